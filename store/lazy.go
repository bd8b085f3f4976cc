package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/btree"
	"github.com/vmihailenco/msgpack/v5"
)

// Lazy writes. Some keys are read back almost only when the store is
// opened again: a peer's outbox, which its owner keeps in memory while
// running, and similar bookkeeping. They change on nearly every request and
// most are deleted within a second, yet each write cost Badger a memory
// table entry, a share of every table flush, and compaction work: on the
// 2-core machine this was measured on, leaving them out of Badger took the
// bench's p99 latency down by about 2 ms.
//
// A lazy write is journaled with its group like any other, so it is as
// durable when acknowledged. The apply stage, though, keeps only each
// key's last lazy write and hands them to Badger later, together with a
// group: after lazyInterval, once lazyMaxBytes are waiting, or when a read
// may need them. A put deleted before it is handed over reaches Badger as
// the delete alone, and an entry appended, or a record created, and deleted
// before it is handed over never reaches Badger at all.
//
// Two rules keep it exact. Reads see every acknowledged write, lazy or
// not: a read of records looks among the lazy writes waiting, or being
// handed over, before Badger (see get and between), and a read of a log
// with lazy writes waiting first makes the apply stage hand them over (see
// settle). And a journal segment is released only once Badger's tables
// hold every lazy write from it (see late). A key must be written either
// always lazily or never.

const (
	// lazyInterval bounds how long a lazy write waits for Badger.
	lazyInterval = time.Second
	// lazyMaxBytes bounds the keys and values of the lazy writes waiting.
	lazyMaxBytes = 8 << 20
)

// lazyWrites holds the lazy writes applied to nothing yet.
type lazyWrites struct {
	interval time.Duration // lazyInterval, less on a small disk, or a test's
	maxBytes int           // lazyMaxBytes, less on a small disk

	// ops holds each key's last lazy write, in key order: a walk of
	// records reads the range it needs from it (see between), where a
	// scan of every waiting write cost 0.8 ms a walk with a second's
	// writes waiting (BenchmarkRecordWalkWithLazyWritesWaiting).
	mu     sync.Mutex
	ops    *btree.BTreeG[op]
	spaces map[string]int // log or kind (see keySpace) -> its writes in ops
	// landing holds the writes taken from ops until readers find them in
	// Badger (see landed): a read between the two finds them here.
	landing *btree.BTreeG[op]
	bytes   int
	oldest  uint64    // version of the group of the oldest write in ops
	since   time.Time // when that write was applied
}

// keep takes o, written by the group at version ts.
func (l *lazyWrites) keep(ts uint64, o op, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ops == nil {
		l.ops, l.landing, l.spaces = newOpTree(), newOpTree(), map[string]int{}
	}
	prev, ok := l.ops.Get(o)
	if ok {
		l.bytes -= len(prev.key) + len(prev.val)
		if prev.fresh && o.del {
			// Appended and deleted while waiting: Badger never had it.
			l.ops.Delete(prev)
			l.spaces[keySpace(o.key)]--
			if l.ops.Len() == 0 {
				l.oldest = 0 // nothing waits: the journal may go
			}
			return
		}
		o.fresh = prev.fresh
	} else {
		l.spaces[keySpace(o.key)]++
	}
	l.ops.ReplaceOrInsert(o)
	l.bytes += len(o.key) + len(o.val)
	if l.oldest == 0 {
		l.oldest, l.since = ts, now
	}
}

// due reports whether the waiting writes should be handed over now.
func (l *lazyWrites) due(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ops != nil && l.ops.Len() > 0 && (l.bytes >= l.maxBytes || now.Sub(l.since) >= l.interval)
}

// waiting reports whether writes to space are waiting.
func (l *lazyWrites) waiting(space string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.spaces[space] > 0
}

// take empties the waiting writes into ops, to be applied at version at,
// and records that in lt.
func (l *lazyWrites) take(ops []op, at uint64, lt *late) []op {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ops == nil || l.ops.Len() == 0 {
		return ops
	}
	l.ops.Ascend(func(o op) bool {
		ops = append(ops, o)
		return true
	})
	lt.add(l.oldest, at)
	// The apply stage takes, applies and lands in turn: landing is empty.
	l.ops, l.landing = l.landing, l.ops
	clear(l.spaces)
	l.bytes, l.oldest = 0, 0
	return ops
}

// landed says that the writes last taken are where reads find them in
// Badger: applied at a version readers read at.
func (l *lazyWrites) landed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.landing != nil {
		l.landing.Clear(true)
	}
}

