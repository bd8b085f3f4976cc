package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
)

// Close codes of the WebSocket endpoints beyond those of RFC 6455;
// docs/websocket.md lists every code a socket can end with.
const (
	// CloseSuperseded means a newer connection of the same consumer took
	// over. Do not reconnect automatically: another process holds the
	// consumer id.
	CloseSuperseded websocket.StatusCode = 4000
	// CloseSlowConsumer means a frame could not be written within
	// Options.WriteTimeout. Reconnect and resume from your cursor.
	CloseSlowConsumer websocket.StatusCode = 4001
	// CloseForgotten means the gateway gave up on this consumer (its runner
	// was deleted, or it stayed away past its grace period) and dropped its
	// outbox.
	CloseForgotten websocket.StatusCode = 4002
	// CloseTokenExpired means the credential that opened the socket
	// expired. Reconnect with a fresh one.
	CloseTokenExpired websocket.StatusCode = 4003
	// ClosePingTimeout means the peer did not answer a ping within
	// Options.PingInterval.
	ClosePingTimeout websocket.StatusCode = 4008
)

// frameSlack is what a command frame may add around a body of
// Options.MaxBodyBytes: the frame's own keys and an id of up to 128 bytes.
const frameSlack = 4 << 10

// streamDefaults fills in the defaults of the long-lived connection
// options; it runs after MaxBodyBytes has its default.
func (o *Options) streamDefaults() {
	if o.PingInterval <= 0 {
		o.PingInterval = 15 * time.Second
	}
	if o.MaxFrameBytes <= 0 {
		o.MaxFrameBytes = int64(o.MaxBodyBytes) + frameSlack
	}
	if o.ConnectRate == 0 {
		o.ConnectRate = 2000
	}
	if o.ConnectBurst <= 0 {
		o.ConnectBurst = max(1, int(math.Ceil(2*o.ConnectRate)))
	}
}

// tokenBucket bounds the rate of new stream connections. A nil bucket
// admits everything.
type tokenBucket struct {
	mu     sync.Mutex
	rate   float64 // tokens per second
	burst  float64
	tokens float64
	last   time.Time
}

// newTokenBucket returns a full bucket, or nil for a negative rate.
func newTokenBucket(rate float64, burst int) *tokenBucket {
	if rate < 0 {
		return nil
	}
	return &tokenBucket{rate: rate, burst: float64(burst), tokens: float64(burst), last: time.Now()}
}

// take spends a token if there is one; otherwise it says how long until
// there will be.
func (b *tokenBucket) take(now time.Time) (time.Duration, bool) {
	if b == nil {
		return 0, true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.tokens = min(b.burst, b.tokens+dt*b.rate)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return 0, true
	}
	return time.Duration((1 - b.tokens) / b.rate * float64(time.Second)), false
}

// admit wraps a stream route with admission control: during a reconnect
// storm, connections past Options.ConnectRate are refused with 429 before
// any stream work is done, and told when to come back.
func (s *Server) admit(h func(*call)) func(*call) {
	return func(c *call) {
		wait, ok := s.admission.take(time.Now())
		if ok {
			h(c)
			return
		}
		secs := max(1, int(math.Ceil(wait.Seconds())))
		c.ctx.Response.Header.Set("Retry-After", strconv.Itoa(secs))
		s.writeJSON(c.ctx, fasthttp.StatusTooManyRequests, errorBody{
			Error: "rate limited: too many new connections, retry after " + strconv.Itoa(secs) + "s",
			Code:  CodeRateLimited,
		})
	}
}

// agentParams reads and checks the query of an agent stream, SSE or
// WebSocket, and the caller's right to it.
func agentParams(c *call) (peer.Key, error) {
	args := c.ctx.QueryArgs()
	agentID, consumerID := string(args.Peek("agent_id")), string(args.Peek("consumer_id"))
	if agentID == "" || consumerID == "" {
		return peer.Key{}, kernelValidation("agent_id and consumer_id query params are required")
	}
	if err := checkIDs(map[string]string{"agent_id": agentID, "consumer_id": consumerID}); err != nil {
		return peer.Key{}, err
	}
	if err := c.principal.Authorize(auth.ActAct, agentResource(agentID)); err != nil {
		return peer.Key{}, err
	}
	return peer.Key{Role: kernel.RoleAgent, ID: agentID, Consumer: consumerID}, nil
}

