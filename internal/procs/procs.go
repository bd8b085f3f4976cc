// Package procs runs the Go scheduler on one processor while the requests
// it serves are few, and on all of them under load.
//
// With little to do, every hand-over between goroutines (a request's, the
// stream that carries what it caused, the store's apply stage) may wake
// another processor's thread on another CPU, and in a virtual machine that
// wake-up costs more than the work it hands over: a gateway serving one
// execution at a time spent a fifth less CPU on one processor, and
// answered as soon or up to a tenth sooner (docs/performance.md). Under load the other processors
// carry the throughput. A Governor measures the load as the requests in
// flight on average (the time spent serving them over the time elapsed)
// and moves GOMAXPROCS between one and all.
package procs

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/option"
)

// Governor moves GOMAXPROCS between one and Max with the load. Tell it of
// every request served (Served) and Run it for as long as it governs; the
// zero value is ready.
type Governor struct {
	// Max is the processors under load; zero: GOMAXPROCS when Run starts.
	Max int
	// Interval is how often the load is looked at; zero: 50 ms.
	Interval time.Duration
	// Calm is how many intervals in a row below one request in flight on
	// average go to one processor; zero: 20 (a second, by default). A
	// change stops the world for a moment: it is made only after a lull.
	Calm int

	busy  atomic.Int64 // nanoseconds spent serving since the last look
	procs atomic.Int64
}

// The load, in requests in flight on average, at or above which the
// governor goes to all the processors at once (one processor no longer
// keeps up: requests wait for it), and below which, for Calm intervals, it
// goes to one.
const (
	upLoad   = 1.5
	downLoad = 1.0
)

// Served counts a request that took d to serve.
func (g *Governor) Served(d time.Duration) { g.busy.Add(int64(d)) }

// Procs returns the processors it set last; zero before Run.
func (g *Governor) Procs() int { return int(g.procs.Load()) }

// Run governs until ctx ends, then gives the scheduler Max processors back.
func (g *Governor) Run(ctx context.Context) {
	option.Default(&g.Max, runtime.GOMAXPROCS(0))
	option.Default(&g.Interval, 50*time.Millisecond)
	option.Default(&g.Calm, 20)
	set := func(n int) {
		if int(g.procs.Load()) != n {
			runtime.GOMAXPROCS(n)
			g.procs.Store(int64(n))
		}
	}
	set(g.Max)
	defer set(g.Max)
	t := time.NewTicker(g.Interval)
	defer t.Stop()
	last, calm := time.Now(), 0
	for {
		var now time.Time
		select {
		case <-ctx.Done():
			return
		case now = <-t.C:
		}
		load := float64(g.busy.Swap(0)) / float64(now.Sub(last))
		last = now
		var n int
		n, calm = decide(g.Procs(), g.Max, calm, g.Calm, load)
		set(n)
	}
}

// decide returns the processors for an interval's load, from procs now,
// and the intervals of calm counted so far.
func decide(procs, max, calm, calmWanted int, load float64) (int, int) {
	switch {
	case load >= upLoad:
		return max, 0
	case load >= downLoad:
		return procs, 0
	case calm+1 >= calmWanted:
		return 1, calm + 1
	default:
		return procs, calm + 1
	}
}
