package stream

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/gatehouse-dev/gatehouse/internal/option"
)

// Close codes that Gatehouse's WebSockets end with beyond those of RFC
// 6455; docs/websocket.md lists every code a socket can end with.
const (
	// CloseSuperseded means a newer connection of the same consumer took
	// over. Do not reconnect automatically: another process holds the
	// consumer id.
	CloseSuperseded websocket.StatusCode = 4000
	// CloseSlowConsumer means a frame could not be written within the write
	// timeout. Reconnect and resume from your cursor.
	CloseSlowConsumer websocket.StatusCode = 4001
	// CloseForgotten means the gateway gave up on this consumer (its runner
	// was deleted, or it stayed away past its grace period) and dropped its
	// outbox.
	CloseForgotten websocket.StatusCode = 4002
	// CloseTokenExpired means the credential that opened the socket
	// expired. Reconnect with a fresh one.
	CloseTokenExpired websocket.StatusCode = 4003
	// ClosePingTimeout means the peer did not answer a ping within the ping
	// interval.
	ClosePingTimeout websocket.StatusCode = 4008
)

// WSOptions configure a WebSocket transport.
type WSOptions struct {
	// Binary sends binary messages; text messages otherwise.
	Binary bool
	// Encode appends a frame's message bytes to dst.
	Encode func(dst []byte, f *Frame) ([]byte, error)
	// WriteTimeout bounds every message write; past it the socket ends
	// with CloseSlowConsumer. Zero means 10s.
	WriteTimeout time.Duration
	// PingInterval is how often StartPings pings; a ping unanswered this
	// long ends the socket with ClosePingTimeout. Zero means 15s.
	PingInterval time.Duration
	// CloseTimeout is how long, from the moment the socket starts to
	// close, the message being written may take to finish; the close frame
	// goes out after it. Past it the connection is cut without a close
	// frame, the message cut short. Zero means 5s.
	CloseTimeout time.Duration
	// CloseFor gives the close code and reason text for the end of a
	// stream carried on the socket; nil closes with 1000 (finished), 1001
	// (shutdown), CloseTokenExpired, CloseSlowConsumer or 1011 (failed).
	CloseFor func(reason Reason, err error) (websocket.StatusCode, string)
}

// WS is a Transport over an accepted WebSocket, and the socket's single
// owner: its writes are bounded, its close happens once, and its ping and
// expiry timers stop with it. Every method is safe for concurrent use;
// only one goroutine may Read.
type WS struct {
	ws *websocket.Conn
	o  WSOptions

	// stop is closed by the first end; every loop of the socket then stops
	// and no new frame is written, so the close frame gets through next.
	stop    chan struct{}
	endOnce sync.Once
	// closed is closed once the close handshake is over.
	closed chan struct{}

	// mu guards the hooks and the count of messages being written, and
	// orders both against the close of stop.
	mu    sync.Mutex
	onEnd []func()
	// sending counts the messages being written. drained is made by the
	// end when some are, and closed once the last of them is done.
	sending int
	drained chan struct{}

	bufMu sync.Mutex
	buf   []byte

	// timerMu guards the ping and expiry timers, which stop with the
	// socket.
	timerMu   sync.Mutex
	pings     *time.Timer
	expiry    *time.Timer
	timersOff bool
}

// NewWS wraps an accepted socket.
func NewWS(ws *websocket.Conn, o WSOptions) *WS {
	option.Default(&o.WriteTimeout, 10*time.Second)
	option.Default(&o.PingInterval, 15*time.Second)
	option.Default(&o.CloseTimeout, 5*time.Second)
	return &WS{ws: ws, o: o, stop: make(chan struct{}), closed: make(chan struct{})}
}

// ErrEnding reports a write refused because the socket is closing.
var ErrEnding = errors.New("stream: websocket is closing")

// OnEnd adds f to what runs once when the socket starts to close: whoever
// tracks the peer learns of it then, not only after a close handshake that
// may wait seconds for a peer that is gone or stuck. f runs at once if the
// socket is closing already.
func (w *WS) OnEnd(f func()) {
	w.mu.Lock()
	select {
	case <-w.stop:
		w.mu.Unlock()
		f()
		return
	default:
	}
	w.onEnd = append(w.onEnd, f)
	w.mu.Unlock()
}

// Ending is closed when the socket starts to close.
func (w *WS) Ending() <-chan struct{} { return w.stop }

// Write encodes a frame and sends it.
func (w *WS) Write(f *Frame) error {
	w.bufMu.Lock()
	defer w.bufMu.Unlock()
	msg, err := w.o.Encode(w.buf[:0], f)
	if err != nil {
		w.End(websocket.StatusInternalError, "internal error")
		return err
	}
	err = w.Send(msg)
	if cap(msg) <= 64<<10 {
		w.buf = msg[:0]
	} else {
		w.buf = nil
	}
	return err
}

// Send writes one message as it is. A write that does not complete within
// the write timeout ends the socket with CloseSlowConsumer.
func (w *WS) Send(msg []byte) error {
	if !w.startSending() {
		return ErrEnding
	}
	defer w.doneSending()
	typ := websocket.MessageText
	if w.o.Binary {
		typ = websocket.MessageBinary
	}
	t := time.AfterFunc(w.o.WriteTimeout, func() { w.End(CloseSlowConsumer, "slow consumer") })
	err := w.ws.Write(context.Background(), typ, msg)
	if !t.Stop() {
		return ErrSlowConsumer
	}
	return err
}

// startSending counts a message in as being written, unless the socket is
// closing.
func (w *WS) startSending() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-w.stop:
		return false
	default:
	}
	w.sending++
	return true
}

