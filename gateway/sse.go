package gateway

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/ident"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/protocol"
	"github.com/gatehouse-dev/gatehouse/stream"
)

// sseHeaders starts an SSE response. Nothing may be written to ctx after.
func sseHeaders(ctx *fasthttp.RequestCtx) {
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
}

// sseStream carries a source on the response in ctx with the /v0 API's
// SSE conventions: a retry advice, heartbeats, the write timeout, the
// credential's expiry announced by a stream.expired event, the server's
// shutdown. open runs on the stream's goroutine once the response has
// begun: it returns the source, may set options (Flushed, Final), and
// returns what to run once the stream has ended.
//
// presence asks to learn of a client's disconnect at once rather than at
// the next failed heartbeat write (the kernel's lost-peer timers depend on
// it for agents and runners): a goroutine then owns the socket's read side
// while the stream runs, so the connection is closed with the stream. A
// stream without it (an execution's, which ends after its terminal event)
// leaves the connection to the client's next request.
func (s *Server) sseStream(c *call, kind string, r stream.Renderer, presence bool, open func(*stream.Options) (stream.Source, func())) {
	so := stream.SSEOptions{Retry: 5 * time.Second, Notice: expiredNotice}
	s.carrySSE(c.ctx, c.principal, kind, r, so, presence, open)
}

// SSE carries a protocol surface's stream; see protocol.Streams.
func (s *Server) SSE(req *protocol.Request, kind string, r stream.Renderer, so stream.SSEOptions, presence bool, open func(*stream.Options) (stream.Source, func())) {
	s.carrySSE(req.Ctx, req.Principal, kind, r, so, presence, open)
}

// carrySSE is sseStream with the surface's own SSE options.
func (s *Server) carrySSE(ctx *fasthttp.RequestCtx, p *auth.Principal, kind string, r stream.Renderer, so stream.SSEOptions, presence bool, open func(*stream.Options) (stream.Source, func())) {
	sseHeaders(ctx)
	conn := ctx.Conn()
	b := &sseBody{
		s: s, kind: kind, conn: conn, r: r, presence: presence, open: open,
		o: stream.Options{Heartbeat: s.opts.Heartbeat, Expires: p.ExpiresAt, Closing: s.closing},
	}
	if presence {
		ctx.SetConnectionClose()
		b.o.Gone = stream.ClientGone(conn)
	}
	so.WriteTimeout = s.opts.WriteTimeout
	b.ac, _ = conn.(answerConn)
	if b.ac != nil {
		so.Last = b.holdToEnd
	}
	b.so = so
	s.streams.Add(1)
	s.metrics.streams.WithLabelValues(kind).Inc()
	ctx.Response.SetBodyStream(b, -1)
}

// sseBody runs an SSE stream on the connection's own goroutine: fasthttp
// hands WriteTo its chunked writer (see fasthttp.BodyWriterTo), so that
// each flush of the stream is one chunk on the socket (the transport
// buffers the frames in between). SetBodyStreamWriter
// would put a pipe and a second goroutine between them, a hand-over per
// flush. Close ends it once, when fasthttp closes the body, also if
// WriteTo never ran (a response that is not sent). Closing the body also
// tells the connection that the response has ended: the last frames it
// holds back leave with fasthttp's next write, the end of the chunked
// body.
//
// It holds all of a stream's state itself, which closures would each
// allocate apart.
type sseBody struct {
	s        *Server
	kind     string
	conn     net.Conn
	ac       answerConn // nil for a connection Serve did not accept
	r        stream.Renderer
	so       stream.SSEOptions
	o        stream.Options
	presence bool
	open     func(*stream.Options) (stream.Source, func())
	held     bool // the last frames wait for the end of the response
	cw       countingWriter
	once     sync.Once
}

// SupportsBodyWriteTo lets fasthttp call WriteTo rather than Read.
func (b *sseBody) SupportsBodyWriteTo() bool { return true }

// WriteTo runs the stream into w, fasthttp's chunked writer.
func (b *sseBody) WriteTo(w io.Writer) (int64, error) {
	b.cw = countingWriter{w: w}
	b.run(&b.cw)
	return b.cw.n, nil
}

