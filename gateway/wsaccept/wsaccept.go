// Package wsaccept accepts github.com/coder/websocket connections on a
// github.com/valyala/fasthttp server.
//
// websocket.Accept is written for net/http: it answers through an
// http.ResponseWriter and then hijacks the connection. fasthttp only hands a
// connection over after the request handler has returned, so Tracker.Accept
// runs websocket.Accept while the request is still being served, against a
// ResponseWriter that records the answer. A refusal (bad Origin, say) is then
// sent as an ordinary fasthttp response and reported to the caller; a 101 is
// written to the socket once fasthttp has hijacked it, just before the
// handler starts.
//
// fasthttp's Server.Shutdown does not wait for hijacked connections, which is
// why a Tracker also keeps every live connection until its handler returns.
package wsaccept

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"

	"github.com/coder/websocket"
	"github.com/valyala/fasthttp"
)

var (
	// ErrNotUpgrade reports a request that is not a valid WebSocket opening
	// handshake. Accept has answered it with 426, 405 or 400.
	ErrNotUpgrade = errors.New("wsaccept: not a websocket upgrade request")

	// ErrRejected reports a handshake that websocket.Accept refused, for
	// instance because the Origin is not allowed by AcceptOptions. Accept has
	// answered it with websocket.Accept's own status and message.
	ErrRejected = errors.New("wsaccept: websocket handshake rejected")

	// ErrShutdown reports an upgrade attempted after Tracker.Shutdown was
	// called. Accept has answered it with 503.
	ErrShutdown = errors.New("wsaccept: tracker is shut down")
)

// Tracker upgrades fasthttp requests to WebSocket connections and keeps
// track of them until their handlers return, so that a server can close them
// on shutdown. The zero value is ready to use. A Tracker must not be copied
// after first use.
type Tracker struct {
	// KeepHijackedConns must be set exactly when the fasthttp.Server has
	// KeepHijackedConns. fasthttp then leaves each hijacked connection to
	// the Tracker, which runs its handler in a goroutine of its own and
	// reads the socket directly: fasthttp frees the request's RequestCtx
	// and read buffer at once instead of holding them, some 7 KiB, for as
	// long as the connection lives.
	KeepHijackedConns bool

	mu       sync.Mutex
	sessions map[*session]struct{}
	closed   bool
	// drained is made by the first Shutdown and closed once sessions is
	// empty; no session is added after that, so it is closed at most once.
	drained chan struct{}
}

// session is one accepted connection whose handler has not returned yet.
type session struct {
	ws     *websocket.Conn
	nc     *conn
	cancel context.CancelFunc
	goAway sync.Once
}

// Accept upgrades the request in ctx to a WebSocket connection and arranges
// for handler to run on it once the request handler has returned: in the
// goroutine fasthttp starts for the hijacked connection, or with
// KeepHijackedConns in one of the Tracker's own. The handler's context is
// cancelled when the Tracker shuts down; the socket is closed when handler
// returns, without a close handshake unless handler performed one.
//
// On error nothing is hijacked and ctx holds the answer already: see
// ErrNotUpgrade, ErrRejected and ErrShutdown. On success the request handler
// must not write a response, as fasthttp will not send it. If the Tracker
// shuts down between Accept returning and fasthttp handing the connection
// over, the client gets 503 and handler does not run.
func (t *Tracker) Accept(ctx *fasthttp.RequestCtx, opts *websocket.AcceptOptions, handler func(context.Context, *websocket.Conn)) error {
	hdr := requestHeader(&ctx.Request.Header)
	if status, reason := checkUpgrade(ctx, hdr); status != 0 {
		refuse(ctx, status, reason)
		return fmt.Errorf("%w: %s", ErrNotUpgrade, reason)
	}
	if t.isClosed() {
		ctx.Error("server is shutting down", fasthttp.StatusServiceUnavailable)
		return ErrShutdown
	}
	req, err := newRequest(ctx, hdr)
	if err != nil {
		refuse(ctx, fasthttp.StatusBadRequest, "malformed request URI")
		return fmt.Errorf("%w: %w", ErrNotUpgrade, err)
	}

	rw := &responseWriter{header: make(http.Header)}
	ws, err := websocket.Accept(rw, req, opts)
	if err != nil {
		rw.replay(&ctx.Response)
		return fmt.Errorf("%w: %w", ErrRejected, err)
	}
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(hc net.Conn) { t.hijacked(hc, rw, ws, handler) })
	return nil
}

