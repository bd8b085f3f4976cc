package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/store"
)

// runNATS starts a NATS server with JetStream on a loopback port, syncing
// every write, as a deployment a member joins with --nats-url.
func runNATS(t *testing.T) string {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true, SyncAlways: true, MaxPayload: cluster.MaxGroupBytes + 64<<10})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s.ClientURL()
}

// openLeadingMember opens a member of a one-replica cluster on dir, joined
// to a NATS deployment, and waits until it leads.
func openLeadingMember(t *testing.T, dir string) *node.Member {
	t.Helper()
	m, err := node.OpenMember(t.Context(), node.Options{Addr: "127.0.0.1:0", Data: dir,
		Auth:    auth.Options{StaticToken: "s3cret"},
		Cluster: cluster.Options{URL: runNATS(t), NodeName: "m1", Replicas: 1}})
	if err != nil {
		t.Fatalf("open member: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), node.ShutdownTimeout)
		defer cancel()
		if err := m.Close(ctx); err != nil {
			t.Errorf("close member: %v", err)
		}
	})
	eventually.True(t, "the member leads", func() bool { return m.Leading() != nil })
	return m
}

// TestMemberStoreDoesNotSyncEachGroupAndStillReportsWhatItHolds: under
// --sync always, the journal's stream syncs every group on a quorum before
// the leader counts it, so a member's own store syncs on a long interval,
// not every 10 ms: forty groups written over a quarter of a second cost it
// at most one or two syncs. It still comes to hold durably every group it
// applied (the position it reports for the journal's purge).
func TestMemberStoreDoesNotSyncEachGroupAndStillReportsWhatItHolds(t *testing.T) {
	m := openLeadingMember(t, t.TempDir())
	s := m.Store()
	if s.Mode() != store.SyncBatch {
		t.Fatalf("a member's store under --sync always: mode %v, want batch", s.Mode())
	}
	before := s.Stats().Syncs
	for i := range 40 {
		b := &store.Batch{}
		if err := b.Put("test", fmt.Sprint(i), i); err != nil {
			t.Fatal(err)
		}
		if err := s.Write(t.Context(), b); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		time.Sleep(6 * time.Millisecond) // one group each, spread as a load's are
	}
	if syncs := s.Stats().Syncs - before; syncs > 2 {
		t.Fatalf("the store synced %d times for 40 groups in about 250 ms: it syncs on the store's 10 ms default, not the member's interval", syncs)
	}
	eventually.True(t, "the store holds durably every group it applied", func() bool {
		return s.DurableReplicated() == s.Replicated() && s.Replicated() > 40
	})
}