// holdToEnd is the transport's Last: see writeSide.holdToEnd.
func (b *sseBody) holdToEnd() {
	b.held = true
	b.ac.holdToEnd()
}

// run carries the stream into w until it ends.
func (b *sseBody) run(w io.Writer) {
	src, ended := b.open(&b.o)
	if ended != nil {
		defer ended()
	}
	tr := stream.NewSSE(w, b.conn, b.so)
	tr.Open()
	reason, _ := stream.New(src, b.r, tr, b.o).Run(context.Background())
	switch {
	case b.held:
		// The last frames wait for the end of the response, within
		// the write deadline their flush armed; the write that
		// carries them clears it.
	case reason == stream.Finished || reason == stream.Expired:
		// The response ends cleanly and the connection may carry the
		// client's next request: the write deadline the stream armed
		// must not outlive it, or that request's answer would fail.
		_ = b.conn.SetWriteDeadline(time.Time{})
	case !b.presence:
		// A cut stream must not look like a complete answer on a
		// connection the client would then reuse.
		_ = b.conn.Close()
	}
}

// Read is never called: fasthttp writes a stream that supports WriteTo
// through it. It ends the body, should another path read it.
func (b *sseBody) Read([]byte) (int, error) { return 0, io.EOF }

// Close is called by fasthttp once the response is written (or dropped).
func (b *sseBody) Close() error {
	b.once.Do(func() {
		if b.ac != nil {
			b.ac.endHeld()
		}
		b.s.metrics.streams.WithLabelValues(b.kind).Dec()
		b.s.streams.Done()
	})
	return nil
}

// countingWriter counts what passes, for WriteTo's result.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// cursor reads where a reconnecting reader of an execution's SSE stream
// resumes: the Last-Event-ID header (what EventSource clients send) or
// after_sequence, whichever is later. after_sequence keeps the kernel
// API's rule, negative or unparsable is 0, which its clients may rely on;
// Last-Event-ID, which only Gatehouse reads, must be a sequence.
func cursor(ctx *fasthttp.RequestCtx) (uint64, error) {
	after := parseSeq(ctx.QueryArgs().Peek("after_sequence"))
	n, err := sequence("Last-Event-ID", ctx.Request.Header.Peek("Last-Event-ID"))
	return max(after, n), err
}

// sequence reads a resume sequence that Gatehouse defined: decimal digits
// that fit 64 bits, or nothing (0). Anything else ("x.y", "5.", "-1", an
// overflow) is a 400 before a stream starts or a socket upgrades: read as
// 0, it would replay everything, and a client would take the repeats for
// new events.
func sequence(name string, b []byte) (uint64, error) {
	if len(b) == 0 {
		return 0, nil
	}
	n, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return 0, kernelValidation(name + " must be a sequence: decimal digits within 64 bits")
	}
	return n, nil
}

// streamExecution streams an execution's events from a cursor and ends
// right after the terminal event, also when the cursor is already past it.
func (s *Server) streamExecution(c *call) error {
	id := c.params[0]
	if _, err := s.execution(c.ctx, c.principal, auth.ActRead, id, nil); err != nil {
		return err
	}
	after, err := cursor(c.ctx)
	if err != nil {
		return err
	}
	src := newEventSource(s.k, s.arenas, id, after)
	s.sseStream(c, "execution", renderEvent, false, func(o *stream.Options) (stream.Source, func()) {
		o.Final = isTerminal
		return src, nil
	})
	return nil
}

func (s *Server) streamAgent(c *call) error {
	key, err := agentParams(c)
	if err != nil {
		return err
	}
	return s.streamPeer(c, "agent", key, nil)
}

func (s *Server) streamRunner(c *call) error {
	key, caps, err := s.runnerParams(c)
	if err != nil {
		return err
	}
	return s.streamPeer(c, "runner", key, caps)
}

