package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/store"
)

// sseHeaders starts an SSE response and returns a channel closed when the
// client goes away. Nothing may be written to ctx after.
//
// A stream's connection is closed when the stream ends, never reused: that
// lets a reader goroutine own the socket's read side while the stream runs,
// so a client that disconnects is noticed at once instead of at the next
// failed heartbeat write (which the kernel's lost-peer timers depend on).
func (s *Server) sseHeaders(ctx *fasthttp.RequestCtx) *sseConn {
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
	ctx.SetConnectionClose()
	conn := ctx.Conn()
	return &sseConn{conn: conn, gone: watchClosed(conn), timeout: s.opts.WriteTimeout}
}

// sseConn is the socket under a stream.
type sseConn struct {
	conn    net.Conn
	gone    <-chan struct{}
	timeout time.Duration
}

// flush writes what is buffered within the write timeout: a client that
// stops reading fills its socket buffer, and the stream must then end (the
// client resumes from its cursor) rather than hold a goroutine forever.
func (c *sseConn) flush(w *bufio.Writer) error {
	_ = c.conn.SetWriteDeadline(time.Now().Add(c.timeout))
	return w.Flush()
}

// watchClosed reads the connection until it fails. An SSE client sends
// nothing after its request, so any read error means it is gone.
func watchClosed(conn net.Conn) <-chan struct{} {
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		_ = conn.SetReadDeadline(time.Time{})
		var b [512]byte
		for {
			if _, err := conn.Read(b[:]); err != nil {
				return
			}
		}
	}()
	return gone
}

// writeFrame writes one SSE frame; id 0 leaves out the id line. The data is
// compact one-line JSON, so one data line suffices.
func writeFrame(w *bufio.Writer, id uint64, typ string, data []byte) {
	if id > 0 {
		w.WriteString("id: ")
		w.WriteString(strconv.FormatUint(id, 10))
		w.WriteByte('\n')
	}
	w.WriteString("event: ")
	w.WriteString(typ)
	w.WriteString("\ndata: ")
	w.Write(data)
	w.WriteString("\n\n")
}

// eventType finds an envelope's type without decoding the payload. The
// envelope's own "type" key precedes the payload, and the keys before it
// hold ids that cannot contain the pattern.
func eventType(data []byte) string {
	const key = `"type":"`
	i := bytes.Index(data, []byte(key))
	if i < 0 {
		return "message"
	}
	rest := data[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return "message"
	}
	return string(rest[:j])
}

// cursor reads where a reconnecting reader resumes: the Last-Event-ID header
// (what EventSource clients send) or after_sequence, whichever is later.
func cursor(ctx *fasthttp.RequestCtx) uint64 {
	after := parseSeq(ctx.QueryArgs().Peek("after_sequence"))
	if h := ctx.Request.Header.Peek("Last-Event-ID"); len(h) > 0 {
		if n := parseSeq(h); n > after {
			after = n
		}
	}
	return after
}

// streamExecution streams an execution's events from a cursor and closes
// right after the terminal event, also when the cursor is already past it.
func (s *Server) streamExecution(c *call) {
	id := c.params[0]
	if _, err := s.execution(c.ctx, c.principal, auth.ActRead, id, nil); err != nil {
		s.writeError(c.ctx, err)
		return
	}
	after := cursor(c.ctx)
	watch := s.k.Watch(id)
	sc := s.sseHeaders(c.ctx)
	expiry := c.principal.ExpiresAt
	s.streams.Add(1)
	s.metrics.streams.WithLabelValues("execution").Inc()
	c.ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer s.streams.Done()
		defer s.metrics.streams.WithLabelValues("execution").Dec()
		defer watch.Stop()
		w.WriteString("retry: 5000\n\n")
		if sc.flush(w) != nil {
			return
		}
		beat := time.NewTicker(s.opts.Heartbeat)
		defer beat.Stop()
		expired, stopExpiry := expiryTimer(expiry)
		defer stopExpiry()
		last := after
		for {
			done := false
			err := s.k.ReadEvents(id, last, func(seq uint64, data []byte) bool {
				typ := eventType(data)
				writeFrame(w, seq, typ, data)
				last = seq
				done = event.IsTerminal(typ)
				return !done
			})
			if err != nil || sc.flush(w) != nil || done {
				return
			}
			if !s.k.Live(id) {
				// Finished before or while we read: everything is committed
				// now, so one more read delivers the rest and ends.
				_ = s.k.ReadEvents(id, last, func(seq uint64, data []byte) bool {
					writeFrame(w, seq, eventType(data), data)
					return true
				})
				_ = sc.flush(w)
				return
			}
			if !s.await(sc, w, watch.C(), watch.Done(), beat.C, expired) {
				return
			}
		}
	})
}

func (s *Server) streamAgent(c *call) {
	key, err := agentParams(c)
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	s.streamPeer(c, "agent", key, func() func() { return s.k.AgentConnected(key.ID, key.Consumer) })
}

func (s *Server) streamRunner(c *call) {
	key, caps, err := runnerParams(c)
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	s.streamPeer(c, "runner", key, func() func() { return s.k.RunnerConnected(key.ID, key.Consumer, caps) })
}

