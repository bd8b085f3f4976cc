// Package store keeps Gatehouse's durable state: sequenced logs (an
// execution's events, a session's log) in a segment log (package seglog,
// see segments.go), and keyed records encoded with msgpack, with the logs
// that suit it (a peer's outbox), in an embedded Badger database.
//
// Every write goes through one committer goroutine that batches whatever
// arrived while the previous batch was being synced (group commit), so many
// concurrent writers share one fsync. A group is made durable in the store's
// own journal (see journal.go), acknowledged, and applied to Badger while
// the next group is already being journaled. Write returns when its batch is
// as durable as the sync mode promises; a read waits until every
// acknowledged write is applied, so it never misses one.
package store

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/ristretto/v2/z"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/gatehouse-dev/gatehouse/internal/option"
)

// Sentinel errors. Callers branch on them with errors.Is.
var (
	// ErrNotFound means the key holds no value.
	ErrNotFound = errors.New("store: not found")
	// ErrClosed means the store was closed.
	ErrClosed = errors.New("store: closed")
	// ErrFailed means an earlier write or sync failed; the store refuses
	// further writes because what is on disk is no longer known.
	ErrFailed = errors.New("store: failed")
)

// SyncMode says when a write counts as durable.
type SyncMode int

const (
	// SyncAlways fsyncs every batch before any of its writes returns.
	SyncAlways SyncMode = iota
	// SyncBatch returns once the batch is written and fsyncs on an interval:
	// a power cut can lose up to one interval of acknowledged writes.
	SyncBatch
	// SyncNone never fsyncs explicitly and leaves it to the OS.
	SyncNone
)

// String returns the mode's flag spelling.
func (m SyncMode) String() string {
	switch m {
	case SyncAlways:
		return "always"
	case SyncBatch:
		return "batch"
	case SyncNone:
		return "none"
	}
	return fmt.Sprintf("SyncMode(%d)", int(m))
}

// ParseSyncMode parses "always", "batch" or "none".
func ParseSyncMode(s string) (SyncMode, error) {
	switch s {
	case "always", "":
		return SyncAlways, nil
	case "batch":
		return SyncBatch, nil
	case "none":
		return SyncNone, nil
	}
	return 0, fmt.Errorf("store: sync mode %q: want always, batch or none", s)
}

// Options configure a Store. The zero value is a SyncAlways store that needs
// only Dir (or InMemory).
type Options struct {
	// Dir is the data folder. Ignored when InMemory is set.
	Dir string
	// InMemory keeps everything in memory: for tests and throwaway runs.
	InMemory bool
	// Sync is the durability mode.
	Sync SyncMode
	// SyncInterval is how often SyncBatch fsyncs; zero means 10ms.
	SyncInterval time.Duration
	// MaxBatch bounds how many writes one commit groups; zero means 1024.
	MaxBatch int
	// QueueLength bounds writes waiting for the committer; zero means 8192.
	// Writers past it block (backpressure), they are never dropped.
	QueueLength int
	// ApplyGather is how long acknowledged groups may gather before they
	// are applied to Badger together; zero means 1ms. Nobody waits for
	// it: answers need only the journal, and a read that needs what is
	// gathering has it applied at once.
	ApplyGather time.Duration
	// Logger receives Badger's warnings and the store's own; nil discards.
	Logger *slog.Logger

	// DiskBudget is the most bytes the data folder may hold, the journal
	// and Badger's files together. Zero takes what the folder holds plus
	// the file system's free space when the store opens. It sizes the
	// journal's segments and Badger's files (a small budget gets small
	// ones) and the reserve, and writes stop short of it (see Space).
	DiskBudget int64
	// LowWater is the room (free space, or what the budget leaves,
	// whichever is less) below which new work waits: Admit refuses it.
	// Zero derives it from the reserve; it is never below the reserve.
	LowWater int64
	// MemoryLimit is the memory the process may use; zero means no bound.
	// It sizes Badger's memory tables and caches.
	MemoryLimit int64
	// SegmentLogs are the starts of the names of the logs kept in the
	// segment log rather than in Badger (see segments.go); nil means the
	// kernel's, the sessions' and the channels' logs. A store in memory
	// keeps every log in Badger. A folder must be opened with the same
	// SegmentLogs each time: a log is read only where they send it.
	SegmentLogs []string
	// CloseTimeout bounds how long Close waits for Badger to write its
	// memory tables out; zero means 30s. Past it the store closes as
	// after a crash: the journal, kept, is replayed at the next start.
	CloseTimeout time.Duration

	// segmentSize, memTableSize, vlogFileSize, lazyInterval and
	// pageOutEvery override the journal's and the segment log's segment
	// size, Badger's memory table and value log file sizes, how long lazy
	// writes may wait and how often table pages are handed back, for tests;
	// readSpace, how the file system's free space is read.
	segmentSize  int64
	memTableSize int64
	vlogFileSize int64
	lazyInterval time.Duration
	pageOutEvery time.Duration
	readSpace    func(dir string) (diskUsage, error)
	idleAfter    time.Duration
	// released, for tests, is called each time a checkpoint has let
	// journal segments go: from then on Badger's files alone hold their
	// writes.
	released func()
	// committing, for tests, is called as the apply stage hands Badger a
	// transaction at version ts, before Badger writes it.
	committing func(ts uint64)
}

// maxGroupBytes bounds the keys and values one commit groups, so that a
// group's journal record and Badger transactions stay small.
const maxGroupBytes = 8 << 20

// maxApplyBacklog and sizing.backlog bound the acknowledged groups
// waiting to be applied to Badger. Badger stalls now and then: switching
// to a new memory table allocates and clears it, which took 40 ms on the
// 2-core machine this was measured on, about 80 groups at full load. A
// backlog lets acknowledgements go on meanwhile, since they need only the
// journal, while reads wait for it to drain.
const maxApplyBacklog = 1024

// maxApplyBytes bounds the keys and values of the groups one Badger
// transaction applies. When a backlog has built up, applying it in a few
// transactions instead of one per group drains it faster.
const maxApplyBytes = 4 << 20

// checkpointInterval is how often the store lets Badger discard old
// versions and deletes journal segments Badger's tables have made redundant.
const checkpointInterval = 2 * time.Second

// pageOutInterval is how often, under a memory limit, the store looks at
// how much of its files the process holds in memory, to hand the pages of
// Badger's tables back to the kernel when they have grown (see tablePages
// and pager). A compaction reads and writes its tables through memory
// maps, and what it touched stays in the RSS until then. A pass reads
// /proc/self/maps and advises each table once, a few hundred microseconds
// with a thousand tables; a look reads /proc/self/statm. On a fixed tick of
// 250 ms, bursts of compactions at 50,000 stored executions still left up
// to 54 MB of table pages resident; watching their growth, up to 27 MB
// (docs/edge.md). An idle store, whose tables nothing writes, looks once
// every pageOutRetry.
const pageOutInterval = 50 * time.Millisecond

// pager decides when the store hands its table pages back: when the pages
// of its files have grown by pageOutStep since the last pass, and at least
// every pageOutRetry, for pages a pass could not take because they were
// still being written out.
type pager struct {
	// last is the files' resident bytes after the last pass, at when it
	// was.
	last int64
	at   time.Time
}

const (
	pageOutStep  = 2 * mib
	pageOutRetry = time.Second
)

// due reports whether n resident bytes of files at now call for a pass.
func (p *pager) due(n int64, now time.Time) bool {
	return n >= p.last+pageOutStep || now.Sub(p.at) >= pageOutRetry
}

// passed records a pass at now that left n resident bytes.
func (p *pager) passed(n int64, now time.Time) {
	p.last, p.at = n, now
}

// idleAfter is how long without a write makes the journal idle: it then
// moves to a small segment, lets go of the segments kept for reuse, and has
// Badger sync its own log so that the journal can be released (see
// checkpoint).
const idleAfter = 10 * time.Second

// Store is an open database. It is safe for concurrent use.
type Store struct {
	db      *badger.DB
	journal *journal // nil in memory
	guard   *guard   // nil in memory
	size    sizing
	opts    Options
	log     *slog.Logger
	epoch   atomic.Pointer[string]
	reqs    chan *request
	applyq  chan *group
	stop    chan struct{}
	done    chan struct{} // closed when both commit stages have ended
	// checkpointed is closed when checkpointLoop and the guard have ended.
	checkpointed chan struct{}
	failed       atomic.Pointer[error]
	// lastWrite is when the last group was journaled (Unix nanoseconds);
	// idle asks the commit loop to move the journal to a small segment.
	lastWrite atomic.Int64
	idle      chan chan struct{}
	// flushq asks the apply stage to have Badger write its memory tables
	// out (see Compact); compacting is held by Compact, and by Close
	// before it closes Badger.
	flushq     chan chan error
	compacting sync.Mutex
	// discarded is the version Badger may discard older versions below
	// (see checkpoint).
	discarded atomic.Uint64
	// crowded asks for a checkpoint at once: the journal holds more
	// written segments than sizing.journal.
	crowded chan struct{}

	// commitMu is held by whoever runs the commit stage's work: a group's
	// version, journal write and hand-over to the apply stage, and the
	// journal's syncs and moves when idle. The commit loop takes it for
	// each group it gathered; a writer that finds the stage idle and
	// nothing queued takes it and commits its own batch on its goroutine
	// (see Write). jbuf and dirty are the stage's, under it.
	commitMu sync.Mutex
	jbuf     []byte // the journal's write buffer, reused
	dirty    bool   // a group was journaled since the last sync (SyncBatch)

	// next is the version the next group is written at; only the commit
	// stage touches it. acked is the newest version acknowledged to its
	// writers, applied the newest Badger holds; readers wait for applied to
	// reach the acked they saw (applyCond, under applyMu), or for stuck:
	// Badger failed and applied will not move again.
	next      uint64
	acked     atomic.Uint64
	applied   atomic.Uint64
	applyMu   sync.Mutex
	applyCond *sync.Cond
	// applyNow cuts the apply stage's gather short: a reader or writer
	// waits for it.
	applyNow chan struct{}
	stuck    bool
	// batchSynced is, under SyncBatch, the newest version the journal
	// holds durably: a sync covers every group acknowledged before it.
	batchSynced atomic.Uint64
	// backlog is the bytes of the groups acknowledged and not yet applied,
	// under applyMu.
	backlog int64
	// lazy holds the lazy writes applied, but not handed to Badger yet;
	// late, the writes Badger got at a later version than their group's.
	lazy lazyWrites
	late late
	// unflushed counts the bytes given to Badger since the apply stage
	// last had it write its memory tables out (see flushIdle).
	unflushed atomic.Int64
	// vlog tracks what Badger's value log, which takes values of
	// valueThreshold bytes and more, may not hold on disk yet.
	vlog           valueLog
	valueThreshold int64
	// replayed is what the journal's replay at Open applied and skipped.
	replayed replay
	// split and applyOps are the apply stage's room for the groups it
	// applies (see applyGroups), kept from one apply to the next.
	split    logSplit
	applyOps []op
	// builders is Badger's pool of table builders' allocators, which the
	// checkpoint loop thins under a memory limit (see builders.go); nil
	// without one. released counts the allocators let go.
	builders *z.AllocatorPool
	released atomic.Uint64

	// logs holds the logs named by segmentLogs (see segments.go); nil in
	// memory, where Badger holds every log. legacy is set while a format 1
	// folder's journal is replayed: its log writes go to Badger, and are
	// moved with the rest. logsFrom is the newest version the segment
	// log held at Open: the replay gives it the groups above.
	logs        Logs
	segmentLogs []string
	legacy      bool
	logsFrom    uint64

	// leading is set while the store leads a cluster (see replica.go),
	// changed under leadMu; replicated is the Replica's position of the
	// last group applied.
	leading    atomic.Pointer[leader]
	leadMu     sync.Mutex
	replicated atomic.Uint64
	// replicatedSynced is, under SyncBatch, the Replica's position of the
	// last group the journal holds durably.
	replicatedSynced atomic.Uint64

	closeOnce sync.Once
	// gate is held shared by every Write and exclusively by Close, so Close
	// waits for in-flight writes while the committer still serves them.
	gate    sync.RWMutex
	closed  bool
	stats   Stats
	statsMu sync.Mutex
}

