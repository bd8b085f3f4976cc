package conformance

import (
	"context"
	"net/http"
	"net/url"
	"strings"
)

// needClients skips the check without two client tokens of different
// principals, and returns them.
func (t *tc) needClients() (alice, bob string) {
	if t.o.ClientToken == "" || t.o.OtherClientToken == "" {
		t.skipf("needs two client tokens of different principals: pass --client-token and --other-client-token")
	}
	return t.o.ClientToken, t.o.OtherClientToken
}

// createAs creates an execution with another token ("": the suite's own);
// the suite's token cancels it when the check ends.
func (t *tc) createAs(tok string, body map[string]any, opts ...reqOpt) *response {
	if tok != "" {
		opts = append([]reqOpt{bearer(tok)}, opts...)
	}
	r := t.call(http.MethodPost, "/v0/executions", body, opts...)
	if r.status/100 == 2 {
		var o obj
		t.decode(r, &o)
		if id, _ := o.str("id"); id != "" {
			t.cleanup(func(ctx context.Context) { t.cancelQuietly(ctx, id) })
		}
	}
	return r
}

// wantHidden fails unless hidden is the 404 that missing is, the ids apart:
// a refusal must not tell whether the id exists.
func (t *tc) wantHidden(hidden, missing *response, id, unknown, what string) {
	h := t.expectError(hidden, http.StatusNotFound, "NOT_FOUND")
	m := t.expectError(missing, http.StatusNotFound, "NOT_FOUND")
	hm, _ := h.str("error")
	mm, _ := m.str("error")
	if strings.ReplaceAll(mm, unknown, id) != hm {
		t.fatalf("%s: the answer about another's resource (%q) differs from the one about an unknown id (%q)", what, hm, mm)
	}
}

func checkForeignExecution(t *tc) {
	alice, bob := t.needClients()
	agentID := newID("conf-agent-")
	o := t.expectJSON(t.createAs(alice, map[string]any{"agent_id": agentID, "input": map[string]any{"private": true}}), http.StatusCreated)
	id := t.wantStr(o, "id", "alice's execution")
	unknown := uuidLike()
	x, u := "/v0/executions/"+id, "/v0/executions/"+unknown
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{http.MethodGet, "", nil},
		{http.MethodGet, "/events", nil},
		{http.MethodPost, "/cancel", nil},
		{http.MethodPost, "/signal", map[string]any{"signal_type": "conformance"}},
	} {
		t.wantHidden(t.call(c.method, x+c.path, c.body, bearer(bob)), t.call(c.method, u+c.path, c.body, bearer(bob)), id, unknown, c.method+" "+c.path)
	}
	if s, r := t.openStream(x+"/stream", bearer(bob)); s != nil {
		s.close()
		t.fatalf("bob opened the stream of alice's execution")
	} else {
		t.expectError(r, http.StatusNotFound, "NOT_FOUND")
	}
	list := t.expectJSON(t.call(http.MethodGet, "/v0/executions?"+url.Values{"agent_id": {agentID}}.Encode(), nil, bearer(bob)), http.StatusOK)
	if strings.Contains(show(list), id) {
		t.fatalf("bob's list shows alice's execution: %s", show(list))
	}
	list = t.expectJSON(t.call(http.MethodGet, "/v0/executions?"+url.Values{"agent_id": {agentID}}.Encode(), nil, bearer(alice)), http.StatusOK)
	if !strings.Contains(show(list), id) {
		t.fatalf("alice's list lacks her execution: %s", show(list))
	}
	if st := t.wantStr(t.expectJSON(t.call(http.MethodGet, x, nil, bearer(alice)), http.StatusOK), "status", "alice's execution"); st != "pending" {
		t.fatalf("bob's requests changed alice's execution: status %s", st)
	}
	for _, e := range t.events(id) {
		if e.Type == "signal.received" || e.Type == "execution.cancelled" {
			t.fatalf("bob's request left %s in alice's log", e.Type)
		}
	}
}

