package loopback_test

import (
	"net"
	"strconv"
	"sync"
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

// TestFreePortIsNeverHandedOutTwiceNorTakenByOutgoingConnections: ports
// asked for at once from many goroutines are all distinct, and all below
// the range the kernel gives outgoing connections and port 0 listeners.
func TestFreePortIsNeverHandedOutTwiceNorTakenByOutgoingConnections(t *testing.T) {
	const n = 400
	ports := make(chan int, n)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range n / 8 {
				ports <- loopback.FreePort(t)
			}
		})
	}
	wg.Wait()
	close(ports)
	seen := map[int]bool{}
	for p := range ports {
		if seen[p] {
			t.Errorf("port %d handed out twice", p)
		}
		seen[p] = true
		if p < 1024 || p >= 32768 {
			t.Errorf("port %d: want one below the ephemeral range (32768 on) and unprivileged", p)
		}
	}
}
