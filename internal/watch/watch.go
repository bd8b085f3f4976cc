// Package watch wakes the readers of logs that grow. A reader watches a log
// by id before it reads what is there, then reads again each time its watch
// fires, so that nothing appended in between is missed. A watch carries no
// data: a slow reader costs no memory and cannot miss anything, because it
// reads after the last position it has.
//
// The kernel's execution logs and the sessions' logs are watched this way.
package watch

import "sync"

// Set is the watches of many logs, by log id. The zero Set is ready to use.
type Set struct {
	// Idle, when set, runs once the last watch of a log has stopped, without
	// the set's lock held: an owner may then drop what it keeps for the
	// log's readers.
	Idle func(id string)

	mu sync.Mutex
	// byID holds the first watch of each watched log, the others linked
	// from it: a list threaded through the watches costs nothing to start,
	// where a set of its own per log would be allocated whenever a log
	// gains its first watch (each execution's stream).
	byID map[string]*Watch
	// done is every watch's Done, closed by Close: one channel for all
	// rather than one per watch.
	done   chan struct{}
	closed bool
}

// Watch is one reader's watch of one log.
type Watch struct {
	set        *Set
	id         string
	c          chan struct{}
	done       chan struct{}
	wake       func() // with set.mu
	prev, next *Watch // with set.mu: the log's other watches
	listed     bool   // with set.mu: in byID's list, not stopped
}

// Watch starts watching log id. Call it before reading the log. A watch
// started after Close is done at once.
func (s *Set) Watch(id string) *Watch {
	w := &Watch{set: s, id: id, c: make(chan struct{}, 1)}
	s.mu.Lock()
	defer s.mu.Unlock()
	w.done = s.doneLocked()
	if s.closed {
		return w
	}
	if s.byID == nil {
		s.byID = map[string]*Watch{}
	}
	if first := s.byID[id]; first != nil {
		w.next, first.prev = first, w
	}
	s.byID[id] = w
	w.listed = true
	return w
}

// doneLocked returns the channel every watch's Done is, made at its first
// use so that the zero Set is ready; the caller holds s.mu.
func (s *Set) doneLocked() chan struct{} {
	if s.done == nil {
		s.done = make(chan struct{})
	}
	return s.done
}

// Watched reports whether log id has a watch.
func (s *Set) Watched(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byID[id] != nil
}

// Notify wakes every watch of log id: its C receives (once, however many
// notifications it has not read yet) and its OnWake function runs.
func (s *Set) Notify(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for w := s.byID[id]; w != nil; w = w.next {
		select {
		case w.c <- struct{}{}:
		default:
		}
		if w.wake != nil {
			w.wake()
		}
	}
}

// Close ends every watch, at shutdown: each Done closes and each OnWake
// function runs once more. Closing again does nothing.
func (s *Set) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	close(s.doneLocked())
	for _, first := range s.byID {
		for w := first; w != nil; w = w.next {
			if w.wake != nil {
				w.wake()
			}
		}
	}
}

// C receives a value when the log may have grown.
func (w *Watch) C() <-chan struct{} { return w.c }

// Done is closed when the set closes.
func (w *Watch) Done() <-chan struct{} { return w.done }

// OnWake makes f run, with the set's lock held, each time C receives and
// when Done closes (at once if it has), so that a reader can wait without
// a goroutine blocked on the channels. f must return quickly and must not
// call into the set.
func (w *Watch) OnWake(f func()) {
	w.set.mu.Lock()
	w.wake = f
	closed := w.set.closed
	w.set.mu.Unlock()
	if closed && f != nil {
		f()
	}
}

// Stop ends the watch; stopping it again does nothing.
func (w *Watch) Stop() {
	s := w.set
	s.mu.Lock()
	idle := false
	if w.listed {
		w.listed = false
		if w.next != nil {
			w.next.prev = w.prev
		}
		switch {
		case w.prev != nil:
			w.prev.next = w.next
		case w.next != nil:
			s.byID[w.id] = w.next
		default:
			delete(s.byID, w.id)
			idle = true
		}
		w.prev, w.next = nil, nil
	}
	s.mu.Unlock()
	if idle && s.Idle != nil {
		s.Idle(w.id)
	}
}
