package addrlimit_test

import (
	"crypto/tls"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/addrlimit"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
)

// closer gives its slot back on Close, twice, as a wrapper whose Close is
// called again would.
type closer struct {
	net.Conn
	release func()
}

func (c *closer) Close() error {
	err := c.Conn.Close()
	c.release()
	c.release()
	return err
}

// serve listens on loopback with o and returns its address and the
// connections it admits.
func serve(t *testing.T, o addrlimit.Options) (string, <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, ln, o)
}

// serveOn is serve on the listener ln.
func serveOn(t *testing.T, ln net.Listener, o addrlimit.Options) (string, <-chan net.Conn) {
	t.Helper()
	o.Wrap = func(c net.Conn, release func()) net.Conn { return &closer{Conn: c, release: release} }
	lim := addrlimit.Listen(ln, o)
	admitted := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := lim.Accept()
			if err != nil {
				close(admitted)
				return
			}
			admitted <- c
		}
	}()
	t.Cleanup(func() {
		lim.Close()
		for c := range admitted {
			c.Close()
		}
	})
	return ln.Addr().String(), admitted
}

// admit waits for the listener to admit the next connection.
func admit(t *testing.T, admitted <-chan net.Conn) net.Conn {
	t.Helper()
	select {
	case c := <-admitted:
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("no connection admitted")
		return nil
	}
}

// refused reads what a refused connection is told, to its end.
func refused(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != addrlimit.Refusal {
		t.Fatalf("refused connection read %q, %v; want the 429 and its close", got, err)
	}
}

// TestAnAddressHoldsAtMostMaxAndGetsItsSlotBackOnClose: past Max
// connections from one address the next is answered 429 and closed, and
// counted; another address has a share of its own; a closed connection
// gives back one slot, however often its release is called.
func TestAnAddressHoldsAtMostMaxAndGetsItsSlotBackOnClose(t *testing.T) {
	var n atomic.Int64
	addr, admitted := serve(t, addrlimit.Options{Max: 2, Refused: func() { n.Add(1) }})
	loopback.DialFrom(t, addr, "127.0.0.1")
	first := admit(t, admitted)
	loopback.DialFrom(t, addr, "127.0.0.1")
	admit(t, admitted)
	refused(t, loopback.DialFrom(t, addr, "127.0.0.1"))
	loopback.DialFrom(t, addr, "127.0.0.2")
	admit(t, admitted)
	if n.Load() != 1 {
		t.Fatalf("%d refusals counted, want 1", n.Load())
	}

	first.Close()
	loopback.DialFrom(t, addr, "127.0.0.1")
	admit(t, admitted)
	refused(t, loopback.DialFrom(t, addr, "127.0.0.1"))
}

// TestExemptAddressesAreNotCounted: an exempt address's connections pass
// the bound and take no slot; another address is still bounded.
func TestExemptAddressesAreNotCounted(t *testing.T) {
	peer := netip.MustParseAddr("127.0.0.2")
	addr, admitted := serve(t, addrlimit.Options{Max: 1, Exempt: func(a netip.Addr) bool { return a == peer }})
	for range 5 {
		loopback.DialFrom(t, addr, "127.0.0.2")
		admit(t, admitted)
	}
	loopback.DialFrom(t, addr, "127.0.0.1")
	admit(t, admitted)
	refused(t, loopback.DialFrom(t, addr, "127.0.0.1"))
}

// TestNoBoundWhenMaxIsNotPositive: Max <= 0 admits every connection.
func TestNoBoundWhenMaxIsNotPositive(t *testing.T) {
	addr, admitted := serve(t, addrlimit.Options{})
	for range 5 {
		loopback.DialFrom(t, addr, "127.0.0.1")
		admit(t, admitted)
	}
}

// TestARefusedTLSConnectionIsClosedWithoutWaitingForItsHandshake: a TLS
// connection past the bound is closed unanswered, since an answer would
// first wait for the client's handshake; a client that sends nothing
// holds up no connection accepted after it.
func TestARefusedTLSConnectionIsClosedWithoutWaitingForItsHandshake(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr, admitted := serveOn(t, tls.NewListener(ln, &tls.Config{}), addrlimit.Options{Max: 1})
	loopback.DialFrom(t, addr, "127.0.0.1")
	admit(t, admitted)
	silent := loopback.DialFrom(t, addr, "127.0.0.1")
	_ = silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(silent); err != nil || len(got) != 0 {
		t.Fatalf("refused TLS connection read %q, %v; want its close, unanswered", got, err)
	}
	loopback.DialFrom(t, addr, "127.0.0.2")
	admit(t, admitted)
}
