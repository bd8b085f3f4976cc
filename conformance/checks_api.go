package conformance

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// def builds a check entry.
func def(id, spec, name string, fn func(*tc)) check {
	return check{Check: Check{ID: id, Spec: spec, Name: name}, run: fn}
}

// defRestart builds a check entry that restarts the server.
func defRestart(id, spec, name string, fn func(*tc)) check {
	c := def(id, spec, name, fn)
	c.Restart = true
	return c
}

func checkHealth(t *tc) {
	o := t.expectJSON(t.call(http.MethodGet, "/v0/health", nil, noAuth()), http.StatusOK)
	t.wantEq(`health "status"`, t.wantStr(o, "status", "health"), "ok")
}

func checkReady(t *tc) {
	o := t.expectJSON(t.call(http.MethodGet, "/v0/ready", nil, noAuth()), http.StatusOK)
	t.wantEq(`ready "status"`, t.wantStr(o, "status", "ready"), "ready")
}

func checkAuth(t *tc) {
	if t.o.Token == "" {
		if r := t.call(http.MethodGet, "/v0/executions?limit=1", nil, noAuth()); r.status == http.StatusUnauthorized {
			t.fatalf("the server requires a bearer token (401 without one) but none was given: pass --token")
		}
		t.skipf("the server runs without a bearer token; start it with one and pass --token to check auth")
	}
	agentPath := "/v0/agents/stream?agent_id=" + newID("conf-agent-") + "&consumer_id=c"
	routes := []struct{ method, path string }{
		{http.MethodGet, "/v0/executions"},
		{http.MethodPost, "/v0/executions"},
		{http.MethodGet, "/v0/executions/" + uuidLike()},
		{http.MethodGet, "/metrics"},
		{http.MethodPost, "/v0/agents/intent"},
		{http.MethodGet, agentPath},
		{http.MethodGet, "/v0/runners/stream?runner_id=r&consumer_id=c"},
	}
	creds := []struct {
		what string
		opt  reqOpt
	}{
		{"no Authorization header", noAuth()},
		{"a wrong token", bearer(t.o.Token + "-wrong")},
		{"a Basic credential", header("Authorization", "Basic Y29uZjpjb25m")},
	}
	for _, rt := range routes {
		for _, c := range creds {
			var body any
			if rt.method == http.MethodPost {
				body = map[string]any{}
			}
			r := t.call(rt.method, rt.path, body, c.opt)
			if r.status != http.StatusUnauthorized {
				t.fatalf("with %s: want 401: %s", c.what, r)
			}
			t.expectError(r, http.StatusUnauthorized, "UNAUTHORIZED")
		}
	}
	for _, p := range []string{"/v0/health", "/v0/ready"} {
		t.expect(t.call(http.MethodGet, p, nil, bearer(t.o.Token+"-wrong")), http.StatusOK)
	}
	t.expectJSON(t.call(http.MethodGet, "/v0/executions?limit=1", nil), http.StatusOK)
}

func checkHTTPConventions(t *tc) {
	t.expect(t.call(http.MethodGet, "/v0/"+newID("no-such-route-"), nil), http.StatusNotFound)
	r := t.call(http.MethodDelete, "/v0/executions", nil)
	t.expect(r, http.StatusMethodNotAllowed)
	if allow := r.header.Get("Allow"); !strings.Contains(allow, "GET") || !strings.Contains(allow, "POST") {
		t.fatalf("405 Allow header %q, want GET and POST listed", allow)
	}
	reqID := newID("conf-req-")
	r = t.call(http.MethodGet, "/v0/health", nil, header("X-Request-ID", reqID))
	t.wantEq("echoed X-Request-ID", r.header.Get("X-Request-ID"), reqID)
	if r = t.call(http.MethodGet, "/v0/health", nil); r.header.Get("X-Request-ID") == "" {
		t.fatalf("no X-Request-ID on a response to a request without one")
	}
	long := strings.Repeat("r", 129)
	if got := t.call(http.MethodGet, "/v0/health", nil, header("X-Request-ID", long)).header.Get("X-Request-ID"); got == "" || got == long {
		t.fatalf("a 129-byte X-Request-ID must be replaced by a fresh one, got %q", got)
	}
}