// get returns the last lazy write of key acknowledged, if Badger may not
// show it yet.
func (l *lazyWrites) get(key []byte) (op, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ops == nil {
		return op{}, false
	}
	if o, ok := l.ops.Get(op{key: key}); ok {
		return o, true
	}
	return l.landing.Get(op{key: key})
}

// between returns, in key order, the lazy writes Badger may not show yet
// of the keys with prefix from start on.
func (l *lazyWrites) between(prefix, start []byte) []op {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ops == nil {
		return nil
	}
	var out []op
	l.ops.AscendGreaterOrEqual(op{key: start}, func(o op) bool {
		if !bytes.HasPrefix(o.key, prefix) {
			return false
		}
		out = append(out, o)
		return true
	})
	waiting := len(out)
	l.landing.AscendGreaterOrEqual(op{key: start}, func(o op) bool {
		if !bytes.HasPrefix(o.key, prefix) {
			return false
		}
		if _, newer := l.ops.Get(o); !newer {
			out = append(out, o)
		}
		return true
	})
	if waiting < len(out) && waiting > 0 {
		slices.SortFunc(out, func(a, b op) int { return bytes.Compare(a.key, b.key) })
	}
	return out
}

// newOpTree returns an empty set of writes ordered by key.
func newOpTree() *btree.BTreeG[op] {
	return btree.NewG(32, func(a, b op) bool { return bytes.Compare(a.key, b.key) < 0 })
}

// oldestWaiting returns the version of the group of the oldest write
// waiting, or 0.
func (l *lazyWrites) oldestWaiting() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.oldest
}

// settle makes Badger hold every lazy write to space acknowledged so far,
// before a read of a log (a log is read in pages and by position, where
// merging the waiting writes in would cost more than the rare hand-over):
// with some waiting, it commits an empty group that asks the apply stage to
// hand them over.
func (s *Store) settle(space string) error {
	// Writes acknowledged before the read may still be on their way to
	// the lazy set; once applied, they are in it.
	s.awaitApplied()
	if !s.lazy.waiting(space) {
		return nil
	}
	b := &Batch{ops: []op{{key: settleKey}}, settle: true}
	err := s.Write(context.Background(), b)
	if errors.Is(err, ErrFailed) {
		// Reads go on after a failure, with what Badger has.
		return nil
	}
	if err != nil {
		return fmt.Errorf("store: hand over lazy writes: %w", err)
	}
	return nil
}

// settleKey is what a settling group writes: a group needs a write.
var settleKey = []byte("m/settle")

// keySpace returns the log or kind a key belongs to: its part before the
// 0x00 that ends a stream name or a kind (see logPrefix, recordPrefix).
func keySpace(key []byte) string {
	if i := bytes.IndexByte(key, 0); i >= 0 {
		key = key[:i]
	}
	return string(key)
}

func logSpace(stream string) string { return "l/" + stream }

// AppendLazy is Append for a new entry that is seldom read: Badger gets it
// late (see lazy.go), a read still sees it. seq must never have been used
// in stream before: an entry deleted before Badger got it is dropped whole.
func (b *Batch) AppendLazy(stream string, seq uint64, data []byte) {
	b.add(op{key: logKey(stream, seq), val: data, lazy: true, fresh: true})
}

// DeleteEntryLazy is DeleteEntry for an entry written with AppendLazy.
func (b *Batch) DeleteEntryLazy(stream string, seq uint64) {
	b.add(op{key: logKey(stream, seq), del: true, lazy: true})
}

// PutLazy is Put for a record that is seldom read: Badger gets it late
// (see lazy.go), a read still sees it.
func (b *Batch) PutLazy(kind, id string, v any) error {
	return b.putLazy(kind, id, v, false)
}

// CreateLazy is PutLazy for a record the caller knows Badger does not
// hold, such as one keyed by a fresh id: deleted before Badger gets it, it
// never reaches Badger at all, not even as a delete marker.
func (b *Batch) CreateLazy(kind, id string, v any) error {
	return b.putLazy(kind, id, v, true)
}

func (b *Batch) putLazy(kind, id string, v any, fresh bool) error {
	data, err := msgpack.Marshal(v)
	if err != nil {
		return fmt.Errorf("store: encode %s/%s: %w", kind, id, err)
	}
	b.add(op{key: recordKey(kind, id), val: data, lazy: true, fresh: fresh})
	return nil
}

// DeleteLazy is Delete for a record written with PutLazy or CreateLazy.
func (b *Batch) DeleteLazy(kind, id string) {
	b.add(op{key: recordKey(kind, id), del: true, lazy: true})
}
