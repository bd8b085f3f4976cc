package relay

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// lingerTime bounds how long a client may still send once the far side
// has closed its own: what it sends has nowhere to go, but closing its
// connection at once, with bytes of it unread, would reset the connection
// and could discard the far side's last answer before the client reads it.
const lingerTime = 2 * time.Second

// copyBufferBytes is the buffer of each direction of a splice. A splice
// holds its two while it waits for bytes, so an idle WebSocket costs 16
// KiB here; larger buffers would cost thousands of idle sockets dearly and
// gain little on frames this size.
const copyBufferBytes = 8 << 10

// splice is one passed-on connection: the client's, as it was accepted,
// and the one dialed to the far side (the leader, or an edge box).
type splice struct {
	client net.Conn
	far    net.Conn
	once   sync.Once

	// mu orders the two copies' marks of who spoke last.
	mu sync.Mutex
	// waiting: the client sent bytes after the far side's last, so it
	// waits for an answer of which it has had no byte, if those ended an
	// answer.
	waiting bool
	// answers follows where the far side's answers end.
	answers answers
}

// sending marks that the client sent bytes.
func (sp *splice) sending([]byte) {
	sp.mu.Lock()
	sp.waiting = true
	sp.mu.Unlock()
}

// answering marks that the far side sent p. It is called before p is
// written to the client, so that the client's next request, which follows
// it, is marked after.
func (sp *splice) answering(p []byte) {
	sp.mu.Lock()
	sp.waiting = false
	sp.answers.feed(p)
	sp.mu.Unlock()
}

// owed says whether the client sent a request after the far side's last
// whole answer and has had no byte of its answer.
func (sp *splice) owed() bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.waiting && sp.answers.whole()
}

// close closes both connections, which ends both directions of the copy.
func (sp *splice) close() {
	_ = sp.client.Close()
	_ = sp.far.Close()
}

// splices are the open splices of a Relay or an Edges: shutdown closes
// them and waits for their copies to end.
type splices struct {
	mu      sync.Mutex
	closing bool
	set     map[*splice]struct{}
	wg      sync.WaitGroup
	open    atomic.Int64
}

// add registers a splice of client and far; false once shutdown has begun.
func (s *splices) add(client, far net.Conn) (*splice, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return nil, false
	}
	if s.set == nil {
		s.set = map[*splice]struct{}{}
	}
	sp := &splice{client: client, far: far}
	s.set[sp] = struct{}{}
	s.wg.Add(1)
	s.open.Add(1)
	return sp, true
}

// finish closes both connections of sp and forgets it.
func (s *splices) finish(sp *splice) { s.end(sp, sp.close) }

// drop closes the far side of sp only and forgets it: the client is still
// answered by this node.
func (s *splices) drop(sp *splice) { s.end(sp, func() { _ = sp.far.Close() }) }

func (s *splices) end(sp *splice, closeConns func()) {
	sp.once.Do(func() {
		closeConns()
		s.mu.Lock()
		delete(s.set, sp)
		s.mu.Unlock()
		s.open.Add(-1)
		s.wg.Done()
	})
}

// closeAll refuses new splices and closes every open one.
func (s *splices) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	for sp := range s.set {
		sp.close()
	}
}

// wait returns once every splice has ended.
func (s *splices) wait() <-chan struct{} {
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	return done
}

// run copies both ways between the client's hijacked connection c (which
// reads first what fasthttp buffered past the first request) and the far
// side, counting the bytes into up and down, until either side is done,
// and then finishes sp. A side that ends its sending (EOF) is half-closed
// through to the other, which may still answer; any error closes both.
//
// With unanswered set, a far side that ends (closed or failed) while the
// client waits for an answer of which it has had no byte gets unanswered
// instead of a bare close, and the client's connection then closes as
// after any answer of the far side's. A client is taken to wait when it
// sent bytes after the far side's last, and those ended a whole answer
// (answers): HTTP/1.1 clients send a request once the previous answer is
// whole. Where that cannot be told (a pipelined request, an answer of
// unknown length, a switch of protocols), the client's connection is only
// closed, as without unanswered.
func (s *splices) run(sp *splice, c net.Conn, up, down *atomic.Uint64, timeout time.Duration, unanswered func(net.Conn) error) {
	defer s.finish(sp)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		rerr, werr := pipe(sp.far, c, up, timeout, sp.sending)
		switch {
		case rerr == nil && werr == nil:
			closeWrite(sp.far)
		case werr != nil && unanswered != nil:
			// The far side failed: the copy the other way reads what it
			// still sent, bounded, then answers the client or closes it.
			// What the client still sends is read and dropped meanwhile,
			// so that its connection is not reset with the answer unread.
			_ = sp.far.SetReadDeadline(time.Now().Add(lingerTime))
			_, _ = io.Copy(io.Discard, c)
		default:
			sp.close()
		}
	}()
	rerr, werr := pipe(c, sp.far, down, timeout, sp.answering)
	switch {
	case werr != nil:
		sp.close()
	case unanswered != nil && sp.owed():
		// Nothing more can come from the far side: close it, so that the
		// copy towards it stops too.
		_ = sp.far.Close()
		_ = c.SetWriteDeadline(time.Now().Add(timeout))
		if err := unanswered(c); err != nil {
			sp.close()
			break
		}
		closeWrite(sp.client)
		_ = sp.client.SetReadDeadline(time.Now().Add(lingerTime))
	case rerr != nil:
		sp.close()
	default:
		closeWrite(sp.client)
		// The far side is done with this connection: the client's side
		// lingers only briefly.
		_ = sp.client.SetReadDeadline(time.Now().Add(lingerTime))
	}
	<-sent
}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, copyBufferBytes); return &b }}

// pipe copies src to dst, counting into n as it goes, until src ends, and
// calls read with each of src's reads before it is written. It returns
// src's error (nil for EOF) or dst's, which may be a write blocked for
// timeout.
func pipe(dst net.Conn, src io.Reader, n *atomic.Uint64, timeout time.Duration, read func([]byte)) (rerr, werr error) {
	bp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bp)
	buf := *bp
	for {
		nr, err := src.Read(buf)
		if nr > 0 {
			read(buf[:nr])
			_ = dst.SetWriteDeadline(time.Now().Add(timeout))
			nw, err := dst.Write(buf[:nr])
			n.Add(uint64(nw))
			if err != nil {
				return nil, err
			}
		}
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		if err != nil {
			return err, nil
		}
	}
}

// closeWrite half-closes c where its kind allows; elsewhere the full close
// at the end of the splice tells the other side.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// envelope is the /v0 error body, newline-terminated as the gateway's.
func envelope(code, msg string) string {
	b, err := json.Marshal(struct {
		Error string `json:"error"`
		Code  string `json:"code"`
	}{msg, code})
	if err != nil {
		return `{"error":"internal error","code":"INTERNAL_ERROR"}` + "\n"
	}
	return string(b) + "\n"
}
