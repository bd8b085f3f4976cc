package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/store/cutfs"
)

func write(t *testing.T, s *Store, f func(b *Batch)) {
	t.Helper()
	var b Batch
	f(&b)
	if err := s.Write(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
}

// TestPowerCutFSJournalAloneRestoresEverything: the journal by itself rebuilds every
// acknowledged write, deletes included, across segments, with the epoch.
func TestPowerCutFSJournalAloneRestoresEverything(t *testing.T) {
	t.Parallel()
	for _, mode := range []SyncMode{SyncAlways, SyncBatch} {
		t.Run(mode.String(), func(t *testing.T) { testJournalAloneRestoresEverything(t, mode) })
	}
}

func testJournalAloneRestoresEverything(t *testing.T, mode SyncMode) {
	m := onCutFS(t)
	dir := m.Dir()
	s := openWith(t, Options{Dir: dir, Sync: mode, segmentSize: 4 << 10})
	for i := uint64(1); i <= 200; i++ {
		write(t, s, func(b *Batch) {
			b.Append("ev", i, bytes.Repeat([]byte{byte(i)}, 100))
			if err := b.Put("rec", fmt.Sprint(i%10), map[string]uint64{"i": i}); err != nil {
				t.Fatal(err)
			}
		})
	}
	write(t, s, func(b *Batch) { b.DeleteEntry("ev", 7); b.Delete("rec", "3") })
	// Concurrent writers keep two journal writes in flight across segment
	// changes.
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := uint64(1); i <= 40; i++ {
				var b Batch
				b.Append(fmt.Sprint("w", w), i, bytes.Repeat([]byte{byte(w)}, 300))
				if err := s.Write(context.Background(), &b); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := s.journal.pending(); n < 3 {
		t.Fatalf("%d segments: the test wants several", n)
	}
	if mode == SyncBatch {
		// Every write acknowledged: the promise covers them once the
		// interval's sync has come.
		eventually.True(t, "the journal is synced", func() bool { return s.batchSynced.Load() >= s.acked.Load() })
	}
	epoch := s.Epoch()
	if _, err := m.Cut(cutfs.CutOptions{}); err != nil {
		t.Fatal(err)
	}
	// What the store does after the cut is lost, a clean close included,
	// which leaves no journal.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(filepath.Join(dir, "journal")); len(left) != 0 {
		t.Errorf("a clean close left %d journal segments", len(left))
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	// The journal alone: Badger's files are lost, every one.
	copied := journalOnly(t, m.Backing())

	r := openWith(t, Options{Dir: copied})
	defer r.Close()
	if r.Epoch() != epoch {
		t.Errorf("epoch %q, want %q", r.Epoch(), epoch)
	}
	got, err := r.Read("ev", 0, 0)
	if err != nil || len(got) != 199 {
		t.Fatalf("read %d entries (%v), want 199", len(got), err)
	}
	if _, err := r.Entry("ev", 7); err == nil {
		t.Error("deleted entry 7 came back")
	}
	var rec map[string]uint64
	if err := r.Get("rec", "9", &rec); err != nil || rec["i"] != 199 {
		t.Errorf("rec 9 = %v, %v; want the last write, i=199", rec, err)
	}
	if err := r.Get("rec", "3", &rec); err == nil {
		t.Error("deleted record came back")
	}
	for w := range 8 {
		if got, err := r.Read(fmt.Sprint("w", w), 0, 0); err != nil || len(got) != 40 {
			t.Errorf("writer %d: %d of 40 entries after replay (%v)", w, len(got), err)
		}
	}
	// The replayed store keeps working, and later writes win.
	write(t, r, func(b *Batch) { b.Append("ev", 201, []byte("after")) })
	if last, _ := r.Last("ev"); last != 201 {
		t.Errorf("last = %d after a new write", last)
	}
}

// TestPowerCutFSJournalTornTail: a record cut short by a crash ends the history;
// everything before it is kept and the store opens.
func TestPowerCutFSJournalTornTail(t *testing.T) {
	m := onCutFS(t)
	s := open(t, m.Dir(), SyncAlways)
	for i := uint64(1); i <= 5; i++ {
		write(t, s, func(b *Batch) { b.Append("ev", i, fmt.Appendf(nil, "entry-%d", i)) })
	}
	copied := powerCut(t, m, s, cutfs.CutOptions{})
	segs, _ := filepath.Glob(filepath.Join(copied, "journal", "*"+segmentExt))
	if len(segs) != 1 { // the one written: the next is prepared once it is half full
		t.Fatalf("segments %v", segs)
	}
	data, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(data, []byte("entry-5"))
	if at < 0 {
		t.Fatal("last entry not found in the segment")
	}
	data[at] ^= 0xff // the last record's checksum no longer matches
	if err := os.WriteFile(segs[0], data, 0o644); err != nil {
		t.Fatal(err)
	}
	r := open(t, copied, SyncAlways)
	defer r.Close()
	if last, _ := r.Last("ev"); last != 4 {
		t.Fatalf("last = %d, want 4: the torn fifth write is dropped, the rest kept", last)
	}
}

// recycledFiles counts the files j keeps for reuse; the segment being
// prepared in the background takes from them under j.mu.
func recycledFiles(j *journal) int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.recycled)
}

