package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
	"github.com/gatehouse-dev/gatehouse/store"
)

// approvalBook is an Approvals that keeps the records in memory, as the
// bridge's readers see them once applied, and allows the tools it is told
// to for whole sessions.
type approvalBook struct {
	mu        sync.Mutex
	requested map[string]Approval
	resolved  map[string]Decision
	published int
	always    map[[2]string]bool // session, tool
}

func newApprovalBook() *approvalBook {
	return &approvalBook{requested: map[string]Approval{}, resolved: map[string]Decision{}, always: map[[2]string]bool{}}
}

func (b *approvalBook) Requested(_ *store.Batch, a Approval) (apply, publish func()) {
	return func() { b.mu.Lock(); b.requested[a.ActionID] = a; b.mu.Unlock() },
		func() { b.mu.Lock(); b.published++; b.mu.Unlock() }
}

func (b *approvalBook) Resolved(_ *store.Batch, actionID string, d Decision) (apply, publish func()) {
	return func() { b.mu.Lock(); b.resolved[actionID] = d; b.mu.Unlock() },
		func() { b.mu.Lock(); b.published++; b.mu.Unlock() }
}

func (b *approvalBook) AllowedAlways(sessionID, toolID string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.always[[2]string{sessionID, toolID}]
}

func (b *approvalBook) decision(actionID string) (Decision, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	d, ok := b.resolved[actionID]
	return d, ok
}

// approvalMsg is an approval.resolved push.
type approvalMsg struct {
	Approved bool   `json:"approved"`
	StepID   string `json:"step_id"`
	Outcome  string `json:"outcome"`
	Reason   string `json:"reason"`
}

func TestApprovalByAPerson(t *testing.T) {
	book := newApprovalBook()
	r := newRig(t, func(o *Options) { o.Policy, o.Approvals = askPolicy(t), book })
	ctx := context.Background()
	defer r.k.AgentConnected("ag", "c1")()
	x := r.start("ag", "c1", CreateRequest{}, Meta{Principal: "alice", Tenant: "acme"})
	args := json.RawMessage(`{"to":"bob"}`)
	ask := x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "ask.send", Arguments: args})
	if !ask.Accepted || !ask.PendingApproval || ask.StepID == "" {
		t.Fatalf("invoke: %+v", ask)
	}
	v, _ := r.k.Get(ctx, x.id)
	action := r.k.ApprovalOf(x.id, ask.StepID)
	if v.Status != StatusBlocked || v.BlockReason != "approval" || v.BlockRef != ask.StepID || action == "" {
		t.Fatalf("waiting for a person: %+v, action %q", v, action)
	}
	book.mu.Lock()
	a, published := book.requested[action], book.published
	book.mu.Unlock()
	if a.Owner != "alice" || a.Tenant != "acme" || a.ExecutionID != x.id || a.StepID != ask.StepID || a.ToolID != "ask.send" ||
		a.ArgsHash != argsHash(args) || a.RuleID != "ask" || a.ExpiresAt != nil || a.OnExpiry != "deny" || published != 1 {
		t.Fatalf("prompt %+v, published %d", a, published)
	}

	_, err := r.k.ResolveApproval(ctx, x.id, "another", Decision{Outcome: OutcomeApproved}, Meta{})
	wantErr(t, err, ErrConflict)
	by := &DecidedBy{Principal: "alice", ChannelID: "phone"}
	after, err := r.k.ResolveApproval(ctx, x.id, action, Decision{Outcome: OutcomeApproved, Scope: ScopeSession, DecidedBy: by}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	var got approvalMsg
	x.box.next(event.PushApprovalResolved, &got)
	if !got.Approved || got.Outcome != OutcomeApproved || got.StepID != ask.StepID {
		t.Fatalf("approval.resolved: %+v", got)
	}
	if d, ok := book.decision(action); !ok || d.Outcome != OutcomeApproved || d.Scope != ScopeSession || d.DecidedBy.ChannelID != "phone" || d.DecidedAt.IsZero() {
		t.Fatalf("recorded decision: %+v", d)
	}
	// Only the first answer counts.
	_, err = r.k.ResolveApproval(ctx, x.id, action, Decision{Outcome: OutcomeDenied}, Meta{})
	wantErr(t, err, ErrConflict)
	after, err = r.k.StepResult(ctx, StepResultRequest{ExecutionID: x.id, SessionID: x.lease, StepID: ask.StepID, Success: true}, Meta{})
	if err != nil {
		t.Fatalf("result of the approved step: %v", err)
	}
	after.Run()
	x.box.next(event.PushToolResult, nil)

	// A denial fails the step, and says so to the agent.
	ask = x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "ask.delete"})
	// The step waits for its answer, not for its agent's result.
	_, err = r.k.StepResult(ctx, StepResultRequest{ExecutionID: x.id, SessionID: x.lease, StepID: ask.StepID, Success: true}, Meta{})
	wantErr(t, err, ErrConflict)
	after, err = r.k.ResolveApproval(ctx, x.id, r.k.ApprovalOf(x.id, ask.StepID), Decision{Outcome: OutcomeDenied, Reason: "not today"}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	x.box.next(event.PushApprovalResolved, &got)
	if got.Approved || got.Outcome != OutcomeDenied || got.Reason != "not today" {
		t.Fatalf("approval.resolved of a denial: %+v", got)
	}

	// Policy's own denial is an answer, not an error, and creates no step.
	denied := x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "deny.drop"})
	if denied.Accepted || denied.StepID != "" || denied.Error != "policy denied: not here (rule: no)" {
		t.Fatalf("denied: %+v", denied)
	}
	x.intent(t, r.k, Intent{Type: IntentComplete})
	types := strings.Join(eventTypes(t, r.k, x.id), " ")
	for _, want := range []string{
		event.StepApprovalRequired + " " + event.PermissionRequested + " " + event.ExecutionBlocked,
		event.PermissionResolved + " " + event.StepDispatched + " " + event.ExecutionResumed,
		event.PermissionResolved + " " + event.StepFailed + " " + event.ExecutionResumed,
		event.IntentDenied,
	} {
		if !strings.Contains(types, want) {
			t.Fatalf("no %q in %s", want, types)
		}
	}
	if s := r.k.Stats(); s.Denied != 1 {
		t.Fatalf("%d denials counted", s.Denied)
	}
}

