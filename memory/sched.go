package memory

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// sched runs memory calls on a bounded number of workers, fairly between
// turns (tenants): a free worker goes to the turn with calls waiting that
// was served least recently, so that a turn with many slow calls queued
// delays another's next call by at most the calls already running. One
// turn runs at most all workers but one, so that another turn's call finds
// a worker free or is the next to get one. Calls wait in a bounded queue,
// per turn and in all; past it a call is refused at once with ErrBusy. A
// call whose context ends while it waits leaves the queue.
//
// There are no worker goroutines: a call runs on its caller's goroutine
// once it holds one of the workers' places.
type sched struct {
	workers   int // calls running at once
	perTurn   int // calls of one turn running at once
	turnQueue int // calls of one turn waiting or running
	queue     int // calls waiting or running

	mu      sync.Mutex
	running int
	held    int    // calls waiting or running
	served  uint64 // grants so far: the clock of turnQueue.served
	turns   map[string]*turnQueue
	// ring holds the turns with calls waiting, in the order they came.
	ring []*turnQueue
}

// turnQueue is the calls of one turn; it is kept while it has any.
type turnQueue struct {
	key     string
	waiting []*waiter
	running int
	served  uint64 // when a call of the turn was last granted; 0: never
	inRing  bool
}

type waiter struct {
	q       *turnQueue
	ready   chan struct{} // closed once granted
	granted bool
}

func newSched(workers, perTurnQueue, queue int) *sched {
	return &sched{workers: workers, perTurn: max(1, workers-1), turnQueue: perTurnQueue, queue: queue, turns: map[string]*turnQueue{}}
}

// do runs fn once a worker is free for turn, and returns its error; or
// ErrBusy when turn's queue or the whole queue is full; or ctx's error
// when ctx ends before fn starts.
func (s *sched) do(ctx context.Context, turn string, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w, err := s.enter(turn)
	if err != nil {
		return err
	}
	return s.wait(ctx, w, fn)
}

// wait runs fn once w is granted a place, or leaves the queue when ctx
// ends first.
func (s *sched) wait(ctx context.Context, w *waiter, fn func() error) error {
	select {
	case <-w.ready:
	case <-ctx.Done():
		if !s.abandon(w) {
			// Granted meanwhile: the place is given back at once.
			s.leave(w.q)
		}
		return ctx.Err()
	}
	defer s.leave(w.q)
	return fn()
}

// enter queues a call of turn, granting it a place at once when one is
// free and it is turn's go.
func (s *sched) enter(turn string) (*waiter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.turns[turn]
	if q == nil {
		q = &turnQueue{key: turn}
	}
	switch {
	case q.running+len(q.waiting) >= s.turnQueue:
		return nil, fmt.Errorf("%w: this tenant has %d memory calls waiting or running, the most it may", ErrBusy, s.turnQueue)
	case s.held >= s.queue:
		return nil, fmt.Errorf("%w: %d memory calls are waiting or running, the most there may be", ErrBusy, s.queue)
	}
	s.turns[turn] = q
	w := &waiter{q: q, ready: make(chan struct{})}
	q.waiting = append(q.waiting, w)
	s.held++
	if !q.inRing {
		q.inRing = true
		s.ring = append(s.ring, q)
	}
	s.grant()
	return w, nil
}

// grant gives the free places to the waiting calls: each to the first
// call of the turn served least recently among those below their share
// of the workers (the earliest in the ring on a tie). The caller holds
// s.mu.
func (s *sched) grant() {
	for s.running < s.workers {
		i := -1
		for j, q := range s.ring {
			if q.running < s.perTurn && (i < 0 || q.served < s.ring[i].served) {
				i = j
			}
		}
		if i < 0 {
			return
		}
		q := s.ring[i]
		w := q.waiting[0]
		q.waiting[0] = nil
		q.waiting = q.waiting[1:]
		w.granted = true
		close(w.ready)
		s.served++
		q.served = s.served
		q.running++
		s.running++
		if len(q.waiting) == 0 {
			q.inRing = false
			s.ring = slices.Delete(s.ring, i, i+1)
		}
	}
}

// leave gives back the place of a call of q that ran.
func (s *sched) leave(q *turnQueue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q.running--
	s.running--
	s.held--
	s.forget(q)
	s.grant()
}

// abandon takes w out of the queue, unless it was granted a place.
func (s *sched) abandon(w *waiter) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.granted {
		return false
	}
	q := w.q
	q.waiting = slices.DeleteFunc(q.waiting, func(x *waiter) bool { return x == w })
	s.held--
	if len(q.waiting) == 0 && q.inRing {
		q.inRing = false
		s.ring = slices.DeleteFunc(s.ring, func(x *turnQueue) bool { return x == q })
	}
	s.forget(q)
	return true
}

// forget drops q once it has no call.
func (s *sched) forget(q *turnQueue) {
	if q.running == 0 && len(q.waiting) == 0 {
		delete(s.turns, q.key)
	}
}
