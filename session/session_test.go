package session_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/session"
	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/store/storetest"
)

// world is a real store, peer hub, kernel and session registry on one data
// folder, as the gateway wires them.
type world struct {
	t   *testing.T
	dir string
	st  *store.Store
	hub *peer.Hub
	k   *kernel.Kernel
	reg *session.Registry
}

type hubAdapter struct{ h *peer.Hub }

func pk(p kernel.Peer) peer.Key { return peer.Key{Role: p.Role, ID: p.ID, Consumer: p.Consumer} }

func (a hubAdapter) Stage(b *store.Batch, p kernel.Peer, typ string, data []byte, settle string) kernel.Staged {
	return a.h.Stage(b, pk(p), typ, data, settle)
}
func (a hubAdapter) Settle(b *store.Batch, p kernel.Peer, settle string) func() {
	return a.h.Settle(b, pk(p), settle)
}
func (a hubAdapter) Forget(p kernel.Peer) { a.h.Forget(pk(p)) }

func open(t *testing.T, dir string, o session.Options) *world {
	t.Helper()
	w := &world{t: t, dir: dir}
	w.st = storetest.Open(t, store.Options{Dir: dir})
	var err error
	if w.hub, err = peer.NewHub(context.Background(), peer.Options{Store: w.st}); err != nil {
		t.Fatal(err)
	}
	o.Store = w.st
	if w.reg, err = session.New(o); err != nil {
		t.Fatal(err)
	}
	if w.k, err = kernel.New(context.Background(), kernel.Options{Store: w.st, Deliverer: hubAdapter{w.hub}, Sessions: w.reg, AgentGrace: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := w.reg.Start(context.Background(), w.k); err != nil {
		t.Fatal(err)
	}
	return w
}

func newWorld(t *testing.T) *world {
	w := open(t, t.TempDir(), session.Options{})
	t.Cleanup(w.close)
	return w
}

func (w *world) close() {
	w.reg.Close()
	w.k.Close()
	w.hub.Close()
	w.st.Close()
}

// agent is a connected agent consumer reading its outbox.
type agent struct {
	w    *world
	conn *peer.Conn
	id   string
}

func (w *world) agent(id string) *agent {
	w.t.Helper()
	w.t.Cleanup(w.k.AgentConnected(id, "c1"))
	conn, _ := w.hub.Attach(peer.Key{Role: kernel.RoleAgent, ID: id, Consumer: "c1"}, nil)
	return &agent{w: w, conn: conn, id: id}
}

// assigned waits for the next execution.assigned and returns its execution
// id and lease.
func (a *agent) assigned() (string, string) {
	a.w.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if d, ok := a.conn.Next(); ok {
			if d.Type != "execution.assigned" {
				continue
			}
			var p struct {
				ExecutionID string `json:"execution_id"`
				SessionID   string `json:"session_id"`
			}
			if err := json.Unmarshal(d.Data, &p); err != nil {
				a.w.t.Fatal(err)
			}
			return p.ExecutionID, p.SessionID
		}
		select {
		case <-a.conn.Ready():
		case <-deadline:
			a.w.t.Fatal("no execution assigned within 10s")
		}
	}
}

func (a *agent) intent(exec, lease string, in kernel.Intent) {
	a.w.t.Helper()
	_, after, err := a.w.k.Intent(context.Background(), kernel.IntentRequest{ExecutionID: exec, SessionID: lease, Intent: in}, kernel.Meta{})
	if err != nil {
		a.w.t.Fatalf("intent %s: %v", in.Type, err)
	}
	after.Run()
}

func (a *agent) complete(exec, lease string) {
	a.w.t.Helper()
	a.intent(exec, lease, kernel.Intent{Type: kernel.IntentComplete, Output: json.RawMessage(`{"ok":true}`)})
}

// completeTurns submits turns prefix0, prefix1, ... to session id one after
// another and completes each as the agent, waiting for it to be recorded.
func (a *agent) completeTurns(id, prefix string, n int) {
	a.w.t.Helper()
	for i := range n {
		turn := fmt.Sprint(prefix, i)
		if _, err := a.w.reg.Submit(context.Background(), session.SubmitRequest{SessionID: id, TurnID: turn}); err != nil {
			a.w.t.Fatal(err)
		}
		exec, lease := a.assigned()
		a.complete(exec, lease)
		a.w.waitTurn(id, turn, session.TurnCompleted)
	}
}

// pastRetention opens a world on a fresh folder whose registry keeps three
// entries for an hour, with a session of agent ag that three completed
// turns took past that: a prune then has a beginning to remove. The caller
// closes the world.
func pastRetention(t *testing.T) (*world, *agent, session.Session) {
	t.Helper()
	w := open(t, t.TempDir(), session.Options{MaxEntries: 3, MaxAge: time.Hour})
	ag := w.agent("ag")
	s, err := w.reg.Create(context.Background(), session.CreateRequest{AgentID: "ag"})
	if err != nil {
		t.Fatal(err)
	}
	ag.completeTurns(s.ID, "done", 3)
	return w, ag, s
}

// items reads session id's whole log.
func (w *world) items(id string) []session.Item {
	w.t.Helper()
	var out []session.Item
	if err := w.reg.Read(context.Background(), id, 0, func(it session.Item) bool { out = append(out, it); return true }); err != nil {
		w.t.Fatal(err)
	}
	return out
}

// summary shows a log as its fact types and event references.
func summary(items []session.Item) string {
	var parts []string
	for _, it := range items {
		switch it.Kind {
		case session.KindEvent:
			parts = append(parts, fmt.Sprintf("ev%d", it.ExecutionSeq))
		case session.KindDelta:
			parts = append(parts, "delta")
		default:
			parts = append(parts, it.Type)
		}
	}
	return strings.Join(parts, " ")
}

// checkSequence fails unless the log's sequences run 1, 2, 3, ...
func checkSequence(t *testing.T, items []session.Item) {
	t.Helper()
	for i, it := range items {
		if it.Seq != uint64(i+1) {
			t.Fatalf("item %d has sequence %d: %s", i, it.Seq, summary(items))
		}
	}
}

func (w *world) waitTurn(id, turn string, want session.TurnStatus) session.Turn {
	w.t.Helper()
	var t session.Turn
	eventually.Check(w.t, func() error {
		var err error
		if t, err = w.reg.Turn(context.Background(), id, turn); err != nil || t.Status != want {
			return fmt.Errorf("turn %s: %+v %v, want %s", turn, t, err, want)
		}
		return nil
	})
	return t
}

func TestTurnRunsAsAnExecutionFiledInTheSessionLog(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	ag := w.agent("ag")
	s, err := w.reg.Create(ctx, session.CreateRequest{AgentID: "ag", Owner: "alice", Title: "research"})
	if err != nil {
		t.Fatal(err)
	}
	turn, err := w.reg.Submit(ctx, session.SubmitRequest{SessionID: s.ID, Input: json.RawMessage(`{"q":"papers"}`)})
	if err != nil || turn.Status != session.TurnRunning {
		t.Fatalf("submit: %+v %v", turn, err)
	}
	exec, lease := ag.assigned()
	ag.complete(exec, lease)
	got := w.waitTurn(s.ID, turn.ID, session.TurnCompleted)
	if got.ExecutionID != exec {
		t.Fatalf("turn ran %s, want %s", got.ExecutionID, exec)
	}
	items := w.items(s.ID)
	checkSequence(t, items)
	want := "session.created thread.started turn.submitted turn.started ev1 ev2 ev3 ev4 turn.completed"
	if got := summary(items); got != want {
		t.Fatalf("log\n got %s\nwant %s", got, want)
	}
	for _, it := range items {
		if it.Kind == session.KindEvent && (it.ExecutionID != exec || it.TurnID != turn.ID || it.ThreadID != session.DefaultThread) {
			t.Fatalf("event item %+v", it)
		}
	}
	v, err := w.k.Get(ctx, exec)
	if err != nil || v.SessionID != s.ID {
		t.Fatalf("execution: %+v %v", v, err)
	}
	cur, _ := w.reg.Get(ctx, s.ID)
	if th := cur.Threads[0]; th.Status != session.ThreadIdle || th.Active != "" {
		t.Fatalf("thread after the turn: %+v", th)
	}
}

func TestQueuedTurnsRunInOrder(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	ag := w.agent("ag")
	s, _ := w.reg.Create(ctx, session.CreateRequest{AgentID: "ag", Owner: "alice"})
	var turns []session.Turn
	for i := range 4 {
		tn, err := w.reg.Submit(ctx, session.SubmitRequest{SessionID: s.ID, TurnID: fmt.Sprintf("t%d", i), Input: json.RawMessage(fmt.Sprint(i))})
		if err != nil {
			t.Fatal(err)
		}
		turns = append(turns, tn)
	}
	if turns[0].Status != session.TurnRunning || turns[1].Status != session.TurnQueued {
		t.Fatalf("statuses %s %s", turns[0].Status, turns[1].Status)
	}
	if err := w.reg.Promote(ctx, s.ID, "t3"); err != nil {
		t.Fatal(err)
	}
	if err := w.reg.RemoveQueued(ctx, s.ID, "t2"); err != nil {
		t.Fatal(err)
	}
	if err := w.reg.RemoveQueued(ctx, s.ID, "t0"); !errors.Is(err, session.ErrConflict) {
		t.Fatalf("removing the running turn: %v", err)
	}
	w.waitTurn(s.ID, "t2", session.TurnCancelled)
	var order []string
	for range 3 {
		exec, lease := ag.assigned()
		v, _ := w.k.Get(ctx, exec)
		order = append(order, string(v.Input))
		ag.complete(exec, lease)
	}
	if got := strings.Join(order, ","); got != "0,3,1" {
		t.Fatalf("ran inputs %s, want 0,3,1 (t3 promoted, t2 removed)", got)
	}
	w.waitTurn(s.ID, "t1", session.TurnCompleted)
	checkSequence(t, w.items(s.ID))
}

func TestSubmitIsIdempotentOnTheTurnID(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	s, _ := w.reg.Create(ctx, session.CreateRequest{AgentID: "ag"})
	first, err := w.reg.Submit(ctx, session.SubmitRequest{SessionID: s.ID, TurnID: "once", Input: json.RawMessage(`{"a": 1}`)})
	if err != nil {
		t.Fatal(err)
	}
	again, err := w.reg.Submit(ctx, session.SubmitRequest{SessionID: s.ID, TurnID: "once", Input: json.RawMessage(`{"a":1}`)})
	if err != nil || again.ID != first.ID || !again.Submitted.Equal(first.Submitted) {
		t.Fatalf("retry: %+v %v", again, err)
	}
	if _, err := w.reg.Submit(ctx, session.SubmitRequest{SessionID: s.ID, TurnID: "once", Input: json.RawMessage(`{"a":2}`)}); !errors.Is(err, session.ErrConflict) {
		t.Fatalf("other input under the same turn id: %v", err)
	}
	turns, _ := w.reg.Turns(ctx, s.ID)
	if len(turns) != 1 {
		t.Fatalf("%d turns", len(turns))
	}
}

func TestExecutionAPIOpensASessionImplicitly(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	ag := w.agent("ag")
	v, _, err := w.k.Create(ctx, kernel.CreateRequest{AgentID: "ag", SessionID: "chat-1"}, kernel.Meta{Principal: "bob", Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := w.reg.Get(ctx, "chat-1")
	if err != nil || s.Owner != "bob" || s.Tenant != "acme" || s.AgentID != "ag" {
		t.Fatalf("implicit session: %+v %v", s, err)
	}
	exec, lease := ag.assigned()
	if exec != v.ID {
		t.Fatal("assigned another execution")
	}
	ag.complete(exec, lease)
	eventually.Check(t, func() error {
		if log := summary(w.items("chat-1")); !strings.HasSuffix(log, "turn.completed") {
			return fmt.Errorf("log: %s", log)
		}
		return nil
	})
	items := w.items("chat-1")
	checkSequence(t, items)
	want := "session.created thread.started thread.started turn.submitted turn.started ev1 ev2 ev3 ev4 turn.completed"
	if got := summary(items); got != want {
		t.Fatalf("log\n got %s\nwant %s", got, want)
	}
	if items[2].ThreadID != "x-"+exec {
		t.Fatalf("the execution's thread is %q", items[2].ThreadID)
	}
	// An execution without a session_id is filed nowhere.
	plain, _, err := w.k.Create(ctx, kernel.CreateRequest{AgentID: "ag"}, kernel.Meta{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.reg.Get(ctx, plain.SessionID); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("a plain execution's default session: %v", err)
	}
}

func TestArchivedSessionTakesNoNewWork(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	s, _ := w.reg.Create(ctx, session.CreateRequest{AgentID: "ag"})
	if _, err := w.reg.Archive(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := w.reg.Submit(ctx, session.SubmitRequest{SessionID: s.ID}); !errors.Is(err, session.ErrArchived) {
		t.Fatalf("submit: %v", err)
	}
	if _, _, err := w.k.Create(ctx, kernel.CreateRequest{AgentID: "ag", SessionID: s.ID}, kernel.Meta{}); !errors.Is(err, session.ErrArchived) {
		t.Fatalf("execution in an archived session: %v", err)
	}
	if got := summary(w.items(s.ID)); got != "session.created thread.started session.updated" {
		t.Fatalf("log %s", got)
	}
}

func TestDeltasAreCoalescedAndShownLive(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	ag := w.agent("ag")
	s, _ := w.reg.Create(ctx, session.CreateRequest{AgentID: "ag"})
	if _, err := w.reg.Submit(ctx, session.SubmitRequest{SessionID: s.ID}); err != nil {
		t.Fatal(err)
	}
	exec, lease := ag.assigned()
	before := w.st.Stats().Writes
	watch := w.reg.Watch(s.ID)
	defer watch.Stop()
	var dones []<-chan error
	var want strings.Builder
	for i := range 1000 {
		d := fmt.Sprintf("w%d ", i)
		want.WriteString(d)
		done, err := w.k.Say(ctx, kernel.IntentRequest{ExecutionID: exec, SessionID: lease, Intent: kernel.Intent{
			Type: kernel.IntentOutput, Output: json.RawMessage(fmt.Sprintf(`{"kind":"text_delta","text":%q}`, d)),
		}}, kernel.Meta{})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			// Shown before it is durable.
			select {
			case <-watch.C():
			case <-time.After(5 * time.Second):
				t.Fatal("no wake for the first delta")
			}
			last, _ := w.reg.Last(ctx, s.ID)
			var seen []session.Item
			_ = w.reg.Read(ctx, s.ID, last-1, func(it session.Item) bool { seen = append(seen, it); return true })
			if len(seen) != 1 || seen[0].Kind != session.KindDelta || seen[0].Text != d {
				t.Fatalf("live read of the open run: %+v", seen)
			}
		}
		dones = append(dones, done)
	}
	for _, done := range dones {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if writes := w.st.Stats().Writes - before; writes > 20 {
		t.Errorf("1,000 deltas took %d store writes", writes)
	}
	ag.complete(exec, lease)
	var got strings.Builder
	items := w.items(s.ID)
	checkSequence(t, items)
	for _, it := range items {
		if it.Kind == session.KindDelta {
			got.WriteString(it.Text)
		}
	}
	if got.String() != want.String() {
		t.Fatalf("deltas read back differ: %d bytes, want %d", got.Len(), want.Len())
	}
}

func TestConcurrentThreadsKeepOneSequence(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	ag := w.agent("ag")
	s, _ := w.reg.Create(ctx, session.CreateRequest{AgentID: "ag"})
	var execs []string
	var leases []string
	for range 3 {
		v, _, err := w.k.Create(ctx, kernel.CreateRequest{AgentID: "ag", SessionID: s.ID}, kernel.Meta{})
		if err != nil {
			t.Fatal(err)
		}
		exec, lease := ag.assigned()
		if exec != v.ID {
			t.Fatal("assigned another execution")
		}
		execs, leases = append(execs, exec), append(leases, lease)
	}
	var wg sync.WaitGroup
	for i := range execs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				_, _, err := w.k.Intent(ctx, kernel.IntentRequest{ExecutionID: execs[i], SessionID: leases[i], Intent: kernel.Intent{Type: kernel.IntentInvokeTool, ToolID: "t"}}, kernel.Meta{})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	items := w.items(s.ID)
	checkSequence(t, items)
	next := map[string]uint64{}
	for _, it := range items {
		if it.Kind != session.KindEvent {
			continue
		}
		if it.ExecutionSeq != next[it.ExecutionID]+1 {
			t.Fatalf("execution %s: event %d after %d", it.ExecutionID, it.ExecutionSeq, next[it.ExecutionID])
		}
		next[it.ExecutionID] = it.ExecutionSeq
	}
	for _, x := range execs {
		v, _ := w.k.Get(ctx, x)
		page, _ := w.k.Events(ctx, x, 0, 1000)
		if next[x] != page.LatestSequence {
			t.Fatalf("execution %s (%s): session log has %d of %d events", x, v.Status, next[x], page.LatestSequence)
		}
	}
}

func TestDueTurnStartsAfterARestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	// A registry without a kernel records the turn as due but cannot run
	// it: the state a crash leaves between the two.
	st, err := store.Open(store.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	reg, _ := session.New(session.Options{Store: st})
	s, _ := reg.Create(ctx, session.CreateRequest{AgentID: "ag"})
	turn, err := reg.Submit(ctx, session.SubmitRequest{SessionID: s.ID, Input: json.RawMessage(`"hello"`)})
	if err != nil {
		t.Fatal(err)
	}
	reg.Close()
	st.Close()

	w := open(t, dir, session.Options{})
	defer w.close()
	ag := w.agent("ag")
	exec, lease := ag.assigned()
	ag.complete(exec, lease)
	if got := w.waitTurn(s.ID, turn.ID, session.TurnCompleted); got.ExecutionID != exec {
		t.Fatalf("turn %+v", got)
	}
}

func TestRetentionKeepsRunningTurnsAndSaysWhenHistoryIsGone(t *testing.T) {
	w, ag, s := pastRetention(t)
	ctx := context.Background()
	running, _ := w.reg.Submit(ctx, session.SubmitRequest{SessionID: s.ID, TurnID: "running"})
	ag.assigned()
	all := w.items(s.ID)
	removed, err := w.reg.Prune(ctx, time.Now())
	if err != nil || removed == 0 {
		t.Fatalf("prune removed %d: %v", removed, err)
	}
	first, _ := w.reg.First(ctx, s.ID)
	if first != running.FirstSeq {
		t.Fatalf("kept from %d, want the running turn's first fact %d", first, running.FirstSeq)
	}
	if err := w.reg.Read(ctx, s.ID, 0, func(session.Item) bool { return true }); !errors.Is(err, session.ErrCursorExpired) {
		t.Fatalf("read from 0 after pruning: %v", err)
	}
	var kept []session.Item
	if err := w.reg.Read(ctx, s.ID, first-1, func(it session.Item) bool { kept = append(kept, it); return true }); err != nil {
		t.Fatal(err)
	}
	if len(kept) != len(all)-int(first)+1 || kept[0].Type != session.FactTurnSubmitted {
		t.Fatalf("kept %s", summary(kept))
	}
	// A restart knows where the log starts.
	w.close()
	w2 := open(t, w.dir, session.Options{MaxEntries: 3})
	defer w2.close()
	if f, _ := w2.reg.First(ctx, s.ID); f != first {
		t.Fatalf("after a restart the log starts at %d, want %d", f, first)
	}
}

// TestNothingFollowsTheLargestSequence: a read of a session's log after
// 2^64-1 gives nothing, neither stored entries nor the deltas of a run not
// yet written, and is not taken for a cursor older than what retention
// kept. after+1 wrapped to 0: the open run was replayed, and a pruned log
// answered ErrCursorExpired.
func TestNothingFollowsTheLargestSequence(t *testing.T) {
	w := open(t, t.TempDir(), session.Options{MaxEntries: 3, MaxAge: time.Hour, DeltaWindow: time.Hour})
	defer w.close()
	ctx := context.Background()
	ag := w.agent("ag")
	s, err := w.reg.Create(ctx, session.CreateRequest{AgentID: "ag"})
	if err != nil {
		t.Fatal(err)
	}
	ag.completeTurns(s.ID, "done", 3)
	if _, err := w.reg.Submit(ctx, session.SubmitRequest{SessionID: s.ID, TurnID: "running"}); err != nil {
		t.Fatal(err)
	}
	exec, lease := ag.assigned()
	if removed, err := w.reg.Prune(ctx, time.Now()); err != nil || removed == 0 {
		t.Fatalf("prune removed %d: %v", removed, err)
	}
	if _, err := w.k.Say(ctx, kernel.IntentRequest{ExecutionID: exec, SessionID: lease, Intent: kernel.Intent{
		Type: kernel.IntentOutput, Output: json.RawMessage(`{"kind":"text_delta","text":"open"}`),
	}}, kernel.Meta{}); err != nil {
		t.Fatal(err)
	}
	last, _ := w.reg.Last(ctx, s.ID)
	var open []session.Item
	if err := w.reg.Read(ctx, s.ID, last-1, func(it session.Item) bool { open = append(open, it); return true }); err != nil || len(open) != 1 || open[0].Kind != session.KindDelta {
		t.Fatalf("the open run: %+v %v", open, err)
	}
	var got []session.Item
	if err := w.reg.Read(ctx, s.ID, math.MaxUint64, func(it session.Item) bool { got = append(got, it); return true }); err != nil || len(got) != 0 {
		t.Fatalf("after 2^64-1: %s (%v), want nothing", summary(got), err)
	}
}