func (w *WS) doneSending() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sending--
	if w.sending == 0 && w.drained != nil {
		close(w.drained)
		w.drained = nil
	}
}

// Flush does nothing: every message is written whole.
func (w *WS) Flush() error { return nil }

// FlushLast does nothing: every message is written whole, and the close
// frame follows on its own.
func (w *WS) FlushLast() error { return nil }

// Heartbeat does nothing: the socket pings on its own timer (StartPings).
func (w *WS) Heartbeat() error { return nil }

// Close ends the socket for the end of the stream it carries.
func (w *WS) Close(reason Reason, err error) {
	code, text := w.closeFor(reason, err)
	w.End(code, text)
}

func (w *WS) closeFor(reason Reason, err error) (websocket.StatusCode, string) {
	if w.o.CloseFor != nil {
		return w.o.CloseFor(reason, err)
	}
	switch reason {
	case Finished, Gone:
		return websocket.StatusNormalClosure, ""
	case Shutdown:
		return websocket.StatusGoingAway, "server shutting down"
	case Expired:
		return CloseTokenExpired, "token expired"
	case SlowConsumer:
		return CloseSlowConsumer, "slow consumer"
	}
	return websocket.StatusInternalError, "internal error"
}

// End closes the socket with code and reason unless it is already ending.
// The close runs in the background: End is also called from timers while a
// write is stuck behind a peer that stopped reading, and the close frame
// can only go out once that write completes.
func (w *WS) End(code websocket.StatusCode, reason string) {
	w.endOnce.Do(func() {
		w.mu.Lock()
		close(w.stop)
		hooks := w.onEnd
		w.onEnd = nil
		var drained chan struct{}
		if w.sending > 0 {
			drained = make(chan struct{})
			w.drained = drained
		}
		w.mu.Unlock()
		for _, f := range hooks {
			f()
		}
		go w.close(code, reason, drained)
	})
}

// close waits for the messages being written, drained, for at most the
// close timeout, then runs the close handshake; past the timeout it cuts
// the connection, which fails those writes. The wait is the socket's own:
// coder/websocket's Close gives a write in progress only its fixed 5 s to
// make way for the close frame and then cuts the connection mid-message.
// Once the close frame can go out, coder/websocket gives it 5 s to do so
// and waits 5 s more for the peer's close frame.
func (w *WS) close(code websocket.StatusCode, reason string, drained <-chan struct{}) {
	defer close(w.closed)
	if drained != nil {
		t := time.NewTimer(w.o.CloseTimeout)
		select {
		case <-drained:
			t.Stop()
		case <-t.C:
			_ = w.ws.CloseNow()
			return
		}
	}
	_ = w.ws.Close(code, CloseReason(reason))
}

// Finish ends the socket if nothing else did, stops its timers, which would
// otherwise keep it in memory until they fire, and waits for its close
// handshake or for ctx (the accepting tracker giving up on it).
func (w *WS) Finish(ctx context.Context) {
	w.End(websocket.StatusNormalClosure, "")
	w.timerMu.Lock()
	w.timersOff = true
	if w.pings != nil {
		w.pings.Stop()
	}
	if w.expiry != nil {
		w.expiry.Stop()
	}
	w.timerMu.Unlock()
	select {
	case <-w.closed:
	case <-ctx.Done():
	}
}

// CloseReason fits a reason into a close frame (123 bytes) on a rune
// boundary.
func CloseReason(s string) string {
	const maxReason = 123
	if len(s) <= maxReason {
		return s
	}
	s = s[:maxReason]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// StartPings pings the peer every ping interval. A timer, not a goroutine,
// waits between pings, so an idle socket costs no stack for it. The pong
// is read by whoever reads the socket, which every socket must do.
func (w *WS) StartPings() {
	w.timerMu.Lock()
	defer w.timerMu.Unlock()
	if !w.timersOff {
		w.pings = time.AfterFunc(firstPing(w.o.PingInterval), w.ping)
	}
}

// firstPing is when a socket's first ping goes out: at a random point of
// the second half of the interval. Sockets that connect together (every
// runner and agent reconnecting after a restart) would otherwise ping
// together for as long as they live, a goroutine and a timer each at the
// same instant; spread once, they stay spread. A dead peer is never
// noticed later than with a fixed interval.
func firstPing(interval time.Duration) time.Duration {
	if interval < 2 {
		return interval
	}
	return interval/2 + rand.N(interval-interval/2)
}

func (w *WS) ping() {
	ctx, cancel := context.WithTimeout(context.Background(), w.o.PingInterval)
	err := w.ws.Ping(ctx)
	cancel()
	if err != nil {
		w.End(ClosePingTimeout, "ping timeout")
		return
	}
	w.timerMu.Lock()
	defer w.timerMu.Unlock()
	if !w.timersOff {
		w.pings.Reset(w.o.PingInterval)
	}
}

// ExpireAt ends the socket with CloseTokenExpired at t, in place of any
// earlier expiry; a zero t never expires. It reports false when the
// earlier expiry has fired already: the socket is closing.
func (w *WS) ExpireAt(t time.Time) bool {
	w.timerMu.Lock()
	defer w.timerMu.Unlock()
	if w.timersOff || w.expiry != nil && !w.expiry.Stop() {
		return false
	}
	w.expiry = nil
	if !t.IsZero() {
		w.expiry = time.AfterFunc(time.Until(t), func() { w.End(CloseTokenExpired, "token expired") })
	}
	return true
}

// Read reads the next message. It fails once the socket is closed, by
// either side, or with a message past the socket's read limit (which
// coder/websocket answers with 1009).
func (w *WS) Read() (websocket.MessageType, []byte, error) {
	return w.ws.Read(context.Background())
}
