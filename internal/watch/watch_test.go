package watch

import (
	"sync"
	"sync/atomic"
	"testing"
)

// fired reports whether c has a value, without waiting.
func fired(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestNotifyWakesTheLogsWatchesOnce(t *testing.T) {
	var s Set
	a, b, other := s.Watch("x"), s.Watch("x"), s.Watch("y")
	var wakes atomic.Int32
	a.OnWake(func() { wakes.Add(1) })
	s.Notify("x")
	s.Notify("x")
	if !fired(a.C()) || !fired(b.C()) {
		t.Fatal("a watch of the log did not fire")
	}
	if fired(a.C()) {
		t.Fatal("two notifications unread make two values: C must coalesce them")
	}
	if fired(other.C()) {
		t.Fatal("another log's watch fired")
	}
	if wakes.Load() != 2 {
		t.Fatalf("OnWake ran %d times for 2 notifications", wakes.Load())
	}
	b.Stop()
	s.Notify("x")
	if fired(b.C()) {
		t.Fatal("a stopped watch fired")
	}
}

func TestIdleRunsWhenTheLastWatchStops(t *testing.T) {
	var idle []string
	s := Set{Idle: func(id string) { idle = append(idle, id) }}
	a, b := s.Watch("x"), s.Watch("x")
	a.Stop()
	if len(idle) != 0 || !s.Watched("x") {
		t.Fatalf("idle %v with a watch left", idle)
	}
	b.Stop()
	b.Stop()
	if len(idle) != 1 || idle[0] != "x" || s.Watched("x") {
		t.Fatalf("idle %v after the last watch stopped (twice), want [x]", idle)
	}
}

func TestCloseEndsEveryWatch(t *testing.T) {
	var s Set
	a := s.Watch("x")
	var woken atomic.Bool
	a.OnWake(func() { woken.Store(true) })
	s.Close()
	s.Close()
	if !fired(a.Done()) || !woken.Load() {
		t.Fatal("Close did not close Done and run OnWake")
	}
	late := s.Watch("x")
	if !fired(late.Done()) {
		t.Fatal("a watch started after Close is not done")
	}
	var ran bool
	late.OnWake(func() { ran = true })
	if !ran {
		t.Fatal("OnWake after Close did not run at once")
	}
}

// TestConcurrentUse runs watches, notifications and stops at once (with
// -race, which checks the locking).
func TestConcurrentUse(t *testing.T) {
	var s Set
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			id := string(rune('a' + g%2))
			for range 200 {
				w := s.Watch(id)
				w.OnWake(func() {})
				s.Notify(id)
				<-w.C()
				w.Stop()
			}
		})
	}
	wg.Wait()
	if s.Watched("a") || s.Watched("b") {
		t.Fatal("watches left after every one stopped")
	}
}

// TestWatchAllocs bounds a watch's cost: one is started and stopped for
// every execution stream, so the log's list and Done channel must not be
// allocated per watch.
func TestWatchAllocs(t *testing.T) {
	var s Set
	keep := s.Watch("other")
	defer keep.Stop()
	n := testing.AllocsPerRun(100, func() {
		w := s.Watch("x")
		w.Stop()
	})
	if n > 2 { // the Watch and its C
		t.Errorf("Watch and Stop: %v allocations, want at most 2", n)
	}
}

func TestStopUnlinksAnyWatchOfTheList(t *testing.T) {
	var s Set
	a, b, c := s.Watch("x"), s.Watch("x"), s.Watch("x")
	b.Stop()
	s.Notify("x")
	if !fired(a.C()) || fired(b.C()) || !fired(c.C()) {
		t.Fatal("stopping the middle watch broke the list")
	}
	c.Stop()
	a.Stop()
	if s.Watched("x") {
		t.Fatal("x is still watched after every watch stopped")
	}
}
