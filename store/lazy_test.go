package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/store/cutfs"
)

// TestLazyWritesReadBack: reads see lazy writes at once, deletes included,
// through every read method.
func TestLazyWritesReadBack(t *testing.T) {
	s := open(t, t.TempDir(), SyncAlways)
	defer s.Close()
	write(t, s, func(b *Batch) {
		b.AppendLazy("o", 1, []byte("one"))
		b.AppendLazy("o", 2, []byte("two"))
		if err := b.PutLazy("peer", "a", 1); err != nil {
			t.Fatal(err)
		}
	})
	write(t, s, func(b *Batch) { b.DeleteEntryLazy("o", 1) })
	if got, err := s.Read("o", 0, 0); err != nil || len(got) != 1 || string(got[0].Data) != "two" {
		t.Fatalf("Read = %+v, %v", got, err)
	}
	if data, err := s.Entry("o", 2); err != nil || string(data) != "two" {
		t.Fatalf("Entry = %q, %v", data, err)
	}
	if last, err := s.Last("o"); err != nil || last != 2 {
		t.Fatalf("Last = %d, %v", last, err)
	}
	var v int
	if err := s.Get("peer", "a", &v); err != nil || v != 1 {
		t.Fatalf("Get = %d, %v", v, err)
	}
	write(t, s, func(b *Batch) { b.DeleteLazy("peer", "a") })
	n := 0
	if err := s.Records("peer", func(string, func(any) error) bool { n++; return true }); err != nil || n != 0 {
		t.Fatalf("Records saw %d deleted records, %v", n, err)
	}
}

// TestLazyDeletedNeverReachesBadger: an entry appended, or a record
// created, and deleted before Badger got it leaves no trace there, not even
// a delete marker; a record put, which Badger may hold from before, leaves
// the marker.
func TestLazyDeletedNeverReachesBadger(t *testing.T) {
	s := open(t, t.TempDir(), SyncAlways)
	defer s.Close()
	write(t, s, func(b *Batch) {
		b.AppendLazy("o", 1, []byte("gone"))
		b.AppendLazy("o", 2, []byte("kept"))
		if err := b.CreateLazy("live", "c", true); err != nil {
			t.Fatal(err)
		}
		if err := b.PutLazy("live", "p", true); err != nil {
			t.Fatal(err)
		}
	})
	write(t, s, func(b *Batch) {
		b.DeleteEntryLazy("o", 1)
		b.DeleteLazy("live", "c")
		b.DeleteLazy("live", "p")
	})
	if err := s.flush(context.Background()); err != nil { // hands the waiting writes over
		t.Fatal(err)
	}
	versions := map[string]int{}
	txn := s.db.NewTransactionAt(s.applied.Load(), false)
	defer txn.Discard()
	it := txn.NewIterator(badger.IteratorOptions{AllVersions: true})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		versions[string(it.Item().Key())]++
	}
	for key, want := range map[string]int{
		string(logKey("o", 1)):         0,
		string(logKey("o", 2)):         1,
		string(recordKey("live", "c")): 0,
		string(recordKey("live", "p")): 1,
	} {
		if versions[key] != want {
			t.Errorf("Badger holds %d versions of %q, want %d", versions[key], key, want)
		}
	}
}

// TestPowerCutFSLazyWritesSurvive: the journal keeps lazy writes until
// Badger's synced tables hold them, however many tables Badger writes
// meanwhile: while they wait, and once handed over, until a table holds
// them. A power cut keeps what was synced: the journal and Badger's
// tables, not its memory tables.
func TestPowerCutFSLazyWritesSurvive(t *testing.T) {
	t.Parallel()
	for _, inTable := range []bool{false, true} {
		name := "handed over"
		if inTable {
			name = "in a table"
		}
		t.Run(name, func(t *testing.T) { testLazyWritesSurviveACrash(t, inTable) })
	}
}

