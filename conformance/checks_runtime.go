package conformance

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"time"
)

const rt = "/runtime/v1"

// rtRequire skips a check against a gateway without the Runtime API.
func (t *tc) rtRequire() {
	if t.routeMissing(http.MethodGet, rt+"/capabilities") {
		t.skipf("the gateway serves no /runtime/v1 surface")
	}
}

// rtError checks a Runtime API error: the status, {"error": "...",
// "details": {"code": ...}}; it returns the details.
func (t *tc) rtError(r *response, status int, code string) obj {
	o := t.expectJSON(r, status)
	if msg, _ := o.str("error"); msg == "" {
		t.fatalf("error without a message: %s", r)
	}
	d := o.sub("details")
	if c, _ := d.str("code"); c != code {
		t.fatalf("want details.code %s: %s", code, r)
	}
	return d
}

// objects returns o's array k of objects (nil when absent).
func objects(o obj, k string) []obj {
	var out []obj
	if raw, ok := o[k]; ok {
		_ = json.Unmarshal(raw, &out)
	}
	return out
}

// rtInvoke invokes tool with body and waits for the end; it returns the
// answer.
func (t *tc) rtInvoke(tool string, body map[string]any) obj {
	body["wait"] = true
	r := t.call(http.MethodPost, rt+"/tools/"+url.PathEscape(tool), body)
	t.needAllowed(tool, r)
	o := t.expectJSON(r, http.StatusOK)
	if st, _ := o.str("status"); st != "completed" {
		t.fatalf("%s did not complete: %v", tool, o)
	}
	return o
}

func checkRuntimeCapabilities(t *tc) {
	t.rtRequire()
	o := t.expectJSON(t.call(http.MethodGet, rt+"/capabilities", nil), http.StatusOK)
	seen := map[string]bool{}
	for _, c := range objects(o, "capabilities") {
		if kind, _ := c.str("kind"); kind == "memory" {
			if typ, _ := c.sub("parameters").str("type"); typ != "object" {
				t.fatalf("memory capability without an object schema: %v", c)
			}
			name, _ := c.str("name")
			seen[name] = true
		}
	}
	for _, name := range []string{"memory_search", "memory_read", "save_memory_note", "memory_ls", "memory_write", "memory_append"} {
		if !seen[name] {
			t.fatalf("memory capability %s missing from %v", name, seen)
		}
	}
}

func checkRuntimeAccounts(t *tc) {
	t.rtRequire()
	tool := newID("conf_tool_")
	r := t.newRunner(tool, tool+"@acc_a", tool+"@acc_b")
	info := map[string]any{"name": tool, "description": "conformance", "isReadOnly": true,
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}, "required": []string{"q"}},
		"accounts":   []any{map[string]any{"connectedAccountId": "acc_a", "integrationId": "conf", "backend": "conf"}, map[string]any{"connectedAccountId": "acc_b", "integrationId": "conf", "backend": "conf"}}}
	t.expectOK(t.call(http.MethodPost, "/v0/runners/"+url.PathEscape(r.id)+"/capabilities", map[string]any{"tools": r.caps, "tool_info": []any{info}}))
	d := t.rtError(t.call(http.MethodPost, rt+"/tools/"+tool, map[string]any{"input": map[string]any{"q": "x"}}), http.StatusConflict, "ACCOUNT_REQUIRED")
	if accs := objects(d, "accounts"); len(accs) != 2 {
		t.fatalf("409 does not list both accounts: %v", d)
	}
	t.rtError(t.call(http.MethodPost, rt+"/tools/"+tool, map[string]any{"input": map[string]any{"q": "x"}, "connectedAccountId": "nope"}), http.StatusBadRequest, "UNKNOWN_ACCOUNT")
	t.rtError(t.call(http.MethodPost, rt+"/tools/"+tool, map[string]any{"input": map[string]any{}, "connectedAccountId": "acc_a"}), http.StatusBadRequest, "INVALID_INPUT")
	invoked := t.call(http.MethodPost, rt+"/tools/"+tool, map[string]any{"input": map[string]any{"q": "x"}, "connectedAccountId": "acc_b"})
	t.needAllowed(tool, invoked)
	o := t.expectJSON(invoked, http.StatusAccepted)
	exec := t.wantStr(o, "executionId", "the invocation")
	_, job := r.s.nextEvent(t, "job.assigned", func(p obj) bool { e, _ := p.str("execution_id"); return e == exec })
	if acc, _ := job.str("account"); acc != "acc_b" {
		t.fatalf("the job does not name its account: %v", job)
	}
	t.expectOK(r.result(job, true, map[string]any{"people": 1}, "", false))
	s := t.mustStream(rt + "/executions/" + exec + "/events")
	defer s.close()
	s.next(t, "done", func(f frame) bool { return f.event == "done" })
}

func checkRuntimeMemory(t *tc) {
	t.rtRequire()
	word := strings.ReplaceAll(newID("zq"), "-", "")
	search := map[string]any{"input": map[string]any{"query": word}}
	if o := t.rtInvoke("memory_search", search); !strings.Contains(string(o["summary"]), `"0 hits"`) {
		t.fatalf("search before the note: %v", o)
	}
	path := "/conformance/" + word + ".md"
	saved := t.rtInvoke("save_memory_note", map[string]any{"input": map[string]any{"path": path, "content": "remember " + word}})
	if p, _ := saved.sub("output").str("path"); p != path {
		t.fatalf("save: %v", saved)
	}
	found := t.rtInvoke("memory_search", map[string]any{"input": map[string]any{"query": word}})
	hits := objects(found.sub("output"), "hits")
	if len(hits) != 1 {
		t.fatalf("search after the note: %v", found)
	}
	hp, _ := hits[0].str("path")
	snippet, _ := hits[0].str("snippet")
	if hp != path || !strings.Contains(snippet, word) {
		t.fatalf("hit: %v", hits[0])
	}
	t.rtError(t.call(http.MethodPost, rt+"/tools/memory_read", map[string]any{"input": map[string]any{"path": "/a/../b"}}), http.StatusBadRequest, "INVALID_INPUT")
	t.rtError(t.call(http.MethodPost, rt+"/tools/no_such_tool_"+word, map[string]any{"input": map[string]any{}}), http.StatusNotFound, "NOT_FOUND")
}

