package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/btree"
)

// Lazy writes. Some keys change far more often than they are read: a
// peer's outbox, which its owner keeps in memory while running, similar
// bookkeeping, and the kernel's records of executions, rewritten as an
// execution's status changes in its first second. Most outbox entries are
// deleted within a second, yet each write cost Badger a memory
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
	maxBytes int           // lazyMaxBytes, less on a small disk or under a memory limit

	mu     sync.Mutex
	ops    map[string]kept // key -> its last lazy write
	spaces map[string]int  // log or kind (see spaceOf) -> its writes in ops
	// ordered holds the keys of ops that are records' in key order, a tree
	// per kind: a walk of records reads only its range of them (see
	// between). A scan of ops took 0.78 ms a walk with a second of full
	// load's writes waiting (BenchmarkRecordWalkWithLazyWritesWaiting).
	// Only a key's first write touches it: the rewrites of a key, most
	// of the writes, stay a map's.
	ordered map[string]*btree.BTreeG[string]
	// landing and landingOrdered hold the writes taken from ops until
	// readers find them in Badger (see landed): a read between the two
	// finds them here.
	landing        map[string]kept
	landingOrdered map[string]*btree.BTreeG[string]
	bytes          int
	oldest         uint64    // version of the group of the oldest write in ops
	since          time.Time // when that write was applied
}

// kept is a lazy write with its key as the map holds it: most writes
// rewrite a key already waiting, and a map assigned by the write's own key
// bytes would make a string of them each time.
type kept struct {
	o   op
	key string
}

// keep takes o, written by the group at version ts.
func (l *lazyWrites) keep(ts uint64, o op, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ops == nil {
		l.ops, l.spaces, l.ordered = map[string]kept{}, map[string]int{}, map[string]*btree.BTreeG[string]{}
		l.landing, l.landingOrdered = map[string]kept{}, map[string]*btree.BTreeG[string]{}
	}
	prev, ok := l.ops[string(o.key)]
	if ok {
		key := prev.key
		l.bytes -= len(prev.o.key) + len(prev.o.val)
		if prev.o.fresh && o.del {
			// Appended and deleted while waiting: Badger never had it.
			space := key[:len(spaceOf(o.key))]
			delete(l.ops, key)
			l.spaces[space]--
			if t := l.ordered[space]; t != nil {
				t.Delete(key)
			}
			if len(l.ops) == 0 {
				l.oldest = 0 // nothing waits: the journal may go
			}
			return
		}
		o.fresh = prev.o.fresh
		l.ops[key] = kept{o: o, key: key}
	} else {
		// The space is the key's start: it shares the key's bytes for as
		// long as ops and spaces hold it, until take.
		key := string(o.key)
		space := key[:len(spaceOf(o.key))]
		l.spaces[space]++
		if isRecordKey(o.key) {
			t := l.ordered[space]
			if t == nil {
				t = btree.NewOrderedG[string](32)
				l.ordered[strings.Clone(space)] = t // kept past take
			}
			t.ReplaceOrInsert(key)
		}
		l.ops[key] = kept{o: o, key: key}
	}
	l.bytes += len(o.key) + len(o.val)
	if l.oldest == 0 {
		l.oldest, l.since = ts, now
	}
}

// due reports whether the waiting writes should be handed over now.
func (l *lazyWrites) due(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ops) > 0 && (l.bytes >= l.maxBytes || now.Sub(l.since) >= l.interval)
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
	if len(l.ops) == 0 {
		return ops
	}
	ops = slices.Grow(ops, len(l.ops))
	for _, k := range l.ops {
		ops = append(ops, k.o)
	}
	lt.add(l.oldest, at)
	// The apply stage takes, applies and lands in turn: landing is empty.
	l.ops, l.landing = l.landing, l.ops
	l.ordered, l.landingOrdered = l.landingOrdered, l.ordered
	clear(l.spaces)
	l.bytes, l.oldest = 0, 0
	return ops
}

// landed says that the writes last taken are where reads find them in
// Badger: applied at a version readers read at.
func (l *lazyWrites) landed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.landing)
	for _, t := range l.landingOrdered {
		t.Clear(true)
	}
}

// get returns the last lazy write of key acknowledged, if Badger may not
// show it yet.
func (l *lazyWrites) get(key []byte) (op, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if k, ok := l.ops[string(key)]; ok {
		return k.o, true
	}
	k, ok := l.landing[string(key)]
	return k.o, ok
}

// between returns, in key order, the lazy writes Badger may not show yet
// of the records with prefix from start on (prefix starts with its kind's,
// see recordPrefix).
func (l *lazyWrites) between(prefix, start []byte) []op {
	l.mu.Lock()
	defer l.mu.Unlock()
	space := spaceOf(prefix)
	p := string(prefix)
	var out []op
	pick := func(t *btree.BTreeG[string], from, shadow map[string]kept) {
		if t == nil {
			return
		}
		t.AscendGreaterOrEqual(string(start), func(k string) bool {
			if !strings.HasPrefix(k, p) {
				return false
			}
			if _, newer := shadow[k]; !newer {
				out = append(out, from[k].o)
			}
			return true
		})
	}
	pick(l.ordered[string(space)], l.ops, nil)
	waiting := len(out)
	pick(l.landingOrdered[string(space)], l.landing, l.ops)
	if waiting > 0 && len(out) > waiting {
		slices.SortFunc(out, func(a, b op) int { return bytes.Compare(a.key, b.key) })
	}
	return out
}

// isRecordKey reports whether key is a record's (see recordKey), not a
// log entry's.
func isRecordKey(key []byte) bool { return bytes.HasPrefix(key, []byte("r/")) }

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

// spaceOf returns the log or kind a key belongs to: its part before the
// 0x00 that ends a stream name or a kind (see logPrefix, recordPrefix).
func spaceOf(key []byte) []byte {
	if i := bytes.IndexByte(key, 0); i >= 0 {
		key = key[:i]
	}
	return key
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
	key, data, err := b.record(kind, id, v)
	if err != nil {
		return err
	}
	b.add(op{key: key, val: data, lazy: true, fresh: fresh})
	return nil
}

// DeleteLazy is Delete for a record written with PutLazy or CreateLazy.
func (b *Batch) DeleteLazy(kind, id string) {
	b.add(op{key: recordKey(kind, id), del: true, lazy: true})
}