// checkIDs checks ids against package ident's rule; an empty one is an
// optional field left out (required ones are checked first).
func checkIDs(ids map[string]string) error {
	for name, v := range ids {
		if v == "" {
			continue
		}
		if err := ident.Check(name, v); err != nil {
			return kernelValidation(err.Error())
		}
	}
	return nil
}

// streamPeer serves a consumer's outbox over SSE. Every frame carries
// "id: <epoch>.<seq>", so an EventSource client resumes with Last-Event-ID.
//
// Acknowledgement: with ack=explicit the client acknowledges through
// POST /v0/peers/ack. Otherwise (the kernel API's clients, which never
// acknowledge) an agent's delivery counts as acknowledged once written and
// flushed, and a runner's job.assigned once the runner acts on it (reports
// the step started or posts its result), so a job whose delivery was lost
// with the socket is sent again on reconnect.
//
// Who is connected is the hub's to know: attaching tells the kernel (and
// the channels) through peer.Presence, with caps, what a runner serves.
func (s *Server) streamPeer(c *call, kind string, key peer.Key, caps []string) error {
	epoch := s.k.Epoch()
	cur, other, err := peerCursor(c.ctx, epoch)
	if err != nil {
		return err
	}
	explicit := string(c.ctx.QueryArgs().Peek("ack")) == "explicit"
	// Runners settle by acting on jobs; agents and channels that cannot
	// acknowledge mark a flushed delivery as delivered: a reconnect without
	// a cursor starts after it, one with an earlier cursor still gets it.
	ackOnFlush := !explicit && key.Role != kernel.RoleRunner
	s.sseStream(c, kind, outboxRenderer(epoch), true, func(o *stream.Options) (stream.Source, func()) {
		conn, reset := s.attach(key, cur, other, caps)
		if ackOnFlush {
			o.Flushed = conn.Delivered
		}
		return newOutboxSource(conn, epoch, other, reset), nil
	})
	return nil
}

// attach takes over a consumer's outbox from a cursor; the reset, if any,
// tells the client it cannot resume there. A cursor of another epoch
// (other is not empty) resumes from the start of what the outbox holds.
func (s *Server) attach(key peer.Key, cur *uint64, other string, caps []string) (*peer.Conn, *peer.Reset) {
	if other != "" {
		conn, _ := s.hub.Attach(key, nil, caps...)
		return conn, &peer.Reset{Reason: peer.ResetEpochChanged, ResumeFrom: 1}
	}
	return s.hub.Attach(key, cur, caps...)
}

// peerCursor reads a consumer's resume cursor from the cursor parameter or
// Last-Event-ID: "<epoch>.<seq>" or a bare "<seq>". A cursor of another
// epoch (a wiped or different store) cannot be honoured: other names that
// epoch then.
func peerCursor(ctx *fasthttp.RequestCtx, epoch string) (cur *uint64, other string, err error) {
	raw := string(ctx.QueryArgs().Peek("cursor"))
	if raw == "" {
		raw = string(ctx.Request.Header.Peek("Last-Event-ID"))
	}
	return parseCursor(raw, epoch)
}

// parseCursor is peerCursor on the raw value; empty is no cursor.
func parseCursor(raw, epoch string) (cur *uint64, other string, err error) {
	if raw == "" {
		return nil, "", nil
	}
	e, seqPart, dotted := strings.Cut(raw, ".")
	if !dotted {
		e, seqPart = "", raw
	}
	n, perr := strconv.ParseUint(seqPart, 10, 64)
	// The epoch, when given, must look like the store's even when it is
	// not the current one: "x.y" is malformed, not an old cursor.
	if perr != nil || (dotted && !epochSyntax(e)) {
		return nil, "", kernelValidation("cursor must be <epoch>.<sequence> or <sequence>, the sequence in decimal digits")
	}
	if dotted && e != epoch {
		return nil, e, nil
	}
	return &n, "", nil
}

// epochSyntax reports whether e can be a store epoch: 1-64 letters and
// digits.
func epochSyntax(e string) bool {
	if e == "" || len(e) > 64 {
		return false
	}
	for i := 0; i < len(e); i++ {
		if c := e[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}
