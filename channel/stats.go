package channel

import (
	"slices"
	"sync"

	"github.com/gatehouse-dev/gatehouse/peer"
)

// Families of the adapter layer's counters (Count.Family).
const (
	// StatSent: cards shown.
	StatSent = "sent"
	// StatEdited: cards edited or withdrawn.
	StatEdited = "edited"
	// StatFailed: calls of an adapter that failed and were retried.
	StatFailed = "failed"
	// StatDropped: deliveries given up on, by reason: refused (the
	// platform refused for good), attempts (an edit failed every attempt),
	// gone (the destination is gone), invalid (not a prompt).
	StatDropped = "dropped"
	// StatRefused: answers refused, by reason (the Refused* constants).
	StatRefused = "refused"
	// StatAnswers: answers taken, by result: won (this answer decided) or
	// recorded (another had, the recorded outcome was returned).
	StatAnswers = "answers"
)

// Count is one counter of the adapter layer.
type Count struct {
	// Adapter is the adapter's name.
	Adapter string
	// Family is sent, edited, failed, dropped, refused or answers.
	Family string
	// Reason is the dropped or refused reason, or the answers result; ""
	// for the other families.
	Reason string
	// N is the count since start.
	N uint64
}

// Stats are the adapter layer's figures, for metrics.
type Stats struct {
	// Counts are the counters, ordered by adapter, family and reason.
	Counts []Count
	// Queued is how many deliveries the adapters' destinations have not
	// carried yet.
	Queued int
}

type statKey struct{ adapter, family, reason string }

// counters is a set of counters safe for concurrent use.
type counters struct {
	mu sync.Mutex
	m  map[statKey]uint64
}

func (r *Registry) count(adapter, family, reason string) {
	r.stats.mu.Lock()
	if r.stats.m == nil {
		r.stats.m = map[statKey]uint64{}
	}
	r.stats.m[statKey{adapter, family, reason}]++
	r.stats.mu.Unlock()
}

// Stats returns the adapter layer's figures.
func (r *Registry) Stats() Stats {
	var s Stats
	r.stats.mu.Lock()
	for k, n := range r.stats.m {
		s.Counts = append(s.Counts, Count{Adapter: k.adapter, Family: k.family, Reason: k.reason, N: n})
	}
	r.stats.mu.Unlock()
	slices.SortFunc(s.Counts, func(a, b Count) int {
		if c := cmpString(a.Adapter, b.Adapter); c != 0 {
			return c
		}
		if c := cmpString(a.Family, b.Family); c != 0 {
			return c
		}
		return cmpString(a.Reason, b.Reason)
	})
	r.mu.Lock()
	var keys []peer.Key
	for k, rc := range r.chans {
		if rc.Kind == KindAdapter {
			keys = append(keys, k)
		}
	}
	r.mu.Unlock()
	for _, k := range keys {
		s.Queued += r.hub.Pending(k)
	}
	return s
}

// Counted returns the count of adapter's family for reason: for tests and
// tools that read one counter.
func (s Stats) Counted(adapter, family, reason string) uint64 {
	for _, c := range s.Counts {
		if c.Adapter == adapter && c.Family == family && c.Reason == reason {
			return c.N
		}
	}
	return 0
}
