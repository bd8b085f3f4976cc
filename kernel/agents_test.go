package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/event"
)

func TestAgentRunsLocalSteps(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	defer r.k.AgentConnected("ag", "c1")()
	x := r.start("ag", "c1", CreateRequest{Input: json.RawMessage(`"hello"`), Labels: map[string]string{"l": "v"}}, Meta{})

	first := x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "calc", Arguments: json.RawMessage(`{"a":1}`)})
	if !first.Accepted || first.StepID == "" || first.PendingApproval {
		t.Fatalf("invoke: %+v", first)
	}
	if id := r.k.ApprovalOf(x.id, first.StepID); id != "" {
		t.Fatalf("a step that needed no approval has action %q", id)
	}
	res := StepResultRequest{ExecutionID: x.id, SessionID: x.lease, StepID: first.StepID, Success: true, Data: json.RawMessage(`{"sum":3}`)}
	after, err := r.k.StepResult(ctx, res, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	var got toolResultPush
	x.box.next(event.PushToolResult, &got)
	if got.StepID != first.StepID || got.Status != string(StepSucceeded) || string(got.Result) != `{"sum":3}` {
		t.Fatalf("tool.result: %+v", got)
	}

	// A retried result is answered again; another outcome is a conflict
	// that carries the recorded one.
	res.Data = json.RawMessage(`{ "sum": 3 }`)
	if _, err := r.k.StepResult(ctx, res, Meta{}); err != nil {
		t.Fatalf("retried result: %v", err)
	}
	res.Data = json.RawMessage(`{"sum":4}`)
	_, err = r.k.StepResult(ctx, res, Meta{})
	wantErr(t, err, ErrConflict)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatal(err)
	}
	if rec := e.Details.(map[string]any)["recorded"].(map[string]any); rec["status"] != StepSucceeded || string(rec["result"].(json.RawMessage)) != `{"sum":3}` {
		t.Fatalf("recorded outcome: %+v", rec)
	}
	x.box.empty()

	// Completing with a step in progress is refused; a failed step is
	// reported as such.
	second := x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "calc"})
	_, _, err = r.k.Intent(ctx, IntentRequest{ExecutionID: x.id, SessionID: x.lease, Intent: Intent{Type: IntentComplete}}, Meta{})
	wantErr(t, err, ErrConflict)
	if !errors.As(err, &e) || e.Details.(map[string]any)["active_steps"] != 1 {
		t.Fatalf("conflict details: %+v", e.Details)
	}
	after, err = r.k.StepResult(ctx, StepResultRequest{ExecutionID: x.id, SessionID: x.lease, StepID: second.StepID, Error: "division by zero"}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	x.box.next(event.PushToolResult, &got)
	if got.StepID != second.StepID || got.Status != string(StepFailed) || got.Error != "division by zero" {
		t.Fatalf("tool.result of a failure: %+v", got)
	}
	if _, err := r.k.StepResult(ctx, StepResultRequest{ExecutionID: x.id, SessionID: x.lease, StepID: second.StepID, Error: "division by zero"}, Meta{}); err != nil {
		t.Fatalf("retried failure: %v", err)
	}

	x.intent(t, r.k, Intent{Type: IntentComplete, Output: json.RawMessage(`"done"`)})
	want := []string{event.ExecutionCreated, event.ExecutionStarted,
		event.IntentAccepted, event.StepCreated, event.StepCompleted,
		event.IntentAccepted, event.StepCreated, event.StepFailed,
		event.IntentAccepted, event.ExecutionCompleted}
	if got := eventTypes(t, r.k, x.id); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("events %v\nwant %v", got, want)
	}
	// The finished execution still answers retried results from its log.
	res.Data = json.RawMessage(`{"sum":3}`)
	if _, err := r.k.StepResult(ctx, res, Meta{}); err != nil {
		t.Fatalf("retried result after the end: %v", err)
	}
	_, err = r.k.StepResult(ctx, StepResultRequest{ExecutionID: x.id, SessionID: x.lease, StepID: "nope"}, Meta{})
	wantErr(t, err, ErrNotFound)
}

