package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"
)

// openKernelWith opens a kernel on dir with the idempotency options given.
func openKernelWith(t *testing.T, dir string, window time.Duration, keys int) (*Kernel, func()) {
	t.Helper()
	r := openRig(t, dir, func(o *Options) { o.IdempotencyWindow, o.IdempotencyKeys = window, keys })
	return r.k, r.close
}

// storedCreateKeys counts the create keys in the store.
func storedCreateKeys(t *testing.T, k *Kernel) int {
	t.Helper()
	n := 0
	if err := k.store.Records(kindCreateKey, func(string, func(any) error) bool { n++; return true }); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestCreateIdempotencyKey(t *testing.T) {
	k, closeKernel := openKernelWith(t, t.TempDir(), time.Hour, 100)
	defer closeKernel()
	ctx := context.Background()
	req := CreateRequest{AgentID: "ag", Input: json.RawMessage(`{"n": 1}`), Labels: map[string]string{"a": "b"}}
	alice := Meta{Principal: "alice", IdempotencyKey: "k1"}
	first, replayed, err := k.Create(ctx, req, alice)
	if err != nil || replayed {
		t.Fatalf("first create: %v replayed=%v", err, replayed)
	}
	tests := []struct {
		name     string
		req      CreateRequest
		meta     Meta
		replayed bool
		conflict bool
	}{
		{"same key, same request", req, alice, true, false},
		{"same request spelled differently", CreateRequest{AgentID: "ag", Input: json.RawMessage(`{"n":1}`), Labels: map[string]string{"a": "b"}}, alice, true, false},
		{"same key, another input", CreateRequest{AgentID: "ag", Input: json.RawMessage(`{"n":2}`), Labels: req.Labels}, alice, false, true},
		{"same key, another agent", CreateRequest{AgentID: "other", Input: req.Input, Labels: req.Labels}, alice, false, true},
		{"same key, another principal", req, Meta{Principal: "bob", IdempotencyKey: "k1"}, false, false},
		{"same key, same principal in a tenant", req, Meta{Principal: "alice", Tenant: "acme", IdempotencyKey: "k1"}, false, false},
		{"another key", req, Meta{Principal: "alice", IdempotencyKey: "k2"}, false, false},
		{"no key", req, Meta{Principal: "alice"}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, replayed, err := k.Create(ctx, tt.req, tt.meta)
			switch {
			case tt.conflict:
				if !errors.Is(err, ErrConflict) {
					t.Fatalf("want a conflict, got %v (%s)", err, v.ID)
				}
			case err != nil:
				t.Fatal(err)
			case replayed != tt.replayed || (v.ID == first.ID) != tt.replayed:
				t.Fatalf("replayed=%v id=%s, want replayed=%v of %s", replayed, v.ID, tt.replayed, first.ID)
			}
		})
	}
	if v, _, err := k.Create(ctx, req, alice); err != nil || v.Owner != "alice" || v.Status != StatusPending {
		t.Fatalf("a replay answers with the execution as it is: %+v %v", v, err)
	}
	if _, err := k.Cancel(ctx, first.ID, Meta{}); err != nil {
		t.Fatal(err)
	}
	if v, replayed, err := k.Create(ctx, req, alice); err != nil || !replayed || v.Status != StatusCancelled {
		t.Fatalf("replay after cancel: %+v %v %v", v, replayed, err)
	}
}

func TestCreateIdempotencyKeyConcurrentRetries(t *testing.T) {
	k, closeKernel := openKernelWith(t, t.TempDir(), time.Hour, 100)
	defer closeKernel()
	const n = 8
	ids := make(chan string, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			v, _, err := k.Create(context.Background(), CreateRequest{AgentID: "ag"}, Meta{Principal: "p", IdempotencyKey: "same"})
			if err != nil {
				t.Error(err)
			}
			ids <- v.ID
		})
	}
	wg.Wait()
	close(ids)
	seen := map[string]bool{}
	for id := range ids {
		seen[id] = true
	}
	if len(seen) != 1 {
		t.Fatalf("%d concurrent creates with one key made %d executions", n, len(seen))
	}
	if st := k.Stats(); st.Live != 1 {
		t.Fatalf("live executions: %d", st.Live)
	}
}

func TestCreateIdempotencyKeysSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	k, closeKernel := openKernelWith(t, dir, time.Hour, 100)
	meta := Meta{Principal: "alice", IdempotencyKey: "restart"}
	first, _, err := k.Create(ctx, CreateRequest{AgentID: "ag"}, meta)
	if err != nil {
		t.Fatal(err)
	}
	closeKernel()
	k, closeKernel = openKernelWith(t, dir, time.Hour, 100)
	defer closeKernel()
	v, replayed, err := k.Create(ctx, CreateRequest{AgentID: "ag"}, meta)
	if err != nil || !replayed || v.ID != first.ID {
		t.Fatalf("after restart: %s replayed=%v %v, want %s", v.ID, replayed, err, first.ID)
	}
	if _, _, err := k.Create(ctx, CreateRequest{AgentID: "ag2"}, meta); !errors.Is(err, ErrConflict) {
		t.Fatalf("another request after restart: %v", err)
	}
}

func TestCreateIdempotencyKeysAreBounded(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	k, closeKernel := openKernelWith(t, dir, time.Hour, 3)
	ids := map[string]string{}
	for _, key := range []string{"a", "b", "c", "d"} {
		v, _, err := k.Create(ctx, CreateRequest{AgentID: "ag"}, Meta{Principal: "p", IdempotencyKey: key})
		if err != nil {
			t.Fatal(err)
		}
		ids[key] = v.ID
	}
	if n := storedCreateKeys(t, k); n != 3 {
		t.Fatalf("%d keys stored, limit 3", n)
	}
	// The oldest made room: its key creates anew; the others still replay.
	if v, replayed, err := k.Create(ctx, CreateRequest{AgentID: "ag"}, Meta{Principal: "p", IdempotencyKey: "a"}); err != nil || replayed || v.ID == ids["a"] {
		t.Fatalf("evicted key: %s replayed=%v %v", v.ID, replayed, err)
	}
	closeKernel()
	// A smaller limit at start-up drops the oldest stored keys.
	k, closeKernel = openKernelWith(t, dir, time.Hour, 2)
	defer closeKernel()
	if n := storedCreateKeys(t, k); n != 2 {
		t.Fatalf("%d keys stored after restart, limit 2", n)
	}
	// Stored were c, d and the new a: c, the oldest, went.
	for _, c := range []struct {
		key    string
		replay bool
	}{{"d", true}, {"c", false}} {
		v, replayed, err := k.Create(ctx, CreateRequest{AgentID: "ag"}, Meta{Principal: "p", IdempotencyKey: c.key})
		if err != nil || replayed != c.replay || (v.ID == ids[c.key]) != c.replay {
			t.Fatalf("key %s after restart: replayed=%v %v, want %v", c.key, replayed, err, c.replay)
		}
	}
}

func TestCreateIdempotencyKeysExpire(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	const window = 200 * time.Millisecond
	k, closeKernel := openKernelWith(t, dir, window, 100)
	meta := Meta{Principal: "p", IdempotencyKey: "old"}
	first, _, err := k.Create(ctx, CreateRequest{AgentID: "ag"}, meta)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := k.Create(ctx, CreateRequest{AgentID: "ag"}, Meta{Principal: "p", IdempotencyKey: "older"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(window + 50*time.Millisecond)
	v, replayed, err := k.Create(ctx, CreateRequest{AgentID: "ag"}, meta)
	if err != nil || replayed || v.ID == first.ID {
		t.Fatalf("expired key: %s replayed=%v %v", v.ID, replayed, err)
	}
	if n, err := k.ExpireIdempotencyKeys(ctx); err != nil || n != 1 {
		t.Fatalf("expire: %d %v, want the one expired key left", n, err)
	}
	if n := storedCreateKeys(t, k); n != 1 {
		t.Fatalf("%d keys stored after expiry, want the new one", n)
	}
	closeKernel()
	time.Sleep(window + 50*time.Millisecond)
	k, closeKernel = openKernelWith(t, dir, window, 100)
	defer closeKernel()
	if n := storedCreateKeys(t, k); n != 0 {
		t.Fatalf("start-up kept %d expired keys", n)
	}
}
