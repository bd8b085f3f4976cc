package relay

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/internal/addrlimit"
)

// limitPerIP bounds the connections open at once from one address, as the
// gateway's listener does (package addrlimit): a refused connection never
// reaches fasthttp. max <= 0 sets no bound.
func limitPerIP(ln net.Listener, max int, idle time.Duration, refused func()) net.Listener {
	return addrlimit.Listen(ln, addrlimit.Options{Max: max, Refused: refused,
		Wrap: func(c net.Conn, release func()) net.Conn { return &conn{Conn: c, idle: idle, release: release} }})
}

// conn is an accepted connection. It gives its address's slot back on
// Close, and half-closes when its own connection can. Until its
// first byte arrives, a read deadline set on it (fasthttp's header
// timeout, started at accept) is held back and the idle timeout applies
// instead: clients dial spare connections and keep them unused, and one
// closed after a few seconds of silence would fail the request a client
// later sends on it.
type conn struct {
	net.Conn
	idle    time.Duration
	release func()

	started atomic.Bool
	linger  atomic.Int64 // bytes to linger for on Close; 0: none
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

// lingerOnClose has Close linger first (gateway.Linger), reading up to
// max bytes: the relay's own refusal of a request still being sent
// reaches its client.
func (c *conn) lingerOnClose(max int64) { c.linger.Store(max) }

func (c *conn) Close() error {
	if max := c.linger.Load(); max > 0 {
		gateway.Linger(c.Conn, max)
	}
	err := c.Conn.Close()
	c.release()
	return err
}