func checkForeignPrompt(t *tc) {
	alice, bob := t.needClients()
	t.needBridge()
	if t.o.ApprovalTool == "" {
		t.skipf("needs a tool the server's policy sends to approval: pass --approval-tool")
	}
	// The suite's agent (admin token) runs alice's execution.
	a := t.newAgent()
	o := t.expectJSON(t.createAs(alice, map[string]any{"agent_id": a.id}), http.StatusCreated)
	id := t.wantStr(o, "id", "alice's execution")
	_, assigned := a.s.nextEvent(t, "execution.assigned", func(p obj) bool { s, _ := p.str("execution_id"); return s == id })
	r := &run{a: a, id: id, session: t.wantStr(assigned, "session_id", "execution.assigned")}
	resp := r.intent(map[string]any{"type": "invoke_tool", "tool_id": t.o.ApprovalTool})
	step := t.wantStr(t.expectJSON(resp, http.StatusOK), "step_id", "the approval tool's answer")
	action := t.actionFor(id, step)
	unknown := uuidLike()
	t.wantHidden(t.call(http.MethodGet, "/v0/actions/"+action, nil, bearer(bob)), t.call(http.MethodGet, "/v0/actions/"+unknown, nil, bearer(bob)), action, unknown, "GET action")
	answer := map[string]any{"decision": "allow_once"}
	t.wantHidden(t.call(http.MethodPost, "/v0/actions/"+action+"/respond", answer, bearer(bob)),
		t.call(http.MethodPost, "/v0/actions/"+unknown+"/respond", answer, bearer(bob)), action, unknown, "respond")
	approve := map[string]any{"signal_type": "step.approve", "payload": map[string]any{"step_id": step, "approved": true}}
	t.expectError(t.call(http.MethodPost, "/v0/executions/"+id+"/signal", approve, bearer(bob)), http.StatusNotFound, "NOT_FOUND")
	list := t.expectJSON(t.call(http.MethodGet, "/v0/actions?status=pending", nil, bearer(bob)), http.StatusOK)
	if strings.Contains(show(list), action) {
		t.fatalf("bob's list shows alice's prompt: %s", show(list))
	}
	rec := t.expectJSON(t.call(http.MethodGet, "/v0/actions/"+action, nil, bearer(alice)), http.StatusOK)
	if st, _ := rec.str("state"); st != "pending" {
		t.fatalf("bob's answers settled alice's prompt: %s", show(rec))
	}
	t.expectOK(t.call(http.MethodPost, "/v0/executions/"+id+"/signal", approve, bearer(alice)))
	r.push("approval.resolved", step)
	t.expectError(t.call(http.MethodPost, "/v0/actions/"+action+"/respond", answer, bearer(alice)), http.StatusConflict, "CONFLICT")
}

func checkIdempotentCreate(t *tc) {
	key := header("Idempotency-Key", newID("conf-key-"))
	body := map[string]any{"agent_id": newID("conf-agent-"), "input": map[string]any{"n": 1}}
	first := t.expectJSON(t.createAs("", body, key), http.StatusCreated)
	id := t.wantStr(first, "id", "first create")
	again := t.expectJSON(t.createAs("", body, key), http.StatusOK)
	t.wantEq("the retried create's id", t.wantStr(again, "id", "retried create"), id)
	other := map[string]any{"agent_id": body["agent_id"], "input": map[string]any{"n": 2}}
	t.expectError(t.createAs("", other, key), http.StatusConflict, "CONFLICT")
	if t.o.ClientToken == "" || t.o.OtherClientToken == "" {
		return
	}
	// Keys belong to their principal: the same key from two clients makes
	// two executions.
	a := t.expectJSON(t.createAs(t.o.ClientToken, body, key), http.StatusCreated)
	b := t.expectJSON(t.createAs(t.o.OtherClientToken, body, key), http.StatusCreated)
	if ida, idb := t.wantStr(a, "id", "alice's create"), t.wantStr(b, "id", "bob's create"); ida == idb || ida == id {
		t.fatalf("one key of three principals made executions %s, %s and %s", id, ida, idb)
	}
}

func checkIdempotentCreateRestart(t *tc) {
	t.needRestart()
	key := header("Idempotency-Key", newID("conf-key-"))
	body := map[string]any{"agent_id": newID("conf-agent-")}
	id := t.wantStr(t.expectJSON(t.createAs("", body, key), http.StatusCreated), "id", "first create")
	t.restart()
	again := t.expectJSON(t.createAs("", body, key), http.StatusOK)
	t.wantEq("the id after a restart", t.wantStr(again, "id", "retried create"), id)
}
