package store

import (
	"sync"
	"sync/atomic"
)

// valueLog tracks which of Badger's value-log writes may not be on disk.
// Values of valueThreshold bytes and more live in the value log, which
// Badger (without SyncWrites) syncs when asked (DB.Sync) and when it moves
// on from a full file (its truncate msyncs first). The table pointing at a
// value is synced when written, so until the value is synced too, a power
// cut can leave the pointer without its value, and the journal must keep
// the write.
type valueLog struct {
	// written is the newest version given a value for the value log. It
	// is raised before the value is written, so a checkpoint that finds
	// a version in a table finds written at or above it.
	written atomic.Uint64

	mu sync.Mutex
	// synced is the newest version whose values are all on disk: every
	// write at or below it was complete when the last sync began.
	synced uint64
}

// wrote records that a value of version ts goes to the value log.
func (v *valueLog) wrote(ts uint64) {
	for {
		cur := v.written.Load()
		if ts <= cur || v.written.CompareAndSwap(cur, ts) {
			return
		}
	}
}

// dirty reports whether a value may be in the value log and not on disk.
func (v *valueLog) dirty() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.written.Load() > v.synced
}

// syncBadger has Badger sync its value log and its memory table's log,
// which then hold every write Badger had completed at version at and
// below: the caller reads the store's applied version before calling. A
// value written meanwhile, even at a version below at, is not counted.
func (s *Store) syncBadger(at uint64) error {
	s.vlog.mu.Lock()
	defer s.vlog.mu.Unlock()
	if err := s.db.Sync(); err != nil {
		return err
	}
	s.vlog.synced = max(s.vlog.synced, at)
	return nil
}
