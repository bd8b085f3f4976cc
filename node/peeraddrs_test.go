package node_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
	"github.com/gatehouse-dev/gatehouse/node"
)

// ready opens a connection from the loopback address from to addr, asks
// GET /v0/ready on it, which a follower relays, and returns the status
// line; the connection stays open until the test ends.
func ready(t *testing.T, addr, from string) string {
	t.Helper()
	c := loopback.DialFrom(t, addr, from)
	if _, err := io.WriteString(c, "GET /v0/ready HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, _ := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line)
}

// TestLeaderDoesNotBoundItsFollowersRelayedConnectionsPerAddress: two
// members with --max-conns-per-ip 2. A follower relays six clients (two
// from each of three addresses, within its own bound) to the leader, all
// from the follower's one address: the leader, which knows that address
// from its route to the follower, lets every one through. A client of
// another address on the leader is still held to two, and the follower's
// /v0/cluster counts what it relayed and refused.
func TestLeaderDoesNotBoundItsFollowersRelayedConnectionsPerAddress(t *testing.T) {
	routes := []string{loopback.FreeAddr(t), loopback.FreeAddr(t)}
	members := make([]*node.Member, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range members {
		o := node.Options{Addr: loopback.FreeAddr(t), Data: t.TempDir(), Server: gateway.Options{MaxConnsPerIP: 2},
			Cluster: cluster.Options{Name: "gh", NodeName: fmt.Sprintf("n%d", i+1), Listen: routes[i], Peers: routes,
				ReadyTimeout: 30 * time.Second}}
		wg.Go(func() { members[i], errs[i] = node.OpenMember(t.Context(), o) })
	}
	wg.Wait()
	for i, m := range members {
		if errs[i] != nil {
			t.Fatalf("member %d: %v", i+1, errs[i])
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), node.ShutdownTimeout)
			defer cancel()
			if err := m.Close(ctx); err != nil {
				t.Errorf("close member %d: %v", i+1, err)
			}
		})
	}
	var leader, follower *node.Member
	eventually.Check(t, func() error {
		for i, m := range members {
			if m.Leading() != nil {
				leader, follower = m, members[1-i]
				return nil
			}
		}
		return fmt.Errorf("no member leads")
	})
	via := follower.Addr().String()
	eventually.Check(t, func() error {
		if got := ready(t, via, "127.0.0.2"); !strings.HasPrefix(got, "HTTP/1.1 200") {
			return fmt.Errorf("through the follower: %q", got)
		}
		return nil
	})
	for _, from := range []string{"127.0.0.3", "127.0.0.4", "127.0.0.5"} {
		for i := range 2 {
			if got := ready(t, via, from); !strings.HasPrefix(got, "HTTP/1.1 200") {
				t.Fatalf("client %d of %s through the follower: %q", i+1, from, got)
			}
		}
	}
	direct := leader.Addr().String()
	for i := range 2 {
		if got := ready(t, direct, "127.0.0.6"); !strings.HasPrefix(got, "HTTP/1.1 200") {
			t.Fatalf("client %d of 127.0.0.6 on the leader: %q", i+1, got)
		}
	}
	if got := ready(t, direct, "127.0.0.6"); !strings.HasPrefix(got, "HTTP/1.1 429") {
		t.Fatalf("third client of 127.0.0.6 on the leader: %q", got)
	}
	if got := ready(t, via, "127.0.0.3"); !strings.HasPrefix(got, "HTTP/1.1 429") {
		t.Fatalf("third client of 127.0.0.3 through the follower: %q", got)
	}

	// The follower's own counters are in its /v0/cluster (its /metrics are
	// the leader's): at least the seven connections above relayed, six
	// of them still open, bytes both ways, the one refusal per address.
	status, body := getCluster(t, "http://"+via, "")
	rel, _ := body["relay"].(map[string]any)
	refused, _ := rel["refused"].(map[string]any)
	if status != 200 || body["role"] != "follower" || rel == nil || refused == nil {
		t.Fatalf("GET /v0/cluster on the follower: %d %v", status, body)
	}
	for _, c := range []struct {
		name string
		got  any
		min  float64
	}{
		{"open", rel["open"], 6}, {"relayed", rel["relayed"], 7},
		{"to_leader_bytes", rel["to_leader_bytes"], 7 * 40}, {"to_client_bytes", rel["to_client_bytes"], 7 * 40},
		{"refused.per_ip", refused["per_ip"], 1},
	} {
		if n, ok := c.got.(float64); !ok || n < c.min {
			t.Errorf("relay %s = %v, want at least %v (%v)", c.name, c.got, c.min, rel)
		}
	}
	if n := refused["no_leader"].(float64) + refused["unreachable"].(float64) + refused["full"].(float64); n != 0 {
		t.Errorf("relay refusals other than per address: %v", refused)
	}
}
