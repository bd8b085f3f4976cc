package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"

	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/internal/option"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/protocol"
	"github.com/gatehouse-dev/gatehouse/stream"
)

// Close codes of the WebSocket endpoints beyond those of RFC 6455, defined
// with the stream engine; docs/websocket.md lists every code a socket can
// end with.
const (
	// CloseSuperseded means a newer connection of the same consumer took
	// over. Do not reconnect automatically: another process holds the
	// consumer id.
	CloseSuperseded = stream.CloseSuperseded
	// CloseSlowConsumer means a frame could not be written within
	// Options.WriteTimeout. Reconnect and resume from your cursor.
	CloseSlowConsumer = stream.CloseSlowConsumer
	// CloseForgotten means the gateway gave up on this consumer (its runner
	// was deleted, or it stayed away past its grace period) and dropped its
	// outbox.
	CloseForgotten = stream.CloseForgotten
	// CloseTokenExpired means the credential that opened the socket
	// expired. Reconnect with a fresh one.
	CloseTokenExpired = stream.CloseTokenExpired
	// ClosePingTimeout means the peer did not answer a ping within
	// Options.PingInterval.
	ClosePingTimeout = stream.ClosePingTimeout
)

// frameSlack is what a command frame may add around a body of
// Options.MaxBodyBytes: the frame's own keys and an id of up to 128 bytes.
const frameSlack = 4 << 10

// streamDefaults fills in the defaults of the long-lived connection
// options; it runs after MaxBodyBytes has its default.
func (o *Options) streamDefaults() {
	d := Defaults()
	option.Default(&o.PingInterval, d.PingInterval)
	option.Default(&o.CloseTimeout, d.CloseTimeout)
	option.Default(&o.MaxFrameBytes, int64(o.MaxBodyBytes)+frameSlack)
	if o.ConnectRate == 0 {
		o.ConnectRate = d.ConnectRate
	}
	option.Default(&o.ConnectBurst, max(1, int(math.Ceil(2*o.ConnectRate))))
}

// newAdmission returns the limiter of new stream connections: rate a
// second, up to burst at once; a negative rate admits everything.
func newAdmission(r float64, burst int) *rate.Limiter {
	if r < 0 {
		return rate.NewLimiter(rate.Inf, 0)
	}
	return rate.NewLimiter(rate.Limit(r), burst)
}

// admitAt spends one of l's tokens if there is one at now; otherwise it
// says how long until there will be, and spends nothing, so that refused
// connections do not push back the ones that come later.
func admitAt(l *rate.Limiter, now time.Time) (time.Duration, bool) {
	res := l.ReserveN(now, 1)
	if !res.OK() {
		return time.Second, false // a burst below one; streamDefaults prevents it
	}
	if wait := res.DelayFrom(now); wait > 0 {
		res.CancelAt(now)
		return wait, false
	}
	return 0, true
}