func TestAnswerStepWithoutTheLease(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	defer r.k.AgentConnected("ag", "c1")()
	defer r.k.RunnerConnected("rn", "c1", []string{"remote.tool"})()
	x := r.start("ag", "c1", CreateRequest{}, Meta{})
	local := x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "client.tool"})
	remote := x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "remote.tool", Remote: true})

	_, err := r.k.AnswerStep(ctx, StepResultRequest{ExecutionID: x.id, StepID: remote.StepID, Success: true}, Meta{})
	wantErr(t, err, ErrConflict)
	after, err := r.k.AnswerStep(ctx, StepResultRequest{ExecutionID: x.id, StepID: local.StepID, Success: true, Data: json.RawMessage(`1`)}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	var got toolResultPush
	x.box.next(event.PushToolResult, &got)
	if got.StepID != local.StepID || string(got.Result) != "1" {
		t.Fatalf("tool.result: %+v", got)
	}
	_, err = r.k.AnswerStep(ctx, StepResultRequest{ExecutionID: x.id, StepID: local.StepID, Success: true, Data: json.RawMessage(`2`)}, Meta{})
	wantErr(t, err, ErrConflict)
}

func TestIntentRefusals(t *testing.T) {
	r, x := newRigRunning(t, func(o *Options) { o.MaxSteps = 1 })
	ctx := context.Background()
	req := func(in Intent) IntentRequest { return IntentRequest{ExecutionID: x.id, SessionID: x.lease, Intent: in} }
	tests := []struct {
		name string
		req  IntentRequest
		want error
	}{
		{"no execution", IntentRequest{SessionID: x.lease, Intent: Intent{Type: IntentComplete}}, ErrValidation},
		{"no lease", IntentRequest{ExecutionID: x.id, Intent: Intent{Type: IntentComplete}}, ErrValidation},
		{"no type", req(Intent{}), ErrValidation},
		{"tool id that is no id", req(Intent{Type: IntentInvokeTool, ToolID: "a\tb"}), ErrValidation},
		{"error too long", req(Intent{Type: IntentFail, Error: strings.Repeat("e", maxErrorLen+1)}), ErrValidation},
		{"unknown execution", IntentRequest{ExecutionID: "0190aaaa-0000-7000-8000-000000000000", SessionID: x.lease, Intent: Intent{Type: IntentComplete}}, ErrNotFound},
		{"another lease", IntentRequest{ExecutionID: x.id, SessionID: "stale", Intent: Intent{Type: IntentComplete}}, ErrUnauthorized},
		{"invoke without tool", req(Intent{Type: IntentInvokeTool}), ErrValidation},
		{"fail without error", req(Intent{Type: IntentFail}), ErrValidation},
		{"wait without signal", req(Intent{Type: IntentWait}), ErrValidation},
		{"unknown type", req(Intent{Type: "dance"}), ErrValidation},
		{"output without output", req(Intent{Type: IntentOutput}), ErrValidation},
		{"output that is no object", req(Intent{Type: IntentOutput, Output: json.RawMessage(`"hi"`)}), ErrValidation},
		{"output without kind", req(Intent{Type: IntentOutput, Output: json.RawMessage(`{"text":"hi"}`)}), ErrValidation},
		{"output of an unknown kind", req(Intent{Type: IntentOutput, Output: json.RawMessage(`{"kind":"song","text":"la"}`)}), ErrValidation},
		{"output too long", req(Intent{Type: IntentOutput, Output: json.RawMessage(`{"kind":"text","text":"` + strings.Repeat("w", maxOutputText+1) + `"}`)}), ErrValidation},
		{"output under another lease", IntentRequest{ExecutionID: x.id, SessionID: "stale", Intent: Intent{Type: IntentOutput, Output: json.RawMessage(`{"kind":"text"}`)}}, ErrUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := r.k.Intent(ctx, tt.req, Meta{})
			wantErr(t, err, tt.want)
		})
	}
	x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "one"})
	_, _, err := r.k.Intent(ctx, req(Intent{Type: IntentInvokeTool, ToolID: "two"}), Meta{})
	wantErr(t, err, ErrConflict)
	if got := eventTypes(t, r.k, x.id); len(got) != 4 {
		t.Fatalf("refused intents wrote events: %v", got)
	}
}

