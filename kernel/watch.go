package kernel

// Watch tells a reader that an execution's log grew. It carries no events:
// the reader reads them from the store after the last sequence it sent, so a
// slow reader costs no memory and cannot miss anything.
type Watch struct {
	k      *Kernel
	id     string
	c      chan struct{}
	closed chan struct{}
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

// Stop ends the watch.
func (w *Watch) Stop() {
	w.k.watchMu.Lock()
	if ws := w.k.watchers[w.id]; ws != nil {
		delete(ws, w)
		if len(ws) == 0 {
			delete(w.k.watchers, w.id)
		}
	}
	w.k.watchMu.Unlock()
}

func (w *Watch) close() {
	select {
	case <-w.closed:
	default:
		close(w.closed)
	}
}

func (k *Kernel) notify(id string, _ uint64) {
	k.watchMu.Lock()
	for w := range k.watchers[id] {
		select {
		case w.c <- struct{}{}:
		default:
		}
	}
	k.watchMu.Unlock()
}