// testLazyWritesSurviveACrash cuts the power once the lazy writes are
// handed over to Badger's memory table, or, with inTable, once a table
// holds them and the journal let them go.
func testLazyWritesSurviveACrash(t *testing.T, inTable bool) {
	m := onCutFS(t)
	// Lazy writes wait until a read hands them over.
	s := openWith(t, Options{Dir: m.Dir(), segmentSize: 256 << 10, memTableSize: 2 << 20, lazyInterval: time.Hour, idleAfter: time.Hour})
	defer s.Close()
	write(t, s, func(b *Batch) {
		b.AppendLazy("o", 1, []byte("lazy entry"))
		if err := b.PutLazy("peer", "a", "lazy record"); err != nil {
			t.Fatal(err)
		}
	})
	// Eager writes fill memory tables, which Badger writes out as tables,
	// and checkpoints release the journal segments those tables cover.
	seq := uint64(0)
	fill := func(n int) {
		for i := 0; i < n; i += 20 {
			write(t, s, func(b *Batch) {
				for range 20 {
					seq++
					b.Append("ev", seq, bytes.Repeat([]byte{1}, 1000))
				}
			})
		}
	}
	first := s.journal.path(1) // the segment holding the lazy writes
	released := func() bool {
		s.checkpoint(s.applied.Load())
		_, err := os.Stat(first)
		return errors.Is(err, os.ErrNotExist)
	}
	fill(5000)
	eventually.True(t, "Badger writes a table", func() bool { return len(s.db.Tables()) > 0 })
	if released() {
		t.Fatal("the lazy writes' segment went while they wait")
	}
	// A read hands them over, into the memory table being filled: the
	// segment must stay until a table holds them.
	if _, err := s.Entry("o", 1); err != nil {
		t.Fatal(err)
	}
	if released() {
		t.Fatal("the lazy writes' segment went while only a memory table holds them")
	}
	if inTable {
		// Once Badger's tables hold them, their segment goes.
		fill(5000)
		eventually.True(t, "the lazy writes' segment is released", released)
	}
	r := openWith(t, Options{Dir: powerCut(t, m, s, cutfs.CutOptions{})})
	defer r.Close()
	if data, err := r.Entry("o", 1); err != nil || string(data) != "lazy entry" {
		t.Errorf("lazy entry after the cut: %q, %v", data, err)
	}
	var v string
	if err := r.Get("peer", "a", &v); err != nil || v != "lazy record" {
		t.Errorf("lazy record after the cut: %q, %v", v, err)
	}
	if got, err := r.Read("ev", 0, 0); err != nil || uint64(len(got)) != seq {
		t.Errorf("%d of %d eager entries after the cut, %v", len(got), seq, err)
	}
}

// onCutFS mounts a power-cut file system over a fresh folder, for a
// store's data folder, until the test ends.
func onCutFS(t *testing.T) *cutfs.FS {
	t.Helper()
	return cutfs.MountForTest(t, t.TempDir(), cutfs.Options{})
}

// powerCut cuts the power under s, open on m, and returns its data folder
// as the disk holds it once the power is back. s is closed after the cut,
// a ghost whose every write is lost, so that m can be unmounted.
func powerCut(t *testing.T, m *cutfs.FS, s *Store, o cutfs.CutOptions) string {
	t.Helper()
	if _, err := m.Cut(o); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	return m.Backing()
}

// journalOnly removes from the data folder dir everything but the
// journal, as if Badger's files were all lost, and returns dir.
func journalOnly(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == "journal" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestLazyAllCancelledFreesTheJournal: once every waiting write cancelled
// out, nothing holds the journal back.
func TestLazyAllCancelledFreesTheJournal(t *testing.T) {
	var l lazyWrites
	l.keep(7, op{key: []byte("l/o\x00a"), val: []byte("v"), lazy: true, fresh: true}, time.Now())
	l.keep(8, op{key: []byte("l/o\x00a"), del: true, lazy: true}, time.Now())
	if l.oldestWaiting() != 0 || l.waiting(logSpace("o")) {
		t.Fatalf("after a cancelled pair: oldest %d, waiting %v", l.oldestWaiting(), l.waiting(logSpace("o")))
	}
}

// TestLazyCloseHandsEverythingOver: a clean close gives Badger the lazy
// writes still waiting, so the journal can go.
func TestLazyCloseHandsEverythingOver(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, SyncAlways)
	write(t, s, func(b *Batch) { b.AppendLazy("o", 1, []byte("x")) })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(filepath.Join(dir, "journal")); len(left) != 0 {
		t.Fatalf("a clean close left %d journal files", len(left))
	}
	r := open(t, dir, SyncAlways)
	defer r.Close()
	if data, err := r.Entry("o", 1); err != nil || string(data) != "x" {
		t.Fatalf("after reopen: %q, %v", data, err)
	}
}

