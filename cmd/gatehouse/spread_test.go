package main

import (
	"context"
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

// background runs peer (an agent or a runner the benchmark loads) until
// the benchmark ends, and waits for it to return before the server stops.
func background(b *testing.B, peer func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		peer(ctx)
	}()
	b.Cleanup(func() { cancel(); <-done })
}

// warm calls op until it first succeeds, which it does once the peers it
// needs are connected, and fails the benchmark if that takes over 20 s.
func warm(b *testing.B, op func() error) {
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := op()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b.Fatal(err)
		}
	}
}

// millis is a latency in milliseconds, for ReportMetric.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