func TestIntentIdempotencyKey(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	r.k.AgentConnected("ag", "c1")
	x := r.start("ag", "c1", CreateRequest{}, Meta{})
	invoke := Intent{Type: IntentInvokeTool, ToolID: "search", Arguments: json.RawMessage(`{"q":1}`), IdempotencyKey: "k1"}
	first := x.intent(t, r.k, invoke)
	if again := x.intent(t, r.k, invoke); again != first {
		t.Fatalf("retry answered %+v, first %+v", again, first)
	}
	other := invoke
	other.Arguments = json.RawMessage(`{"q":2}`)
	_, _, err := r.k.Intent(ctx, IntentRequest{ExecutionID: x.id, SessionID: x.lease, Intent: other}, Meta{})
	wantErr(t, err, ErrConflict)
	n := len(eventTypes(t, r.k, x.id))

	// After a restart the answer comes from the store; the agent comes
	// back within its grace period and keeps its lease.
	r = r.reopen(nil)
	r.k.AgentConnected("ag", "c1")
	if again := x.intent(t, r.k, invoke); again != first {
		t.Fatalf("retry after restart answered %+v, first %+v", again, first)
	}
	_, _, err = r.k.Intent(ctx, IntentRequest{ExecutionID: x.id, SessionID: x.lease, Intent: other}, Meta{})
	wantErr(t, err, ErrConflict)
	if got := len(eventTypes(t, r.k, x.id)); got != n {
		t.Fatalf("retries wrote %d events", got-n)
	}
	after, err := r.k.StepResult(ctx, StepResultRequest{ExecutionID: x.id, SessionID: x.lease, StepID: first.StepID, Success: true, IdempotencyKey: "r1"}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	complete := Intent{Type: IntentComplete, IdempotencyKey: "k2"}
	x.intent(t, r.k, complete)
	// A retry of the last intent reaches a finished execution, and is
	// still answered.
	if again := x.intent(t, r.k, complete); !again.Accepted {
		t.Fatalf("retried complete: %+v", again)
	}
	_, _, err = r.k.Intent(ctx, IntentRequest{ExecutionID: x.id, SessionID: x.lease, Intent: Intent{Type: IntentFail, Error: "x", IdempotencyKey: "k2"}}, Meta{})
	wantErr(t, err, ErrConflict)
	_, _, err = r.k.Intent(ctx, IntentRequest{ExecutionID: x.id, SessionID: x.lease, Intent: Intent{Type: IntentComplete, IdempotencyKey: "k3"}}, Meta{})
	wantErr(t, err, ErrConflict)
}

func TestWaitAndSignals(t *testing.T) {
	r, x := newRigRunning(t, func(o *Options) { o.MaxSignals = 2 })
	ctx := context.Background()
	signal := func(typ, payload string) {
		t.Helper()
		after, err := r.k.Signal(ctx, x.id, SignalRequest{SignalType: typ, Payload: json.RawMessage(payload)}, Meta{})
		if err != nil {
			t.Fatal(err)
		}
		after.Run()
	}
	type sigMsg struct {
		SignalType string          `json:"signal_type"`
		Payload    json.RawMessage `json:"payload"`
		Sequence   uint64          `json:"sequence"`
	}
	var got sigMsg

	// A signal that comes before the wait is kept, and the wait takes it.
	signal("early", `{"n":1}`)
	x.box.next(event.PushSignalReceived, &got)
	early := got.Sequence
	x.intent(t, r.k, Intent{Type: IntentWait, SignalType: "early"})
	x.box.next(event.PushSignalReceived, &got)
	if got.SignalType != "early" || got.Sequence != early || string(got.Payload) != `{"n":1}` {
		t.Fatalf("wait on a kept signal pushed %+v, want sequence %d", got, early)
	}
	if v, _ := r.k.Get(ctx, x.id); v.Status != StatusRunning {
		t.Fatalf("after a wait on a kept signal: %s", v.Status)
	}

	// A wait with nothing kept blocks until its signal comes.
	x.intent(t, r.k, Intent{Type: IntentWait, SignalType: "go"})
	if v, _ := r.k.Get(ctx, x.id); v.Status != StatusBlocked || v.BlockReason != "signal" || v.BlockRef != "go" {
		t.Fatalf("waiting: %+v", v)
	}
	_, _, err := r.k.Intent(ctx, IntentRequest{ExecutionID: x.id, SessionID: x.lease, Intent: Intent{Type: IntentComplete}}, Meta{})
	wantErr(t, err, ErrConflict)
	signal("other", `null`)
	x.box.next(event.PushSignalReceived, &got)
	if v, _ := r.k.Get(ctx, x.id); v.Status != StatusBlocked {
		t.Fatalf("another signal resumed it: %s", v.Status)
	}
	signal("go", `true`)
	x.box.next(event.PushSignalReceived, &got)
	if v, _ := r.k.Get(ctx, x.id); v.Status != StatusRunning || got.SignalType != "go" {
		t.Fatalf("after its signal: %s, push %+v", v.Status, got)
	}

	// Signals nobody waits for are bounded.
	signal("other", `2`)
	_, err = r.k.Signal(ctx, x.id, SignalRequest{SignalType: "other"}, Meta{})
	wantErr(t, err, ErrConflict)
	for _, bad := range []SignalRequest{{}, {SignalType: "two\nlines"}, {SignalType: strings.Repeat("s", maxIDLen+1)}} {
		_, err := r.k.Signal(ctx, x.id, bad, Meta{})
		wantErr(t, err, ErrValidation)
	}
}

func TestAgentLostHandsExecutionToAnother(t *testing.T) {
	r := newRig(t, func(o *Options) { o.AgentGrace = 20 * time.Millisecond })
	ctx := context.Background()
	gone := r.k.AgentConnected("ag", "c1")
	x := r.start("ag", "c1", CreateRequest{Input: json.RawMessage(`{"task":1}`)}, Meta{})
	done := x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "done.tool", Arguments: json.RawMessage(`[1]`)})
	after, err := r.k.StepResult(ctx, StepResultRequest{ExecutionID: x.id, SessionID: x.lease, StepID: done.StepID, Success: true, Data: json.RawMessage(`"r"`)}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	open := x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "open.tool"})

	box2 := r.inbox(RoleAgent, "ag", "c2")
	defer r.k.AgentConnected("ag", "c2")()
	box2.empty() // c1 still holds it during its grace period
	gone()
	var a assignedPush
	box2.next(event.PushExecutionAssigned, &a)
	if a.ExecutionID != x.id || a.SessionID == x.lease || string(a.Input) != `{"task":1}` || len(a.History) != 2 {
		t.Fatalf("reassignment: %+v", a)
	}
	if h := a.History; h[0].StepID != done.StepID || h[0].Status != StepSucceeded || string(h[0].Result) != `"r"` ||
		h[1].StepID != open.StepID || h[1].Status != StepCancelled {
		t.Fatalf("history: %+v", h)
	}
	_, _, err = r.k.Intent(ctx, IntentRequest{ExecutionID: x.id, SessionID: x.lease, Intent: Intent{Type: IntentComplete}}, Meta{})
	wantErr(t, err, ErrUnauthorized)
	y := running{id: x.id, lease: a.SessionID, box: box2}
	y.intent(t, r.k, Intent{Type: IntentComplete})
	types := eventTypes(t, r.k, x.id)
	want := []string{event.AgentTimeout, event.StepCancelled, event.ExecutionReset, event.ExecutionStarted, event.IntentAccepted, event.ExecutionCompleted}
	if tail := types[len(types)-len(want):]; strings.Join(tail, " ") != strings.Join(want, " ") {
		t.Fatalf("events end %v, want %v", tail, want)
	}
}

