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
func (s *splices) run(sp *splice, c net.Conn, up, down *atomic.Uint64, timeout time.Duration) {
	defer s.finish(sp)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		if err := pipe(sp.far, c, up, timeout); err != nil {
			sp.close()
			return
		}
		closeWrite(sp.far)
	}()
	if err := pipe(c, sp.far, down, timeout); err != nil {
		sp.close()
	} else {
		closeWrite(sp.client)
		// The far side is done with this connection: the client's side
		// lingers only briefly.
		_ = sp.client.SetReadDeadline(time.Now().Add(lingerTime))
	}
	<-sent
}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, copyBufferBytes); return &b }}

// pipe copies src to dst, counting into n as it goes, until src ends: nil
// for EOF, the error otherwise, or a write to dst blocked for timeout.
func pipe(dst net.Conn, src io.Reader, n *atomic.Uint64, timeout time.Duration) error {
	bp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bp)
	buf := *bp
	for {
		nr, rerr := src.Read(buf)
		if nr > 0 {
			_ = dst.SetWriteDeadline(time.Now().Add(timeout))
			nw, werr := dst.Write(buf[:nr])
			n.Add(uint64(nw))
			if werr != nil {
				return werr
			}
		}
		if errors.Is(rerr, io.EOF) {
			return nil
		}
		if rerr != nil {
			return rerr
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
