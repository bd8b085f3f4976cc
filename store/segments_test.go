package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/gatehouse-dev/gatehouse/store/cutfs"
	"github.com/gatehouse-dev/gatehouse/store/seglog"
)

// badgerLogKeys counts the log entries Badger holds, by stream.
func badgerLogKeys(t *testing.T, s *Store) map[string]int {
	t.Helper()
	n := map[string]int{}
	txn := s.db.NewTransactionAt(s.awaitApplied(), false)
	defer txn.Discard()
	it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte("l/")})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		k := it.Item().Key()
		n[string(k[2:len(k)-9])]++
	}
	return n
}

func seqsOf(es []Entry) []uint64 {
	out := make([]uint64, len(es))
	for i, e := range es {
		out[i] = e.Seq
	}
	return out
}

// TestExecutionLogsLiveInSegmentsAndRecordsInBadger: a log named by
// SegmentLogs goes to the segment log, and Badger gets none of it; the
// store's reads see it as before, a delete drops the log's start, and all
// of it survives a restart. A peer outbox stays in Badger.
func TestExecutionLogsLiveInSegmentsAndRecordsInBadger(t *testing.T) {
	dir := t.TempDir()
	s := openWith(t, Options{Dir: dir})
	for i := uint64(1); i <= 50; i++ {
		write(t, s, func(b *Batch) {
			b.Append("x/ex1", i, fmt.Appendf(nil, "event-%d", i))
			if err := b.Put("summary", "ex1", i); err != nil {
				t.Fatal(err)
			}
			b.AppendLazy("o/agent", i, []byte("push"))
		})
	}
	write(t, s, func(b *Batch) { b.DeleteEntry("x/ex1", 10) })
	check := func(s *Store) {
		t.Helper()
		if es, err := s.Read("o/agent", 0, 0); err != nil || len(es) != 50 { // hands the lazy writes to Badger
			t.Fatalf("outbox: %d entries, %v", len(es), err)
		}
		if keys := badgerLogKeys(t, s); keys["x/ex1"] != 0 || keys["o/agent"] != 50 {
			t.Errorf("Badger's log entries: %v; want none of x/ex1 and the outbox's 50", keys)
		}
		es, err := s.Read("x/ex1", 0, 0)
		if err != nil || len(es) != 40 || es[0].Seq != 11 || string(es[39].Data) != "event-50" {
			t.Fatalf("read %v (%v); want 11-50", seqsOf(es), err)
		}
		if es, _ := s.Read("x/ex1", 20, 3); fmt.Sprint(seqsOf(es)) != "[21 22 23]" {
			t.Errorf("read after 20, 3 of them: %v", seqsOf(es))
		}
		for _, stream := range []string{"x/ex1", "o/agent"} { // the segment log, Badger
			var seqs []uint64
			err := s.ScanAtMost(stream, 20, 3, func(seq uint64, _ []byte) bool { seqs = append(seqs, seq); return true })
			if err != nil || fmt.Sprint(seqs) != "[21 22 23]" {
				t.Errorf("%s: scan after 20, at most 3, of a reader that takes all: %v, %v", stream, seqs, err)
			}
		}
		if d, err := s.Entry("x/ex1", 25); err != nil || string(d) != "event-25" {
			t.Errorf("entry 25: %q, %v", d, err)
		}
		if _, err := s.Entry("x/ex1", 5); !errors.Is(err, ErrNotFound) {
			t.Errorf("entry 5, dropped: %v", err)
		}
		if f, _ := s.First("x/ex1"); f != 11 {
			t.Errorf("first %d, want 11", f)
		}
		if l, _ := s.Last("x/ex1"); l != 50 {
			t.Errorf("last %d, want 50", l)
		}
		var n uint64
		if err := s.Get("summary", "ex1", &n); err != nil || n != 50 {
			t.Errorf("record: %d, %v", n, err)
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if segs, _ := filepath.Glob(filepath.Join(dir, logsDir, "*.seg")); len(segs) == 0 {
		t.Error("no segment in the data folder's logs/")
	}
	r := openWith(t, Options{Dir: dir})
	defer r.Close()
	check(r)
	// Dropped whole, as retention prunes an execution.
	write(t, r, func(b *Batch) {
		for i := uint64(11); i <= 50; i++ {
			b.DeleteEntry("x/ex1", i)
		}
	})
	if es, err := r.Read("x/ex1", 0, 0); err != nil || len(es) != 0 {
		t.Errorf("after the prune: %v, %v", seqsOf(es), err)
	}
	if l, _ := r.Last("x/ex1"); l != 0 {
		t.Errorf("last %d after the prune", l)
	}
}

// TestStoreRefusesALogBatchTheSegmentLogWouldRefuse: a log name past the
// segment log's bound is refused at Write, with the store still working,
// rather than failing the store after the journal took it.
func TestStoreRefusesALogBatchTheSegmentLogWouldRefuse(t *testing.T) {
	s := openWith(t, Options{Dir: t.TempDir()})
	defer s.Close()
	var b Batch
	b.Append("x/"+strings.Repeat("n", seglog.MaxStreamName), 1, []byte("e"))
	if err := s.Write(t.Context(), &b); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Write = %v, want ErrTooLarge", err)
	}
	write(t, s, func(b *Batch) { b.Append("x/fine", 1, []byte("e")) })
	if err := s.Ping(t.Context()); err != nil {
		t.Errorf("Ping after a refused batch: %v", err)
	}
}

// writeFormat1 makes dir a data folder of the earlier layout, whose logs
// are in Badger: a store that keeps no log in the segment log, without
// the FORMAT file.
func writeFormat1(t *testing.T, dir string) {
	t.Helper()
	s := openWith(t, Options{Dir: dir, SegmentLogs: []string{"none/"}})
	for i := uint64(1); i <= 300; i++ {
		write(t, s, func(b *Batch) {
			b.Append("x/old", i, bytes.Repeat([]byte{byte(i)}, 200))
			b.Append("s/sess", i, []byte("turn"))
			b.Append("o/box", i, []byte("push"))
		})
	}
	write(t, s, func(b *Batch) { b.DeleteEntry("x/old", 1); b.DeleteEntry("x/old", 2) })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{formatFile, logsDir} {
		if err := os.RemoveAll(filepath.Join(dir, p)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFormat1FolderIsMovedOnStart: a folder of the earlier layout opens:
// its logs move from Badger to the segment log, the folder is recorded as
// format 3 (formats 1 to 3 in one start), and a move cut short (a partial logs/ left, no FORMAT) starts
// again from Badger.
func TestFormat1FolderIsMovedOnStart(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(t *testing.T, dir string)
	}{
		{"a folder of the earlier layout", func(*testing.T, string) {}},
		{"a move cut short", func(t *testing.T, dir string) {
			l, err := seglog.Open(filepath.Join(dir, logsDir), seglog.Options{})
			if err != nil {
				t.Fatal(err)
			}
			var b seglog.Batch
			b.Append("x/old", 3, []byte("half moved, wrong"))
			if err := l.Commit(t.Context(), &b); err != nil {
				t.Fatal(err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFormat1(t, dir)
			tc.spoil(t, dir)
			s := openWith(t, Options{Dir: dir})
			defer s.Close()
			if f, err := os.ReadFile(filepath.Join(dir, formatFile)); err != nil || strings.TrimSpace(string(f)) != formatVersion {
				t.Errorf("FORMAT %q, %v", f, err)
			}
			if keys := badgerLogKeys(t, s); keys["x/old"] != 0 || keys["s/sess"] != 0 || keys["o/box"] != 300 {
				t.Errorf("Badger's log entries after the move: %v", keys)
			}
			es, err := s.Read("x/old", 0, 0)
			if err != nil || len(es) != 298 || es[0].Seq != 3 || !bytes.Equal(es[0].Data, bytes.Repeat([]byte{3}, 200)) {
				t.Fatalf("moved log: %d entries from %v (%v)", len(es), seqsOf(es[:min(1, len(es))]), err)
			}
			if l, _ := s.Last("s/sess"); l != 300 {
				t.Errorf("moved session log ends at %d", l)
			}
			// The store goes on at versions above the moved entries.
			write(t, s, func(b *Batch) { b.Append("x/old", 301, []byte("new")); b.DeleteEntry("x/old", 100) })
			if f, _ := s.First("x/old"); f != 101 {
				t.Errorf("first %d after a drop past the moved entries", f)
			}
		})
	}
}

// TestFormat2FolderBecomesFormat3: a folder of format 2 opens, with its
// logs and records, and is recorded as format 3 before anything is written,
// so that a build of format 2 no longer opens it (the kernel moves its
// records to their later layout once started).
func TestFormat2FolderBecomesFormat3(t *testing.T) {
	dir := t.TempDir()
	s := openWith(t, Options{Dir: dir})
	write(t, s, func(b *Batch) {
		b.Append("x/old", 1, []byte("event"))
		if err := b.Put("xs", "old", "summary"); err != nil {
			t.Fatal(err)
		}
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, formatFile), []byte("2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s = openWith(t, Options{Dir: dir})
	defer s.Close()
	if f, err := os.ReadFile(filepath.Join(dir, formatFile)); err != nil || strings.TrimSpace(string(f)) != "3" {
		t.Errorf("FORMAT %q, %v; want 3", f, err)
	}
	var v string
	if err := s.Get("xs", "old", &v); err != nil || v != "summary" {
		t.Errorf("record of the format 2 folder: %q %v", v, err)
	}
	if es, err := s.Read("x/old", 0, 0); err != nil || len(es) != 1 {
		t.Errorf("log of the format 2 folder: %d entries, %v", len(es), err)
	}
}

// TestUnknownFormatIsRefused: a folder written in a format this build does
// not read is refused with ErrFormat, naming it, and nothing is changed.
func TestUnknownFormatIsRefused(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, formatFile), []byte("4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Options{Dir: dir})
	if err == nil {
		_ = s.Close()
		t.Fatal("opened a format 4 folder")
	}
	if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), `"4"`) {
		t.Errorf("Open = %v; want ErrFormat naming the format", err)
	}
	if _, err := os.Stat(filepath.Join(dir, logsDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("logs/ made in a refused folder: %v", err)
	}
}

// TestPowerCutFSJournalRefillsTheSegmentLog: the segment log syncs only at
// checkpoints, and the journal keeps every group until it has: after a
// power cut, what the segment log lost comes back from the journal, even
// once an idle checkpoint has released the journal's older segments.
func TestPowerCutFSJournalRefillsTheSegmentLog(t *testing.T) {
	t.Parallel()
	m := onCutFS(t)
	s := openWith(t, Options{Dir: m.Dir(), segmentSize: 16 << 10})
	for i := uint64(1); i <= 200; i++ {
		write(t, s, func(b *Batch) { b.Append("x/ex", i, bytes.Repeat([]byte{byte(i)}, 300)) })
	}
	if !s.settleIdle() {
		t.Fatal("the idle checkpoint did not release the journal")
	}
	if n := s.journal.pending(); n != 1 {
		t.Fatalf("%d journal segments after an idle checkpoint, want 1", n)
	}
	for i := uint64(201); i <= 300; i++ {
		write(t, s, func(b *Batch) { b.Append("x/ex", i, bytes.Repeat([]byte{byte(i)}, 300)) })
	}
	r := openWith(t, Options{Dir: powerCut(t, m, s, cutfs.CutOptions{Tear: true, Seed: 5})})
	defer r.Close()
	es, err := r.Read("x/ex", 0, 0)
	if err != nil || len(es) != 300 {
		t.Fatalf("%d of 300 entries after the cut (%v)", len(es), err)
	}
	for _, e := range es {
		if !bytes.Equal(e.Data, bytes.Repeat([]byte{byte(e.Seq)}, 300)) {
			t.Fatalf("entry %d: wrong data", e.Seq)
		}
	}
}

// TestCompactDropsTheSegmentsOfPrunedLogs: once retention deleted the
// logs, Compact gives their segments back, and copies forward the log
// that lives on.
func TestCompactDropsTheSegmentsOfPrunedLogs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := openWith(t, Options{Dir: dir, segmentSize: 16 << 10})
	defer s.Close()
	for i := range 100 {
		write(t, s, func(b *Batch) {
			for seq := uint64(1); seq <= 5; seq++ {
				b.Append(fmt.Sprint("x/done", i), seq, bytes.Repeat([]byte{1}, 200))
			}
			b.Append("x/live", uint64(i+1), []byte("still running"))
		})
	}
	for i := range 100 {
		write(t, s, func(b *Batch) {
			for seq := uint64(1); seq <= 5; seq++ {
				b.DeleteEntry(fmt.Sprint("x/done", i), seq)
			}
		})
	}
	segs := func() int {
		m, _ := filepath.Glob(filepath.Join(dir, logsDir, "*.seg"))
		return len(m)
	}
	before := segs()
	if before < 5 {
		t.Fatalf("%d segments; the test wants several", before)
	}
	if err := s.Compact(t.Context()); err != nil {
		t.Fatal(err)
	}
	if after := segs(); after > 2 {
		t.Errorf("%d segments after Compact, %d before", after, before)
	}
	if es, err := s.Read("x/live", 0, 0); err != nil || len(es) != 100 {
		t.Errorf("the live log: %d of 100 entries, %v", len(es), err)
	}
	if es, err := s.Read("x/done7", 0, 0); err != nil || len(es) != 0 {
		t.Errorf("a pruned log: %v, %v", seqsOf(es), err)
	}
}

// TestGroupsAppliedTogetherShareAnAppendWhereTheyReadTheSame: the apply stage hands the
// segment log the log writes of the groups it applies together in one
// append, and a group whose writes would read differently in the same
// append as the ones before it (it drops what they appended, or appends a
// sequence they did) starts another; every read is what one append per
// group gives. Each group is a write of its own.
func TestGroupsAppliedTogetherShareAnAppendWhereTheyReadTheSame(t *testing.T) {
	type want struct {
		stream string
		seqs   string
		last   string // the last entry's data
	}
	big := bytes.Repeat([]byte{'e'}, 300<<10)
	put := func(b *Batch, n int) {
		if err := b.Put("kind", "k", n); err != nil {
			t.Error(err)
		}
	}
	for _, c := range []struct {
		name    string
		before  []func(*Batch) // written and applied first
		groups  []func(*Batch)
		appends uint64
		want    []want
	}{
		{
			name: "appends to two logs",
			groups: []func(*Batch){
				func(b *Batch) { b.Append("x/a", 1, []byte("a1")); b.Append("x/a", 2, []byte("a2")) },
				func(b *Batch) { b.Append("x/a", 3, []byte("a3")) },
				func(b *Batch) { put(b, 1); b.Append("x/b", 1, []byte("b1")) },
				func(b *Batch) { put(b, 2) },
			},
			appends: 1,
			want:    []want{{"x/a", "[1 2 3]", "a3"}, {"x/b", "[1]", "b1"}},
		},
		{
			name: "a drop of what an earlier group appended",
			groups: []func(*Batch){
				func(b *Batch) { b.Append("x/a", 1, []byte("a1")); b.Append("x/a", 2, []byte("a2")) },
				func(b *Batch) { b.Append("x/a", 3, []byte("a3")); b.Append("x/b", 1, []byte("b1")) },
				func(b *Batch) { b.DeleteEntry("x/a", 2) },
				func(b *Batch) { b.Append("x/a", 4, []byte("a4")) },
			},
			appends: 2,
			want:    []want{{"x/a", "[3 4]", "a4"}, {"x/b", "[1]", "b1"}},
		},
		{
			name: "a drop of what came before the groups",
			before: []func(*Batch){
				func(b *Batch) { b.Append("x/a", 1, []byte("a1")); b.Append("x/a", 2, []byte("a2")) },
			},
			groups: []func(*Batch){
				func(b *Batch) { b.Append("x/a", 3, []byte("a3")) },
				func(b *Batch) { b.DeleteEntry("x/a", 2) },
			},
			appends: 1,
			want:    []want{{"x/a", "[3]", "a3"}},
		},
		{
			name: "an append and then a drop in one group",
			groups: []func(*Batch){
				func(b *Batch) { b.Append("x/b", 1, []byte("b1")) },
				func(b *Batch) { b.Append("x/a", 1, []byte("a1")); b.DeleteEntry("x/a", 1) },
			},
			appends: 1,
			want:    []want{{"x/a", "[1]", "a1"}, {"x/b", "[1]", "b1"}},
		},
		{
			name: "groups past 256 KiB, with one that writes no log between them",
			groups: []func(*Batch){
				func(b *Batch) { b.Append("x/a", 1, big) },
				func(b *Batch) { put(b, 1) },
				func(b *Batch) { b.Append("x/a", 2, big) },
				func(b *Batch) { b.Append("x/b", 1, []byte("b1")) },
			},
			appends: 3,
			want:    []want{{"x/a", "[1 2]", string(big)}, {"x/b", "[1]", "b1"}},
		},
		{
			name: "a sequence written again",
			groups: []func(*Batch){
				func(b *Batch) { b.Append("x/a", 1, []byte("first")) },
				func(b *Batch) { b.Append("x/a", 1, []byte("second")) },
			},
			appends: 2,
			want:    []want{{"x/a", "[1]", "second"}},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The apply stage is held in the apply of a group of its own
			// while the groups are written, so that it finds them all
			// waiting when it goes on.
			var holding atomic.Bool
			held, hold := make(chan struct{}), make(chan struct{})
			s := openWith(t, Options{Dir: t.TempDir(), Sync: SyncNone, ApplyGather: time.Hour, idleAfter: time.Hour,
				committing: func(uint64) {
					if holding.CompareAndSwap(true, false) {
						close(held)
						<-hold
					}
				}})
			defer s.Close()
			for _, fill := range c.before {
				write(t, s, fill)
			}
			s.awaitApplied()
			records := func() uint64 { return s.logs.(segmentLogs).l.Stats().Records }
			from := records()
			holding.Store(true)
			write(t, s, func(b *Batch) { put(b, 0) })
			s.hurryApply()
			<-held
			for _, fill := range c.groups {
				write(t, s, fill)
			}
			close(hold)
			for _, w := range c.want {
				es, err := s.Read(w.stream, 0, 0)
				last := ""
				if len(es) > 0 {
					last = string(es[len(es)-1].Data)
				}
				if err != nil || fmt.Sprint(seqsOf(es)) != w.seqs || last != w.last {
					t.Errorf("%s: %v ending %.20q (%v); want %s ending %.20q", w.stream, seqsOf(es), last, err, w.seqs, w.last)
				}
			}
			if n := records() - from; n != c.appends {
				t.Errorf("the groups made %d appends; want %d", n, c.appends)
			}
		})
	}
}
