// Package loopback hands tests addresses on 127.0.0.1 to listen on, for
// servers they start in another process or that take their address as a
// flag, and connections from other loopback addresses.
package loopback

import (
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Ports are chosen below the range the kernel assigns for port 0 and for
// the local end of outgoing connections (Linux's default 32768-60999,
// macOS's 49152-65535): a port picked from that range, given back and
// listened on a moment later by a server process, can meanwhile be taken
// by any connection a parallel test opens. Below it only another caller
// of FreePort may take it, and within one process none does: handed keeps
// every port given out, for the life of the process on purpose, since the
// ports it guards are the machine's.
const (
	firstPort = 20000
	lastPort  = 32767
)

var handed = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// FreePort returns a port of 127.0.0.1 that nothing listens on, that no
// outgoing connection will take, and that this process has not returned
// before. Another process may still take it first; a test that needs
// certainty listens on port 0 itself.
func FreePort(tb testing.TB) int {
	tb.Helper()
	handed.Lock()
	defer handed.Unlock()
	for range 1000 {
		port := firstPort + rand.IntN(lastPort-firstPort+1)
		if handed.ports[port] {
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		ln.Close()
		handed.ports[port] = true
		return port
	}
	tb.Fatalf("loopback: no free port in %d-%d after 1000 tries", firstPort, lastPort)
	return 0
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
