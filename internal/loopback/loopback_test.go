package loopback_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/loopback"
)

// TestFreeAddrCanBeListenedOn: the address is on loopback, and free.
func TestFreeAddrCanBeListenedOn(t *testing.T) {
	for _, addr := range []string{loopback.FreeAddr(t), "127.0.0.1:" + strconv.Itoa(loopback.FreePort(t))} {
		host, _, err := net.SplitHostPort(addr)
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("address %q: %v", addr, err)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listen on %s: %v", addr, err)
		}
		ln.Close()
	}
}