func checkBodyLimit(t *tc) {
	big := strings.Repeat("x", 1<<20+16<<10)
	r := t.call(http.MethodPost, "/v0/executions", rawBody(`{"agent_id":"`+newID("conf-agent-")+`","input":"`+big+`"}`))
	if r.status == http.StatusCreated {
		id, _ := t.object(r).str("id")
		t.cleanup(func(ctx context.Context) { t.cancelQuietly(ctx, id) })
	}
	t.expectError(r, http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE")
}

func checkCreate(t *tc) {
	agentID := newID("conf-agent-")
	input := map[string]any{"task": "conformance <&>", "nested": map[string]any{"CamelCase": []any{1, 2.5, nil}}}
	labels := map[string]any{"env": "conf", "team": newID("t")}
	o := t.create(map[string]any{"agent_id": agentID, "input": input, "labels": labels})
	t.wantExecutionShape(o, "created execution")
	t.wantEq("status", t.wantStr(o, "status", "created"), "pending")
	t.wantEq("agent_id", t.wantStr(o, "agent_id", "created"), agentID)
	t.wantJSON("labels", o["labels"], labels)
	t.wantJSON("input", o["input"], input)
	if o.has("output") {
		t.fatalf("a pending execution has an output key: %s", show(o))
	}
	bare := t.create(map[string]any{"agent_id": agentID})
	t.wantExecutionShape(bare, "execution created without input and labels")
	if !bare.isNull("labels") || !bare.isNull("input") {
		t.fatalf("labels and input left out must be null, got labels %s, input %s", show(bare["labels"]), show(bare["input"]))
	}
	for _, in := range []any{"just a string", 42.5, []any{"a", 1}} {
		got := t.create(map[string]any{"agent_id": agentID, "input": in})
		t.wantJSON("non-object input echoed", got["input"], in)
	}
	edge := strings.Repeat("a", 240) + newID("")
	t.wantEq("256-byte agent_id", t.wantStr(t.create(map[string]any{"agent_id": edge}), "agent_id", "created"), edge)
	extra := t.create(map[string]any{"agent_id": agentID, "unknown_field": 1})
	t.wantEq("status with an unknown field", t.wantStr(extra, "status", "created"), "pending")
}

// wantExecutionShape checks the keys of an execution object.
func (t *tc) wantExecutionShape(o obj, what string) {
	for _, k := range []string{"id", "status", "agent_id", "labels", "input", "created_at", "updated_at"} {
		if !o.has(k) {
			t.fatalf("%s lacks %q: %s", what, k, show(o))
		}
	}
	t.wantTime(o, "created_at", what)
	t.wantTime(o, "updated_at", what)
	st := t.wantStr(o, "status", what)
	switch st {
	case "pending", "running", "blocked", "completed", "failed", "cancelled":
	default:
		t.fatalf("%s: status %q is not one of the six", what, st)
	}
}

func checkCreateValidation(t *tc) {
	long := strings.Repeat("a", 257)
	bodies := []struct {
		what string
		body any
	}{
		{"an empty object", map[string]any{}},
		{"an empty agent_id", map[string]any{"agent_id": ""}},
		{"malformed JSON", rawBody(`{"agent_id":`)},
		{"an empty body", rawBody(``)},
		{"a numeric label value", rawBody(`{"agent_id":"a","labels":{"k":1}}`)},
		{"a 257-byte agent_id", map[string]any{"agent_id": long}},
	}
	for _, b := range bodies {
		r := t.call(http.MethodPost, "/v0/executions", b.body)
		if r.status == http.StatusCreated {
			id, _ := t.object(r).str("id")
			t.cleanup(func(ctx context.Context) { t.cancelQuietly(ctx, id) })
		}
		if r.status != http.StatusBadRequest {
			t.fatalf("create with %s: want 400: %s", b.what, r)
		}
		t.expectError(r, http.StatusBadRequest, "VALIDATION_ERROR")
	}
}

func checkGet(t *tc) {
	created := t.create(map[string]any{"agent_id": newID("conf-agent-"), "input": map[string]any{"q": 1}, "labels": map[string]any{"k": "v"}})
	id, _ := created.str("id")
	got := t.execution(id)
	t.wantExecutionShape(got, "get")
	for _, k := range []string{"id", "status", "agent_id", "labels", "input", "created_at"} {
		t.wantJSON("get "+k, got[k], created[k])
	}
	t.expectError(t.call(http.MethodGet, "/v0/executions/"+uuidLike(), nil), http.StatusNotFound, "NOT_FOUND")

	a := t.newAgent()
	r := a.start(nil)
	r.complete(map[string]any{"answer": 42})
	done := t.execution(r.id)
	t.wantEq("status", t.wantStr(done, "status", "get"), "completed")
	t.wantJSON("output of a completed execution", done["output"], map[string]any{"answer": 42})
}

// listPage is the list endpoint's answer.
type listPage struct {
	ids    []string
	rows   []obj
	cursor string
	raw    *response
}

func (t *tc) list(query url.Values) listPage {
	r := t.call(http.MethodGet, "/v0/executions?"+query.Encode(), nil)
	o := t.expectJSON(r, http.StatusOK)
	raw, ok := o["executions"]
	if !ok || strings.TrimSpace(string(raw)) == "null" {
		t.fatalf(`"executions" must be an array, never null or absent: %s`, r)
	}
	var rows []obj
	t.decode(&response{body: raw, method: r.method, path: r.path, status: r.status}, &rows)
	if !o.has("next_cursor") {
		t.fatalf(`list answer lacks "next_cursor": %s`, r)
	}
	p := listPage{rows: rows, raw: r}
	p.cursor, _ = o.str("next_cursor")
	for _, row := range rows {
		id, _ := row.str("id")
		p.ids = append(p.ids, id)
	}
	return p
}

// wantIDs fails unless the page holds exactly the ids, in any order.
func (t *tc) wantIDs(what string, p listPage, want ...string) {
	got := append([]string(nil), p.ids...)
	w := append([]string(nil), want...)
	sort.Strings(got)
	sort.Strings(w)
	if strings.Join(got, ",") != strings.Join(w, ",") {
		t.fatalf("%s: got ids %v, want %v", what, p.ids, want)
	}
}

// wantNewestFirst fails unless rows are sorted by created_at then id, both
// descending.
func (t *tc) wantNewestFirst(what string, rows []obj) {
	for i := 1; i < len(rows); i++ {
		a, b := rows[i-1], rows[i]
		ta, tb := t.wantTime(a, "created_at", what), t.wantTime(b, "created_at", what)
		ia, _ := a.str("id")
		ib, _ := b.str("id")
		if ta.Before(tb) || (ta.Equal(tb) && ia < ib) {
			t.fatalf("%s: rows %d and %d are not newest first (%s %s, then %s %s)", what, i-1, i, ta.Format(time.RFC3339Nano), ia, tb.Format(time.RFC3339Nano), ib)
		}
	}
}

func checkListFilters(t *tc) {
	agentA, agentB, agentC := newID("conf-agent-"), newID("conf-agent-"), newID("conf-agent-")
	tag := newID("tag")
	id := func(o obj) string { s, _ := o.str("id"); return s }
	a1 := id(t.create(map[string]any{"agent_id": agentA, "labels": map[string]any{"conf": tag, "k": "1"}, "input": map[string]any{"secret": 1}}))
	a2 := id(t.create(map[string]any{"agent_id": agentA, "labels": map[string]any{"conf": tag, "k": "2"}}))
	b1 := id(t.create(map[string]any{"agent_id": agentB, "labels": map[string]any{"conf": tag, "k": "1"}}))
	c1 := id(t.create(map[string]any{"agent_id": agentC}))
	t.expectJSON(t.call(http.MethodPost, "/v0/executions/"+a2+"/cancel", nil), http.StatusOK)

	p := t.list(url.Values{"agent_id": {agentA}})
	t.wantIDs("agent_id filter", p, a1, a2)
	t.wantNewestFirst("agent_id filter", p.rows)
	t.wantEq("next_cursor on the last page", p.cursor, "")
	for _, row := range p.rows {
		for _, k := range []string{"id", "status", "agent_id", "labels", "created_at", "updated_at"} {
			if !row.has(k) {
				t.fatalf("list summary lacks %q: %s", k, show(row))
			}
		}
		if row.has("input") || row.has("output") {
			t.fatalf("list summary carries input or output: %s", show(row))
		}
	}
	t.wantIDs("label filter", t.list(url.Values{"label": {"conf:" + tag}}), a1, a2, b1)
	t.wantIDs("two label filters (AND)", t.list(url.Values{"label": {"conf:" + tag, "k:1"}}), a1, b1)
	u1 := id(t.create(map[string]any{"agent_id": agentB, "labels": map[string]any{"url" + tag: "http://x:8080/p"}}))
	t.wantIDs("label whose value holds colons (split at the first)", t.list(url.Values{"label": {"url" + tag + ":http://x:8080/p"}}), u1)
	t.wantIDs("agent_id+status=cancelled", t.list(url.Values{"agent_id": {agentA}, "status": {"cancelled"}}), a2)
	t.wantIDs("agent_id+status=pending", t.list(url.Values{"agent_id": {agentA}, "status": {"pending"}}), a1)
	empty := t.list(url.Values{"agent_id": {newID("conf-nobody-")}})
	t.wantIDs("filter matching nothing", empty)
	t.wantEq("next_cursor of an empty result", empty.cursor, "")

	pc := t.list(url.Values{"agent_id": {agentC}})
	t.wantIDs("agent without labels", pc, c1)
	if got := strings.TrimSpace(string(pc.rows[0]["labels"])); got != "{}" {
		t.fatalf("summary labels of an execution created without labels = %s, want {} (wire-facts §5.3)", got)
	}

	for _, q := range []url.Values{
		{"status": {"bogus"}},
		{"label": {"novalue"}},
		{"label": {":v"}},
		{"cursor": {"%%%not-base64%%%"}},
		{"cursor": {"Z2FyYmFnZQ=="}},
	} {
		r := t.call(http.MethodGet, "/v0/executions?"+q.Encode(), nil)
		if r.status != http.StatusBadRequest {
			t.fatalf("list with %s: want 400: %s", q.Encode(), r)
		}
		t.expectError(r, http.StatusBadRequest, "VALIDATION_ERROR")
	}
}

func checkListPagination(t *tc) {
	agentID := newID("conf-agent-")
	const n = 201
	ids := make([]string, n)
	t.parallel(n, func(i int) {
		o := t.create(map[string]any{"agent_id": agentID})
		ids[i], _ = o.str("id")
	})
	q := func(kv ...string) url.Values {
		v := url.Values{"agent_id": {agentID}}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	if p := t.list(q("limit", "500")); len(p.ids) != 200 || p.cursor == "" {
		t.fatalf("limit=500 over %d rows: got %d rows and cursor %q, want 200 rows (the maximum) and a cursor", n, len(p.ids), p.cursor)
	}
	for _, lim := range []string{"", "0", "-3", "abc"} {
		if p := t.list(q("limit", lim)); len(p.ids) != 50 {
			t.fatalf("limit=%q: got %d rows, want the default 50", lim, len(p.ids))
		}
	}
	seen := map[string]bool{}
	var rows []obj
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > n {
			t.fatalf("pagination does not end")
		}
		v := q("limit", "37")
		if cursor != "" {
			v.Set("cursor", cursor)
		}
		p := t.list(v)
		if len(p.ids) > 37 {
			t.fatalf("page of limit 37 has %d rows", len(p.ids))
		}
		for _, id := range p.ids {
			if seen[id] {
				t.fatalf("execution %s appears on two pages (the next page must start strictly after the cursor)", id)
			}
			seen[id] = true
		}
		rows = append(rows, p.rows...)
		if p.cursor == "" {
			break
		}
		if len(p.ids) == 0 {
			t.fatalf("an empty page with a non-empty next_cursor %q", p.cursor)
		}
		cursor = p.cursor
	}
	if len(seen) != n {
		t.fatalf("pagination returned %d distinct executions, want %d", len(seen), n)
	}
	for _, id := range ids {
		if !seen[id] {
			t.fatalf("execution %s missing from the pages", id)
		}
	}
	t.wantNewestFirst("pages in order", rows)
}

// parallel runs fn(0..n-1) on a few goroutines and waits. A failure inside
// fn ends only that goroutine; the others stop taking work, and parallel
// then ends the check.
func (t *tc) parallel(n int, fn func(i int)) {
	work := make(chan int, n)
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if st, _ := t.outcome(); st != Pass {
					return
				}
				fn(i)
			}
		}()
	}
	wg.Wait()
	if st, _ := t.outcome(); st != Pass {
		runtime.Goexit()
	}
}

