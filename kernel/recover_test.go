package kernel

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
)

// TestRestartKeepsEveryState closes the kernel and its store with
// executions in every state and opens them again on the same folder: each
// is where it was, and its agents and runners carry on with the leases and
// jobs they held.
func TestRestartKeepsEveryState(t *testing.T) {
	long := func(o *Options) { o.Policy, o.AgentGrace, o.RunnerGrace = askPolicy(t), time.Hour, time.Hour }
	r := newRig(t, long)
	ctx := context.Background()
	r.k.AgentConnected("ag", "c1")
	r.k.RunnerConnected("rn", "c1", []string{"fetch"})
	pending, _, err := r.k.Create(ctx, CreateRequest{AgentID: "nobody", Input: json.RawMessage(`"wait for me"`)}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	working := r.start("ag", "c1", CreateRequest{Labels: map[string]string{"k": "v"}}, Meta{Principal: "alice"})
	local := working.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "calc"})
	asking := r.start("ag", "c1", CreateRequest{}, Meta{})
	ask := asking.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "ask.send"})
	waiting := r.start("ag", "c1", CreateRequest{}, Meta{})
	waiting.intent(t, r.k, Intent{Type: IntentWait, SignalType: "go"})
	held := r.direct("fetch")
	heldStep := liveStep(t, r.k, held, dispatched)
	queued := r.direct("rare")
	eventually.True(t, "a job queued", func() bool { return r.k.Stats().QueuedJobs == 1 })
	before := map[string]View{}
	for _, id := range []string{pending.ID, working.id, asking.id, waiting.id, held, queued} {
		before[id], _ = r.k.Get(ctx, id)
	}

	r = r.reopen(long)
	for id, was := range before {
		got, err := r.k.Get(ctx, id)
		if err != nil || !r.k.Live(id) || got.Status != was.Status || got.BlockReason != was.BlockReason || got.BlockRef != was.BlockRef ||
			got.Owner != was.Owner || !got.CreatedAt.Equal(was.CreatedAt) || len(got.Labels) != len(was.Labels) {
			t.Fatalf("after the restart:\n got  %+v %v\n want %+v", got, err, was)
		}
	}
	if s := r.k.Stats(); s.Live != 6 || s.QueuedJobs != 1 || s.RunnersBusy != 1 {
		t.Fatalf("stats after the restart: %+v", s)
	}
	page, err := r.k.List(ctx, ListRequest{Status: StatusBlocked})
	if err != nil || len(page.Executions) != 2 {
		t.Fatalf("blocked executions listed: %+v %v", page, err)
	}

	// The agent comes back as the same consumer and keeps its leases.
	r.k.AgentConnected("ag", "c1")
	after, err := r.k.StepResult(ctx, StepResultRequest{ExecutionID: working.id, SessionID: working.lease, StepID: local.StepID, Success: true}, Meta{})
	if err != nil {
		t.Fatalf("result under the lease held before the restart: %v", err)
	}
	after.Run()
	working.intent(t, r.k, Intent{Type: IntentComplete})
	after, err = r.k.ResolveApproval(ctx, asking.id, r.k.ApprovalOf(asking.id, ask.StepID), Decision{Outcome: OutcomeApproved}, Meta{})
	if err != nil {
		t.Fatalf("answer to a prompt made before the restart: %v", err)
	}
	after.Run()
	after, err = r.k.Signal(ctx, waiting.id, SignalRequest{SignalType: "go"}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	for id, want := range map[string]Status{working.id: StatusCompleted, asking.id: StatusRunning, waiting.id: StatusRunning} {
		if v, _ := r.k.Get(ctx, id); v.Status != want {
			t.Fatalf("%s: %s, want %s", id, v.Status, want)
		}
	}

	// The runner comes back and finishes the job it held; the queued job
	// and the waiting execution go to the first that can take them.
	r.k.RunnerConnected("rn", "c1", []string{"fetch"})
	after, err = r.k.RunnerResult(ctx, "rn", RunnerResultRequest{JobID: heldStep.JobID, ExecutionID: held, StepID: heldStep.ID, Success: true}, Meta{})
	if err != nil {
		t.Fatalf("result of a job held across the restart: %v", err)
	}
	after.Run()
	if v := settle(t, r.k, held); v.Status != StatusCompleted {
		t.Fatalf("held job's execution ended %s", v.Status)
	}
	rare := r.inbox(RoleRunner, "rare", "c1")
	r.k.RunnerConnected("rare", "c1", []string{"rare"})
	var j jobMsg
	rare.next(event.PushJobAssigned, &j)
	if j.ExecutionID != queued || j.Attempt != 1 {
		t.Fatalf("queued job: %+v", j)
	}
	nobody := r.inbox(RoleAgent, "nobody", "c1")
	r.k.AgentConnected("nobody", "c1")
	var a assignedPush
	nobody.next(event.PushExecutionAssigned, &a)
	if a.ExecutionID != pending.ID || string(a.Input) != `"wait for me"` {
		t.Fatalf("pending execution: %+v", a)
	}
}

