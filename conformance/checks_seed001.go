package conformance

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

func checkStableIDs(t *tc) {
	r, evs := t.longRun()
	seen := map[string]bool{}
	for i, e := range evs {
		if e.Sequence != uint64(i+1) {
			t.fatalf("event %d has sequence %d: want 1..n without gaps", i+1, e.Sequence)
		}
		if e.ID == "" || seen[e.ID] {
			t.fatalf("event %d: id %q is empty or repeated", e.Sequence, e.ID)
		}
		seen[e.ID] = true
		var env obj
		_ = json.Unmarshal(e.raw, &env)
		eid, ok := env.str("event_id")
		if !ok {
			t.fatalf("event %d lacks event_id, which the seed 001 envelope requires", e.Sequence)
		}
		t.wantEq("event_id of event "+strconv.FormatUint(e.Sequence, 10), eid, e.ID)
		if _, ok := env.str("timestamp"); !ok || !env.has("schema_version") {
			t.fatalf("event %d lacks timestamp or schema_version", e.Sequence)
		}
	}
	again := t.events(r.id)
	for i := range evs {
		if again[i].ID != evs[i].ID {
			t.fatalf("event %d changed id between reads: %s then %s", evs[i].Sequence, evs[i].ID, again[i].ID)
		}
	}
	s := t.mustStream("/v0/executions/" + r.id + "/stream")
	for i, f := range events(s.readAll(t, 5*time.Second)) {
		if id, _ := f.json().str("id"); i >= len(evs) || id != evs[i].ID {
			t.fatalf("the stream renders event %s with id %q, the events endpoint with %q", f.id, id, evs[min(i, len(evs)-1)].ID)
		}
	}
}

// readModel is the state an execution's events fold into.
type readModel struct {
	status    string
	agentID   string
	input     json.RawMessage
	labels    json.RawMessage
	output    json.RawMessage
	hasOutput bool
}

// fold replays an execution's events into its read model, using only the
// event types and payloads of the wire facts (§8.2, §9.1).
func fold(evs []event) readModel {
	var m readModel
	for _, e := range evs {
		p := e.payload()
		switch e.Type {
		case "execution.created":
			m.status = "pending"
			m.agentID, _ = p.str("agent_id")
			m.input, m.labels = p["input"], p["labels"]
		case "execution.started", "execution.resumed":
			m.status = "running"
		case "execution.blocked":
			m.status = "blocked"
		case "execution.reset":
			m.status = "pending"
		case "execution.completed":
			m.status = "completed"
			m.output, m.hasOutput = p["output"], true
		case "execution.failed":
			m.status = "failed"
		case "execution.cancelled":
			m.status = "cancelled"
		}
	}
	return m
}

func checkReplayReadModel(t *tc) {
	a := t.newAgent()
	var ids []string
	running := a.start(map[string]any{"s": "running"})
	blocked := a.start(nil)
	blocked.accepted(map[string]any{"type": "wait", "signal_type": "conf.later"})
	resumed := a.start(nil)
	resumed.accepted(map[string]any{"type": "wait", "signal_type": "conf.now"})
	t.signal(resumed.id, "conf.now", nil)
	done := a.start(nil)
	done.complete(map[string]any{"out": []any{1, "x"}})
	failed := a.start(nil)
	failed.accepted(map[string]any{"type": "fail", "error": "e"})
	cancelled := a.start(nil)
	t.expectJSON(t.call(http.MethodPost, "/v0/executions/"+cancelled.id+"/cancel", nil), http.StatusOK)
	for _, r := range []*run{running, blocked, resumed, done, failed, cancelled} {
		ids = append(ids, r.id)
	}
	pending, _ := t.create(map[string]any{"agent_id": newID("conf-agent-"), "input": "p", "labels": map[string]any{"l": "v"}}).str("id")
	ids = append(ids, pending)

	summaries := map[string]string{}
	updated := map[string]time.Time{}
	for _, row := range t.list(url.Values{"agent_id": {a.id}, "limit": {"200"}}).rows {
		id, _ := row.str("id")
		summaries[id], _ = row.str("status")
		updated[id] = t.wantTime(row, "updated_at", "list summary")
	}
	for _, id := range ids {
		m := fold(t.events(id))
		got := t.execution(id)
		st, _ := got.str("status")
		if m.status != st {
			t.fatalf("execution %s: events fold to %q, the API says %q", id, m.status, st)
		}
		if s, ok := summaries[id]; ok && s != st {
			t.fatalf("execution %s: list says %q, get says %q", id, s, st)
		}
		ag, _ := got.str("agent_id")
		t.wantEq("agent_id folded from execution.created", m.agentID, ag)
		t.wantJSON("input folded from execution.created of "+id, m.input, got["input"])
		t.wantJSON("labels folded from execution.created of "+id, m.labels, got["labels"])
		if m.hasOutput {
			t.wantJSON("output folded from execution.completed of "+id, m.output, got["output"])
		}
		evs := t.events(id)
		lastAt, err := time.Parse(time.RFC3339Nano, evs[len(evs)-1].Timestamp)
		if err != nil {
			t.fatalf("event timestamp %q: %v", evs[len(evs)-1].Timestamp, err)
		}
		// Every log here ends with a state change, so both readings of
		// updated_at (the last event, the last state change) agree.
		up := t.wantTime(got, "updated_at", "execution "+id)
		if !up.Equal(lastAt) {
			t.fatalf("execution %s (%s): updated_at %s, but its last event is at %s", id, st, up.Format(time.RFC3339Nano), lastAt.Format(time.RFC3339Nano))
		}
		if lu, ok := updated[id]; ok && !lu.Equal(up) {
			t.fatalf("execution %s: list updated_at %s, get updated_at %s", id, lu.Format(time.RFC3339Nano), up.Format(time.RFC3339Nano))
		}
	}
	for _, r := range []*run{running, resumed} {
		r.complete(nil)
	}
}