func checkCancel(t *tc) {
	pending := t.create(map[string]any{"agent_id": newID("conf-agent-"), "input": map[string]any{"x": 1}, "labels": map[string]any{"k": "v"}})
	pid, _ := pending.str("id")
	o := t.expectJSON(t.call(http.MethodPost, "/v0/executions/"+pid+"/cancel", nil), http.StatusOK)
	t.wantExecutionShape(o, "cancel answer")
	t.wantEq("status after cancel", t.wantStr(o, "status", "cancel"), "cancelled")
	t.wantJSON("input after cancel", o["input"], map[string]any{"x": 1})
	if o.has("output") {
		t.fatalf("a cancelled execution has an output key: %s", show(o))
	}
	evs := t.events(pid)
	last := evs[len(evs)-1]
	t.wantEq("last event after cancel", last.Type, "execution.cancelled")
	if _, ok := last.payload().str("reason"); !ok {
		t.fatalf("execution.cancelled payload lacks a reason: %s", last.Payload)
	}
	t.expectError(t.call(http.MethodPost, "/v0/executions/"+pid+"/cancel", nil), http.StatusConflict, "CONFLICT")
	t.expectError(t.call(http.MethodPost, "/v0/executions/"+uuidLike()+"/cancel", nil), http.StatusNotFound, "NOT_FOUND")

	a := t.newAgent()
	r := a.start(nil)
	step := r.invoke(newID("conformance.tool."), map[string]any{"n": 1}, false)
	o = t.expectJSON(t.call(http.MethodPost, "/v0/executions/"+r.id+"/cancel", nil), http.StatusOK)
	t.wantEq("status after cancelling a running execution", t.wantStr(o, "status", "cancel"), "cancelled")
	evs = t.events(r.id)
	sc := t.one(evs, "step.cancelled", step)
	if _, ok := sc.payload().str("reason"); !ok {
		t.fatalf("step.cancelled payload lacks a reason: %s", sc.Payload)
	}
	if sc.Sequence > evs[len(evs)-1].Sequence || evs[len(evs)-1].Type != "execution.cancelled" {
		t.fatalf("want step.cancelled then execution.cancelled last, log: %s", typesOf(evs))
	}
	t.expectError(r.intent(map[string]any{"type": "complete"}), http.StatusConflict, "CONFLICT")
	t.expectError(r.stepResult(step, true, map[string]any{"late": true}, ""), http.StatusConflict, "CONFLICT")

	tool := newID("conformance.remote.")
	q := a.start(nil)
	q.invoke(tool, nil, true)
	t.expectJSON(t.call(http.MethodPost, "/v0/executions/"+q.id+"/cancel", nil), http.StatusOK)
	late := t.newRunner(tool)
	late.s.absent(t, 500*time.Millisecond, "a job of a cancelled execution", func(f frame) bool { return f.event == "job.assigned" })

	b := a.start(nil)
	b.accepted(map[string]any{"type": "wait", "signal_type": "conf.never"})
	t.wantStatus(b.id, "blocked")
	o = t.expectJSON(t.call(http.MethodPost, "/v0/executions/"+b.id+"/cancel", nil), http.StatusOK)
	t.wantEq("status after cancelling a blocked execution", t.wantStr(o, "status", "cancel"), "cancelled")
}

func checkSignal(t *tc) {
	id, _ := t.create(map[string]any{"agent_id": newID("conf-agent-")}).str("id")
	path := "/v0/executions/" + id + "/signal"
	t.expectError(t.call(http.MethodPost, path, map[string]any{"payload": map[string]any{}}), http.StatusBadRequest, "VALIDATION_ERROR")
	t.expectError(t.call(http.MethodPost, path, rawBody(`{"signal_type":`)), http.StatusBadRequest, "VALIDATION_ERROR")
	t.expectError(t.call(http.MethodPost, "/v0/executions/"+uuidLike()+"/signal", map[string]any{"signal_type": "conf.x"}), http.StatusNotFound, "NOT_FOUND")
	payload := map[string]any{"approved": true, "Note": "<b>"}
	t.signal(id, "conf.approval", payload)
	t.signal(id, "conf.bare", nil)
	evs := t.events(id)
	sigs := ofType(evs, "signal.received", "")
	if len(sigs) != 2 {
		t.fatalf("want 2 signal.received events, log: %s", typesOf(evs))
	}
	p0, p1 := sigs[0].payload(), sigs[1].payload()
	t.wantEq("signal_type", t.wantStr(p0, "signal_type", "signal.received"), "conf.approval")
	t.wantJSON("signal payload", p0["payload"], payload)
	t.wantEq("signal_type", t.wantStr(p1, "signal_type", "signal.received"), "conf.bare")
	if !p1.isNull("payload") {
		t.fatalf("a signal without payload must record payload null, got %s", show(p1["payload"]))
	}
	t.wantStatus(id, "pending")
	t.expectJSON(t.call(http.MethodPost, "/v0/executions/"+id+"/cancel", nil), http.StatusOK)
	t.expectError(t.call(http.MethodPost, path, map[string]any{"signal_type": "conf.late"}), http.StatusConflict, "CONFLICT")
}

func checkEvents(t *tc) {
	agentID := newID("conf-agent-")
	id, _ := t.create(map[string]any{"agent_id": agentID, "input": map[string]any{"q": "x"}, "labels": map[string]any{"k": "v"}}).str("id")
	for i := 0; i < 4; i++ {
		t.signal(id, "conf.s"+strconv.Itoa(i), map[string]any{"i": i})
	}
	seqs := func(evs []event) []uint64 {
		out := []uint64{}
		for _, e := range evs {
			out = append(out, e.Sequence)
		}
		return out
	}
	p, evs, _ := t.eventsPage(id, "")
	t.wantEq("sequences", seqs(evs), []uint64{1, 2, 3, 4, 5})
	t.wantEq("latest_sequence", *p.LatestSequence, uint64(5))
	for i, e := range evs {
		t.wantEnvelope(e, id, "event "+strconv.Itoa(i+1))
	}
	created := evs[0]
	t.wantEq("first event type", created.Type, "execution.created")
	cp := created.payload()
	t.wantEq("execution.created agent_id", t.wantStr(cp, "agent_id", "execution.created"), agentID)
	t.wantJSON("execution.created input", cp["input"], map[string]any{"q": "x"})
	t.wantJSON("execution.created labels", cp["labels"], map[string]any{"k": "v"})

	p, evs, _ = t.eventsPage(id, "?limit=2")
	t.wantEq("limit=2 sequences", seqs(evs), []uint64{1, 2})
	t.wantEq("limit=2 latest_sequence", *p.LatestSequence, uint64(2))
	p, evs, _ = t.eventsPage(id, "?after_sequence=2&limit=2")
	t.wantEq("after_sequence=2&limit=2 sequences", seqs(evs), []uint64{3, 4})
	t.wantEq("after_sequence=2&limit=2 latest_sequence (the page's last, wire-facts §5.7)", *p.LatestSequence, uint64(4))
	p, evs, r := t.eventsPage(id, "?after_sequence=5")
	if len(evs) != 0 || !strings.Contains(strings.ReplaceAll(string(r.body), " ", ""), `"events":[]`) {
		t.fatalf("after the last event: want \"events\":[], got %s", r)
	}
	t.wantEq("latest_sequence of an empty page", *p.LatestSequence, uint64(0))
	for _, q := range []string{"?after_sequence=-1", "?after_sequence=abc", "?limit=0", "?limit=-5", "?limit=5000"} {
		_, evs, _ = t.eventsPage(id, q)
		t.wantEq("sequences for "+q, seqs(evs), []uint64{1, 2, 3, 4, 5})
	}
	t.expectError(t.call(http.MethodGet, "/v0/executions/"+uuidLike()+"/events", nil), http.StatusNotFound, "NOT_FOUND")
}