// Stats counts the committer's work, for metrics.
type Stats struct {
	// Commits is the number of batches committed.
	Commits uint64
	// Writes is the number of Write calls committed.
	Writes uint64
	// Syncs is the number of fsyncs.
	Syncs uint64
	// SyncTime is the time the journal's durable writes took, in all:
	// over Syncs, the latency of one durable point (a disk's fsync).
	SyncTime time.Duration
	// SyncLatency counts the Syncs by how long each took: bucket i those
	// of at most SyncBucketBound(i), the last those of longer. The mean
	// hides what an answer waits for when the disk stalls; the buckets
	// show it.
	SyncLatency [SyncBuckets + 1]uint64
	// LastBatch is the number of writes in the last batch.
	LastBatch int
	// LastCommit is how long the last commit (with its sync) took.
	LastCommit time.Duration
	// Space is the data folder's room at the last reading; zero in memory.
	Space Space
	// SegmentFailures counts the journal segments that could not be
	// prepared.
	SegmentFailures uint64
	// Refused counts the writes refused for lack of room.
	Refused uint64
	// Level0Tables is how many tables Badger's level 0 holds; at
	// Level0Stall its writes, and so the store's, wait for a compaction.
	Level0Tables, Level0Stall int
	// TableBytes is the size of Badger's tables, every level.
	TableBytes int64
	// BuildersReleased counts the table builders' allocators taken back
	// from Badger under a memory limit (see builders.go).
	BuildersReleased uint64
}

// SyncBuckets is the number of bounded buckets of Stats.SyncLatency.
const SyncBuckets = 14

// SyncBucketBound is the upper bound of Stats.SyncLatency's bucket i:
// 64 µs doubled i times, from a fast disk's durable write to a stalled
// one's half second.
func SyncBucketBound(i int) time.Duration { return 64 * time.Microsecond << i }

// syncBucket is the bucket of Stats.SyncLatency that a sync of d counts in.
func syncBucket(d time.Duration) int {
	if d <= SyncBucketBound(0) {
		return 0
	}
	return min(bits.Len64(uint64((d-1)/SyncBucketBound(0))), SyncBuckets)
}

type request struct {
	batch *Batch
	done  chan error
}

// group is one commit: the requests it answers and their writes, in order,
// at one version.
type group struct {
	reqs   []*request
	ops    []op
	size   int // bytes of keys and values
	lazy   int // lazy writes among ops
	settle bool
	ts     uint64
	start  time.Time
	wrote  time.Duration // the journal's write of the group
	// follow is the Replica's position a follower's batch in the group
	// applies up to, replicated the one a leader's group was given.
	follow, replicated uint64
	// settleOnly is set for a group that only hands lazy writes over.
	settleOnly bool
}

// Open opens (creating if needed) the database described by o.
func Open(o Options) (*Store, error) {
	if !o.InMemory && o.Dir == "" {
		return nil, errors.New("store: Options.Dir is required unless InMemory is set")
	}
	option.Default(&o.SyncInterval, 10*time.Millisecond)
	option.Default(&o.MaxBatch, 1024)
	option.Default(&o.QueueLength, 8192)
	option.Default(&o.ApplyGather, time.Millisecond)
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	z := sized(0, o.MemoryLimit)
	var g *guard
	if !o.InMemory {
		var err error
		if z, g, err = openSpace(o, log); err != nil {
			return nil, err
		}
	}
	if o.memTableSize > 0 {
		z.memTable = o.memTableSize
		z.derive()
	}
	if o.vlogFileSize > 0 {
		z.vlogFile = o.vlogFileSize
	}
	bo := badger.DefaultOptions(o.Dir).
		WithInMemory(o.InMemory).
		WithSyncWrites(false). // the journal makes writes durable instead
		WithLogger(badgerLogger{log}).
		WithNumVersionsToKeep(1).
		WithMemTableSize(z.memTable).
		WithNumMemtables(z.numMemtables).
		WithBlockCacheSize(z.blockCache).
		WithIndexCacheSize(z.indexCache).
		WithValueLogFileSize(z.vlogFile).
		WithValueThreshold(z.valueThreshold).
		WithBaseTableSize(z.baseTable).
		WithBaseLevelSize(z.baseLevel).
		WithNumCompactors(2).
		// Every memory table spans all the key space (logs, records, list
		// entries), so each compaction of level 0 rewrites all of level 1,
		// and its writes make the journal's syncs wait on the disk. Ten
		// tables instead of five halve how often that happens: over 60 s at
		// full load the longest stall went from about 600 ms to 60 ms. A
		// small disk compacts each table at once instead (see sized).
		WithNumLevelZeroTables(z.l0Tables).
		WithNumLevelZeroTablesStall(z.l0Stall).
		WithDetectConflicts(false)
	if z.tableGrowth > 0 {
		bo.TableSizeMultiplier = z.tableGrowth
	}
	if o.InMemory {
		bo = bo.WithDir("").WithValueDir("")
	}
	began := time.Now()
	if !o.InMemory {
		if err := recoverBadger(bo, log); err != nil {
			return nil, err
		}
	}
	// Managed mode: the store picks each write's version, so a journal
	// record replays at the version it was first applied at.
	db, err := badger.OpenManaged(bo)
	if err != nil {
		return nil, fmt.Errorf("store: open %q: %w", o.Dir, err)
	}
	s := &Store{
		db:     db,
		guard:  g,
		size:   z,
		opts:   o,
		log:    log,
		reqs:   make(chan *request, o.QueueLength),
		applyq: make(chan *group, maxApplyBacklog),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		idle:   make(chan chan struct{}),
		flushq: make(chan chan error),

		applyNow: make(chan struct{}, 1),
		crowded:  make(chan struct{}, 1),

		checkpointed: make(chan struct{}),

		valueThreshold: bo.ValueThreshold,
		segmentLogs:    o.SegmentLogs,
	}
	if s.segmentLogs == nil {
		s.segmentLogs = defaultSegmentLogs()
	}
	s.lazy.interval, s.lazy.maxBytes = cmp.Or(o.lazyInterval, z.lazyWait), z.lazyBytes
	if o.MemoryLimit > 0 {
		if s.builders = builderPool(db); s.builders == nil {
			log.Warn("Badger's table builders keep their buffers: this version of Badger has no pool the store knows")
		}
	}
	last := db.MaxVersion()
	opened := time.Now()
	if !o.InMemory {
		if s.legacy, err = s.openLogs(z); err == nil {
			s.logsFrom, err = s.logs.Sync(context.Background())
		}
		if err != nil {
			_ = s.closeLogs()
			_ = db.Close()
			return nil, err
		}
		last = max(last, s.logsFrom)
		jo := journalOptions{minSegment: min(minSegmentSize, z.segment), maxSegment: z.segment, recycle: z.journal / 2,
			durable: o.Sync == SyncAlways, log: log}
		if o.segmentSize > 0 {
			jo.minSegment, jo.maxSegment = o.segmentSize, o.segmentSize
		}
		if s.journal, err = openJournal(filepath.Join(o.Dir, "journal"), jo); err == nil {
			var (
				replayed uint64
				r        replay
			)
			replayed, err = s.journal.replay(func(ts uint64, ops []op) error { return s.replayApply(&r, ts, ops) })
			last = max(last, replayed)
			s.late.add(r.from, r.at)
			s.replayed = r
			if r.skipped > 0 || r.applied > 0 {
				log.Info("journal replayed", "writes", r.applied, "already_held", r.skipped,
					"badger_open", opened.Sub(began).Round(time.Millisecond), "logs_and_replay", time.Since(opened).Round(time.Millisecond))
			}
		}
		if err == nil {
			err = s.settleFormat(last)
		}
		if err == nil {
			var held uint64
			if held, err = s.logs.Sync(context.Background()); err == nil {
				last = max(last, held, db.MaxVersion())
			}
		}
		if err != nil {
			_ = s.closeLogs()
			_ = db.Close()
			return nil, err
		}
	}
	s.next = last + 1
	s.acked.Store(last)
	s.applied.Store(last)
	s.applyCond = sync.NewCond(&s.applyMu)
	s.lastWrite.Store(time.Now().UnixNano())
	db.SetDiscardTs(last)
	if g != nil {
		g.prepErr = s.journal.lastPrepErr
		g.check()
	}
	go s.commitLoop()
	go s.checkpointLoop()
	epoch, err := s.loadEpoch()
	if err == nil {
		err = s.loadReplicated()
	}
	if err != nil {
		_ = s.Close()
		return nil, err
	}
	s.epoch.Store(&epoch)
	return s, nil
}

