package kernel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/gatehouse-dev/gatehouse/store"
)

// The kinds of the earlier layout of executions' records, before kindExec:
// read only to move them (see moveLayout).
const (
	kindOldSummary = "xs"   // inverted created ns "/" id -> Summary
	kindOldIndex   = "xk"   // id -> its kindOldSummary key
	kindOldIdem    = "idem" // id "/" idempotency key -> idemRecord
)

// kindKernelMeta holds the kernel's own bookkeeping: metaLayout, once the
// records of executions are all in kindExec. It sorts before "x", as every
// kind written after start must (see kindExec).
const (
	kindKernelMeta = "kmeta"
	metaLayout     = "layout"
	// layoutOneKind is metaLayout's value once nothing of the earlier
	// layout is left.
	layoutOneKind = 2
)

// A move writes at most moveRecords records, of at most moveBytes, in one
// store batch: a folder of any size moves in batches of bounded memory.
const (
	moveRecords = 512
	moveBytes   = 1 << 20
)

// errLayout means a record of the earlier layout has a key that layout
// never wrote: the folder is damaged, and the kernel does not start on it.
var errLayout = errors.New("kernel: record of the earlier layout not understood")

// settleLayout moves the records of the earlier layout to kindExec, before
// anything reads them, and records that it is done, so that later starts
// read one record instead of three kinds. Each batch writes the new keys
// and deletes the old ones, so a start cut short leaves every record in one
// layout or the other, and the next start moves the rest. The store has
// recorded its format 3 already: no build that reads only the earlier
// layout opens the folder once a record has moved (see store.formatVersion).
func (k *Kernel) settleLayout(ctx context.Context) error {
	m, err := newLayoutMove(k.store)
	if err != nil || m == nil {
		return err
	}
	for {
		done, err := m.step(ctx)
		if err != nil {
			return err
		}
		if done {
			break
		}
	}
	if m.total() > 0 {
		k.log.Info("kernel: moved the records of executions to their one kind",
			"summaries", m.moved[kindOldSummary], "index", m.moved[kindOldIndex], "idempotency", m.moved[kindOldIdem])
	}
	return nil
}

// layoutMove moves the earlier layout's records, a batch a step.
type layoutMove struct {
	st    *store.Store
	kinds []string // the kinds left to move, the one being moved first
	after string   // the last id moved of kinds[0]
	moved map[string]int
	// maxRecords and maxBytes bound a batch: moveRecords and moveBytes.
	maxRecords, maxBytes int
}

// newLayoutMove returns the move of st's records, or nil when there is
// nothing to move.
func newLayoutMove(st *store.Store) (*layoutMove, error) {
	var layout int
	err := st.Get(kindKernelMeta, metaLayout, &layout)
	switch {
	case err == nil && layout >= layoutOneKind:
		return nil, nil
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return nil, fmt.Errorf("kernel: read the layout: %w", err)
	}
	return &layoutMove{st: st, kinds: []string{kindOldIdem, kindOldIndex, kindOldSummary}, moved: map[string]int{},
		maxRecords: moveRecords, maxBytes: moveBytes}, nil
}

func (m *layoutMove) total() int {
	n := 0
	for _, c := range m.moved {
		n += c
	}
	return n
}

// step moves one batch, or, with nothing left, records the layout; it
// reports the move done.
func (m *layoutMove) step(ctx context.Context) (done bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	var b store.Batch
	if len(m.kinds) == 0 {
		if err := b.Put(kindKernelMeta, metaLayout, layoutOneKind); err != nil {
			return false, err
		}
		if err := m.st.Write(ctx, &b); err != nil {
			return false, fmt.Errorf("kernel: record the layout: %w", err)
		}
		return true, nil
	}
	kind := m.kinds[0]
	n, size := 0, 0
	var last string
	var bad error
	err = m.st.RecordsAfter(kind, m.after, func(id string, decode func(any) error) bool {
		var raw msgpack.RawMessage
		if err := decode(&raw); err != nil {
			bad = fmt.Errorf("%w: %s/%s: %v", errLayout, kind, id, err)
			return false
		}
		if bad = moveRecord(&b, kind, id, bytes.Clone(raw)); bad != nil {
			return false
		}
		last = id
		n++
		size += len(id) + len(raw)
		return n < m.maxRecords && size < m.maxBytes
	})
	if err == nil {
		err = bad
	}
	if err != nil {
		return false, fmt.Errorf("kernel: move the records of executions: %w", err)
	}
	if n == 0 {
		m.kinds, m.after = m.kinds[1:], ""
		return false, nil
	}
	if err := m.st.Write(ctx, &b); err != nil {
		return false, fmt.Errorf("kernel: move the records of executions: %w", err)
	}
	m.after = last
	m.moved[kind] += n
	return false, nil
}

// moveRecord adds to b the move of record id of kind, whose msgpack value
// is raw, to kindExec.
func moveRecord(b *store.Batch, kind, id string, raw msgpack.RawMessage) error {
	var key string
	var val any = raw
	switch kind {
	case kindOldSummary:
		created, execID, ok := parseOldSummaryKey(id)
		if !ok {
			return fmt.Errorf("%w: %s/%s", errLayout, kind, id)
		}
		key = summaryKey(created, execID)
	case kindOldIndex:
		var old string
		if err := msgpack.Unmarshal(raw, &old); err != nil {
			return fmt.Errorf("%w: %s/%s: %v", errLayout, kind, id, err)
		}
		created, execID, ok := parseOldSummaryKey(old)
		if !ok || execID != id {
			return fmt.Errorf("%w: %s/%s -> %q", errLayout, kind, id, old)
		}
		key, val = indexKey(id), summaryKey(created, execID)
	case kindOldIdem:
		execID, idem, ok := strings.Cut(id, "/")
		if !ok || execID == "" {
			return fmt.Errorf("%w: %s/%s", errLayout, kind, id)
		}
		key = idemKey(execID, idem)
	}
	if err := b.PutLazy(kindExec, key, val); err != nil {
		return err
	}
	b.Delete(kind, id)
	return nil
}