func checkIDs(ids map[string]string) error {
	for name, v := range ids {
		if len(v) > 256 {
			return kernelValidation(name + " exceeds maximum length of 256 characters")
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
func (s *Server) streamPeer(c *call, kind string, key peer.Key, connect func() func()) {
	cur, epochOK, err := peerCursor(c.ctx, s.k.Epoch())
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	explicit := string(c.ctx.QueryArgs().Peek("ack")) == "explicit"
	expiry := c.principal.ExpiresAt
	// Runners settle by acting on jobs; agents and channels that cannot
	// acknowledge mark a flushed delivery as delivered: a reconnect without
	// a cursor starts after it, one with an earlier cursor still gets it.
	ackOnFlush := !explicit && key.Role != kernel.RoleRunner
	sc := s.sseHeaders(c.ctx)
	s.streams.Add(1)
	s.metrics.streams.WithLabelValues(kind).Inc()
	epoch := s.k.Epoch()
	c.ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer s.streams.Done()
		defer s.metrics.streams.WithLabelValues(kind).Dec()
		conn, reset := s.hub.Attach(key, cur)
		defer conn.Detach()
		disconnected := connect()
		defer disconnected()
		w.WriteString("retry: 5000\n\n")
		if !epochOK {
			reset = &peer.Reset{Reason: peer.ResetEpochChanged, ResumeFrom: 1}
		}
		if reset != nil {
			writeFrame(w, 0, "stream.reset", resetBody(epoch, reset))
		}
		if sc.flush(w) != nil {
			return
		}
		beat := time.NewTicker(s.opts.Heartbeat)
		defer beat.Stop()
		expired, stopExpiry := expiryTimer(expiry)
		defer stopExpiry()
		for {
			var last uint64
			for {
				d, ok := conn.Next()
				if !ok {
					break
				}
				writePeerFrame(w, epoch, d)
				last = d.Seq
			}
			if last > 0 {
				if sc.flush(w) != nil {
					return
				}
				if ackOnFlush {
					conn.Delivered(last)
				}
			}
			if !s.await(sc, w, conn.Ready(), conn.Done(), beat.C, expired) {
				return
			}
		}
	})
}

// Deliverer adapts a peer hub to the kernel's delivery interface.
func Deliverer(h *peer.Hub) kernel.Deliverer { return hubDeliverer{h} }

type hubDeliverer struct{ h *peer.Hub }

func key(p kernel.Peer) peer.Key { return peer.Key{Role: p.Role, ID: p.ID, Consumer: p.Consumer} }

func (d hubDeliverer) Stage(b *store.Batch, p kernel.Peer, typ string, data []byte, settle string) kernel.Staged {
	return d.h.Stage(b, key(p), typ, data, settle)
}

func (d hubDeliverer) Settle(b *store.Batch, p kernel.Peer, settle string) func() {
	return d.h.Settle(b, key(p), settle)
}

func (d hubDeliverer) Forget(p kernel.Peer) { d.h.Forget(key(p)) }

// writePeerFrame writes an outbox delivery with its resumable id.
func writePeerFrame(w *bufio.Writer, epoch string, d peer.Delivery) {
	w.WriteString("id: ")
	w.WriteString(epoch)
	w.WriteByte('.')
	w.WriteString(strconv.FormatUint(d.Seq, 10))
	w.WriteByte('\n')
	writeFrame(w, 0, d.Type, d.Data)
}

// resetBody is the payload of a stream.reset frame: the consumer cannot
// resume where it asked and should re-hydrate (list its executions) first.
func resetBody(epoch string, r *peer.Reset) []byte {
	data, _ := json.Marshal(map[string]any{
		"reason": r.Reason, "epoch": epoch, "resume_from": r.ResumeFrom, "latest_sequence": r.Latest,
		"snapshot": "/v0/executions",
	})
	return data
}

// peerCursor reads a consumer's resume cursor from the cursor parameter or
// Last-Event-ID: "<epoch>.<seq>" or a bare "<seq>". A cursor of another
// epoch (a wiped or different store) cannot be honoured; ok is false then.
func peerCursor(ctx *fasthttp.RequestCtx, epoch string) (cur *uint64, ok bool, err error) {
	raw := string(ctx.QueryArgs().Peek("cursor"))
	if raw == "" {
		raw = string(ctx.Request.Header.Peek("Last-Event-ID"))
	}
	if raw == "" {
		return nil, true, nil
	}
	seqPart := raw
	if e, s, found := strings.Cut(raw, "."); found {
		if e != epoch {
			return nil, false, nil
		}
		seqPart = s
	}
	n, perr := strconv.ParseUint(seqPart, 10, 64)
	if perr != nil {
		return nil, true, kernelValidation("cursor must be <epoch>.<sequence> or <sequence>")
	}
	return &n, true, nil
}

// expiryTimer fires when a credential expires; a zero time never fires.
// A long-lived stream must not outlive the token that opened it.
func expiryTimer(at time.Time) (<-chan time.Time, func()) {
	if at.IsZero() {
		return nil, func() {}
	}
	t := time.NewTimer(time.Until(at))
	return t.C, func() { t.Stop() }
}

// writeExpired tells the client why its stream ends: reconnect with a fresh token.
func (c *sseConn) writeExpired(w *bufio.Writer) {
	writeFrame(w, 0, "stream.expired", []byte(`{"reason":"token expired","code":"UNAUTHORIZED"}`))
	_ = c.flush(w)
}

// await blocks until a stream may have more to send (true) or must end
// (false): its source ended, the client left, its token expired or the
// server is shutting down. Heartbeats are written while it waits.
func (s *Server) await(sc *sseConn, w *bufio.Writer, ready, done <-chan struct{}, beat, expired <-chan time.Time) bool {
	select {
	case <-ready:
		return true
	case <-beat:
		w.WriteString(":heartbeat\n\n")
		return sc.flush(w) == nil
	case <-done:
	case <-sc.gone:
	case <-expired:
		sc.writeExpired(w)
	case <-s.closing:
	}
	return false
}