var epochKey = []byte("m/epoch")

// loadEpoch returns the store's epoch, creating it on first open. The epoch
// changes only when the data folder is wiped, so a cursor from another epoch
// is known to point into history that no longer exists.
func (s *Store) loadEpoch() (string, error) {
	var epoch string
	err := s.view(func(txn *badger.Txn) error {
		item, err := txn.Get(epochKey)
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error { epoch = string(v); return nil })
	})
	if err == nil {
		return epoch, nil
	}
	if !errors.Is(err, badger.ErrKeyNotFound) {
		return "", fmt.Errorf("store: read epoch: %w", err)
	}
	epoch = fmt.Sprintf("%x", time.Now().UnixNano())
	b := &Batch{ops: []op{{key: epochKey, val: []byte(epoch)}}}
	if err := s.Write(context.Background(), b); err != nil {
		return "", fmt.Errorf("store: write epoch: %w", err)
	}
	return epoch, nil
}

// view runs fn in a read transaction that sees every write acknowledged
// before the call.
func (s *Store) view(fn func(txn *badger.Txn) error) error {
	txn := s.db.NewTransactionAt(s.awaitApplied(), false)
	defer txn.Discard()
	return fn(txn)
}

// awaitApplied waits until Badger holds every write acknowledged so far and
// returns the version to read at. The wait is at most the apply of a few
// groups, except when Badger failed: then it returns at once, and reads
// see what Badger has.
func (s *Store) awaitApplied() uint64 {
	want := s.acked.Load()
	if v := s.applied.Load(); v >= want {
		return v
	}
	s.hurryApply()
	s.applyMu.Lock()
	for s.applied.Load() < want && !s.stuck {
		s.applyCond.Wait()
	}
	s.applyMu.Unlock()
	return s.applied.Load()
}

// hurryApply has the apply stage apply what it gathered without waiting
// out Options.ApplyGather: someone waits for it.
func (s *Store) hurryApply() {
	select {
	case s.applyNow <- struct{}{}:
	default:
	}
}

// Epoch identifies this database's lifetime; it changes when the data folder
// is wiped.
func (s *Store) Epoch() string { return *s.epoch.Load() }

// Mode returns the sync mode in force.
func (s *Store) Mode() SyncMode { return s.opts.Sync }

// Stats returns a copy of the committer's counters.
func (s *Store) Stats() Stats {
	s.statsMu.Lock()
	st := s.stats
	s.statsMu.Unlock()
	if s.guard != nil {
		st.Space = s.guard.snapshot()
		st.SegmentFailures = s.journal.prepFailures.Load()
		st.Refused = s.guard.refused.Load()
	}
	st.Level0Stall = s.size.l0Stall
	st.BuildersReleased = s.released.Load()
	for _, l := range s.db.Levels() {
		if l.Level == 0 {
			st.Level0Tables = l.NumTables
		}
		st.TableBytes += l.Size
	}
	return st
}

// Ping reports whether the store can be read and still accepts writes.
func (s *Store) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.gate.RLock()
	defer s.gate.RUnlock()
	if s.closed {
		return ErrClosed
	}
	if p := s.failed.Load(); p != nil {
		return *p
	}
	if s.guard != nil {
		if sp := s.guard.snapshot(); sp.State != SpaceOK {
			return &SpaceError{Space: sp}
		}
		if err := s.journal.lastPrepErr(); err != nil {
			return err
		}
	}
	return s.view(func(txn *badger.Txn) error {
		_, err := txn.Get(epochKey)
		return err
	})
}

// Admit returns nil when there is room for new work, and otherwise a
// *SpaceError (matching ErrStorageFull): below the low-water mark, new
// work waits so that work already running can finish from what is left.
func (s *Store) Admit() error {
	if s.guard == nil {
		return nil
	}
	return s.guard.admitNew()
}

// SpaceChanged returns a channel closed at the next change of the room's
// state (see Space): work refused for lack of room can wait on it rather
// than try again and again. A store in memory never closes it.
func (s *Store) SpaceChanged() <-chan struct{} {
	if s.guard == nil {
		return nil
	}
	return s.guard.changes()
}

// Space returns the data folder's room at the last reading; a store in
// memory has room without end (State SpaceOK, the figures zero).
func (s *Store) Space() Space {
	if s.guard == nil {
		return Space{}
	}
	return s.guard.snapshot()
}

// Write commits b atomically. It returns when b is durable under the store's
// sync mode, or with an error, in which case none of b was applied. ctx bounds
// only the wait to enter the commit queue: once queued, Write waits for the
// outcome, so a caller never mistakes a committed write for a failed one.
// The store goes on using b's bytes after Write returns (it applies them to
// Badger in the background), so neither b nor the slices given to it may be
// changed afterwards. Short of room (see Space), a write that grows the
// data is refused with a *SpaceError, which matches ErrStorageFull; one
// that only deletes still goes on.
func (s *Store) Write(ctx context.Context, b *Batch) error {
	if b == nil || len(b.ops) == 0 {
		return nil
	}
	if p := s.failed.Load(); p != nil {
		return *p
	}
	if err := s.checkLogs(b); err != nil {
		return err
	}
	// A write that only hands lazy writes over (a block of journal, no
	// new data) goes through whatever the room: reads need it, and so does
	// an idle journal letting its segments go.
	if s.guard != nil && !b.settling() {
		if err := s.guard.admit(b.shrinks()); err != nil {
			return err
		}
	}
	s.gate.RLock()
	defer s.gate.RUnlock()
	if s.closed {
		return ErrClosed
	}
	// With nothing queued and no group being written, the writer commits
	// its batch itself: handing it to the commit loop and waiting for its
	// answer cost two goroutine wake-ups per commit, the larger part of a
	// commit's time when writes come one at a time and the disk is fast.
	// Under load the queue is seldom empty, and the commit loop gathers
	// what waits into groups as before.
	if len(s.reqs) == 0 && s.commitMu.TryLock() {
		return s.commitInline(b)
	}
	r := &request{batch: b, done: make(chan error, 1)}
	select {
	case s.reqs <- r:
	case <-ctx.Done():
		return fmt.Errorf("store: write not queued: %w", ctx.Err())
	}
	return <-r.done
}

// commitLoop is the first commit stage: it gathers a group from the queue,
// journals it (durably, under SyncAlways), answers its writers and hands it
// to applyLoop, then gathers the next group while that one is applied. A
// writer that finds it idle commits on its own goroutine instead (Write).
//
// One journal write is in flight at a time (commitMu). Two would let a group start
// while the previous one's write returns, but on the 2-core machine this
// was measured on they made groups half as large and the system calls per
// execution twice as many, and executions 13% slower.
func (s *Store) commitLoop() {
	applied := make(chan struct{})
	go func() {
		defer close(applied)
		s.applyLoop()
	}()
	defer func() {
		close(s.applyq)
		s.hurryApply()
		<-applied
		close(s.done)
	}()
	var tick <-chan time.Time
	if s.opts.Sync == SyncBatch && s.journal != nil {
		ticker := time.NewTicker(s.opts.SyncInterval)
		defer ticker.Stop()
		tick = ticker.C
	}
	for {
		select {
		case r := <-s.reqs:
			s.commitMu.Lock()
			g := s.gather(r)
			err := s.commitGroup(g)
			for _, r := range g.reqs {
				r.done <- err
			}
			if err == nil {
				s.enqueueApply(g)
			}
			s.commitMu.Unlock()
		case <-tick:
			s.commitMu.Lock()
			s.batchSync()
			s.commitMu.Unlock()
		case done := <-s.idle:
			s.commitMu.Lock()
			s.journalIdle()
			s.commitMu.Unlock()
			close(done)
		case <-s.stop:
			// Close holds the gate, so no writer is waiting or can enter.
			s.commitMu.Lock()
			if s.dirty && s.opts.Sync != SyncAlways {
				if err := s.journal.sync(); err != nil {
					s.log.Error("final sync failed", "err", err)
				}
			}
			s.commitMu.Unlock()
			return
		}
	}
}

// commitInline commits b as a group of its own on the writer's goroutine;
// the caller holds commitMu, which it releases.
func (s *Store) commitInline(b *Batch) error {
	defer s.commitMu.Unlock()
	g := &group{ops: b.ops, size: b.size, lazy: b.lazy, settle: b.settle, follow: b.follow, start: time.Now(),
		settleOnly: b.settling()}
	err := s.commitGroup(g)
	if err == nil {
		s.enqueueApply(g)
	}
	return err
}

// commitGroup gives g its version and journals it; the caller holds
// commitMu, answers g's writers and hands g to the apply stage.
func (s *Store) commitGroup(g *group) error {
	if err := s.replicate(g); err != nil {
		return err
	}
	var err error
	s.jbuf, err = s.journalGroup(g, s.jbuf)
	if err != nil {
		return err
	}
	s.dirty = true
	s.acked.Store(g.ts)
	s.countCommit(g)
	if at := max(g.follow, g.replicated); at > 0 {
		s.replicated.Store(at)
	}
	return nil
}

// batchSync syncs the journal under SyncBatch when a group was journaled
// since the last sync; the caller holds commitMu.
func (s *Store) batchSync() {
	if !s.dirty {
		return
	}
	s.dirty = false
	at, rep := s.acked.Load(), s.replicated.Load()
	start := time.Now()
	if err := s.journal.sync(); err != nil {
		s.fail(err)
	} else {
		s.batchSynced.Store(at)
		s.replicatedSynced.Store(rep)
		s.countSync(time.Since(start))
	}
}