// runnerParams reads and checks the query of a runner stream, SSE or
// WebSocket, and the caller's right to it.
func runnerParams(c *call) (peer.Key, []string, error) {
	args := c.ctx.QueryArgs()
	runnerID, consumerID := string(args.Peek("runner_id")), string(args.Peek("consumer_id"))
	if runnerID == "" || consumerID == "" {
		return peer.Key{}, nil, kernelValidation("runner_id and consumer_id query params are required")
	}
	if err := checkIDs(map[string]string{"runner_id": runnerID, "consumer_id": consumerID}); err != nil {
		return peer.Key{}, nil, err
	}
	var caps []string
	for t := range strings.SplitSeq(string(args.Peek("capabilities")), ",") {
		if t = strings.TrimSpace(t); t != "" {
			caps = append(caps, t)
		}
	}
	if err := validTools(caps); err != nil {
		return peer.Key{}, nil, err
	}
	if err := c.principal.Authorize(auth.ActAct, runnerResource(runnerID)); err != nil {
		return peer.Key{}, nil, err
	}
	return peer.Key{Role: kernel.RoleRunner, ID: runnerID, Consumer: consumerID}, caps, nil
}

// peerSocket is what an agent or runner socket serves.
type peerSocket struct {
	role    string
	key     peer.Key
	connect func() (disconnected func())
	cursor  *uint64 // from the cursor parameter or Last-Event-ID
	epochOK bool    // false: the cursor names another store
}

func (s *Server) agentWS(c *call) {
	key, err := agentParams(c)
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	ps := &peerSocket{role: kernel.RoleAgent, key: key, connect: func() func() {
		return s.k.AgentConnected(key.ID, key.Consumer)
	}}
	s.upgradePeer(c, ps)
}

func (s *Server) runnerWS(c *call) {
	key, caps, err := runnerParams(c)
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	ps := &peerSocket{role: kernel.RoleRunner, key: key, connect: func() func() {
		return s.k.RunnerConnected(key.ID, key.Consumer, caps)
	}}
	s.upgradePeer(c, ps)
}

func (s *Server) upgradePeer(c *call, ps *peerSocket) {
	cur, epochOK, err := peerCursor(c.ctx, s.k.Epoch())
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	ps.cursor, ps.epochOK = cur, epochOK
	s.upgrade(c, "ws_"+ps.role, func(w *wsConn) { s.servePeer(w, ps) })
}

func (s *Server) executionWS(c *call) {
	id := c.params[0]
	v, err := s.execution(c.ctx, c.principal, auth.ActRead, id, nil)
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	res := executionResource(&v)
	after := max(cursor(c.ctx), parseSeq(c.ctx.QueryArgs().Peek("cursor")))
	s.upgrade(c, "ws_execution", func(w *wsConn) { s.serveExecution(w, res, after) })
}

// upgrade accepts the WebSocket handshake and runs serve on the socket once
// fasthttp has handed it over. Everything that can be refused was checked
// before, so refusals are JSON answers like the rest of the API.
func (s *Server) upgrade(c *call, kind string, serve func(*wsConn)) {
	opts := &websocket.AcceptOptions{
		Subprotocols:    []string{SubprotocolJSON, SubprotocolMsgpack},
		OriginPatterns:  s.opts.CORSOrigins,
		CompressionMode: websocket.CompressionDisabled,
	}
	principal := c.principal
	err := s.ws.Accept(c.ctx, opts, func(ctx context.Context, ws *websocket.Conn) {
		s.metrics.streams.WithLabelValues(kind).Inc()
		defer s.metrics.streams.WithLabelValues(kind).Dec()
		ws.SetReadLimit(s.opts.MaxFrameBytes)
		w := &wsConn{
			s: s, ws: ws, ctx: ctx, format: formatOf(ws.Subprotocol()),
			stop: make(chan struct{}), closed: make(chan struct{}),
		}
		w.principal.Store(principal)
		serve(w)
	})
	if err == nil {
		// Only the metrics see this status: a hijacked response is not sent.
		c.ctx.SetStatusCode(fasthttp.StatusSwitchingProtocols)
		return
	}
	// Accept has answered in plain text; keep its status and headers
	// (Upgrade, Sec-WebSocket-Version, ...) but answer in the API's JSON.
	status := c.ctx.Response.StatusCode()
	code := CodeValidation
	switch status {
	case fasthttp.StatusForbidden:
		code = CodeForbidden
	case fasthttp.StatusServiceUnavailable:
		code = CodeUnavailable
		c.ctx.Response.Header.Set("Retry-After", "1")
	}
	reason := strings.TrimSpace(string(c.ctx.Response.Body()))
	s.writeJSON(c.ctx, status, errorBody{Error: "websocket handshake refused: " + reason, Code: code})
}

