package peer

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

// TestQueueMatchesASlice runs random pushes, front pops, removals and
// searches against a plain slice, through many compactions.
func TestQueueMatchesASlice(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var q queue
	var model []uint64
	seq := uint64(0)
	for step := range 200000 {
		switch op := r.IntN(10); {
		case op < 5:
			seq += 1 + uint64(r.IntN(2))
			q.push(entry{Delivery: Delivery{Seq: seq}})
			model = append(model, seq)
		case op < 8 && len(model) > 0:
			n := 1 + r.IntN(min(3, len(model)))
			q.popFront(n)
			model = model[n:]
		case op < 9 && len(model) > 0:
			i := r.IntN(len(model))
			q.removeAt(i)
			model = slices.Delete(model, i, i+1)
		default:
			want := uint64(r.IntN(int(seq) + 2))
			i, _ := slices.BinarySearch(model, want)
			if got := q.search(want); got != i {
				t.Fatalf("step %d: search(%d) = %d, want %d", step, want, got, i)
			}
			f := q.find(want)
			if (f >= 0) != (i < len(model) && model[i] == want) {
				t.Fatalf("step %d: find(%d) = %d", step, want, f)
			}
		}
		if q.len() != len(model) {
			t.Fatalf("step %d: len %d, want %d", step, q.len(), len(model))
		}
		if len(model) > 0 && (q.at(0).Seq != model[0] || q.at(q.len()-1).Seq != model[len(model)-1]) {
			t.Fatalf("step %d: ends %d..%d, want %d..%d", step, q.at(0).Seq, q.at(q.len()-1).Seq, model[0], model[len(model)-1])
		}
		if cap(q.buf) > 4*max(len(model), shrinkCap) {
			t.Fatalf("step %d: capacity %d for %d entries", step, cap(q.buf), len(model))
		}
	}
}

// TestFullOutboxPushCostsNoCopy: pushing to a consumer that never
// acknowledges, through a full outbox, allocates the same small amount per
// push whatever the outbox limit: dropping the oldest entry moves a head
// index instead of copying the outbox (which cost 300 KB a push at the
// default limit).
func TestFullOutboxPushCostsNoCopy(t *testing.T) {
	for _, limit := range []int{64, 4096} {
		h := newHub(t, nil, Options{OutboxLimit: limit})
		k := Key{Role: "agent", ID: "a", Consumer: "sse"}
		c, _ := h.Attach(k, nil)
		push := func() {
			deliver(t, h, k, "x")
			c.Delivered(next(t, c).Seq)
		}
		for range 3 * limit { // full, and the array at its steady size
			push()
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		const n = 2000
		for range n {
			push()
		}
		runtime.ReadMemStats(&after)
		if per := (after.TotalAlloc - before.TotalAlloc) / n; per > 1024 {
			t.Errorf("limit %d: %d bytes allocated per push, want under 1 KiB", limit, per)
		}
	}
}