// journalGroup gives g its version and writes it to the journal, durably
// under SyncAlways, encoding it in buf. It returns the buffer to reuse.
func (s *Store) journalGroup(g *group, buf []byte) ([]byte, error) {
	if err := s.failedErr(); err != nil {
		return buf, err
	}
	g.ts = s.next
	s.next++
	if s.journal == nil {
		return buf, nil
	}
	rec := s.journal.encode(buf, g.ts, g.ops)
	if !s.journal.fits(rec) {
		if err := s.journal.rotate(); err != nil {
			if isNoSpace(err) {
				return rec, s.guard.full(err)
			}
			return rec, s.fail(err)
		}
		if s.journal.heldBytes() > s.size.journal {
			select {
			case s.crowded <- struct{}{}:
			default:
			}
		}
	}
	start := time.Now()
	err := s.journal.place(rec, g.ts).do()
	g.wrote = time.Since(start)
	if err != nil {
		if isNoSpace(err) {
			// Nothing was acknowledged: the writers are refused and
			// may try again once there is room.
			s.journal.seal()
			return rec, s.guard.full(err)
		}
		return rec, s.fail(err)
	}
	if !g.settle || len(g.ops) > 1 {
		s.lastWrite.Store(g.start.UnixNano())
	}
	s.guard.wrote(len(rec))
	return rec, nil
}

// gather takes r and whatever else is queued, within the group bounds.
func (s *Store) gather(r *request) *group {
	g := &group{reqs: []*request{r}, start: time.Now()}
	size := r.batch.size
	for len(g.reqs) < s.opts.MaxBatch && size < maxGroupBytes {
		var more *request
		select {
		case more = <-s.reqs:
		default:
		}
		if more == nil {
			break
		}
		g.reqs = append(g.reqs, more)
		size += more.batch.size
	}
	g.size = size
	for _, r := range g.reqs {
		g.lazy += r.batch.lazy
		g.settle = g.settle || r.batch.settle
		g.follow = max(g.follow, r.batch.follow)
	}
	g.settleOnly = len(g.reqs) == 1 && r.batch.settling()
	if len(g.reqs) == 1 {
		g.ops = r.batch.ops
		return g
	}
	n := 0
	for _, r := range g.reqs {
		n += len(r.batch.ops)
	}
	g.ops = make([]op, 0, n)
	for _, r := range g.reqs {
		g.ops = append(g.ops, r.batch.ops...)
	}
	return g
}

// enqueueApply hands an acknowledged group to applyLoop, first waiting
// while the backlog holds more than maxBacklogBytes.
func (s *Store) enqueueApply(g *group) {
	s.applyMu.Lock()
	for s.backlog > 0 && s.backlog+int64(g.size) > s.size.backlog && !s.stuck {
		s.hurryApply()
		s.applyCond.Wait()
	}
	s.backlog += int64(g.size)
	s.applyMu.Unlock()
	s.applyq <- g
}

// applyLoop is the second commit stage: it applies acknowledged groups to
// Badger in order and lets the readers waiting for them go. Groups that
// queued up meanwhile are applied together (see applyGroups). A failure
// here poisons the store: the groups are in the journal, so a restart
// applies them.
func (s *Store) applyLoop() {
	var groups []*group
	// The apply stage gathers groups for Options.ApplyGather before it
	// hands them to Badger in one transaction. No answer waits for the
	// apply (acknowledgements need only the journal), and whoever waits
	// for it asks for it at once (hurryApply), so the gather delays
	// nobody; what it saves is the hand-overs of a transaction per group
	// (this stage's wake-up, Badger's writer's and this stage's again):
	// about 3% of the server's CPU one request at a time (see
	// docs/decisions.md).
	gather := time.NewTimer(s.opts.ApplyGather)
	gather.Stop()
	for {
		var g *group
		select {
		case next, ok := <-s.applyq:
			if !ok {
				s.applyLast()
				return
			}
			g = next
		case done := <-s.flushq:
			done <- s.flushBadger()
			continue
		}
		// Alone in the queue, the group waits for others to gather; those
		// acknowledged meanwhile wait in applyq, which wakes no one while
		// this waits here. A queue that holds more already is a batch.
		var flush chan error
		if len(s.applyq) == 0 {
			gather.Reset(s.opts.ApplyGather)
			select {
			case <-gather.C:
			case <-s.applyNow:
				gather.Stop()
			case flush = <-s.flushq:
				gather.Stop()
			}
		}
		groups = append(groups[:0], g)
		size := g.size
	more:
		for size < maxApplyBytes {
			select {
			case next, ok := <-s.applyq:
				if !ok {
					break more
				}
				groups = append(groups, next)
				size += next.size
			default:
				break more
			}
		}
		err := s.failedErr()
		if err == nil {
			if err = s.applyGroups(groups); err != nil {
				s.fail(err)
			}
		}
		s.applyMu.Lock()
		s.backlog -= int64(size)
		if err == nil {
			s.applied.Store(groups[len(groups)-1].ts)
			s.lazy.landed()
		} else {
			s.stuck = true
		}
		s.applyCond.Broadcast()
		s.applyMu.Unlock()
		clear(groups) // let the applied groups' bytes go
		if flush != nil {
			flush <- s.flushBadger()
		}
	}
}

// applyLast hands Badger the lazy writes still waiting when the store
// closes, so that a clean close leaves it everything.
func (s *Store) applyLast() {
	if at := s.applied.Load(); s.failedErr() == nil {
		if ops := s.lazy.take(nil, at, &s.late); len(ops) > 0 {
			if err := s.apply(at, ops); err != nil {
				s.fail(err)
				return
			}
			s.lazy.landed()
		}
	}
}

// flushKey is a key written only to be dropped: Badger writes its memory
// tables out when a prefix that has data is dropped, and offers no other
// way short of closing.
var flushKey = []byte("m/flush")

// flushBadger has Badger write its memory tables out as tables, the lazy
// writes waiting included. It runs in the apply stage: Badger refuses
// writes while it drops a prefix, and the apply stage is its only writer.
func (s *Store) flushBadger() error {
	if err := s.failedErr(); err != nil {
		return err
	}
	at := s.applied.Load()
	ops := append(s.lazy.take(nil, at, &s.late), op{key: flushKey, val: []byte{1}})
	if err := s.apply(at, ops); err != nil {
		return s.fail(err)
	}
	s.lazy.landed()
	if err := s.db.DropPrefix(flushKey); err != nil {
		return fmt.Errorf("store: write memory tables out: %w", err)
	}
	s.unflushed.Store(0)
	return nil
}

// idleFlushBytes is how much an idle store leaves in Badger's memory
// table: past it, going idle writes the table out, so that an idle folder
// holds tables rather than the log of a memory table filled by the last
// burst. After retention emptied a gateway, the deletions that follow a
// burst (the outboxes of the peers that left) kept 2-4 MB of such a log
// until the table filled, hours later on a quiet box.
const idleFlushBytes = 1 << 20

// flushIdle has Badger write its memory tables out when more than
// idleFlushBytes went to it since they last were.
func (s *Store) flushIdle() {
	if s.unflushed.Load() < idleFlushBytes || s.roomToFlush() != nil {
		return
	}
	if err := s.flush(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
		s.log.Warn("idle: cannot write Badger's memory tables out", "err", err)
	}
}

// flush has the apply stage make Badger write its memory tables out (see
// flushBadger) and waits for it.
func (s *Store) flush(ctx context.Context) error {
	done := make(chan error, 1)
	select {
	case s.flushq <- done:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.stop:
		return ErrClosed
	}
	return <-done
}

// maxFlatten bounds the tables Compact rewrites into one level: Badger's
// compactions wait meanwhile, and so does Close.
const maxFlatten = 512 * mib

// Compact gives back the space of what was deleted: Badger writes its
// memory tables out, compacts its tables into one level, where deletions
// meet what they delete and both go, and collects its value log. Badger
// gets there by itself under writes; an idle gateway has none, and kept
// what retention deleted. Compacting writes the live data again before the
// old tables go, so it runs only when the tables are at most maxFlatten
// and the room holds them with the reserve to spare; otherwise only the
// memory tables are written out and the value log collected. The journal
// then keeps one small segment, as an idle one does. Close waits for it.
func (s *Store) Compact(ctx context.Context) error {
	if s.opts.InMemory {
		return nil
	}
	s.compacting.Lock()
	defer s.compacting.Unlock()
	// A compaction drops a deletion, and what it deletes, only below the
	// version Badger may discard at, which checkpoints move up behind the
	// writes: wait until it covers every write acknowledged so far, the
	// caller's deletions included (applied first: a checkpoint moves it
	// up to what Badger holds).
	for at := s.acked.Load(); s.discarded.Load() < at; {
		s.hurryApply()
		select {
		case <-time.After(checkpointInterval / 4):
		case <-ctx.Done():
			return fmt.Errorf("store: compact: %w", ctx.Err())
		case <-s.stop:
			return ErrClosed
		}
	}
	if err := s.flush(ctx); err != nil {
		if errors.Is(err, ErrClosed) {
			return err
		}
		return fmt.Errorf("store: compact: %w", err)
	}
	var tables int64
	for _, t := range s.db.Tables() {
		tables += int64(t.OnDiskSize)
	}
	if sp := s.guard.check(); tables <= maxFlatten && sp.Room()-sp.Reserve > tables && ctx.Err() == nil {
		if err := s.db.Flatten(1); err != nil {
			return fmt.Errorf("store: compact: %w", err)
		}
	}
	if err := s.collectValueLog(ctx); err != nil {
		return fmt.Errorf("store: compact: %w", err)
	}
	// Badger's tables hold everything now: the journal can go to one
	// small segment, as when idle.
	s.settleIdle()
	if err := s.retainLogs(ctx); err != nil {
		return fmt.Errorf("store: compact: %w", err)
	}
	return nil
}