// wsConn is one accepted socket: its encoding, the single close it gets and
// the bounded writes.
type wsConn struct {
	s  *Server
	ws *websocket.Conn
	// ctx is cancelled by the Tracker once the socket is done. Reads, writes
	// and pings do not use it: every end of the socket closes it, which ends
	// them as well, and each use would leave an idle socket holding the
	// context.AfterFunc bookkeeping it costs.
	ctx    context.Context
	format wireFormat
	// principal opened the socket, or refreshed its credential since: its
	// commands run with its rights, and the socket ends when it expires.
	principal atomic.Pointer[auth.Principal]

	// stop is closed by the first end; every loop of the socket then stops
	// and no new frame is written, so the close frame gets through next.
	stop    chan struct{}
	endOnce sync.Once
	// closed is closed once the close handshake is over.
	closed chan struct{}
	// onEnd, if set, runs once when the socket starts to close: whoever
	// tracks the peer learns of it then, not only after a close handshake
	// that may wait seconds for a peer that is gone or stuck.
	onEnd func()

	// timerMu guards the ping and expiry timers, which stop with the
	// socket.
	timerMu   sync.Mutex
	pings     *time.Timer
	expiry    *time.Timer
	timersOff bool
}

// errEnded reports a write refused because the socket is closing.
var errEnded = errors.New("gateway: websocket is closing")

// end closes the socket with code and reason unless it is already ending.
// The close handshake runs in the background: end is also called from
// timers while a write is stuck behind a peer that stopped reading, and
// the close frame can only go out once that write completes or the
// handshake gives up (coder/websocket waits 5 s for each half).
func (w *wsConn) end(code websocket.StatusCode, reason string) {
	w.endOnce.Do(func() {
		close(w.stop)
		if w.onEnd != nil {
			w.onEnd()
		}
		go func() {
			defer close(w.closed)
			_ = w.ws.Close(code, closeReason(reason))
		}()
	})
}

// finish ends the socket if nothing else did, stops its timers, which would
// otherwise keep it in memory until they fire, and waits for its close
// handshake or for the Tracker to give up on it.
func (w *wsConn) finish() {
	w.end(websocket.StatusNormalClosure, "")
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
	case <-w.ctx.Done():
	}
}

