package gateway

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/addrlimit"
)

// limitPerIP bounds the connections open at once from one source address
// (package addrlimit). fasthttp's own MaxConnsPerIP races with its
// shutdown (a conn is nilled while a worker still reads it), so the bound
// lives in the listener, where a refused connection never reaches fasthttp
// at all. max <= 0 sets no bound; the connections from an address exempt
// reports (a cluster's peers), if exempt is not nil, are not counted.
//
// Each admitted connection is a perIPConn, which also gives a new
// connection the idle timeout, not the header timeout, to send its first
// byte: HTTP clients dial spare connections and keep them in their pools
// unused, and one closed after a few seconds of silence would fail the
// POST a client later sends on it (clients retry only idempotent requests
// on a connection that turns out closed).
func limitPerIP(ln net.Listener, max int, exempt func(netip.Addr) bool, idle time.Duration, refused func()) net.Listener {
	return addrlimit.Listen(ln, addrlimit.Options{Max: max, Exempt: exempt, Refused: refused,
		Wrap: func(c net.Conn, release func()) net.Conn {
			pc := &perIPConn{Conn: c, release: release, idle: idle}
			if tc, ok := c.(*tls.Conn); ok {
				// fasthttp recognises TLS by these methods.
				return &perIPTLSConn{perIPConn: pc, tls: tc}
			}
			return pc
		}})
}

// perIPConn gives its address's slot back on Close. Until
// its first byte arrives, a read deadline set on it (fasthttp's header
// timeout, which it starts at accept) is held back and the idle timeout
// applies instead; the first byte starts the held-back timeout afresh. Its
// writes go through its writeSide (connwrite.go).
type perIPConn struct {
	net.Conn
	w       writeSide
	release func()
	idle    time.Duration

	started atomic.Bool // the first byte has arrived
	mu      sync.Mutex
	held    time.Duration // the deadline set before it, as a duration; 0: none

	linger atomic.Bool // close by draining what the client still sends
}

func (c *perIPConn) SetReadDeadline(t time.Time) error {
	if c.started.Load() || c.idle <= 0 {
		return c.Conn.SetReadDeadline(t)
	}
	c.mu.Lock()
	if c.started.Load() {
		c.mu.Unlock()
		return c.Conn.SetReadDeadline(t)
	}
	c.held = 0
	if !t.IsZero() {
		c.held = max(time.Until(t), time.Millisecond)
		t = time.Now().Add(c.idle)
	}
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}

func (c *perIPConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.started.Load() {
		c.mu.Lock()
		if !c.started.Load() {
			c.started.Store(true)
			if c.held > 0 {
				_ = c.Conn.SetReadDeadline(time.Now().Add(c.held))
			}
		}
		c.mu.Unlock()
	}
	return n, err
}

func (c *perIPConn) Write(p []byte) (int, error) { return c.w.write(c.Conn, p) }

// CloseWrite half-closes the connection, so that a client told the
// connection ends (a relay's last answer) reads its end at once rather
// than when the gateway closes it. It refuses while a response's end is
// held back, which must leave first.
func (c *perIPConn) CloseWrite() error {
	cw, ok := c.Conn.(interface{ CloseWrite() error })
	if !ok || c.w.holdingBack() {
		return errors.ErrUnsupported
	}
	return cw.CloseWrite()
}

func (c *perIPConn) afterWrite(f func()) { c.w.afterWrite(f) }
func (c *perIPConn) holdToEnd()          { c.w.holdToEnd() }
func (c *perIPConn) endHeld()            { c.w.endHeld() }
func (c *perIPConn) wentIdle()           { c.w.runThen() }

func (c *perIPConn) Close() error {
	c.w.closing(c.Conn)
	if c.linger.Load() {
		c.drain()
	}
	err := c.Conn.Close()
	c.release()
	return err
}

// Bounds of a lingering close: how long it reads what the client still
// sends, and how much of it.
const (
	lingerTime  = time.Second
	lingerBytes = 256 << 10
)

// lingerOnClose has Close drain the connection first. A refusal sent
// while the client is still writing its request (headers over the limit)
// would otherwise close a socket with unread bytes, which makes the kernel
// answer with a reset that can reach the client before it reads the
// refusal: it then sees a broken connection instead of the error code.
func (c *perIPConn) lingerOnClose() { c.linger.Store(true) }

// drain lingers on the connection before it is closed.
func (c *perIPConn) drain() { Linger(c.Conn, lingerBytes) }

// Linger ends c's sending side, so that its peer reads the answer to its
// end, then reads and drops what the peer still sends, within a second and
// max bytes; the caller closes c after it. A refusal sent while a client is
// still writing its request (a body or headers over the limit) reaches the
// client this way, where closing a socket with unread bytes has the kernel
// send a reset that can overtake it. The follower relay refuses with it as
// the gateway does.
func Linger(c net.Conn, max int64) {
	type closeWriter interface{ CloseWrite() error }
	if cw, ok := c.(closeWriter); ok {
		if err := cw.CloseWrite(); err != nil {
			return
		}
	}
	if c.SetReadDeadline(time.Now().Add(lingerTime)) != nil {
		return
	}
	_, _ = io.CopyN(io.Discard, c, max)
}

// perIPTLSConn is a perIPConn over TLS.
type perIPTLSConn struct {
	*perIPConn
	tls *tls.Conn
}

func (c *perIPTLSConn) Handshake() error                     { return c.tls.Handshake() }
func (c *perIPTLSConn) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }
