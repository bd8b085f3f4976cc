package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
)

// single starts one embedded node with JetStream in a temporary folder.
func single(t *testing.T) *cluster.Node {
	t.Helper()
	n, err := start(t, cluster.Options{NodeName: "n1", Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestJournalAppendsAreFencedByTheLastSequence(t *testing.T) {
	ctx := context.Background()
	j, err := single(t).Journal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	old := j.Writer(0)
	for i := range 3 {
		if seq, err := old.Append(ctx, []byte(fmt.Sprint(i))); err != nil || seq != uint64(i+1) {
			t.Fatalf("append %d = %d, %v", i, seq, err)
		}
	}
	// A node that caught up to 3 takes over; the one that led before is
	// refused from then on, and its group is stored nowhere.
	next := j.Writer(3)
	if _, err := next.Append(ctx, []byte("term")); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Append(ctx, []byte("late")); !errors.Is(err, cluster.ErrFenced) {
		t.Fatalf("the deposed writer's append = %v, want ErrFenced", err)
	}
	if _, err := j.Writer(2).Append(ctx, []byte("behind")); !errors.Is(err, cluster.ErrFenced) {
		t.Fatalf("a writer behind the journal = %v, want ErrFenced", err)
	}
	if _, err := next.Append(ctx, make([]byte, cluster.MaxGroupBytes+1)); !errors.Is(err, cluster.ErrGroupTooLarge) {
		t.Fatalf("an oversized group = %v, want ErrGroupTooLarge", err)
	}
	if last, err := j.Last(ctx); err != nil || last != 4 {
		t.Fatalf("last = %d, %v; want 4", last, err)
	}

	r, err := j.Reader(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	var got []cluster.Entry
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < 3 && time.Now().Before(deadline) {
		es, err := r.Next(ctx, 2, 1<<20, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) > 2 {
			t.Fatalf("Next returned %d groups, asked for at most 2", len(es))
		}
		got = append(got, es...)
	}
	want := []string{"1", "2", "term"}
	if len(got) != len(want) {
		t.Fatalf("read %d groups after 1, want %d", len(got), len(want))
	}
	for i, e := range got {
		if e.Seq != uint64(i+2) || !bytes.Equal(e.Data, []byte(want[i])) {
			t.Errorf("group %d = %d %q, want %d %q", i, e.Seq, e.Data, i+2, want[i])
		}
	}
	if es, err := r.Next(ctx, 10, 1<<20, 100*time.Millisecond); err != nil || len(es) != 0 {
		t.Fatalf("Next at the end = %d groups, %v", len(es), err)
	}
}

func TestLeaseGoesToTheNextNodeOnceReleasedOrLost(t *testing.T) {
	ctx := context.Background()
	n := single(t)
	ls, err := n.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ls.Leader(ctx); !errors.Is(err, cluster.ErrNoLeader) {
		t.Fatalf("Leader before any = %v, want ErrNoLeader", err)
	}
	a, err := ls.Campaign(ctx, []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := ls.Leader(ctx); err != nil || string(v) != "a" {
		t.Fatalf("Leader = %q, %v", v, err)
	}
	// b waits while a renews, well past the lease's time to live.
	bctx, cancel := context.WithTimeout(ctx, 2*cluster.LeaseTTL)
	_, err = ls.Campaign(bctx, []byte("b"))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("campaign against a renewed lease = %v", err)
	}
	a.Release(ctx)
	start := time.Now()
	b, err := ls.Campaign(ctx, []byte("b"))
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > cluster.LeaseTTL/2 {
		t.Errorf("a released lease took %s to move", took)
	}
	select {
	case <-a.Lost():
	default:
		t.Error("a released lease is not lost")
	}
	select {
	case <-b.Lost():
		t.Fatal("b lost its fresh lease")
	default:
	}
	b.Release(ctx)
}

func TestJournalPurgeDropsWhatEveryNodeHolds(t *testing.T) {
	ctx := context.Background()
	n := single(t)
	j, err := n.Journal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := j.Writer(0)
	for i := range 5 {
		if _, err := w.Append(ctx, []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	ps, err := n.Positions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if all, err := ps.All(ctx); err != nil || len(all) != 0 {
		t.Fatalf("positions before any = %v, %v", all, err)
	}
	for node, pos := range map[string]uint64{"n1": 4, "n2": 3} {
		if err := ps.Report(ctx, node, pos); err != nil {
			t.Fatal(err)
		}
	}
	all, err := ps.All(ctx)
	if err != nil || len(all) != 2 || all["n1"] != 4 || all["n2"] != 3 {
		t.Fatalf("positions = %v, %v", all, err)
	}
	if got := n.Peers(); len(got) != 1 || got[0] != "n1" {
		t.Fatalf("peers of a single node = %v", got)
	}
	if err := j.Purge(ctx, 4); err != nil {
		t.Fatal(err)
	}
	// A reader from the start now begins at 4: the caller (the store's
	// Follow) sees the gap.
	r, err := j.Reader(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	es, err := r.Next(ctx, 10, 1<<20, 5*time.Second)
	if err != nil || len(es) == 0 || es[0].Seq != 4 {
		t.Fatalf("first group after the purge = %v, %v", es, err)
	}
	// Appends go on after the purge.
	if seq, err := w.Append(ctx, []byte("after")); err != nil || seq != 6 {
		t.Fatalf("append after the purge = %d, %v", seq, err)
	}
}

// TestClusteredNodesClientPortTakesOnlyItsOwnConnection: a clustered
// node's client listener, which NATS needs for its routes, refuses a
// connection without the password only the node's process knows: another
// local process cannot reach the journal through it.
func TestClusteredNodesClientPortTakesOnlyItsOwnConnection(t *testing.T) {
	addrs := []string{loopback.FreeAddr(t), loopback.FreeAddr(t), loopback.FreeAddr(t)}
	nodes := make([]*cluster.Node, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range nodes {
		o := cluster.Options{Name: "gh", NodeName: fmt.Sprintf("n%d", i+1), Listen: addrs[i], Peers: addrs,
			Dir: t.TempDir(), ReadyTimeout: 20 * time.Second}
		wg.Go(func() { nodes[i], errs[i] = start(t, o) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	n := nodes[0]
	if _, err := n.Journal(context.Background()); err != nil {
		t.Fatalf("the node's own connection: %v", err)
	}
	nc, err := nats.Connect(n.ClientURL(), nats.MaxReconnects(0))
	if err == nil {
		nc.Close()
		t.Fatalf("an unauthenticated connection to %s was accepted", n.ClientURL())
	}
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("connect without the password = %v, want an authorization error", err)
	}
}