func checkToolFacts(t *tc) {
	tool := newID("conformance.remote.")
	rn := t.newRunner(tool)
	a := t.newAgent()
	r := a.start(nil)
	args := map[string]any{"path": "/a b/ü.txt", "Opts": map[string]any{"deep": []any{true, nil, 1.5}}}
	local := r.invoke(newID("conformance.tool."), args, false)
	data := map[string]any{"bytes": 12, "Lines": []any{"x"}}
	t.expectOK(r.stepResult(local, true, data, ""))
	broken := r.invoke(newID("conformance.tool."), args, false)
	t.expectOK(r.stepResult(broken, false, nil, "disk full"))
	remote := r.invoke(tool, args, true)
	t.expectOK(rn.result(rn.job(remote), false, nil, "timeout upstream", true))
	t.expectOK(rn.result(rn.job(remote), true, data, "", false))

	evs := t.events(r.id)
	for _, s := range []string{local, broken, remote} {
		t.wantJSON("step.created arguments of "+s, t.one(evs, "step.created", s).payload()["arguments"], args)
	}
	t.wantJSON("step.completed result", t.one(evs, "step.completed", local).payload()["result"], data)
	t.wantEq("step.failed error", t.wantStr(t.one(evs, "step.failed", broken).payload(), "error", "step.failed"), "disk full")
	first := t.one(evs, "step.failed", remote).payload()
	t.wantEq("the failed first attempt's error", t.wantStr(first, "error", "step.failed"), "timeout upstream")
	t.one(evs, "step.retried", remote)
	t.wantJSON("the second attempt's result", t.one(evs, "step.completed", remote).payload()["result"], data)

	resp := r.intent(map[string]any{"type": "invoke_tool", "tool_id": t.o.DeniedTool, "arguments": args})
	o := t.expectJSON(resp, http.StatusOK)
	if ok, _ := o.boolean("accepted"); ok {
		r.complete(nil)
		t.skipf("inputs, results, errors and attempts are kept, but the policy allows %q, so no denial could be checked (pass --denied-tool)", t.o.DeniedTool)
	}
	denied := ofType(t.events(r.id), "intent.denied", "")
	if len(denied) != 1 {
		t.fatalf("want one intent.denied for the denied call")
	}
	dp := denied[0].payload()
	if t.wantStr(dp, "reason", "intent.denied") == "" || t.wantStr(dp, "rule_id", "intent.denied") == "" {
		t.fatalf("the policy decision lacks its reason or rule: %s", denied[0].Payload)
	}
	t.wantEq("intent.denied tool_id", t.wantStr(dp, "tool_id", "intent.denied"), t.o.DeniedTool)
	r.complete(nil)
}

