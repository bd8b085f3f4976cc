package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
)

// askPolicy asks a person before any tool named ask.*, denies deny.* and
// allows the rest.
func askPolicy(t *testing.T) Policy {
	t.Helper()
	pol := policytest.Parse(t, `rules:
  - id: ask
    priority: 1
    when: {tool_id: "ask.*"}
    then: {decision: require_approval}
  - id: no
    priority: 2
    when: {tool_id: "deny.*"}
    then: {decision: deny, reason: not here}
default: {decision: allow}
`)
	return pol
}

// liveStep waits until the only step of live execution id satisfies ok,
// and returns a copy of it.
func liveStep(t *testing.T, k *Kernel, id string, ok func(*Step) bool) Step {
	t.Helper()
	return eventually.Value(t, "execution "+id+": a step in the expected state", func() (Step, bool) {
		k.mu.Lock()
		ex := k.live[id]
		k.mu.Unlock()
		if ex == nil {
			return Step{}, false
		}
		ex.mu.Lock()
		defer ex.mu.Unlock()
		for _, st := range ex.Steps {
			if ok(st) {
				return *st, true
			}
		}
		return Step{}, false
	})
}

func dispatched(st *Step) bool { return st.JobID != "" }

// settle waits for execution id to end and returns it.
func settle(t *testing.T, k *Kernel, id string) View {
	t.Helper()
	var v View
	eventually.Check(t, func() error {
		var err error
		if v, err = k.Get(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		if !v.Status.Terminal() {
			return fmt.Errorf("execution %s still %s", id, v.Status)
		}
		return nil
	})
	if k.Live(id) {
		t.Fatalf("execution %s is %s but still live", id, v.Status)
	}
	return v
}

func eventTypes(t *testing.T, k *Kernel, id string) []string {
	t.Helper()
	page, err := k.Events(context.Background(), id, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, raw := range page.Events {
		var e struct{ Type string }
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatal(err)
		}
		out = append(out, e.Type)
	}
	return out
}

func TestDirectExecutionEndsWithItsStep(t *testing.T) {
	k := newKernel(t, askPolicy(t))
	ctx := context.Background()
	defer k.RunnerConnected("rn", "r1", []string{"search"})()
	tests := []struct {
		name       string
		success    bool
		retryable  bool
		wantStatus Status
		wantOutput string
		wantError  string
	}{
		{name: "success", success: true, wantStatus: StatusCompleted, wantOutput: `{"hits":2}`},
		{name: "failure", wantStatus: StatusFailed, wantError: "quota exhausted"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, _, err := k.Create(ctx, CreateRequest{Tool: &ToolCall{ToolID: "search", Arguments: json.RawMessage(`{"q":"x"}`)}}, Meta{Principal: "alice"})
			if err != nil || v.Status != StatusRunning || v.Tool == nil || v.Tool.ToolID != "search" || v.AgentID != "" {
				t.Fatalf("create: %+v %v", v, err)
			}
			st := liveStep(t, k, v.ID, dispatched)
			if st.RunnerID != "rn" || string(st.Arguments) != `{"q":"x"}` {
				t.Fatalf("dispatched step: %+v", st)
			}
			after, err := k.RunnerResult(ctx, "rn", RunnerResultRequest{JobID: st.JobID, ExecutionID: v.ID, StepID: st.ID,
				Success: tt.success, Data: json.RawMessage(tt.wantOutput), Error: tt.wantError}, Meta{})
			if err != nil {
				t.Fatal(err)
			}
			after.Run()
			got := settle(t, k, v.ID)
			if got.Status != tt.wantStatus || string(got.Output) != tt.wantOutput && tt.wantOutput != "" {
				t.Fatalf("ended %s with %s, want %s with %s", got.Status, got.Output, tt.wantStatus, tt.wantOutput)
			}
			types := eventTypes(t, k, v.ID)
			last := types[len(types)-1]
			if want := "execution." + string(tt.wantStatus); last != want || types[1] != "execution.started" {
				t.Fatalf("events %v", types)
			}
		})
	}
}