// admit wraps a stream route with admission control: during a reconnect
// storm, connections past Options.ConnectRate are refused with 429 before
// any stream work is done, and told when to come back.
func (s *Server) admit(h func(*call) error) func(*call) error {
	return func(c *call) error {
		wait, ok := admitAt(s.admission, time.Now())
		if ok {
			return h(c)
		}
		secs := max(1, int(math.Ceil(wait.Seconds())))
		c.ctx.Response.Header.Set("Retry-After", strconv.Itoa(secs))
		// Answered by the route's protocol, as the guard's refusals are.
		return &guardError{fasthttp.StatusTooManyRequests, CodeRateLimited,
			errors.New("rate limited: too many new connections, retry after " + strconv.Itoa(secs) + "s")}
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
// WebSocket, and the caller's right to it and to serve the capabilities it
// declares: a declaration the gateway refuses refuses the connection,
// before any stream byte or the upgrade, so that the runner is told why.
func (s *Server) runnerParams(c *call) (peer.Key, []string, error) {
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
	if err := s.actAsRunner(c.principal, runnerID); err != nil {
		return peer.Key{}, nil, err
	}
	if err := s.mayServe(c.principal, caps); err != nil {
		return peer.Key{}, nil, err
	}
	return peer.Key{Role: kernel.RoleRunner, ID: runnerID, Consumer: consumerID}, caps, nil
}

// peerSocket is what an agent, runner or channel socket serves.
type peerSocket struct {
	role   string
	key    peer.Key
	caps   []string // what a runner serves, for peer.Presence
	cursor *uint64  // from the cursor parameter or Last-Event-ID
	other  string   // the other store's epoch the cursor names, if it does
}

func (s *Server) agentWS(c *call) error {
	key, err := agentParams(c)
	if err != nil {
		return err
	}
	ps := &peerSocket{role: kernel.RoleAgent, key: key}
	return s.upgradePeer(c, ps)
}

func (s *Server) runnerWS(c *call) error {
	key, caps, err := s.runnerParams(c)
	if err != nil {
		return err
	}
	ps := &peerSocket{role: kernel.RoleRunner, key: key, caps: caps}
	return s.upgradePeer(c, ps)
}

func (s *Server) upgradePeer(c *call, ps *peerSocket) error {
	cur, other, err := peerCursor(c.ctx, s.k.Epoch())
	if err != nil {
		return err
	}
	ps.cursor, ps.other = cur, other
	s.upgrade(c, "ws_"+ps.role, func(w *wsConn) { s.servePeer(w, ps) })
	return nil
}

func (s *Server) executionWS(c *call) error {
	id := c.params[0]
	v, err := s.execution(c.ctx, c.principal, auth.ActRead, id, nil)
	if err != nil {
		return err
	}
	res := executionResource(&v)
	// The socket is Gatehouse's own: every one of its cursors is strict.
	var after uint64
	for _, cur := range []struct {
		name string
		v    []byte
	}{{"after_sequence", c.ctx.QueryArgs().Peek("after_sequence")}, {"cursor", c.ctx.QueryArgs().Peek("cursor")},
		{"Last-Event-ID", c.ctx.Request.Header.Peek("Last-Event-ID")}} {
		n, err := sequence(cur.name, cur.v)
		if err != nil {
			return err
		}
		after = max(after, n)
	}
	s.upgrade(c, "ws_execution", func(w *wsConn) { s.serveExecution(w, res, after) })
	return nil
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
		w := &wsConn{s: s, ctx: ctx, raw: ws, format: formatOf(ws.Subprotocol())}
		w.principal.Store(principal)
		serve(w)
	})
	if err == nil {
		// Only the metrics see this status: a hijacked response is not sent.
		c.ctx.SetStatusCode(fasthttp.StatusSwitchingProtocols)
		return
	}
	// Accept has answered in plain text; keep its status and headers
	// (Upgrade, Sec-WebSocket-Version, ...) but answer in the JSON of the
	// route's protocol.
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
	s.refuse(c.ctx, s.surfaceAt(string(c.ctx.Path())), &guardError{status, code, errors.New("websocket handshake refused: " + reason)})
}

// wsConn is one accepted socket: the stream engine's WebSocket transport,
// with the socket's encoding and the credential its commands run with.
type wsConn struct {
	*stream.WS // set by open
	s          *Server
	raw        *websocket.Conn
	// ctx is cancelled by the Tracker once the socket is done. Reads, writes
	// and pings do not use it: every end of the socket closes it, which ends
	// them as well, and each use would leave an idle socket holding the
	// context.AfterFunc bookkeeping it costs.
	ctx    context.Context
	format wireFormat
	// principal opened the socket, or refreshed its credential since: its
	// commands run with its rights, and the socket ends when it expires.
	principal atomic.Pointer[auth.Principal]
}

// open makes the socket the transport of a stream of frames of type typ
// (event or delivery), which ends with the close code closeFor gives.
func (w *wsConn) open(typ string, closeFor func(stream.Reason, error) (websocket.StatusCode, string)) {
	w.WS = stream.NewWS(w.raw, stream.WSOptions{
		Binary:       w.format == formatMsgpack,
		Encode:       w.encoder(typ),
		WriteTimeout: w.s.opts.WriteTimeout,
		PingInterval: w.s.opts.PingInterval,
		CloseTimeout: w.s.opts.CloseTimeout,
		CloseFor:     closeFor,
	})
}

// send writes one frame, given as JSON, in the socket's encoding.
func (w *wsConn) send(frame []byte) error {
	scratch := w.s.bufs.get()
	defer w.s.bufs.put(scratch)
	data, err := w.format.encodeFrame(scratch, frame)
	if err != nil {
		w.s.log.Error("encode websocket frame", "err", err)
		w.End(websocket.StatusInternalError, "internal error")
		return err
	}
	return w.Send(data)
}