func TestAgentReconnectingKeepsItsExecutions(t *testing.T) {
	r := newRig(t, func(o *Options) { o.AgentGrace = time.Hour })
	first := r.k.AgentConnected("ag", "c1")
	x := r.start("ag", "c1", CreateRequest{}, Meta{})
	// A second connection of the same consumer takes over; the end of the
	// first must not count as the consumer leaving.
	second := r.k.AgentConnected("ag", "c1")
	first()
	if s := r.k.Stats(); s.AgentsOnline != 1 {
		t.Fatalf("after a superseded connection ended: %d agents online", s.AgentsOnline)
	}
	second()
	if s := r.k.Stats(); s.AgentsOnline != 0 {
		t.Fatalf("after the last connection ended: %d agents online", s.AgentsOnline)
	}
	defer r.k.AgentConnected("ag", "c1")()
	x.intent(t, r.k, Intent{Type: IntentComplete})
}

func TestOutputIntentsWithoutSessions(t *testing.T) {
	r, x := newRigRunning(t, nil)
	for _, kind := range []string{OutputText, OutputTextDelta, OutputReasoning, OutputReasoningDelta, OutputStatus, OutputCheckpoint} {
		res := x.intent(t, r.k, Intent{Type: IntentOutput, Output: json.RawMessage(`{"kind":"` + kind + `","text":"t-` + kind + `","data":{"k":1}}`)})
		if !res.Accepted || res.StepID != "" {
			t.Fatalf("output %s: %+v", kind, res)
		}
	}
	var said []string
	err := r.k.ReadEventValues(x.id, 2, func(e *event.Event) bool {
		var o Output
		if e.Type != event.AgentOutput || json.Unmarshal(e.Payload, &o) != nil || o.Text != "t-"+o.Kind || string(o.Data) != `{"k":1}` {
			t.Errorf("event %d: %s %s", e.Sequence, e.Type, e.Payload)
		}
		said = append(said, o.Kind)
		return true
	})
	if err != nil || len(said) != 6 {
		t.Fatalf("outputs in the log: %v %v", said, err)
	}
	_, err = r.k.Say(context.Background(), IntentRequest{ExecutionID: x.id, Intent: Intent{Output: json.RawMessage(`{"kind":"text"}`)}}, Meta{})
	wantErr(t, err, ErrValidation)
}

