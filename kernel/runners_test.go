package kernel

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
	"github.com/gatehouse-dev/gatehouse/peer"
)

// direct creates a direct execution of tool and returns its id.
func (r *rig) direct(tool string) string {
	r.t.Helper()
	v, _, err := r.k.Create(context.Background(), CreateRequest{Tool: &ToolCall{ToolID: tool}}, Meta{})
	if err != nil {
		r.t.Fatal(err)
	}
	return v.ID
}

func TestRemoteStepRetries(t *testing.T) {
	r := newRig(t, func(o *Options) { o.RemoteMaxAttempts = 2 })
	defer r.k.AgentConnected("ag", "c1")()
	runner := r.inbox(RoleRunner, "rn", "c1")
	defer r.k.RunnerConnected("rn", "c1", []string{"fetch"})()
	x := r.start("ag", "c1", CreateRequest{}, Meta{})
	var got toolResultPush

	// A retryable failure sends the job again; when attempts run out the
	// agent hears of the last failure.
	step := x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "fetch", Remote: true, Arguments: json.RawMessage(`{"url":"u"}`)})
	var j1, j2 jobMsg
	runner.next(event.PushJobAssigned, &j1)
	if j1.StepID != step.StepID || j1.Attempt != 1 || j1.ToolID != "fetch" || string(j1.Arguments) != `{"url":"u"}` {
		t.Fatalf("first job: %+v", j1)
	}
	j1.result(t, r.k, "rn", RunnerResultRequest{Error: "503", Retryable: true})
	runner.next(event.PushJobAssigned, &j2)
	if j2.StepID != step.StepID || j2.Attempt != 2 || j2.ID == j1.ID {
		t.Fatalf("second job: %+v", j2)
	}
	// The first attempt's failure, told again, changes nothing.
	j1.result(t, r.k, "rn", RunnerResultRequest{Error: "503", Retryable: true})
	j2.result(t, r.k, "rn", RunnerResultRequest{Error: "503 again", Retryable: true})
	x.box.next(event.PushToolResult, &got)
	if got.StepID != step.StepID || got.Status != string(StepFailed) || got.Error != "503 again" {
		t.Fatalf("tool.result after the last attempt: %+v", got)
	}
	runner.empty()

	// A late success of an earlier attempt is still a success the step
	// needs; the later attempt's result is then a conflict.
	step = x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "fetch", Remote: true})
	runner.next(event.PushJobAssigned, &j1)
	j1.result(t, r.k, "rn", RunnerResultRequest{Error: "timeout", Retryable: true})
	runner.next(event.PushJobAssigned, &j2)
	j1.result(t, r.k, "rn", RunnerResultRequest{Success: true, Data: json.RawMessage(`"late"`)})
	x.box.next(event.PushToolResult, &got)
	if got.StepID != step.StepID || got.Status != string(StepSucceeded) || string(got.Result) != `"late"` {
		t.Fatalf("tool.result of the late success: %+v", got)
	}
	_, err := r.k.RunnerResult(context.Background(), "rn", RunnerResultRequest{JobID: j2.ID, ExecutionID: x.id, StepID: step.StepID, Success: true, Data: json.RawMessage(`"other"`)}, Meta{})
	wantErr(t, err, ErrConflict)
	if s := r.k.Stats(); s.RunnersBusy != 0 || s.Retries != 2 {
		t.Fatalf("after the results: %+v", s)
	}
	types := eventTypes(t, r.k, x.id)
	if n := strings.Count(strings.Join(types, " "), event.StepRetried); n != 2 {
		t.Fatalf("%d retries in %v", n, types)
	}
}

