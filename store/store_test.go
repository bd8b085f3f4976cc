package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/gatehouse-dev/gatehouse/store/cutfs"
)

// TestMain lets the test binary serve the power-cut file systems the
// tests mount (see cutfs.Main).
func TestMain(m *testing.M) {
	cutfs.Main()
	os.Exit(m.Run())
}

// open opens a store in dir that syncs as mode says.
func open(t *testing.T, dir string, mode SyncMode) *Store {
	t.Helper()
	return openWith(t, Options{Dir: dir, Sync: mode})
}

// openWith opens a store with o, failing the test if it does not open. The
// caller closes it: tests that crash or restart a store choose when.
func openWith(tb testing.TB, o Options) *Store {
	tb.Helper()
	s, err := Open(o)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func TestParseSyncMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want SyncMode
		err  bool
	}{{"always", SyncAlways, false}, {"", SyncAlways, false}, {"batch", SyncBatch, false}, {"none", SyncNone, false}, {"sometimes", 0, true}} {
		got, err := ParseSyncMode(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseSyncMode(%q) = %v, %v", tc.in, got, err)
		}
		if err == nil && tc.in != "" && got.String() != tc.in {
			t.Errorf("String() = %q, want %q", got.String(), tc.in)
		}
	}
}

func TestLogsAndRecordsSurviveReopen(t *testing.T) {
	for _, mode := range []SyncMode{SyncAlways, SyncBatch, SyncNone} {
		t.Run(mode.String(), func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, mode)
			epoch := s.Epoch()
			var b Batch
			for i := uint64(1); i <= 5; i++ {
				b.Append("x/a", i, []byte(fmt.Sprint("event-", i)))
			}
			b.Append("x/b", 1, []byte("other stream"))
			if err := b.Put("kind", "id1", map[string]int{"n": 1}); err != nil {
				t.Fatal(err)
			}
			if err := s.Write(context.Background(), &b); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = open(t, dir, mode)
			defer s.Close()
			if s.Epoch() != epoch {
				t.Fatalf("epoch changed on reopen: %s -> %s", epoch, s.Epoch())
			}
			got, err := s.Read("x/a", 2, 2)
			if err != nil || len(got) != 2 || got[0].Seq != 3 || string(got[1].Data) != "event-4" {
				t.Fatalf("Read after 2, limit 2: %+v, %v", got, err)
			}
			if last, _ := s.Last("x/a"); last != 5 {
				t.Fatalf("Last = %d", last)
			}
			if first, _ := s.First("x/a"); first != 1 {
				t.Fatalf("First = %d", first)
			}
			if last, _ := s.Last("x/none"); last != 0 {
				t.Fatalf("Last of empty = %d", last)
			}
			var rec map[string]int
			if err := s.Get("kind", "id1", &rec); err != nil || rec["n"] != 1 {
				t.Fatalf("Get: %v %v", rec, err)
			}
			if err := s.Get("kind", "missing", &rec); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Get missing: %v", err)
			}
			if _, err := s.Entry("x/a", 9); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Entry missing: %v", err)
			}
		})
	}
}

func TestFreshFolderGetsNewEpoch(t *testing.T) {
	a := open(t, t.TempDir(), SyncAlways)
	defer a.Close()
	b := open(t, t.TempDir(), SyncAlways)
	defer b.Close()
	if a.Epoch() == b.Epoch() {
		t.Fatal("two fresh folders share an epoch")
	}
}

func TestSyncBucket(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int
	}{
		{0, 0},
		{time.Microsecond, 0},
		{64 * time.Microsecond, 0},
		{64*time.Microsecond + 1, 1},
		{128 * time.Microsecond, 1},
		{128*time.Microsecond + 1, 2},
		{time.Millisecond, 4}, // at most 1,024 µs
		{SyncBucketBound(SyncBuckets - 1), SyncBuckets - 1},
		{SyncBucketBound(SyncBuckets-1) + 1, SyncBuckets},
		{time.Hour, SyncBuckets},
	} {
		got := syncBucket(c.d)
		if got != c.want {
			t.Errorf("syncBucket(%v) = %d, want %d", c.d, got, c.want)
		}
		if got < SyncBuckets && c.d > SyncBucketBound(got) || got > 0 && c.d <= SyncBucketBound(got-1) {
			t.Errorf("%v in bucket %d, outside (%v, %v]", c.d, got, SyncBucketBound(max(got-1, 0)), SyncBucketBound(got))
		}
	}
}