// applyGroups applies consecutive groups in one transaction at the newest
// one's version, where a key written in several keeps its last write; late
// records that, so that the journal keeps the older groups until Badger's
// tables hold the version they were applied at. Their lazy writes are kept
// back, and the ones waiting are handed over when due.
func (s *Store) applyGroups(groups []*group) error {
	// The groups' writes for Badger and the ops of its transaction are
	// kept in the apply stage's slices, which Badger does not keep (it
	// keeps the keys and values), nor anything else past the apply.
	buf, ops := s.split.rest[:0], s.applyOps[:0]
	defer func() { s.split.rest, s.applyOps = reusable(buf), reusable(ops) }()
	if s.logs != nil && !s.legacy {
		var err error
		if buf, err = s.appendLogs(groups, buf); err != nil {
			return err
		}
	}
	last := groups[len(groups)-1]
	now := time.Now()
	lazy, settle := 0, false
	for _, g := range groups {
		lazy += g.lazy
		settle = settle || g.settle
	}
	if len(groups) == 1 && lazy == 0 && !settle && !s.lazy.due(now) {
		return s.apply(last.ts, last.ops)
	}
	n := 0
	for _, g := range groups {
		n += len(g.ops)
	}
	ops = slices.Grow(ops, n-lazy)
	for _, g := range groups {
		if g.lazy == 0 {
			ops = append(ops, g.ops...)
			continue
		}
		for _, o := range g.ops {
			if o.lazy {
				s.lazy.keep(g.ts, o, now)
			} else {
				ops = append(ops, o)
			}
		}
	}
	if settle || s.lazy.due(now) {
		ops = s.lazy.take(ops, last.ts, &s.late)
	}
	s.late.add(groups[0].ts, last.ts)
	if len(ops) == 0 {
		return nil
	}
	return s.apply(last.ts, ops)
}

func (s *Store) failedErr() error {
	if p := s.failed.Load(); p != nil {
		return *p
	}
	return nil
}

func (s *Store) countCommit(g *group) {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	if s.journal != nil && s.opts.Sync == SyncAlways {
		s.stats.Syncs++ // the group's own write was synchronous
		s.stats.SyncTime += g.wrote
		s.stats.SyncLatency[syncBucket(g.wrote)]++
	}
	writes := max(len(g.reqs), 1) // an inline commit's group has one writer, unnamed
	s.stats.Commits++
	s.stats.Writes += uint64(writes)
	s.stats.LastBatch = writes
	s.stats.LastCommit = time.Since(g.start)
}

// replay counts what a replay applied and skipped, and spans the writes
// Badger held at a later version than their record's.
type replay struct {
	applied, skipped int
	from, at         uint64
}

// replayApply applies the writes of the journal record at version ts that
// Badger does not hold yet. After a crash that spared the page cache
// (a killed process), Badger replays its own logs and holds nearly all of
// them: writing them again would only make tables of duplicates (tens of
// MiB per restart), which compactions must then remove. A write is held
// when Badger has its key, set or deleted, at version ts or later; a
// delete of a key Badger never had changes nothing either. Writes Badger
// holds at a later version (lazy writes, groups applied together) are
// recorded as late, so that the journal keeps them until Badger's tables
// hold that version.
func (s *Store) replayApply(r *replay, ts uint64, ops []op) error {
	if s.logs != nil && !s.legacy {
		rest := s.splitLogs(ops, s.split.rest[:0])
		defer func() { s.split.rest = reusable(rest) }()
		var err error
		if sp := &s.split; ts > s.logsFrom && (len(sp.entries) > 0 || len(sp.drops) > 0) {
			err = s.logs.Append(context.Background(), ts, sp.entries, sp.drops)
		}
		s.split.done()
		if err != nil {
			return fmt.Errorf("store: journal replay: logs: %w", err)
		}
		if ops = rest; len(ops) == 0 {
			return nil
		}
	}
	txn := s.db.NewTransactionAt(math.MaxUint64, false)
	defer txn.Discard()
	keep := ops[:0]
	for _, o := range ops {
		v, found, err := latestVersion(txn, o.key)
		switch {
		case err != nil:
			return fmt.Errorf("store: journal replay: read: %w", err)
		case found && v > ts:
			if r.from == 0 {
				r.from = ts
			}
			r.at = max(r.at, v)
		case found && v == ts && s.valueLost(txn, o):
			keep = append(keep, o)
			continue
		case found && v == ts, !found && o.del:
		default:
			keep = append(keep, o)
			continue
		}
		r.skipped++
	}
	r.applied += len(keep)
	if len(keep) == 0 {
		return nil
	}
	return s.apply(ts, keep)
}

// valueLost reports whether Badger, holding o's key at o's version, lost
// its value: a value of valueThreshold bytes or more lives in the value
// log, which only a checkpoint syncs, while the table that points into it
// may have been synced, and named, before. A power cut in between leaves
// the pointer and not the value, which reads back empty; the journal's
// copy is then written again, at the same version, where reads find it
// first.
func (s *Store) valueLost(txn *badger.Txn, o op) bool {
	if o.del || int64(len(o.val)) < s.valueThreshold {
		return false
	}
	item, err := txn.Get(o.key)
	if err != nil {
		return true
	}
	same := false
	err = item.Value(func(v []byte) error { same = bytes.Equal(v, o.val); return nil })
	return err != nil || !same
}

// latestVersion returns the newest version Badger has of key, a deletion
// included, and whether it has one.
func latestVersion(txn *badger.Txn, key []byte) (uint64, bool, error) {
	item, err := txn.Get(key)
	if err == nil {
		return item.Version(), true, nil
	}
	if !errors.Is(err, badger.ErrKeyNotFound) {
		return 0, false, err
	}
	// Deleted, or never written: only an iterator over every version
	// sees a deletion.
	it := txn.NewKeyIterator(key, badger.IteratorOptions{AllVersions: true})
	defer it.Close()
	it.Rewind()
	if !it.Valid() {
		return 0, false, nil
	}
	return it.Item().Version(), true, nil
}

// apply writes ops to Badger at version ts. Readers see none of it until
// applied moves to ts.
func (s *Store) apply(ts uint64, ops []op) error {
	if len(ops) == 0 {
		return nil
	}
	var n int64
	for _, o := range ops {
		n += int64(len(o.key) + len(o.val))
	}
	s.unflushed.Add(n)
	err := s.applyTxn(ts, ops)
	if errors.Is(err, badger.ErrTxnTooBig) {
		err = s.applySplit(ts, ops)
	}
	return err
}

// applyTxn writes ops in one transaction, where a key written twice keeps
// its last write.
func (s *Store) applyTxn(ts uint64, ops []op) error {
	txn := s.db.NewTransactionAt(ts, true)
	defer txn.Discard()
	for _, o := range ops {
		if err := s.setOp(txn, ts, o); err != nil {
			return fmt.Errorf("store: write: %w", err)
		}
	}
	if s.opts.committing != nil {
		s.opts.committing(ts)
	}
	if err := txn.CommitAt(ts, nil); err != nil {
		return fmt.Errorf("store: commit: %w", err)
	}
	return nil
}

// applySplit writes ops too many for one transaction in several, all at
// version ts. Two writes of one key at one version in different
// transactions would leave Badger two values for it, so only each key's
// last write is kept first.
func (s *Store) applySplit(ts uint64, ops []op) error {
	last := make(map[string]int, len(ops))
	for i, o := range ops {
		last[string(o.key)] = i
	}
	txn := s.db.NewTransactionAt(ts, true)
	defer func() { txn.Discard() }()
	for i, o := range ops {
		if last[string(o.key)] != i {
			continue
		}
		err := s.setOp(txn, ts, o)
		if errors.Is(err, badger.ErrTxnTooBig) {
			if err = txn.CommitAt(ts, nil); err != nil {
				return fmt.Errorf("store: commit: %w", err)
			}
			txn = s.db.NewTransactionAt(ts, true)
			err = s.setOp(txn, ts, o)
		}
		if err != nil {
			return fmt.Errorf("store: write: %w", err)
		}
	}
	if err := txn.CommitAt(ts, nil); err != nil {
		return fmt.Errorf("store: commit: %w", err)
	}
	return nil
}

func (s *Store) setOp(txn *badger.Txn, ts uint64, o op) error {
	if o.del {
		return txn.Delete(o.key)
	}
	if int64(len(o.val)) >= s.valueThreshold {
		s.vlog.wrote(ts)
	}
	return txn.Set(o.key, o.val)
}

func (s *Store) countSync(took time.Duration) {
	s.statsMu.Lock()
	s.stats.Syncs++
	s.stats.SyncTime += took
	s.stats.SyncLatency[syncBucket(took)]++
	s.statsMu.Unlock()
}

// checkpointLoop runs checkpoints until the store closes. It runs beside
// the commit stages, so Badger's sync in it never delays a commit.
func (s *Store) checkpointLoop() {
	var guarded sync.WaitGroup
	if s.guard != nil {
		guarded.Go(func() { s.guard.run(s.stop) })
	}
	defer func() {
		guarded.Wait()
		close(s.checkpointed)
	}()
	// A start after a crash keeps every segment the journal held and
	// begins one more, and a gateway that crashes again before Badger
	// writes a table out (its memory table, refilled by the replay, is
	// lost each time) piles them up, one per start, until its disk is
	// full. Past a few, the start settles the journal as an idle one does.
	if s.journal != nil && s.journal.pending() > maxRecycled {
		s.settleIdle()
	}
	ticker := time.NewTicker(checkpointInterval)
	defer ticker.Stop()
	discard := s.applied.Load()
	idle := false
	changed := s.SpaceChanged()
	pages := s.tablePages()
	var paging <-chan time.Time
	var pg pager
	var pageTicker *time.Ticker
	if pages != "" {
		pageTicker = time.NewTicker(cmp.Or(s.opts.pageOutEvery, pageOutInterval))
		defer pageTicker.Stop()
		paging = pageTicker.C
	}
	for {
		select {
		case <-s.crowded:
			discard = s.checkpoint(discard)
			continue
		case <-changed:
			changed = s.SpaceChanged()
			if s.Space().State != SpaceOK {
				s.shedJournal()
			}
			continue
		case now := <-paging:
			s.released.Add(uint64(releaseBuilders(s.builders)))
			if n, err := residentFiles(); err == nil && !pg.due(n, now) {
				continue
			}
			if err := pageOut(pages); err != nil {
				s.log.Warn("the pages of Badger's tables stay mapped", "err", err)
				paging = nil
			}
			// Unreadable, the figure stays zero and every look passes.
			n, _ := residentFiles()
			pg.passed(n, now)
		case <-ticker.C:
			discard = s.checkpoint(discard)
			s.retainLogs(context.Background())
			s.released.Add(uint64(releaseBuilders(s.builders)))
			quiet := s.journal != nil && time.Since(time.Unix(0, s.lastWrite.Load())) >= cmp.Or(s.opts.idleAfter, idleAfter)
			was := idle
			if !quiet {
				idle = false
			} else if !idle {
				if idle = s.settleIdle(); idle {
					s.flushIdle()
				}
			}
			if pageTicker != nil && idle != was && s.opts.pageOutEvery == 0 {
				// Idle, nothing writes tables: reads fault back few pages,
				// and the pass due every pageOutRetry hands them back.
				every := pageOutInterval
				if idle {
					every = pageOutRetry
				}
				pageTicker.Reset(every)
			}
		case <-s.stop:
			return
		}
	}
}

