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

// lingerTime bounds how long a client may still send once the leader has
// closed its side: what it sends has nowhere to go, but closing its
// connection at once, with bytes of it unread, would reset the connection
// and could discard the leader's last answer before the client reads it.
const lingerTime = 2 * time.Second

// copyBufferBytes is the buffer of each direction of a splice. A splice
// holds its two while it waits for bytes, so an idle WebSocket costs 16
// KiB here; larger buffers would cost thousands of idle sockets dearly and
// gain little on frames this size.
const copyBufferBytes = 8 << 10

// splice is one relayed connection: the client's, as the relay accepted
// it, and the one the relay dialed to the leader.
type splice struct {
	client net.Conn
	leader net.Conn
	once   sync.Once
}

// close closes both connections, which ends both directions of the copy.
func (sp *splice) close() {
	_ = sp.client.Close()
	_ = sp.leader.Close()
}

// begin registers the splice of client and leader, so that Shutdown
// closes them; false once shutdown has begun. The splice is pending until
// fasthttp hands the connection over (unpend).
func (r *Relay) begin(client, leader net.Conn) (*splice, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return nil, false
	}
	sp := &splice{client: client, leader: leader}
	r.splices[sp] = struct{}{}
	r.pending[client] = sp
	r.wg.Add(1)
	r.open.Add(1)
	return sp, true
}

// unpend ends c's pending state and says whether it was pending: the one
// of the hijack handler and connState that finds it runs or ends the
// splice.
func (r *Relay) unpend(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.pending[c]
	delete(r.pending, c)
	return ok
}

// finish closes both connections of sp and forgets it.
func (r *Relay) finish(sp *splice) {
	r.end(sp, sp.close)
}

// drop closes the leader's side of sp only and forgets it: the relay
// still answers the client itself.
func (r *Relay) drop(sp *splice) {
	r.end(sp, func() { _ = sp.leader.Close() })
}

func (r *Relay) end(sp *splice, closeConns func()) {
	sp.once.Do(func() {
		closeConns()
		r.mu.Lock()
		delete(r.splices, sp)
		r.mu.Unlock()
		r.open.Add(-1)
		r.wg.Done()
	})
}

// run copies both ways between the client's hijacked connection c (which
// reads first what fasthttp buffered past the first request) and the
// leader, until either side is done. A side that ends its sending (EOF) is
// half-closed through to the other, which may still answer; any error
// closes both.
func (r *Relay) run(sp *splice, c net.Conn) {
	defer r.finish(sp)
	up := make(chan struct{})
	go func() {
		defer close(up)
		if err := pipe(sp.leader, c, &r.toLeader, r.o.WriteTimeout); err != nil {
			sp.close()
			return
		}
		closeWrite(sp.leader)
	}()
	if err := pipe(c, sp.leader, &r.toClient, r.o.WriteTimeout); err != nil {
		sp.close()
	} else {
		closeWrite(sp.client)
		// The leader is done with this connection: the client's side
		// lingers only briefly.
		_ = sp.client.SetReadDeadline(time.Now().Add(lingerTime))
	}
	<-up
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