func TestDirectExecutionDeniedByPolicyFailsAtOnce(t *testing.T) {
	k := newKernel(t, askPolicy(t))
	v, _, err := k.Create(context.Background(), CreateRequest{Tool: &ToolCall{ToolID: "deny.me"}}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Status != StatusFailed || k.Live(v.ID) {
		t.Fatalf("denied call: %+v, live %v", v, k.Live(v.ID))
	}
	types := eventTypes(t, k, v.ID)
	if len(types) != 4 || types[2] != "intent.denied" || types[3] != "execution.failed" {
		t.Fatalf("events %v", types)
	}
}

func TestDirectExecutionWaitsForAPerson(t *testing.T) {
	for _, approved := range []bool{true, false} {
		k := newKernel(t, askPolicy(t))
		ctx := context.Background()
		defer k.RunnerConnected("rn", "r1", []string{"ask.send"})()
		v, _, err := k.Create(ctx, CreateRequest{Tool: &ToolCall{ToolID: "ask.send"}}, Meta{Principal: "alice"})
		if err != nil || v.Status != StatusBlocked {
			t.Fatalf("create: %+v %v", v, err)
		}
		st := liveStep(t, k, v.ID, func(st *Step) bool { return st.ActionID != "" })
		after, err := k.ResolveApproval(ctx, v.ID, st.ActionID, Decision{Outcome: map[bool]string{true: OutcomeApproved, false: OutcomeDenied}[approved]}, Meta{})
		if err != nil {
			t.Fatal(err)
		}
		after.Run()
		if !approved {
			if got := settle(t, k, v.ID); got.Status != StatusFailed {
				t.Fatalf("denied: %s", got.Status)
			}
			continue
		}
		// Approved: the step goes to the runner, and the execution does not
		// fall back to pending for want of an agent.
		st = liveStep(t, k, v.ID, dispatched)
		if got, _ := k.Get(ctx, v.ID); got.Status != StatusRunning {
			t.Fatalf("approved: %s", got.Status)
		}
		after, err = k.RunnerResult(ctx, "rn", RunnerResultRequest{JobID: st.JobID, ExecutionID: v.ID, StepID: st.ID, Success: true}, Meta{})
		if err != nil {
			t.Fatal(err)
		}
		after.Run()
		if got := settle(t, k, v.ID); got.Status != StatusCompleted {
			t.Fatalf("approved: ended %s", got.Status)
		}
	}
}

func TestJobsGoToTheRunnerOfTheirAccount(t *testing.T) {
	k := newKernel(t, askPolicy(t))
	defer k.RunnerConnected("r-one", "c", []string{"search", "search@acc_1"})()
	defer k.RunnerConnected("r-two", "c", []string{"search", "search@acc_2"})()
	for range 3 {
		for _, acc := range []string{"acc_1", "acc_2"} {
			v, _, err := k.Create(context.Background(), CreateRequest{Tool: &ToolCall{ToolID: "search", Account: acc}}, Meta{})
			if err != nil {
				t.Fatal(err)
			}
			st := liveStep(t, k, v.ID, dispatched)
			if want := map[string]string{"acc_1": "r-one", "acc_2": "r-two"}[acc]; st.RunnerID != want || st.Account != acc {
				t.Fatalf("account %s went to %s, want %s", acc, st.RunnerID, want)
			}
			after, err := k.RunnerResult(context.Background(), st.RunnerID, RunnerResultRequest{JobID: st.JobID, ExecutionID: v.ID, StepID: st.ID, Success: true}, Meta{})
			if err != nil {
				t.Fatal(err)
			}
			after.Run()
			settle(t, k, v.ID)
		}
	}
}

func TestDirectExecutionSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	k, closeKernel := openKernel(t, dir, askPolicy(t))
	v, _, err := k.Create(context.Background(), CreateRequest{Tool: &ToolCall{ToolID: "search", Account: "acc_9"}}, Meta{Principal: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	closeKernel() // no runner yet: the job waits in the queue
	k, closeKernel = openKernel(t, dir, askPolicy(t))
	defer closeKernel()
	defer k.RunnerConnected("late", "c", []string{"search@acc_9"})()
	st := liveStep(t, k, v.ID, dispatched)
	after, err := k.RunnerResult(context.Background(), "late", RunnerResultRequest{JobID: st.JobID, ExecutionID: v.ID, StepID: st.ID, Success: true, Data: json.RawMessage(`1`)}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	if got := settle(t, k, v.ID); got.Status != StatusCompleted || string(got.Output) != "1" || got.Tool == nil || got.Owner != "alice" {
		t.Fatalf("after the restart: %+v", got)
	}
}

func TestDirectExecutionStepTimeoutFailsIt(t *testing.T) {
	st, hub := openStoreAndHub(t)
	k, err := New(context.Background(), Options{Store: st, Deliverer: hubAdapter{hub}, Policy: askPolicy(t), StepTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	defer k.RunnerConnected("slow", "c", []string{"search"})()
	v, _, err := k.Create(context.Background(), CreateRequest{Tool: &ToolCall{ToolID: "search"}}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	if got := settle(t, k, v.ID); got.Status != StatusFailed {
		t.Fatalf("ended %s", got.Status)
	}
}

func TestDirectExecutionRequest(t *testing.T) {
	k := newKernel(t, askPolicy(t))
	for _, req := range []CreateRequest{
		{AgentID: "a", Tool: &ToolCall{ToolID: "t"}},
		{Tool: &ToolCall{}},
		{Tool: &ToolCall{ToolID: "t", Account: string(make([]byte, 300))}},
	} {
		if _, _, err := k.Create(context.Background(), req, Meta{}); !errors.Is(err, ErrValidation) {
			t.Errorf("create %+v: %v, want a validation error", req, err)
		}
	}
}