// tablePages returns the folder whose table pages checkpointLoop hands
// back to the kernel, or "" for none. Badger writes and reads its tables
// through memory maps and never lets go of their pages: every table
// written or compacted stays in the process's RSS (and its cgroup's
// usage) until the kernel runs short, so the RSS grows with the data
// stored. Under a memory limit the store hands them back every
// pageOutInterval: tables are synced when written, and reads fault back
// what they use (indexes, hot blocks).
func (s *Store) tablePages() string {
	if s.opts.MemoryLimit <= 0 || s.opts.InMemory {
		return ""
	}
	// /proc/self/maps names files by their absolute, resolved paths.
	dir, err := filepath.Abs(s.opts.Dir)
	if err == nil {
		dir, err = filepath.EvalSymlinks(dir)
	}
	if err != nil {
		s.log.Warn("the pages of Badger's tables stay mapped", "err", err)
		return ""
	}
	return dir
}

// checkpoint lets Badger discard versions older than the previous
// checkpoint's. Read transactions are short (a scan is bounded by its
// limit); one older than checkpointInterval would at worst see an entry
// deleted or replaced since it began as already gone. It then releases the
// journal segments whose every write Badger's tables hold (see
// releasable), and returns the version to discard below next time.
func (s *Store) checkpoint(discard uint64) uint64 {
	s.db.SetDiscardTs(discard)
	s.discarded.Store(discard)
	if s.journal != nil && s.journal.pending() > 1 {
		var durable uint64
		for _, t := range s.db.Tables() {
			durable = max(durable, t.MaxVersion)
		}
		// Tables are synced when written, but values too large for the
		// tree live in the value log, which only a sync makes durable. It
		// also msyncs the whole memory table, stalling Badger's writes for
		// tens of milliseconds, so it runs only when such a value may not
		// be on disk. A version in a table was applied, and its value
		// written, before durable was read, and every version below it
		// before applied is read here (groups are applied in order).
		if s.vlog.dirty() {
			if err := s.syncBadger(s.applied.Load()); err != nil {
				s.log.Warn("checkpoint: sync failed; journal kept", "err", err)
				return s.applied.Load()
			}
		}
		// Badger names a table it writes out in its MANIFEST without
		// syncing the folder: until the folder is synced, a power cut
		// takes the table's name (see recoverBadger), and so its writes,
		// which only the journal then holds.
		if err := syncDir(s.opts.Dir); err != nil {
			s.log.Warn("checkpoint: sync failed; journal kept", "err", err)
			return s.applied.Load()
		}
		if n, err := s.journal.release(s.releasable(durable)); err != nil {
			s.log.Warn("checkpoint: journal segments kept", "err", err)
		} else if n > 0 && s.opts.released != nil {
			s.opts.released()
		}
		if s.size.syncRelease && s.journal.pending() > 1 {
			s.syncRelease()
		}
	}
	return s.applied.Load()
}

// settleIdle is the checkpoint of a journal that has had no write for
// idleAfter: the commit loop moves it to a small segment, and Badger syncs
// its own log, which then holds every write Badger's tables do not, so that
// the journal can let go of everything but that small segment, and of the
// segments it kept for reuse. Under writes the journal instead waits for
// Badger's tables (see checkpoint): syncing Badger's log costs an msync of
// a whole memory table. It reports whether it could; if not, the next
// checkpoint tries again.
func (s *Store) settleIdle() bool {
	// Lazy writes waiting would hold the journal back: a settling write
	// hands them over, and does not count as a write that ends idleness.
	settle := &Batch{ops: []op{{key: settleKey}}, settle: true}
	if err := s.Write(context.Background(), settle); err != nil {
		return false
	}
	done := make(chan struct{})
	select {
	case s.idle <- done:
		<-done
	case <-s.stop:
		return false
	}
	// The settling write was acknowledged, not yet applied, and it hands
	// the lazy writes still waiting to Badger at its own version: until
	// it is applied, their segments cannot go.
	s.awaitApplied()
	if !s.syncRelease() {
		return false
	}
	s.journal.dropRecycled()
	return true
}

// syncRelease has Badger sync its own log and releases the journal's
// segments whose every write Badger's tables or that log hold. It reports
// whether it could: not while a memory table waits to be written out,
// since only the one being filled has its log synced.
func (s *Store) syncRelease() bool {
	at := s.applied.Load()
	mems, err := s.memFiles()
	if err != nil || len(mems) != 1 {
		return false
	}
	// The memory table's log is synced, and the folder, which names it
	// and the tables written out before it.
	if err := s.syncBadger(at); err != nil {
		s.log.Warn("checkpoint: sync failed; journal kept", "err", err)
		return false
	}
	if err := syncDir(s.opts.Dir); err != nil {
		s.log.Warn("checkpoint: sync failed; journal kept", "err", err)
		return false
	}
	if after, err := s.memFiles(); err != nil || !slices.Equal(after, mems) {
		return false // Badger moved to a new memory table meanwhile
	}
	// Every version up to at is in Badger's tables or in the memory
	// table whose log was just synced.
	n, err := s.journal.release(s.releasable(at + 1))
	if err != nil {
		s.log.Warn("checkpoint: journal segments kept", "err", err)
		return false
	}
	if n > 0 && s.opts.released != nil {
		s.opts.released()
	}
	return true
}

// shedJournal, short of room, has Badger write its memory tables out and
// the journal keep one small segment: what the journal holds is what a
// start after a crash must replay, and it should find room for that.
func (s *Store) shedJournal() {
	if err := s.roomToFlush(); err != nil {
		s.log.Warn("storage: no room to write Badger's memory tables out; the journal is kept", "err", err)
		return
	}
	if err := s.flush(context.Background()); err != nil {
		if !errors.Is(err, ErrClosed) {
			s.log.Warn("storage: cannot write Badger's memory tables out", "err", err)
		}
		return
	}
	s.settleIdle()
}

// memFiles lists Badger's memory table logs: one for the table being
// filled, and one more for each waiting to be written out.
func (s *Store) memFiles() ([]string, error) {
	entries, err := os.ReadDir(s.opts.Dir)
	if err != nil {
		return nil, err
	}
	var mems []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".mem") {
			mems = append(mems, e.Name())
		}
	}
	return mems, nil
}

// journalIdle moves the journal, when its segment holds records, to a
// fresh segment of the smallest size, so that an idle journal holds one
// small segment once the others are released. It runs in the commit loop,
// under commitMu.
func (s *Store) journalIdle() {
	if s.failedErr() != nil {
		return
	}
	if err := s.journal.shrink(); err != nil {
		if isNoSpace(err) {
			s.guard.full(err)
			return
		}
		s.log.Warn("journal: cannot move to a small segment", "err", err)
	}
}

// fail poisons the store: after a failed commit or fsync, what reached the
// disk is unknown, so accepting more writes could acknowledge facts that a
// restart contradicts.
func (s *Store) fail(err error) error {
	wrapped := fmt.Errorf("%w: %w", ErrFailed, err)
	if s.failed.CompareAndSwap(nil, &wrapped) {
		s.log.Error("store failed; refusing further writes", "err", err)
	}
	return wrapped
}

// Close drains queued writes, syncs and closes the database. Closing Badger
// writes its memory tables out as synced tables, after which the journal is
// deleted; if that fails, the journal is kept and replayed at the next Open.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.gate.Lock()
		s.closed = true
		s.gate.Unlock()
		close(s.stop)
		<-s.done
		<-s.checkpointed
		s.compacting.Lock()
		defer s.compacting.Unlock()
		clean := s.failed.Load() == nil
		// The segment log is synced and sealed before the journal,
		// which holds what it was given, can go.
		lerr := s.closeLogs()
		if lerr != nil {
			s.log.Error("store: closing the segment log failed; the journal is kept and replayed at the next start", "err", lerr)
			clean = false
		}
		defer func() { err = errors.Join(err, lerr) }()
		if err = s.roomToFlush(); err != nil {
			// Closing Badger writes its memory tables out through memory
			// maps, which fault on a full disk: it is left as a crash
			// would leave it, and the journal, kept, is replayed at the
			// next start.
			s.log.Error("store: no room to write Badger's memory tables out; closing as after a crash", "err", err)
			if jerr := s.journal.close(false); jerr != nil {
				err = errors.Join(err, jerr)
			}
			return
		}
		if s.journal != nil && clean {
			if err = s.syncBadger(s.applied.Load()); err != nil {
				clean = false
			}
		}
		if cerr := s.closeDB(); cerr != nil {
			clean = false
			if err == nil {
				err = cerr
			}
		}
		if s.journal != nil {
			if jerr := s.journal.close(clean); jerr != nil && err == nil {
				err = jerr
			}
		}
	})
	return err
}

// ErrCloseTimeout is returned by Close when Badger did not close within
// Options.CloseTimeout.
var ErrCloseTimeout = errors.New("store: Badger did not close in time")

// closeDB closes Badger within the close timeout. Badger retries a memory
// table it cannot write out (its folder removed, a read-only remount)
// without end, and its Close waits for it: a gateway told to stop must
// stop, and what it acknowledged is in the journal.
func (s *Store) closeDB() error {
	wait := s.opts.CloseTimeout
	if wait <= 0 {
		wait = 30 * time.Second
	}
	done := make(chan error, 1)
	go func() { done <- s.db.Close() }()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		s.log.Error("store: Badger did not close; closing as after a crash (the journal is kept and replayed at the next start)", "waited", wait)
		return fmt.Errorf("%w: waited %v", ErrCloseTimeout, wait)
	}
}

