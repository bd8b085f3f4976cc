package kernel

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestPruneDeletesOldFinishedExecutions(t *testing.T) {
	r, oldest := newRigRunning(t, nil)
	ctx := context.Background()
	done := Intent{Type: IntentComplete, IdempotencyKey: "done"}
	oldest.intent(t, r.k, done)
	var finished []string
	for range 2 {
		v := r.create("later")
		if _, err := r.k.Cancel(ctx, v.ID, Meta{}); err != nil {
			t.Fatal(err)
		}
		finished = append(finished, v.ID)
	}
	live := r.create("later")
	idem := func(id string) int {
		n := 0
		if err := r.st.RecordsWithPrefix(kindExec, idemPrefix(id), func(string, func(any) error) bool { n++; return true }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if idem(oldest.id) != 1 {
		t.Fatal("the keyed intent left no record to prune")
	}

	// Keeping the two newest finished executions deletes the oldest only,
	// all of it.
	if n, err := r.k.Prune(ctx, time.Time{}, 2); err != nil || n != 1 {
		t.Fatalf("prune keeping 2: %d %v", n, err)
	}
	_, err := r.k.Get(ctx, oldest.id)
	wantErr(t, err, ErrNotFound)
	_, err = r.k.Events(ctx, oldest.id, 0, 10)
	wantErr(t, err, ErrNotFound)
	_, _, err = r.k.Intent(ctx, IntentRequest{ExecutionID: oldest.id, SessionID: oldest.lease, Intent: done}, Meta{})
	wantErr(t, err, ErrNotFound)
	if idem(oldest.id) != 0 {
		t.Fatal("the pruned execution's idempotency record is left")
	}
	entries, err := r.st.Read(streamOf(oldest.id), 0, 10)
	if err != nil || len(entries) != 0 {
		t.Fatalf("the pruned execution's log holds %d events, %v", len(entries), err)
	}

	// Everything that finished before the cutoff goes; live executions stay.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := r.k.Prune(cancelled, time.Now().Add(time.Hour), 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("prune with a cancelled context: %v", err)
	}
	if n, err := r.k.Prune(ctx, time.Now().Add(time.Hour), 0); err != nil || n != 2 {
		t.Fatalf("prune before a cutoff: %d %v", n, err)
	}
	page, err := r.k.List(ctx, ListRequest{})
	if err != nil || len(page.Executions) != 1 || page.Executions[0].ID != live.ID {
		t.Fatalf("left after pruning: %+v %v", page.Executions, err)
	}
	if n, err := r.k.Prune(ctx, time.Now().Add(time.Hour), 0); err != nil || n != 0 {
		t.Fatalf("prune with nothing finished: %d %v", n, err)
	}
	for _, id := range finished {
		_, err := r.k.Get(ctx, id)
		wantErr(t, err, ErrNotFound)
	}
}

// TestPruneReadsOnlyWhatMayHaveExpired: with nothing old enough to go, a
// pass costs the same with 300 finished executions stored as with 10: it
// starts its walk at the cutoff instead of reading every execution.
func TestPruneReadsOnlyWhatMayHaveExpired(t *testing.T) {
	r, _ := newRigRunning(t, nil)
	ctx := context.Background()
	finish := func(n int) {
		for range n {
			v := r.create("later")
			if _, err := r.k.Cancel(ctx, v.ID, Meta{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	cutoff := time.Now().Add(-time.Hour)
	allocs := func() float64 {
		return testing.AllocsPerRun(5, func() {
			if n, err := r.k.Prune(ctx, cutoff, 0); err != nil || n != 0 {
				t.Fatalf("prune with nothing expired: %d %v", n, err)
			}
		})
	}
	finish(10)
	few := allocs()
	finish(290)
	many := allocs()
	// Each execution read costs several allocations (its id, its decoded
	// entry): 290 more read would be well over a thousand.
	if many > few+100 {
		t.Fatalf("a pass with nothing to prune allocated %.0f times with 300 executions stored, %.0f with 10", many, few)
	}
}
