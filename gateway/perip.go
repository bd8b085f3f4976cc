package gateway

import (
	"crypto/tls"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// tooManyConns is written, unencrypted, to a connection refused for its
// address's share of connections, before it is closed.
const tooManyConns = "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 73\r\n\r\n" +
	`{"error":"too many connections from your address","code":"RATE_LIMITED"}` + "\n"

// perIPListener bounds the connections open at once from one source
// address. fasthttp's own MaxConnsPerIP races with its shutdown (a conn is
// nilled while a worker still reads it), so the bound lives here, where a
// refused connection never reaches fasthttp at all.
//
// It also gives a new connection the idle timeout, not the header timeout,
// to send its first byte: HTTP clients dial spare connections and keep
// them in their pools unused, and one closed after a few seconds of
// silence would fail the POST a client later sends on it (clients retry
// only idempotent requests on a connection that turns out closed).
type perIPListener struct {
	net.Listener
	max    int
	idle   time.Duration
	mu     sync.Mutex
	counts map[netip.Addr]int
	// refused counts connections turned away, for the metrics.
	refused func()
}

// limitPerIP wraps ln; max <= 0 sets no bound per address.
func limitPerIP(ln net.Listener, max int, idle time.Duration, refused func()) net.Listener {
	return &perIPListener{Listener: ln, max: max, idle: idle, counts: map[netip.Addr]int{}, refused: refused}
}

func (l *perIPListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := remoteAddr(c)
		l.mu.Lock()
		n := l.counts[ip]
		if l.max > 0 && n >= l.max {
			l.mu.Unlock()
			l.refuse(c)
			continue
		}
		l.counts[ip] = n + 1
		l.mu.Unlock()
		pc := &perIPConn{Conn: c, release: func() { l.release(ip) }, idle: l.idle}
		if tc, ok := c.(*tls.Conn); ok {
			// fasthttp recognises TLS by these methods.
			return &perIPTLSConn{perIPConn: pc, tls: tc}, nil
		}
		return pc, nil
	}
}

// refuse answers c and closes it. The answer is written on the accepting
// goroutine: it is a few bytes into a new socket's empty send buffer, so
// the write does not wait (and is bounded anyway), and a flood of refused
// connections costs no goroutine each.
func (l *perIPListener) refuse(c net.Conn) {
	if l.refused != nil {
		l.refused()
	}
	if _, ok := c.(*tls.Conn); !ok {
		_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_, _ = c.Write([]byte(tooManyConns))
	}
	_ = c.Close()
}

func (l *perIPListener) release(ip netip.Addr) {
	l.mu.Lock()
	if l.counts[ip] <= 1 {
		delete(l.counts, ip)
	} else {
		l.counts[ip]--
	}
	l.mu.Unlock()
}

// remoteAddr is the address a connection comes from; connections with no
// IP address (unix sockets) share the zero address.
func remoteAddr(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// perIPConn gives its address's slot back once, on the first Close. Until
// its first byte arrives, a read deadline set on it (fasthttp's header
// timeout, which it starts at accept) is held back and the idle timeout
// applies instead; the first byte starts the held-back timeout afresh. Its
// writes go through its writeSide (connwrite.go).
type perIPConn struct {
	net.Conn
	w       writeSide
	once    sync.Once
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
	c.once.Do(c.release)
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

// drain ends the sending side, so the client reads the answer to its end,
// then reads and drops what it still sends, within lingerTime and
// lingerBytes.
func (c *perIPConn) drain() {
	type closeWriter interface{ CloseWrite() error }
	if cw, ok := c.Conn.(closeWriter); ok {
		if err := cw.CloseWrite(); err != nil {
			return
		}
	}
	if c.Conn.SetReadDeadline(time.Now().Add(lingerTime)) != nil {
		return
	}
	_, _ = io.CopyN(io.Discard, c.Conn, lingerBytes)
}

// perIPTLSConn is a perIPConn over TLS.
type perIPTLSConn struct {
	*perIPConn
	tls *tls.Conn
}

func (c *perIPTLSConn) Handshake() error                     { return c.tls.Handshake() }
func (c *perIPTLSConn) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }
