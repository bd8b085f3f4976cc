package kernel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/gatehouse-dev/gatehouse/store"
)

// kindCreateKey holds the idempotency keys of creates: the hex of a
// createKey -> idemRecord whose Result is the execution id (a JSON string).
const kindCreateKey = "idemc"

// createKey names one owner's idempotency key. The owner is part of it, so
// that two principals' keys never meet; hashing it keeps the store key
// short whatever the principal and the key are.
type createKey [16]byte

func newCreateKey(m Meta) createKey {
	h := sha256.New()
	// Length-prefixed, so that no choice of fields can spell another's.
	for _, f := range []string{m.Principal, m.Tenant, m.IdempotencyKey} {
		h.Write([]byte(strconv.Itoa(len(f)) + ":" + f))
	}
	var k createKey
	copy(k[:], h.Sum(nil))
	return k
}

func (c createKey) String() string { return hex.EncodeToString(c[:]) }

// createKeys remembers the idempotency keys of creates: each for the window,
// and at most limit of them, the oldest making room for a new one. The
// records are in the store, written in the batch that creates the
// execution; memory keeps the time of each (about 64 bytes a key) so that a
// create with a new key reads nothing, and the order to evict them in.
type createKeys struct {
	window time.Duration
	limit  int

	mu sync.Mutex
	// at is the time of every key's stored record, in Unix nanoseconds.
	at map[createKey]int64
	// order lists the keys oldest first. A key stored again after it
	// expired leaves its older entry behind, stale: an entry counts only
	// while its time is the key's time in at.
	order []createRef
	// inflight holds the keys of creates under way: a retry that arrives
	// before the first attempt is answered waits for it.
	inflight map[createKey]chan struct{}
	// staged counts the keys written by commits under way, which the
	// limit counts already.
	staged int
}

type createRef struct {
	key createKey
	at  int64
}

func newCreateKeys(window time.Duration, limit int) *createKeys {
	return &createKeys{window: window, limit: limit, at: map[createKey]int64{}, inflight: map[createKey]chan struct{}{}}
}

