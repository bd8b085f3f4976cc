package conformance

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// The checks every mount answers alike: its errors in its own JSON
// envelope, and resumable streams whose every event has an id of its own.

// envelope is a mount's JSON error shape.
type envelope int

const (
	// kernelEnvelope is {"error", "code", "details"?}: /v0, /agent-runtime
	// and /aap/v1.
	kernelEnvelope envelope = iota
	// runtimeEnvelope is {"error", "details": {"code"}}: /runtime/v1.
	runtimeEnvelope
)

// wantErrorEnvelope checks an error answer: its status, a JSON object in the
// mount's envelope with a non-empty one-line sentence and code.
func (t *tc) wantErrorEnvelope(r *response, shape envelope, status int, code string) {
	if r.status != status || !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
		t.fatalf("want %d with a JSON body, got Content-Type %q: %s", status, r.header.Get("Content-Type"), r)
	}
	o := t.object(r)
	msg, _ := o.str("error")
	if msg == "" || strings.ContainsAny(msg, "\r\n") {
		t.fatalf(`want a one-line sentence in "error": %s`, r)
	}
	got := ""
	switch shape {
	case kernelEnvelope:
		got, _ = o.str("code")
	case runtimeEnvelope:
		if o.has("code") {
			t.fatalf("the Runtime API's error has its code in details, not beside the sentence: %s", r)
		}
		got, _ = o.sub("details").str("code")
	}
	if got != code {
		t.fatalf("code %q, want %s: %s", got, code, r)
	}
}

