package store

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
)

// ErrStorageFull matches the errors of writes and admissions refused for
// lack of disk space (see Space); they are *SpaceError. Unlike ErrFailed,
// it passes: writes are taken again once there is room.
var ErrStorageFull = errors.New("storage full")

// SpaceState says how much room the data folder has left.
type SpaceState int32

const (
	// SpaceOK: room above the low-water mark.
	SpaceOK SpaceState = iota
	// SpaceLow: below the low-water mark. New work waits (Admit refuses
	// it); writes that let work already running finish, and free space,
	// still go on.
	SpaceLow
	// SpaceFull: below the reserve, the room Badger may still need on its
	// own. Every write that grows the data is refused; deletions and the
	// reads' bookkeeping still go on.
	SpaceFull
)

// String returns "ok", "low" or "full".
func (s SpaceState) String() string {
	switch s {
	case SpaceOK:
		return "ok"
	case SpaceLow:
		return "low"
	case SpaceFull:
		return "full"
	}
	return fmt.Sprintf("SpaceState(%d)", int32(s))
}

// Space is a snapshot of the data folder's room, taken a few times a
// second. Room is the lesser of the file system's free space and what the
// budget leaves.
type Space struct {
	State SpaceState
	// Free is the file system's free space for the folder (what an
	// unprivileged writer may use); Used, the bytes the folder holds.
	Free, Used int64
	// Budget is the most the folder may hold; LowWater and Reserve, the
	// room below which new work waits and every growing write is refused.
	Budget, LowWater, Reserve int64
	// Err is why the space could not be read, or why the journal could
	// not prepare its last segment; nil when all is well.
	Err error
}

// Room returns the lesser of the free space and what the budget leaves.
func (s Space) Room() int64 { return min(s.Free, s.Budget-s.Used) }

// SpaceError is a write or an admission refused for lack of room. It
// matches ErrStorageFull.
type SpaceError struct {
	Space Space
	// Cause is the file system's own refusal (ENOSPC), when there was one.
	Cause error
}