// TestToolResultLeavesWithTheResultsCommit checks that a remote step's
// outcome reaches the agent's outbox when the runner's result is
// committed, without waiting for the runner's answer to be written (the
// After the gateway runs then): the intent that named the step was
// answered before its job was sent, so nothing it could overtake is left.
func TestToolResultLeavesWithTheResultsCommit(t *testing.T) {
	r := newRig(t, nil)
	defer r.k.AgentConnected("ag", "c1")()
	runner := r.inbox(RoleRunner, "rn", "c1")
	defer r.k.RunnerConnected("rn", "c1", []string{"fetch"})()
	x := r.start("ag", "c1", CreateRequest{}, Meta{})
	step := x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "fetch", Remote: true})
	var j jobMsg
	runner.next(event.PushJobAssigned, &j)
	after, err := r.k.RunnerResult(context.Background(), "rn", RunnerResultRequest{
		JobID: j.ID, ExecutionID: x.id, StepID: step.StepID, Success: true, Data: json.RawMessage(`"ok"`),
	}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	defer after.Run()
	d, ok := x.box.c.Next()
	if !ok || d.Type != event.PushToolResult {
		t.Fatalf("the agent's outbox right after the result: %+v, %v; want its tool.result", d, ok)
	}
}

func TestStepStarted(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	defer r.k.RunnerConnected("rn", "c1", []string{"fetch"})()
	defer r.k.RunnerConnected("other", "c1", []string{"else"})()
	id := r.direct("fetch")
	st := liveStep(t, r.k, id, dispatched)
	key := peer.Key{Role: RoleRunner, ID: "rn", Consumer: "c1"}
	if n := r.hub.Pending(key); n != 1 {
		t.Fatalf("%d pushes pending for the runner, want its job", n)
	}
	tests := []struct {
		name   string
		stepID string
		req    StepStartedRequest
		want   error
	}{
		{"no execution", st.ID, StepStartedRequest{RunnerID: "rn"}, ErrValidation},
		{"no runner", st.ID, StepStartedRequest{ExecutionID: id}, ErrValidation},
		{"step id that is no id", "a b\x00", StepStartedRequest{ExecutionID: id, RunnerID: "rn"}, ErrValidation},
		{"unknown execution", st.ID, StepStartedRequest{ExecutionID: "0190aaaa-0000-7000-8000-000000000000", RunnerID: "rn"}, ErrNotFound},
		{"unknown step", "nope", StepStartedRequest{ExecutionID: id, RunnerID: "rn"}, ErrNotFound},
		{"another runner", st.ID, StepStartedRequest{ExecutionID: id, RunnerID: "other"}, ErrConflict},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantErr(t, r.k.StepStarted(ctx, tt.stepID, tt.req, Meta{}), tt.want)
		})
	}
	for range 2 { // the second call changes nothing
		if err := r.k.StepStarted(ctx, st.ID, StepStartedRequest{ExecutionID: id, RunnerID: "rn"}, Meta{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := liveStep(t, r.k, id, func(*Step) bool { return true }); got.Status != StepRunning || !got.Started {
		t.Fatalf("started step: %+v", got)
	}
	// A started job is settled: a reconnecting runner is not sent it again.
	if n := r.hub.Pending(key); n != 0 {
		t.Fatalf("%d pushes pending for the runner after it started its job", n)
	}
	types := eventTypes(t, r.k, id)
	if strings.Count(strings.Join(types, " "), event.StepStarted) != 1 {
		t.Fatalf("events %v", types)
	}
	after, err := r.k.RunnerResult(ctx, "rn", RunnerResultRequest{JobID: st.JobID, ExecutionID: id, StepID: st.ID, Success: true}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	settle(t, r.k, id)
	// A finished step is still found, and starting it changes nothing.
	if err := r.k.StepStarted(ctx, st.ID, StepStartedRequest{ExecutionID: id, RunnerID: "rn"}, Meta{}); err != nil {
		t.Fatalf("started after the end: %v", err)
	}
}

func TestRunnerResultRefusals(t *testing.T) {
	r := newRig(t, nil)
	defer r.k.RunnerConnected("rn", "c1", []string{"fetch"})()
	defer r.k.RunnerConnected("other", "c1", []string{"fetch"})()
	id := r.direct("fetch")
	st := liveStep(t, r.k, id, dispatched)
	owner, stranger := st.RunnerID, map[string]string{"rn": "other", "other": "rn"}[st.RunnerID]
	ok := RunnerResultRequest{JobID: st.JobID, ExecutionID: id, StepID: st.ID, Success: true}
	with := func(f func(*RunnerResultRequest)) RunnerResultRequest { req := ok; f(&req); return req }

	// Another runner's result for the job is refused and does not free its
	// holder, which still runs it: the next job goes to the other runner.
	_, err := r.k.RunnerResult(context.Background(), stranger, ok, Meta{})
	wantErr(t, err, ErrConflict)
	if s := r.k.Stats(); s.RunnersBusy != 1 {
		t.Fatalf("%d runners busy after another runner's result, want the job's holder", s.RunnersBusy)
	}
	if next := liveStep(t, r.k, r.direct("fetch"), dispatched); next.RunnerID != stranger {
		t.Fatalf("the next job went to %s, which still runs %s", next.RunnerID, st.JobID)
	}

	tests := []struct {
		name   string
		runner string
		req    RunnerResultRequest
		want   error
	}{
		{"no job", owner, with(func(q *RunnerResultRequest) { q.JobID = "" }), ErrValidation},
		{"no step", owner, with(func(q *RunnerResultRequest) { q.StepID = "" }), ErrValidation},
		{"runner id that is no id", "r\nn", ok, ErrValidation},
		{"error too long", owner, with(func(q *RunnerResultRequest) { q.Error = strings.Repeat("e", maxErrorLen+1) }), ErrValidation},
		{"unknown execution", owner, with(func(q *RunnerResultRequest) { q.ExecutionID = "0190aaaa-0000-7000-8000-000000000000" }), ErrNotFound},
		{"unknown step", owner, with(func(q *RunnerResultRequest) { q.StepID = "nope" }), ErrNotFound},
		{"unknown job", owner, with(func(q *RunnerResultRequest) { q.JobID = "nope" }), ErrConflict},
		{"another runner's job", stranger, ok, ErrConflict},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := r.k.RunnerResult(context.Background(), tt.runner, tt.req, Meta{})
			wantErr(t, err, tt.want)
		})
	}
	if v, _ := r.k.Get(context.Background(), id); v.Status != StatusRunning {
		t.Fatalf("refused results changed the execution: %s", v.Status)
	}
}

func TestLostRunnersJobGoesToAnother(t *testing.T) {
	r := newRig(t, func(o *Options) { o.RunnerGrace = 20 * time.Millisecond })
	gone := r.k.RunnerConnected("r1", "c1", []string{"fetch"})
	id := r.direct("fetch")
	first := liveStep(t, r.k, id, dispatched)
	if first.RunnerID != "r1" {
		t.Fatalf("dispatched to %s", first.RunnerID)
	}
	r2 := r.inbox(RoleRunner, "r2", "c1")
	defer r.k.RunnerConnected("r2", "c1", []string{"fetch"})()
	r2.empty() // r1 still holds the job during its grace period
	gone()
	var j jobMsg
	r2.next(event.PushJobAssigned, &j)
	if j.ExecutionID != id || j.StepID != first.ID || j.Attempt != 2 {
		t.Fatalf("job after the runner was lost: %+v", j)
	}
	j.result(t, r.k, "r2", RunnerResultRequest{Success: true, Data: json.RawMessage(`1`)})
	if v := settle(t, r.k, id); v.Status != StatusCompleted || string(v.Output) != "1" {
		t.Fatalf("ended %+v", v)
	}
	types := strings.Join(eventTypes(t, r.k, id), " ")
	if !strings.Contains(types, event.StepFailed+" "+event.StepRetried+" "+event.StepDispatched) {
		t.Fatalf("events %s", types)
	}
	if s := r.k.Stats(); s.RunnersOnline != 1 {
		t.Fatalf("%d runners online, want r2 only", s.RunnersOnline)
	}
}

func TestRemovedRunnersJobGoesToAnotherAtOnce(t *testing.T) {
	r := newRig(t, func(o *Options) { o.RunnerGrace = time.Hour })
	r1 := r.inbox(RoleRunner, "r1", "c1")
	gone := r.k.RunnerConnected("r1", "c1", []string{"fetch"})
	id := r.direct("fetch")
	r1.next(event.PushJobAssigned, nil)
	r2 := r.inbox(RoleRunner, "r2", "c1")
	defer r.k.RunnerConnected("r2", "c1", []string{"fetch"})()
	r.k.RemoveRunner("r1")
	var j jobMsg
	r2.next(event.PushJobAssigned, &j)
	if j.ExecutionID != id || j.Attempt != 2 {
		t.Fatalf("job after the runner was removed: %+v", j)
	}
	select {
	case <-r1.c.Done(): // its connection was ended
	default:
		t.Fatal("the removed runner's connection is still open")
	}
	gone() // the removed runner's connection ending must not bring it back
	tools := r.k.Tools()
	if len(tools) != 1 || strings.Join(tools[0].Runners, ",") != "r2" {
		t.Fatalf("tools: %+v", tools)
	}
	r.k.RemoveRunner("never-seen")
}

func TestCapabilitiesAndTools(t *testing.T) {
	r := newRig(t, func(o *Options) { o.RunnerGrace = time.Hour })
	rn := r.inbox(RoleRunner, "rn", "c1")
	defer r.k.RunnerConnected("rn", "c1", []string{"a", ""})()
	away := r.k.RunnerConnected("away", "c1", []string{"a", "z"})
	away()
	id := r.direct("b")
	eventually.True(t, "queued", func() bool { return r.k.Stats().QueuedJobs == 1 })

	r.k.UpdateCapabilities("nobody", []string{"b"})
	r.k.UpdateCapabilities("rn", []string{"a", "b"})
	var j jobMsg
	rn.next(event.PushJobAssigned, &j)
	if j.ExecutionID != id || j.ToolID != "b" {
		t.Fatalf("job: %+v", j)
	}

	r.k.DescribeTools("rn", map[string]json.RawMessage{"b": json.RawMessage(`{"description":"bee"}`)})
	r.k.DescribeTools("nobody", map[string]json.RawMessage{"a": json.RawMessage(`{}`)})
	tools := r.k.Tools()
	if len(tools) != 2 || tools[0].ID != "a" || tools[1].ID != "b" ||
		strings.Join(tools[0].Runners, ",") != "rn" || tools[0].Info != nil ||
		strings.Join(tools[1].Runners, ",") != "rn" || string(tools[1].Info) != `{"description":"bee"}` {
		t.Fatalf("tools: %+v", tools)
	}
}

func TestRunnerTakesItsNextJobWithItsResult(t *testing.T) {
	r := newRig(t, nil)
	rn := r.inbox(RoleRunner, "rn", "c1")
	defer r.k.RunnerConnected("rn", "c1", []string{"fetch"})()
	ids := []string{r.direct("fetch")}
	rn.next(event.PushJobAssigned, nil)
	// Each create queues its job after it answers: wait for each, so that
	// the queue's order is the creations'. A queued job the runner cannot
	// run is passed over.
	for i, tool := range []string{"other", "fetch", "fetch"} {
		id := r.direct(tool)
		if tool == "fetch" {
			ids = append(ids, id)
		}
		eventually.True(t, "queued", func() bool { return r.k.Stats().QueuedJobs == i+1 })
	}
	var j jobMsg
	for i, id := range ids {
		if i > 0 {
			rn.next(event.PushJobAssigned, &j)
			if j.ExecutionID != id {
				t.Fatalf("job %d is of %s, want %s (oldest first)", i, j.ExecutionID, id)
			}
		} else {
			j = jobMsg{jobPush{ExecutionID: id}}
			st := liveStep(t, r.k, id, dispatched)
			j.ID, j.StepID = st.JobID, st.ID
		}
		j.result(t, r.k, "rn", RunnerResultRequest{Success: true})
		if v := settle(t, r.k, id); v.Status != StatusCompleted {
			t.Fatalf("execution %d ended %s", i, v.Status)
		}
	}
	if s := r.k.Stats(); s.QueuedJobs != 1 || s.RunnersBusy != 0 || s.Jobs != 3 {
		t.Fatalf("stats: %+v", s)
	}
}

func TestStepTimeoutFreesTheRunner(t *testing.T) {
	pol := policytest.Parse(t, `rules:
  - id: quick
    priority: 1
    when: {tool_id: "slow"}
    then: {decision: allow, timeout_ms: 30}
default: {decision: allow}
`)
	r := newRig(t, func(o *Options) { o.Policy = pol })
	defer r.k.AgentConnected("ag", "c1")()
	rn := r.inbox(RoleRunner, "rn", "c1")
	defer r.k.RunnerConnected("rn", "c1", []string{"slow", "fast"})()
	x := r.start("ag", "c1", CreateRequest{}, Meta{})
	slow := x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "slow", Remote: true})
	var j1, j2 jobMsg
	rn.next(event.PushJobAssigned, &j1)
	fast := x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "fast", Remote: true})
	var got toolResultPush
	x.box.next(event.PushToolResult, &got)
	if got.StepID != slow.StepID || got.Status != string(StepFailed) || got.Error != "step timed out" {
		t.Fatalf("tool.result of the slow step: %+v", got)
	}
	// The runner is free again and gets the waiting job.
	rn.next(event.PushJobAssigned, &j2)
	if j2.StepID != fast.StepID {
		t.Fatalf("next job: %+v", j2)
	}
	_, err := r.k.RunnerResult(context.Background(), "rn", RunnerResultRequest{JobID: j1.ID, ExecutionID: x.id, StepID: slow.StepID, Success: true}, Meta{})
	wantErr(t, err, ErrConflict)
	j2.result(t, r.k, "rn", RunnerResultRequest{Success: true})
	x.box.next(event.PushToolResult, &got)
	if got.StepID != fast.StepID || got.Status != string(StepSucceeded) {
		t.Fatalf("tool.result of the fast step: %+v", got)
	}
	if !strings.Contains(strings.Join(eventTypes(t, r.k, x.id), " "), event.StepTimedOut) {
		t.Fatal("no step.timed_out in the log")
	}
}