// encoder returns the engine's frame encoder for a stream of frames of
// type typ (event or delivery) on this socket: a stream.reset notice
// becomes a reset frame.
func (w *wsConn) encoder(typ string) func(dst []byte, f *stream.Frame) ([]byte, error) {
	return func(dst []byte, f *stream.Frame) ([]byte, error) {
		var frame []byte
		if f.Event == typeReset {
			frame = appendReset(dst, f.Data)
		} else {
			frame = appendPush(dst, typ, f.Seq, f.Event, f.Data)
		}
		if w.format == formatJSON {
			return frame, nil
		}
		scratch := w.s.bufs.get()
		defer w.s.bufs.put(scratch)
		if err := jsonToMsgpack(scratch, frame); err != nil {
			return nil, err
		}
		return append(frame[:0], scratch.Bytes()...), nil
	}
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

// finish ends the socket if nothing else did and waits for its close
// handshake or for the Tracker to give up on it.
func (w *wsConn) finish() { w.Finish(w.ctx) }

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
	if !w.ExpireAt(p.ExpiresAt) {
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

// readMessage reads the next client message. When the socket cannot go on
// it ends it with the code that says why and reports false: the peer's own
// close is answered with 1000, as is a peer that went away; a message past
// the read limit gets 1009 (coder/websocket has sent it); a text message
// that is not UTF-8 1007 (RFC 6455 §8.1); a frame that breaks the protocol
// 1002, which coder/websocket sends itself for most but only reports for
// an unmasked client frame.
func (w *wsConn) readMessage() ([]byte, bool) {
	typ, data, err := w.Read()
	switch {
	case err == nil && typ == websocket.MessageText && !utf8.Valid(data):
		w.End(websocket.StatusInvalidFramePayloadData, "text frame is not valid UTF-8")
	case err == nil:
		return data, true
	case websocket.CloseStatus(err) != -1, errors.Is(err, websocket.ErrMessageTooBig),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		w.End(websocket.StatusNormalClosure, "")
	default:
		w.End(websocket.StatusProtocolError, "protocol error")
	}
	return nil, false
}

// readFrames reads client frames until the socket ends and hands each valid
// one to handle. A malformed frame is answered with an error reply when it
// has an id, and otherwise ends the socket with 1007.
func (w *wsConn) readFrames(handle func(fr inFrame, first bool)) {
	first := true
	for {
		data, ok := w.readMessage()
		if !ok {
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
			w.End(websocket.StatusInvalidFramePayloadData, err.Error())
			return
		}
		handle(fr, first)
		first = false
	}
}

// peerSession is an agent, runner or channel socket while it runs. The
// handler's goroutine reads the client's frames; deliveries are written by
// the stream engine, whose pump runs only while the outbox has something to
// send, so an idle socket costs one goroutine, not two.
type peerSession struct {
	s      *Server
	w      *wsConn
	ps     *peerSocket
	epoch  string
	render stream.Renderer
	st     *stream.Stream
	// current is the outbox connection that acks go to; a resume frame
	// replaces it.
	current atomic.Pointer[peer.Conn]
	// saying counts the output intents waiting to be durable.
	saying chan struct{}
}

// servePeer serves an agent's or runner's outbox on a socket. Unlike legacy
// SSE, a delivery is not acknowledged by writing it: the client acks, and
// what it has not acked comes again on its next connection.
func (s *Server) servePeer(w *wsConn, ps *peerSocket) {
	p := &peerSession{s: s, w: w, ps: ps, epoch: s.k.Epoch(), saying: make(chan struct{}, maxSaying)}
	p.render = outboxRenderer(p.epoch)
	conn, reset := s.attach(ps.key, ps.cursor, ps.other, ps.caps)
	p.current.Store(conn)
	w.open(frameDelivery, peerClose)
	p.st = stream.New(newOutboxSource(conn, p.epoch, ps.other, reset), p.render, w, stream.Options{})
	w.OnEnd(func() {
		p.st.Stop()
		p.current.Load().Detach()
	})
	hello := appendHello(nil, p.epoch, ps.role, ps.key.ID, ps.key.Consumer, s.opts.PingInterval)
	if w.send(hello) == nil {
		w.ExpireAt(w.principal.Load().ExpiresAt)
		p.st.Start()
		w.StartPings()
		w.readFrames(p.frame)
	}
	w.End(websocket.StatusNormalClosure, "")
	// A resume may have attached after the end detached the previous one.
	p.current.Load().Detach()
	w.finish()
}

// peerClose maps the end of an outbox stream to its close code.
func peerClose(reason stream.Reason, err error) (websocket.StatusCode, string) {
	switch {
	case errors.Is(err, peer.ErrForgotten):
		return CloseForgotten, "forgotten: the gateway gave up on this consumer"
	case errors.Is(err, peer.ErrSuperseded):
		return CloseSuperseded, "superseded by a newer connection"
	}
	return defaultClose(reason)
}

// resume restarts delivery from the cursor of a resume frame. The engine
// writes what the old connection had handed out, then the reset, if any,
// and the deliveries from the new one, before the next frame is read: the
// client may already ack a delivery that the old connection wrote, and an
// ack is capped at what the current connection has handed out.
func (p *peerSession) resume(fr inFrame) {
	cur := fr.Cursor
	p.st.Switch(func() stream.Source {
		other := fr.Epoch
		if other == p.epoch {
			other = ""
		}
		conn, reset := p.s.attach(p.ps.key, &cur, other, p.ps.caps)
		p.current.Store(conn)
		return newOutboxSource(conn, p.epoch, other, reset)
	})
}

// frame handles one client frame, in the handler's goroutine, which reads
// them: commands run one at a time, in the order sent.
func (p *peerSession) frame(fr inFrame, first bool) {
	w := p.w
	switch fr.Type {
	case frameAck:
		p.current.Load().Ack(fr.Seq)
		// An ack with an id asks to be told once it is durable, as an
		// HTTP ack's answer tells.
		if fr.ID != "" {
			if err := p.s.hub.Flush(); err != nil {
				_ = w.replyError(fr.ID, ackError(err))
				return
			}
			_ = w.reply(fr.ID, fasthttp.StatusOK, statusOK)
		}
	case frameResume:
		if !first {
			w.frameRefused(fr, "resume must be the first frame")
			return
		}
		p.resume(fr)
	case frameRefresh:
		w.refresh(fr, p.scope)
	case frameCommand:
		if p.ps.role == kernel.RoleAgent && fr.Command == cmdIntent && p.say(fr) {
			return
		}
		status, resp, after := p.s.peerCommand(w, p.ps, fr)
		_ = w.reply(fr.ID, status, resp)
		// After the reply is written, so that pushes the command caused
		// cannot overtake it.
		after.Run()
	}
}

// maxSaying bounds the output intents of one socket waiting to be durable;
// past it the socket reads no further frame until one is.
const maxSaying = 1024

// say takes an output intent, if fr is one, and reports whether it did: it
// takes its place in order here, on the socket's reader, and its reply goes
// out once it is durable, without holding up the frames after it (an agent
// streams deltas faster than a disk write each).
func (p *peerSession) say(fr inFrame) bool {
	if !bytes.Contains(fr.Body, []byte(`"output"`)) {
		return false
	}
	var req kernel.IntentRequest
	if decodeBody(fr.Body, &req, p.s.opts.MaxBodyBytes) != nil || req.Intent.Type != kernel.IntentOutput {
		return false
	}
	w := p.w
	fail := func(err error) bool {
		status, body := statusOf(err)
		_ = w.reply(fr.ID, status, body)
		return true
	}
	if err := p.s.touch(w.ctx, w.principal.Load(), auth.ActAct, req.ExecutionID, nil); err != nil {
		return fail(err)
	}
	done, err := p.s.k.Say(w.ctx, req, kernel.Meta{})
	if err != nil {
		return fail(err)
	}
	p.saying <- struct{}{}
	go func() {
		defer func() { <-p.saying }()
		select {
		case err := <-done:
			if err != nil {
				fail(err)
				return
			}
			_ = w.reply(fr.ID, fasthttp.StatusOK, kernel.IntentResult{Accepted: true})
		case <-w.Ending():
		}
	}()
	return true
}

// scope checks that a refreshed credential still grants the socket's id
// and, for a runner, every tool the runner serves: a credential narrowed
// since may not keep serving what it no longer may declare.
func (p *peerSession) scope(pr *auth.Principal) error {
	switch p.ps.role {
	case kernel.RoleRunner:
		if err := p.s.actAsRunner(pr, p.ps.key.ID); err != nil {
			return err
		}
		return p.s.mayServe(pr, p.s.k.RunnerCapabilities(p.ps.key.ID))
	case channel.RoleChannel:
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
	w.End(websocket.StatusInvalidFramePayloadData, msg)
}

// peerCommand maps a command frame to the shared command layer. Runner
// commands name the socket's runner; started names its step in the body,
// since the frame has no path to carry it.
func (s *Server) peerCommand(w *wsConn, ps *peerSocket, fr inFrame) (int, any, kernel.After) {
	if ps.role == channel.RoleChannel {
		return s.channelCommand(w, ps, fr)
	}
	var name, pathID string
	switch {
	case ps.role == kernel.RoleAgent && (fr.Command == cmdIntent || fr.Command == cmdStepResult):
		name = fr.Command
	case ps.role == kernel.RoleAgent && fr.Command == cmdDeclare:
		name, pathID = fr.Command, ps.key.ID
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
		want := "intent, step_result or declare"
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

// serveExecution streams an execution's events from the store on a
// socket; it closes with 1000 right after the terminal event.
func (s *Server) serveExecution(w *wsConn, res auth.Resource, last uint64) {
	id := res.ID
	src := newEventSource(s.k, s.arenas, id, last)
	w.open(frameEvent, executionClose)
	if w.send(appendHello(nil, s.k.Epoch(), "execution", id, "", s.opts.PingInterval)) != nil {
		src.Close()
		w.finish()
		return
	}
	w.ExpireAt(w.principal.Load().ExpiresAt)
	st := stream.New(src, renderEvent, w, stream.Options{Final: isTerminal})
	w.OnEnd(st.Stop)
	st.Start()
	w.StartPings()
	w.readFrames(func(fr inFrame, _ bool) {
		// Acks and resumes mean nothing here: the client's position is
		// the sequence it reconnects with. One that asks for a reply
		// (carries an id) is told so; one without is ignored.
		switch fr.Type {
		case frameAck, frameResume:
			if fr.ID != "" {
				_ = w.replyError(fr.ID, kernelValidation("the execution socket takes no "+fr.Type+": reconnect with after_sequence to move"))
			}
		case frameCommand:
			w.frameRefused(fr, "the execution socket takes no commands")
		case frameRefresh:
			w.refresh(fr, func(p *auth.Principal) error { return p.Authorize(auth.ActRead, res) })
		}
	})
	w.finish()
}

// executionClose maps the end of an execution's stream to its close code.
func executionClose(reason stream.Reason, err error) (websocket.StatusCode, string) {
	switch {
	case reason == stream.Finished:
		return websocket.StatusNormalClosure, "execution finished"
	case errors.Is(err, kernel.ErrUnavailable):
		return websocket.StatusTryAgainLater, "event store unavailable"
	case errors.Is(err, errKernelClosed):
		return websocket.StatusGoingAway, "server shutting down"
	}
	return defaultClose(reason)
}

// defaultClose is the close code of an end that needs no particular one.
func defaultClose(reason stream.Reason) (websocket.StatusCode, string) {
	switch reason {
	case stream.Finished, stream.Gone:
		return websocket.StatusNormalClosure, ""
	case stream.Shutdown:
		return websocket.StatusGoingAway, "server shutting down"
	case stream.Expired:
		return CloseTokenExpired, "token expired"
	case stream.SlowConsumer:
		return CloseSlowConsumer, "slow consumer"
	}
	return websocket.StatusInternalError, "internal error"
}

// WebSocket carries a protocol surface's stream on a socket; see
// protocol.Gateway.
func (s *Server) WebSocket(req *protocol.Request, kind string, r stream.Renderer, src stream.Source) {
	c := &call{ctx: req.Ctx, params: req.Params, principal: req.Principal}
	s.upgrade(c, kind, func(w *wsConn) {
		w.WS = stream.NewWS(w.raw, stream.WSOptions{
			Encode:       func(dst []byte, f *stream.Frame) ([]byte, error) { return append(dst, f.Data...), nil },
			WriteTimeout: s.opts.WriteTimeout, PingInterval: s.opts.PingInterval, CloseTimeout: s.opts.CloseTimeout,
		})
		st := stream.New(src, r, w, stream.Options{})
		w.OnEnd(st.Stop)
		w.ExpireAt(w.principal.Load().ExpiresAt)
		st.Start()
		w.StartPings()
		for {
			if _, ok := w.readMessage(); !ok {
				break
			}
		}
		w.finish()
	})
	if req.Ctx.Response.StatusCode() != fasthttp.StatusSwitchingProtocols {
		src.Close() // refused: the source never ran
	}
}
