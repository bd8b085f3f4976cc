package seglog

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/gatehouse-dev/gatehouse/store/cutfs"
)

// powerCut cuts the power under l, open on m, and returns the folder as
// the disk holds it once the power is back. l is closed after the cut, a
// ghost whose every write is lost, so that m can be unmounted.
func powerCut(t *testing.T, m *cutfs.FS, l *Log, o cutfs.CutOptions) string {
	t.Helper()
	if _, err := m.Cut(o); err != nil {
		t.Fatal(err)
	}
	_ = l.Close()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	return m.Backing()
}

// wantPrefix fails unless stream holds exactly 1..n, for some n of at
// least acked, each with its data: a power cut may keep more than was
// acknowledged, never less, and never leaves a gap.
func wantPrefix(t *testing.T, l *Log, stream string, acked uint64, size int) {
	t.Helper()
	es := readAll(t, l, stream)
	if uint64(len(es)) < acked {
		t.Fatalf("%s: %d entries after the cut, %d were acknowledged", stream, len(es), acked)
	}
	wantSeqs(t, es, stream, size, seqRange(1, uint64(len(es)))...)
}

// TestPowerCutFSKeepsEveryCommitReturned: under SyncAlways, every commit
// that returned is there after a power cut that tears the last write, with
// concurrent committers across several segments; and the log goes on.
func TestPowerCutFSKeepsEveryCommitReturned(t *testing.T) {
	t.Parallel()
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			m := cutfs.MountForTest(t, t.TempDir(), cutfs.Options{})
			o := Options{SegmentSize: 16 << 10}
			l := openLog(t, m.Dir(), o)
			acked := make([]uint64, 8)
			var wg sync.WaitGroup
			for w := range acked {
				wg.Go(func() {
					s := fmt.Sprint("x/w", w)
					for seq := uint64(1); seq <= 30; seq++ {
						var b Batch
						b.Append(s, seq, data(s, seq, 300))
						if err := l.Commit(context.Background(), &b); err != nil {
							t.Error(err)
							return
						}
						acked[w] = seq
					}
				})
			}
			wg.Wait()
			if n := l.Stats().Segments; n < 3 {
				t.Fatalf("%d segments; the test wants several", n)
			}
			dir := powerCut(t, m, l, cutfs.CutOptions{Tear: true, Seed: seed})
			r := openLog(t, dir, o)
			defer r.Close()
			for w, n := range acked {
				wantPrefix(t, r, fmt.Sprint("x/w", w), n, 300)
			}
			commit(t, r, func(b *Batch) { b.Append("x/w0", 31, data("x/w0", 31, 300)) })
			if _, last, _ := r.Bounds("x/w0"); last != 31 {
				t.Errorf("last %d after a write past the cut", last)
			}
		})
	}
}

// TestPowerCutFSSyncNoneKeepsWhatSyncCovered: under SyncNone, what Sync
// covered is kept, and what came after it is lost only from the end.
func TestPowerCutFSSyncNoneKeepsWhatSyncCovered(t *testing.T) {
	t.Parallel()
	m := cutfs.MountForTest(t, t.TempDir(), cutfs.Options{})
	o := Options{Sync: SyncNone, SegmentSize: 16 << 10}
	l := openLog(t, m.Dir(), o)
	for seq := uint64(1); seq <= 120; seq++ {
		commit(t, l, func(b *Batch) { b.Append("x/a", seq, data("x/a", seq, 300)) })
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if l.Durable() != l.LastVersion() {
		t.Fatalf("durable %d after Sync, last %d", l.Durable(), l.LastVersion())
	}
	for seq := uint64(121); seq <= 150; seq++ {
		commit(t, l, func(b *Batch) { b.Append("x/a", seq, data("x/a", seq, 300)) })
	}
	dir := powerCut(t, m, l, cutfs.CutOptions{Tear: true, Seed: 7})
	r := openLog(t, dir, o)
	defer r.Close()
	wantPrefix(t, r, "x/a", 120, 300)
}

// TestPowerCutFSCompactionLosesNothing: a power cut right after a
// compaction keeps every live entry, copied forward, and the drops still
// hide what they hid.
func TestPowerCutFSCompactionLosesNothing(t *testing.T) {
	t.Parallel()
	m := cutfs.MountForTest(t, t.TempDir(), cutfs.Options{})
	o := Options{Sync: SyncNone, SegmentSize: 4 << 10}
	l := openLog(t, m.Dir(), o)
	for i := range 30 {
		s := fmt.Sprint("x/short", i)
		commit(t, l, func(b *Batch) {
			for seq := uint64(1); seq <= 4; seq++ {
				b.Append(s, seq, data(s, seq, 100))
			}
			b.Append("x/long", uint64(i+1), data("x/long", uint64(i+1), 100))
		})
		commit(t, l, func(b *Batch) { b.DropBefore(s, 3) })
	}
	st, err := l.Compact(context.Background(), 0.9)
	if err != nil || st.Segments == 0 || st.Entries == 0 {
		t.Fatalf("compact: %+v, %v", st, err)
	}
	dir := powerCut(t, m, l, cutfs.CutOptions{})
	r := openLog(t, dir, o)
	defer r.Close()
	wantSeqs(t, readAll(t, r, "x/long"), "x/long", 100, seqRange(1, 30)...)
	for i := range 30 {
		s := fmt.Sprint("x/short", i)
		wantSeqs(t, readAll(t, r, s), s, 100, 3, 4)
	}
}
