package conformance

import (
	"encoding/json"
	"net/http"
	"net/url"
)

// needBridge skips the check unless the server has the actions API.
func (t *tc) needBridge() {
	if t.routeMissing(http.MethodGet, "/v0/actions") {
		t.skipf("not built: GET /v0/actions is 404 (permission bridge)")
	}
}

// findObject returns the first object inside a JSON value (depth first)
// that satisfies match, or nil.
func findObject(raw json.RawMessage, match func(obj) bool) obj {
	var o obj
	if json.Unmarshal(raw, &o) == nil && o != nil {
		if match(o) {
			return o
		}
		for _, v := range o {
			if f := findObject(v, match); f != nil {
				return f
			}
		}
		return nil
	}
	var arr []json.RawMessage
	if json.Unmarshal(raw, &arr) == nil {
		for _, v := range arr {
			if f := findObject(v, match); f != nil {
				return f
			}
		}
	}
	return nil
}

// actionFor finds the action record of a step awaiting approval: from the
// approval event's action_id (envelope or payload), else from the pending
// actions listing.
func (t *tc) actionFor(execID, step string) string {
	for _, e := range ofType(t.events(execID), "step.approval_required", step) {
		var env obj
		_ = json.Unmarshal(e.raw, &env)
		if id, _ := env.str("action_id"); id != "" {
			return id
		}
		if id, _ := e.payload().str("action_id"); id != "" {
			return id
		}
	}
	r := t.call(http.MethodGet, "/v0/actions?status=pending", nil)
	t.expectJSON(r, http.StatusOK)
	rec := findObject(r.body, func(o obj) bool { s, _ := o.str("step_id"); return s == step })
	if rec != nil {
		for _, k := range []string{"action_id", "id"} {
			if id, _ := rec.str(k); id != "" {
				return id
			}
		}
	}
	t.fatalf("no action record names step %s (neither the approval event nor GET /v0/actions?status=pending)", step)
	return ""
}

// respond answers an action.
func (t *tc) respond(action, decision string) *response {
	return t.call(http.MethodPost, "/v0/actions/"+url.PathEscape(action)+"/respond", map[string]any{"decision": decision, "reason": "conformance"})
}

func checkBridgeFirstAnswer(t *tc) {
	t.needBridge()
	r, step := t.approvalRun()
	action := t.actionFor(r.id, step)
	t.expectJSON(t.call(http.MethodGet, "/v0/actions/"+url.PathEscape(action), nil), http.StatusOK)
	first := t.respond(action, "allow_once")
	if first.status/100 != 2 {
		t.fatalf("the first answer must succeed: %s", first)
	}
	o := t.expectError(t.respond(action, "deny"), http.StatusConflict, "CONFLICT")
	if !o.has("details") || o.isNull("details") {
		t.fatalf("a late answer's 409 must carry the recorded outcome in details: %s", show(o))
	}
	t.waitStatus(r.id, "running")
	ap := r.push("approval.resolved", step)
	t.wantJSON("approval.resolved approved", ap["approved"], true)
	t.expectError(t.call(http.MethodGet, "/v0/actions/"+uuidLike(), nil), http.StatusNotFound, "NOT_FOUND")
	t.expectError(t.respond(uuidLike(), "allow_once"), http.StatusNotFound, "NOT_FOUND")
	t.expectOK(r.stepResult(step, true, nil, ""))
	r.complete(nil)
}

func checkBridgeSignalCompat(t *tc) {
	t.needBridge()
	r, step := t.approvalRun()
	action := t.actionFor(r.id, step)
	t.signal(r.id, "step.approve", map[string]any{"step_id": step, "approved": false, "reason": "no"})
	t.waitStatus(r.id, "running")
	t.expectError(t.respond(action, "allow_once"), http.StatusConflict, "CONFLICT")
	r.complete(nil)
}

func checkBridgeAudit(t *tc) {
	t.needBridge()
	r, step := t.approvalRun()
	action := t.actionFor(r.id, step)
	if first := t.respond(action, "deny"); first.status/100 != 2 {
		t.fatalf("answer: %s", first)
	}
	t.waitStatus(r.id, "running")
	evs := t.events(r.id)
	for _, typ := range []string{"permission.requested", "permission.resolved"} {
		if len(ofType(evs, typ, "")) == 0 {
			t.fatalf("no %s event in the log: %s", typ, typesOf(evs))
		}
	}
	r.complete(nil)
}

func checkBridgeRestart(t *tc) {
	t.needBridge()
	t.needRestart()
	r, step := t.approvalRun()
	action := t.actionFor(r.id, step)
	t.restart()
	list := t.call(http.MethodGet, "/v0/actions?status=pending", nil)
	t.expectJSON(list, http.StatusOK)
	if findObject(list.body, func(o obj) bool {
		a, _ := o.str("action_id")
		i, _ := o.str("id")
		return a == action || i == action
	}) == nil {
		t.fatalf("pending action %s is gone after the restart: %s", action, list)
	}
	r.a.connect()
	if first := t.respond(action, "allow_once"); first.status/100 != 2 {
		t.fatalf("answer after the restart: %s", first)
	}
	t.waitStatus(r.id, "running")
	r.push("approval.resolved", step)
	t.expectOK(r.stepResult(step, true, nil, ""))
	r.complete(nil)
}