// closeReason fits a reason into a close frame (123 bytes) on a rune
// boundary.
func closeReason(s string) string {
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

// send writes one frame, given as JSON. A write that does not complete
// within Options.WriteTimeout ends the socket with CloseSlowConsumer.
func (w *wsConn) send(frame []byte) error {
	select {
	case <-w.stop:
		return errEnded
	default:
	}
	scratch := w.s.bufs.get()
	defer w.s.bufs.put(scratch)
	data, err := w.format.encodeFrame(scratch, frame)
	if err != nil {
		w.s.log.Error("encode websocket frame", "err", err)
		w.end(websocket.StatusInternalError, "internal error")
		return err
	}
	t := time.AfterFunc(w.s.opts.WriteTimeout, func() { w.end(CloseSlowConsumer, "slow consumer") })
	err = w.ws.Write(context.Background(), w.format.messageType(), data)
	t.Stop()
	return err
}

// reply answers a command with the status and body its HTTP twin gives.
func (w *wsConn) reply(id string, status int, resp any) error {
	buf := w.s.bufs.get()
	defer w.s.bufs.put(buf)
	// The same encoder as writeJSONThen, so the body is the HTTP body byte
	// for byte, without its trailing newline.
	if err := json.NewEncoder(buf).Encode(resp); err != nil {
		w.s.log.Error("encode reply", "err", err)
		buf.Reset()
		buf.WriteString(`{"error":"internal error","code":"INTERNAL_ERROR"}`)
		status = fasthttp.StatusInternalServerError
	}
	body := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	return w.send(appendReply(make([]byte, 0, len(body)+len(id)+48), id, status, body))
}

func (w *wsConn) replyError(id string, err error) error {
	status, body := statusOf(err)
	return w.reply(id, status, body)
}

// startPings pings the peer every Options.PingInterval. A timer, not a
// goroutine, waits between pings, so an idle socket costs no stack for it.
func (w *wsConn) startPings() {
	w.timerMu.Lock()
	defer w.timerMu.Unlock()
	if !w.timersOff {
		w.pings = time.AfterFunc(w.s.opts.PingInterval, w.ping)
	}
}

// ping runs on the timer. The pong is read by the socket's reader, which
// every socket runs.
func (w *wsConn) ping() {
	ctx, cancel := context.WithTimeout(context.Background(), w.s.opts.PingInterval)
	err := w.ws.Ping(ctx)
	cancel()
	if err != nil {
		w.end(ClosePingTimeout, "ping timeout")
		return
	}
	w.timerMu.Lock()
	defer w.timerMu.Unlock()
	if !w.timersOff {
		w.pings.Reset(w.s.opts.PingInterval)
	}
}

// expireAt ends the socket with CloseTokenExpired at t, in place of any
// earlier expiry; a zero t never expires. A timer, like the pings, so that
// no goroutine waits for it. It reports false when the earlier expiry has
// fired already: the socket is closing.
func (w *wsConn) expireAt(t time.Time) bool {
	w.timerMu.Lock()
	defer w.timerMu.Unlock()
	if w.timersOff || w.expiry != nil && !w.expiry.Stop() {
		return false
	}
	w.expiry = nil
	if !t.IsZero() {
		w.expiry = time.AfterFunc(time.Until(t), func() { w.end(CloseTokenExpired, "token expired") })
	}
	return true
}

// refreshAnswer is the body of the reply to a refresh frame.
type refreshAnswer struct {
	// ExpiresAt is null for a credential that does not expire.
	ExpiresAt *time.Time `json:"expires_at"`
}

// refresh moves the socket to the credential of a refresh frame, so that a
// long-lived socket can outlive the token that opened it. The new
// credential must be valid now, stand for the same caller (subject and
// role) and still grant the socket's ids (scope); the socket then runs with
// its rights and expires with it.
func (w *wsConn) refresh(fr inFrame, scope func(*auth.Principal) error) {
	now := time.Now()
	p, err := w.s.auth.Authenticate([]byte("Bearer "+fr.Token), now)
	if err == nil {
		err = sameCaller(w.principal.Load(), p, now)
	}
	if err == nil {
		err = scope(p)
	}
	if err != nil {
		_ = w.replyError(fr.ID, err)
		return
	}
	if !w.expireAt(p.ExpiresAt) {
		return
	}
	w.principal.Store(p)
	var ans refreshAnswer
	if !p.ExpiresAt.IsZero() {
		ans.ExpiresAt = &p.ExpiresAt
	}
	_ = w.reply(fr.ID, fasthttp.StatusOK, ans)
}

// sameCaller checks a refreshed credential against the one it replaces. One
// past its exp is refused although the authenticator's leeway accepts it:
// the socket would close at once.
func sameCaller(old, p *auth.Principal, now time.Time) error {
	if !p.ExpiresAt.IsZero() && !p.ExpiresAt.After(now) {
		return fmt.Errorf("%w: the new token expired at %s", auth.ErrExpiredToken, p.ExpiresAt.UTC().Format(time.RFC3339))
	}
	if p.Subject != old.Subject || p.Role != old.Role {
		return fmt.Errorf("%w: the socket belongs to %s %q, the new token is for %s %q", auth.ErrForbidden, old.Role, old.Subject, p.Role, p.Subject)
	}
	return nil
}

// readFrames reads client frames until the socket ends and hands each valid
// one to handle. A malformed frame is answered with an error reply when it
// has an id, and otherwise ends the socket with 1007.
func (w *wsConn) readFrames(handle func(fr inFrame, first bool)) {
	first := true
	for {
		_, data, err := w.ws.Read(context.Background())
		if err != nil {
			// The peer closed, went away, or sent a frame past the read
			// limit (coder/websocket has answered that with 1009).
			w.end(websocket.StatusNormalClosure, "")
			return
		}
		fr, err := decodeFrame(w.format, data)
		if err != nil {
			var fe *frameError
			if errors.As(err, &fe) && fe.id != "" {
				_ = w.replyError(fe.id, kernelValidation(fe.Error()))
				first = false
				continue
			}
			w.end(websocket.StatusInvalidFramePayloadData, err.Error())
			return
		}
		handle(fr, first)
		first = false
	}
}

// peerSession is an agent or runner socket while it runs. The handler's
// goroutine reads the client's frames; deliveries are written by a pump
// goroutine that runs only while the outbox has something to send, so an
// idle socket costs one goroutine, not two.
type peerSession struct {
	s     *Server
	w     *wsConn
	ps    *peerSocket
	epoch string
	// current is the outbox connection that acks go to; a resume frame
	// replaces it.
	current atomic.Pointer[peer.Conn]
	// pump is pumpIdle, pumpRunning or pumpAgain.
	pump atomic.Int32
	// mu orders writes from the outbox: a pump's deliveries, and a resume's
	// switch of connection with its reset.
	mu sync.Mutex
}

const (
	pumpIdle    int32 = iota
	pumpRunning       // a pump goroutine runs
	pumpAgain         // woken while running: the pump looks once more before it stops
)

// servePeer serves an agent's or runner's outbox on a socket. Unlike legacy
// SSE, a delivery is not acknowledged by writing it: the client acks, and
// what it has not acked comes again on its next connection.
func (s *Server) servePeer(w *wsConn, ps *peerSocket) {
	p := &peerSession{s: s, w: w, ps: ps, epoch: s.k.Epoch()}
	reset := p.attach(ps.cursor, ps.epochOK)
	disconnected := ps.connect()
	w.onEnd = sync.OnceFunc(func() {
		p.current.Load().Detach()
		disconnected()
	})
	hello := appendHello(nil, p.epoch, ps.role, ps.key.ID, ps.key.Consumer, s.opts.PingInterval)
	if w.send(hello) == nil && p.sendReset(reset) == nil {
		w.expireAt(w.principal.Load().ExpiresAt)
		p.listen()
		w.startPings()
		w.readFrames(p.frame)
	}
	w.end(websocket.StatusNormalClosure, "")
	// A resume may have attached after onEnd detached the previous one.
	p.current.Load().Detach()
	w.finish()
}

// attach takes over the consumer's outbox from a cursor; the reset, if
// any, tells the client it cannot resume there.
func (p *peerSession) attach(cur *uint64, epochOK bool) *peer.Reset {
	if !epochOK {
		conn, _ := p.s.hub.Attach(p.ps.key, nil)
		p.current.Store(conn)
		return &peer.Reset{Reason: peer.ResetEpochChanged, ResumeFrom: 1}
	}
	conn, reset := p.s.hub.Attach(p.ps.key, cur)
	p.current.Store(conn)
	return reset
}

func (p *peerSession) sendReset(r *peer.Reset) error {
	if r == nil {
		return nil
	}
	return p.w.send(appendReset(nil, resetBody(p.epoch, r)))
}

// listen has the current outbox connection wake the pump, and pumps once
// for what is waiting already.
func (p *peerSession) listen() {
	p.current.Load().OnWake(p.kick)
	p.kick()
}

// kick makes sure that a pump runs after it. The hub calls it with its
// locks held (peer.Conn.OnWake), so it only starts a goroutine or tells the
// running one.
func (p *peerSession) kick() {
	for {
		switch p.pump.Load() {
		case pumpIdle:
			if p.pump.CompareAndSwap(pumpIdle, pumpRunning) {
				go p.runPump()
				return
			}
		case pumpRunning:
			if p.pump.CompareAndSwap(pumpRunning, pumpAgain) {
				return
			}
		default:
			return
		}
	}
}

// runPump drains the outbox until it stays empty. Once the socket ends it
// stops for good: the state stays running, so no kick starts another.
func (p *peerSession) runPump() {
	for {
		p.pump.Store(pumpRunning)
		if !p.drain() || p.pump.CompareAndSwap(pumpRunning, pumpIdle) {
			return
		}
	}
}

// drain writes what the outbox holds for the current connection. It
// reports false when the socket is ending: it ended already, a write
// failed, or the consumer was superseded or forgotten.
func (p *peerSession) drain() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.drainLocked()
}

