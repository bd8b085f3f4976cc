package bridge

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/store/storetest"
)

func TestParseDecision(t *testing.T) {
	for _, tc := range []struct {
		in, outcome, scope string
		err                bool
	}{
		{DecisionAllowOnce, kernel.OutcomeApproved, kernel.ScopeOnce, false},
		{DecisionAllowAlways, kernel.OutcomeApproved, kernel.ScopeSession, false},
		{DecisionDeny, kernel.OutcomeDenied, kernel.ScopeOnce, false},
		{"approve", "", "", true},
		{"", "", "", true},
	} {
		o, s, err := ParseDecision(tc.in)
		if (err != nil) != tc.err || o != tc.outcome || s != tc.scope {
			t.Errorf("ParseDecision(%q) = %q, %q, %v", tc.in, o, s, err)
		}
		if err != nil && !errors.Is(err, ErrDecision) {
			t.Errorf("ParseDecision(%q): error %v is not ErrDecision", tc.in, err)
		}
	}
}

type notes struct{ prompts, retracts []string }

func (n *notes) Prompt(r Record)  { n.prompts = append(n.prompts, r.ActionID) }
func (n *notes) Retract(r Record) { n.retracts = append(n.retracts, r.State) }

// TestRecordLifecycleSurvivesReopen: a prompt staged, committed, published
// and settled is recorded, audited and reloaded from the same folder.
func TestRecordLifecycleSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	st := storetest.Open(t, store.Options{Dir: dir})
	n := &notes{}
	b, err := New(context.Background(), Options{Store: st, Notifier: n})
	if err != nil {
		t.Fatal(err)
	}
	commit := func(batch *store.Batch) {
		t.Helper()
		if err := st.Write(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"a1", "a2"} {
		var batch store.Batch
		apply, publish := b.Requested(&batch, kernel.Approval{ActionID: id, Owner: "alice", SessionID: "s1", ToolID: "deploy", RequestedAt: time.Now()})
		commit(&batch)
		apply()
		publish()
	}
	if got := b.Pending("alice"); len(got) != 2 || got[0].State != StatePending {
		t.Fatalf("pending: %+v", got)
	}
	if len(b.Pending("bob")) != 0 {
		t.Fatal("bob sees alice's prompts")
	}
	var batch store.Batch
	apply, publish := b.Resolved(&batch, "a1", kernel.Decision{Outcome: kernel.OutcomeApproved, Scope: kernel.ScopeSession, Reason: "ok",
		DecidedBy: &kernel.DecidedBy{Principal: "alice", ChannelID: "phone", NativePeerID: "u1"}, DecidedAt: time.Now()})
	commit(&batch)
	apply()
	if rec, _ := b.Get("a1"); rec.State != StateApproved {
		t.Fatalf("the decision is not visible right after the commit: %+v", rec)
	}
	publish()
	if !b.AllowedAlways("s1", "deploy") || b.AllowedAlways("s2", "deploy") {
		t.Fatal("allow_always not scoped to its session and tool")
	}
	if len(n.prompts) != 2 || len(n.retracts) != 1 || n.retracts[0] != StateApproved {
		t.Fatalf("notifications: %+v", n)
	}

	st = storetest.Reopen(t, st, store.Options{Dir: dir})
	b, err = New(context.Background(), Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := b.Get("a1")
	if err != nil || rec.State != StateApproved || rec.Decision != DecisionAllowAlways || rec.DecidedBy.ChannelID != "phone" || rec.DecidedAt == nil {
		t.Fatalf("audit after reopen: %+v, %v", rec, err)
	}
	if got := b.Pending(""); len(got) != 1 || got[0].ActionID != "a2" {
		t.Fatalf("pending after reopen: %+v", got)
	}
	if !b.AllowedAlways("s1", "deploy") {
		t.Fatal("allow_always lost on reopen")
	}
	if _, err := b.Get("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown action: %v", err)
	}
	alices := func(r *Record) bool { return r.Owner == "alice" }
	all, next, err := b.List(context.Background(), "", alices, "", 1)
	if err != nil || len(all) != 1 || all[0].ActionID != "a1" || next != "a1" {
		t.Fatalf("list page 1: %+v %q %v", all, next, err)
	}
	all, next, err = b.List(context.Background(), "", alices, next, 1)
	if err != nil || len(all) != 1 || all[0].ActionID != "a2" || next != "" {
		t.Fatalf("list page 2: %+v %q %v", all, next, err)
	}
	if all, _, err := b.List(context.Background(), StatePending, func(*Record) bool { return false }, "", 10); err != nil || len(all) != 0 {
		t.Fatalf("pending list of a caller who sees nothing: %+v %v", all, err)
	}
}

