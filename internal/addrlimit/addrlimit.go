// Package addrlimit bounds the connections a listener holds open at once
// from one remote address, and answers those past the bound with 429
// before closing them. The gateway's listener and a cluster follower's
// relay both use it, each wrapping the connections it admits in its own
// type.
//
// The bound lives in the listener, not in the HTTP server, so that a
// refused connection never reaches the server at all, costs no goroutine,
// and is refused before any of its bytes are read.
package addrlimit

import (
	"crypto/tls"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Refusal is written, unencrypted, to a connection refused for its
// address's share of connections, before it is closed: the /v0 error
// envelope of a 429.
const Refusal = "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 73\r\n\r\n" +
	`{"error":"too many connections from your address","code":"RATE_LIMITED"}` + "\n"

// refusalWrite bounds the write of Refusal.
const refusalWrite = 100 * time.Millisecond

// Options configure a listener.
type Options struct {
	// Max is the most connections open at once from one address; <= 0
	// sets no bound.
	Max int
	// Exempt reports whether the connections from an address are not
	// counted at all (a cluster's own nodes, which relay many clients each
	// from one address); nil exempts none. It is asked once per accepted
	// connection, on the accepting goroutine: it must be quick.
	Exempt func(netip.Addr) bool
	// Refused is called once per connection refused, for the metrics; nil
	// counts nothing.
	Refused func()
	// Wrap makes the connection Accept returns of one admitted, given the
	// function that gives the connection's slot back: the wrapper calls it
	// when the connection is closed (calls after the first do nothing).
	// Required.
	Wrap func(c net.Conn, release func()) net.Conn
}

// Listen returns ln with its connections bounded per address as o says.
func Listen(ln net.Listener, o Options) net.Listener {
	return &listener{Listener: ln, o: o, counts: map[netip.Addr]int{}}
}

type listener struct {
	net.Listener
	o Options

	mu     sync.Mutex
	counts map[netip.Addr]int
}

// Accept returns the next connection its address's share admits; those
// past it are answered and closed here, and Accept waits for the next.
func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		release, ok := l.admit(c)
		if !ok {
			l.refuse(c)
			continue
		}
		return l.o.Wrap(c, release), nil
	}
}

// admit counts c against its address's share and returns the function
// that gives the slot back, or false when the share is taken.
func (l *listener) admit(c net.Conn) (func(), bool) {
	if l.o.Max <= 0 {
		return noRelease, true
	}
	ip := remoteAddr(c)
	if l.o.Exempt != nil && l.o.Exempt(ip) {
		return noRelease, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.counts[ip]
	if n >= l.o.Max {
		return nil, false
	}
	l.counts[ip] = n + 1
	s := &slot{l: l, ip: ip}
	return s.release, true
}

func noRelease() {}

// refuse answers c and closes it. The answer is written on the accepting
// goroutine: it is a few bytes into a new socket's empty send buffer, so
// the write does not wait (and is bounded anyway), and a flood of refused
// connections costs no goroutine each. A TLS connection is closed
// unanswered: writing to it would start its handshake, which waits for
// the client.
func (l *listener) refuse(c net.Conn) {
	if l.o.Refused != nil {
		l.o.Refused()
	}
	if _, ok := c.(*tls.Conn); !ok {
		_ = c.SetWriteDeadline(time.Now().Add(refusalWrite))
		_, _ = c.Write([]byte(Refusal))
	}
	_ = c.Close()
}

// slot is one admitted connection's share of its address.
type slot struct {
	l        *listener
	ip       netip.Addr
	released atomic.Bool
}

func (s *slot) release() {
	if !s.released.CompareAndSwap(false, true) {
		return
	}
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	if s.l.counts[s.ip] <= 1 {
		delete(s.l.counts, s.ip)
		return
	}
	s.l.counts[s.ip]--
}

// remoteAddr is the address a connection comes from; connections with no
// IP address (unix sockets) share the zero address.
func remoteAddr(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}