// drainLocked is drain with mu held.
func (p *peerSession) drainLocked() bool {
	w := p.w
	conn := p.current.Load()
	select {
	case <-w.stop:
		return false
	case <-conn.Done():
		// A nil error is our own detach: the socket is closing already.
		switch err := conn.Err(); {
		case errors.Is(err, peer.ErrForgotten):
			w.end(CloseForgotten, "forgotten: the gateway gave up on this consumer")
		case errors.Is(err, peer.ErrSuperseded):
			w.end(CloseSuperseded, "superseded by a newer connection")
		}
		return false
	default:
	}
	var frame []byte
	for {
		d, ok := conn.Next()
		if !ok {
			return true
		}
		frame = appendPush(frame[:0], frameDelivery, d.Seq, d.Type, d.Data)
		if w.send(frame) != nil {
			return false
		}
	}
}

// resume restarts delivery from the cursor of a resume frame. Holding mu,
// it waits for a pump's writes from the old connection, which thus come
// before the reset, if any, and before the deliveries from the new one.
// It writes those itself before the next frame is read: the client may
// already ack a delivery that the old connection wrote, and an ack is
// capped at what the current connection has handed out.
func (p *peerSession) resume(fr inFrame) {
	p.mu.Lock()
	cur := fr.Cursor
	reset := p.attach(&cur, fr.Epoch == "" || fr.Epoch == p.epoch)
	ok := p.sendReset(reset) == nil && p.drainLocked()
	p.mu.Unlock()
	if ok {
		p.listen()
	}
}

