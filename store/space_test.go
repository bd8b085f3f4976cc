package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
	"github.com/gatehouse-dev/gatehouse/store/cutfs"
	"github.com/gatehouse-dev/gatehouse/store/fstest"
)

func TestSized(t *testing.T) {
	for _, tc := range []struct {
		name           string
		budget, memory int64
		// want
		segment, memTable int64
		numMemtables      int
		maxReserve        int64 // the reserve and low-water mark stay within it
		l0Stall           int   // under a memory limit
	}{
		{"roomy, no memory bound: the bench's sizes", 0, 0, 32 * mib, 16 * mib, 5, 1 << 62, 0},
		{"a large disk", 100 * gib, 0, 32 * mib, 16 * mib, 5, 1 << 62, 0},
		{"64 MiB partition", 64 * mib, 0, mib, 2 * mib, 2, 20 * mib, 0},
		{"256 MiB partition", 256 * mib, 0, 4 * mib, 8 * mib, 2, 80 * mib, 0},
		{"1 GiB partition", gib, 0, 16 * mib, 32 * mib, 2, 320 * mib, 0},
		{"8 GiB partition", 8 * gib, 0, 32 * mib, 16 * mib, 3, gib, 0},
		{"a 256 MiB memory cap on a roomy disk", 0, 256 * mib, 32 * mib, mib, 5, 1 << 62, 3},
		{"a 512 MiB memory cap: a deeper level 0", 0, 512 * mib, 32 * mib, 2 * mib, 5, 1 << 62, 8},
		{"a 4 GiB memory cap", 0, 4 * gib, 32 * mib, 16 * mib, 5, 1 << 62, 8},
		{"a 64 MiB memory cap", 0, 64 * mib, 32 * mib, mib, 5, 1 << 62, 3},
		{"both small", 64 * mib, 256 * mib, mib, mib, 2, 20 * mib, 2},
		{"a small disk under a roomy memory cap", 64 * mib, gib, mib, 2 * mib, 2, 20 * mib, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			z := sized(tc.budget, tc.memory)
			if z.segment != tc.segment || z.memTable != tc.memTable || z.numMemtables != tc.numMemtables {
				t.Errorf("segment %d MiB, memory table %d MiB x %d; want %d MiB, %d MiB x %d",
					z.segment/mib, z.memTable/mib, z.numMemtables, tc.segment/mib, tc.memTable/mib, tc.numMemtables)
			}
			if z.reserve <= 0 || z.lowWater <= z.reserve || z.lowWater > tc.maxReserve {
				t.Errorf("reserve %d MiB, low water %d MiB: want 0 < reserve < low water <= %d MiB", z.reserve/mib, z.lowWater/mib, tc.maxReserve/mib)
			}
			// Badger refuses a value threshold above 15% of a memory table.
			if z.valueThreshold <= 0 || z.valueThreshold > z.memTable*15/100 {
				t.Errorf("value threshold %d for %d MiB memory tables", z.valueThreshold, z.memTable/mib)
			}
			if tc.memory > 0 {
				if spent := int64(z.numMemtables)*z.memTable*2 + z.blockCache + z.indexCache + z.backlog; spent > tc.memory/2 {
					t.Errorf("Badger may take %d MiB of a %d MiB memory limit", spent/mib, tc.memory/mib)
				}
				// A compaction's memory follows its tables' size, the same
				// at every level, and four tables in level 0 let Badger
				// merge them into one built in memory (with its compressed
				// copy): only where that stays within a quarter of the limit.
				if z.baseTable > z.memTable/4 || z.tableGrowth != 1 || z.l0Tables >= z.l0Stall ||
					(z.l0Stall >= 4 && int64(z.l0Stall)*z.memTable*2 > tc.memory/4) {
					t.Errorf("tables of %d KiB growing %dx per level, level 0 compacted at %d and stalled at %d tables",
						z.baseTable/kib, z.tableGrowth, z.l0Tables, z.l0Stall)
				}
				if int64(z.lazyBytes) > z.memTable {
					t.Errorf("%d KiB of lazy writes may wait, over a %d KiB memory table", z.lazyBytes/kib, z.memTable/kib)
				}
				if z.l0Stall != tc.l0Stall {
					t.Errorf("level 0 stalls at %d tables, want %d", z.l0Stall, tc.l0Stall)
				}
			}
		})
	}
}

