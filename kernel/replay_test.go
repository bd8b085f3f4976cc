package kernel

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/store/storetest"
)

func newKernel(t *testing.T, pol Policy) *Kernel {
	t.Helper()
	k, closeKernel := openKernel(t, t.TempDir(), pol)
	t.Cleanup(closeKernel)
	return k
}

// openKernel opens a kernel on the data folder dir; close it with the
// returned function.
func openKernel(t *testing.T, dir string, pol Policy) (*Kernel, func()) {
	t.Helper()
	r := openRig(t, dir, func(o *Options) { o.Policy = pol })
	return r.k, r.close
}

// openStoreAndHubIn opens a store on dir and a peer hub on it.
func openStoreAndHubIn(t *testing.T, dir string) (*store.Store, *peer.Hub) {
	t.Helper()
	st := storetest.Open(t, store.Options{Dir: dir})
	hub, err := peer.NewHub(context.Background(), peer.Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	return st, hub
}

// openStoreAndHub opens a store and hub in a fresh folder, closed when the
// test ends, for tests that need their own kernel options.
func openStoreAndHub(t *testing.T) (*store.Store, *peer.Hub) {
	t.Helper()
	st, hub := openStoreAndHubIn(t, t.TempDir())
	t.Cleanup(func() { hub.Close(); st.Close() })
	return st, hub
}

// hubAdapter is the gateway's adapter, repeated here because the kernel
// cannot import the gateway.
type hubAdapter struct{ h *peer.Hub }

func pk(p Peer) peer.Key { return peer.Key{Role: p.Role, ID: p.ID, Consumer: p.Consumer} }

func (a hubAdapter) Stage(b *store.Batch, p Peer, typ string, data []byte, settle string) Staged {
	return a.h.Stage(b, pk(p), typ, data, settle)
}
func (a hubAdapter) Settle(b *store.Batch, p Peer, settle string) func() {
	return a.h.Settle(b, pk(p), settle)
}
func (a hubAdapter) Forget(p Peer) { a.h.Forget(pk(p)) }

// TestReplayRebuildsLiveState drives an execution through every kind of
// transition, then checks that folding its log from the store (what a
// restart does) gives the same state as the live fold.
func TestReplayRebuildsLiveState(t *testing.T) {
	pol := policytest.Parse(t, "rules:\n  - id: ask\n    priority: 1\n    when: {tool_id: \"ask.*\"}\n    then: {decision: require_approval}\ndefault: {decision: allow}\n")
	k := newKernel(t, pol)
	ctx := context.Background()
	defer k.AgentConnected("ag", "c1")()
	defer k.RunnerConnected("rn", "r1", []string{"remote.tool"})()
	v, _, err := k.Create(ctx, CreateRequest{AgentID: "ag", Input: json.RawMessage(`{"x":1}`), Labels: map[string]string{"l": "v"}}, Meta{TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"})
	if err != nil || v.Status != StatusRunning {
		t.Fatalf("create: %+v %v", v, err)
	}
	k.mu.Lock()
	ex := k.live[v.ID]
	k.mu.Unlock()
	lease := ex.Lease.ID
	intent := func(in Intent) IntentResult {
		t.Helper()
		res, after, err := k.Intent(ctx, IntentRequest{ExecutionID: v.ID, SessionID: lease, Intent: in}, Meta{})
		if err != nil {
			t.Fatalf("intent %+v: %v", in, err)
		}
		after.Run()
		return res
	}
	local := intent(Intent{Type: IntentInvokeTool, ToolID: "local.tool", Arguments: json.RawMessage(`[1]`)})
	after, err := k.StepResult(ctx, StepResultRequest{ExecutionID: v.ID, SessionID: lease, StepID: local.StepID, Success: true, Data: json.RawMessage(`"ok"`)}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	remote := intent(Intent{Type: IntentInvokeTool, ToolID: "remote.tool", Remote: true})
	jobID := eventually.Value(t, "the remote step dispatched", func() (string, bool) {
		ex.mu.Lock()
		defer ex.mu.Unlock()
		id := ex.Steps[remote.StepID].JobID
		return id, id != ""
	})
	after, err = k.RunnerResult(ctx, "rn", RunnerResultRequest{JobID: jobID, ExecutionID: v.ID, StepID: remote.StepID, Error: "flaky", Retryable: true}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	ask := intent(Intent{Type: IntentInvokeTool, ToolID: "ask.human"})
	after, err = k.Signal(ctx, v.ID, SignalRequest{SignalType: "note", Payload: json.RawMessage(`1`)}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	after, err = k.Signal(ctx, v.ID, SignalRequest{SignalType: signalStepApprove, Payload: json.RawMessage(`{"step_id":"` + ask.StepID + `","approved":false}`)}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	intent(Intent{Type: IntentWait, SignalType: "go"})

	ex.mu.Lock()
	defer ex.mu.Unlock()
	got, err := k.replay(v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != ex.Status || got.Seq != ex.Seq || got.BlockReason != ex.BlockReason || got.BlockRef != ex.BlockRef ||
		got.Lease.ID != ex.Lease.ID || got.TraceID != ex.TraceID || got.SessionID != ex.SessionID || got.AgentID != ex.AgentID || string(got.Input) != string(ex.Input) ||
		len(got.Signals) != len(ex.Signals) || len(got.History) != len(ex.History) || len(got.StepOrder) != len(ex.StepOrder) {
		t.Fatalf("replay differs:\n live   %+v\n replay %+v", ex, got)
	}
	for _, id := range ex.StepOrder {
		a, b := ex.Steps[id], got.Steps[id]
		if a.Status != b.Status || a.Attempt != b.Attempt || a.JobID != b.JobID || a.Approval != b.Approval || a.Remote != b.Remote || !a.NotBefore.Equal(b.NotBefore) {
			t.Fatalf("step %s differs:\n live   %+v\n replay %+v", id, a, b)
		}
	}
	if ex.Status != StatusBlocked || len(ex.Signals) != 1 {
		t.Fatalf("scenario did not end blocked with one pending signal: %s %d", ex.Status, len(ex.Signals))
	}

	// Earlier releases stored events in their JSON form. A log rewritten
	// in that form reads back the same and replays the same.
	page, err := k.Events(ctx, v.ID, 0, 1000)
	if err != nil || len(page.Events) != int(ex.Seq) {
		t.Fatalf("events: %d of %d, %v", len(page.Events), ex.Seq, err)
	}
	var b store.Batch
	for i, raw := range page.Events {
		if raw[0] != '{' {
			t.Fatalf("event %d is not JSON: %s", i+1, raw)
		}
		b.Append(streamOf(v.ID), uint64(i+1), raw)
	}
	if err := k.store.Write(ctx, &b); err != nil {
		t.Fatal(err)
	}
	again, err := k.Events(ctx, v.ID, 0, 1000)
	if err != nil || len(again.Events) != len(page.Events) {
		t.Fatalf("events after rewrite: %d, %v", len(again.Events), err)
	}
	for i := range again.Events {
		if string(again.Events[i]) != string(page.Events[i]) {
			t.Fatalf("event %d reads differently:\n stored form %s\n JSON form   %s", i+1, page.Events[i], again.Events[i])
		}
	}
	old, err := k.replay(v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if old.Status != got.Status || old.Seq != got.Seq || old.TraceID != got.TraceID || old.SessionID != got.SessionID || len(old.StepOrder) != len(got.StepOrder) ||
		len(old.Signals) != len(got.Signals) || len(old.History) != len(got.History) {
		t.Fatalf("JSON-form replay differs:\n stored form %+v\n JSON form   %+v", got, old)
	}

	// The replay takes the session from the log; a log from before events
	// named it takes it from the execution's summary.
	var first map[string]any
	if err := json.Unmarshal(page.Events[0], &first); err != nil {
		t.Fatal(err)
	}
	delete(first, "session_id")
	raw, err := json.Marshal(first)
	if err != nil {
		t.Fatal(err)
	}
	b = store.Batch{}
	b.Append(streamOf(v.ID), 1, raw)
	if err := k.store.Write(ctx, &b); err != nil {
		t.Fatal(err)
	}
	older, err := k.replay(v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if older.SessionID != ex.SessionID {
		t.Fatalf("replay of a log naming no session: session %q, want %q", older.SessionID, ex.SessionID)
	}
}

func TestNextStatus(t *testing.T) {
	for _, tc := range []struct {
		from Status
		typ  string
		want Status
	}{
		{"", event.ExecutionCreated, StatusPending},
		{StatusPending, event.ExecutionStarted, StatusRunning},
		{StatusRunning, event.ExecutionBlocked, StatusBlocked},
		{StatusBlocked, event.ExecutionResumed, StatusRunning},
		{StatusRunning, event.ExecutionReset, StatusPending},
		{StatusRunning, event.ExecutionCompleted, StatusCompleted},
		{StatusBlocked, event.ExecutionFailed, StatusFailed},
		{StatusPending, event.ExecutionCancelled, StatusCancelled},
		{StatusRunning, event.StepCreated, StatusRunning},
		{StatusBlocked, event.SignalReceived, StatusBlocked},
	} {
		if got := nextStatus(tc.from, tc.typ); got != tc.want {
			t.Errorf("nextStatus(%s, %s) = %s, want %s", tc.from, tc.typ, got, tc.want)
		}
	}
}
