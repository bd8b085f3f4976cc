package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/gateway/tlscert/tlscerttest"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
)

// start starts a node that the test closes.
func start(t *testing.T, o cluster.Options) (*cluster.Node, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := cluster.Start(ctx, o)
	if err == nil {
		t.Cleanup(n.Close)
	}
	return n, err
}

// caFile writes ca's certificate and returns its path.
func caFile(t *testing.T, ca *tlscerttest.CA) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// nodeTLS is a node's certificate from ca, for loopback.
func nodeTLS(t *testing.T, ca *tlscerttest.CA, serial int64, caPath string) cluster.TLSFiles {
	t.Helper()
	cert, key := ca.WriteNodePair(t, serial, "127.0.0.1", "localhost")
	return cluster.TLSFiles{Cert: cert, Key: key, CA: caPath}
}

// TestThreeNodesReplicateOverMutualTLS starts three embedded servers whose
// routes are mutual TLS, each given the same peer list (its own address
// among them): they elect a meta leader, each sees routes to the other two
// (and knows their addresses, PeerAddrs), and a stream of three replicas
// written through one node reads back through another. A fourth server whose certificate another CA signed
// cannot join: it finds no quorum and its start fails with ErrNotReady.
func TestThreeNodesReplicateOverMutualTLS(t *testing.T) {
	ca := tlscerttest.NewCA(t)
	caPath := caFile(t, ca)
	addrs := []string{loopback.FreeAddr(t), loopback.FreeAddr(t), loopback.FreeAddr(t)}
	nodes := make([]*cluster.Node, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range nodes {
		o := cluster.Options{Name: "gh", NodeName: fmt.Sprintf("n%d", i+1), Listen: addrs[i], Peers: addrs,
			Dir: t.TempDir(), RouteTLS: nodeTLS(t, ca, int64(10+i), caPath), ReadyTimeout: 20 * time.Second}
		wg.Go(func() { nodes[i], errs[i] = start(t, o) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("node %d: %v", i+1, err)
		}
	}
	for i, n := range nodes {
		eventually.Check(t, func() error {
			st := n.Status(t.Context())
			if !st.Healthy || st.JetStream.MetaLeader == "" || len(st.Routes) != 2 || st.JetStream.ClusterSize != 3 {
				return fmt.Errorf("node %d: %+v", i+1, st)
			}
			return nil
		})
	}
	// Every node's routes come from, or go to, loopback: the one address
	// its peers' relayed connections come from.
	for i, n := range nodes {
		if got := n.PeerAddrs(); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("127.0.0.1")}) {
			t.Errorf("node %d: peer addresses %v, want 127.0.0.1", i+1, got)
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if _, err := nodes[0].JetStream().CreateStream(ctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3}); err != nil {
		t.Fatalf("create R3 stream: %v", err)
	}
	for i := range 3 {
		// A new stream answers once its replicas have elected a leader,
		// which a loaded machine may take longer for than the client's
		// own retries; the message id keeps a retried publish stored once.
		eventually.Check(t, func() error {
			_, err := nodes[0].JetStream().Publish(ctx, "r3.x", fmt.Appendf(nil, "m%d", i), jetstream.WithMsgID(fmt.Sprint("m", i)))
			return err
		})
	}
	s, err := nodes[2].JetStream().Stream(ctx, "R3")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("R3 stream from node 3: %d messages, cluster %+v", info.State.Msgs, info.Cluster)
	}
	msg, err := s.GetMsg(ctx, 3)
	if err != nil || string(msg.Data) != "m2" {
		t.Fatalf("message 3: %v %v", msg, err)
	}

	stranger := tlscerttest.NewCA(t)
	_, err = start(t, cluster.Options{Name: "gh", NodeName: "n4", Listen: loopback.FreeAddr(t), Peers: addrs,
		Dir: t.TempDir(), RouteTLS: nodeTLS(t, stranger, 20, caFile(t, stranger)), ReadyTimeout: time.Second})
	if !errors.Is(err, cluster.ErrNotReady) {
		t.Fatalf("a node with another CA's certificate: %v, want ErrNotReady", err)
	}
	for i, n := range nodes {
		if st := n.Status(t.Context()); len(st.Routes) != 2 {
			t.Errorf("node %d has routes %+v, want the two others only", i+1, st.Routes)
		}
	}
}