// TestReleasable: the journal keeps every group whose writes Badger's
// tables may not hold: lazy writes waiting, and writes applied at a later
// version than their group's until a table holds that version.
func TestReleasable(t *testing.T) {
	for _, tc := range []struct {
		name       string
		lazyOldest uint64
		late       []lateWrite
		durable    uint64
		want       uint64
		left       int
	}{
		{name: "nothing durable", durable: 0, want: 0},
		{name: "every version below the newest in a table", durable: 10, want: 9},
		{name: "a lazy write waiting", lazyOldest: 5, durable: 10, want: 4},
		{name: "applied later, not in a table", late: []lateWrite{{from: 3, at: 12}}, durable: 10, want: 2, left: 1},
		{name: "applied at the newest version in a table", late: []lateWrite{{from: 3, at: 10}}, durable: 10, want: 2, left: 1},
		{name: "applied later, in a table", late: []lateWrite{{from: 3, at: 8}}, durable: 10, want: 9},
		{name: "older in a table, newer not", late: []lateWrite{{from: 3, at: 8}, {from: 9, at: 15}}, lazyOldest: 16, durable: 10, want: 8, left: 1},
		{name: "a lazy handover older than groups applied together", late: []lateWrite{{from: 7, at: 11}, {from: 2, at: 12}}, durable: 10, want: 1, left: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Store{lazy: lazyWrites{oldest: tc.lazyOldest}, late: late{list: tc.late}}
			if got := s.releasable(tc.durable); got != tc.want || len(s.late.list) != tc.left {
				t.Fatalf("releasable(%d) = %d with %d late writes left; want %d with %d", tc.durable, got, len(s.late.list), tc.want, tc.left)
			}
		})
	}
}

// TestGroupsAppliedTogetherAreLate: groups applied in one transaction are
// recorded as applied at the newest one's version.
func TestGroupsAppliedTogetherAreLate(t *testing.T) {
	s := open(t, t.TempDir(), SyncAlways)
	defer s.Close()
	groups := []*group{{ops: []op{{key: []byte("r/k\x00a"), val: []byte("1")}}}, {ops: []op{{key: []byte("r/k\x00b"), val: []byte("2")}}}}
	for _, g := range groups {
		g.ts = s.next
		s.next++
	}
	if err := s.applyGroups(groups); err != nil {
		t.Fatal(err)
	}
	if got := s.late.limit(groups[1].ts); got != groups[0].ts-1 {
		t.Fatalf("with tables up to the newest group's version, releasable up to %d; want %d", got, groups[0].ts-1)
	}
	if got := s.late.limit(groups[1].ts + 1); got != groups[1].ts {
		t.Fatalf("with tables past it, releasable up to %d; want %d", got, groups[1].ts)
	}
}