// roomToFlush returns nil when the file system has room for Badger to
// write its memory tables out, as it does when it closes or is asked to
// flush: the reserve keeps that room, unless something else took it.
// Without it Badger's table, written through a memory map, fails when it is
// synced, and Badger leaves that table open and mapped (its file keeping
// the blocks it got) for as long as the process lives; some file systems
// fault the write instead.
func (s *Store) roomToFlush() error {
	if s.guard == nil {
		return nil
	}
	du, err := s.guard.read(s.opts.Dir)
	if err != nil {
		return nil // nothing known: close as usual
	}
	if need := int64(s.size.numMemtables)*s.size.memTable + mib; du.free < need {
		sp := s.guard.snapshot()
		sp.Free, sp.State = du.free, SpaceFull
		return &SpaceError{Space: sp}
	}
	return nil
}

// RunGC gives back the space of Badger's value log files that are half
// garbage or more, keeping what it moves durable (see collectValueLog);
// call it periodically. It returns ErrClosed once the store is closed, and
// a *SpaceError when the disk has no room for the writes it takes.
func (s *Store) RunGC(ctx context.Context) error {
	if s.opts.InMemory {
		return nil
	}
	s.compacting.Lock()
	defer s.compacting.Unlock()
	select {
	case <-s.stop:
		return ErrClosed
	default:
	}
	return s.collectValueLog(ctx)
}

// collectValueLog has Badger collect its value log files that are half
// garbage or more. Badger moves a file's live values to the file it
// writes, and their pointers to its memory table, without syncing either,
// then deletes the file: a power cut after the deletion reached the disk
// would leave the tables pointing into a file that is gone. An open
// iterator holds the deletion back (Badger waits for the last one to
// close) until the memory tables are written out and the value log
// synced. Compacting must be held.
func (s *Store) collectValueLog(ctx context.Context) error {
	if err := s.roomToFlush(); err != nil {
		return err // collecting writes, and so does what makes it durable
	}
	txn := s.db.NewTransactionAt(s.applied.Load(), false)
	defer txn.Discard()
	pin := txn.NewIterator(badger.IteratorOptions{})
	defer pin.Close()
	moved := false
	for ctx.Err() == nil && s.db.RunValueLogGC(0.5) == nil {
		moved = true
	}
	if !moved {
		return nil
	}
	if err := s.flush(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("store: value log: %w", err)
	}
	if err := s.syncBadger(s.applied.Load()); err != nil {
		return fmt.Errorf("store: value log: %w", err)
	}
	// The folder names the tables just written.
	return syncDir(s.opts.Dir)
}

// Batch is a set of writes applied atomically by Write. The zero value is an
// empty batch.
type Batch struct {
	ops  []op
	size int // bytes of keys and values
	lazy int // writes made with the Lazy methods
	dels int // deletions
	// settle asks the apply stage to hand the waiting lazy writes over.
	settle bool
	// follow is the Replica's position of the last group a follower's
	// batch applies (see Follow).
	follow uint64
	// scratch is where the batch's records are encoded before each is
	// copied out, next to its key, in one allocation of its own: kept from
	// one record to the next, it is never handed on.
	scratch encodeBuf
	// keys is room for the keys of the batch's writes to logs that are not
	// lazy: nothing keeps those keys past the batch's apply, so they can
	// share allocations. A lazy write's key may wait in memory for a
	// second (see lazy.go), and has one of its own, not to hold others.
	keys []byte
}

// batchKeys is how many keys of the first one's size a batch's first
// room for keys holds.
const batchKeys = 4

// logKey is logKey in b's room for keys, which it grows as needed. The
// key's capacity ends where it does: appending to it cannot reach the
// next.
func (b *Batch) logKey(stream string, seq uint64) []byte {
	n := logKeyLen(stream)
	if cap(b.keys)-len(b.keys) < n {
		// The keys already handed out stay where they are.
		b.keys = make([]byte, 0, max(batchKeys*n, 2*cap(b.keys)))
	}
	from := len(b.keys)
	b.keys = appendLogKey(b.keys, stream, seq)
	return b.keys[from:len(b.keys):len(b.keys)]
}

// minBatchOps is the room a batch's first write makes for its writes: a
// transaction's batch holds several, and growing one at a time from one
// made a batch's most allocations.
const minBatchOps = 8

type op struct {
	key []byte
	val []byte
	del bool
	// lazy marks a write Badger may get late (see lazy.go), and fresh a
	// new log entry among those.
	lazy  bool
	fresh bool
}

// Merge appends o's writes to b, after b's own.
func (b *Batch) Merge(o *Batch) {
	b.ops = append(b.ops, o.ops...)
	b.size += o.size
	b.lazy += o.lazy
	b.dels += o.dels
	b.settle = b.settle || o.settle
}

// Len returns the number of writes in the batch.
func (b *Batch) Len() int { return len(b.ops) }

// Append adds entry seq of the log named stream.
func (b *Batch) Append(stream string, seq uint64, data []byte) {
	b.add(op{key: b.logKey(stream, seq), val: data})
}

func (b *Batch) add(o op) {
	if cap(b.ops) == 0 {
		b.ops = make([]op, 0, minBatchOps)
	}
	b.ops = append(b.ops, o)
	b.size += len(o.key) + len(o.val)
	if o.lazy {
		b.lazy++
	}
	if o.del {
		b.dels++
	}
}

// shrinks reports whether b only deletes: short of room such writes still
// go on, since they free space.
func (b *Batch) shrinks() bool { return b.dels == len(b.ops) }

// settling reports whether b only hands the lazy writes over (see settle).
func (b *Batch) settling() bool {
	return b.settle && len(b.ops) == 1 && bytes.Equal(b.ops[0].key, settleKey)
}

// DeleteEntry removes entry seq of the log named stream. Logs are deleted
// from their start: in the segment log (the logs Options.SegmentLogs
// names, see segments.go) deleting entry seq deletes the entries below it
// too, those written by earlier batches.
func (b *Batch) DeleteEntry(stream string, seq uint64) {
	b.add(op{key: b.logKey(stream, seq), del: true})
}

// Put stores v, msgpack-encoded, as record id of kind.
func (b *Batch) Put(kind, id string, v any) error {
	key, data, err := b.record(kind, id, v)
	if err != nil {
		return err
	}
	b.add(op{key: key, val: data})
	return nil
}

// record returns the key of record id of kind and v msgpack-encoded, in
// one allocation: the store holds them, and lets them go, together.
func (b *Batch) record(kind, id string, v any) (key, val []byte, err error) {
	if cap(b.scratch) == 0 {
		b.scratch = make(encodeBuf, 0, batchRecordBytes)
	}
	b.scratch = b.scratch[:0]
	if err := encodeTo(&b.scratch, v); err != nil {
		return nil, nil, fmt.Errorf("store: encode %s/%s: %w", kind, id, err)
	}
	n := recordKeyLen(kind, id)
	kv := appendRecordKey(make([]byte, 0, n+len(b.scratch)), kind, id)
	kv = append(kv, b.scratch...)
	return kv[:n:n], kv[n:], nil
}

// encodeTo appends v, msgpack-encoded, to w. It encodes as
// msgpack.Marshal does, with the package's pooled encoders, into w
// rather than into a buffer of its own.
func encodeTo(w *encodeBuf, v any) error {
	enc := msgpack.GetEncoder()
	enc.Reset(w)
	err := enc.Encode(v)
	msgpack.PutEncoder(enc)
	return err
}

// encodeBuf is a msgpack encoder's writer that appends what it is given.
type encodeBuf []byte

// Write appends p.
func (w *encodeBuf) Write(p []byte) (int, error) {
	*w = append(*w, p...)
	return len(p), nil
}

// WriteByte appends c; with it the encoder needs no wrapper of w.
func (w *encodeBuf) WriteByte(c byte) error {
	*w = append(*w, c)
	return nil
}

// Delete removes record id of kind.
func (b *Batch) Delete(kind, id string) {
	b.add(op{key: recordKey(kind, id), del: true})
}

// Key layout. Logs: "l/" stream 0x00 seq(8 bytes, big endian), so one
// stream's entries are contiguous and ordered. Records: "r/" kind 0x00 id.
// Stream names and kinds must not contain 0x00.
func logPrefix(stream string) []byte {
	return appendLogPrefix(make([]byte, 0, logKeyLen(stream)), stream)
}

func appendLogPrefix(k []byte, stream string) []byte {
	k = append(k, "l/"...)
	k = append(k, stream...)
	return append(k, 0)
}

func logKey(stream string, seq uint64) []byte {
	return appendLogKey(make([]byte, 0, logKeyLen(stream)), stream, seq)
}

func logKeyLen(stream string) int { return 3 + len(stream) + 8 }

func appendLogKey(k []byte, stream string, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(appendLogPrefix(k, stream), seq)
}

func recordPrefix(kind string) []byte {
	k := make([]byte, 0, 3+len(kind)+36)
	return appendRecordPrefix(k, kind)
}

func appendRecordPrefix(k []byte, kind string) []byte {
	k = append(k, "r/"...)
	k = append(k, kind...)
	return append(k, 0)
}

func recordKey(kind, id string) []byte {
	return appendRecordKey(make([]byte, 0, recordKeyLen(kind, id)), kind, id)
}

func recordKeyLen(kind, id string) int { return 3 + len(kind) + len(id) }

func appendRecordKey(k []byte, kind, id string) []byte {
	return append(appendRecordPrefix(k, kind), id...)
}

// Get decodes record id of kind into v.
func (s *Store) Get(kind, id string, v any) error {
	key := recordKey(kind, id)
	// Writes acknowledged before the read may still be on their way to
	// the lazy writes; once applied, they are there or in Badger.
	s.awaitApplied()
	var err error
	if o, ok := s.lazy.get(key); ok {
		err = badger.ErrKeyNotFound
		if !o.del {
			err = msgpack.Unmarshal(o.val, v)
		}
	} else {
		err = s.view(func(txn *badger.Txn) error {
			item, err := txn.Get(key)
			if err != nil {
				return err
			}
			return item.Value(func(data []byte) error { return msgpack.Unmarshal(data, v) })
		})
	}
	if errors.Is(err, badger.ErrKeyNotFound) {
		return fmt.Errorf("%w: %s/%s", ErrNotFound, kind, id)
	}
	if err != nil {
		return fmt.Errorf("store: get %s/%s: %w", kind, id, err)
	}
	return nil
}

