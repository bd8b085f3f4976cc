package webpush

import (
	"context"
	"sync"
	"testing"

	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/store/storetest"
)

// journal is a store.Replica that keeps the groups in order, as a
// cluster's journal stream does.
type journal struct {
	mu     sync.Mutex
	groups [][]byte
}

func (j *journal) Replicate(_ context.Context, p []byte) (uint64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.groups = append(j.groups, append([]byte(nil), p...))
	return uint64(len(j.groups)), nil
}

// from returns the groups after position after, as a follower reads them.
func (j *journal) from(after uint64) []store.Replicated {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []store.Replicated
	for i := after; i < uint64(len(j.groups)); i++ {
		out = append(out, store.Replicated{Seq: i + 1, Data: j.groups[i]})
	}
	return out
}

func (j *journal) len() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.groups)
}

// TestVAPIDKeyPairReachesTheFollowerAndTheNextLeaderSignsWithIt: the key
// pair the leader makes is a group of the journal; a follower that applied
// the journal holds it, and once it leads its channel signs with the same
// pair without making another.
func TestVAPIDKeyPairReachesTheFollowerAndTheNextLeaderSignsWithIt(t *testing.T) {
	ctx := t.Context()
	j := &journal{}
	lead := storetest.Open(t, store.Options{})
	if err := lead.Lead(ctx, j); err != nil {
		t.Fatal(err)
	}
	first, err := New(ctx, Options{Store: lead})
	if err != nil {
		t.Fatal(err)
	}
	if j.len() != 2 {
		t.Fatalf("the journal holds %d groups: want the term's and the key pair's", j.len())
	}

	fol := storetest.Open(t, store.Options{})
	if err := fol.Follow(ctx, j.from(0)); err != nil {
		t.Fatal(err)
	}
	var held keyPair
	if err := fol.Get(kindKey, idVAPID, &held); err != nil {
		t.Fatalf("the follower's store: %v", err)
	}
	if held.Public != first.public || held.Private != first.private {
		t.Fatalf("the follower holds another key pair than the leader's")
	}

	lead.Unlead()
	if err := fol.Lead(ctx, j); err != nil {
		t.Fatal(err)
	}
	before := j.len()
	next, err := New(ctx, Options{Store: fol})
	if err != nil {
		t.Fatal(err)
	}
	if next.public != first.public || next.private != first.private {
		t.Fatalf("the next leader signs with another key pair")
	}
	if j.len() != before {
		t.Fatalf("the next leader wrote %d groups: the key pair was made again", j.len()-before)
	}
}