func TestWatermarks(t *testing.T) {
	w := watermarks{budget: 100 * mib, lowWater: 20 * mib, reserve: 10 * mib, hysteresis: 2 * mib}
	for _, tc := range []struct {
		name       string
		prev       SpaceState
		free, used int64
		want       SpaceState
	}{
		{"plenty of room", SpaceOK, 500 * mib, 10 * mib, SpaceOK},
		{"free space below the low-water mark", SpaceOK, 19 * mib, 10 * mib, SpaceLow},
		{"the budget nearly spent, the disk empty", SpaceOK, 500 * mib, 85 * mib, SpaceLow},
		{"the budget overspent", SpaceOK, 500 * mib, 120 * mib, SpaceFull},
		{"below the reserve", SpaceOK, 9 * mib, 10 * mib, SpaceFull},
		{"straight from low to full", SpaceLow, 5 * mib, 10 * mib, SpaceFull},
		{"back above the low-water mark, within the hysteresis", SpaceLow, 21 * mib, 10 * mib, SpaceLow},
		{"back above the low-water mark and its hysteresis", SpaceLow, 22 * mib, 10 * mib, SpaceOK},
		{"back above the reserve, within the hysteresis", SpaceFull, 11 * mib, 10 * mib, SpaceFull},
		{"back above the reserve and its hysteresis", SpaceFull, 12 * mib, 10 * mib, SpaceLow},
		{"from full to plenty at once", SpaceFull, 500 * mib, 10 * mib, SpaceOK},
		{"from full to just above the low-water mark", SpaceFull, 21 * mib, 10 * mib, SpaceLow},
		{"low stays low", SpaceLow, 15 * mib, 10 * mib, SpaceLow},
		{"full stays full", SpaceFull, 1 * mib, 10 * mib, SpaceFull},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := w.next(tc.prev, tc.free, tc.used); got != tc.want {
				t.Errorf("next(%v, free %d MiB, used %d MiB) = %v, want %v", tc.prev, tc.free/mib, tc.used/mib, got, tc.want)
			}
		})
	}
}

// TestPeriodicReadingWalksTheFolderWhenNeeded: the guard's periodic
// reading walks the data folder for its size only when something was
// journaled since the last walk, or folderWalkInterval after it; an
// explicit check always walks.
func TestPeriodicReadingWalksTheFolderWhenNeeded(t *testing.T) {
	dir := t.TempDir()
	fs := &fakeSpace{}
	fs.free.Store(10 * gib)
	g := newGuard(dir, watermarks{lowWater: mib, reserve: mib / 2}, slog.New(slog.DiscardHandler), fs.read)
	grow := func(name string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), bytes.Repeat([]byte{1}, 64<<10), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	grow("a")
	first := g.check().Used
	if first < 64<<10 {
		t.Fatalf("the first reading found %d bytes in the folder, want at least 64 KiB", first)
	}
	steps := []struct {
		name   string
		before func()
		walk   bool
		grows  bool
	}{
		{"idle: the size of the last walk", func() { grow("b") }, false, false},
		{"a write journaled since", func() { g.wrote(100) }, false, true},
		{"an explicit check", func() { grow("c") }, true, true},
		{"the walk is old", func() { grow("d"); g.walked = g.walked.Add(-folderWalkInterval) }, false, true},
	}
	last := first
	for _, st := range steps {
		st.before()
		used := g.measure(st.walk).Used
		if grew := used > last; grew != st.grows {
			t.Errorf("%s: the folder's size went from %d to %d bytes; want a new walk: %v", st.name, last, used, st.grows)
		}
		last = used
	}
}

// fakeSpace is a file system's free space a test sets: an injected reader
// of the one figure the store cannot choose, over a real store.
type fakeSpace struct{ free atomic.Int64 }

