package kernel

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
)

func TestCreateRefusesMalformedRequests(t *testing.T) {
	r := newRig(t, nil)
	long := strings.Repeat("x", maxIDLen+1)
	manyLabels := map[string]string{}
	for i := range maxLabels + 1 {
		manyLabels[fmt.Sprint("l", i)] = "v"
	}
	manyAsk := make([]string, maxLabels+1)
	for i := range manyAsk {
		manyAsk[i] = fmt.Sprint("tool", i)
	}
	tests := []struct {
		name string
		req  CreateRequest
		meta Meta
	}{
		{"no agent", CreateRequest{}, Meta{}},
		{"agent id too long", CreateRequest{AgentID: long}, Meta{}},
		{"agent id with a control character", CreateRequest{AgentID: "a\x00b"}, Meta{}},
		{"session id too long", CreateRequest{AgentID: "ag", SessionID: long}, Meta{}},
		{"idempotency key too long", CreateRequest{AgentID: "ag"}, Meta{IdempotencyKey: strings.Repeat("k", maxIdempotencyKey+1)}},
		{"too many ask tools", CreateRequest{AgentID: "ag", Ask: manyAsk}, Meta{}},
		{"ask tool that is no id", CreateRequest{AgentID: "ag", Ask: []string{"bad\ntool"}}, Meta{}},
		{"too many labels", CreateRequest{AgentID: "ag", Labels: manyLabels}, Meta{}},
		{"empty label key", CreateRequest{AgentID: "ag", Labels: map[string]string{"": "v"}}, Meta{}},
		{"label value too long", CreateRequest{AgentID: "ag", Labels: map[string]string{"k": strings.Repeat("v", maxLabelLen+1)}}, Meta{}},
		{"label value on two lines", CreateRequest{AgentID: "ag", Labels: map[string]string{"k": "a\nb"}}, Meta{}},
		{"label key that is no id", CreateRequest{AgentID: "ag", Labels: map[string]string{"a\u200bb": "v"}}, Meta{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := r.k.Create(context.Background(), tt.req, tt.meta)
			wantErr(t, err, ErrValidation)
		})
	}
	if st := r.k.Stats(); st.Live != 0 || st.Created != 0 {
		t.Fatalf("refused creates left %d live, %d created", st.Live, st.Created)
	}
}