// TestGroupCommitSharesSyncs checks that concurrent writers are batched:
// far fewer fsyncs than writes, and every write is readable after.
func TestGroupCommitSharesSyncs(t *testing.T) {
	s := open(t, t.TempDir(), SyncAlways)
	defer s.Close()
	before := s.Stats() // the epoch's write
	const writers, each = 32, 50
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				var b Batch
				b.Append(fmt.Sprintf("w/%d", w), uint64(i+1), []byte("x"))
				if err := s.Write(context.Background(), &b); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	st := s.Stats()
	st.Writes -= before.Writes
	st.Syncs -= before.Syncs
	if st.Writes != writers*each {
		t.Fatalf("writes = %d", st.Writes)
	}
	if st.Syncs >= st.Writes {
		t.Fatalf("no group commit: %d syncs for %d writes", st.Syncs, st.Writes)
	}
	if st.SyncTime <= before.SyncTime {
		t.Fatalf("%d durable writes took no time: %v", st.Syncs, st.SyncTime)
	}
	var counted uint64
	for i, n := range st.SyncLatency {
		counted += n - before.SyncLatency[i]
	}
	if counted != st.Syncs {
		t.Fatalf("the sync latencies count %d syncs of %d: %v", counted, st.Syncs, st.SyncLatency)
	}
	for w := range writers {
		if last, _ := s.Last(fmt.Sprintf("w/%d", w)); last != each {
			t.Fatalf("writer %d: last = %d", w, last)
		}
	}
	t.Logf("%d writes in %d commits with %d fsyncs", st.Writes, st.Commits, st.Syncs)
}

func TestRecordsIterationAndDelete(t *testing.T) {
	s := openWith(t, Options{InMemory: true})
	defer s.Close()
	var b Batch
	for _, id := range []string{"b", "a", "c"} {
		if err := b.Put("k", id, id); err != nil {
			t.Fatal(err)
		}
	}
	_ = b.Put("other", "z", "z")
	if err := s.Write(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	var del Batch
	del.Delete("k", "b")
	if err := s.Write(context.Background(), &del); err != nil {
		t.Fatal(err)
	}
	var ids []string
	err := s.Records("k", func(id string, decode func(any) error) bool {
		var v string
		if err := decode(&v); err != nil || v != id {
			t.Fatalf("decode %s: %q %v", id, v, err)
		}
		ids = append(ids, id)
		return true
	})
	if err != nil || fmt.Sprint(ids) != "[a c]" {
		t.Fatalf("Records = %v, %v", ids, err)
	}
}

func TestClosedStoreRefusesWrites(t *testing.T) {
	s := open(t, t.TempDir(), SyncAlways)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var b Batch
	b.Append("x", 1, nil)
	if err := s.Write(context.Background(), &b); !errors.Is(err, ErrClosed) {
		t.Fatalf("Write after Close: %v", err)
	}
	if err := s.Ping(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Ping after Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestEmptyBatchIsNoop(t *testing.T) {
	s := openWith(t, Options{InMemory: true})
	defer s.Close()
	before := s.Stats().Commits
	if err := s.Write(context.Background(), &Batch{}); err != nil {
		t.Fatal(err)
	}
	if s.Stats().Commits != before {
		t.Fatal("empty batch committed")
	}
}

func TestOpenNeedsDir(t *testing.T) {
	if _, err := Open(Options{}); err == nil {
		t.Fatal("Open without Dir or InMemory succeeded")
	}
}

func BenchmarkWriteParallel(b *testing.B) {
	s := openWith(b, Options{Dir: b.TempDir(), Sync: SyncAlways})
	defer s.Close()
	payload := make([]byte, 300)
	var n sync.Mutex
	seq := uint64(0)
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n.Lock()
			seq++
			i := seq
			n.Unlock()
			var batch Batch
			batch.Append("bench", i, payload)
			if err := s.Write(context.Background(), &batch); err != nil {
				b.Error(err)
				return
			}
		}
	})
	st := s.Stats()
	b.ReportMetric(float64(st.Writes)/float64(max(st.Syncs, 1)), "writes/fsync")
}