func (f *fakeSpace) read(string) (diskUsage, error) { return diskUsage{free: f.free.Load()}, nil }

// TestGuardRefusesAndResumes: below the low-water mark new work waits
// while other writes go on; below the reserve only deletions and the
// reads' bookkeeping do; with room back, everything resumes at the next
// reading, with no restart. Each change is logged once.
func TestGuardRefusesAndResumes(t *testing.T) {
	fs := &fakeSpace{}
	fs.free.Store(10 * gib)
	var logs syncbuf.Buffer
	s := openWith(t, Options{Dir: t.TempDir(), DiskBudget: 64 * mib, readSpace: fs.read, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer s.Close()
	z := s.size
	put := func(i int) error {
		var b Batch
		b.Append("grow", uint64(i), []byte("some bytes"))
		return s.Write(context.Background(), &b)
	}
	del := func(i int) error {
		var b Batch
		b.DeleteEntry("grow", uint64(i))
		return s.Write(context.Background(), &b)
	}
	steps := []struct {
		name              string
		room              int64
		state             SpaceState
		admit, grow, dels bool
	}{
		{"room", z.lowWater * 2, SpaceOK, true, true, true},
		{"below the low-water mark", z.lowWater - mib, SpaceLow, false, true, true},
		{"below the reserve", z.reserve - mib, SpaceFull, false, false, true},
		{"below half the reserve", z.reserve/2 - mib, SpaceFull, false, false, false},
		{"room again", z.lowWater * 2, SpaceOK, true, true, true},
	}
	for i, st := range steps {
		// The budget leaves more room than the file system does here.
		fs.free.Store(st.room)
		s.guard.check()
		if got := s.Space().State; got != st.state {
			t.Fatalf("%s: state %v, want %v", st.name, got, st.state)
		}
		for _, c := range []struct {
			what string
			err  error
			want bool
		}{{"Admit", s.Admit(), st.admit}, {"a growing write", put(i), st.grow}, {"a deletion", del(i), st.dels}} {
			if (c.err == nil) != c.want {
				t.Errorf("%s: %s: err %v, want accepted=%v", st.name, c.what, c.err, c.want)
			}
			if c.err != nil && !errors.Is(c.err, ErrStorageFull) {
				t.Errorf("%s: %s: %v does not match ErrStorageFull", st.name, c.what, c.err)
			}
		}
		if err := s.Ping(context.Background()); (err == nil) != (st.state == SpaceOK) || (err != nil && !errors.Is(err, ErrStorageFull)) {
			t.Errorf("%s: Ping = %v", st.name, err)
		}
	}
	if _, err := s.Read("grow", 0, 0); err != nil {
		t.Errorf("reads go on throughout: %v", err)
	}
	for _, msg := range []string{"below the low-water mark", "reserve reached", "room again"} {
		if n := strings.Count(logs.String(), msg); n != 1 {
			t.Errorf("%q logged %d times, want once:\n%s", msg, n, logs.String())
		}
	}
}

// TestIdleFolderIsSmall: a new, empty store takes at most 8 MiB of disk,
// Badger's files included; on a roomy disk too, where a busy journal grows
// its segments to 32 MiB.
// TestSegmentLogSegmentsFollowTheMemoryLimit: under a memory limit the
// segment log's segments, whose index stays in memory while one is written
// and is built in memory again when it is sealed, are a thirty-second of
// the limit (2 MiB under 64 MiB); without one they keep the full 32 MiB, so
// that 3 MiB of log entries fill two segments under 64 MiB and one without.
func TestSegmentLogSegmentsFollowTheMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		memory   int64
		segments int
	}{
		{"no memory limit", 0, 1},
		{"64 MiB", 64 * mib, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openWith(t, Options{Dir: dir, MemoryLimit: tc.memory})
			entry := bytes.Repeat([]byte{'e'}, kib)
			for i := range uint64(48) {
				write(t, s, func(b *Batch) {
					for j := range uint64(64) {
						b.Append("x/ex", i*64+j+1, entry)
					}
				})
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			segs, err := filepath.Glob(filepath.Join(dir, logsDir, "*.seg"))
			if err != nil {
				t.Fatal(err)
			}
			// The segment a start begins, empty, is not counted.
			full := 0
			for _, seg := range segs {
				fi, err := os.Stat(seg)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Size() > 0 {
					full++
				}
			}
			if full != tc.segments {
				t.Errorf("3 MiB of entries in %d segments; want %d", full, tc.segments)
			}
		})
	}
}