// TestJournalReleaseAndRecycle: segments go once Badger's tables hold
// their versions, oldest first, and never the one being written; released
// files are reused, and what they held before never comes back.
func TestJournalReleaseAndRecycle(t *testing.T) {
	dir := t.TempDir()
	j, err := openJournal(dir, journalOptions{minSegment: 8 << 10, maxSegment: 8 << 10, durable: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.replay(func(uint64, []op) error { return nil }); err != nil {
		t.Fatal(err)
	}
	appendN := func(from, to uint64) {
		for ts := from; ts <= to; ts++ {
			if err := appendRecord(j, ts, []op{{key: fmt.Appendf(nil, "k%d", ts), val: bytes.Repeat([]byte("v"), int(ts*37%700))}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	appendN(1, 60)
	before := j.pending()
	n, err := j.release(30)
	if err != nil || n == 0 || j.pending() != before-n {
		t.Fatalf("release(30) = %d, %v; pending %d -> %d", n, err, before, j.pending())
	}
	if recycledFiles(j) == 0 {
		t.Fatal("released segments were not kept for reuse")
	}
	appendN(61, 120) // rotates into the recycled files
	if free, _ := filepath.Glob(filepath.Join(dir, "*"+recycleExt)); len(free) == recycledFiles(j)+n {
		t.Fatal("no recycled file was reused")
	}
	if err := j.close(false); err != nil {
		t.Fatal(err)
	}

	j, err = openJournal(dir, journalOptions{minSegment: 8 << 10, maxSegment: 8 << 10, durable: true})
	if err != nil {
		t.Fatal(err)
	}
	var first, last uint64
	if _, err := j.replay(func(ts uint64, ops []op) error {
		if first == 0 {
			first = ts
		} else if ts != last+1 {
			t.Errorf("replay jumped from %d to %d", last, ts)
		}
		if len(ops) != 1 || string(ops[0].key) != fmt.Sprintf("k%d", ts) || len(ops[0].val) != int(ts*37%700) {
			t.Errorf("record %d replayed wrong: %d ops", ts, len(ops))
		}
		last = ts
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if first == 0 || first > 31 || last != 120 {
		t.Fatalf("replayed %d..%d, want a suffix from at most 31 through 120", first, last)
	}
	if _, err := j.release(1 << 40); err != nil || j.pending() != 1 {
		t.Fatalf("releasing everything left %d segments (%v); the one written stays", j.pending(), err)
	}
	if err := j.close(true); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("a clean close left %d files", len(left))
	}
}

func TestDecodeRecordRejectsDamage(t *testing.T) {
	good := encodeRecord(nil, 0, 9, []op{{key: []byte("a"), val: []byte("b")}, {key: []byte("c"), del: true}})[recordHeader:]
	ts, ops, err := decodeRecord(good)
	if err != nil || ts != 9 || len(ops) != 2 || string(ops[0].val) != "b" || !ops[1].del {
		t.Fatalf("round trip: %d %+v %v", ts, ops, err)
	}
	for name, p := range map[string][]byte{
		"empty":         nil,
		"short":         good[:5],
		"cut in a key":  good[:len(good)-3],
		"trailing":      append(append([]byte(nil), good...), 0),
		"bad flag":      append(append([]byte(nil), good[:9]...), 7),
		"huge op count": append(append([]byte(nil), good[:8]...), 0xff, 0xff, 0xff, 0xff, 0x0f),
	} {
		if _, _, err := decodeRecord(p); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(encodeRecord(nil, 0, 1, []op{{key: []byte("k"), val: []byte("v")}})[recordHeader:])
	f.Fuzz(func(t *testing.T, p []byte) {
		ts, ops, err := decodeRecord(p)
		if err != nil {
			return
		}
		ts2, ops2, err := decodeRecord(encodeRecord(nil, 0, ts, ops)[recordHeader:])
		if err != nil || ts2 != ts || len(ops2) != len(ops) {
			t.Fatalf("re-encoded record decodes to %d %d ops (%v), want %d %d ops", ts2, len(ops2), err, ts, len(ops))
		}
		for i := range ops {
			if !bytes.Equal(ops[i].key, ops2[i].key) || !bytes.Equal(ops[i].val, ops2[i].val) || ops[i].del != ops2[i].del {
				t.Fatalf("op %d changed: %+v -> %+v", i, ops[i], ops2[i])
			}
		}
	})
}

// appendRecord writes one record and waits for it, as the store does with
// one write in flight.
func appendRecord(j *journal, ts uint64, ops []op) error {
	rec := j.encode(nil, ts, ops)
	if !j.fits(rec) {
		if err := j.rotate(); err != nil {
			return err
		}
	}
	return j.place(rec, ts).do()
}

// TestCheckpointSyncsValueLogOnlyWhenUsed: Badger's value log, which takes
// values of 1 MiB and more, is synced at a checkpoint only after such a
// value was written; the value survives a reopen either way.
func TestCheckpointSyncsValueLogOnlyWhenUsed(t *testing.T) {
	dir := t.TempDir()
	s := openWith(t, Options{Dir: dir, segmentSize: 4 << 10})
	for i := uint64(1); i <= 20; i++ {
		write(t, s, func(b *Batch) { b.Append("small", i, bytes.Repeat([]byte("s"), 1000)) })
	}
	_, _ = s.Last("small") // a read waits for Badger to be given every write
	if s.vlog.dirty() {
		t.Fatal("small values marked the value log as written")
	}
	big := bytes.Repeat([]byte("B"), 2<<20)
	write(t, s, func(b *Batch) { b.Append("big", 1, big) })
	_, _ = s.Last("big")
	if !s.vlog.dirty() {
		t.Fatal("a 2 MiB value did not mark the value log as written")
	}
	if s.journal.pending() < 2 {
		t.Fatal("the test wants a segment to release")
	}
	s.checkpoint(0)
	if s.vlog.dirty() {
		t.Error("the checkpoint did not sync the value log")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir, SyncAlways)
	defer s.Close()
	if got, err := s.Entry("big", 1); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("big value after reopen: %d bytes, %v", len(got), err)
	}
}

// TestPowerCutFSKeepsLargeValues: a value large enough for Badger's value
// log, acknowledged and written out in a table before any checkpoint
// synced the value log, is there after a power cut: the table survives
// and points at a value the cut lost, and the journal's replay writes the
// value again instead of taking the table's word for it. It read back
// empty before.
func TestPowerCutFSKeepsLargeValues(t *testing.T) {
	t.Parallel()
	m := onCutFS(t)
	s := openWith(t, Options{Dir: m.Dir(), idleAfter: time.Hour})
	defer s.Close()
	big := bytes.Repeat([]byte("B"), 2<<20)
	write(t, s, func(b *Batch) { b.Append("big", 1, big) })
	if err := s.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Twice: the second time the replayed value is in a table too, beside
	// the one that lost it, and reads must still find it.
	for range 2 {
		r := openWith(t, Options{Dir: powerCut(t, m, s, cutfs.CutOptions{})})
		if got, err := r.Entry("big", 1); err != nil || !bytes.Equal(got, big) {
			t.Fatalf("the large value after the cut: %d of %d bytes, %v", len(got), len(big), err)
		}
		if err := r.flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		m = cutfs.MountForTest(t, m.Backing(), cutfs.Options{})
		s = openWith(t, Options{Dir: m.Dir(), idleAfter: time.Hour})
		defer s.Close()
	}
}

// TestPowerCutFSLargeValueWrittenDuringACheckpointIsKept: a checkpoint
// that syncs the value log while a large value is on its way to it (handed
// to Badger, not written yet) does not count that value as synced: once a
// table holds it, the next checkpoint syncs the value log again before the
// journal lets the write go. The first checkpoint used to clear the mark
// the value had set, the second released the journal without a sync, and
// the power cut took the value (CI, TestPowerCutFSRightAfterTheJournalLetsGo:
// "record 442: 0 of 204800 bytes").
func TestPowerCutFSLargeValueWrittenDuringACheckpointIsKept(t *testing.T) {
	t.Parallel()
	m := onCutFS(t)
	var (
		armed   atomic.Bool
		handed  = make(chan struct{})
		proceed = make(chan struct{})
	)
	s := openWith(t, Options{
		Dir: m.Dir(), segmentSize: 16 << 10, memTableSize: 1 << 20, idleAfter: time.Hour,
		committing: func(uint64) {
			if armed.CompareAndSwap(true, false) {
				close(handed)
				<-proceed
			}
		},
	})
	defer s.Close()
	small := func(from, to uint64) {
		for i := from; i <= to; i++ {
			write(t, s, func(b *Batch) { b.Append("small", i, bytes.Repeat([]byte{byte(i)}, 2000)) })
		}
	}
	small(1, 20)
	_, _ = s.Last("small")
	big := bytes.Repeat([]byte("B"), 200<<10) // over the value threshold of 1 MiB memory tables
	armed.Store(true)
	write(t, s, func(b *Batch) { b.Append("big", 1, big) })
	<-handed
	s.checkpoint(0)
	close(proceed)
	// Segments after the large value's, so that the journal can let its
	// segment go, and the large value in a table.
	small(21, 40)
	writeAllOut(t, s)
	s.checkpoint(0)
	// 40 KB of small writes came after the large one: the journal keeps
	// at most the segment written and the one before, not the large
	// write's.
	if n := s.journal.pending(); n > 2 {
		t.Fatalf("the journal keeps %d segments", n)
	}
	r := openWith(t, Options{Dir: powerCut(t, m, s, cutfs.CutOptions{})})
	defer r.Close()
	if got, err := r.Entry("big", 1); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("the large value after the cut: %d of %d bytes, %v", len(got), len(big), err)
	}
	if got, err := r.Read("small", 0, 0); err != nil || len(got) != 40 {
		t.Fatalf("%d of 40 small entries after the cut, %v", len(got), err)
	}
}

// writeAllOut has Badger's tables hold every write so far, and a later
// one: groups applied together, as a backlog on a loaded machine is, hold
// the journal back until a table holds a version above theirs (see
// late.limit), so a lone write follows them into a table.
func writeAllOut(t *testing.T, s *Store) {
	t.Helper()
	for i := range 2 {
		write(t, s, func(b *Batch) {
			if err := b.Put("marker", "m", i); err != nil {
				t.Fatal(err)
			}
		})
		var got int
		if err := s.Get("marker", "m", &got); err != nil || got != i {
			t.Fatalf("marker: %d, %v", got, err)
		}
		if err := s.flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// largeValues is how many values the value-log tests write, each
// largeValue(i): 200 KiB, over the value threshold of 1 MiB memory
// tables, and together over three 1 MiB value log files.
const largeValues = 16

func largeValue(i uint64) []byte { return bytes.Repeat([]byte{byte(i)}, 200<<10) }

// storeOfLargeValues opens a store on a power-cut file system, with 1 MiB
// memory tables and value log files, and appends the large values to the
// log "big". The caller closes the store.
func storeOfLargeValues(t *testing.T) (*cutfs.FS, *Store) {
	t.Helper()
	m := onCutFS(t)
	s := openWith(t, Options{
		Dir: m.Dir(), segmentSize: 16 << 10, memTableSize: 1 << 20, vlogFileSize: 1 << 20, idleAfter: time.Hour,
	})
	for i := uint64(1); i <= largeValues; i++ {
		write(t, s, func(b *Batch) { b.Append("big", i, largeValue(i)) })
		// Each value in a Badger write of its own: Badger moves to a new
		// value log file only between writes, and the apply stage of a
		// loaded machine would gather several groups into one.
		s.awaitApplied()
	}
	return m, s
}

// expectLargeValues checks that r holds, whole, every large value i for
// which want(i).
func expectLargeValues(t *testing.T, r *Store, want func(i uint64) bool) {
	t.Helper()
	for i := uint64(1); i <= largeValues; i++ {
		if !want(i) {
			continue
		}
		if got, err := r.Entry("big", i); err != nil || !bytes.Equal(got, largeValue(i)) {
			t.Errorf("large value %d after the cut: %d of %d bytes, %v", i, len(got), len(largeValue(i)), err)
		}
	}
}

// TestPowerCutFSLargeValuesInFullValueLogFilesAreKept: a checkpoint's sync
// reaches only the value log file Badger writes to, and the journal lets
// go of values in the files before it: those must be on disk. They are
// (Badger msyncs a file as it moves on from it, in the truncate that ends
// it); this holds the store to it, with 1 MiB files and 200 KiB values.
func TestPowerCutFSLargeValuesInFullValueLogFilesAreKept(t *testing.T) {
	t.Parallel()
	m, s := storeOfLargeValues(t)
	defer s.Close()
	for i := uint64(1); i <= 20; i++ {
		write(t, s, func(b *Batch) { b.Append("small", i, bytes.Repeat([]byte{byte(i)}, 2000)) })
	}
	writeAllOut(t, s)
	s.checkpoint(0)
	if n := s.journal.pending(); n > 2 {
		t.Fatalf("the journal keeps %d segments", n)
	}
	if vlogs, err := filepath.Glob(filepath.Join(m.Dir(), "*.vlog")); err != nil || len(vlogs) < 3 {
		t.Fatalf("the test wants the values over three value log files: %q, %v", vlogs, err)
	}
	r := openWith(t, Options{Dir: powerCut(t, m, s, cutfs.CutOptions{})})
	defer r.Close()
	expectLargeValues(t, r, func(uint64) bool { return true })
}

// TestPowerCutFSValueLogCollectionKeepsTheValuesItMoves: collecting the
// value log moves a file's live values and deletes the file; a power cut
// once the deletion reached the disk (any later folder sync, here a
// checkpoint's) keeps the moved values. Badger writes them and their
// pointers unsynced and deletes the file at once: the tables kept pointing
// into the deleted file, and the values read back as errors.
func TestPowerCutFSValueLogCollectionKeepsTheValuesItMoves(t *testing.T) {
	t.Parallel()
	m, s := storeOfLargeValues(t)
	defer s.Close()
	// Their pointers in a level below the first, so that the compaction
	// below has a level to merge the deletions into: level 0 is compacted
	// once it holds enough tables.
	for i := uint64(1); !lowerLevel(s); i++ {
		if i > 100 {
			t.Fatal("level 0 was never compacted")
		}
		write(t, s, func(b *Batch) { b.Append("filler", i, []byte("x")) })
		if err := s.flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// Three of every four go: every value log file is mostly garbage.
	kept := func(i uint64) bool { return i%4 == 0 }
	for i := uint64(1); i <= largeValues; i++ {
		if !kept(i) {
			write(t, s, func(b *Batch) { b.DeleteEntry("big", i) })
		}
	}
	// Compacting the tables drops the deleted values' pointers, once
	// checkpoints let Badger discard their versions, and counts the
	// garbage in each value log file, which the collection reads.
	eventually.True(t, "Badger may discard the deleted values", func() bool { return s.discarded.Load() >= s.acked.Load() })
	if err := s.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Flatten(1); err != nil {
		t.Fatal(err)
	}
	vlogs := func() []string {
		names, err := filepath.Glob(filepath.Join(m.Dir(), "*.vlog"))
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	before := vlogs()
	if err := s.RunGC(context.Background()); err != nil {
		t.Fatal(err)
	}
	if after := vlogs(); len(after) >= len(before) {
		t.Fatalf("the collection deleted no value log file: %q, then %q", before, after)
	}
	for i := uint64(1); i <= 20; i++ {
		write(t, s, func(b *Batch) { b.Append("small", i, bytes.Repeat([]byte{byte(i)}, 2000)) })
	}
	_, _ = s.Last("small")
	s.checkpoint(s.applied.Load())
	r := openWith(t, Options{Dir: powerCut(t, m, s, cutfs.CutOptions{})})
	defer r.Close()
	expectLargeValues(t, r, kept)
}

// lowerLevel reports whether Badger has a table below level 0.
func lowerLevel(s *Store) bool {
	for _, t := range s.db.Tables() {
		if t.Level > 0 {
			return true
		}
	}
	return false
}

// TestPowerCutFSCrashLoopKeepsTheJournalSmall: a store cut off again and
// again, each time before Badger writes a table, keeps a few journal
// segments, not one more per start, and every write.
func TestPowerCutFSCrashLoopKeepsTheJournalSmall(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	seq := uint64(0)
	for range 8 {
		m := cutfs.MountForTest(t, dir, cutfs.Options{})
		// Never idle long enough to settle the journal by itself.
		s := openWith(t, Options{Dir: m.Dir(), idleAfter: time.Hour})
		eventually.True(t, "the journal keeps a few segments", func() bool { return s.journal.pending() <= maxRecycled+1 })
		for range 20 {
			seq++
			write(t, s, func(b *Batch) { b.Append("ev", seq, bytes.Repeat([]byte{1}, 2000)) })
		}
		dir = powerCut(t, m, s, cutfs.CutOptions{})
	}
	r := openWith(t, Options{Dir: dir})
	defer r.Close()
	if got, err := r.Read("ev", 0, 0); err != nil || uint64(len(got)) != seq {
		t.Fatalf("%d of %d entries after the cuts (%v)", len(got), seq, err)
	}
}

// TestPowerCutFSIdleJournalLetsGo: once writes stop, the journal moves to one small
// segment and lets go of the others, and of those kept for reuse: Badger
// syncs its memory table's log, which then holds what its tables do not.
// A power cut after that keeps everything: the journal left, Badger's
// tables and its synced log.
func TestPowerCutFSIdleJournalLetsGo(t *testing.T) {
	t.Parallel()
	m := onCutFS(t)
	dir := m.Dir()
	s := openWith(t, Options{Dir: dir, idleAfter: 100 * time.Millisecond})
	defer s.Close()
	// 2.4 MB: a few of the small segments a quiet journal starts with.
	for i := uint64(1); i <= 300; i++ {
		write(t, s, func(b *Batch) {
			b.Append("ev", i, bytes.Repeat([]byte{byte(i)}, 8<<10))
			if err := b.PutLazy("peer", fmt.Sprint(i%7), i); err != nil {
				t.Fatal(err)
			}
		})
	}
	waitIdleJournal(t, s, dir, "one small, empty segment", func(f os.DirEntry) bool {
		if !strings.HasSuffix(f.Name(), segmentExt) {
			return false
		}
		fi, err := f.Info()
		return err == nil && fi.Size() <= minSegmentSize
	})
	r := openWith(t, Options{Dir: powerCut(t, m, s, cutfs.CutOptions{})})
	defer r.Close()
	if got, err := r.Read("ev", 0, 0); err != nil || len(got) != 300 {
		t.Fatalf("%d of 300 entries after the crash (%v)", len(got), err)
	}
	for k := range 7 {
		var v uint64
		if err := r.Get("peer", fmt.Sprint(k), &v); err != nil || v%7 != uint64(k) || v < 294 {
			t.Errorf("lazy record %d after the crash: %d, %v", k, v, err)
		}
	}
}

// TestPowerCutFSRightAfterTheJournalLetsGo cuts the power the moment a
// checkpoint has let journal segments go, when Badger's files and the
// segment log alone hold their writes: under writes, Badger's tables
// (synced as they are written), the folder naming them, and its value log
// for the records too large for a table, which a checkpoint syncs; once
// idle, its memory table's log, synced by the settling checkpoint. Every
// write acknowledged before the cut is there after it: records small and
// large, log entries, deletes of both, lazy records.
func TestPowerCutFSRightAfterTheJournalLetsGo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		o    Options
		// writes is how many batches are written before waiting for the
		// release; 0 writes on until it comes.
		writes int
	}{
		// 1 MiB memory tables: a few hundred batches write tables out,
		// and records over about 150 KiB go to the value log.
		{"tables and value log, under writes", Options{segmentSize: 256 << 10, memTableSize: 1 << 20, idleAfter: time.Hour}, 0},
		// Memory tables too large to be written out: only the idle
		// journal's settling, which syncs the memory table's log, lets
		// segments go.
		{"memory table's log, idle", Options{segmentSize: 64 << 10, memTableSize: 64 << 20, idleAfter: 100 * time.Millisecond}, 60},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := onCutFS(t)
			var (
				mu      sync.Mutex
				cutting bool
				acked   = map[uint64]int{} // entry -> its size, acknowledged before the cut
				deleted = map[uint64]bool{}
				last    uint64 // the lazy record's value last acknowledged
				tried   uint64 // the last write begun
			)
			cut := make(chan struct{})
			var once sync.Once
			o := tc.o
			o.Dir = m.Dir()
			o.released = func() {
				once.Do(func() {
					mu.Lock()
					cutting = true
					seed := last
					mu.Unlock()
					if _, err := m.Cut(cutfs.CutOptions{Tear: true, Seed: seed}); err != nil {
						t.Error(err)
					}
					close(cut)
				})
			}
			s := openWith(t, o)
			defer s.Close()
			size := func(i uint64) int {
				if i%17 == 0 {
					return 200 << 10 // in the value log
				}
				return 2000 + int(i%7)*1000
			}
			data := func(i uint64) []byte { return bytes.Repeat([]byte{byte(i), byte(i >> 8)}, size(i)/2) }
			entry := func(i uint64) []byte { return fmt.Appendf(nil, "entry %d", i) }
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := uint64(1); tc.writes == 0 || i <= uint64(tc.writes); i++ {
					select {
					case <-cut:
						return
					default:
					}
					var b Batch
					if err := b.Put("rec", fmt.Sprint(i), data(i)); err != nil {
						t.Error(err)
						return
					}
					b.Append("ev", i, entry(i))
					if i%5 == 0 {
						b.Delete("rec", fmt.Sprint(i-3))
						b.DeleteEntry("ev", i-3)
					}
					if err := b.PutLazy("peer", "p", i); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					tried = i
					mu.Unlock()
					if s.Write(context.Background(), &b) != nil {
						return // the ghost, closed after the cut
					}
					mu.Lock()
					if !cutting {
						acked[i] = size(i)
						if i%5 == 0 {
							deleted[i-3] = true
						}
						last = i
					}
					mu.Unlock()
				}
			}()
			select {
			case <-cut:
			case <-time.After(60 * time.Second):
				t.Fatal("no journal segment was let go within 60 s")
			}
			<-done
			r := openWith(t, Options{Dir: powerCut(t, m, s, cutfs.CutOptions{})})
			defer r.Close()
			for i, n := range acked {
				var rec []byte
				recErr := r.Get("rec", fmt.Sprint(i), &rec)
				got, err := r.Entry("ev", i)
				// A write begun and not acknowledged before the cut may
				// or may not be there, and with it its deletes.
				mayBeDeleted := (i+3)%5 == 0 && i+3 > last && i+3 <= tried
				switch {
				case deleted[i] && (recErr == nil || err == nil):
					t.Errorf("write %d, deleted, is back: record %v, entry %v", i, recErr, err)
				case deleted[i]:
				case mayBeDeleted && errors.Is(recErr, ErrNotFound) && errors.Is(err, ErrNotFound):
				case recErr != nil || len(rec) != n || !bytes.Equal(rec, data(i)):
					t.Errorf("record %d: %d of %d bytes, %v", i, len(rec), n, recErr)
				case err != nil || !bytes.Equal(got, entry(i)):
					t.Errorf("entry %d: %q, %v", i, got, err)
				}
			}
			var p uint64
			if err := r.Get("peer", "p", &p); err != nil || p < last {
				t.Errorf("the lazy record: %d, %v; %d acknowledged", p, err, last)
			}
			t.Logf("%d writes acknowledged before the cut", len(acked))
		})
	}
}

// TestIdleJournalLetsGoOfLazyWrites: lazy writes still waiting when the
// journal goes idle are handed to Badger by the settling write, at its
// version; the journal lets go of their segments once that write is
// applied, not when it was acknowledged. Retention deleting a whole
// gateway at once left every segment since its start behind this way.
func TestIdleJournalLetsGoOfLazyWrites(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := openWith(t, Options{Dir: dir, idleAfter: 100 * time.Millisecond, lazyInterval: time.Hour})
	defer s.Close()
	for i := range 40 {
		write(t, s, func(b *Batch) {
			b.Append("ev", uint64(i+1), bytes.Repeat([]byte{byte(i)}, 32<<10))
			for k := range 1000 {
				if err := b.PutLazy("peer", fmt.Sprint(i*1000+k), i); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	waitIdleJournal(t, s, dir, "one segment", func(os.DirEntry) bool { return true })
}

// waitIdleJournal checks that the writes so far filled several journal
// segments, then waits for the idle journal of s, open in dir, to be down
// to one file that ok accepts; what names that state.
func waitIdleJournal(t *testing.T, s *Store, dir, what string, ok func(os.DirEntry) bool) {
	t.Helper()
	if s.journal.pending() < 2 {
		t.Fatal("the test wants several segments")
	}
	journal := filepath.Join(dir, "journal")
	eventually.True(t, "the idle journal holds "+what, func() bool {
		files, _ := os.ReadDir(journal)
		return len(files) == 1 && ok(files[0])
	})
}

// TestIdleStoreWritesItsMemoryTableOut: a store gone idle after more than
// idleFlushBytes of writes has Badger write its memory table out, so that
// the folder holds a table instead of the table's log.
func TestIdleStoreWritesItsMemoryTableOut(t *testing.T) {
	t.Parallel()
	s := openWith(t, Options{Dir: t.TempDir(), idleAfter: 100 * time.Millisecond})
	defer s.Close()
	const n = 80 // 1.25 MiB, far from filling a memory table
	for i := range n {
		write(t, s, func(b *Batch) { b.Append("ev", uint64(i+1), bytes.Repeat([]byte{byte(i)}, 16<<10)) })
	}
	eventually.True(t, "Badger has a table", func() bool { return len(s.db.Tables()) > 0 })
	if got, err := s.Read("ev", 0, 0); err != nil || len(got) != n {
		t.Fatalf("%d of %d entries (%v)", len(got), n, err)
	}
}

// TestPowerCutFSReplaySkipsWhatBadgerHolds: after a crash that spared Badger's logs
// (a killed process: the page cache keeps them), the journal's replay
// writes nothing Badger already holds, where it used to write everything
// again as tables of duplicates; after a power cut that lost them, it
// writes everything. Either way, every write is there.
func TestPowerCutFSReplaySkipsWhatBadgerHolds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		cut       cutfs.CutOptions
		maxWrites int
	}{
		{"killed: Badger's logs kept", cutfs.CutOptions{KeepPageCache: true}, 0},
		{"power cut: Badger's logs lost", cutfs.CutOptions{}, 1 << 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := onCutFS(t)
			// Idle, the store would sync Badger's logs, which a power cut
			// then keeps.
			s := openWith(t, Options{Dir: m.Dir(), idleAfter: time.Hour})
			defer s.Close()
			for i := uint64(1); i <= 300; i++ {
				write(t, s, func(b *Batch) {
					b.Append("ev", i, bytes.Repeat([]byte{byte(i)}, 500))
					if err := b.PutLazy("peer", "p", i); err != nil {
						t.Fatal(err)
					}
					if i%3 == 0 {
						b.DeleteEntry("ev", i-1)
					}
				})
			}
			if err := s.settle("r/peer"); err != nil { // hands the lazy writes over
				t.Fatal(err)
			}
			s.awaitApplied() // and Badger has them
			var p uint64
			r := openWith(t, Options{Dir: powerCut(t, m, s, tc.cut)})
			defer r.Close()
			if r.replayed.applied > tc.maxWrites || !tc.cut.KeepPageCache && r.replayed.applied < 600 {
				t.Errorf("replay wrote %d writes and skipped %d", r.replayed.applied, r.replayed.skipped)
			}
			got, err := r.Read("ev", 0, 0)
			if err != nil || len(got) != 200 {
				t.Fatalf("%d of 200 entries (%v)", len(got), err)
			}
			if err := r.Get("peer", "p", &p); err != nil || p != 300 {
				t.Errorf("lazy record: %d, %v", p, err)
			}
		})
	}
}

// TestStatsShowBadgersLevelZero: the store reports the tables in Badger's
// level 0 against the count at which its writes wait, and the bytes of its
// tables, which the metrics export.
func TestStatsShowBadgersLevelZero(t *testing.T) {
	t.Parallel()
	s := openWith(t, Options{Dir: t.TempDir(), MemoryLimit: 256 * mib, idleAfter: time.Hour})
	defer s.Close()
	if st := s.Stats(); st.Level0Tables != 0 || st.TableBytes != 0 || st.Level0Stall < 2 || st.Level0Stall > 3 {
		t.Fatalf("empty store: %d tables in level 0 (stall at %d), %d bytes of tables", st.Level0Tables, st.Level0Stall, st.TableBytes)
	}
	for i := range 80 { // 1.25 MiB: Badger writes its memory table (1 MiB under this limit) out
		write(t, s, func(b *Batch) {
			if err := b.Put("rec", strconv.Itoa(i), bytes.Repeat([]byte{byte(i)}, 16<<10)); err != nil {
				t.Fatal(err)
			}
		})
	}
	eventually.True(t, "a table in level 0", func() bool {
		st := s.Stats()
		return st.Level0Tables == 1 && st.TableBytes > 0
	})
}

// TestPowerCutFSBatchLosesOnlyTheLastInterval: under SyncBatch, at its
// documented default interval, a power cut in the middle of concurrent
// writes, the last journal write torn at a page boundary, loses only
// writes acknowledged within that interval before the cut, give or take
// batchMargin, and nothing half-written: of each writer, what survives is
// every batch up to some point, each whole (three log entries of several
// pages each and a record, all or none), none torn, none missing before it.
func TestPowerCutFSBatchLosesOnlyTheLastInterval(t *testing.T) {
	t.Parallel()
	// The window docs/operations.md gives --sync batch.
	const documented = 10 * time.Millisecond
	// batchMargin is what the window may stretch beyond the interval: the
	// sync's own time (an fdatasync through the FUSE server) and a loaded
	// machine's scheduling of the commit loop, which a tick may find
	// journaling a group. The test logs what each cut lost: the oldest
	// loss was 9 ms in 24 cuts under the race detector on the 2-core
	// development machine at a load average of 9.
	const batchMargin = 40 * time.Millisecond
	const writers = 4
	logs := [...]string{"a", "b", "c"}
	entry := func(w int, i uint64, log string) []byte {
		return append(fmt.Appendf(nil, "%d/%d/%s:", w, i, log), bytes.Repeat([]byte{byte(i)}, 9000)...)
	}
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			m := onCutFS(t)
			s := openWith(t, Options{Dir: m.Dir(), Sync: SyncBatch})
			defer s.Close()
			if s.opts.SyncInterval != documented {
				t.Fatalf("the default sync interval is %v; docs/operations.md says %v", s.opts.SyncInterval, documented)
			}
			var acked [writers][]time.Time // acked[w][i-1]: when writer w's batch i was acknowledged
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for w := range writers {
				wg.Go(func() {
					for i := uint64(1); ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						var b Batch
						for _, log := range logs {
							b.Append(fmt.Sprint(w, log), i, entry(w, i, log))
						}
						if err := b.Put("last", fmt.Sprint(w), i); err != nil {
							t.Error(err)
							return
						}
						if s.Write(context.Background(), &b) != nil {
							return // the ghost, closed after the cut
						}
						acked[w] = append(acked[w], time.Now())
					}
				})
			}
			// A moment some way into the writes, different for each seed.
			eventually.True(t, "writes under way", func() bool { return s.acked.Load() > 20*(seed+1) })
			cut := time.Now()
			if _, err := m.Cut(cutfs.CutOptions{Tear: true, Seed: seed}); err != nil {
				t.Fatal(err)
			}
			close(stop)
			wg.Wait()
			r := openWith(t, Options{Dir: powerCut(t, m, s, cutfs.CutOptions{})})
			defer r.Close()
			var oldest time.Duration // the oldest acknowledgement lost, before the cut
			lost, total := 0, 0
			for w := range writers {
				var kept uint64 // the batches of w that survived: 1..kept
				for i, log := range logs {
					got, err := r.Read(fmt.Sprint(w, log), 0, 0)
					if err != nil {
						t.Fatal(err)
					}
					for j, e := range got {
						if e.Seq != uint64(j+1) || !bytes.Equal(e.Data, entry(w, e.Seq, log)) {
							t.Fatalf("writer %d, log %s, entry %d after the cut: sequence %d, %d bytes: not the prefix written", w, log, j+1, e.Seq, len(e.Data))
						}
					}
					if i > 0 && uint64(len(got)) != kept {
						t.Fatalf("writer %d: %d entries of one log and %d of another survived: a batch was half written", w, kept, len(got))
					}
					kept = uint64(len(got))
				}
				var last uint64
				if err := r.Get("last", fmt.Sprint(w), &last); err != nil && !errors.Is(err, ErrNotFound) {
					t.Fatal(err)
				}
				if last != kept {
					t.Fatalf("writer %d: %d batches' entries survived, and its record says %d: a batch was half written", w, kept, last)
				}
				for i, at := range acked[w] {
					if !at.Before(cut) {
						break
					}
					total++
					if uint64(i) < kept {
						continue
					}
					lost++
					oldest = max(oldest, cut.Sub(at))
					if cut.Sub(at) > documented+batchMargin {
						t.Errorf("writer %d: batch %d, acknowledged %v before the cut, is lost", w, i+1, cut.Sub(at))
					}
				}
			}
			t.Logf("%d of %d batches acknowledged before the cut were lost, the oldest acknowledged %v before it", lost, total, oldest)
		})
	}
}
