package main

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// spread runs b.N operations on workers goroutines, each calling the op
// newOp made for it (so an op may keep state between its calls, a session
// id, say), and returns one benchResult per latency series the ops report,
// all over the same wall time.
func spread(b *testing.B, workers, series int, newOp func() func() ([]time.Duration, error)) []*benchResult {
	results := make([]*benchResult, series)
	for i := range results {
		results[i] = &benchResult{}
	}
	var mu sync.Mutex
	work := make(chan struct{}, b.N)
	for range b.N {
		work <- struct{}{}
	}
	close(work)
	b.ResetTimer()
	t0 := time.Now()
	var wg sync.WaitGroup
	for range workers {
		op := newOp()
		wg.Go(func() {
			for range work {
				lat, err := op()
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				for i, d := range lat {
					results[i].latencies = append(results[i].latencies, d)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(t0)
	b.StopTimer()
	for _, r := range results {
		r.elapsed = elapsed
		slices.Sort(r.latencies)
	}
	return results
}

// millis is a latency in milliseconds, for ReportMetric.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