func TestIdleFolderIsSmall(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, SyncAlways)
	defer s.Close()
	used, err := folderSize(dir)
	if err != nil {
		t.Fatal(err)
	}
	if used > 8*mib {
		t.Fatalf("an idle, empty store takes %d KiB", used/kib)
	}
	if s.Space().Budget < 32*mib {
		t.Errorf("budget %d: the default is the folder's size plus the free space", s.Space().Budget)
	}
}

// TestSegmentPrepareFailure: on a real, small file system that runs out of
// space, a segment that cannot be prepared is removed again (no empty or
// half-made file is left), the failure is visible (Space, Ping, Stats) and
// refuses writes as storage full rather than failing the store, and
// writes resume once space is freed. The journal gets a file system of its
// own, so that Badger's files, which it writes through memory maps, stay
// out of it; and the watermarks are kept out of the way with a free-space
// reader that sees room without end, so that it is the file system itself
// that says no.
func TestSegmentPrepareFailure(t *testing.T) {
	dir := t.TempDir()
	mnt := filepath.Join(dir, "journal")
	fstest.Mount(t, mnt, 4*mib)
	ballast := filepath.Join(mnt, "ballast")
	fs := &fakeSpace{}
	fs.free.Store(100 * gib)
	s := openWith(t, Options{Dir: dir, DiskBudget: 100 * gib, readSpace: fs.read, segmentSize: 256 * kib})
	defer s.Close()
	// Fill the journal's file system.
	for size := int64(4 * mib); size >= 4*kib; size /= 2 {
		f, err := os.OpenFile(ballast+fmt.Sprint(size), os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if err := preallocate(f, size); err != nil {
			_ = os.Remove(f.Name())
		}
		f.Close()
	}
	var refused error
	for i := 1; i < 10000 && refused == nil; i++ {
		var b Batch
		b.Append("fill", uint64(i), bytes.Repeat([]byte{'x'}, 8*kib))
		refused = s.Write(context.Background(), &b)
	}
	if !errors.Is(refused, ErrStorageFull) || errors.Is(refused, ErrFailed) {
		t.Fatalf("a write with no room for its segment: %v; want ErrStorageFull, not ErrFailed", refused)
	}
	if err := s.Ping(context.Background()); err == nil {
		t.Error("Ping is fine with a segment that cannot be prepared")
	}
	if st := s.Stats(); st.SegmentFailures == 0 || st.Space.Err == nil {
		t.Errorf("stats: %d failures, space error %v", st.SegmentFailures, st.Space.Err)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "journal", "*"))
	for _, p := range segs {
		if fi, err := os.Stat(p); err == nil && fi.Size() == 0 {
			t.Errorf("an empty segment was left: %s", p)
		}
	}
	// Free the space: the next write prepares its segment.
	ballasts, _ := filepath.Glob(ballast + "*")
	for _, p := range ballasts {
		os.Remove(p)
	}
	eventually.True(t, "writes resume once space is back", func() bool {
		var b Batch
		b.Append("fill", 1<<40, []byte("after"))
		return s.Write(context.Background(), &b) == nil
	})
	if err := s.Ping(context.Background()); err != nil {
		t.Errorf("Ping once a segment is prepared again: %v", err)
	}
}