func TestApprovalBySignal(t *testing.T) {
	r, x := newRigRunning(t, func(o *Options) { o.Policy = askPolicy(t) })
	ctx := context.Background()
	// With no prompt pending, step.approve is a signal like any other.
	after, err := r.k.Signal(ctx, x.id, SignalRequest{SignalType: signalStepApprove, Payload: json.RawMessage(`{"step_id":"x","approved":true}`)}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	x.box.next(event.PushSignalReceived, nil)
	ask := x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "ask.send"})
	for _, bad := range []string{``, `null`, `[1]`, `{"step_id":"` + ask.StepID + `"}`, `{"step_id":"other","approved":true}`} {
		_, err := r.k.Signal(ctx, x.id, SignalRequest{SignalType: signalStepApprove, Payload: json.RawMessage(bad)}, Meta{})
		wantErr(t, err, ErrValidation)
	}
	after, err = r.k.Signal(ctx, x.id, SignalRequest{SignalType: signalStepApprove,
		Payload: json.RawMessage(`{"step_id":"` + ask.StepID + `","approved":false,"reason":"no"}`)}, Meta{Principal: "op"})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	var got approvalMsg
	x.box.next(event.PushApprovalResolved, &got)
	if got.Approved || got.Outcome != OutcomeDenied || got.Reason != "no" {
		t.Fatalf("approval.resolved: %+v", got)
	}
	x.box.next(event.PushSignalReceived, nil)
	// A late answer to the settled prompt is refused, not kept.
	_, err = r.k.Signal(ctx, x.id, SignalRequest{SignalType: signalStepApprove,
		Payload: json.RawMessage(`{"step_id":"` + ask.StepID + `","approved":true}`)}, Meta{})
	wantErr(t, err, ErrConflict)
	var e *Error
	if !errors.As(err, &e) || e.Details.(map[string]any)["action_id"] != r.k.ApprovalOf(x.id, ask.StepID) {
		t.Fatalf("late answer: %#v", err)
	}
	if v, _ := r.k.Get(ctx, x.id); v.Status != StatusRunning {
		t.Fatalf("after the answer: %s", v.Status)
	}
}