// TestRestartWithoutThePeersHandsWorkOver: agents and runners that do not
// come back within their grace period after a restart lose their work to
// others, and a prompt whose time ran out expires.
func TestRestartWithoutThePeersHandsWorkOver(t *testing.T) {
	pol := policytest.Parse(t, `rules:
  - id: brief
    priority: 1
    when: {tool_id: "ask.*"}
    then: {decision: require_approval, expires_in: 200ms}
default: {decision: allow}
`)
	short := func(o *Options) {
		o.Policy, o.AgentGrace, o.RunnerGrace = pol, 20*time.Millisecond, 20*time.Millisecond
	}
	r := newRig(t, short)
	r.k.AgentConnected("ag", "c1")
	r.k.RunnerConnected("rn", "c1", []string{"fetch"})
	working := r.start("ag", "c1", CreateRequest{}, Meta{})
	asking := r.start("ag", "c1", CreateRequest{}, Meta{})
	asking.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "ask.send"})
	held := r.direct("fetch")
	heldStep := liveStep(t, r.k, held, dispatched)

	r = r.reopen(short)
	agent := r.inbox(RoleAgent, "ag", "c2")
	r.k.AgentConnected("ag", "c2")
	runner := r.inbox(RoleRunner, "rn2", "c1")
	r.k.RunnerConnected("rn2", "c1", []string{"fetch"})
	var j jobMsg
	runner.next(event.PushJobAssigned, &j)
	if j.ExecutionID != held || j.StepID != heldStep.ID || j.Attempt != 2 {
		t.Fatalf("job of the lost runner: %+v", j)
	}
	// Both executions come to the new consumer: one when its agent is
	// declared lost, the other when its prompt expires without an agent.
	got := map[string]bool{}
	for range 2 {
		var a assignedPush
		agent.next(event.PushExecutionAssigned, &a)
		got[a.ExecutionID] = true
	}
	if !got[working.id] || !got[asking.id] {
		t.Fatalf("reassigned %v, want %s and %s", got, working.id, asking.id)
	}
	var resolved permissionResolvedPayload
	found := false
	if err := r.k.ReadEventValues(asking.id, 0, func(e *event.Event) bool {
		if e.Type == event.PermissionResolved {
			found = json.Unmarshal(e.Payload, &resolved) == nil
		}
		return true
	}); err != nil || !found || resolved.Outcome != OutcomeExpired {
		t.Fatalf("the prompt across the restart: %+v found=%v %v", resolved, found, err)
	}
}

// TestRestartPastDeadlines: deadlines that passed while the kernel was
// down fire as it starts, while it is still rebuilding the others; every
// execution still ends the way its deadline says.
func TestRestartPastDeadlines(t *testing.T) {
	r := newRig(t, nil)
	var ids []string
	for range 300 {
		ids = append(ids, r.create("away").ID)
	}
	r = r.reopen(func(o *Options) { o.ExecutionTimeout = time.Nanosecond })
	for _, id := range ids {
		if v := settle(t, r.k, id); v.Status != StatusFailed {
			t.Fatalf("%s ended %s", id, v.Status)
		}
	}
	if s := r.k.Stats(); s.Live != 0 || s.Failed != uint64(len(ids)) {
		t.Fatalf("after the deadlines: %+v", s)
	}
}