// TestEdgeLinksToHubOverTLS links an edge server, with its own JetStream
// domain, to a hub as a leaf node over mutual TLS: each reports the link,
// a message the edge publishes on its own subjects reaches a subscriber of
// the hub's in EdgesAccount, and the edge's JetStream answers in its own
// domain.
func TestEdgeLinksToHubOverTLS(t *testing.T) {
	ca := tlscerttest.NewCA(t)
	caPath := caFile(t, ca)
	leaf := loopback.FreeAddr(t)
	hub, err := start(t, cluster.Options{NodeName: "hub", LeafListen: leaf, Dir: t.TempDir(), LeafTLS: nodeTLS(t, ca, 10, caPath)})
	if err != nil {
		t.Fatal(err)
	}
	cert, key := ca.WriteEdgePair(t, 11, "edge", "127.0.0.1")
	edge, err := start(t, cluster.Options{NodeName: "edge", Domain: "edge", LeafRemotes: []string{"tls://" + leaf},
		Dir: t.TempDir(), LeafTLS: cluster.TLSFiles{Cert: cert, Key: key, CA: caPath}})
	if err != nil {
		t.Fatal(err)
	}
	eventually.Check(t, func() error {
		e, h := edge.Status(t.Context()), hub.Status(t.Context())
		if len(e.Leafs) != 1 || e.Leafs[0].Role != "hub" || e.Leafs[0].Node != "hub" || len(h.Leafs) != 1 || h.Leafs[0].Role != "edge" {
			return fmt.Errorf("edge leafs %+v, hub leafs %+v", e.Leafs, h.Leafs)
		}
		return nil
	})
	greet := cluster.EdgeInboxPrefix("edge") + ".greet"
	sub, err := edgesConn(t, hub, "hub").SubscribeSync(greet)
	if err != nil {
		t.Fatal(err)
	}
	fromEdge := edgesConn(t, edge, "edge")
	// Interest crosses the link a moment after the subscription.
	eventually.Check(t, func() error {
		if err := fromEdge.Publish(greet, []byte("hello")); err != nil {
			return err
		}
		msg, err := sub.NextMsg(100 * time.Millisecond)
		if err != nil {
			return err
		}
		if string(msg.Data) != "hello" {
			return fmt.Errorf("got %q", msg.Data)
		}
		return nil
	})
	ai, err := edge.JetStream().AccountInfo(t.Context())
	if err != nil || ai.Domain != "edge" {
		t.Fatalf("edge JetStream: %+v %v", ai, err)
	}
}

// TestStartRefusesBadOptions: each combination that cannot work, or that
// would carry a node's facts in clear text over a network, is refused
// before anything listens, with an error matching ErrConfig.
func TestStartRefusesBadOptions(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		o    cluster.Options
	}{
		{"peers without a cluster name", cluster.Options{NodeName: "n1", Peers: []string{"127.0.0.1:6222"}, Dir: dir}},
		{"routes in clear text on a network", cluster.Options{Name: "gh", NodeName: "n1", Listen: "0.0.0.0:6222", Dir: dir}},
		{"the default route listener without TLS", cluster.Options{Name: "gh", NodeName: "n1", Dir: dir}},
		{"a peer on a network without TLS", cluster.Options{Name: "gh", NodeName: "n1", Listen: "127.0.0.1:0", Peers: []string{"10.0.0.2:6222"}, Dir: dir}},
		{"a peer that is not host:port", cluster.Options{Name: "gh", NodeName: "n1", Listen: "127.0.0.1:0", Peers: []string{"10.0.0.2"}, Dir: dir}},
		{"NATS clients on a network", cluster.Options{NodeName: "n1", ClientListen: "0.0.0.0:4222", Dir: dir}},
		{"a leaf remote in clear text on a network", cluster.Options{NodeName: "e", LeafRemotes: []string{"nats-leaf://hub.example:7422"}, Dir: dir}},
		{"a leaf remote of another scheme", cluster.Options{NodeName: "e", LeafRemotes: []string{"http://127.0.0.1:7422"}, Dir: dir}},
		{"a leaf listener in clear text on a network", cluster.Options{NodeName: "h", LeafListen: ":7422", Dir: dir}},
		{"a certificate without its key", cluster.Options{NodeName: "h", LeafListen: "127.0.0.1:0", LeafTLS: cluster.TLSFiles{Cert: "c.pem"}, Dir: dir}},
		{"an existing deployment and an embedded option", cluster.Options{URL: "nats://127.0.0.1:4222", Name: "gh"}},
		{"no data folder", cluster.Options{NodeName: "n1", LeafListen: "127.0.0.1:0"}},
		{"a node name with a dot", cluster.Options{NodeName: "n.1", Dir: dir}},
		{"a domain with a space", cluster.Options{NodeName: "n1", Domain: "my edge", Dir: dir}},
		{"credentials without --nats-url", cluster.Options{NodeName: "n1", Creds: "x.creds", Dir: dir}},
		{"replicas without --nats-url", cluster.Options{NodeName: "n1", Replicas: 3, Dir: dir}},
		{"more replicas than JetStream has", cluster.Options{NodeName: "n1", URL: "nats://127.0.0.1:4222", Replicas: 7}},
		{"negative replicas", cluster.Options{NodeName: "n1", URL: "nats://127.0.0.1:4222", Replicas: -1}},
		{"route TLS files that are not there", cluster.Options{Name: "gh", NodeName: "n1", Listen: "127.0.0.1:0", Dir: dir,
			RouteTLS: cluster.TLSFiles{Cert: "/nonexistent/c.pem", Key: "/nonexistent/k.pem", CA: "/nonexistent/ca.pem"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := cluster.Start(t.Context(), tc.o)
			if err == nil {
				n.Close()
			}
			if !errors.Is(err, cluster.ErrConfig) {
				t.Fatalf("Start: %v, want ErrConfig", err)
			}
		})
	}
}

// TestNotEnabledByDefault: the zero Options ask for no NATS at all.
func TestNotEnabledByDefault(t *testing.T) {
	var o cluster.Options
	if o.Enabled() {
		t.Fatal("zero Options are enabled")
	}
	for _, o := range []cluster.Options{{NodeName: "n1"}, {URL: "nats://127.0.0.1:4222"}, {Domain: "edge"}, {LeafRemotes: []string{"nats-leaf://127.0.0.1:7422"}}} {
		if !o.Enabled() {
			t.Errorf("%+v is not enabled", o)
		}
	}
}