func TestApprovalExpiry(t *testing.T) {
	pol := policytest.Parse(t, `rules:
  - id: hurry-deny
    priority: 1
    when: {tool_id: "ask.deny"}
    then: {decision: require_approval, expires_in: 30ms, on_expiry: deny}
  - id: hurry-allow
    priority: 2
    when: {tool_id: "ask.allow"}
    then: {decision: require_approval, expires_in: 30ms, on_expiry: allow}
default: {decision: allow}
`)
	book := newApprovalBook()
	r, x := newRigRunning(t, func(o *Options) { o.Policy, o.Approvals = pol, book })
	ctx := context.Background()
	tests := []struct {
		tool    string
		allowed bool
		reason  string
	}{
		{"ask.deny", false, "approval expired"},
		{"ask.allow", true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.tool, func(t *testing.T) {
			ask := x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: tt.tool})
			action := r.k.ApprovalOf(x.id, ask.StepID)
			book.mu.Lock()
			a := book.requested[action]
			book.mu.Unlock()
			if a.ExpiresAt == nil || a.OnExpiry != map[bool]string{true: "allow", false: "deny"}[tt.allowed] {
				t.Fatalf("prompt %+v", a)
			}
			var got approvalMsg
			x.box.next(event.PushApprovalResolved, &got)
			if got.Approved != tt.allowed || got.Outcome != OutcomeExpired || got.Reason != tt.reason {
				t.Fatalf("approval.resolved: %+v", got)
			}
			if d, ok := book.decision(action); !ok || d.Outcome != OutcomeExpired {
				t.Fatalf("recorded: %+v", d)
			}
			after, err := r.k.StepResult(ctx, StepResultRequest{ExecutionID: x.id, SessionID: x.lease, StepID: ask.StepID, Success: true}, Meta{})
			after.Run()
			if tt.allowed && err != nil {
				t.Fatalf("an expired prompt that allows lets the step run: %v", err)
			}
			if !tt.allowed {
				wantErr(t, err, ErrConflict) // the step failed when its prompt expired
			}
		})
	}
}

func TestAllowedAlwaysAndAskTools(t *testing.T) {
	book := newApprovalBook()
	book.always[[2]string{"s1", "ask.send"}] = true
	r := newRig(t, func(o *Options) { o.Policy, o.Approvals = askPolicy(t), book })
	defer r.k.AgentConnected("ag", "c1")()
	x := r.start("ag", "c1", CreateRequest{SessionID: "s1", Ask: []string{"calc"}}, Meta{})
	tests := []struct {
		tool    string
		pending bool
	}{
		{"ask.send", false},  // a person allowed it for the whole session
		{"ask.other", true},  // not that one
		{"calc", true},       // policy allows it, the caller asks first
		{"deny.send", false}, // the caller's ask does not undo a denial
	}
	for _, tt := range tests {
		res, after, err := r.k.Intent(context.Background(), IntentRequest{ExecutionID: x.id, SessionID: x.lease,
			Intent: Intent{Type: IntentInvokeTool, ToolID: tt.tool}}, Meta{})
		if err != nil {
			t.Fatalf("%s: %v", tt.tool, err)
		}
		after.Run()
		if res.PendingApproval != tt.pending {
			t.Fatalf("%s: %+v", tt.tool, res)
		}
		if res.PendingApproval {
			after, err := r.k.ResolveApproval(context.Background(), x.id, r.k.ApprovalOf(x.id, res.StepID), Decision{Outcome: OutcomeApproved}, Meta{})
			if err != nil {
				t.Fatal(err)
			}
			after.Run()
		}
	}
	var first struct {
		Payload struct {
			Details toolDetails `json:"details"`
		} `json:"payload"`
	}
	page, err := r.k.Events(context.Background(), x.id, 2, 1)
	if err != nil || json.Unmarshal(page.Events[0], &first) != nil || first.Payload.Details.ToolID != "ask.send" || !first.Payload.Details.AllowedAlways {
		t.Fatalf("the allowed call's intent.accepted: %s %v", page.Events, err)
	}
	book.mu.Lock()
	defer book.mu.Unlock()
	asked := map[string]string{}
	for _, a := range book.requested {
		asked[a.ToolID] = a.RuleID
	}
	if len(asked) != 2 || asked["calc"] != "ask_tools" || asked["ask.other"] != "ask" {
		t.Fatalf("prompts by tool: %v", asked)
	}
}

