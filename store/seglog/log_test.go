package seglog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/gatehouse-dev/gatehouse/store/cutfs"
)

// TestMain lets the test binary serve the power-cut file systems the
// tests mount (see cutfs.Main).
func TestMain(m *testing.M) {
	cutfs.Main()
	os.Exit(m.Run())
}

func openLog(tb testing.TB, dir string, o Options) *Log {
	tb.Helper()
	l, err := Open(dir, o)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

func commit(tb testing.TB, l *Log, fill func(b *Batch)) *Batch {
	tb.Helper()
	var b Batch
	fill(&b)
	if err := l.Commit(context.Background(), &b); err != nil {
		tb.Fatal(err)
	}
	return &b
}

// data is entry seq of stream's bytes: its name and sequence, padded to n.
func data(stream string, seq uint64, n int) []byte {
	d := fmt.Appendf(nil, "%s/%d;", stream, seq)
	for len(d) < n {
		d = append(d, byte('a'+seq%26))
	}
	return d
}

func readAll(tb testing.TB, l *Log, stream string) []Entry {
	tb.Helper()
	var (
		out   []Entry
		r     Reader
		after uint64
	)
	// One Reader for every page, as a catch-up reads: each page's entries
	// are copied before the next read reuses its buffers.
	for {
		es, err := r.Read(l, stream, after, 7, 0)
		if err != nil {
			tb.Fatal(err)
		}
		if len(es) == 0 {
			return out
		}
		for _, e := range es {
			out = append(out, Entry{Seq: e.Seq, Data: bytes.Clone(e.Data)})
		}
		after = es[len(es)-1].Seq
	}
}

// wantSeqs fails unless es are stream's entries at seqs, with their data
// as data(stream, seq, size) wrote it.
func wantSeqs(tb testing.TB, es []Entry, stream string, size int, seqs ...uint64) {
	tb.Helper()
	got := make([]uint64, len(es))
	for i, e := range es {
		got[i] = e.Seq
	}
	if fmt.Sprint(got) != fmt.Sprint(seqs) {
		tb.Fatalf("%s: sequences %v, want %v", stream, got, seqs)
	}
	for _, e := range es {
		if want := data(stream, e.Seq, size); !bytes.Equal(e.Data, want) {
			tb.Fatalf("%s/%d: data %q, want %q", stream, e.Seq, e.Data, want)
		}
	}
}

func seqRange(from, to uint64) []uint64 {
	var s []uint64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

// TestReadReturnsWhatWasAppendedWithinItsBounds: reads by cursor, count
// and bytes, across many segments, before and after a restart (the
// sidecars loaded), and after losing the sidecars (the segments read).
func TestReadReturnsWhatWasAppendedWithinItsBounds(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, Options{SegmentSize: 4 << 10})
	// Three streams interleaved, 100 bytes an entry: about 11 segments.
	for seq := uint64(1); seq <= 150; seq++ {
		commit(t, l, func(b *Batch) {
			for _, s := range []string{"x/a", "x/b", "s/c"} {
				if s != "s/c" || seq%3 == 0 {
					b.Append(s, seq, data(s, seq, 100))
				}
			}
		})
	}
	check := func(t *testing.T, l *Log) {
		// The cases read through l.Read, then all through one Reader, whose
		// buffers each read reuses.
		var shared Reader
		for _, tc := range []struct {
			name            string
			stream          string
			after           uint64
			count, maxBytes int
			want            []uint64
		}{
			{"from the start", "x/a", 0, 5, 0, seqRange(1, 5)},
			{"from a cursor", "x/b", 97, 4, 0, seqRange(98, 101)},
			{"to the end", "x/a", 147, 10, 0, seqRange(148, 150)},
			{"past the end", "x/a", 150, 10, 0, nil},
			{"the largest cursor", "x/a", 1<<64 - 1, 10, 0, nil},
			{"bytes bound", "x/a", 10, 100, 250, seqRange(11, 12)},
			{"one entry over the bytes bound still comes", "x/a", 10, 100, 1, seqRange(11, 11)},
			{"gaps in the sequences", "s/c", 10, 3, 0, []uint64{12, 15, 18}},
			{"a stream never written", "nope", 0, 10, 0, nil},
		} {
			t.Run(tc.name, func(t *testing.T) {
				es, err := l.Read(tc.stream, tc.after, tc.count, tc.maxBytes)
				if err != nil {
					t.Fatal(err)
				}
				wantSeqs(t, es, tc.stream, 100, tc.want...)
				if es, err = shared.Read(l, tc.stream, tc.after, tc.count, tc.maxBytes); err != nil {
					t.Fatal(err)
				}
				wantSeqs(t, es, tc.stream, 100, tc.want...)
			})
		}
		for _, tc := range []struct {
			stream      string
			first, last uint64
		}{{"x/a", 1, 150}, {"s/c", 3, 150}, {"nope", 0, 0}} {
			if f, la, err := l.Bounds(tc.stream); err != nil || f != tc.first || la != tc.last {
				t.Errorf("Bounds(%s) = %d, %d, %v; want %d, %d", tc.stream, f, la, err, tc.first, tc.last)
			}
		}
		wantSeqs(t, readAll(t, l, "x/b"), "x/b", 100, seqRange(1, 150)...)
	}
	t.Run("written", func(t *testing.T) { check(t, l) })
	if n := l.Stats().Segments; n < 8 {
		t.Fatalf("%d segments; the test wants many", n)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	t.Run("reopened", func(t *testing.T) {
		l := openLog(t, dir, Options{SegmentSize: 4 << 10})
		defer l.Close()
		check(t, l)
	})
	idx, _ := filepath.Glob(filepath.Join(dir, "*"+idxExt))
	for _, p := range idx {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("sidecars rebuilt", func(t *testing.T) {
		l := openLog(t, dir, Options{SegmentSize: 4 << 10})
		defer l.Close()
		check(t, l)
		if again, _ := filepath.Glob(filepath.Join(dir, "*"+idxExt)); len(again) != len(idx) {
			t.Errorf("%d sidecars after the start, want %d", len(again), len(idx))
		}
	})
}

// TestReaderAllocatesNothingOnceGrown: a Reader reading page after page of
// a stream, from the segment being written (mapped) and from sealed ones
// (through their sidecars, read from the file), allocates nothing once its
// buffers have grown, and every page is right.
func TestReaderAllocatesNothingOnceGrown(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, Options{SegmentSize: 64 << 10})
	for seq := uint64(1); seq <= 2000; seq++ {
		commit(t, l, func(b *Batch) {
			b.Append("x/a", seq, data("x/a", seq, 100))
			b.Append("x/b", seq, data("x/b", seq, 100))
		})
	}
	if n := l.Stats().Segments; n < 4 {
		t.Fatalf("%d segments; the test wants several", n)
	}
	var (
		r   Reader
		es  []Entry
		err error
	)
	for _, after := range []uint64{0, 1000, 1900, 0, 600, 1744} {
		allocs := testing.AllocsPerRun(20, func() { es, err = r.Read(l, "x/a", after, 256, 0) })
		if err != nil {
			t.Fatal(err)
		}
		wantSeqs(t, es, "x/a", 100, seqRange(after+1, min(after+256, 2000))...)
		if allocs != 0 {
			t.Errorf("a page after %d: %.1f allocations, want none", after, allocs)
		}
	}
}

// TestReadBoundsAreCapped: a read asking for more than the caps gets the
// caps, and zero asks for the defaults.
func TestReadBoundsAreCapped(t *testing.T) {
	l := openLog(t, t.TempDir(), Options{SegmentSize: 1 << 20})
	defer l.Close()
	const n = MaxReadCount + 10
	for from := uint64(1); from <= n; from += 10000 {
		commit(t, l, func(b *Batch) {
			for seq := from; seq < from+10000 && seq <= n; seq++ {
				b.Append("x/big", seq, []byte{1})
			}
		})
	}
	for _, tc := range []struct {
		name         string
		count, bytes int
		want         int
	}{
		{"defaults", 0, 0, DefaultReadCount},
		{"count capped", 1 << 30, 0, MaxReadCount},
		{"bytes bound", 1 << 30, 100, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			es, err := l.Read("x/big", 0, tc.count, tc.bytes)
			if err != nil || len(es) != tc.want {
				t.Fatalf("%d entries (%v), want %d", len(es), err, tc.want)
			}
		})
	}
}

// TestCommitRefusesWhatCannotBeWritten: each bad batch gets its sentinel,
// and nothing of it is written.
func TestCommitRefusesWhatCannotBeWritten(t *testing.T) {
	l := openLog(t, t.TempDir(), Options{MaxBatchBytes: 1 << 10})
	defer l.Close()
	commit(t, l, func(b *Batch) { b.Append("x/a", 1, []byte("one")); b.SetVersion(10) })
	for _, tc := range []struct {
		name string
		fill func(b *Batch)
		want error
	}{
		{"empty batch", func(b *Batch) {}, ErrInvalid},
		{"empty stream", func(b *Batch) { b.Append("", 1, nil) }, ErrInvalid},
		{"sequence 0", func(b *Batch) { b.Append("x/a", 0, nil) }, ErrInvalid},
		{"the largest sequence", func(b *Batch) { b.Append("x/a", 1<<64-1, nil) }, ErrInvalid},
		{"name too long", func(b *Batch) { b.Append(strings.Repeat("n", MaxStreamName+1), 2, nil) }, ErrTooLarge},
		{"batch too large", func(b *Batch) { b.Append("x/a", 2, make([]byte, 2<<10)) }, ErrTooLarge},
		{"version not above the last", func(b *Batch) { b.Append("x/a", 2, nil); b.SetVersion(10) }, ErrVersion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b Batch
			tc.fill(&b)
			if err := l.Commit(context.Background(), &b); !errors.Is(err, tc.want) {
				t.Fatalf("Commit = %v, want %v", err, tc.want)
			}
		})
	}
	if f, la, _ := l.Bounds("x/a"); f != 1 || la != 1 {
		t.Errorf("bounds %d-%d after refused batches, want 1-1", f, la)
	}
	b := commit(t, l, func(b *Batch) { b.Append("x/a", 2, []byte("two")) })
	if b.Version() != 11 {
		t.Errorf("version %d, want the next one, 11", b.Version())
	}
}

