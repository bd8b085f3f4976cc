package client

import (
	"context"
	"sync"
	"time"
)

// workerIdle is how long a worker waits for more work before it ends.
const workerIdle = 30 * time.Second

// workers runs functions on goroutines that stay for the next function
// instead of ending. A busy agent or runner would otherwise start a fresh
// goroutine for every execution or job, and grow its stack anew under the
// HTTP client's deep calls each time, a cost the bench's profile showed.
// After a burst the extra workers end by themselves.
type workers struct {
	// idle hands a function to a worker waiting for one; unbuffered, so a
	// send succeeds only when one is idle.
	idle chan func()
	wg   sync.WaitGroup
}

func newWorkers() *workers { return &workers{idle: make(chan func())} }

// run runs f on an idle worker, or on a new one. Workers end when ctx does;
// f must return by then too.
func (w *workers) run(ctx context.Context, f func()) {
	select {
	case w.idle <- f:
	default:
		w.wg.Go(func() { w.work(ctx, f) })
	}
}

// work runs f and then the functions handed to it while it is idle.
func (w *workers) work(ctx context.Context, f func()) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		f()
		idle.Reset(workerIdle)
		select {
		case f = <-w.idle:
		case <-idle.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// wait returns once every worker has ended.
func (w *workers) wait() { w.wg.Wait() }