func TestCancelAndTimeoutWithdrawThePrompt(t *testing.T) {
	book := newApprovalBook()
	r, x := newRigRunning(t, func(o *Options) { o.Policy, o.Approvals = askPolicy(t), book })
	ctx := context.Background()
	ask := x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "ask.send"})
	action := r.k.ApprovalOf(x.id, ask.StepID)
	if _, err := r.k.Cancel(ctx, x.id, Meta{}); err != nil {
		t.Fatal(err)
	}
	if d, ok := book.decision(action); !ok || d.Outcome != OutcomeCancelled || d.Reason != "execution cancelled" {
		t.Fatalf("prompt of a cancelled execution: %+v %v", d, ok)
	}
	if r.k.ApprovalOf(x.id, ask.StepID) != "" {
		t.Fatal("a finished execution still names its prompt")
	}
	types := eventTypes(t, r.k, x.id)
	if want := event.PermissionResolved + " " + event.StepCancelled + " " + event.ExecutionCancelled; !strings.HasSuffix(strings.Join(types, " "), want) {
		t.Fatalf("events %v, want them to end with %s", types, want)
	}

	// An execution past its time fails, whatever it waits for.
	r, x = newRigRunning(t, func(o *Options) { o.Policy, o.Approvals, o.ExecutionTimeout = askPolicy(t), book, time.Second })
	ask = x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "ask.send"})
	action = r.k.ApprovalOf(x.id, ask.StepID)
	idle := r.create("nobody")
	for _, id := range []string{x.id, idle.ID} {
		if v := settle(t, r.k, id); v.Status != StatusFailed {
			t.Fatalf("%s ended %s", id, v.Status)
		}
		var last errorPayload
		if err := r.k.readPayload(id, mustSeq(t, r.k, id), &last); err != nil || last.Error != "execution exceeded maximum duration" {
			t.Fatalf("last event of %s: %+v %v", id, last, err)
		}
	}
	eventually.True(t, "the prompt withdrawn", func() bool { d, ok := book.decision(action); return ok && d.Outcome == OutcomeCancelled })
}

// mustSeq returns the sequence of execution id's last event.
func mustSeq(t *testing.T, k *Kernel, id string) uint64 {
	t.Helper()
	page, err := k.Events(context.Background(), id, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return page.LatestSequence
}

func TestApprovalAfterTheAgentWasLost(t *testing.T) {
	r := newRig(t, func(o *Options) { o.Policy, o.AgentGrace = askPolicy(t), 20*time.Millisecond })
	ctx := context.Background()
	gone := r.k.AgentConnected("ag", "c1")
	x := r.start("ag", "c1", CreateRequest{}, Meta{})
	ask := x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "ask.send"})
	gone()
	eventually.True(t, "the lease released", func() bool {
		types := eventTypes(t, r.k, x.id)
		return types[len(types)-1] == event.AgentTimeout
	})
	if v, _ := r.k.Get(ctx, x.id); v.Status != StatusBlocked {
		t.Fatalf("a blocked execution whose agent left: %s", v.Status)
	}
	box := r.inbox(RoleAgent, "ag", "c2")
	defer r.k.AgentConnected("ag", "c2")()
	box.empty()
	// Approved with nobody holding it, it goes to the next agent.
	after, err := r.k.ResolveApproval(ctx, x.id, r.k.ApprovalOf(x.id, ask.StepID), Decision{Outcome: OutcomeApproved}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	var a assignedPush
	box.next(event.PushExecutionAssigned, &a)
	if a.ExecutionID != x.id || len(a.History) != 1 || a.History[0].Status != StepCancelled {
		t.Fatalf("assignment: %+v", a)
	}
}
