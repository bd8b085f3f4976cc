package memory

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// gatedCalls runs calls on a sched that block until released, and tells
// in which order they started.
type gatedCalls struct {
	t       *testing.T
	s       *sched
	started chan string
	wg      sync.WaitGroup
	mu      sync.Mutex
	gates   map[string]chan struct{}
	errs    map[string]error
}

func newGatedCalls(t *testing.T, s *sched) *gatedCalls {
	g := &gatedCalls{t: t, s: s, started: make(chan string, 64), gates: map[string]chan struct{}{}, errs: map[string]error{}}
	t.Cleanup(func() {
		g.mu.Lock()
		for _, c := range g.gates {
			select {
			case <-c:
			default:
				close(c)
			}
		}
		g.mu.Unlock()
		g.wg.Wait()
	})
	return g
}

// submit starts call name of turn on its own goroutine; it blocks in the
// call until release(name).
func (g *gatedCalls) submit(ctx context.Context, turn, name string) {
	gate := make(chan struct{})
	g.mu.Lock()
	g.gates[name] = gate
	g.mu.Unlock()
	queued := make(chan struct{})
	g.wg.Go(func() {
		w, err := g.s.enter(turn)
		close(queued)
		if err == nil {
			err = g.s.wait(ctx, w, func() error {
				g.started <- name
				<-gate
				return nil
			})
		}
		g.mu.Lock()
		g.errs[name] = err
		g.mu.Unlock()
	})
	<-queued
}

func (g *gatedCalls) release(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.gates[name])
}

// next is the next call to start.
func (g *gatedCalls) next() string { return <-g.started }

// none fails if a call has started that next has not returned.
func (g *gatedCalls) none() {
	g.t.Helper()
	select {
	case name := <-g.started:
		g.t.Fatalf("%s started", name)
	default:
	}
}

// TestAnotherTenantsReadIsNotHeldBehindSlowSearches: with two workers,
// one tenant runs at most one call at a time, so while its slow calls
// run and queue, another tenant's call starts at once.
func TestAnotherTenantsReadIsNotHeldBehindSlowSearches(t *testing.T) {
	g := newGatedCalls(t, newSched(2, 8, 32))
	ctx := context.Background()
	for _, name := range []string{"a1", "a2", "a3", "a4"} {
		g.submit(ctx, "a", name)
	}
	if got := g.next(); got != "a1" {
		t.Fatalf("first: %s", got)
	}
	g.none()
	g.submit(ctx, "b", "b-read")
	if got := g.next(); got != "b-read" {
		t.Fatalf("another tenant's call waits; %s started", got)
	}
	g.release("b-read")
	g.none()
	g.release("a1")
	if got := g.next(); got != "a2" {
		t.Fatalf("after a1: %s", got)
	}
}

// TestTenantsTakeTurns: with one worker, the tenants with calls waiting
// take one call each in turn, the one served least recently first,
// whatever was queued first.
func TestTenantsTakeTurns(t *testing.T) {
	g := newGatedCalls(t, newSched(1, 8, 32))
	ctx := context.Background()
	for _, c := range [][2]string{{"a", "a1"}, {"a", "a2"}, {"a", "a3"}, {"b", "b1"}, {"b", "b2"}, {"c", "c1"}} {
		g.submit(ctx, c[0], c[1])
	}
	var order []string
	for range 6 {
		name := g.next()
		order = append(order, name)
		g.none()
		g.release(name)
	}
	want := []string{"a1", "b1", "c1", "a2", "b2", "a3"}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("order %v, want %v", order, want)
		}
	}
}

// TestQueuesAreBounded: past its tenant's bound, or past the bound of
// everyone's calls, a call is refused at once with ErrBusy, and the
// others go on.
func TestQueuesAreBounded(t *testing.T) {
	s := newSched(1, 2, 3)
	g := newGatedCalls(t, s)
	ctx := context.Background()
	g.submit(ctx, "a", "a1")
	g.submit(ctx, "a", "a2")
	if err := s.do(ctx, "a", func() error { t.Error("ran past the tenant's bound"); return nil }); !errors.Is(err, ErrBusy) {
		t.Fatalf("a's third call: %v", err)
	}
	g.submit(ctx, "b", "b1")
	if err := s.do(ctx, "c", func() error { t.Error("ran past the bound"); return nil }); !errors.Is(err, ErrBusy) {
		t.Fatalf("a fourth call in all: %v", err)
	}
	for _, want := range []string{"a1", "b1", "a2"} {
		if got := g.next(); got != want {
			t.Fatalf("%s started, want %s", got, want)
		}
		g.release(want)
	}
}

// TestCancelledCallLeavesTheQueue: a call whose context ends while it
// waits returns the context's error without running, and leaves nothing
// behind: the next call runs, and the sched is empty at the end.
func TestCancelledCallLeavesTheQueue(t *testing.T) {
	s := newSched(1, 8, 32)
	g := newGatedCalls(t, s)
	g.submit(context.Background(), "a", "a1")
	if got := g.next(); got != "a1" {
		t.Fatal(got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := s.enter("b")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.wait(ctx, w, func() error { t.Error("a cancelled call ran"); return nil }) }()
	g.submit(context.Background(), "c", "c1")
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	g.release("a1")
	if got := g.next(); got != "c1" {
		t.Fatal(got)
	}
	g.release("c1")
	g.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running != 0 || s.held != 0 || len(s.turns) != 0 || len(s.ring) != 0 {
		t.Fatalf("left behind: running %d, held %d, turns %v, ring %v", s.running, s.held, s.turns, s.ring)
	}
}
