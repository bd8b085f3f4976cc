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

	mu     sync.Mutex
	byID   map[string]map[*Watch]struct{}
	closed bool
}

// Watch is one reader's watch of one log.
type Watch struct {
	set  *Set
	id   string
	c    chan struct{}
	done chan struct{}
	wake func() // with set.mu
}

// Watch starts watching log id. Call it before reading the log. A watch
// started after Close is done at once.
func (s *Set) Watch(id string) *Watch {
	w := &Watch{set: s, id: id, c: make(chan struct{}, 1), done: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		close(w.done)
		return w
	}
	if s.byID == nil {
		s.byID = map[string]map[*Watch]struct{}{}
	}
	ws := s.byID[id]
	if ws == nil {
		ws = map[*Watch]struct{}{}
		s.byID[id] = ws
	}
	ws[w] = struct{}{}
	return w
}

// Watched reports whether log id has a watch.
func (s *Set) Watched(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID[id]) > 0
}

// Notify wakes every watch of log id: its C receives (once, however many
// notifications it has not read yet) and its OnWake function runs.
func (s *Set) Notify(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for w := range s.byID[id] {
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
	for _, ws := range s.byID {
		for w := range ws {
			close(w.done)
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
	if ws := s.byID[w.id]; ws != nil {
		if _, ok := ws[w]; ok {
			delete(ws, w)
			if len(ws) == 0 {
				delete(s.byID, w.id)
				idle = true
			}
		}
	}
	s.mu.Unlock()
	if idle && s.Idle != nil {
		s.Idle(w.id)
	}
}
