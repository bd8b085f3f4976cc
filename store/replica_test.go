package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
)

// sliceReplica is a Replica that keeps groups in order, refusing every
// group once refuse is set, as a stream a newer leader appended to does.
type sliceReplica struct {
	mu     sync.Mutex
	groups [][]byte
	refuse error
}

func (r *sliceReplica) Replicate(_ context.Context, p []byte) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refuse != nil {
		return 0, r.refuse
	}
	r.groups = append(r.groups, append([]byte(nil), p...))
	return uint64(len(r.groups)), nil
}

// from returns the groups after position after.
func (r *sliceReplica) from(after uint64) []Replicated {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Replicated
	for i := after; i < uint64(len(r.groups)); i++ {
		out = append(out, Replicated{Seq: i + 1, Data: r.groups[i]})
	}
	return out
}

type note struct{ N int }

func TestFollowerHoldsWhatTheLeaderCommitted(t *testing.T) {
	ctx := context.Background()
	r := &sliceReplica{}
	lead := open(t, t.TempDir(), SyncAlways)
	defer lead.Close()
	if err := lead.Lead(ctx, r); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		var b Batch
		b.Append("x/e1", uint64(i+1), []byte(fmt.Sprint(i)))
		if err := b.Put("note", fmt.Sprint(i%5), note{i}); err != nil {
			t.Fatal(err)
		}
		if err := b.PutLazy("cursor", "c", note{i}); err != nil {
			t.Fatal(err)
		}
		if i == 10 {
			b.DeleteEntry("x/e1", 3)
		}
		write(t, lead, func(x *Batch) { x.Merge(&b) })
	}
	if got := lead.Replicated(); got != uint64(len(r.groups)) || got != 21 {
		t.Fatalf("leader at %d, replica holds %d groups (want the term's and 20)", got, len(r.groups))
	}

	dir := t.TempDir()
	fol := open(t, dir, SyncAlways)
	if fol.Epoch() == lead.Epoch() {
		t.Fatal("two fresh stores share an epoch")
	}
	// In two writes, as a follower reads them in batches.
	all := r.from(0)
	for _, part := range [][]Replicated{all[:7], all[7:]} {
		if err := fol.Follow(ctx, part); err != nil {
			t.Fatal(err)
		}
	}
	check := func(s *Store) {
		t.Helper()
		if s.Epoch() != lead.Epoch() {
			t.Errorf("follower's epoch %s, leader's %s", s.Epoch(), lead.Epoch())
		}
		if s.Replicated() != 21 {
			t.Errorf("follower at %d, want 21", s.Replicated())
		}
		want, _ := lead.Read("x/e1", 0, 100)
		got, err := s.Read("x/e1", 0, 100)
		if err != nil || len(got) != len(want) || len(got) != 17 || got[0].Seq != want[0].Seq {
			t.Errorf("follower's log: %d entries from %v (%v), leader's %d", len(got), first(got), err, len(want))
		}
		for id, n := range map[string]int{"0": 15, "4": 19} {
			var v note
			if err := s.Get("note", id, &v); err != nil || v.N != n {
				t.Errorf("note %s = %v, %v; want %d", id, v, err, n)
			}
		}
		var c note
		if err := s.Get("cursor", "c", &c); err != nil || c.N != 19 {
			t.Errorf("lazy cursor = %v, %v", c, err)
		}
	}
	check(fol)
	fol.Close()
	// The position and the epoch outlive a restart.
	fol = open(t, dir, SyncAlways)
	defer fol.Close()
	check(fol)

	t.Run("gap", func(t *testing.T) {
		err := fol.Follow(ctx, []Replicated{{Seq: 23, Data: encodeReplica(nil, nil)}})
		if !errors.Is(err, ErrReplicaGap) {
			t.Fatalf("Follow past a gap = %v, want ErrReplicaGap", err)
		}
	})
	t.Run("damaged", func(t *testing.T) {
		err := fol.Follow(ctx, []Replicated{{Seq: 22, Data: []byte{5, 1}}})
		if err == nil || fol.Replicated() != 21 {
			t.Fatalf("Follow of a damaged group = %v, at %d", err, fol.Replicated())
		}
	})
	t.Run("leading", func(t *testing.T) {
		if err := lead.Follow(ctx, r.from(0)); !errors.Is(err, ErrLeading) {
			t.Fatalf("a leader's Follow = %v, want ErrLeading", err)
		}
	})
}

func first(es []Entry) uint64 {
	if len(es) == 0 {
		return 0
	}
	return es[0].Seq
}

func TestRefusedGroupIsNotAppliedAndTheStoreStopsLeading(t *testing.T) {
	ctx := context.Background()
	fenced := errors.New("wrong last sequence")
	r := &sliceReplica{}
	dir := t.TempDir()
	s := open(t, dir, SyncAlways)
	if err := s.Lead(ctx, r); err != nil {
		t.Fatal(err)
	}
	write(t, s, func(b *Batch) { _ = b.Put("note", "a", note{1}) })
	r.mu.Lock()
	r.refuse = fenced
	r.mu.Unlock()
	var b Batch
	_ = b.Put("note", "a", note{2})
	if err := s.Write(ctx, &b); !errors.Is(err, ErrNotLeading) || !errors.Is(err, fenced) {
		t.Fatalf("write refused by the replica = %v", err)
	}
	if s.Leading() {
		t.Fatal("still leading after a refusal")
	}
	var b2 Batch
	_ = b2.Put("note", "b", note{3})
	if err := s.Write(ctx, &b2); !errors.Is(err, ErrNotLeading) {
		t.Fatalf("write after a refusal = %v, want ErrNotLeading", err)
	}
	var v note
	if err := s.Get("note", "a", &v); err != nil || v.N != 1 {
		t.Fatalf("note a = %v, %v; the refused write was applied", v, err)
	}
	// Following again picks up from what the store holds.
	s.Unlead()
	if err := s.Follow(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if s.Replicated() != 2 {
		t.Fatalf("at %d, want 2", s.Replicated())
	}
	s.Close()
}

func FuzzDecodeReplica(f *testing.F) {
	f.Add(encodeReplica(nil, []op{{key: []byte("r/a\x00b"), val: []byte("v"), lazy: true}, {key: []byte("l/x"), del: true}}))
	f.Add([]byte{1, 0})
	f.Fuzz(func(t *testing.T, p []byte) {
		ops, err := decodeReplica(p)
		if err != nil {
			return
		}
		again, err := decodeReplica(encodeReplica(nil, ops))
		if err != nil || len(again) != len(ops) {
			t.Fatalf("round trip: %d ops, then %d (%v)", len(ops), len(again), err)
		}
	})
}