func checkHumanPause(t *tc) {
	a := t.newAgent()
	r := a.start(nil)
	r.accepted(map[string]any{"type": "wait", "signal_type": "conf.answer"})
	t.wantStatus(r.id, "blocked")
	t.signal(r.id, "conf.unrelated", nil)
	t.expectError(r.intent(map[string]any{"type": "invoke_tool", "tool_id": newID("conformance.tool.")}), http.StatusConflict, "CONFLICT")
	t.expectError(r.intent(map[string]any{"type": "complete"}), http.StatusConflict, "CONFLICT")
	t.sleep(200 * time.Millisecond)
	t.wantStatus(r.id, "blocked")
	t.signal(r.id, "conf.answer", map[string]any{"ok": true})
	t.waitStatus(r.id, "running")
	r.complete(nil)

	if t.o.ApprovalTool == "" {
		return
	}
	ar, step := t.approvalRun()
	t.signal(ar.id, "conf.unrelated", nil)
	t.expectError(ar.stepResult(step, true, nil, ""), http.StatusConflict, "CONFLICT")
	t.sleep(200 * time.Millisecond)
	t.wantStatus(ar.id, "blocked")
	evs := t.events(ar.id)
	if len(ofType(evs, "step.completed", step)) != 0 || len(ofType(evs, "step.failed", step)) != 0 {
		t.fatalf("the step awaiting approval was resolved without an answer: %s", typesOf(evs))
	}
	t.signal(ar.id, "step.approve", map[string]any{"step_id": step, "approved": true})
	t.waitStatus(ar.id, "running")
	t.expectOK(ar.stepResult(step, true, nil, ""))
	ar.complete(nil)
}

func checkLifecycleRestart(t *tc) {
	t.needRestart()
	rn, r, step := t.remoteStep(map[string]any{"n": 1})
	a := r.a
	t.expectOK(rn.result(rn.job(step), false, nil, "flaky", true))
	second := rn.job(step)
	t.wantJSON("attempt of the retry", second["attempt"], 2)
	waiting := a.start(nil)
	waiting.accepted(map[string]any{"type": "wait", "signal_type": "conf.later"})
	done := a.start(nil)
	done.complete(map[string]any{"ok": 1})
	cancelled, _ := t.create(map[string]any{"agent_id": newID("conf-agent-")}).str("id")
	t.expectJSON(t.call(http.MethodPost, "/v0/executions/"+cancelled+"/cancel", nil), http.StatusOK)

	want := map[string]string{r.id: "running", waiting.id: "blocked", done.id: "completed", cancelled: "cancelled"}
	approval, approvalStep, _ := t.tryApproval()
	if approval != nil {
		want[approval.id] = "blocked"
	}
	t.restart()
	for id, st := range want {
		t.wantEq("status of "+id+" after the restart", t.status(id), st)
	}
	evs := t.events(r.id)
	if f := t.one(evs, "step.failed", step).payload(); !sameJSON(f["retryable"], true) {
		t.fatalf("the failed first attempt lost its retryable flag: %s", show(f))
	}
	t.one(evs, "step.retried", step)

	a.connect()
	rn.connect()
	job := rn.job(step)
	t.wantJSON("attempt of the job after the restart", job["attempt"], 2)
	t.expectOK(rn.result(job, true, map[string]any{"n": 2}, "", false))
	r.push("tool.result", step)
	r.complete(nil)
	t.wantStatus(r.id, "completed")
	t.signal(waiting.id, "conf.later", nil)
	t.waitStatus(waiting.id, "running")
	waiting.complete(nil)
	if approval == nil {
		return
	}
	approval.a.connect()
	t.signal(approval.id, "step.approve", map[string]any{"step_id": approvalStep, "approved": true})
	t.waitStatus(approval.id, "running")
	approval.push("approval.resolved", approvalStep)
	t.expectOK(approval.stepResult(approvalStep, true, nil, ""))
	approval.complete(nil)
}

func checkMissingFacts(t *tc) {
	if t.routeMissing(http.MethodGet, "/v0/peers") {
		t.skipf("not built: no read model reports presence (GET /v0/peers is 404), so nothing can be marked unknown, unavailable or stale")
	}
	rn := t.newRunner(newID("conformance.remote."))
	state := func() string {
		p := t.findPeer("runner", func(o obj) bool {
			for _, k := range []string{"peer_id", "id", "runner_id"} {
				if s, _ := o.str(k); s == rn.id {
					return true
				}
			}
			return false
		})
		if p == nil {
			return ""
		}
		for _, k := range []string{"state", "status", "presence"} {
			if s, ok := p.str(k); ok {
				return s
			}
		}
		t.fatalf("peer %s has no state field: %s", rn.id, show(p))
		return ""
	}
	if st := state(); st != "online" {
		t.fatalf("a connected runner %s is reported %q, want online", rn.id, st)
	}
	rn.s.close()
	for {
		if st := state(); st != "online" {
			return
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-t.ctx.Done():
			t.fatalf("runner %s is still reported online after its connection closed", rn.id)
		}
	}
}
