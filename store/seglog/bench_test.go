package seglog

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The benchmarks measure what issue 29 asks of a log engine, side by side
// with an embedded JetStream file store (jetstream_bench_test.go):
//
//	go test -run '^$' -bench . -benchtime 2s ./store/seglog/
//
// BenchmarkAppend: commits of one 512-byte entry each, from 1, 8 and 32
// concurrent appenders, each to its own stream, synced per group
// (SyncAlways): commits/s, and each commit's latency at p50 and p99.
// BenchmarkReplay: a resuming client reading one stream of 100,000 events
// from its start, pages of 1,024: events/s.

const (
	benchEntry   = 512
	replayEvents = 100_000
	replayEntry  = 200
	replayPage   = 1024
)

var appenders = []int{1, 8, 32}

// latencies gathers commit latencies from concurrent appenders.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d []time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d...)
	l.mu.Unlock()
}

func (l *latencies) report(b *testing.B, elapsed time.Duration, ops int) {
	slices.Sort(l.d)
	if len(l.d) == 0 {
		return
	}
	b.ReportMetric(float64(ops)/elapsed.Seconds(), "commits/s")
	b.ReportMetric(float64(l.d[len(l.d)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(l.d[len(l.d)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(0, "ns/op")
}

// runAppenders runs b.N commits from n goroutines, each timing its own.
func runAppenders(b *testing.B, n int, commit func(w int, seq uint64) error) {
	var (
		next atomic.Int64
		lat  latencies
		wg   sync.WaitGroup
	)
	b.ResetTimer()
	start := time.Now()
	for w := range n {
		wg.Go(func() {
			var mine []time.Duration
			for seq := uint64(1); next.Add(1) <= int64(b.N); seq++ {
				t := time.Now()
				if err := commit(w, seq); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(t))
			}
			lat.add(mine)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	lat.report(b, elapsed, b.N)
}

func BenchmarkAppend(b *testing.B) {
	payload := make([]byte, benchEntry)
	for _, n := range appenders {
		b.Run(fmt.Sprint("appenders=", n), func(b *testing.B) {
			l := openLog(b, b.TempDir(), Options{})
			defer l.Close()
			runAppenders(b, n, func(w int, seq uint64) error {
				var bt Batch
				bt.Append(fmt.Sprint("x/w", w), seq, payload)
				return l.Commit(context.Background(), &bt)
			})
			b.ReportMetric(float64(b.N)/float64(l.Stats().Records), "commits/sync")
		})
	}
}

// fillReplay writes replayEvents entries to stream "x/replay", with
// others interleaved (other streams appended in the same groups).
func fillReplay(b *testing.B, l *Log, others int) {
	payload := make([]byte, replayEntry)
	for seq := uint64(1); seq <= replayEvents; seq += 64 {
		var bt Batch
		for s := seq; s < seq+64 && s <= replayEvents; s++ {
			bt.Append("x/replay", s, payload)
			for o := range others {
				bt.Append(fmt.Sprint("x/other", o), s, payload)
			}
		}
		if err := l.Commit(context.Background(), &bt); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReplay(b *testing.B) {
	for _, tc := range []struct {
		name   string
		others int
	}{{"alone", 0}, {"interleaved=7", 7}} {
		b.Run(tc.name, func(b *testing.B) {
			dir := b.TempDir()
			l := openLog(b, dir, Options{Sync: SyncNone})
			fillReplay(b, l, tc.others)
			// Read back as after a restart: sealed segments, through
			// their sidecars.
			if err := l.Close(); err != nil {
				b.Fatal(err)
			}
			l = openLog(b, dir, Options{Sync: SyncNone})
			defer l.Close()
			b.ResetTimer()
			start := time.Now()
			events := 0
			for range b.N {
				after := uint64(0)
				for {
					es, err := l.Read("x/replay", after, replayPage, 0)
					if err != nil {
						b.Fatal(err)
					}
					if len(es) == 0 {
						break
					}
					events += len(es)
					after = es[len(es)-1].Seq
				}
			}
			b.StopTimer()
			if events != b.N*replayEvents {
				b.Fatalf("read %d events, want %d", events, b.N*replayEvents)
			}
			b.ReportMetric(float64(events)/time.Since(start).Seconds(), "events/s")
		})
	}
}
