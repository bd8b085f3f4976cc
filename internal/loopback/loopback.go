// Package loopback hands tests addresses on 127.0.0.1 to listen on, for
// servers they start in another process or that take their address as a
// flag, and connections from other loopback addresses.
package loopback

import (
	"net"
	"strconv"
	"testing"
	"time"
)

// FreePort returns a port of 127.0.0.1 that nothing listened on a moment
// ago: one the kernel handed out and was given back. Another process may
// take it first; a test that needs certainty listens on port 0 itself.
func FreePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// FreeAddr is FreePort as a host:port address.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	return "127.0.0.1:" + strconv.Itoa(FreePort(tb))
}

// DialFrom connects to addr from the loopback address from (127.0.0.2,
// say: every 127/8 address is the machine's own), as a client of another
// address would, within 5 s; the connection closes when the test ends.
func DialFrom(tb testing.TB, addr, from string) net.Conn {
	tb.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}
