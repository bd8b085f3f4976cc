package policy

import (
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const limitedPolicy = `
rules:
  - id: limited-web
    priority: 1
    when: {tool_id: "web_*"}
    then: {decision: allow, timeout_ms: 1000}
    rate_limit: {max: 3, window: 1m}
  - id: limited-doc
    priority: 2
    when: {tool_id: "doc_*"}
    then: {decision: allow}
    rate_limit: {max: 1, window: 1m30s}
  - id: approve-fs
    priority: 3
    when: {tool_id: "fs_*"}
    then: {decision: require_approval}
    rate_limit: {max: 1, window: 1h}
`

func TestRateLimitSlidingWindow(t *testing.T) {
	e := mustParse(t, limitedPolicy)
	t0 := monday10
	steps := []struct {
		at      time.Duration
		agent   string
		tool    string
		limited bool
	}{
		{0, "a", "web_search", false},
		{10 * time.Second, "a", "web_search", false},
		{20 * time.Second, "a", "web_search", false},
		{30 * time.Second, "a", "web_search", true},
		// Separate budgets per agent and per tool.
		{30 * time.Second, "b", "web_search", false},
		{30 * time.Second, "a", "web_fetch", false},
		// The call at 0s leaves the window at 60s; the denied call at 30s
		// was never counted, so exactly one slot is free.
		{60 * time.Second, "a", "web_search", false},
		{61 * time.Second, "a", "web_search", true},
		{70 * time.Second, "a", "web_search", false},
		{71 * time.Second, "a", "web_search", true},
		// Each rule has its own window.
		{0, "a", "doc_read", false},
		{89 * time.Second, "a", "doc_read", true},
		{90 * time.Second, "a", "doc_read", false},
	}
	for i, s := range steps {
		got := e.Evaluate(Input{AgentID: s.agent, ToolID: s.tool, Now: t0.Add(s.at)})
		if got.RateLimited != s.limited {
			t.Fatalf("step %d (%v %s/%s): got %+v, want limited=%v", i, s.at, s.agent, s.tool, got, s.limited)
		}
		if s.limited && got.Decision != Deny {
			t.Errorf("step %d: rate limited but Decision = %s", i, got.Decision)
		}
		if !s.limited && got.Decision != Allow {
			t.Errorf("step %d: Decision = %s, want allow", i, got.Decision)
		}
	}
}

func TestRateLimitResult(t *testing.T) {
	e := mustParse(t, limitedPolicy)
	in := Input{AgentID: "a", ToolID: "doc_read", Now: monday10}
	if got := e.Evaluate(in); got.Decision != Allow {
		t.Fatalf("first call: %+v", got)
	}
	want := Result{Decision: Deny, RuleID: "limited-doc", Reason: "rate limit exceeded: max 1 per 1m30s", RateLimited: true}
	if got := e.Evaluate(in); !reflect.DeepEqual(got, want) {
		t.Errorf("second call = %+v, want %+v", got, want)
	}
	in.ToolID = "web_x"
	if got := e.Evaluate(in); got.Timeout != time.Second {
		t.Errorf("allowed call lost its timeout: %+v", got)
	}
}

func TestRateLimitSkipsApproval(t *testing.T) {
	e := mustParse(t, limitedPolicy)
	for i := range 5 {
		got := e.Evaluate(Input{AgentID: "a", ToolID: "fs_write", Now: monday10})
		if got.Decision != RequireApproval || got.RateLimited {
			t.Fatalf("call %d: %+v", i, got)
		}
	}
	if n := len(e.limiter.logs); n != 0 {
		t.Errorf("approval calls were tracked: %d keys", n)
	}
}

func TestRateLimitKeyCap(t *testing.T) {
	e := mustParse(t, limitedPolicy)
	e.limiter.maxKeys = 2
	t0 := monday10
	eval := func(tool string, at time.Duration) Result {
		return e.Evaluate(Input{AgentID: "a", ToolID: tool, Now: t0.Add(at)})
	}
	if eval("web_1", 0).RateLimited || eval("web_2", 10*time.Second).RateLimited {
		t.Fatal("calls under the cap were limited")
	}
	got := eval("web_3", 20*time.Second)
	if !got.RateLimited || got.Decision != Deny || got.RuleID != "limited-web" {
		t.Fatalf("new key past the cap: %+v", got)
	}
	// Keys already tracked keep working at the cap.
	if eval("web_1", 20*time.Second).RateLimited {
		t.Error("tracked key refused at the cap")
	}
	// Once web_2's only call has expired, the cap sweep frees its slot.
	if got := eval("web_3", 70*time.Second); got.RateLimited {
		t.Errorf("new key after expiry: %+v", got)
	}
	if n := len(e.limiter.logs); n != 2 {
		t.Errorf("tracked keys = %d, want 2", n)
	}
}

func TestRateLimitPeriodicSweep(t *testing.T) {
	e := mustParse(t, limitedPolicy)
	for _, tool := range []string{"web_1", "web_2", "web_3", "doc_1"} {
		e.Evaluate(Input{AgentID: "a", ToolID: tool, Now: monday10})
	}
	if n := len(e.limiter.logs); n != 4 {
		t.Fatalf("tracked keys = %d, want 4", n)
	}
	// Long after every window, one call sweeps all stale keys away.
	e.Evaluate(Input{AgentID: "a", ToolID: "web_9", Now: monday10.Add(time.Hour)})
	if n := len(e.limiter.logs); n != 1 {
		t.Errorf("tracked keys after sweep = %d, want 1", n)
	}
}

func TestRateLimitConcurrent(t *testing.T) {
	e := mustParse(t, limitedPolicy)
	var allowed atomic.Int32
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			got := e.Evaluate(Input{AgentID: "a", ToolID: "web_x", Now: monday10.Add(time.Duration(i) * time.Millisecond)})
			if got.Decision == Allow {
				allowed.Add(1)
			}
		})
	}
	wg.Wait()
	if n := allowed.Load(); n != 3 {
		t.Errorf("allowed %d concurrent calls, want 3", n)
	}
}

func TestCallLogKeepsOrder(t *testing.T) {
	var c callLog
	for _, s := range []int{3, 1, 2, 5, 4} {
		c.record(monday10.Add(time.Duration(s) * time.Second))
	}
	for i := 1; i < len(c.times); i++ {
		if c.times[i].Before(c.times[i-1]) {
			t.Fatalf("times out of order: %v", c.times)
		}
	}
	c.expire(monday10.Add(63*time.Second), time.Minute)
	if len(c.times) != 2 {
		t.Errorf("after expiry %d times left, want 2", len(c.times))
	}
}