// Error says how much room there is and how much is needed.
func (e *SpaceError) Error() string {
	need := e.Space.LowWater
	if e.Space.State == SpaceFull {
		need = e.Space.Reserve
	}
	msg := fmt.Sprintf("storage full: %s of room left in the data folder (%s free, %s of a %s budget used); writes resume above %s",
		size(e.Space.Room()), size(e.Space.Free), size(e.Space.Used), size(e.Space.Budget), size(need))
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Is makes a SpaceError match ErrStorageFull.
func (e *SpaceError) Is(target error) bool { return target == ErrStorageFull }

// Unwrap returns the file system's refusal, if any.
func (e *SpaceError) Unwrap() error { return e.Cause }

func size(n int64) string {
	if n < 0 {
		return "-" + humanize.IBytes(uint64(-n))
	}
	return humanize.IBytes(uint64(n))
}

// isNoSpace reports whether err is the file system saying it has no room.
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// watermarks turn room into a SpaceState.
type watermarks struct {
	budget, lowWater, reserve int64
	// hysteresis is the room above a mark a state needs before it is
	// left: near a mark, a few writes and a compaction would otherwise
	// flip it back and forth.
	hysteresis int64
}

// next is the state after prev, for free bytes free and used bytes used.
// A zero budget bounds nothing: the room is the free space.
func (w watermarks) next(prev SpaceState, free, used int64) SpaceState {
	room := free
	if w.budget > 0 {
		room = min(free, w.budget-used)
	}
	next := SpaceOK
	switch {
	case room < w.reserve:
		next = SpaceFull
	case room < w.lowWater:
		next = SpaceLow
	}
	if next < prev {
		switch {
		case prev == SpaceFull && room < w.reserve+w.hysteresis:
			next = SpaceFull
		case room < w.lowWater+w.hysteresis:
			next = SpaceLow
		}
	}
	return next
}

// Reading the space: a few times a second, and at once (but no more
// often than spaceMinInterval) when writes since the last reading may
// have used up the room it found: a write or an admission that the
// estimate would refuse reads it again first.
const (
	spaceInterval    = 250 * time.Millisecond
	spaceMinInterval = 100 * time.Millisecond
	// writeCost is how many bytes of disk a journaled byte may take
	// before the next reading sees it: the journal and Badger's log file
	// (whose table replaces it).
	writeCost = 2
	// folderWalkInterval is how often the periodic reading walks the
	// folder for its size when nothing was journaled since the last walk:
	// what changes it then is Badger's own work (compactions, memory
	// tables written out) after the writes, which the free space (one
	// statfs each reading) shows at once anyway. Walking it four times a
	// second was half the CPU of an idle gateway with 250 tables.
	folderWalkInterval = 5 * time.Second
)

// diskUsage is what the store needs to know of its file system.
type diskUsage struct {
	// free is the space an unprivileged writer may still use.
	free int64
	// inodesLow is set when the file system is out of files to create.
	inodesLow bool
}

// guard watches the data folder's room and says which writes may go on.
type guard struct {
	dir   string
	marks watermarks
	log   *slog.Logger
	// read reads the file system's space; statfs but in tests.
	read func(dir string) (diskUsage, error)

	// room is the room found by the last reading, less writeCost for each
	// byte journaled since (written).
	room    atomic.Int64
	written atomic.Int64
	state   atomic.Int32
	poke    chan struct{}
	refused atomic.Uint64
	// checking serializes readings; checked is when the last one began
	// (Unix nanoseconds); walked, under checking, when the last one
	// walked the folder.
	checking sync.Mutex
	checked  atomic.Int64
	walked   time.Time

	mu   sync.Mutex
	last Space
	// changed is closed, and replaced, at each change of state.
	changed chan struct{}
	// prepErr reports the journal's last failure to prepare a segment.
	prepErr func() error
}

func newGuard(dir string, marks watermarks, log *slog.Logger, read func(string) (diskUsage, error)) *guard {
	g := &guard{dir: dir, marks: marks, log: log, read: read, poke: make(chan struct{}, 1), changed: make(chan struct{})}
	g.room.Store(1<<62 - 1)
	return g
}

// check reads the space and moves the state. A state change is logged
// once.
func (g *guard) check() Space { return g.measure(true) }

// measure is check; with walk false it reuses the folder's size from the
// last reading instead of walking the folder, unless something was
// journaled since or folderWalkInterval has passed (see run).
func (g *guard) measure(walk bool) Space {
	g.checking.Lock()
	defer g.checking.Unlock()
	now := time.Now()
	g.checked.Store(now.UnixNano())
	du, err := g.read(g.dir)
	g.mu.Lock()
	used, failed := g.last.Used, g.last.Err != nil
	g.mu.Unlock()
	// What is journaled from here on counts toward the next reading.
	wrote := g.written.Swap(0) > 0
	var uerr error
	// Never walked, walked is zero and long past.
	if walk || wrote || failed || now.Sub(g.walked) >= folderWalkInterval {
		used, uerr = folderSize(g.dir)
		g.walked = now
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	sp := Space{Free: du.free, Used: used, Budget: g.marks.budget, LowWater: g.marks.lowWater, Reserve: g.marks.reserve}
	if sp.Budget <= 0 {
		// No budget: the folder may take what is free.
		sp.Budget = used + du.free
	}
	prev := SpaceState(g.state.Load())
	switch {
	case err != nil || uerr != nil:
		// Nothing new is known: keep the state and the last figures.
		sp = g.last
		sp.Err = errors.Join(err, uerr)
		if g.last.Err == nil {
			g.log.Warn("cannot read the data folder's free space; keeping the last reading", "err", sp.Err)
		}
		sp.State = prev
		g.last = sp
		return sp
	case du.inodesLow:
		sp.State = SpaceFull
	default:
		sp.State = g.marks.next(prev, du.free, used)
	}
	g.room.Store(sp.Room())
	g.state.Store(int32(sp.State))
	g.last = sp
	if sp.State != prev {
		g.logChange(prev, sp)
		g.signalLocked()
	}
	return g.withPrepErr(sp)
}

// signalLocked wakes whoever waits for a change of state. The caller
// holds mu.
func (g *guard) signalLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// changes returns a channel closed at the next change of state.
func (g *guard) changes() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.changed
}

// withPrepErr adds the journal's last failure to prepare a segment to sp.
func (g *guard) withPrepErr(sp Space) Space {
	if g.prepErr != nil {
		sp.Err = errors.Join(sp.Err, g.prepErr())
	}
	return sp
}

func (g *guard) logChange(prev SpaceState, sp Space) {
	attrs := []any{"room", size(sp.Room()), "free", size(sp.Free), "used", size(sp.Used), "budget", size(sp.Budget),
		"low_water", size(sp.LowWater), "reserve", size(sp.Reserve)}
	switch sp.State {
	case SpaceOK:
		g.log.Info("storage: room again; new work is taken", attrs...)
	case SpaceLow:
		if prev == SpaceFull {
			g.log.Warn("storage: above the reserve again; running work may write, new work still waits (507 STORAGE_FULL)", attrs...)
			return
		}
		g.log.Warn("storage: below the low-water mark; new work is refused (507 STORAGE_FULL), running work goes on", attrs...)
	case SpaceFull:
		g.log.Error("storage: reserve reached; every write that grows the data is refused (507 STORAGE_FULL) until space returns", attrs...)
	}
}

// wrote counts n bytes journaled since the last reading, and asks for a
// new reading when they may have used up the room it found.
func (g *guard) wrote(n int) {
	cost := int64(n) * writeCost
	g.written.Add(cost)
	if g.room.Add(-cost) < g.marks.lowWater {
		g.wake()
	}
}

func (g *guard) wake() {
	select {
	case g.poke <- struct{}{}:
	default:
	}
}

// admit returns nil when a write that grows the data (or, with shrinks,
// one that only deletes) may go on.
func (g *guard) admit(shrinks bool) error {
	floor := g.marks.reserve
	if shrinks {
		// The reserve's lowest quarter is Badger's alone, and room to
		// start again after a crash.
		floor = floor * 3 / 4
	}
	ok := func() bool { return g.room.Load() >= floor && (shrinks || SpaceState(g.state.Load()) != SpaceFull) }
	if ok() || g.recheck() && ok() {
		return nil
	}
	return g.refusal(nil)
}

// admitNew returns nil when new work may start.
func (g *guard) admitNew() error {
	ok := func() bool { return g.room.Load() >= g.marks.lowWater && SpaceState(g.state.Load()) == SpaceOK }
	if ok() || g.recheck() && ok() {
		return nil
	}
	return g.refusal(nil)
}

// recheck reads the space again, first waiting until spaceMinInterval has
// passed since the last reading (a write near the mark waits that long
// rather than be refused on an estimate); it reports whether it read.
func (g *guard) recheck() bool {
	last := g.checked.Load()
	if wait := spaceMinInterval - time.Since(time.Unix(0, last)); wait > 0 {
		time.Sleep(wait)
	}
	g.checking.Lock()
	fresh := g.checked.Load() != last // another caller read it meanwhile
	g.checking.Unlock()
	if !fresh {
		g.check()
	}
	return true
}

// refusal returns the error of a refused write, with the last reading.
func (g *guard) refusal(cause error) *SpaceError {
	g.refused.Add(1)
	sp := g.snapshot()
	if sp.State == SpaceOK {
		// The writes since the last reading took the room it found.
		sp.State = SpaceLow
	}
	return &SpaceError{Space: sp, Cause: cause}
}

// full records the file system refusing a write: no room, whatever the
// last reading said, until the next one finds some.
func (g *guard) full(cause error) *SpaceError {
	g.room.Store(0)
	g.mu.Lock()
	prev := SpaceState(g.state.Swap(int32(SpaceFull)))
	g.last.State = SpaceFull
	if prev != SpaceFull {
		g.logChange(prev, g.last)
		g.signalLocked()
	}
	g.mu.Unlock()
	g.wake()
	return g.refusal(cause)
}

// snapshot returns the last reading.
func (g *guard) snapshot() Space {
	g.mu.Lock()
	sp := g.last
	g.mu.Unlock()
	return g.withPrepErr(sp)
}

// run reads the space every spaceInterval, and at once when poked, until
// stop is closed.
func (g *guard) run(stop <-chan struct{}) {
	t := time.NewTicker(spaceInterval)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-t.C:
		case <-g.poke:
			if wait := spaceMinInterval - time.Since(last); wait > 0 {
				select {
				case <-time.After(wait):
				case <-stop:
					return
				}
			}
		case <-stop:
			return
		}
		g.measure(false)
		last = time.Now()
	}
}

