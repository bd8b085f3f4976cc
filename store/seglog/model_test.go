package seglog

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestLogAgreesWithAModel: random appends, drops (streams dropped whole
// and begun again at 1 included), compactions and restarts over small
// segments, checked after every step against a map of what each stream
// holds.
func TestLogAgreesWithAModel(t *testing.T) {
	t.Parallel()
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, seed))
			dir := t.TempDir()
			o := Options{SegmentSize: 8 << 10}
			l := openLog(t, dir, o)
			defer func() { l.Close() }()
			streams := []string{"x/a", "x/b", "s/c", "chlog/d", "x/e"}
			model := map[string]map[uint64]string{}
			next := map[string]uint64{}
			for step := range 300 {
				switch r := rng.IntN(100); {
				case r < 3:
					if err := l.Close(); err != nil {
						t.Fatal(err)
					}
					l = openLog(t, dir, o)
				case r < 8:
					if _, err := l.Compact(context.Background(), rng.Float64()); err != nil {
						t.Fatal(err)
					}
				default:
					var b Batch
					// A drop hides what came before its batch, not the
					// appends beside it, which share its version.
					fresh := map[string]map[uint64]bool{}
					for range 1 + rng.IntN(4) {
						s := streams[rng.IntN(len(streams))]
						if model[s] == nil {
							model[s] = map[uint64]string{}
						}
						if rng.IntN(6) == 0 && next[s] > 0 {
							before := 1 + rng.Uint64N(next[s]+1)
							b.DropBefore(s, before)
							for seq := range model[s] {
								if seq < before && !fresh[s][seq] {
									delete(model[s], seq)
								}
							}
							if before > next[s] && rng.IntN(2) == 0 {
								next[s] = 0 // dropped whole: begins again at 1
							}
							continue
						}
						next[s]++
						d := fmt.Sprintf("%s/%d@%d;%s", s, next[s], step, string(make([]byte, rng.IntN(300))))
						b.Append(s, next[s], []byte(d))
						model[s][next[s]] = d
						if fresh[s] == nil {
							fresh[s] = map[uint64]bool{}
						}
						fresh[s][next[s]] = true
					}
					if err := l.Commit(context.Background(), &b); err != nil {
						t.Fatal(err)
					}
				}
				if step%5 != 4 {
					continue
				}
				for _, s := range streams {
					want := slices.Sorted(func(yield func(uint64) bool) {
						for seq := range model[s] {
							if !yield(seq) {
								return
							}
						}
					})
					got := readAll(t, l, s)
					if len(got) != len(want) {
						t.Fatalf("step %d, %s: %v, want %v", step, s, seqsOfEntries(got), want)
					}
					for i, e := range got {
						if e.Seq != want[i] || string(e.Data) != model[s][e.Seq] {
							t.Fatalf("step %d, %s: entry %d = %d %.20q, want %d %.20q", step, s, i, e.Seq, e.Data, want[i], model[s][want[i]])
						}
					}
					f, la, err := l.Bounds(s)
					if err != nil {
						t.Fatal(err)
					}
					if len(want) == 0 && (f != 0 || la != 0) || len(want) > 0 && (f != want[0] || la != want[len(want)-1]) {
						t.Fatalf("step %d, %s: bounds %d-%d, want %v", step, s, f, la, want)
					}
				}
			}
		})
	}
}

func seqsOfEntries(es []Entry) []uint64 {
	out := make([]uint64, len(es))
	for i, e := range es {
		out[i] = e.Seq
	}
	return out
}