// Records calls fn for every record of kind in id order, with a decode
// function valid only during the call. fn returns false to stop.
func (s *Store) Records(kind string, fn func(id string, decode func(v any) error) bool) error {
	return s.RecordsWithPrefix(kind, "", fn)
}

// RecordsWithPrefix is Records limited to ids starting with idPrefix.
func (s *Store) RecordsWithPrefix(kind, idPrefix string, fn func(id string, decode func(v any) error) bool) error {
	return s.records(kind, idPrefix, idPrefix, fn)
}

// RecordsAfter is Records from the first id greater than after: a walk
// that goes on where an earlier one stopped seeks there, without reading
// the records before it.
func (s *Store) RecordsAfter(kind, after string, fn func(id string, decode func(v any) error) bool) error {
	return s.records(kind, "", after, fn)
}

// records calls fn for the records of kind whose ids start with idPrefix,
// from from on, leaving out an id equal to from unless from is idPrefix.
// A record's value is read only when fn decodes it, so a walk that skips
// most records by their ids reads none of theirs (values are in Badger's
// tables but for the rare large ones, so a read is a slice of the table).
//
// The lazy writes Badger may not show yet are merged in, in key order: a
// walk sees every write acknowledged before it, as Get does.
func (s *Store) records(kind, idPrefix, from string, fn func(id string, decode func(v any) error) bool) error {
	base := recordPrefix(kind)
	prefix := append(append([]byte(nil), base...), idPrefix...)
	start := append(append([]byte(nil), base...), from...)
	s.awaitApplied()
	waiting := s.lazy.between(prefix, start)
	return s.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		it.Seek(start)
		for {
			var key []byte
			var value func(fn func([]byte) error) error
			next := false // Badger's item, valid until the iterator moves
			switch {
			case len(waiting) > 0 && (!it.ValidForPrefix(prefix) || bytes.Compare(waiting[0].key, it.Item().Key()) <= 0):
				o := waiting[0]
				waiting = waiting[1:]
				if it.ValidForPrefix(prefix) && bytes.Equal(o.key, it.Item().Key()) {
					it.Next() // Badger's is older
				}
				if o.del {
					continue
				}
				key, value = o.key, func(fn func([]byte) error) error { return fn(o.val) }
			case it.ValidForPrefix(prefix):
				item := it.Item()
				key, value, next = item.Key(), item.Value, true
			default:
				return nil
			}
			if from != idPrefix && bytes.Equal(key, start) {
				if next {
					it.Next()
				}
				continue
			}
			id := string(key[len(base):])
			var verr error
			decode := func(v any) error {
				var derr error
				if err := value(func(data []byte) error { derr = msgpack.Unmarshal(data, v); return nil }); err != nil {
					verr = err
					return err
				}
				return derr
			}
			cont := fn(id, decode)
			if verr != nil {
				return fmt.Errorf("store: read %s/%s: %w", kind, id, verr)
			}
			if !cont {
				return nil
			}
			if next {
				it.Next()
			}
		}
	})
}

// EachRecord calls fn with every record of kind whose id starts with
// idPrefix, in id order, decoded into a T, until fn returns false. A record
// that does not decode ends the walk with an error naming it, and a walk
// cut short by ctx returns ctx.Err(), so that neither passes for a walk
// that found nothing.
func EachRecord[T any](ctx context.Context, s *Store, kind, idPrefix string, fn func(id string, v *T) bool) error {
	var stop error
	err := s.RecordsWithPrefix(kind, idPrefix, func(id string, decode func(any) error) bool {
		if stop = ctx.Err(); stop != nil {
			return false
		}
		var v T
		if err := decode(&v); err != nil {
			stop = fmt.Errorf("store: decode %s/%s: %w", kind, id, err)
			return false
		}
		return fn(id, &v)
	})
	if err != nil {
		return err
	}
	return stop
}

// Entry is one entry of a log.
type Entry struct {
	// Seq is the entry's sequence in its stream.
	Seq uint64
	// Data is the entry's bytes, owned by the caller.
	Data []byte
}

// Read returns up to limit entries of stream with sequence greater than
// after, in order. limit <= 0 means no limit.
func (s *Store) Read(stream string, after uint64, limit int) ([]Entry, error) {
	var out []Entry
	err := s.ScanAtMost(stream, after, limit, func(seq uint64, data []byte) bool {
		out = append(out, Entry{Seq: seq, Data: append([]byte(nil), data...)})
		return limit <= 0 || len(out) < limit
	})
	return out, err
}

// Scan calls fn for each entry of stream after sequence after, in order; data
// is valid only during the call. fn returns false to stop. Nothing comes
// after the largest sequence: a cursor of 2^64-1 reads nothing (after+1
// would wrap to 0 and read everything).
func (s *Store) Scan(stream string, after uint64, fn func(seq uint64, data []byte) bool) error {
	return s.ScanAtMost(stream, after, 0, fn)
}

// ScanAtMost is Scan of at most limit entries (limit <= 0: no bound). A reader
// that knows how many it takes says so: the segment log is read a page at
// a time, and a reader that stopped inside a page would otherwise have
// read the rest of it for nothing, then again on its next scan.
func (s *Store) ScanAtMost(stream string, after uint64, limit int, fn func(seq uint64, data []byte) bool) error {
	if after == math.MaxUint64 {
		return nil
	}
	if s.inSegments(stream) {
		return s.scanSegments(stream, after, limit, fn)
	}
	if err := s.settle(logSpace(stream)); err != nil {
		return err
	}
	prefix := logPrefix(stream)
	prefetch := 256
	if limit > 0 {
		prefetch = min(prefetch, limit)
	}
	return s.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: prefetch})
		defer it.Close()
		n := 0
		for it.Seek(logKey(stream, after+1)); it.ValidForPrefix(prefix); it.Next() {
			item := it.Item()
			seq := binary.BigEndian.Uint64(item.Key()[len(prefix):])
			cont := true
			if err := item.Value(func(data []byte) error { cont = fn(seq, data); return nil }); err != nil {
				return fmt.Errorf("store: read %s/%d: %w", stream, seq, err)
			}
			if n++; !cont || n == limit {
				return nil
			}
		}
		return nil
	})
}

// Entry returns entry seq of stream, or ErrNotFound.
func (s *Store) Entry(stream string, seq uint64) ([]byte, error) {
	if s.inSegments(stream) {
		return s.segmentEntry(stream, seq)
	}
	if err := s.settle(logSpace(stream)); err != nil {
		return nil, err
	}
	var out []byte
	err := s.view(func(txn *badger.Txn) error {
		item, err := txn.Get(logKey(stream, seq))
		if err != nil {
			return err
		}
		out, err = item.ValueCopy(nil)
		return err
	})
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, fmt.Errorf("%w: %s/%d", ErrNotFound, stream, seq)
	}
	return out, err
}

// Last returns the highest sequence in stream, or 0 when it is empty.
func (s *Store) Last(stream string) (uint64, error) {
	if s.inSegments(stream) {
		s.awaitApplied()
		_, last, err := s.logs.Bounds(context.Background(), stream)
		return last, err
	}
	if err := s.settle(logSpace(stream)); err != nil {
		return 0, err
	}
	prefix := logPrefix(stream)
	var last uint64
	err := s.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, Reverse: true})
		defer it.Close()
		it.Seek(append(append([]byte(nil), prefix...), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff))
		if it.ValidForPrefix(prefix) {
			last = binary.BigEndian.Uint64(it.Item().Key()[len(prefix):])
		}
		return nil
	})
	return last, err
}

// First returns the lowest sequence still held in stream, or 0 when it is empty.
func (s *Store) First(stream string) (uint64, error) {
	var first uint64
	err := s.Scan(stream, 0, func(seq uint64, _ []byte) bool { first = seq; return false })
	return first, err
}

// badgerLogger hands Badger's log to slog: its information at debug
// level, and its caches' statistics too, which it warns of every minute
// while their hit ratio is low (as a read of every execution by
// retention makes it, on a box whose memory limit keeps the cache small):
// a figure, not a fault anyone could act on. A message is formatted only
// when its level is logged: Badger logs four debug lines per write it
// applies, and formatting them cost more than the rest of the logger.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) log(level slog.Level, f string, a []any) {
	ctx := context.Background()
	if !b.l.Enabled(ctx, level) {
		return
	}
	b.l.Log(ctx, level, fmt.Sprintf(f, a...), "component", "badger")
}

func (b badgerLogger) Errorf(f string, a ...any) { b.log(slog.LevelError, f, a) }
func (b badgerLogger) Warningf(f string, a ...any) {
	level := slog.LevelWarn
	if strings.Contains(f, "might be too small") || strings.HasPrefix(f, "Cache life expectancy") {
		level = slog.LevelDebug
	}
	b.log(level, f, a)
}
func (b badgerLogger) Infof(f string, a ...any)  { b.log(slog.LevelDebug, f, a) }
func (b badgerLogger) Debugf(f string, a ...any) { b.log(slog.LevelDebug, f, a) }

// Encode msgpack-encodes a value for a log entry. It is for plain data
// structs, which always encode; a value that cannot be encoded (a channel, a
// function) is a programming error and panics.
func Encode(v any) []byte {
	// Encoded into room on the heap that fits most entries, and copied out
	// at its size: two allocations, where a growing buffer made three or
	// four, and the entry, which callers keep, holds no spare room.
	room := new(encodeRoom)
	room.buf = room.arr[:0]
	if err := encodeTo(&room.buf, v); err != nil {
		panic(fmt.Sprintf("store: encode %T: %v", v, err))
	}
	return bytes.Clone(room.buf)
}

// encodeRoom is Encode's buffer, with the room it starts with.
type encodeRoom struct {
	buf encodeBuf
	arr [encodeRoomBytes]byte
}

// encodeRoomBytes is the room Encode starts with, and batchRecordBytes a
// batch's room for its records: most log entries, and records, fit.
const (
	encodeRoomBytes  = 512
	batchRecordBytes = 256
)

// Decode decodes what Encode wrote.
func Decode(data []byte, v any) error { return msgpack.Unmarshal(data, v) }