// folderSize returns the bytes the files under dir take on disk: blocks
// allocated, so that sparse files (Badger maps its logs at twice their
// size) count for what they hold.
func folderSize(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // a file removed while walking
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		total += allocated(fi)
		return nil
	})
	return total, err
}

// openSpace reads the data folder's room and sizes the store for its
// budget. It refuses to open a store that could not even start without
// running out of space, since Badger writes the memory tables it finds out
// as tables, and the journal is replayed into Badger, through memory-mapped
// files that would fault on a full disk: it then writes nothing, so that a
// supervisor starting it again and again uses up nothing either.
func openSpace(o Options, log *slog.Logger) (sizing, *guard, error) {
	if err := mkdirDurable(o.Dir); err != nil {
		return sizing{}, nil, fmt.Errorf("store: %w", err)
	}
	read := o.readSpace
	if read == nil {
		read = statfs
	}
	du, err := read(o.Dir)
	if err != nil {
		return sizing{}, nil, fmt.Errorf("store: read the free space of %q: %w", o.Dir, err)
	}
	used, err := folderSize(o.Dir)
	if err != nil {
		return sizing{}, nil, fmt.Errorf("store: measure %q: %w", o.Dir, err)
	}
	// Without a budget the folder may take what is free, which sizes it;
	// the budget is not kept, or a start on a disk that something else
	// filled would shrink it for good.
	budget := o.DiskBudget
	if budget > 0 && budget < minBudget {
		return sizing{}, nil, fmt.Errorf("store: a disk budget of %s is too small: at least %s", size(budget), size(minBudget))
	}
	hint := budget
	if hint <= 0 {
		hint = used + du.free
	}
	z := sized(hint, o.MemoryLimit)
	// Badger cannot replay a memory table's log into a smaller table: a
	// folder keeps the size its memory tables were made with (their logs
	// are twice it) until they are written out.
	if old, err := memTableOf(o.Dir); err != nil {
		return sizing{}, nil, err
	} else if old > z.memTable {
		z.memTable = old
		z.derive()
	}
	if o.LowWater > 0 {
		z.lowWater = max(o.LowWater, z.reserve)
	}
	need, err := startNeed(o.Dir, z)
	if err != nil {
		return sizing{}, nil, err
	}
	room := du.free
	if budget > 0 {
		room = min(room, budget-used)
	}
	if room < need {
		return sizing{}, nil, fmt.Errorf("store: %s of room in %q (%s free, %s used), and starting needs %s "+
			"(the journal replayed, Badger's memory tables written out); nothing was written: free space, grow the file system or raise the budget: %w",
			size(room), o.Dir, size(du.free), size(used), size(need), ErrStorageFull)
	}
	marks := watermarks{budget: budget, lowWater: z.lowWater, reserve: z.reserve, hysteresis: max(mib, z.reserve/8)}
	return z, newGuard(o.Dir, marks, log, read), nil
}

