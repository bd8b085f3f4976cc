package wsaccept

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// conn is the net.Conn websocket.Accept gets from responseWriter.Hijack and
// that serve later attaches to fasthttp's hijacked conn.
//
// It reads through the hijacked conn rather than the socket underneath,
// because fasthttp's buffered reader may already hold bytes the client
// pipelined behind the handshake; with Tracker.KeepHijackedConns, unbuffer
// takes those bytes out first and then reads the socket directly.
//
// Its Close has to interrupt the socket itself: fasthttp's hijacked conn
// ignores Close unless Server.KeepHijackedConns is set, yet websocket.Conn
// relies on Close to unblock reads and writes.
type conn struct {
	// hc and raw are set by bind before the websocket.Conn is used; hc is
	// cleared by release.
	hc  net.Conn
	raw net.Conn
	// head holds what unbuffer took out of fasthttp's reader, to be read
	// before the socket. Only reads touch it, and websocket.Conn never
	// reads from two goroutines at once.
	head []byte

	laddr, raddr net.Addr

	// inUse is held for reading across every call into hc, so that release
	// can wait until none is in flight.
	inUse  sync.RWMutex
	closed atomic.Bool

	closeOnce sync.Once
	closeErr  error
}

// halfCloser is implemented by *net.TCPConn and *net.UnixConn.
type halfCloser interface {
	CloseRead() error
	CloseWrite() error
}

// socket returns the half-closable socket under nc, looking through TLS
// (*tls.Conn and fasthttp's per-IP TLS wrapper both have NetConn).
func socket(nc net.Conn) (halfCloser, bool) {
	if t, ok := nc.(interface{ NetConn() net.Conn }); ok {
		nc = t.NetConn()
	}
	s, ok := nc.(halfCloser)
	return s, ok
}

// aLongTimeAgo is a deadline that has passed, which makes blocked I/O on a
// net.Conn return at once.
var aLongTimeAgo = time.Unix(1, 0)

func (c *conn) bind(hc net.Conn) {
	c.hc = hc
	c.raw = hc
	if u, ok := hc.(interface{ UnsafeConn() net.Conn }); ok {
		c.raw = u.UnsafeConn()
	}
	c.laddr, c.raddr = hc.LocalAddr(), hc.RemoteAddr()
}

// unbuffer moves reads from fasthttp's buffered reader to the socket
// underneath. With KeepHijackedConns fasthttp leaves that reader, 4 KiB by
// default, to the hijacked conn for as long as it lives; once nothing reads
// through the hijacked conn, the reader is garbage. It must run before the
// conn is used, and only with KeepHijackedConns, where hc's other methods
// are raw's own.
func (c *conn) unbuffer() {
	if c.raw == c.hc || c.raw.SetReadDeadline(aLongTimeAgo) != nil {
		return
	}
	// With the deadline past, the reader hands out what it holds and then
	// fails with the socket's timeout, without taking anything from it.
	var buf [512]byte
	for {
		n, err := c.hc.Read(buf[:])
		c.head = append(c.head, buf[:n]...)
		if err != nil || n == 0 {
			break
		}
	}
	if c.raw.SetReadDeadline(time.Time{}) == nil {
		c.hc = c.raw
	}
}

func (c *conn) Read(p []byte) (int, error) {
	c.inUse.RLock()
	defer c.inUse.RUnlock()
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	if len(c.head) > 0 {
		n := copy(p, c.head)
		if c.head = c.head[n:]; len(c.head) == 0 {
			c.head = nil
		}
		return n, nil
	}
	return c.hc.Read(p)
}

func (c *conn) Write(p []byte) (int, error) {
	c.inUse.RLock()
	defer c.inUse.RUnlock()
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	return c.hc.Write(p)
}

// Close wakes pending I/O with a past deadline and shuts the socket down, so
// the peer sees the end at once. Only behind a plain (non-TLS)
// Server.MaxConnsPerIP wrapper, which hides the socket, does the peer have to
// wait for the handler to return and fasthttp to close the conn.
//
// It must not call Close on raw: without KeepHijackedConns fasthttp closes
// raw itself after the hijack handler returns, and with MaxConnsPerIP raw is
// a pooled wrapper that its first Close returns to the pool, so a second
// Close could cut whichever connection picked it up next. hc.Close is the
// close fasthttp expects from a hijack handler: a no-op by default, the real
// close under KeepHijackedConns, where fasthttp never closes raw itself and
// unbuffer may have made hc raw.
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		if c.hc == nil {
			return // fasthttp never hijacked the connection
		}
		_ = c.hc.SetDeadline(aLongTimeAgo)
		if s, ok := socket(c.raw); ok {
			_ = s.CloseRead()
			_ = s.CloseWrite()
		}
		c.closeErr = c.hc.Close()
	})
	return c.closeErr
}

// release closes c and waits out any call into hc, after which fasthttp may
// recycle hc and its buffered reader for another connection.
func (c *conn) release() {
	_ = c.Close()
	c.inUse.Lock()
	c.hc = nil
	c.inUse.Unlock()
}

func (c *conn) LocalAddr() net.Addr  { return c.laddr }
func (c *conn) RemoteAddr() net.Addr { return c.raddr }

// errDeadline is returned by the deadline setters: websocket.Conn times out
// with contexts, and a deadline moved by anyone else could undo the one
// Close uses to interrupt the socket.
var errDeadline = errors.New("wsaccept: deadlines are not supported, use contexts")

func (c *conn) SetDeadline(time.Time) error      { return errDeadline }
func (c *conn) SetReadDeadline(time.Time) error  { return errDeadline }
func (c *conn) SetWriteDeadline(time.Time) error { return errDeadline }