// load reads the stored keys at start-up, deleting the expired ones and
// those beyond the limit.
func (c *createKeys) load(ctx context.Context, st *store.Store, now time.Time) error {
	var drop store.Batch
	err := st.Records(kindCreateKey, func(id string, decode func(any) error) bool {
		var rec idemRecord
		raw, herr := hex.DecodeString(id)
		if herr != nil || len(raw) != len(createKey{}) || decode(&rec) != nil || now.Sub(rec.At) >= c.window {
			drop.Delete(kindCreateKey, id)
			return ctx.Err() == nil
		}
		var k createKey
		copy(k[:], raw)
		c.at[k] = rec.At.UnixNano()
		c.order = append(c.order, createRef{key: k, at: rec.At.UnixNano()})
		return ctx.Err() == nil
	})
	if err != nil {
		return fmt.Errorf("load idempotency keys: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sort.Slice(c.order, func(i, j int) bool { return c.order[i].at < c.order[j].at })
	for _, ref := range c.evictLocked(c.limit) {
		drop.Delete(kindCreateKey, ref.key.String())
	}
	if drop.Len() == 0 {
		return nil
	}
	if err := st.Write(ctx, &drop); err != nil {
		return fmt.Errorf("drop expired idempotency keys: %w", err)
	}
	return nil
}

// evictLocked removes the oldest keys until at most keep remain, counting
// those being staged, and returns them for the caller to delete from the
// store.
func (c *createKeys) evictLocked(keep int) []createRef {
	return c.popLocked(func(createRef) bool { return len(c.at)+c.staged > keep })
}

// expire forgets the keys older than the window and returns them.
func (c *createKeys) expire(now time.Time) []createRef {
	c.mu.Lock()
	defer c.mu.Unlock()
	cutoff := now.Add(-c.window).UnixNano()
	return c.popLocked(func(oldest createRef) bool { return oldest.at <= cutoff })
}

// popLocked takes keys off the front of the order, oldest first, while
// more says so of the oldest, and returns those it forgot: a key used again
// since it was queued stays, under its newer entry.
func (c *createKeys) popLocked(more func(oldest createRef) bool) []createRef {
	var out []createRef
	for len(c.order) > 0 && more(c.order[0]) {
		ref := c.order[0]
		c.order = c.order[1:]
		if c.at[ref.key] == ref.at {
			delete(c.at, ref.key)
			out = append(out, ref)
		}
	}
	return out
}

// createClaim is a create that holds its key: no other create with the same
// key runs until release.
type createClaim struct {
	c    *createKeys
	key  createKey
	hash string
	done chan struct{}
}

// claimCreate looks the key of meta up. A key seen within the window
// answers with the execution it created (replayed) or, for another request,
// a conflict. Otherwise the caller gets the claim and creates; it must
// release it.
func (k *Kernel) claimCreate(ctx context.Context, meta Meta, hash string) (*createClaim, View, bool, error) {
	c := k.creates
	key := newCreateKey(meta)
	for {
		c.mu.Lock()
		wait, busy := c.inflight[key]
		if !busy {
			cl := &createClaim{c: c, key: key, hash: hash, done: make(chan struct{})}
			c.inflight[key] = cl.done
			at, known := c.at[key]
			c.mu.Unlock()
			if !known || time.Since(time.Unix(0, at)) >= c.window {
				return cl, View{}, false, nil
			}
			v, found, err := k.replayCreate(ctx, key, meta.IdempotencyKey, hash)
			if err == nil && !found {
				// Expired and deleted in the meantime: a new key.
				return cl, View{}, false, nil
			}
			cl.release()
			return nil, v, err == nil, err
		}
		c.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, View{}, false, newErr(ErrUnavailable, "service unavailable: %v", ctx.Err())
		}
	}
}

// replayCreate answers a retried create with the execution the key created;
// found is false when the key's record is gone.
func (k *Kernel) replayCreate(ctx context.Context, key createKey, idemKey, hash string) (v View, found bool, err error) {
	var rec idemRecord
	switch err := k.store.Get(kindCreateKey, key.String(), &rec); {
	case errors.Is(err, store.ErrNotFound):
		return View{}, false, nil
	case err != nil:
		return View{}, false, newErr(ErrUnavailable, "service unavailable: %v", err)
	}
	if rec.Hash != hash {
		return View{}, true, conflict("conflict: idempotency key %q was used for a different request", idemKey)
	}
	var id string
	if err := json.Unmarshal(rec.Result, &id); err != nil {
		return View{}, true, fmt.Errorf("idempotency key %q: stored answer: %w", idemKey, err)
	}
	v, err = k.Get(ctx, id)
	if errors.Is(err, ErrNotFound) {
		e := conflict("conflict: idempotency key %q created execution %s, which has been deleted since", idemKey, id)
		e.Details = map[string]any{"execution_id": id}
		return View{}, true, e
	}
	return v, true, err
}

// stage writes the key's record into t, the transaction that creates
// execution execID, making room for it first. What it changes in memory is
// undone if the commit fails.
func (cl *createClaim) stage(t *tx, execID string) {
	c := cl.c
	at := t.now.UnixNano()
	id, _ := json.Marshal(execID)
	if err := t.batch.Put(kindCreateKey, cl.key.String(), idemRecord{Hash: cl.hash, Result: id, At: t.now}); err != nil {
		t.err = err
		return
	}
	c.mu.Lock()
	evicted := c.evictLocked(c.limit - 1)
	c.staged++
	c.mu.Unlock()
	for _, ref := range evicted {
		t.batch.Delete(kindCreateKey, ref.key.String())
	}
	t.onAbort(func() {
		c.mu.Lock()
		c.staged--
		for _, ref := range evicted {
			if _, again := c.at[ref.key]; !again {
				c.at[ref.key] = ref.at
			}
		}
		c.order = append(evicted, c.order...)
		c.mu.Unlock()
	})
	t.onCommit(func() {
		c.mu.Lock()
		c.staged--
		c.at[cl.key] = at
		c.order = append(c.order, createRef{key: cl.key, at: at})
		c.mu.Unlock()
	})
}

// release lets the next create with the same key run.
func (cl *createClaim) release() {
	cl.c.mu.Lock()
	delete(cl.c.inflight, cl.key)
	cl.c.mu.Unlock()
	close(cl.done)
}

// ExpireIdempotencyKeys deletes the idempotency keys of creates that are
// older than Options.IdempotencyWindow. Expired keys are ignored anyway;
// this gives their space back. It returns how many it deleted.
func (k *Kernel) ExpireIdempotencyKeys(ctx context.Context) (int, error) {
	refs := k.creates.expire(time.Now())
	if len(refs) == 0 {
		return 0, nil
	}
	var b store.Batch
	for _, ref := range refs {
		b.Delete(kindCreateKey, ref.key.String())
	}
	if err := k.store.Write(ctx, &b); err != nil {
		return 0, fmt.Errorf("expire idempotency keys: %w", err)
	}
	return len(refs), nil
}