// frame handles one client frame, in the handler's goroutine, which reads
// them: commands run one at a time, in the order sent.
func (p *peerSession) frame(fr inFrame, first bool) {
	w := p.w
	switch fr.Type {
	case frameAck:
		p.current.Load().Ack(fr.Seq)
	case frameResume:
		if !first {
			w.frameRefused(fr, "resume must be the first frame")
			return
		}
		p.resume(fr)
	case frameRefresh:
		w.refresh(fr, p.scope)
	case frameCommand:
		status, resp, after := p.s.peerCommand(w, p.ps, fr)
		_ = w.reply(fr.ID, status, resp)
		// After the reply is written, so that pushes the command caused
		// cannot overtake it.
		after.Run()
	}
}

// scope checks that a refreshed credential still grants the socket's id.
func (p *peerSession) scope(pr *auth.Principal) error {
	switch p.ps.role {
	case kernel.RoleRunner:
		return pr.Authorize(auth.ActAct, runnerResource(p.ps.key.ID))
	case roleChannel:
		_, err := person(pr, auth.ActWrite) // the refresh already requires the same subject
		return err
	}
	return pr.Authorize(auth.ActAct, agentResource(p.ps.key.ID))
}

// frameRefused answers a well-formed frame that this socket cannot take: an
// error reply when it has an id, else a close with 1007, as for a
// malformed frame.
func (w *wsConn) frameRefused(fr inFrame, msg string) {
	if fr.ID != "" {
		_ = w.replyError(fr.ID, kernelValidation(msg))
		return
	}
	w.end(websocket.StatusInvalidFramePayloadData, msg)
}

// peerCommand maps a command frame to the shared command layer. Runner
// commands name the socket's runner; started names its step in the body,
// since the frame has no path to carry it.
func (s *Server) peerCommand(w *wsConn, ps *peerSocket, fr inFrame) (int, any, kernel.After) {
	if ps.role == roleChannel {
		return s.channelCommand(w, ps, fr)
	}
	var name, pathID string
	switch {
	case ps.role == kernel.RoleAgent && (fr.Command == cmdIntent || fr.Command == cmdStepResult):
		name = fr.Command
	case ps.role == kernel.RoleRunner && (fr.Command == cmdResult || fr.Command == cmdCapabilities):
		name, pathID = fr.Command, ps.key.ID
	case ps.role == kernel.RoleRunner && fr.Command == cmdStarted:
		var ref struct {
			StepID string `json:"step_id"`
		}
		if err := decodeBody(fr.Body, &ref, s.opts.MaxBodyBytes); err != nil {
			return commandError(err)
		}
		if ref.StepID == "" {
			return commandError(kernelValidation("step_id is required"))
		}
		name, pathID = cmdStarted, ref.StepID
	default:
		want := "intent or step_result"
		if ps.role == kernel.RoleRunner {
			want = "result, started or capabilities"
		}
		return commandError(kernelValidation("the " + ps.role + " socket takes the commands " + want + ", not " + strconv.Quote(fr.Command)))
	}
	return s.command(w.ctx, w.principal.Load(), name, pathID, fr.Body, kernel.Meta{})
}