// TestLargeGroupSpansTransactions: a group bigger than one Badger
// transaction is split and still written whole, a key written twice in it
// keeping its last write.
func TestLargeGroupSpansTransactions(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir, SyncAlways)
	var b Batch
	big := make([]byte, 64<<10)
	const n = 400 // about 25 MiB: more than one transaction holds
	if err := b.Put("rec", "twice", "first"); err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= n; i++ {
		b.Append("big", i, big)
	}
	b.Append("big", 1, []byte("rewritten"))
	if err := b.Put("rec", "twice", "last"); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		if last, _ := s.Last("big"); last != n {
			t.Fatalf("%s: last = %d, want %d", when, last, n)
		}
		if e, err := s.Entry("big", 1); err != nil || string(e) != "rewritten" {
			t.Fatalf("%s: entry 1 = %.20q, %v; want the last write", when, e, err)
		}
		var v string
		if err := s.Get("rec", "twice", &v); err != nil || v != "last" {
			t.Fatalf("%s: record = %q, %v; want the last write", when, v, err)
		}
	}
	check("before reopening")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir, SyncAlways)
	defer s.Close()
	check("after reopening")
}

// TestApplyGroupsKeepsLastWrite: groups applied together in one Badger
// transaction leave each key as its last write left it, deletes included.
func TestApplyGroupsKeepsLastWrite(t *testing.T) {
	s := open(t, t.TempDir(), SyncAlways)
	defer s.Close()
	var b Batch
	if err := b.Put("k", "gone", "v0"); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	put := func(id, v string) op { return op{key: recordKey("k", id), val: Encode(v)} }
	del := func(id string) op { return op{key: recordKey("k", id), del: true} }
	groups := []*group{
		{ops: []op{put("gone", "v1"), del("back"), put("kept", "a")}},
		{ops: []op{del("gone"), put("back", "b1")}},
		{ops: []op{put("back", "b2"), put("kept", "c")}},
	}
	for _, g := range groups {
		g.ts = s.next
		s.next++
	}
	if err := s.applyGroups(groups); err != nil {
		t.Fatal(err)
	}
	txn := s.db.NewTransactionAt(groups[2].ts, false)
	defer txn.Discard()
	for id, want := range map[string]string{"gone": "", "back": "b2", "kept": "c"} {
		item, err := txn.Get(recordKey("k", id))
		if want == "" {
			if !errors.Is(err, badger.ErrKeyNotFound) {
				t.Errorf("%s: want deleted, got %v", id, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		var got string
		if err := item.Value(func(v []byte) error { return Decode(v, &got) }); err != nil || got != want {
			t.Errorf("%s = %q, %v; want %q", id, got, err, want)
		}
	}
}

// TestCloseIsBoundedWhenBadgerCannotFinish: with its folder removed under
// it, Badger retries writing its memory table out without end; Close
// returns ErrCloseTimeout after CloseTimeout instead of waiting with it.
func TestCloseIsBoundedWhenBadgerCannotFinish(t *testing.T) {
	dir := t.TempDir()
	s := openWith(t, Options{Dir: dir, CloseTimeout: time.Second})
	var b Batch
	b.Append("x/a", 1, []byte("acknowledged"))
	if err := s.Write(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrCloseTimeout) {
			t.Fatalf("Close on a removed folder: %v, want ErrCloseTimeout", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close still waits for Badger after a minute")
	}
}

func TestBadgerLoggerLevels(t *testing.T) {
	for _, tc := range []struct {
		name   string
		format string
		args   []any
		level  string
	}{
		{"a cache's statistics", "%s might be too small. Metrics: %s\n", []any{"Block cache", "hit: 1"}, "DEBUG"},
		{"its life expectancy", "Cache life expectancy (in seconds): %+v\n", []any{"histogram"}, "DEBUG"},
		{"any other warning", "Value log %d truncated", []any{3}, "WARN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			b := badgerLogger{slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))}
			b.Warningf(tc.format, tc.args...)
			if !strings.Contains(out.String(), "level="+tc.level) {
				t.Errorf("Warningf(%q) logged %q, want level %s", tc.format, out.String(), tc.level)
			}
		})
	}
}

// TestNothingFollowsTheLargestSequence: a read after 2^64-1 gives nothing.
// after+1 wrapped to 0 and gave the whole log.
func TestNothingFollowsTheLargestSequence(t *testing.T) {
	s := openWith(t, Options{InMemory: true})
	defer s.Close()
	var b Batch
	for i := uint64(1); i <= 3; i++ {
		b.Append("x/a", i, []byte(fmt.Sprint("event-", i)))
	}
	if err := s.Write(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	for _, after := range []uint64{3, math.MaxUint64 - 1, math.MaxUint64} {
		if got, err := s.Read("x/a", after, 0); err != nil || len(got) != 0 {
			t.Fatalf("Read after %d: %d entries (%v), want none", after, len(got), err)
		}
	}
}

// TestBadgerLoggerFormatsOnlyWhatIsLogged: Badger logs debug lines on every
// write it applies; below the logger's level they must cost no formatting
// (they cost a Sprintf each, about 2% of the server's CPU at one execution
// at a time).
func TestBadgerLoggerFormatsOnlyWhatIsLogged(t *testing.T) {
	var out bytes.Buffer
	b := badgerLogger{slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	count := 3
	allocs := testing.AllocsPerRun(100, func() {
		b.Debugf("%d entries written", count)
		b.Infof("Set nextTxnTs to %d", count)
	})
	if allocs != 0 || out.Len() != 0 {
		t.Errorf("debug lines below the level: %v allocations, logged %q; want none", allocs, out.String())
	}
	b.Warningf("Value log %d truncated", count)
	if !strings.Contains(out.String(), "Value log 3 truncated") {
		t.Errorf("a warning at the level was not logged: %q", out.String())
	}
}

// TestNothingWaitsOutTheApplyGather: acknowledged groups gather before they
// are applied to Badger, and with a gather of an hour a read of what was
// just written, Compact (which waits for a checkpoint of every write, and
// flushes in the apply stage) and Close still finish: whoever waits for
// the apply has it run at once. The idle journal's settling, which also
// applies what gathered, is put off for an hour too, so that nothing but
// the waiters themselves can end the gather.
func TestNothingWaitsOutTheApplyGather(t *testing.T) {
	s := openWith(t, Options{Dir: t.TempDir(), Sync: SyncNone, ApplyGather: time.Hour, idleAfter: time.Hour})
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			ctx := context.Background()
			for i := uint64(1); i <= 20; i++ {
				var b Batch
				b.Append("x/a", i, []byte(fmt.Sprint("event-", i)))
				if err := b.Put("kind", fmt.Sprint("id", i), map[string]uint64{"n": i}); err != nil {
					return err
				}
				if err := s.Write(ctx, &b); err != nil {
					return err
				}
				var rec map[string]uint64
				if err := s.Get("kind", fmt.Sprint("id", i), &rec); err != nil || rec["n"] != i {
					return fmt.Errorf("Get after write %d: %v, %w", i, rec, err)
				}
				if got, err := s.Read("x/a", i-1, 1); err != nil || len(got) != 1 || got[0].Seq != i {
					return fmt.Errorf("Read after write %d: %+v, %w", i, got, err)
				}
			}
			var b Batch
			if err := b.Put("kind", "last", map[string]int{"n": 0}); err != nil {
				return err
			}
			if err := s.Write(ctx, &b); err != nil {
				return err
			}
			if err := s.Compact(ctx); err != nil {
				return fmt.Errorf("compact: %w", err)
			}
			if err := s.Write(ctx, &b); err != nil {
				return err
			}
			return s.Close()
		}()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("still waiting after a minute: something waited out the apply stage's gather")
	}
}
