package procs

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
)

func TestDecideGoesDownAfterALullAndUpAtOnce(t *testing.T) {
	for _, c := range []struct {
		name             string
		procs, calm      int
		load             float64
		wantProcs, wantC int
	}{
		{"quiet, not yet a lull", 4, 0, 0.2, 4, 1},
		{"quiet, the lull is long enough", 4, 2, 0.2, 1, 3},
		{"quiet on one processor", 1, 7, 0.9, 1, 8},
		{"busy enough to break the lull, not to go up", 1, 7, 1.2, 1, 0},
		{"busy enough to break the lull on all of them", 4, 2, 1.0, 4, 0},
		{"one processor no longer keeps up", 1, 9, 1.5, 4, 0},
		{"loaded", 4, 0, 12, 4, 0},
	} {
		procs, calm := decide(c.procs, 4, c.calm, 3, c.load)
		if procs != c.wantProcs || calm != c.wantC {
			t.Errorf("%s: decide(%d, 4, %d, 3, %v) = %d, %d; want %d, %d",
				c.name, c.procs, c.calm, c.load, procs, calm, c.wantProcs, c.wantC)
		}
	}
}

// TestGovernorFollowsTheLoad runs a Governor on this test binary's own
// scheduler: one processor after a lull, all of them under load, and all
// of them again once it stops.
func TestGovernorFollowsTheLoad(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	g := &Governor{Max: 2, Interval: 5 * time.Millisecond, Calm: 3}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Run(ctx)
	}()
	procs := func(n int) func() bool {
		return func() bool { return g.Procs() == n && runtime.GOMAXPROCS(0) == n }
	}
	eventually.True(t, "one processor with nothing served", procs(1))

	// Requests that took longer than the time they were served in: a load
	// of several in flight, whatever the interval.
	stop := make(chan struct{})
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				g.Served(time.Second)
			}
		}
	}()
	eventually.True(t, "all the processors under load", procs(2))
	close(stop)
	<-loaded
	eventually.True(t, "one processor after the lull", procs(1))

	cancel()
	<-done
	if n := runtime.GOMAXPROCS(0); n != 2 {
		t.Fatalf("GOMAXPROCS %d after Run, want Max (2)", n)
	}
}