// minBudget is the smallest disk budget the store takes: below it the
// reserve would leave nothing.
const minBudget = 32 * mib

// memTableOf returns the size of the memory tables whose logs are in dir,
// or zero when there are none. Badger makes a log twice its table's size
// (a power of two, as sized makes them) and cuts it to what it holds when
// it replays it; such a log's table needs at least its size.
func memTableOf(dir string) (int64, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.mem"))
	if err != nil {
		return 0, fmt.Errorf("store: %w", err)
	}
	var most int64
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return 0, fmt.Errorf("store: %w", err)
		}
		n := fi.Size()
		if n&(n-1) == 0 {
			n /= 2
		}
		most = max(most, n)
	}
	return most, nil
}

// startNeed is the room opening the store in dir may take: Badger writes
// the memory tables it finds out as tables, one at a time, each replacing
// its log; the journal is replayed into a new memory table (at most all
// of it: after a crash that spared the page cache Badger holds nearly
// everything already, see replayApply); and a fresh segment is made.
func startNeed(dir string, z sizing) (int64, error) {
	records, err := recordBytes(filepath.Join(dir, "journal"))
	if err != nil {
		return 0, err
	}
	need := min(minSegmentSize, z.segment) + mib + records
	var mem int64
	paths, err := filepath.Glob(filepath.Join(dir, "*.mem"))
	if err != nil {
		return 0, fmt.Errorf("store: %w", err)
	}
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return 0, fmt.Errorf("store: %w", err)
		}
		mem = max(mem, allocated(fi))
	}
	return need + mem, nil
}
