package relay

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// tooManyConns is written to a connection refused for its address's share
// of connections, before it is closed: the gateway's answer.
const tooManyConns = "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 73\r\n\r\n" +
	`{"error":"too many connections from your address","code":"RATE_LIMITED"}` + "\n"

// perIPListener bounds the connections open at once from one address, as
// the gateway's does: a refused connection never reaches fasthttp.
type perIPListener struct {
	net.Listener
	max     int
	idle    time.Duration
	refused func()

	mu     sync.Mutex
	counts map[netip.Addr]int
}

// limitPerIP wraps ln; max <= 0 sets no bound per address.
func limitPerIP(ln net.Listener, max int, idle time.Duration, refused func()) net.Listener {
	return &perIPListener{Listener: ln, max: max, idle: idle, refused: refused, counts: map[netip.Addr]int{}}
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
			l.refused()
			// A few bytes into a new socket's empty send buffer: the write
			// does not wait, and is bounded anyway.
			_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			_, _ = c.Write([]byte(tooManyConns))
			_ = c.Close()
			continue
		}
		l.counts[ip] = n + 1
		l.mu.Unlock()
		return &conn{Conn: c, idle: l.idle, release: func() { l.release(ip) }}, nil
	}
}

func (l *perIPListener) release(ip netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.counts[ip] <= 1 {
		delete(l.counts, ip)
		return
	}
	l.counts[ip]--
}

// remoteAddr is the address a connection comes from; connections with no
// IP address share the zero address.
func remoteAddr(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// conn is an accepted connection. It gives its address's slot back on its
// first Close, and half-closes when its own connection can. Until its
// first byte arrives, a read deadline set on it (fasthttp's header
// timeout, started at accept) is held back and the idle timeout applies
// instead: clients dial spare connections and keep them unused, and one
// closed after a few seconds of silence would fail the request a client
// later sends on it.
type conn struct {
	net.Conn
	idle    time.Duration
	release func()
	once    sync.Once

	started atomic.Bool
	mu      sync.Mutex
	held    time.Duration // the deadline set before the first byte, as a duration; 0: none
}

func (c *conn) SetReadDeadline(t time.Time) error {
	if c.started.Load() || c.idle <= 0 {
		return c.Conn.SetReadDeadline(t)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started.Load() {
		return c.Conn.SetReadDeadline(t)
	}
	c.held = 0
	if !t.IsZero() {
		c.held = max(time.Until(t), time.Millisecond)
		t = time.Now().Add(c.idle)
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

func (c *conn) Read(p []byte) (int, error) {
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

// CloseWrite half-closes the connection where it can (TCP, TLS).
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