func TestDeclarations(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	for _, bad := range []struct {
		agent string
		info  string
	}{{"", `{}`}, {"a\x01", `{}`}, {"ag", `{`}, {"ag", `{"big":"` + strings.Repeat("x", maxAgentInfo) + `"}`}} {
		wantErr(t, r.k.Declare(ctx, bad.agent, json.RawMessage(bad.info)), ErrValidation)
	}
	for _, d := range []struct{ agent, info string }{{"zed", `{"v":1}`}, {"alpha", `{"v":1}`}, {"zed", `{"v":2}`}} {
		if err := r.k.Declare(ctx, d.agent, json.RawMessage(d.info)); err != nil {
			t.Fatal(err)
		}
	}
	defer r.k.AgentConnected("zed", "c1")()
	check := func(k *Kernel, zedOnline bool) {
		t.Helper()
		ds, err := k.Declarations()
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) != 2 || ds[0].AgentID != "alpha" || ds[1].AgentID != "zed" || string(ds[1].Info) != `{"v":2}` ||
			ds[0].Online || ds[1].Online != zedOnline || ds[1].At.IsZero() {
			t.Fatalf("declarations: %+v", ds)
		}
	}
	check(r.k, true)
	r = r.reopen(nil)
	check(r.k, false)
}

func TestTrimHistoryKeepsTheNewest(t *testing.T) {
	big := json.RawMessage(`"` + strings.Repeat("r", 100<<10) + `"`)
	var h []HistoryEntry
	for i := range 8 {
		h = append(h, HistoryEntry{StepID: string(rune('a' + i)), Result: big})
	}
	got := trimHistory(h)
	if len(got) != 5 || got[len(got)-1].StepID != "h" || got[0].StepID != "d" {
		t.Fatalf("trimmed to %d entries, from %s to %s", len(got), got[0].StepID, got[len(got)-1].StepID)
	}
	if small := h[:3]; len(trimHistory(small)) != 3 {
		t.Fatal("a small history was trimmed")
	}
}