// wantRouterEnvelope checks the router's misses under a mount: a path
// nothing is served at is 404 NOT_FOUND, and getOnly, a path served for
// GET only, answers DELETE with 405 METHOD_NOT_ALLOWED naming GET in Allow,
// both in the mount's envelope.
func (t *tc) wantRouterEnvelope(mount, getOnly string, shape envelope) {
	t.wantErrorEnvelope(t.call(http.MethodGet, mount+"/"+newID("no-such-route-")+"/x", nil), shape, http.StatusNotFound, "NOT_FOUND")
	r := t.call(http.MethodDelete, getOnly, nil)
	t.wantErrorEnvelope(r, shape, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED")
	if allow := r.header.Get("Allow"); !strings.Contains(allow, http.MethodGet) {
		t.fatalf("405 Allow header %q, want GET listed", allow)
	}
}

func checkEnvelopeV0(t *tc) {
	t.wantRouterEnvelope("/v0", "/v0/health", kernelEnvelope)
	// A path under no mount is answered as /v0 answers.
	t.wantErrorEnvelope(t.call(http.MethodGet, "/"+newID("no-mount-"), nil), kernelEnvelope, http.StatusNotFound, "NOT_FOUND")
}

func checkEnvelopeAgentRuntime(t *tc) {
	if t.routeMissing(http.MethodGet, "/agent-runtime/sessions") {
		t.skipf("the gateway serves no /agent-runtime surface")
	}
	t.wantRouterEnvelope("/agent-runtime", "/agent-runtime/sessions/"+newID("s-"), kernelEnvelope)
}

func checkEnvelopeAAP(t *tc) {
	if t.routeMissing(http.MethodGet, aap+"/meta") {
		t.skipf("the gateway serves no /aap/v1 surface")
	}
	t.wantRouterEnvelope(aap, aap+"/meta", kernelEnvelope)
}

func checkEnvelopeRuntime(t *tc) {
	t.rtRequire()
	t.wantRouterEnvelope(rt, rt+"/capabilities", runtimeEnvelope)
}

// wantUniqueIDs checks that every event frame of a stream has an id and
// that no two frames share one.
func (t *tc) wantUniqueIDs(what string, frames []frame) {
	seen := map[string]string{}
	for _, f := range frames {
		if !f.isEvent() {
			continue
		}
		if !f.hasID || f.id == "" {
			t.fatalf("%s: event %s has no id", what, f.event)
		}
		if prev, dup := seen[f.id]; dup {
			t.fatalf("%s: events %s and %s share id %s", what, prev, f.event, f.id)
		}
		seen[f.id] = f.event
	}
}

func checkUniqueIDsV0(t *tc) {
	r, _ := t.longRun()
	t.wantUniqueIDs("the execution stream", t.mustStream("/v0/executions/"+r.id+"/stream").readAll(t, 5*time.Second))
	// The agent's own stream: the run's deliveries so far.
	t.wantUniqueIDs("the agent stream", r.a.s.all())
}

func checkUniqueIDsAgentRuntime(t *tc) {
	id := t.arSession()
	n := len(t.arEvents(id, "?limit=1000"))
	s := t.mustStream("/agent-runtime/sessions/"+id+"/events", header("Accept", "text/event-stream"))
	defer s.close()
	var frames []frame
	for range n {
		frames = append(frames, s.next(t, "the session's next event", func(f frame) bool { return f.isEvent() }))
	}
	t.wantUniqueIDs("the session's event stream", frames)
}

func checkUniqueIDsRuntime(t *tc) {
	t.rtRequire()
	o := t.rtInvoke("memory_ls", map[string]any{"input": map[string]any{"prefix": "/conformance/"}})
	exec := t.wantStr(o, "executionId", "the invocation")
	t.wantUniqueIDs("the execution's event stream", t.mustStream(rt+"/executions/"+exec+"/events").readAll(t, 10*time.Second))
}

// checkUniqueIDsAAP: a PUT's delta stream (session_start, turn_start, the
// agent's thinking and text, turn_stop) has an id on every event, no two
// alike, and a resume from any of them gives exactly the events after it:
// from session_start, turn_start comes first.
func checkUniqueIDsAAP(t *tc) {
	a := t.aapAgent()
	call := t.aapStart(http.MethodPut, aap+"/session", map[string]any{"agent": map[string]any{"name": a.id}, "stream": "delta", "messages": userMessage("think, then count")})
	_, assigned := a.s.nextEvent(t, "execution.assigned", nil)
	r := &run{a: a, id: t.wantStr(assigned, "execution_id", "execution.assigned"), session: t.wantStr(assigned, "session_id", "execution.assigned")}
	say := func(kind, text string) {
		r.accepted(map[string]any{"type": "output", "output": map[string]any{"kind": kind, "text": text}})
	}
	say("reasoning", "the user wants a count")
	say("text_delta", "one ")
	say("text_delta", "two")
	say("text", "one two")
	r.complete(nil)
	status, body := call.wait(t)
	if status != http.StatusOK {
		t.fatalf("PUT /session (delta): %d %s", status, body)
	}
	evs := parseAAP(body)
	if len(evs) < 5 || evs[0].name != "session_start" || evs[1].name != "turn_start" {
		t.fatalf("the stream does not open with session_start and turn_start: %s", body)
	}
	seen := map[string]string{}
	for _, e := range evs {
		if e.id == "" {
			t.fatalf("event %s without an id: %s", e.name, body)
		}
		if prev, dup := seen[e.id]; dup {
			t.fatalf("events %s and %s share id %s", prev, e.name, e.id)
		}
		seen[e.id] = e.name
	}
	session, _ := evs[0].data.str("sessionId")
	for i, e := range evs[:len(evs)-1] {
		resp := t.call(http.MethodGet, aap+"/session/"+session+"/stream?stream=delta", nil, header("Last-Event-ID", e.id), header("Accept", "text/event-stream"))
		if resp.status != http.StatusOK {
			t.fatalf("resume after %s (%s): %s", e.id, e.name, resp)
		}
		if got, want := aapShow(parseAAP(resp.body)), aapShow(evs[i+1:]); got != want {
			t.fatalf("resumed after %s (%s):\n got %s\nwant %s", e.id, e.name, got, want)
		}
	}
}

// aapShow writes events for comparison: each one's id, name and data.
func aapShow(evs []aapEvent) string {
	var b strings.Builder
	for _, e := range evs {
		data, _ := json.Marshal(e.data)
		b.WriteString(e.id + " " + e.name + " " + string(data) + "\n")
	}
	return b.String()
}