// wantEnvelope checks the seed 004 keys of an event object.
func (t *tc) wantEnvelope(e event, execID, what string) {
	var o obj
	t.decode(&response{body: e.raw}, &o)
	for _, k := range []string{"id", "execution_id", "type", "schema_version", "timestamp", "payload", "causation_id", "correlation_id", "idempotency_key", "sequence"} {
		if !o.has(k) {
			t.fatalf("%s lacks %q: %s", what, k, e.raw)
		}
	}
	for _, k := range []string{"id", "type", "causation_id", "correlation_id", "idempotency_key"} {
		t.wantStr(o, k, what)
	}
	if e.ID == "" || e.Type == "" {
		t.fatalf("%s has an empty id or type: %s", what, e.raw)
	}
	t.wantEq(what+" execution_id", e.ExecutionID, execID)
	if e.SchemaVersion < 1 {
		t.fatalf("%s: schema_version %d, want >= 1", what, e.SchemaVersion)
	}
	t.wantTime(o, "timestamp", what)
	if o.has("step_id") {
		t.wantStr(o, "step_id", what)
	}
}

// finished runs a short execution to completion and returns it with its
// log: created, started, a local tool call, a signal, completed.
func (t *tc) finished() (*run, []event) {
	a := t.newAgent()
	r := a.start(map[string]any{"task": "finish"})
	step := r.invoke(newID("conformance.tool."), map[string]any{"n": 1}, false)
	t.expectOK(r.stepResult(step, true, map[string]any{"ok": true}, ""))
	t.signal(r.id, "conf.note", map[string]any{"k": 1})
	r.complete(map[string]any{"done": true})
	evs := t.events(r.id)
	if len(evs) < 5 || evs[len(evs)-1].Type != "execution.completed" {
		t.fatalf("finished execution %s: unexpected log %s", r.id, typesOf(evs))
	}
	return r, evs
}