// TestRecordReadsSeeLazyWritesWithoutHandingThemOver: Get and every walk of
// records merge the lazy writes waiting with what Badger holds, in key
// order, with the walks' bounds, without a group that hands them over: the
// journal takes no write for a read.
func TestRecordReadsSeeLazyWritesWithoutHandingThemOver(t *testing.T) {
	s := openWith(t, Options{Dir: t.TempDir(), lazyInterval: time.Hour, idleAfter: time.Hour})
	defer s.Close()
	put := func(b *Batch, create bool, id string, v int) {
		f := b.PutLazy
		if create {
			f = b.CreateLazy
		}
		if err := f("k", id, v); err != nil {
			t.Fatal(err)
		}
	}
	write(t, s, func(b *Batch) {
		for i, id := range []string{"a", "c", "e", "g"} {
			put(b, true, id, i+1)
		}
	})
	if err := s.flush(context.Background()); err != nil { // into Badger
		t.Fatal(err)
	}
	write(t, s, func(b *Batch) {
		put(b, false, "b", 20)
		put(b, false, "c", 30)
		b.DeleteLazy("k", "e")
		put(b, true, "h", 80)
	})
	commits := s.Stats().Commits

	walk := func(f func(fn func(id string, decode func(any) error) bool) error, stopAfter int) string {
		var got []string
		err := f(func(id string, decode func(any) error) bool {
			var v int
			if err := decode(&v); err != nil {
				t.Fatalf("decode %s: %v", id, err)
			}
			got = append(got, fmt.Sprintf("%s=%d", id, v))
			return len(got) != stopAfter
		})
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(got, " ")
	}
	for _, tc := range []struct {
		name string
		walk func(fn func(id string, decode func(any) error) bool) error
		stop int
		want string
	}{
		{"all", func(fn func(string, func(any) error) bool) error { return s.Records("k", fn) }, 0, "a=1 b=20 c=30 g=4 h=80"},
		{"after a key in Badger", func(fn func(string, func(any) error) bool) error { return s.RecordsAfter("k", "a", fn) }, 0, "b=20 c=30 g=4 h=80"},
		{"after a key waiting", func(fn func(string, func(any) error) bool) error { return s.RecordsAfter("k", "c", fn) }, 0, "g=4 h=80"},
		{"after a deleted key", func(fn func(string, func(any) error) bool) error { return s.RecordsAfter("k", "e", fn) }, 0, "g=4 h=80"},
		{"with a prefix", func(fn func(string, func(any) error) bool) error { return s.RecordsWithPrefix("k", "c", fn) }, 0, "c=30"},
		{"stopped", func(fn func(string, func(any) error) bool) error { return s.Records("k", fn) }, 3, "a=1 b=20 c=30"},
	} {
		if got := walk(tc.walk, tc.stop); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	for id, want := range map[string]int{"a": 1, "b": 20, "c": 30, "e": -1, "h": 80} {
		var v int
		err := s.Get("k", id, &v)
		switch {
		case want < 0 && !errors.Is(err, ErrNotFound):
			t.Errorf("Get %s (deleted) = %d, %v", id, v, err)
		case want >= 0 && (err != nil || v != want):
			t.Errorf("Get %s = %d, %v; want %d", id, v, err, want)
		}
	}
	if got := s.Stats().Commits; got != commits {
		t.Errorf("the reads committed %d groups", got-commits)
	}
	if !s.lazy.waiting("r/k") {
		t.Error("the reads handed the lazy writes over")
	}
}

// TestRecordReadDuringAHandOverSeesTheWrite: a lazy write on its way into
// Badger (taken from the waiting ones, not yet committed there) is still
// found by a read.
func TestRecordReadDuringAHandOverSeesTheWrite(t *testing.T) {
	var armed atomic.Bool
	type result struct {
		v   int
		err error
	}
	seen := make(chan result, 1)
	var s *Store
	s = openWith(t, Options{
		Dir: t.TempDir(), lazyInterval: time.Hour, idleAfter: time.Hour,
		committing: func(uint64) {
			if !armed.CompareAndSwap(true, false) {
				return
			}
			// Another goroutine, as a reader would be; the apply stage
			// waits for it, bounded, so that a read that waited for this
			// hand-over fails rather than hangs.
			done := make(chan result, 1)
			go func() {
				var r result
				r.err = s.Get("k", "a", &r.v)
				done <- r
			}()
			select {
			case r := <-done:
				seen <- r
			case <-time.After(5 * time.Second):
				seen <- result{err: errors.New("the read waited for the hand-over")}
			}
		},
	})
	defer s.Close()
	write(t, s, func(b *Batch) {
		if err := b.CreateLazy("k", "a", 7); err != nil {
			t.Fatal(err)
		}
	})
	armed.Store(true)
	if err := s.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := <-seen; r.err != nil || r.v != 7 {
		t.Fatalf("read during the hand-over: %d, %v", r.v, r.err)
	}
}

// BenchmarkRecordWalkWithLazyWritesWaiting: a narrow walk of records (one
// execution's keyed answers, as retention makes for each execution it
// deletes) while a full second of lazy writes of the same kind waits, and
// the same walk with none waiting.
func BenchmarkRecordWalkWithLazyWritesWaiting(b *testing.B) {
	for _, waiting := range []int{0, 40000} {
		b.Run(fmt.Sprintf("waiting=%d", waiting), func(b *testing.B) {
			s := openWith(b, Options{Dir: b.TempDir(), Sync: SyncNone, lazyInterval: time.Hour, idleAfter: time.Hour})
			defer s.Close()
			for i := 0; i < waiting; i += 1000 {
				var batch Batch
				for j := i; j < i+1000; j++ {
					if err := batch.CreateLazy("x", fmt.Sprintf("%08d/k/%d/key", j, j), j); err != nil {
						b.Fatal(err)
					}
				}
				if err := s.Write(context.Background(), &batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if err := s.RecordsWithPrefix("x", fmt.Sprintf("%08d/k/%d/", i%1000+1<<20, i), func(string, func(any) error) bool { return true }); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestLazyBetweenMergesWaitingAndLanding: a walk's range of the lazy
// writes holds those waiting and those being handed over, in key order,
// a key's waiting write hiding its landing one, within the prefix and from
// the start key on.
func TestLazyBetweenMergesWaitingAndLanding(t *testing.T) {
	var l lazyWrites
	var lt late
	put := func(ts uint64, id, val string) {
		l.keep(ts, op{key: recordKey("k", id), val: []byte(val), lazy: true}, time.Now())
	}
	put(1, "a", "a1")
	put(1, "c", "c1")
	put(1, "e", "e1")
	l.keep(1, op{key: logKey("o", 1), val: []byte("log"), lazy: true}, time.Now())
	if taken := l.take(nil, 2, &lt); len(taken) != 4 {
		t.Fatalf("took %d writes, want 4", len(taken))
	}
	put(3, "b", "b3")
	put(3, "c", "c3")
	l.keep(3, op{key: recordKey("k", "d"), del: true, lazy: true}, time.Now())
	put(3, "f", "f3")
	l.keep(3, op{key: recordKey("other", "a"), val: []byte("x"), lazy: true}, time.Now())

	show := func(ops []op) string {
		var parts []string
		for _, o := range ops {
			v := string(o.val)
			if o.del {
				v = "deleted"
			}
			parts = append(parts, string(o.key[len(recordPrefix("k")):])+"="+v)
		}
		return strings.Join(parts, " ")
	}
	for _, tc := range []struct{ prefix, start, want string }{
		{"", "", "a=a1 b=b3 c=c3 d=deleted e=e1 f=f3"},
		{"", "c", "c=c3 d=deleted e=e1 f=f3"},
		{"c", "c", "c=c3"},
		{"e", "e", "e=e1"},
		{"z", "z", ""},
	} {
		got := show(l.between(recordKey("k", tc.prefix), recordKey("k", tc.start)))
		if got != tc.want {
			t.Errorf("between(%q, %q) = %q, want %q", tc.prefix, tc.start, got, tc.want)
		}
	}
	l.landed()
	if got := show(l.between(recordKey("k", ""), recordKey("k", ""))); got != "b=b3 c=c3 d=deleted f=f3" {
		t.Errorf("after the hand-over landed: %q", got)
	}
}

// BenchmarkLazyKeep: the apply stage's keep for one execution's lazy
// writes as the kernel makes them (index and list entries created, the
// entry rewritten, two keyed answers, a live marker created and
// cancelled), handed over every 1,500 executions.
func BenchmarkLazyKeep(b *testing.B) {
	var l lazyWrites
	var lt late
	now := time.Now()
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("%016x/%036d", 1<<40-i, i)
		ts := uint64(i + 1)
		l.keep(ts, op{key: recordKey("x", id+"/i"), val: []byte("v"), lazy: true, fresh: true}, now)
		l.keep(ts, op{key: recordKey("x", id+"/s"), val: []byte("v"), lazy: true, fresh: true}, now)
		l.keep(ts, op{key: recordKey("x", id+"/s"), val: []byte("v2"), lazy: true}, now)
		l.keep(ts, op{key: recordKey("x", id+"/k1"), val: []byte("v"), lazy: true}, now)
		l.keep(ts, op{key: recordKey("x", id+"/k2"), val: []byte("v"), lazy: true}, now)
		l.keep(ts, op{key: recordKey("live", id), val: []byte("v"), lazy: true, fresh: true}, now)
		l.keep(ts, op{key: recordKey("live", id), del: true, lazy: true}, now)
		if i%1500 == 0 {
			l.take(nil, ts+1, &lt)
			l.landed()
		}
	}
}