func commandError(err error) (int, any, kernel.After) {
	status, body := statusOf(err)
	return status, body, nil
}

// serveExecution streams an execution's events from the store: the watch
// only says that there is more, so a slow reader costs no memory. The socket
// closes with 1000 right after the terminal event.
func (s *Server) serveExecution(w *wsConn, res auth.Resource, last uint64) {
	id := res.ID
	watch := s.k.Watch(id)
	defer watch.Stop()
	if w.send(appendHello(nil, s.k.Epoch(), "execution", id, "", s.opts.PingInterval)) != nil {
		w.finish()
		return
	}
	w.expireAt(w.principal.Load().ExpiresAt)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		w.readFrames(func(fr inFrame, _ bool) {
			// Acks and resumes mean nothing here: the client's position is
			// the sequence it reconnects with.
			switch fr.Type {
			case frameCommand:
				w.frameRefused(fr, "the execution socket takes no commands")
			case frameRefresh:
				w.refresh(fr, func(p *auth.Principal) error { return p.Authorize(auth.ActRead, res) })
			}
		})
	}()
	w.startPings()
	s.streamEvents(w, watch, id, last)
	w.finish()
	// The reader returns once the socket is closed.
	<-readerDone
}

// streamEvents writes the events of id after last until the terminal one,
// or until the socket ends.
func (s *Server) streamEvents(w *wsConn, watch *kernel.Watch, id string, last uint64) {
	for {
		terminal, err := s.sendEvents(w, id, &last)
		if err == nil && !terminal && !s.k.Live(id) {
			// Finished before or while we read: everything is committed
			// now, so reading on delivers the rest.
			_, err = s.sendEvents(w, id, &last)
			terminal = true
		}
		switch {
		case errors.Is(err, kernel.ErrUnavailable):
			w.end(websocket.StatusTryAgainLater, "event store unavailable")
			return
		case err != nil:
			return
		case terminal:
			w.end(websocket.StatusNormalClosure, "execution finished")
			return
		}
		select {
		case <-watch.C():
		case <-watch.Done():
			w.end(websocket.StatusGoingAway, "server shutting down")
			return
		case <-w.stop:
			return
		case <-w.ctx.Done():
			return
		}
	}
}

// Replay batches: events are copied out of the store this many at a time, so
// no store iterator stays open while a frame waits for a slow socket.
const (
	replayBatch      = 256
	replayBatchBytes = 1 << 20
)

type storedEvent struct {
	seq  uint64
	data []byte
}

// sendEvents writes the stored events of id after *last, advancing it, and
// reports whether the terminal event was among them.
func (s *Server) sendEvents(w *wsConn, id string, last *uint64) (bool, error) {
	var (
		batch []storedEvent
		size  int
		frame []byte
	)
	for {
		batch, size = batch[:0], 0
		err := s.k.ReadEvents(id, *last, func(seq uint64, data []byte) bool {
			batch = append(batch, storedEvent{seq: seq, data: bytes.Clone(data)})
			size += len(data)
			return len(batch) < replayBatch && size < replayBatchBytes
		})
		if err != nil {
			return false, err
		}
		for _, e := range batch {
			typ := eventType(e.data)
			frame = appendPush(frame[:0], frameEvent, e.seq, typ, e.data)
			if err := w.send(frame); err != nil {
				return false, err
			}
			*last = e.seq
			if event.IsTerminal(typ) {
				return true, nil
			}
		}
		if len(batch) < replayBatch && size < replayBatchBytes {
			return false, nil
		}
	}
}