// wantFrames checks that frames are exactly the events after `after`, with
// the wire framing: id before event, id = sequence, event = type, data
// equal to the events endpoint's object.
func (t *tc) wantFrames(what string, frames []frame, evs []event, after uint64) {
	var want []event
	for _, e := range evs {
		if e.Sequence > after {
			want = append(want, e)
		}
	}
	got := events(frames)
	if len(got) != len(want) {
		var ids []string
		for _, f := range got {
			ids = append(ids, f.id+":"+f.event)
		}
		t.fatalf("%s: got %d event frames [%s], want sequences %d..%d", what, len(got), strings.Join(ids, " "), after+1, after+uint64(len(want)))
	}
	for i, f := range got {
		e := want[i]
		if !f.hasID {
			t.fatalf("%s: frame %q has no id: line", what, f.event)
		}
		idAt, evAt := indexOf(f.fields, "id"), indexOf(f.fields, "event")
		if idAt > evAt {
			t.fatalf("%s: frame %s has its id: line after event: (fields %v; wire-facts §6)", what, f.id, f.fields)
		}
		t.wantEq(what+" frame id", f.id, strconv.FormatUint(e.Sequence, 10))
		t.wantEq(what+" frame event", f.event, e.Type)
		if f.json() == nil {
			t.fatalf("%s: frame %s data is not a JSON object: %s", what, f.id, f.data)
		}
		if !sameJSON([]byte(f.data), e.raw) {
			t.fatalf("%s: frame %s data differs from the events endpoint:\n stream %s\n events %s", what, f.id, f.data, e.raw)
		}
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func checkStreamFraming(t *tc) {
	r, evs := t.finished()
	s := t.mustStream("/v0/executions/" + r.id + "/stream")
	if cc := s.header.Get("Cache-Control"); !strings.Contains(cc, "no-cache") {
		t.fatalf("execution stream Cache-Control %q, want no-cache", cc)
	}
	frames := s.readAll(t, 5*time.Second)
	if len(frames) == 0 || frames[0].retry == "" {
		t.fatalf("the stream does not start with a retry: preamble (wire-facts §6)")
	}
	if n, err := strconv.Atoi(frames[0].retry); err != nil || n <= 0 {
		t.fatalf("retry: %q is not a positive integer", frames[0].retry)
	}
	if frames[0].isEvent() {
		t.fatalf("the retry preamble must come before any event, as its own block")
	}
	t.wantFrames("full replay", frames, evs, 0)
}

func checkStreamLive(t *tc) {
	a := t.newAgent()
	r := a.start(nil)
	p, _, _ := t.eventsPage(r.id, "?limit=1000")
	after := *p.LatestSequence
	s := t.mustStream("/v0/executions/" + r.id + "/stream?after_sequence=" + strconv.FormatUint(after, 10))
	s.next(t, "the retry preamble", func(f frame) bool { return f.retry != "" })
	s.absent(t, 300*time.Millisecond, "event before anything happened", frame.isEvent)
	step := r.invoke(newID("conformance.tool."), nil, false)
	f := s.next(t, "a live event", frame.isEvent)
	t.wantEq("first live frame id", f.id, strconv.FormatUint(after+1, 10))
	t.expectOK(r.stepResult(step, true, nil, ""))
	s.next(t, "step.completed live", func(f frame) bool { return f.event == "step.completed" })
	r.complete(nil)
	s.next(t, "execution.completed live", func(f frame) bool { return f.event == "execution.completed" })
	if !s.waitEnd(t, 5*time.Second) {
		t.fatalf("the server did not end the stream after execution.completed")
	}
	t.wantFrames("live stream", s.all(), t.events(r.id), after)
}

func checkStreamAfterTerminal(t *tc) {
	r, evs := t.finished()
	n := evs[len(evs)-1].Sequence
	for _, v := range []struct {
		what string
		path string
		opts []reqOpt
	}{
		{"after_sequence = terminal", "?after_sequence=" + strconv.FormatUint(n, 10), nil},
		{"after_sequence past the end", "?after_sequence=" + strconv.FormatUint(n+10, 10), nil},
		{"Last-Event-ID = terminal", "", []reqOpt{header("Last-Event-ID", strconv.FormatUint(n, 10))}},
	} {
		s := t.mustStream("/v0/executions/"+r.id+"/stream"+v.path, v.opts...)
		if !s.waitEnd(t, 3*time.Second) {
			t.fatalf("%s: the stream of a finished execution stays open (wire-facts §14.11)", v.what)
		}
		if got := events(s.all()); len(got) != 0 {
			t.fatalf("%s: got %d events, want none", v.what, len(got))
		}
	}
}

func checkStreamBacklog(t *tc) {
	a := t.newAgent()
	r := a.start(nil)
	tool := newID("conformance.tool.")
	t.parallel(900, func(i int) {
		if i%3 == 0 {
			r.invoke(tool, nil, false)
			return
		}
		t.signal(r.id, "conf.backlog", nil)
	})
	p, _, _ := t.eventsPage(r.id, "?limit=5000")
	if got := *p.LatestSequence; got != 1000 {
		t.fatalf("events with limit=5000 over more than 1000 events: latest_sequence %d, want 1000 (the maximum page)", got)
	}
	evs := t.events(r.id)
	s := t.mustStream("/v0/executions/" + r.id + "/stream")
	last := evs[len(evs)-1].Sequence
	s.next(t, fmt.Sprintf("the replay of all %d events of a live execution, with nothing new written", last), func(f frame) bool {
		return f.id == strconv.FormatUint(last, 10)
	})
	s.close()
	t.wantFrames("backlog replay", s.all(), evs, 0)
}

func checkStreamLastEventID(t *tc) {
	r, evs := t.finished()
	s := t.mustStream("/v0/executions/"+r.id+"/stream", header("Last-Event-ID", "2"))
	t.wantFrames("resume with Last-Event-ID: 2", s.readAll(t, 5*time.Second), evs, 2)
}

func checkStreamUnknown(t *tc) {
	s, r := t.openStream("/v0/executions/" + uuidLike() + "/stream")
	if s != nil {
		t.fatalf("an unknown execution's stream opened as an event stream; want a JSON 404")
	}
	t.expectError(r, http.StatusNotFound, "NOT_FOUND")
}

func checkHeartbeat(t *tc) {
	a := t.newAgent()
	rn := t.newRunner(newID("conformance.tool."))
	id, _ := t.create(map[string]any{"agent_id": newID("conf-agent-")}).str("id")
	ex := t.mustStream("/v0/executions/" + id + "/stream")
	for _, s := range []*stream{a.s, rn.s, ex} {
		ctx, cancel := t.within(16 * time.Second)
		_, ok := s.poll(ctx, frame.isComment)
		cancel()
		if !ok {
			t.fatalf("%s: no :heartbeat comment within 16 s of idleness", s.path)
		}
	}
}

func checkAgentStreamParams(t *tc) { checkStreamParams(t, "agent") }

// checkStreamParams: a role stream without both ids is a JSON 400, before
// any stream bytes.
func checkStreamParams(t *tc, role string) {
	for _, q := range []string{"", "?" + role + "_id=x", "?consumer_id=c", "?" + role + "_id=&consumer_id=c"} {
		s, r := t.openStream("/v0/" + role + "s/stream" + q)
		if s != nil {
			t.fatalf("%s stream %q opened; want a JSON 400", role, q)
		}
		t.expectError(r, http.StatusBadRequest, "VALIDATION_ERROR")
	}
}

func checkAgentAssigned(t *tc) {
	a := t.newAgent()
	input := map[string]any{"task": "t", "Keep": []any{"Case"}}
	labels := map[string]any{"env": "conf"}
	o := t.create(map[string]any{"agent_id": a.id, "input": input, "labels": labels})
	id, _ := o.str("id")
	if st, _ := o.str("status"); st != "pending" && st != "running" {
		t.fatalf("create with a connected agent: status %q, want pending or running", st)
	}
	f, p := a.s.nextEvent(t, "execution.assigned", func(p obj) bool { s, _ := p.str("execution_id"); return s == id })
	if !f.hasData || f.event == "" {
		t.fatalf("execution.assigned frame needs both event: and data: lines")
	}
	session := t.wantStr(p, "session_id", "execution.assigned")
	if session == "" {
		t.fatalf("execution.assigned has an empty session_id")
	}
	t.wantEq("execution.assigned agent_id", t.wantStr(p, "agent_id", "execution.assigned"), a.id)
	t.wantJSON("execution.assigned input", p["input"], input)
	t.wantJSON("execution.assigned labels", p["labels"], labels)
	if h, ok := p["history"]; ok && !sameJSON(h, []any{}) && !sameJSON(h, nil) {
		t.fatalf("a fresh execution's history must be empty or absent, got %s", h)
	}
	t.waitStatus(id, "running")
	_, evs := t.waitEvent(id, "execution.started", func(e event) bool { return e.Type == "execution.started" })
	started := t.one(evs, "execution.started", "")
	t.wantEq("execution.started session_id", t.wantStr(started.payload(), "session_id", "execution.started"), session)

	bare := t.create(map[string]any{"agent_id": a.id})
	bid, _ := bare.str("id")
	_, bp := a.s.nextEvent(t, "execution.assigned", func(p obj) bool { s, _ := p.str("execution_id"); return s == bid })
	if !bp.isNull("input") {
		t.fatalf("execution.assigned without input must carry \"input\": null, got %s", show(bp["input"]))
	}
	if l, ok := bp["labels"]; ok && !sameJSON(l, nil) && !sameJSON(l, map[string]any{}) {
		t.fatalf("execution.assigned without labels carries labels %s", l)
	}
}

func checkIntentLocalTool(t *tc) {
	a := t.newAgent()
	r := a.start(nil)
	tool := newID("conformance.tool.")
	args := map[string]any{"query": "a<b & c", "Nested": map[string]any{"n": 2.5}}
	resp := r.intent(map[string]any{"type": "invoke_tool", "tool_id": tool, "arguments": args, "remote": false})
	o := t.expectJSON(resp, http.StatusOK)
	if ok, _ := o.boolean("accepted"); !ok {
		t.needAllowed(tool, resp)
		t.fatalf("invoke_tool not accepted: %s", resp)
	}
	step := t.wantStr(o, "step_id", "invoke_tool answer")
	if step == "" {
		t.fatalf("accepted invoke_tool has an empty step_id")
	}
	t.wantStatus(r.id, "running")
	evs := t.events(r.id)
	acc := ofType(evs, "intent.accepted", "")
	if len(acc) == 0 {
		t.fatalf("no intent.accepted event, log: %s", typesOf(evs))
	}
	t.wantEq("intent.accepted intent_type", t.wantStr(acc[len(acc)-1].payload(), "intent_type", "intent.accepted"), "invoke_tool")
	sc := t.one(evs, "step.created", step).payload()
	t.wantEq("step.created tool_id", t.wantStr(sc, "tool_id", "step.created"), tool)
	t.wantJSON("step.created arguments", sc["arguments"], args)
	t.wantJSON("step.created max_attempts (local)", sc["max_attempts"], 1)
	t.wantJSON("step.created attempt", sc["attempt"], 1)

	data := map[string]any{"result": "found", "Items": []any{1, "two"}}
	t.expectOK(r.stepResult(step, true, data, ""))
	t.wantJSON("step.completed result", t.one(t.events(r.id), "step.completed", step).payload()["result"], data)
	t.wantJSON("tool.result result", r.toolResult(step, "succeeded")["result"], data)

	step2 := r.invoke(tool, nil, false)
	t.expectOK(r.stepResult(step2, false, nil, "tool exploded"))
	t.stepFailed(t.events(r.id), step2, "tool exploded", false)
	r.toolFailed(step2, "tool exploded")
	r.complete(nil)
}

func checkIntentRemoteTool(t *tc) {
	args := map[string]any{"path": "/tmp/x", "Flags": []any{"a"}}
	rn, r, step := t.remoteStep(args)
	job := rn.job(step)
	jobID := t.wantStr(job, "id", "job.assigned")
	if jobID == "" {
		t.fatalf("job.assigned has an empty id")
	}
	t.wantEq("job.assigned execution_id", t.wantStr(job, "execution_id", "job.assigned"), r.id)
	t.wantEq("job.assigned tool_id", t.wantStr(job, "tool_id", "job.assigned"), rn.caps[0])
	t.wantJSON("job.assigned arguments", job["arguments"], args)
	t.wantJSON("job.assigned attempt", job["attempt"], 1)
	t.wantTime(job, "deadline", "job.assigned")

	evs := t.events(r.id)
	sc := t.one(evs, "step.created", step).payload()
	if n, _ := sc.num("max_attempts"); n < 1 {
		t.fatalf("step.created max_attempts %s for a remote step", show(sc["max_attempts"]))
	}
	dispatched := false
	for _, e := range ofType(evs, "step.dispatched", step) {
		if j, _ := e.payload().str("job_id"); j == jobID {
			dispatched = true
		}
	}
	if !dispatched {
		t.fatalf("no step.dispatched with job_id %s, log: %s", jobID, typesOf(evs))
	}
	t.expectOK(t.call(http.MethodPost, "/v0/runners/steps/"+step+"/started", map[string]any{"execution_id": r.id, "runner_id": rn.id}))
	st := t.one(t.events(r.id), "step.started", step).payload()
	t.wantEq("step.started runner_id", t.wantStr(st, "runner_id", "step.started"), rn.id)
	data := map[string]any{"content": "hello"}
	t.expectOK(rn.result(job, true, data, "", false))
	t.wantJSON("step.completed result", t.one(t.events(r.id), "step.completed", step).payload()["result"], data)
	t.wantJSON("tool.result result", r.toolResult(step, "succeeded")["result"], data)
	r.complete(nil)
	t.wantStatus(r.id, "completed")
}

func checkIntentComplete(t *tc) {
	a := t.newAgent()
	r := a.start(nil)
	out := map[string]any{"summary": "done", "N": []any{1, 2}}
	o := r.accepted(map[string]any{"type": "complete", "output": out})
	if o.has("step_id") {
		if s, _ := o.str("step_id"); s != "" {
			t.fatalf("complete answered a step_id: %s", show(o))
		}
	}
	evs := t.events(r.id)
	last := evs[len(evs)-1]
	t.wantEq("last event", last.Type, "execution.completed")
	t.wantJSON("execution.completed output", last.payload()["output"], out)
	if prev := evs[len(evs)-2]; prev.Type != "intent.accepted" {
		t.fatalf("want intent.accepted before execution.completed, log: %s", typesOf(evs))
	}
	got := t.execution(r.id)
	t.wantEq("status", t.wantStr(got, "status", "get"), "completed")
	t.wantJSON("output", got["output"], out)
	t.expectError(r.intent(map[string]any{"type": "complete"}), http.StatusConflict, "CONFLICT")
	t.expectError(t.call(http.MethodPost, "/v0/executions/"+r.id+"/cancel", nil), http.StatusConflict, "CONFLICT")
	t.expectError(t.call(http.MethodPost, "/v0/executions/"+r.id+"/signal", map[string]any{"signal_type": "conf.late"}), http.StatusConflict, "CONFLICT")

	r2 := a.start(nil)
	r2.complete(nil)
	got = t.execution(r2.id)
	if !got.isNull("output") {
		t.fatalf("completed without output: want \"output\": null, got %s", show(got["output"]))
	}
}

func checkIntentFail(t *tc) {
	a := t.newAgent()
	r := a.start(nil)
	t.expectError(r.intent(map[string]any{"type": "fail"}), http.StatusBadRequest, "VALIDATION_ERROR")
	r.accepted(map[string]any{"type": "fail", "error": "gave up"})
	evs := t.events(r.id)
	last := evs[len(evs)-1]
	t.wantEq("last event", last.Type, "execution.failed")
	t.wantEq("execution.failed error", t.wantStr(last.payload(), "error", "execution.failed"), "gave up")
	got := t.execution(r.id)
	t.wantEq("status", t.wantStr(got, "status", "get"), "failed")
	if got.has("output") {
		t.fatalf("a failed execution has an output key: %s", show(got))
	}
}

func checkIntentWait(t *tc) {
	a := t.newAgent()
	r := a.start(nil)
	t.expectError(r.intent(map[string]any{"type": "wait"}), http.StatusBadRequest, "VALIDATION_ERROR")
	r.accepted(map[string]any{"type": "wait", "signal_type": "conf.go"})
	t.wantStatus(r.id, "blocked")
	blocked := ofType(t.events(r.id), "execution.blocked", "")
	if len(blocked) != 1 {
		t.fatalf("want one execution.blocked event")
	}
	bp := blocked[0].payload()
	t.wantEq("execution.blocked reason", t.wantStr(bp, "reason", "execution.blocked"), "signal")
	t.wantEq("execution.blocked ref", t.wantStr(bp, "ref", "execution.blocked"), "conf.go")
	t.expectError(r.intent(map[string]any{"type": "invoke_tool", "tool_id": newID("conformance.tool.")}), http.StatusConflict, "CONFLICT")

	t.signal(r.id, "conf.other", map[string]any{"n": 1})
	t.wantStatus(r.id, "blocked")
	r.signalPush("conf.other")

	t.signal(r.id, "conf.go", map[string]any{"n": 2})
	t.waitStatus(r.id, "running")
	evs := t.events(r.id)
	res := ofType(evs, "execution.resumed", "")
	if len(res) != 1 || !strings.Contains(t.wantStr(res[0].payload(), "reason", "execution.resumed"), "conf.go") {
		t.fatalf("want one execution.resumed naming conf.go, log: %s", typesOf(evs))
	}
	t.wantJSON("signal.received payload", r.signalPush("conf.go")["payload"], map[string]any{"n": 2})
	r.complete(nil)
}

func checkIntentWaitPresignalled(t *tc) {
	a := t.newAgent()
	r := a.start(nil)
	t.signal(r.id, "conf.early", map[string]any{"v": 1})
	r.push("signal.received", "")
	r.accepted(map[string]any{"type": "wait", "signal_type": "conf.early"})
	t.wantStatus(r.id, "running")
	evs := t.events(r.id)
	if len(ofType(evs, "execution.blocked", "")) != 0 {
		t.fatalf("a wait for an already received signal must not block, log: %s", typesOf(evs))
	}
	if len(ofType(evs, "execution.resumed", "")) != 1 {
		t.fatalf("want execution.resumed for the consumed signal, log: %s", typesOf(evs))
	}
	t.wantJSON("re-pushed payload", r.signalPush("conf.early")["payload"], map[string]any{"v": 1})
	r.complete(nil)
}

func checkIntentValidation(t *tc) {
	a := t.newAgent()
	r := a.start(nil)
	post := func(body any) *response { return t.call(http.MethodPost, "/v0/agents/intent", body) }
	bad := []struct {
		what string
		body any
	}{
		{"malformed JSON", rawBody(`{"execution_id":`)},
		{"an empty object", map[string]any{}},
		{"no session_id", map[string]any{"execution_id": r.id, "intent": map[string]any{"type": "complete"}}},
		{"no intent.type", map[string]any{"execution_id": r.id, "session_id": r.session, "intent": map[string]any{}}},
		{"an unknown intent type", map[string]any{"execution_id": r.id, "session_id": r.session, "intent": map[string]any{"type": "dance"}}},
		{"invoke_tool without tool_id", map[string]any{"execution_id": r.id, "session_id": r.session, "intent": map[string]any{"type": "invoke_tool"}}},
		{"a 257-byte tool_id", map[string]any{"execution_id": r.id, "session_id": r.session, "intent": map[string]any{"type": "invoke_tool", "tool_id": strings.Repeat("t", 257)}}},
	}
	for _, b := range bad {
		resp := post(b.body)
		if resp.status != http.StatusBadRequest {
			t.fatalf("intent with %s: want 400: %s", b.what, resp)
		}
		t.expectError(resp, http.StatusBadRequest, "VALIDATION_ERROR")
	}
	resp := post(map[string]any{"execution_id": r.id, "session_id": uuidLike(), "intent": map[string]any{"type": "complete"}})
	t.expectError(resp, http.StatusUnauthorized, "UNAUTHORIZED")
	t.wantStatus(r.id, "running")
	r.complete(nil)
}

func checkIntentActiveSteps(t *tc) {
	a := t.newAgent()
	r := a.start(nil)
	step := r.invoke(newID("conformance.tool."), nil, false)
	t.expectError(r.intent(map[string]any{"type": "complete"}), http.StatusConflict, "CONFLICT")
	t.expectError(r.intent(map[string]any{"type": "fail", "error": "x"}), http.StatusConflict, "CONFLICT")
	evs := t.events(r.id)
	if n := len(ofType(evs, "intent.accepted", "")); n != 1 {
		t.fatalf("refused complete/fail left intent.accepted events (%d, want only the invoke's): %s", n, typesOf(evs))
	}
	t.expectOK(r.stepResult(step, true, nil, ""))
	r.complete(nil)
}

func checkPolicyDeny(t *tc) {
	a := t.newAgent()
	r := a.start(nil)
	before := len(t.events(r.id))
	args := map[string]any{"command": "rm -rf /"}
	resp := r.intent(map[string]any{"type": "invoke_tool", "tool_id": t.o.DeniedTool, "arguments": args, "idempotency_key": newID("k")})
	o := t.expectJSON(resp, http.StatusOK)
	if ok, _ := o.boolean("accepted"); ok {
		t.skipf("the server's policy allows tool %q, so no denial can be provoked (pass --denied-tool)", t.o.DeniedTool)
	}
	if !o.has("accepted") {
		t.fatalf(`denial lacks "accepted": false: %s`, resp)
	}
	msg := t.wantStr(o, "error", "denial")
	if !strings.HasPrefix(msg, "policy denied: ") || !strings.Contains(msg, "(rule: ") {
		t.fatalf(`denial error %q, want "policy denied: <reason> (rule: <rule_id>)"`, msg)
	}
	if s, _ := o.str("step_id"); s != "" {
		t.fatalf("a denial carries a step_id: %s", resp)
	}
	evs := t.events(r.id)
	added := evs[before:]
	if len(added) != 1 || added[0].Type != "intent.denied" {
		t.fatalf("a denial must write exactly intent.denied, wrote: %s", typesOf(added))
	}
	p := added[0].payload()
	t.wantEq("intent.denied intent_type", t.wantStr(p, "intent_type", "intent.denied"), "invoke_tool")
	t.wantEq("intent.denied tool_id", t.wantStr(p, "tool_id", "intent.denied"), t.o.DeniedTool)
	if t.wantStr(p, "reason", "intent.denied") == "" || t.wantStr(p, "rule_id", "intent.denied") == "" {
		t.fatalf("intent.denied needs a non-empty reason and rule_id: %s", added[0].Payload)
	}
	t.wantStatus(r.id, "running")
	r.complete(nil)
}

// approvalRun starts an execution and asks for the approval tool; it skips
// when no approval tool is configured or the policy does not gate it.
func (t *tc) approvalRun() (*run, string) {
	r, step, why := t.tryApproval()
	if r == nil {
		t.skipf("%s", why)
	}
	return r, step
}

// tryApproval is approvalRun for checks that go on without an approval:
// it returns a nil run and the reason instead of skipping.
func (t *tc) tryApproval() (*run, string, string) {
	if t.o.ApprovalTool == "" {
		return nil, "", "needs a tool the server's policy sends to approval: pass --approval-tool"
	}
	a := t.newAgent()
	r := a.start(nil)
	resp := r.intent(map[string]any{"type": "invoke_tool", "tool_id": t.o.ApprovalTool, "arguments": map[string]any{"target": "prod"}})
	o := t.expectJSON(resp, http.StatusOK)
	if ok, _ := o.boolean("accepted"); !ok {
		t.fatalf("approval tool %q not accepted: %s", t.o.ApprovalTool, resp)
	}
	step := t.wantStr(o, "step_id", "require_approval answer")
	if pa, _ := o.boolean("pending_approval"); !pa {
		r.complete(nil)
		return nil, "", fmt.Sprintf("the server's policy does not require approval for %q (no pending_approval in %s)", t.o.ApprovalTool, resp)
	}
	return r, step, ""
}

func checkPolicyApproval(t *tc) {
	r, step := t.approvalRun()
	t.wantStatus(r.id, "blocked")
	evs := t.events(r.id)
	t.one(evs, "step.created", step)
	ar := t.one(evs, "step.approval_required", step).payload()
	t.wantEq("step.approval_required tool_id", t.wantStr(ar, "tool_id", "step.approval_required"), t.o.ApprovalTool)
	t.wantJSON("step.approval_required arguments", ar["arguments"], map[string]any{"target": "prod"})
	bl := ofType(evs, "execution.blocked", "")
	if len(bl) != 1 {
		t.fatalf("want one execution.blocked, log: %s", typesOf(evs))
	}
	bp := bl[0].payload()
	t.wantEq("execution.blocked reason", t.wantStr(bp, "reason", "execution.blocked"), "approval")
	t.wantEq("execution.blocked ref", t.wantStr(bp, "ref", "execution.blocked"), step)
	t.expectError(r.intent(map[string]any{"type": "invoke_tool", "tool_id": newID("conformance.tool.")}), http.StatusConflict, "CONFLICT")

	sig := "/v0/executions/" + r.id + "/signal"
	t.expectError(t.call(http.MethodPost, sig, map[string]any{"signal_type": "step.approve", "payload": map[string]any{"step_id": uuidLike(), "approved": true}}), http.StatusBadRequest, "VALIDATION_ERROR")
	t.expectError(t.call(http.MethodPost, sig, map[string]any{"signal_type": "step.approve", "payload": "yes please"}), http.StatusBadRequest, "VALIDATION_ERROR")
	t.wantStatus(r.id, "blocked")

	t.signal(r.id, "step.approve", map[string]any{"step_id": step, "approved": true})
	t.waitStatus(r.id, "running")
	evs = t.events(r.id)
	res := ofType(evs, "execution.resumed", "")
	if len(res) != 1 || t.wantStr(res[0].payload(), "reason", "execution.resumed") != "approval granted" {
		t.fatalf(`want one execution.resumed "approval granted", log: %s`, typesOf(evs))
	}
	ap := r.push("approval.resolved", step)
	t.wantJSON("approval.resolved approved", ap["approved"], true)
	r.signalPush("step.approve")
	t.expectOK(r.stepResult(step, true, map[string]any{"deployed": true}, ""))
	r.push("tool.result", step)
	r.complete(nil)
}

func checkPolicyApprovalDeny(t *tc) {
	r, step := t.approvalRun()
	t.signal(r.id, "step.approve", map[string]any{"step_id": step, "approved": false, "reason": "not today"})
	t.waitStatus(r.id, "running")
	evs := t.events(r.id)
	t.stepFailed(evs, step, "not today", false)
	res := ofType(evs, "execution.resumed", "")
	if len(res) != 1 || t.wantStr(res[0].payload(), "reason", "execution.resumed") != "approval denied" {
		t.fatalf(`want one execution.resumed "approval denied", log: %s`, typesOf(evs))
	}
	ap := r.push("approval.resolved", step)
	t.wantJSON("approval.resolved approved", ap["approved"], false)
	r.push("signal.received", "")
	r.a.s.absent(t, 300*time.Millisecond, "tool.result for a denied approval", func(f frame) bool {
		s, _ := f.json().str("step_id")
		return f.event == "tool.result" && s == step
	})
	r.complete(nil)
}

func checkStepResult(t *tc) {
	a := t.newAgent()
	r := a.start(nil)
	step := r.invoke(newID("conformance.tool."), nil, false)
	post := func(body any) *response { return t.call(http.MethodPost, "/v0/agents/step-result", body) }
	t.expectError(post(map[string]any{"execution_id": r.id}), http.StatusBadRequest, "VALIDATION_ERROR")
	t.expectError(post(rawBody(`{"execution_id":`)), http.StatusBadRequest, "VALIDATION_ERROR")
	t.expectError(r.stepResult(uuidLike(), true, nil, ""), http.StatusNotFound, "NOT_FOUND")
	t.expectError(post(map[string]any{"execution_id": r.id, "session_id": uuidLike(), "step_id": step, "success": true}), http.StatusUnauthorized, "UNAUTHORIZED")

	data := map[string]any{"v": 1}
	t.expectOK(r.stepResult(step, true, data, ""))
	n := len(t.events(r.id))
	t.expectOK(r.stepResult(step, true, data, ""))
	if got := len(t.events(r.id)); got != n {
		t.fatalf("an identical retried step-result wrote %d new events", got-n)
	}
	t.wantRecorded(r.stepResult(step, false, nil, "different"), "succeeded", data)
	t.wantRecorded(r.stepResult(step, true, map[string]any{"v": 2}, ""), "succeeded", data)
	r.complete(nil)
}

// wantRecorded checks a 409 for a resolved step whose details carry the
// recorded outcome.
func (t *tc) wantRecorded(r *response, status string, result any) {
	o := t.expectError(r, http.StatusConflict, "CONFLICT")
	rec := o.sub("details").sub("recorded")
	if rec == nil {
		t.fatalf("409 for a resolved step lacks details.recorded: %s", r)
	}
	t.wantEq("details.recorded.status", t.wantStr(rec, "status", "details.recorded"), status)
	if result != nil {
		t.wantJSON("details.recorded.result", rec["result"], result)
	}
}

func checkRunnerStreamParams(t *tc) { checkStreamParams(t, "runner") }

func checkRunnerStarted(t *tc) {
	rn, r, step := t.remoteStep(nil)
	job := rn.job(step)
	path := "/v0/runners/steps/" + step + "/started"
	t.expectError(t.call(http.MethodPost, path, map[string]any{}), http.StatusBadRequest, "VALIDATION_ERROR")
	t.expectError(t.call(http.MethodPost, path, map[string]any{"execution_id": r.id}), http.StatusBadRequest, "VALIDATION_ERROR")
	t.expectError(t.call(http.MethodPost, "/v0/runners/steps/"+uuidLike()+"/started", map[string]any{"execution_id": r.id, "runner_id": rn.id}), http.StatusNotFound, "NOT_FOUND")
	t.expectOK(t.call(http.MethodPost, path, map[string]any{"execution_id": r.id, "runner_id": rn.id}))
	t.one(t.events(r.id), "step.started", step)
	t.expectOK(rn.result(job, true, nil, "", false))
	n := len(t.events(r.id))
	t.expectOK(t.call(http.MethodPost, path, map[string]any{"execution_id": r.id, "runner_id": rn.id}))
	if got := len(t.events(r.id)); got != n {
		t.fatalf("started for a finished step wrote %d events, want a no-op", got-n)
	}
	r.complete(nil)
}

func checkRunnerResults(t *tc) {
	rn, r, step := t.remoteStep(nil)
	job := rn.job(step)
	path := "/v0/runners/" + rn.id + "/results"
	t.expectError(t.call(http.MethodPost, path, map[string]any{"execution_id": r.id, "step_id": step, "success": true}), http.StatusBadRequest, "VALIDATION_ERROR")
	t.expectError(t.call(http.MethodPost, path, rawBody(`{"job_id":`)), http.StatusBadRequest, "VALIDATION_ERROR")
	jobID, _ := job.str("id")
	t.expectError(t.call(http.MethodPost, path, map[string]any{"job_id": jobID, "execution_id": r.id, "step_id": uuidLike(), "success": true}), http.StatusNotFound, "NOT_FOUND")
	data := map[string]any{"rows": 3}
	t.expectOK(rn.result(job, true, data, "", false))
	n := len(t.events(r.id))
	t.expectOK(rn.result(job, true, data, "", false))
	if got := len(t.events(r.id)); got != n {
		t.fatalf("an identical retried result wrote %d new events", got-n)
	}
	t.wantRecorded(rn.result(job, false, nil, "late failure", false), "succeeded", data)
	r.complete(nil)
}

func checkRunnerRetry(t *tc) {
	rn, r, step := t.remoteStep(map[string]any{"try": true})
	job1 := rn.job(step)
	t.expectOK(rn.result(job1, false, nil, "flaky", true))
	evs := t.events(r.id)
	t.stepFailed(evs, step, "flaky", true)
	t.wantJSON("step.retried next_attempt", t.one(evs, "step.retried", step).payload()["next_attempt"], 2)
	job2 := rn.job(step)
	t.wantJSON("retried job attempt", job2["attempt"], 2)
	id1, _ := job1.str("id")
	if id2, _ := job2.str("id"); id2 == id1 {
		t.fatalf("the retry reuses job id %s; each attempt is a new job (wire-facts §7.5)", id1)
	}
	t.wantJSON("retried job arguments", job2["arguments"], map[string]any{"try": true})
	t.expectOK(rn.result(job2, true, map[string]any{"ok": 1}, "", false))
	r.toolResult(step, "succeeded")
	r.complete(nil)
}

func checkRunnerFinalFailure(t *tc) {
	rn, r, step := t.remoteStep(nil)
	job := rn.job(step)
	t.expectOK(rn.result(job, false, nil, "fatal", false))
	evs := t.events(r.id)
	t.stepFailed(evs, step, "fatal", false)
	if len(ofType(evs, "step.retried", step)) != 0 {
		t.fatalf("a non-retryable failure was retried")
	}
	r.toolFailed(step, "fatal")
	r.complete(nil)
}

func checkRunnerCapabilities(t *tc) {
	tool := newID("conformance.remote.")
	rn := t.newRunner()
	a := t.newAgent()
	r := a.start(nil)
	step := r.invoke(tool, nil, true)
	rn.s.absent(t, 300*time.Millisecond, "a job for a tool the runner did not announce", func(f frame) bool { return f.event == "job.assigned" })
	path := "/v0/runners/" + rn.id + "/capabilities"
	t.expectError(t.call(http.MethodPost, path, rawBody(`{"tools":`)), http.StatusBadRequest, "VALIDATION_ERROR")
	t.expectOK(t.call(http.MethodPost, path, map[string]any{"tools": []string{tool}}))
	job := rn.job(step)
	t.expectOK(rn.result(job, true, nil, "", false))
	r.complete(nil)
}

func checkRunnerDelete(t *tc) {
	r := t.call(http.MethodDelete, "/v0/runners/"+newID("conf-runner-"), nil)
	t.expect(r, http.StatusNoContent)
	if len(r.body) != 0 {
		t.fatalf("204 with a body: %s", r)
	}
	held, run, step := t.remoteStep(nil)
	first := held.job(step)
	spare := t.newRunner(held.caps[0])
	t.expect(t.call(http.MethodDelete, "/v0/runners/"+held.id, nil), http.StatusNoContent)
	if !held.s.waitEnd(t, 5*time.Second) {
		t.fatalf("DELETE /v0/runners/%s left the runner's stream open", held.id)
	}
	again := spare.job(step)
	id1, _ := first.str("id")
	if id2, _ := again.str("id"); id2 == id1 {
		t.fatalf("the re-queued job kept the deleted runner's job id %s", id1)
	}
	t.expectOK(spare.result(again, true, nil, "", false))
	run.push("tool.result", step)
	run.complete(nil)
}

func checkRunnerDispatchIdle(t *tc) {
	tool := newID("conformance.remote.")
	r1 := t.newRunner(tool)
	r2 := t.newRunner(tool)
	a := t.newAgent()
	r := a.start(nil)
	r.invoke(tool, map[string]any{"n": 1}, true)
	r.invoke(tool, map[string]any{"n": 2}, true)
	isJob := func(f frame) bool { return f.event == "job.assigned" }
	j1 := r1.s.next(t, "a job on the first idle runner", isJob).json()
	j2 := r2.s.next(t, "a job on the second idle runner", isJob).json()
	s1, _ := j1.str("step_id")
	s2, _ := j2.str("step_id")
	if s1 == s2 {
		t.fatalf("both runners got step %s", s1)
	}
	t.expectOK(r1.result(j1, true, nil, "", false))
	t.expectOK(r2.result(j2, true, nil, "", false))
	r.complete(nil)
}

// assignedOn waits until one of the agents' streams carries the
// execution.assigned push of an execution and returns that agent's index.
func (t *tc) assignedOn(agents []*agent, execID string) int {
	match := func(f frame) bool {
		id, _ := f.json().str("execution_id")
		return f.event == "execution.assigned" && id == execID
	}
	for {
		for i, a := range agents {
			ctx, cancel := t.within(20 * time.Millisecond)
			_, ok := a.s.poll(ctx, match)
			cancel()
			if ok {
				return i
			}
		}
		if t.ctx.Err() != nil {
			t.fatalf("execution %s was assigned to none of the agent's consumers", execID)
		}
	}
}

func checkAgentRoundRobin(t *tc) {
	first := t.newAgent()
	second := &agent{t: t, id: first.id, consumer: newID("conf-consumer-")}
	second.connect()
	agents := []*agent{first, second}
	got := make([]int, len(agents))
	for i := 0; i < 4; i++ {
		id, _ := t.create(map[string]any{"agent_id": first.id}).str("id")
		got[t.assignedOn(agents, id)]++
	}
	if got[0] == 0 || got[1] == 0 {
		t.fatalf("4 executions of one agent with 2 online consumers were assigned %v; every consumer must get work", got)
	}
}

func checkRunnerBusyRelease(t *tc) {
	rn, r, s1 := t.remoteStep(map[string]any{"n": 1})
	s2 := r.invoke(rn.caps[0], map[string]any{"n": 2}, true)
	first := rn.s.next(t, "the first job", func(f frame) bool { return f.event == "job.assigned" }).json()
	rn.s.absent(t, 500*time.Millisecond, "a second job while the runner is busy", func(f frame) bool { return f.event == "job.assigned" })
	t.expectOK(rn.result(first, true, nil, "", false))
	firstStep, _ := first.str("step_id")
	next := s2
	if firstStep == s2 {
		next = s1
	}
	second := rn.job(next)
	t.expectOK(rn.result(second, true, nil, "", false))
	r.complete(nil)
}

func checkConsumerTakeover(t *tc) {
	a := t.newAgent()
	r := a.start(nil)
	step := r.invoke(newID("conformance.tool."), nil, false)
	old := a.s
	a.connect()
	if !old.waitEnd(t, 5*time.Second) {
		t.fatalf("the old stream of consumer %s stayed open after a reconnect with the same consumer_id", a.consumer)
	}
	t.expectOK(r.stepResult(step, true, map[string]any{"v": 1}, ""))
	push := r.push("tool.result", step)
	t.wantJSON("tool.result on the new connection", push["result"], map[string]any{"v": 1})
	r.complete(nil)
}

func checkMetrics(t *tc) {
	r := t.call(http.MethodGet, "/metrics", nil)
	t.expect(r, http.StatusOK)
	ct := r.header.Get("Content-Type")
	if !strings.HasPrefix(ct, "text/plain") && !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.fatalf("/metrics Content-Type %q, want text/plain (Prometheus text format)", ct)
	}
	if err := checkExposition(string(r.body)); err != "" {
		t.fatalf("/metrics: %s", err)
	}
}
