package kernel

import (
	"errors"
	"sync"
	"time"

	"github.com/gatehouse-dev/gatehouse/store"
)

// Work that a failed commit left undone, and that nobody asked for (an
// execution assigned to an agent that connected, a job sent to a runner),
// is tried again after a wait that doubles from retryFirst up to retryMax
// while the store keeps refusing it, and at once when the store's room
// changes: never in a loop, which on a failed or full store burnt a core
// and wrote thousands of log lines a second.
const (
	retryFirst = time.Second
	retryMax   = 30 * time.Second
)

// retries holds the waits of work to try again, by key (what the work is
// about: an agent, the job queue).
type retries struct {
	mu      sync.Mutex
	waiting map[string]*retrying
	// stop is closed by Kernel.Close: waits end at once.
	stop chan struct{}
}

type retrying struct {
	wait  time.Duration // before the next try
	armed bool          // a try is scheduled
}

func newRetries() *retries {
	return &retries{waiting: map[string]*retrying{}, stop: make(chan struct{})}
}

// retryLater runs f again after key's wait, which doubles each time key's
// work fails again, unless a try is scheduled already. Close ends the wait.
func (k *Kernel) retryLater(key string, f func()) {
	r := k.retries
	r.mu.Lock()
	st := r.waiting[key]
	switch {
	case st == nil:
		st = &retrying{wait: retryFirst}
		r.waiting[key] = st
	case st.armed:
		r.mu.Unlock()
		return
	default:
		st.wait = min(2*st.wait, retryMax)
	}
	st.armed = true
	wait := st.wait
	r.mu.Unlock()
	changed := k.store.SpaceChanged()
	k.spawn(func() {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-changed:
		case <-r.stop:
			return
		}
		r.mu.Lock()
		st.armed = false
		r.mu.Unlock()
		f()
	})
}

// closedRetries reports whether Close stopped the retries already.
func (k *Kernel) closedRetries() bool {
	select {
	case <-k.retries.stop:
		return true
	default:
		return false
	}
}

// retried forgets key's wait: its work went through.
func (k *Kernel) retried(key string) {
	r := k.retries
	r.mu.Lock()
	if st := r.waiting[key]; st != nil && !st.armed {
		delete(r.waiting, key)
	}
	r.mu.Unlock()
}

// logCommitFailure logs a failed commit, unless the store already said
// why once (it failed, or is short of room) or the caller went away.
func (k *Kernel) logCommitFailure(msg, execID string, err error) {
	if errors.Is(err, store.ErrFailed) || errors.Is(err, ErrStorageFull) || errors.Is(err, store.ErrClosed) {
		return
	}
	k.log.Error(msg, "execution", execID, "err", err)
}