// TestReservedToolsReachOnlyTheirBuiltinRunner: a tool reserved for a
// built-in runner is served by that runner alone. Another runner that
// declares it, bare or on an account, at connect or later, is not handed
// its jobs, even when it is the only runner idle, and is not listed as
// serving it; what else it declares it still serves.
func TestReservedToolsReachOnlyTheirBuiltinRunner(t *testing.T) {
	r := newRig(t, nil)
	r.k.Reserve("builtin", []string{"memory_read"})
	if owner, ok := r.k.ReservedTool("memory_read@acme"); !ok || owner != "builtin" {
		t.Fatalf("ReservedTool(memory_read@acme) = %q, %v", owner, ok)
	}
	if !r.k.BuiltinRunner("builtin") || r.k.BuiltinRunner("squat") {
		t.Fatal("BuiltinRunner does not tell the built-in runner from another")
	}
	squatter := r.inbox(RoleRunner, "squat", "c1")
	defer r.k.RunnerConnected("squat", "c1", []string{"memory_read", "memory_read@acme", "fetch"})()

	if tools := r.k.Tools(); len(tools) != 1 || tools[0].ID != "fetch" {
		t.Fatalf("Tools() = %+v, want the squatter listed for fetch only", tools)
	}
	first := r.direct("memory_read")
	r.k.UpdateCapabilities("squat", []string{"memory_read", "fetch"})
	second := r.direct("memory_read")
	fetch := r.direct("fetch")
	var j jobMsg
	squatter.next(event.PushJobAssigned, &j)
	if j.ToolID != "fetch" || j.ExecutionID != fetch {
		t.Fatalf("the squatter got %+v, want the fetch job only", j)
	}
	squatter.empty()

	builtin := r.inbox(RoleRunner, "builtin", "b")
	defer r.k.RunnerConnected("builtin", "b", []string{"memory_read"})()
	// A create queues its job after it answers (its effects run on their
	// own goroutine), so two creates in a row may queue in either order.
	want := map[string]bool{first: true, second: true}
	for range 2 {
		builtin.next(event.PushJobAssigned, &j)
		if !want[j.ExecutionID] || j.ToolID != "memory_read" {
			t.Fatalf("the built-in runner got %+v, want the jobs of %s and %s, once each", j, first, second)
		}
		delete(want, j.ExecutionID)
		j.result(t, r.k, "builtin", RunnerResultRequest{Success: true, Data: json.RawMessage(`{}`)})
	}
	squatter.empty()
}
