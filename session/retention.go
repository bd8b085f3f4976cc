package session

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gatehouse-dev/gatehouse/store"
)

// Prune applies retention to every session's log: entries past
// Options.MaxEntries from the end, or older than Options.MaxAge, go, except
// from the first fact of a turn that has not ended on. It returns how many
// entries it removed. Readers whose cursor falls before what is kept get
// ErrCursorExpired.
func (r *Registry) Prune(ctx context.Context, now time.Time) (int, error) {
	var ids []string
	err := r.st.Records(kindSession, func(id string, _ func(any) error) bool {
		ids = append(ids, id)
		return ctx.Err() == nil
	})
	if err != nil {
		return 0, fmt.Errorf("session: prune: %w", err)
	}
	total := 0
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := r.prune(ctx, id, now)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// prune applies retention to session id's log.
func (r *Registry) prune(ctx context.Context, id string, now time.Time) (int, error) {
	b, err := r.book(ctx, id)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return 0, nil
		}
		return 0, err
	}
	keep, err := r.runningFrom(ctx, id)
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	cut := uint64(0)
	if b.last > uint64(r.o.MaxEntries) {
		cut = b.last - uint64(r.o.MaxEntries)
	}
	oldest := now.Add(-r.o.MaxAge)
	var batch store.Batch
	first := b.first
	var derr error
	err = r.st.Scan(streamOf(id), 0, func(seq uint64, data []byte) bool {
		var e entry
		if derr = store.Decode(data, &e); derr != nil {
			return false
		}
		if seq >= keep || seq > b.last || seq > cut && !e.At.Before(oldest) {
			first = seq
			if e.First > 0 {
				first = e.First
			}
			return false
		}
		batch.DeleteEntry(streamOf(id), seq)
		first = seq + 1
		return batch.Len() < 10000
	})
	if err == nil {
		err = derr
	}
	if err != nil || batch.Len() == 0 {
		return 0, err
	}
	if err := r.st.Write(ctx, &batch); err != nil {
		return 0, fmt.Errorf("session: prune %s: %w", id, err)
	}
	b.first = first
	return batch.Len(), nil
}

// runningFrom returns the first sequence of the oldest turn of session id
// that has not ended, or no limit.
func (r *Registry) runningFrom(ctx context.Context, id string) (uint64, error) {
	keep := ^uint64(0)
	err := store.EachRecord(ctx, r.st, kindTurn, id+"/", func(_ string, t *Turn) bool {
		if !t.Status.Ended() && t.FirstSeq > 0 {
			keep = min(keep, t.FirstSeq)
		}
		return true
	})
	return keep, err
}