func TestCreateStopsAtMaxLive(t *testing.T) {
	r := newRig(t, func(o *Options) { o.MaxLive = 2 })
	ctx := context.Background()
	var ids []string
	for range 2 {
		ids = append(ids, r.create("ag").ID)
	}
	_, _, err := r.k.Create(ctx, CreateRequest{AgentID: "ag"}, Meta{})
	wantErr(t, err, ErrUnavailable)
	if _, err := r.k.Cancel(ctx, ids[0], Meta{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.k.Create(ctx, CreateRequest{AgentID: "ag"}, Meta{}); err != nil {
		t.Fatalf("create after one finished: %v", err)
	}
}

func TestUnknownAndFinishedExecutions(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	v := r.create("ag")
	if _, err := r.k.Cancel(ctx, v.ID, Meta{}); err != nil {
		t.Fatal(err)
	}
	const missing = "0190aaaa-0000-7000-8000-000000000000"
	tests := []struct {
		name string
		call func() error
		want error
	}{
		{"get unknown", func() error { _, err := r.k.Get(ctx, missing); return err }, ErrNotFound},
		{"cancel unknown", func() error { _, err := r.k.Cancel(ctx, missing, Meta{}); return err }, ErrNotFound},
		{"events of unknown", func() error { _, err := r.k.Events(ctx, missing, 0, 10); return err }, ErrNotFound},
		{"signal unknown", func() error { _, err := r.k.Signal(ctx, missing, SignalRequest{SignalType: "go"}, Meta{}); return err }, ErrNotFound},
		{"approve on unknown", func() error {
			_, err := r.k.ResolveApproval(ctx, missing, "a", Decision{Outcome: OutcomeApproved}, Meta{})
			return err
		}, ErrNotFound},
		{"cancel finished", func() error { _, err := r.k.Cancel(ctx, v.ID, Meta{}); return err }, ErrConflict},
		{"signal finished", func() error { _, err := r.k.Signal(ctx, v.ID, SignalRequest{SignalType: "go"}, Meta{}); return err }, ErrConflict},
		{"step result of unknown", func() error {
			_, err := r.k.StepResult(ctx, StepResultRequest{ExecutionID: missing, SessionID: "s", StepID: "st"}, Meta{})
			return err
		}, ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantErr(t, tt.call(), tt.want) })
	}
	// A conflict with a finished execution says what it is, for clients.
	_, err := r.k.Cancel(ctx, v.ID, Meta{})
	var e *Error
	if !errors.As(err, &e) || e.Details.(map[string]any)["status"] != StatusCancelled || !strings.Contains(e.Error(), "cancelled") {
		t.Fatalf("conflict on a cancelled execution: %#v", err)
	}
	_, err = r.k.Get(ctx, missing)
	if !errors.As(err, &e) || !strings.Contains(e.Error(), missing) {
		t.Fatalf("not found names the execution: %v", err)
	}
}

func TestFinishedExecutionReadsBackFromTheStore(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	defer r.k.AgentConnected("ag", "c1")()
	x := r.start("ag", "c1", CreateRequest{Input: json.RawMessage(`{"q":"hi"}`), Labels: map[string]string{"team": "a"}},
		Meta{Principal: "alice", Tenant: "acme"})
	x.intent(t, r.k, Intent{Type: IntentComplete, Output: json.RawMessage(`{"answer":42}`)})
	if r.k.Live(x.id) {
		t.Fatal("a completed execution is still live")
	}
	v, err := r.k.Get(ctx, x.id)
	if err != nil {
		t.Fatal(err)
	}
	if v.Status != StatusCompleted || !v.HasOutput || string(v.Output) != `{"answer":42}` || string(v.Input) != `{"q":"hi"}` ||
		v.Labels["team"] != "a" || v.Owner != "alice" || v.Tenant != "acme" || v.AgentID != "ag" {
		t.Fatalf("finished view: %+v", v)
	}

	// Without input, labels or output the view says so rather than
	// showing empty values.
	y := r.start("ag", "c1", CreateRequest{}, Meta{})
	y.intent(t, r.k, Intent{Type: IntentFail, Error: "gave up"})
	v, err = r.k.Get(ctx, y.id)
	if err != nil {
		t.Fatal(err)
	}
	if v.Status != StatusFailed || v.HasOutput || v.Input != nil || v.Labels != nil {
		t.Fatalf("failed view: %+v", v)
	}
}

func TestListPagesAndFilters(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	var ids []string // in creation order
	for i := range 7 {
		ag := "ag-even"
		if i%2 == 1 {
			ag = "ag-odd"
		}
		v, _, err := r.k.Create(ctx, CreateRequest{AgentID: ag, Labels: map[string]string{"n": fmt.Sprint(i), "group": fmt.Sprint(i % 3)}},
			Meta{Principal: fmt.Sprint("p", i%2)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.ID)
	}
	if _, err := r.k.Cancel(ctx, ids[3], Meta{}); err != nil {
		t.Fatal(err)
	}

	// Pages of two walk every execution once, newest first.
	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		page, err := r.k.List(ctx, ListRequest{Limit: 2, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range page.Executions {
			got = append(got, s.ID)
		}
		if page.NextCursor == "" {
			if pages != 3 {
				t.Fatalf("%d pages of two for 7 executions", pages+1)
			}
			break
		}
		cursor = page.NextCursor
	}
	if len(got) != len(ids) {
		t.Fatalf("pages hold %d executions, want %d", len(got), len(ids))
	}
	for i, id := range got {
		if id != ids[len(ids)-1-i] {
			t.Fatalf("row %d is %s, want %s (newest first)", i, id, ids[len(ids)-1-i])
		}
	}

	tests := []struct {
		name string
		req  ListRequest
		want []int // indexes into ids, newest first
	}{
		{"by agent", ListRequest{AgentID: "ag-odd"}, []int{5, 3, 1}},
		{"by status", ListRequest{Status: StatusCancelled}, []int{3}},
		{"by status and agent", ListRequest{Status: StatusPending, AgentID: "ag-odd"}, []int{5, 1}},
		{"by label", ListRequest{Labels: map[string]string{"group": "0"}}, []int{6, 3, 0}},
		{"by two labels", ListRequest{Labels: map[string]string{"group": "0", "n": "6"}}, []int{6}},
		{"by owner", ListRequest{Visible: func(s *Summary) bool { return s.Owner == "p0" }, Limit: 3}, []int{6, 4, 2}},
		{"nothing matches", ListRequest{AgentID: "nobody"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page, err := r.k.List(ctx, tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Executions) != len(tt.want) {
				t.Fatalf("%d rows, want %d: %+v", len(page.Executions), len(tt.want), page.Executions)
			}
			for i, s := range page.Executions {
				if s.ID != ids[tt.want[i]] {
					t.Fatalf("row %d is %s (labels %v), want execution %d", i, s.ID, s.Labels, tt.want[i])
				}
			}
		})
	}

	for _, c := range []string{"%%%", base64.StdEncoding.EncodeToString([]byte("no bar")),
		base64.StdEncoding.EncodeToString([]byte("yesterday|id")), base64.StdEncoding.EncodeToString([]byte("2024-01-01T00:00:00Z|"))} {
		_, err := r.k.List(ctx, ListRequest{Cursor: c})
		wantErr(t, err, ErrValidation)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := r.k.List(cancelled, ListRequest{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("list with a cancelled context: %v", err)
	}
}

func TestEventsPagesAndReaders(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	defer r.k.AgentConnected("ag", "c1")()
	x := r.start("ag", "c1", CreateRequest{}, Meta{TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"})
	for i := range 3 {
		after, err := r.k.Signal(ctx, x.id, SignalRequest{SignalType: "note", Payload: json.RawMessage(fmt.Sprint(i))}, Meta{})
		if err != nil {
			t.Fatal(err)
		}
		after.Run()
	}
	want := []string{event.ExecutionCreated, event.ExecutionStarted, event.SignalReceived, event.SignalReceived, event.SignalReceived}
	if got := eventTypes(t, r.k, x.id); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("events %v, want %v", got, want)
	}
	page, err := r.k.Events(ctx, x.id, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Events) != 2 || page.LatestSequence != 4 {
		t.Fatalf("page after 2, limit 2: %d events, latest %d", len(page.Events), page.LatestSequence)
	}
	var ev event.Event
	if err := json.Unmarshal(page.Events[0], &ev); err != nil || ev.Sequence != 3 || ev.Type != event.SignalReceived || string(ev.Payload) != `{"signal_type":"note","payload":0}` {
		t.Fatalf("event 3: %s %v", page.Events[0], err)
	}
	if page, err := r.k.Events(ctx, x.id, 5, 0); err != nil || len(page.Events) != 0 || page.LatestSequence != 0 {
		t.Fatalf("page past the end: %+v %v", page, err)
	}

	// AppendEvents gives the JSON form and the type, in order, and stops
	// when told or at its bound; the parts it handed out stay whole as the
	// buffer grows.
	for _, c := range []struct {
		max, stop int
		want      string
	}{{0, 3, "[2 3 4]"}, {2, 3, "[2 3]"}, {0, 0, "[2 3 4 5]"}, {9, 0, "[2 3 4 5]"}} {
		var seqs []uint64
		var parts [][]byte
		buf, err := r.k.AppendEvents(make([]byte, 0, 8), x.id, 1, c.max, func(seq uint64, typ string, data []byte) bool {
			var e event.Event
			if err := json.Unmarshal(data, &e); err != nil || e.Sequence != seq || e.Type != typ || e.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" {
				t.Errorf("event %d (%s): %s %v", seq, typ, data, err)
			}
			seqs, parts = append(seqs, seq), append(parts, data)
			return c.stop == 0 || len(seqs) < c.stop
		})
		if err != nil || fmt.Sprint(seqs) != c.want || string(bytes.Join(parts, nil)) != string(buf) {
			t.Fatalf("AppendEvents after 1, at most %d, stopping at %d: %v, %v; %q against %q", c.max, c.stop, seqs, err, parts, buf)
		}
	}
	var types []string
	err = r.k.ReadEventValues(x.id, 0, func(e *event.Event) bool {
		types = append(types, e.Type)
		return true
	})
	if err != nil || strings.Join(types, " ") != strings.Join(want, " ") {
		t.Fatalf("ReadEventValues: %v %v", types, err)
	}

}

func TestParseStatus(t *testing.T) {
	for _, tc := range []struct {
		in       string
		want     Status
		ok       bool
		terminal bool
	}{
		{"pending", StatusPending, true, false},
		{"running", StatusRunning, true, false},
		{"blocked", StatusBlocked, true, false},
		{"completed", StatusCompleted, true, true},
		{"failed", StatusFailed, true, true},
		{"cancelled", StatusCancelled, true, true},
		{"Running", "", false, false},
		{"", "", false, false},
	} {
		got, ok := ParseStatus(tc.in)
		if got != tc.want || ok != tc.ok || got.Terminal() != tc.terminal {
			t.Errorf("ParseStatus(%q) = %q %v (terminal %v)", tc.in, got, ok, got.Terminal())
		}
	}
}

func TestWatchWakesReaders(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	v := r.create("ag")
	w := r.k.Watch(v.ID)
	other := r.k.Watch(v.ID)
	woken := make(chan struct{}, 10)
	other.OnWake(func() { woken <- struct{}{} })
	select {
	case <-w.C():
		t.Fatal("woken before anything was written")
	default:
	}
	after, err := r.k.Signal(ctx, v.ID, SignalRequest{SignalType: "go"}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	after.Run()
	<-w.C() // the signal's commit wakes it; a missed wake hangs the test
	<-woken
	w.Stop()
	if _, err := r.k.Cancel(ctx, v.ID, Meta{}); err != nil {
		t.Fatal(err)
	}
	<-woken
	select {
	case <-w.C():
		t.Fatal("a stopped watch was woken")
	default:
	}
	other.Stop()
	// Watchers are not kept for executions nobody watches.
	if r.k.watches.Watched(v.ID) {
		t.Fatal("the execution is still watched after every watch stopped")
	}

	// Close ends every watch, and OnWake after that runs at once.
	last := r.k.Watch(v.ID)
	r.close()
	<-last.Done()
	ran := false
	last.OnWake(func() { ran = true })
	if !ran {
		t.Fatal("OnWake on a closed watch did not run")
	}
}

func TestKernelReportsItself(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	if err := r.k.Ready(ctx); err != nil {
		t.Fatalf("ready: %v", err)
	}
	if r.k.Epoch() == "" || r.k.Epoch() != r.st.Epoch() {
		t.Fatalf("epoch %q, store's %q", r.k.Epoch(), r.st.Epoch())
	}
	defer r.k.AgentConnected("ag", "c1")()
	defer r.k.RunnerConnected("rn", "c1", []string{"slow"})()
	x := r.start("ag", "c1", CreateRequest{}, Meta{})
	x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "slow", Remote: true})
	x.intent(t, r.k, Intent{Type: IntentInvokeTool, ToolID: "slow", Remote: true})
	eventually.True(t, "one job held and one queued", func() bool { s := r.k.Stats(); return s.QueuedJobs == 1 && s.RunnersBusy == 1 })
	s := r.k.Stats()
	if s.Live != 1 || s.AgentsOnline != 1 || s.RunnersOnline != 1 || s.Created != 1 || s.Intents != 2 || s.Steps != 2 || s.Jobs != 1 || s.Events == 0 {
		t.Fatalf("stats: %+v", s)
	}
	k := r.k
	r.close()
	if err := k.Ready(ctx); err == nil {
		t.Fatal("ready with the store closed")
	}
}
