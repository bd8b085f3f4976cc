package kernel

// Watch tells a reader that an execution's log grew. It carries no events:
// the reader reads them after the last sequence it sent (ReadEvents: from
// the execution's tail in memory, or the store), so a slow reader costs no
// memory and cannot miss anything.
type Watch struct {
	k      *Kernel
	id     string
	c      chan struct{}
	closed chan struct{}
	wake   func() // with k.watchMu
}

// Watch starts watching execution id. Call it before reading the backlog so
// that nothing appended in between is missed.
func (k *Kernel) Watch(id string) *Watch {
	w := &Watch{k: k, id: id, c: make(chan struct{}, 1), closed: make(chan struct{})}
	k.watchMu.Lock()
	ws := k.watchers[id]
	if ws == nil {
		ws = map[*Watch]struct{}{}
		k.watchers[id] = ws
	}
	ws[w] = struct{}{}
	k.watchMu.Unlock()
	return w
}

// C receives a value when new events may be available.
func (w *Watch) C() <-chan struct{} { return w.c }

// Done is closed when the kernel shuts down.
func (w *Watch) Done() <-chan struct{} { return w.closed }

// OnWake makes f run, with the kernel's watch lock held, each time C
// receives and when Done is closed, so that a reader can wait without a
// goroutine blocked on the channels. f must return quickly and must not
// call into the kernel.
func (w *Watch) OnWake(f func()) {
	w.k.watchMu.Lock()
	w.wake = f
	closed := false
	select {
	case <-w.closed:
		closed = true
	default:
	}
	w.k.watchMu.Unlock()
	if closed && f != nil {
		f()
	}
}

// Stop ends the watch.
func (w *Watch) Stop() {
	w.k.watchMu.Lock()
	if ws := w.k.watchers[w.id]; ws != nil {
		delete(ws, w)
		if len(ws) == 0 {
			delete(w.k.watchers, w.id)
			if tl := w.k.tails[w.id]; tl != nil && tl.ended {
				w.k.forgetTail(w.id)
			}
		}
	}
	w.k.watchMu.Unlock()
}

// close ends the watch at shutdown; the caller holds k.watchMu.
func (w *Watch) close() {
	select {
	case <-w.closed:
	default:
		close(w.closed)
		if w.wake != nil {
			w.wake()
		}
	}
}
