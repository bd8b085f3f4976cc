package policy

import (
	"fmt"
	"sync"
	"time"
)

const (
	// maxTrackedKeys bounds limiter memory no matter how many distinct
	// agent/tool pairs callers present.
	maxTrackedKeys = 100_000
	// sweepInterval is how often all pairs are swept, so pairs that are
	// never looked up again do not linger until the cap is reached.
	sweepInterval = time.Minute
)

// limiter keeps sliding-window logs of allowed calls per rule and
// agent/tool pair.
type limiter struct {
	mu        sync.Mutex
	maxKeys   int
	lastSweep time.Time
	logs      map[limitKey]*callLog
}

// limitKey keeps agent and tool apart rather than joining them with ':' so
// that ids containing ':' cannot collide.
type limitKey struct {
	rule  *rule
	agent string
	tool  string
}

// callLog holds the times of allowed calls inside the window, oldest first.
type callLog struct {
	times []time.Time
}

func newLimiter() *limiter {
	return &limiter{maxKeys: maxTrackedKeys, logs: make(map[limitKey]*callLog)}
}

// admit records an allowed call for r and reports whether it is within the
// limit; when it is not, the returned reason explains why.
func (l *limiter) admit(r *rule, in *Input) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if in.Now.Sub(l.lastSweep) >= sweepInterval {
		l.sweep(in.Now)
	}
	key := limitKey{rule: r, agent: in.AgentID, tool: in.ToolID}
	calls, ok := l.logs[key]
	if !ok {
		if len(l.logs) >= l.maxKeys {
			l.sweep(in.Now)
		}
		if len(l.logs) >= l.maxKeys {
			return fmt.Sprintf("rate limit exceeded: limiter is tracking its maximum of %d agent/tool pairs", l.maxKeys), false
		}
		calls = &callLog{}
		l.logs[key] = calls
	}
	calls.expire(in.Now, r.limit.window)
	if len(calls.times) >= r.limit.max {
		return r.limit.exceeded, false
	}
	calls.record(in.Now)
	return "", true
}

// sweep drops every pair with no call left inside its window.
func (l *limiter) sweep(now time.Time) {
	l.lastSweep = now
	for key, calls := range l.logs {
		if calls.expire(now, key.rule.limit.window); len(calls.times) == 0 {
			delete(l.logs, key)
		}
	}
}

// expire drops calls that have left the window ending at now.
func (c *callLog) expire(now time.Time, window time.Duration) {
	cutoff := now.Add(-window)
	i := 0
	for i < len(c.times) && !c.times[i].After(cutoff) {
		i++
	}
	if i == len(c.times) {
		// Release the backing array instead of keeping an empty slice of it.
		c.times = nil
		return
	}
	c.times = c.times[i:]
}

// record adds a call, keeping times ordered even when concurrent callers
// take the lock in a different order than they read the clock.
func (c *callLog) record(now time.Time) {
	c.times = append(c.times, now)
	for i := len(c.times) - 1; i > 0 && c.times[i].Before(c.times[i-1]); i-- {
		c.times[i], c.times[i-1] = c.times[i-1], c.times[i]
	}
}
