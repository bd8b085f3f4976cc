package kernel

import (
	"context"
	"fmt"
	"time"

	"github.com/gatehouse-dev/gatehouse/store"
)

// Prune deletes finished executions (summary, index, events and idempotency
// records) that ended before cutoff, and beyond the newest keep finished
// ones when keep > 0. Live executions are never touched. A reader asking
// for a pruned execution gets 404: its history is gone, not silently empty.
// It returns how many executions it deleted.
func (k *Kernel) Prune(ctx context.Context, cutoff time.Time, keep int) (int, error) {
	type victim struct{ key, id string }
	var victims []victim
	finished := 0
	// Without a count to keep, only executions that ended before cutoff
	// go, and each was created before it: its list entry lies in cutoff's
	// bucket or an older one, so the walk starts there instead of reading
	// every execution stored at every pass. (One whose clock went back
	// between its creation and its end waits for a later pass.)
	from := ""
	if keep <= 0 {
		from = bucket(cutoff.UnixMilli())
	}
	err := k.store.RecordsAfter(kindExec, from, func(key string, decode func(any) error) bool {
		if !isSummaryKey(key) {
			return ctx.Err() == nil
		}
		var s Summary
		if decode(&s) != nil || !s.Status.Terminal() {
			return ctx.Err() == nil
		}
		finished++
		if s.UpdatedAt.Before(cutoff) || (keep > 0 && finished > keep) {
			victims = append(victims, victim{key, s.ID})
		}
		return ctx.Err() == nil
	})
	if err == nil {
		// A scan cut short by ctx must not pass for one that found nothing.
		err = ctx.Err()
	}
	if err != nil {
		return 0, fmt.Errorf("prune: scan: %w", err)
	}
	deleted := 0
	for _, v := range victims {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		var b store.Batch
		b.DeleteLazy(kindExec, v.key)
		b.DeleteLazy(kindExec, indexKey(v.id))
		if err := k.store.Scan(streamOf(v.id), 0, func(seq uint64, _ []byte) bool {
			b.DeleteEntry(streamOf(v.id), seq)
			return true
		}); err != nil {
			return deleted, fmt.Errorf("prune %s: %w", v.id, err)
		}
		if err := k.store.RecordsWithPrefix(kindExec, idemPrefix(v.id), func(id string, _ func(any) error) bool {
			b.DeleteLazy(kindExec, id)
			return true
		}); err != nil {
			return deleted, fmt.Errorf("prune %s: %w", v.id, err)
		}
		if err := k.store.Write(ctx, &b); err != nil {
			return deleted, fmt.Errorf("prune %s: %w", v.id, err)
		}
		deleted++
	}
	if deleted > 0 {
		k.log.Info("pruned finished executions", "count", deleted, "cutoff", cutoff)
	}
	return deleted, nil
}
