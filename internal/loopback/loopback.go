// Package loopback hands tests addresses on 127.0.0.1 to listen on, for
// servers they start in another process or that take their address as a
// flag.
package loopback

import (
	"net"
	"strconv"
	"testing"
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