// IsUpgrade reports whether the request in ctx is a valid WebSocket opening
// handshake, letting a caller answer anything else in its own format before
// calling Accept. It does not check the Origin, which websocket.Accept
// judges against AcceptOptions.
func IsUpgrade(ctx *fasthttp.RequestCtx) bool {
	status, _ := checkUpgrade(ctx, requestHeader(&ctx.Request.Header))
	return status == 0
}

// Len returns the number of connections whose handler has not returned yet.
func (t *Tracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sessions)
}

// Shutdown makes the Tracker refuse new connections, closes every live
// connection with websocket.StatusGoingAway and reason (at most 123 bytes,
// or websocket.Conn.Close substitutes StatusInternalError), and waits until
// all handlers have returned.
//
// A handler's context is cancelled once its connection's close handshake is
// over: cancelling first would make websocket.Conn drop the socket before the
// close frame is sent, and the client would see an abnormal closure instead
// of 1001.
//
// If ctx ends first, Shutdown cancels the remaining handlers' contexts,
// closes their sockets without a handshake and returns an error wrapping
// ctx.Err() without waiting further. Shutdown may be called more than once.
func (t *Tracker) Shutdown(ctx context.Context, reason string) error {
	t.mu.Lock()
	t.closed = true
	if t.drained == nil {
		t.drained = make(chan struct{})
		if len(t.sessions) == 0 {
			close(t.drained)
		}
	}
	drained := t.drained
	sessions := t.snapshotLocked()
	t.mu.Unlock()

	for _, s := range sessions {
		go s.goAwayOnce(reason)
	}
	select {
	case <-drained:
		return nil
	case <-ctx.Done():
	}

	t.mu.Lock()
	sessions = t.snapshotLocked()
	t.mu.Unlock()
	if len(sessions) == 0 {
		return nil // drained just as ctx ended
	}
	for _, s := range sessions {
		s.cancel()
		_ = s.nc.Close()
	}
	return fmt.Errorf("wsaccept: shutdown left %d websocket handlers running: %w", len(sessions), ctx.Err())
}

// hijacked runs in fasthttp's hijack goroutine. Without KeepHijackedConns
// fasthttp closes hc and recycles it once this returns, so the connection is
// served here; with it, this returns as soon as nothing refers to fasthttp's
// buffers any more.
func (t *Tracker) hijacked(hc net.Conn, rw *responseWriter, ws *websocket.Conn, handler func(context.Context, *websocket.Conn)) {
	rw.nc.bind(hc)
	if !t.KeepHijackedConns {
		t.serve(rw, ws, handler)
		return
	}
	rw.nc.unbuffer()
	go t.serve(rw, ws, handler)
}

// serve runs the handler and stops everything that can reach the hijacked
// conn before it returns.
func (t *Tracker) serve(rw *responseWriter, ws *websocket.Conn, handler func(context.Context, *websocket.Conn)) {
	nc := rw.nc
	ctx, cancel := context.WithCancel(context.Background())
	s := &session{ws: ws, nc: nc, cancel: cancel}
	if !t.add(s) {
		cancel()
		_, _ = nc.Write([]byte("HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"))
		_ = ws.CloseNow()
		nc.release()
		return
	}
	defer func() {
		cancel()
		_ = ws.CloseNow()
		nc.release()
		t.remove(s)
	}()
	if _, err := nc.Write(rw.head()); err != nil {
		return
	}
	handler(ctx, ws)
}

func (s *session) goAwayOnce(reason string) {
	s.goAway.Do(func() {
		_ = s.ws.Close(websocket.StatusGoingAway, reason)
		s.cancel()
	})
}

func (t *Tracker) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

func (t *Tracker) add(s *session) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	if t.sessions == nil {
		t.sessions = make(map[*session]struct{})
	}
	t.sessions[s] = struct{}{}
	return true
}

func (t *Tracker) remove(s *session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.sessions, s)
	if t.drained != nil && len(t.sessions) == 0 {
		close(t.drained)
	}
}

func (t *Tracker) snapshotLocked() []*session {
	sessions := make([]*session, 0, len(t.sessions))
	for s := range t.sessions {
		sessions = append(sessions, s)
	}
	return sessions
}