// TestConcurrentCommitsAllLand: 32 committers, each its own stream; every
// commit returned is readable, in order, and survives a restart.
func TestConcurrentCommitsAllLand(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, Options{SegmentSize: 64 << 10})
	var wg sync.WaitGroup
	for w := range 32 {
		wg.Go(func() {
			s := fmt.Sprint("x/w", w)
			for seq := uint64(1); seq <= 50; seq++ {
				var b Batch
				b.Append(s, seq, data(s, seq, 200))
				if err := l.Commit(context.Background(), &b); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, dir, Options{SegmentSize: 64 << 10})
	defer l.Close()
	for w := range 32 {
		s := fmt.Sprint("x/w", w)
		wantSeqs(t, readAll(t, l, s), s, 200, seqRange(1, 50)...)
	}
}

// TestDropHidesOnlyWhatCameBefore: a drop hides its stream's entries below
// its sequence, across segments and restarts; a stream dropped whole may
// begin again at 1.
func TestDropHidesOnlyWhatCameBefore(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: 4 << 10}
	l := openLog(t, dir, o)
	for seq := uint64(1); seq <= 60; seq++ {
		commit(t, l, func(b *Batch) { b.Append("x/a", seq, data("x/a", seq, 100)) })
	}
	commit(t, l, func(b *Batch) { b.DropBefore("x/a", 41) })
	wantSeqs(t, readAll(t, l, "x/a"), "x/a", 100, seqRange(41, 60)...)
	// Dropped whole, then begun again.
	commit(t, l, func(b *Batch) { b.DropBefore("x/a", 61) })
	if f, la, _ := l.Bounds("x/a"); f != 0 || la != 0 {
		t.Fatalf("bounds %d-%d after a drop of everything", f, la)
	}
	for seq := uint64(1); seq <= 5; seq++ {
		commit(t, l, func(b *Batch) { b.Append("x/a", seq, data("x/a", seq, 100)) })
	}
	check := func(l *Log) {
		t.Helper()
		wantSeqs(t, readAll(t, l, "x/a"), "x/a", 100, seqRange(1, 5)...)
		if f, la, _ := l.Bounds("x/a"); f != 1 || la != 5 {
			t.Errorf("bounds %d-%d, want 1-5", f, la)
		}
	}
	check(l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, dir, o)
	defer l.Close()
	check(l)
}

// TestCompactDropsWholeSegmentsAndCopiesTheLiveForward: retention deletes
// the oldest segments; the entries in them no drop hides are copied
// forward and read as before, after a restart too, and the drops that
// hid the rest go with their segment.
func TestCompactDropsWholeSegmentsAndCopiesTheLiveForward(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: 4 << 10}
	l := openLog(t, dir, o)
	// Many short executions, dropped whole once done, and one long one
	// that lives through them all.
	for i := range 40 {
		s := fmt.Sprint("x/short", i)
		commit(t, l, func(b *Batch) {
			for seq := uint64(1); seq <= 5; seq++ {
				b.Append(s, seq, data(s, seq, 100))
			}
			b.Append("x/long", uint64(i+1), data("x/long", uint64(i+1), 100))
		})
		if i < 35 {
			commit(t, l, func(b *Batch) { b.DropBefore(s, 6) })
		}
	}
	before := l.Stats()
	if before.Segments < 8 {
		t.Fatalf("%d segments; the test wants several", before.Segments)
	}
	// Nothing is rewritten while most of the oldest segment is live.
	if st, err := l.Compact(context.Background(), 0.05); err != nil || st.Segments != 0 {
		t.Fatalf("compact at 5%% live: %+v, %v; want nothing done", st, err)
	}
	st, err := l.Compact(context.Background(), 0.5)
	if err != nil {
		t.Fatal(err)
	}
	after := l.Stats()
	if st.Segments == 0 || st.Entries == 0 || after.Bytes >= before.Bytes {
		t.Fatalf("compact: %+v; bytes %d -> %d", st, before.Bytes, after.Bytes)
	}
	if after.Drops >= before.Drops {
		t.Errorf("drops %d -> %d: those of deleted segments stay", before.Drops, after.Drops)
	}
	check := func(l *Log) {
		t.Helper()
		wantSeqs(t, readAll(t, l, "x/long"), "x/long", 100, seqRange(1, 40)...)
		for i := range 40 {
			s := fmt.Sprint("x/short", i)
			want := seqRange(1, 5)
			if i < 35 {
				want = nil
			}
			wantSeqs(t, readAll(t, l, s), s, 100, want...)
		}
	}
	check(l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, dir, o)
	defer l.Close()
	check(l)
	if st, err := l.Compact(context.Background(), 1); err != nil || st.Segments == 0 {
		t.Fatalf("compact everything: %+v, %v", st, err)
	}
	check(l)
	if n := l.Stats().Segments; n > 3 {
		t.Errorf("%d segments after compacting every sealed one", n)
	}
}