// TestUnforwardedPromptIsForwardedAtStart: a prompt committed but never
// handed to the channels (a crash between the two) reaches them when the
// bridge starts again; a forwarded one is not sent again.
func TestUnforwardedPromptIsForwardedAtStart(t *testing.T) {
	dir := t.TempDir()
	st := storetest.Open(t, store.Options{Dir: dir})
	b, err := New(context.Background(), Options{Store: st, Notifier: &notes{}})
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"sent", "lost"} {
		var batch store.Batch
		apply, publish := b.Requested(&batch, kernel.Approval{ActionID: id, Owner: "alice", RequestedAt: time.Now()})
		if err := st.Write(context.Background(), &batch); err != nil {
			t.Fatal(err)
		}
		apply()
		if i == 0 {
			publish() // the crash comes before the second prompt's fan-out
		}
	}
	st = storetest.Reopen(t, st, store.Options{Dir: dir})
	n := &notes{}
	if _, err := New(context.Background(), Options{Store: st, Notifier: n}); err != nil {
		t.Fatal(err)
	}
	if len(n.prompts) != 1 || n.prompts[0] != "lost" {
		t.Fatalf("forwarded at start: %v, want [lost]", n.prompts)
	}
}

// TestUnretractedSettlementIsRetractedAtStart: a settlement committed but
// never handed to the channels (a crash between the two) is retracted
// when the bridge starts again, once; a retracted one is not again.
func TestUnretractedSettlementIsRetractedAtStart(t *testing.T) {
	dir := t.TempDir()
	st := storetest.Open(t, store.Options{Dir: dir})
	b, err := New(context.Background(), Options{Store: st, Notifier: &notes{}})
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"retracted", "lost"} {
		var batch store.Batch
		apply, publish := b.Requested(&batch, kernel.Approval{ActionID: id, Owner: "alice", RequestedAt: time.Now()})
		if err := st.Write(context.Background(), &batch); err != nil {
			t.Fatal(err)
		}
		apply()
		publish()
		batch = store.Batch{}
		apply, publish = b.Resolved(&batch, id, kernel.Decision{Outcome: kernel.OutcomeDenied, DecidedAt: time.Now()})
		if err := st.Write(context.Background(), &batch); err != nil {
			t.Fatal(err)
		}
		apply()
		if i == 0 {
			publish() // the crash comes before the second retraction
		}
	}
	st = storetest.Reopen(t, st, store.Options{Dir: dir})
	n := &notes{}
	if _, err := New(context.Background(), Options{Store: st, Notifier: n}); err != nil {
		t.Fatal(err)
	}
	if len(n.retracts) != 1 || n.retracts[0] != StateDenied {
		t.Fatalf("retracted at start: %v, want [denied]", n.retracts)
	}
	st = storetest.Reopen(t, st, store.Options{Dir: dir})
	n = &notes{}
	if _, err := New(context.Background(), Options{Store: st, Notifier: n}); err != nil {
		t.Fatal(err)
	}
	if len(n.retracts) != 0 {
		t.Fatalf("retracted again at the next start: %v", n.retracts)
	}
}