// checkRuntimeNotesIsolated: one client's note is, to another client, a
// note that does not exist: reading it fails word for word as reading an
// unknown path, a search for its words finds nothing, a listing of its
// folder does not show it; its owner still reads it.
func checkRuntimeNotesIsolated(t *tc) {
	t.rtRequire()
	alice, bob := t.needClients()
	invoke := func(tok, tool string, input map[string]any) obj {
		o := t.expectJSON(t.call(http.MethodPost, rt+"/tools/"+tool, map[string]any{"input": input, "wait": true}, bearer(tok)), http.StatusOK)
		if st, _ := o.str("status"); st != "completed" && st != "failed" {
			t.fatalf("%s did not end: %s", tool, show(o))
		}
		return o
	}
	word := strings.ReplaceAll(newID("zq"), "-", "")
	folder := "/conformance/" + word + "/"
	if o := invoke(alice, "memory_write", map[string]any{"path": folder + "mine.md", "content": "private " + word}); !statusIs(o, "completed") {
		t.fatalf("alice's write: %s", show(o))
	}
	hidden := invoke(bob, "memory_read", map[string]any{"path": folder + "mine.md"})
	missing := invoke(bob, "memory_read", map[string]any{"path": folder + "none.md"})
	he, _ := hidden.str("error")
	me, _ := missing.str("error")
	if !statusIs(hidden, "failed") || !statusIs(missing, "failed") || strings.ReplaceAll(me, "none.md", "mine.md") != he {
		t.fatalf("bob reading alice's note: %s; reading an unknown one: %s", show(hidden), show(missing))
	}
	if o := invoke(bob, "memory_search", map[string]any{"query": word}); len(objects(o.sub("output"), "hits")) != 0 {
		t.fatalf("bob's search finds alice's note: %s", show(o))
	}
	if o := invoke(bob, "memory_ls", map[string]any{"prefix": folder}); len(objects(o.sub("output"), "entries")) != 0 {
		t.fatalf("bob's listing shows alice's note: %s", show(o))
	}
	if c, _ := invoke(alice, "memory_read", map[string]any{"path": folder + "mine.md"}).sub("output").str("content"); c != "private "+word {
		t.fatalf("alice's read: %q", c)
	}
}

// statusIs reports whether an invocation's answer has status st.
func statusIs(o obj, st string) bool {
	s, _ := o.str("status")
	return s == st
}

func checkRuntimeStream(t *tc) {
	t.rtRequire()
	o := t.rtInvoke("memory_ls", map[string]any{"input": map[string]any{"prefix": "/conformance/"}})
	exec := t.wantStr(o, "executionId", "the invocation")
	frames := t.mustStream(rt+"/executions/"+exec+"/events").readAll(t, 10*time.Second)
	var names []string
	for _, f := range frames {
		if f.event == "" {
			continue
		}
		if !f.hasID {
			t.fatalf("event %s without an id", f.event)
		}
		names = append(names, f.event)
	}
	if got := strings.Join(names, " "); got != "session run_status tool_use tool_result run_status done" {
		t.fatalf("events: %s", got)
	}
	events := frames[len(frames)-len(names):]
	rest := t.mustStream(rt+"/executions/"+exec+"/events", header("Last-Event-ID", events[2].id)).readAll(t, 10*time.Second)
	var after []string
	for _, f := range rest {
		if f.event != "" {
			after = append(after, f.event)
		}
	}
	if got := strings.Join(after, " "); got != "tool_result run_status done" {
		t.fatalf("resumed after %s: %s", events[2].id, got)
	}
}

func checkRuntimeSessions(t *tc) {
	t.rtRequire()
	s := t.expectJSON(t.call(http.MethodPost, rt+"/sessions", map[string]any{}), http.StatusCreated)
	id := t.wantStr(s, "id", "the session")
	for k, want := range map[string]string{"title": "Agent Runtime Session", "interactionMode": "execute", "status": "active", "source": "api"} {
		if got, _ := s.str(k); got != want {
			t.fatalf("session %s %q, want %q: %v", k, got, want, s)
		}
	}
	invoked := t.call(http.MethodPost, rt+"/sessions/"+id+"/tools/memory_ls", map[string]any{"input": map[string]any{}, "wait": true})
	t.needAllowed("memory_ls", invoked)
	o := t.expectJSON(invoked, http.StatusOK)
	if sid, _ := o.str("sessionId"); sid != id {
		t.fatalf("invocation filed in %q, want %q", sid, id)
	}
	got := t.expectJSON(t.call(http.MethodGet, rt+"/sessions/"+id, nil), http.StatusOK)
	if ex := objects(got, "executions"); len(ex) != 1 {
		t.fatalf("session executions: %v", got)
	}
	t.expectJSON(t.call(http.MethodPost, rt+"/sessions/"+id+"/archive", nil), http.StatusOK)
	t.rtError(t.call(http.MethodPost, rt+"/sessions/"+id+"/tools/memory_ls", map[string]any{"input": map[string]any{}}), http.StatusConflict, "SESSION_ARCHIVED")
	t.rtError(t.call(http.MethodGet, rt+"/sessions/"+newID("no-such-"), nil), http.StatusNotFound, "NOT_FOUND")
}