// TestTornTailEndsTheSegment: a record cut short ends its segment's
// history; what came before it is read, and the log goes on in a new
// segment.
func TestTornTailEndsTheSegment(t *testing.T) {
	for _, tc := range []struct {
		name string
		tear func(b []byte, at int) []byte
	}{
		{"cut short", func(b []byte, at int) []byte { return b[:at+10] }},
		{"garbled", func(b []byte, at int) []byte { b[at+12] ^= 0xff; return b }},
		{"zeros past it", func(b []byte, at int) []byte { clear(b[at:]); return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l := openLog(t, dir, Options{})
			for seq := uint64(1); seq <= 5; seq++ {
				commit(t, l, func(b *Batch) { b.Append("x/a", seq, data("x/a", seq, 50)) })
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			segs, _ := filepath.Glob(filepath.Join(dir, "*"+segExt))
			if len(segs) != 1 {
				t.Fatalf("segments %v", segs)
			}
			b, err := os.ReadFile(segs[0])
			if err != nil {
				t.Fatal(err)
			}
			at := bytes.Index(b, []byte("x/a/5;")) - 20 // inside record 5, past its start
			if err := os.WriteFile(segs[0], tc.tear(b, at), 0o644); err != nil {
				t.Fatal(err)
			}
			// A crash leaves no sidecar for the segment being written.
			if err := os.Remove(strings.TrimSuffix(segs[0], segExt) + idxExt); err != nil {
				t.Fatal(err)
			}
			l = openLog(t, dir, Options{})
			defer l.Close()
			wantSeqs(t, readAll(t, l, "x/a"), "x/a", 50, seqRange(1, 4)...)
			commit(t, l, func(b *Batch) { b.Append("x/a", 5, data("x/a", 5, 50)) })
			wantSeqs(t, readAll(t, l, "x/a"), "x/a", 50, seqRange(1, 5)...)
		})
	}
}

// TestClosedLogRefuses: after Close, commits and reads fail with
// ErrClosed, and a second Close is harmless.
func TestClosedLogRefuses(t *testing.T) {
	l := openLog(t, t.TempDir(), Options{})
	commit(t, l, func(b *Batch) { b.Append("x/a", 1, []byte("a")) })
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	var b Batch
	b.Append("x/a", 2, []byte("b"))
	if err := l.Commit(context.Background(), &b); !errors.Is(err, ErrClosed) {
		t.Errorf("Commit after Close = %v", err)
	}
	if _, err := l.Read("x/a", 0, 1, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("Read after Close = %v", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

// TestCompactLooksAgainOnceADropCame: a segment found too live is not
// read again for as much until a drop comes; once one hides its entries,
// the next Compact drops it.
func TestCompactLooksAgainOnceADropCame(t *testing.T) {
	l := openLog(t, t.TempDir(), Options{SegmentSize: 4 << 10})
	defer l.Close()
	for seq := uint64(1); seq <= 100; seq++ {
		commit(t, l, func(b *Batch) { b.Append("x/a", seq, data("x/a", seq, 100)) })
	}
	for range 2 {
		if st, err := l.Compact(context.Background(), 0.5); err != nil || st.Segments != 0 {
			t.Fatalf("compact of a live log: %+v, %v", st, err)
		}
	}
	commit(t, l, func(b *Batch) { b.DropBefore("x/a", 101) })
	if st, err := l.Compact(context.Background(), 0.5); err != nil || st.Segments == 0 || st.Entries != 0 {
		t.Fatalf("compact once everything is dropped: %+v, %v", st, err)
	}
}

// TestReadOfASegmentCutShortUnderneathIsAnError: a sealed segment is read
// through a mapping; when its file loses its bytes behind the log's back
// (cut short by hand, or an I/O error under the mapping), a read of them
// fails with an error instead of killing the process with SIGBUS, and the
// log goes on serving what it can still read.
func TestReadOfASegmentCutShortUnderneathIsAnError(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("segments are mapped on Linux only")
	}
	dir := t.TempDir()
	l := openLog(t, dir, Options{})
	for seq := uint64(1); seq <= 50; seq++ {
		commit(t, l, func(b *Batch) { b.Append("x/a", seq, data("x/a", seq, 8<<10)) })
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, dir, Options{})
	defer l.Close()
	wantSeqs(t, readAll(t, l, "x/a"), "x/a", 8<<10, seqRange(1, 50)...)
	segs, _ := filepath.Glob(filepath.Join(dir, "*"+segExt))
	if len(segs) < 1 {
		t.Fatalf("segments %v", segs)
	}
	if err := os.Truncate(segs[0], 0); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Read("x/a", 0, 50, 0); err == nil {
		t.Fatal("a read of a segment whose bytes are gone succeeded")
	}
	commit(t, l, func(b *Batch) { b.Append("x/b", 1, data("x/b", 1, 50)) })
	wantSeqs(t, readAll(t, l, "x/b"), "x/b", 50, 1)
}