// storeOnAFullDisk opens a store with options o on a cutfs mount over a
// 32 MiB file system, writes 100 entries of 1,000 bytes to log "ev", and
// then fills the file system with files beside the store (freeTheDisk
// removes them). It returns the store, its mount and the file system's
// folder.
func storeOnAFullDisk(t *testing.T, o Options) (*Store, *cutfs.FS, string) {
	t.Helper()
	mnt := t.TempDir()
	fstest.Mount(t, mnt, 32*mib)
	dir := filepath.Join(mnt, "data")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	m := cutfs.MountForTest(t, dir, cutfs.Options{})
	o.Dir, o.idleAfter = m.Dir(), time.Hour
	s := openWith(t, o)
	for i := uint64(1); i <= 100; i++ {
		write(t, s, func(b *Batch) { b.Append("ev", i, bytes.Repeat([]byte{byte(i)}, 1000)) })
	}
	// A read waits until Badger has every write: it writes nothing more
	// while the disk fills.
	if _, err := s.Read("ev", 0, 0); err != nil {
		t.Fatal(err)
	}
	for size := int64(32 * mib); size >= 4*kib; size /= 2 {
		f, err := os.Create(filepath.Join(mnt, fmt.Sprint("taken-", size)))
		if err != nil {
			t.Fatal(err)
		}
		if preallocate(f, size) != nil {
			_ = os.Remove(f.Name())
		}
		f.Close()
	}
	return s, m, mnt
}

// freeTheDisk removes what storeOnAFullDisk filled the file system with.
func freeTheDisk(t *testing.T, mnt string) {
	t.Helper()
	taken, _ := filepath.Glob(filepath.Join(mnt, "taken-*"))
	for _, p := range taken {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPowerCutFSCloseOnAFullDisk: a store closed with no room left for Badger to
// write its memory tables out (something else took the reserve) leaves
// Badger as a crash would rather than fault, keeps the journal, and opens
// again with every write once there is room.
func TestPowerCutFSCloseOnAFullDisk(t *testing.T) {
	s, m, mnt := storeOnAFullDisk(t, Options{})
	dir := m.Backing()
	if err := s.Close(); !errors.Is(err, ErrStorageFull) {
		t.Fatalf("Close on a full disk: %v, want ErrStorageFull", err)
	}
	// The process lives on in a test, Badger left open: the power goes
	// now, and the next start finds what the disk holds.
	if _, err := m.Cut(cutfs.CutOptions{}); err != nil {
		t.Fatal(err)
	}
	freeTheDisk(t, mnt)
	_ = s.db.Close()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	r := openWith(t, Options{Dir: dir})
	defer r.Close()
	if got, err := r.Read("ev", 0, 0); err != nil || len(got) != 100 {
		t.Fatalf("%d of 100 entries after a close on a full disk (%v)", len(got), err)
	}
}

// TestPowerCutFSFullDiskIsNotAskedForATable: once something else took the
// reserve, the store reacting to the full disk does not have Badger write
// its memory tables out. Badger writes a table through a memory map and
// syncs it; on a full disk the sync fails, and Badger leaves that table's
// file open and mapped for as long as the process lives (the mount it is
// on then cannot be let go). Here the disk is a FUSE mount (cutfs), where
// the failure comes back from the sync; on tmpfs the write would fault.
func TestPowerCutFSFullDiskIsNotAskedForATable(t *testing.T) {
	var logs syncbuf.Buffer
	s, m, mnt := storeOnAFullDisk(t, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	// Either reaction to the full disk logs this: the build before this
	// test asked Badger for the tables ("cannot write"), this one does not
	// ("no room to write").
	eventually.True(t, "the store reacts to the full disk", func() bool {
		return strings.Contains(logs.String(), "Badger's memory tables out")
	})
	known := map[string]bool{}
	for _, tb := range s.db.Tables() {
		known[fmt.Sprintf("%06d.sst", tb.ID)] = true
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skipf("no /proc/self/maps: %v", err)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		if i := strings.Index(line, m.Dir()+"/"); i >= 0 && strings.HasSuffix(line, ".sst") {
			if name := filepath.Base(line[i:]); !known[name] {
				t.Errorf("%s is mapped, and is none of Badger's tables: a table it could not write, left mapped\n%s", name, logs.String())
			}
		}
	}
	if err := s.Close(); !errors.Is(err, ErrStorageFull) {
		t.Fatalf("Close on a full disk: %v, want ErrStorageFull", err)
	}
	freeTheDisk(t, mnt)
	if err := s.db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}
