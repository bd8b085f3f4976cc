package store

import (
	"context"
	"sync"
)

// late remembers writes Badger got at a later version than the group that
// journaled them: groups applied together, at the newest one's version,
// and lazy writes handed over with a later group. A journal segment may go
// once Badger's tables hold every version it holds; for such writes, the
// version that counts is the one they were applied at.
type late struct {
	mu   sync.Mutex
	list []lateWrite // in order of at
}

// lateWrite says that writes of groups from version from on were applied
// at version at.
type lateWrite struct{ from, at uint64 }

// maxLate bounds late.list; past it the newest two merge, which only makes
// releasing more cautious.
const maxLate = 1024

// add remembers that writes of groups from version from on were applied
// at version at. It must be called before they are applied.
func (l *late) add(from, at uint64) {
	if from >= at {
		return // applied at their own version
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.list); n == maxLate {
		l.list[n-2] = lateWrite{from: min(l.list[n-2].from, l.list[n-1].from), at: l.list[n-1].at}
		l.list = l.list[:n-1]
	}
	l.list = append(l.list, lateWrite{from: from, at: at})
}

// limit returns the newest version whose journal records may be released
// when Badger's tables hold every version below durable (groups are
// applied in order, so a table holding version v means all below v are in
// tables too; v itself may be split across tables).
func (l *late) limit(durable uint64) uint64 {
	if durable == 0 {
		return 0
	}
	limit := durable - 1
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for n < len(l.list) && l.list[n].at < durable {
		n++
	}
	l.list = append(l.list[:0], l.list[n:]...)
	for _, w := range l.list {
		limit = min(limit, w.from-1)
	}
	return limit
}

// releasable returns the newest version whose journal records may be
// released, given that Badger's tables hold every version below durable.
// Lazy writes waiting are read first: handing them over records them in
// late before they stop waiting, so none slips between the two reads.
//
// The segment log holds every group applied before it is synced: the
// groups above that stay in the journal, the only copy on disk of their
// log writes.
func (s *Store) releasable(durable uint64) uint64 {
	limit := uint64(1<<64 - 1)
	if s.logs != nil {
		at := s.applied.Load()
		if _, err := s.logs.Sync(context.Background()); err != nil {
			s.log.Warn("checkpoint: the segment log is not synced; journal kept", "err", err)
			return 0
		}
		limit = at
	}
	if oldest := s.lazy.oldestWaiting(); oldest > 0 {
		limit = oldest - 1
	}
	return min(limit, s.late.limit(durable))
}
