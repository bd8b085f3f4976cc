package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// event is one event of an execution's log, as the events endpoint and the
// execution stream render it.
type event struct {
	ID             string          `json:"id"`
	EventID        string          `json:"event_id"`
	ExecutionID    string          `json:"execution_id"`
	StepID         string          `json:"step_id"`
	Type           string          `json:"type"`
	SchemaVersion  int             `json:"schema_version"`
	Timestamp      string          `json:"timestamp"`
	Payload        json.RawMessage `json:"payload"`
	CausationID    string          `json:"causation_id"`
	CorrelationID  string          `json:"correlation_id"`
	IdempotencyKey string          `json:"idempotency_key"`
	Sequence       uint64          `json:"sequence"`

	raw json.RawMessage
}

// payload decodes the payload as an object.
func (e event) payload() obj {
	var o obj
	_ = json.Unmarshal(e.Payload, &o)
	return o
}

// eventPage is the events endpoint's answer.
type eventPage struct {
	Events         []json.RawMessage `json:"events"`
	LatestSequence *uint64           `json:"latest_sequence"`
}

// eventsPage reads one page of an execution's events.
func (t *tc) eventsPage(execID, query string) (eventPage, []event, *response) {
	r := t.call(http.MethodGet, "/v0/executions/"+execID+"/events"+query, nil)
	t.expectJSON(r, http.StatusOK)
	var p eventPage
	t.decode(r, &p)
	if p.Events == nil {
		t.fatalf(`"events" is null or absent, want an array: %s`, r)
	}
	if p.LatestSequence == nil {
		t.fatalf(`"latest_sequence" is absent: %s`, r)
	}
	evs := make([]event, len(p.Events))
	for i, raw := range p.Events {
		if err := json.Unmarshal(raw, &evs[i]); err != nil {
			t.fatalf("event %d is not an event object (%v): %s", i, err, raw)
		}
		evs[i].raw = raw
	}
	return p, evs, r
}

// events reads an execution's whole log.
func (t *tc) events(execID string) []event {
	var all []event
	var after uint64
	for {
		_, evs, _ := t.eventsPage(execID, "?limit=1000&after_sequence="+strconv.FormatUint(after, 10))
		if len(evs) == 0 {
			return all
		}
		all = append(all, evs...)
		after = evs[len(evs)-1].Sequence
		if len(all) > 100000 {
			t.fatalf("execution %s: more than 100000 events, or paging does not advance", execID)
		}
	}
}

// ofType returns the events of a type (and step, when stepID is not "").
func ofType(evs []event, typ, stepID string) []event {
	var out []event
	for _, e := range evs {
		if e.Type == typ && (stepID == "" || e.StepID == stepID) {
			out = append(out, e)
		}
	}
	return out
}

// one returns the single event of a type (and step) or fails the check.
func (t *tc) one(evs []event, typ, stepID string) event {
	got := ofType(evs, typ, stepID)
	if len(got) != 1 {
		t.fatalf("want exactly one %s event%s, got %d (log: %s)", typ, forStep(stepID), len(got), typesOf(evs))
	}
	return got[0]
}

func forStep(stepID string) string {
	if stepID == "" {
		return ""
	}
	return " for step " + stepID
}

// typesOf lists event types, for messages.
func typesOf(evs []event) string {
	var b strings.Builder
	for i, e := range evs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d:%s", e.Sequence, e.Type)
	}
	return b.String()
}

// waitEvent polls the log until an event satisfies match.
func (t *tc) waitEvent(execID, what string, match func(event) bool) (event, []event) {
	for {
		evs := t.events(execID)
		for _, e := range evs {
			if match(e) {
				return e, evs
			}
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-t.ctx.Done():
			t.fatalf("execution %s: timed out waiting for %s (log: %s)", execID, what, typesOf(evs))
		}
	}
}

// execution reads an execution.
func (t *tc) execution(id string) obj {
	return t.expectJSON(t.call(http.MethodGet, "/v0/executions/"+id, nil), http.StatusOK)
}

// status reads an execution's status.
func (t *tc) status(id string) string {
	return t.wantStr(t.execution(id), "status", "execution "+id)
}

// wantStatus fails unless the execution has the status now.
func (t *tc) wantStatus(id, want string) {
	if got := t.status(id); got != want {
		t.fatalf("execution %s: status %q, want %q", id, got, want)
	}
}

// waitStatus polls until the execution has the status.
func (t *tc) waitStatus(id, want string) {
	last := ""
	for {
		if last = t.status(id); last == want {
			return
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-t.ctx.Done():
			t.fatalf("execution %s: timed out waiting for status %q (still %q)", id, want, last)
		}
	}
}

// create creates an execution and returns the 201 body. The execution is
// cancelled when the check ends if it is still live, so a shared server is
// left clean.
func (t *tc) create(body map[string]any) obj {
	o := t.expectJSON(t.call(http.MethodPost, "/v0/executions", body), http.StatusCreated)
	id := t.wantStr(o, "id", "created execution")
	if id == "" {
		t.fatalf("created execution has an empty id")
	}
	t.cleanup(func(ctx context.Context) { t.cancelQuietly(ctx, id) })
	return o
}

// cancelQuietly cancels an execution, ignoring every outcome: it is cleanup.
func (t *tc) cancelQuietly(ctx context.Context, id string) {
	t.quietly(ctx, http.MethodPost, "/v0/executions/"+id+"/cancel")
}

// quietly sends a request without a body and ignores every outcome: cleanup
// runs after the check has ended, when there is nothing left to fail.
func (t *tc) quietly(ctx context.Context, method, path string) {
	req, err := http.NewRequestWithContext(ctx, method, t.o.URL+path, nil)
	if err != nil {
		return
	}
	if t.o.Token != "" {
		req.Header.Set("Authorization", "Bearer "+t.o.Token)
	}
	if resp, err := t.o.HTTPClient.Do(req); err == nil {
		resp.Body.Close()
	}
}

// signal sends a signal and expects 200 {"status":"ok"}.
func (t *tc) signal(execID, typ string, payload any) {
	body := map[string]any{"signal_type": typ}
	if payload != nil {
		body["payload"] = payload
	}
	t.expectOK(t.call(http.MethodPost, "/v0/executions/"+execID+"/signal", body))
}

// expectOK fails unless the answer is 200 {"status":"ok"}.
func (t *tc) expectOK(r *response) {
	o := t.expectJSON(r, http.StatusOK)
	if s, _ := o.str("status"); s != "ok" {
		t.fatalf(`want {"status":"ok"}: %s`, r)
	}
}

// agent is the suite acting as an agent process: one SSE connection under
// an agent id and consumer id of its own.
type agent struct {
	t        *tc
	id       string
	consumer string
	extra    url.Values // further stream query parameters, such as ack=explicit
	s        *stream
}

// newAgent connects a fresh agent.
func (t *tc) newAgent() *agent {
	a := &agent{t: t, id: newID("conf-agent-"), consumer: newID("conf-consumer-")}
	a.connect()
	return a
}

// connect opens (or reopens) the agent's stream and waits for its first
// frame, which the server sends once the connection is registered.
func (a *agent) connect(opts ...reqOpt) {
	a.s = a.t.mustStream(a.path(), opts...)
	a.s.started(a.t)
}

func (a *agent) path() string {
	v := url.Values{"agent_id": {a.id}, "consumer_id": {a.consumer}}
	for k, vs := range a.extra {
		v[k] = vs
	}
	return "/v0/agents/stream?" + v.Encode()
}

// run is an execution held by an agent.
type run struct {
	a       *agent
	id      string
	session string
}

// start creates an execution for the agent and waits for its assignment.
func (a *agent) start(input any) *run {
	body := map[string]any{"agent_id": a.id}
	if input != nil {
		body["input"] = input
	}
	return a.startWith(body)
}

// startWith creates an execution from body (agent_id is set) and waits for
// its assignment.
func (a *agent) startWith(body map[string]any) *run {
	body["agent_id"] = a.id
	o := a.t.create(body)
	id, _ := o.str("id")
	r := &run{a: a, id: id}
	_, assigned := a.s.nextEvent(a.t, "execution.assigned", func(p obj) bool {
		s, _ := p.str("execution_id")
		return s == id
	})
	r.session = a.t.wantStr(assigned, "session_id", "execution.assigned")
	if r.session == "" {
		a.t.fatalf("execution.assigned for %s has an empty session_id", id)
	}
	return r
}

// intent posts an intent and returns the raw answer.
func (r *run) intent(in map[string]any, opts ...reqOpt) *response {
	return r.a.t.call(http.MethodPost, "/v0/agents/intent", map[string]any{
		"execution_id": r.id, "session_id": r.session, "intent": in,
	}, opts...)
}

// accepted posts an intent and requires 200 {"accepted": true}.
func (r *run) accepted(in map[string]any) obj {
	resp := r.intent(in)
	o := r.a.t.expectJSON(resp, http.StatusOK)
	if ok, _ := o.boolean("accepted"); !ok {
		if tool, isTool := in["tool_id"].(string); isTool {
			r.a.t.needAllowed(tool, resp)
		}
		r.a.t.fatalf("intent %v not accepted: %s", in["type"], resp)
	}
	return o
}

// invoke asks for a tool call and returns the step id.
func (r *run) invoke(tool string, args any, remote bool) string {
	in := map[string]any{"type": "invoke_tool", "tool_id": tool, "remote": remote}
	if args != nil {
		in["arguments"] = args
	}
	o := r.accepted(in)
	step, _ := o.str("step_id")
	if step == "" {
		r.a.t.fatalf("accepted invoke_tool has no step_id: %s", show(o))
	}
	return step
}

// complete finishes the execution with output.
func (r *run) complete(output any) {
	in := map[string]any{"type": "complete"}
	if output != nil {
		in["output"] = output
	}
	r.accepted(in)
}

// stepResult posts a local tool's outcome.
func (r *run) stepResult(step string, success bool, data any, errText string, opts ...reqOpt) *response {
	body := map[string]any{"execution_id": r.id, "session_id": r.session, "step_id": step, "success": success}
	if data != nil {
		body["data"] = data
	}
	if errText != "" {
		body["error"] = errText
	}
	return r.a.t.call(http.MethodPost, "/v0/agents/step-result", body, opts...)
}

// push waits for an agent push of the type about this execution (and step,
// when stepID is not "").
func (r *run) push(typ, stepID string) obj {
	f := r.a.s.next(r.a.t, typ+" for execution "+r.id+forStep(stepID), func(f frame) bool {
		if f.event != typ {
			return false
		}
		p := f.json()
		e, _ := p.str("execution_id")
		s, _ := p.str("step_id")
		return e == r.id && (stepID == "" || s == stepID)
	})
	return f.json()
}

// stepFailed checks the single step.failed event of a step in evs.
func (t *tc) stepFailed(evs []event, step, errText string, retryable bool) {
	p := t.one(evs, "step.failed", step).payload()
	t.wantEq("step.failed error", t.wantStr(p, "error", "step.failed"), errText)
	t.wantJSON("step.failed retryable", p["retryable"], retryable)
}

// toolResult waits for the tool.result push of a step and checks its status.
func (r *run) toolResult(step, status string) obj {
	p := r.push("tool.result", step)
	r.a.t.wantEq("tool.result status", r.a.t.wantStr(p, "status", "tool.result"), status)
	return p
}

// toolFailed waits for the tool.result push of a failed step and checks its
// error.
func (r *run) toolFailed(step, errText string) {
	p := r.toolResult(step, "failed")
	r.a.t.wantEq("tool.result error", r.a.t.wantStr(p, "error", "tool.result"), errText)
}

// signalPush waits for a signal.received push about this execution and
// checks its signal_type.
func (r *run) signalPush(typ string) obj {
	p := r.push("signal.received", "")
	r.a.t.wantEq("signal.received signal_type", r.a.t.wantStr(p, "signal_type", "signal.received push"), typ)
	return p
}

// runner is the suite acting as a tool runner.
type runner struct {
	t        *tc
	id       string
	consumer string
	caps     []string
	s        *stream
}

// newRunner connects a fresh runner able to run the tools.
func (t *tc) newRunner(caps ...string) *runner {
	r := &runner{t: t, id: newID("conf-runner-"), consumer: newID("conf-consumer-"), caps: caps}
	r.connect()
	t.cleanup(func(ctx context.Context) { t.quietly(ctx, http.MethodDelete, "/v0/runners/"+r.id) })
	return r
}

// connect opens (or reopens) the runner's stream and waits for its first
// frame.
func (r *runner) connect(opts ...reqOpt) {
	r.s = r.t.mustStream(r.path(), opts...)
	r.s.started(r.t)
}

func (r *runner) path() string {
	v := url.Values{"runner_id": {r.id}, "consumer_id": {r.consumer}}
	if len(r.caps) > 0 {
		v.Set("capabilities", strings.Join(r.caps, ","))
	}
	return "/v0/runners/stream?" + v.Encode()
}

// job waits for the job.assigned push of a step.
func (r *runner) job(stepID string) obj {
	_, p := r.s.nextEvent(r.t, "job.assigned", func(p obj) bool {
		s, _ := p.str("step_id")
		return s == stepID
	})
	return p
}

// result posts a job's outcome, as observed runners do: without
// consumer_id, started_at or completed_at.
func (r *runner) result(job obj, success bool, data any, errText string, retryable bool, opts ...reqOpt) *response {
	body := map[string]any{"success": success}
	for _, k := range []string{"execution_id", "step_id"} {
		body[k], _ = job.str(k)
	}
	body["job_id"], _ = job.str("id")
	if data != nil {
		body["data"] = data
	}
	if errText != "" {
		body["error"] = errText
		body["retryable"] = retryable
	}
	return r.t.call(http.MethodPost, "/v0/runners/"+url.PathEscape(r.id)+"/results", body, opts...)
}

// remoteStep starts an execution on a fresh agent whose first step invokes,
// with args, a fresh remote tool that one fresh runner offers (the tool is
// the runner's caps[0]). It returns the runner, the execution and the step;
// the job is left for the caller to wait for.
func (t *tc) remoteStep(args any) (*runner, *run, string) {
	rn := t.newRunner(newID("conformance.remote."))
	r := t.newAgent().start(nil)
	return rn, r, r.invoke(rn.caps[0], args, true)
}

// routeMissing reports whether the server has no route for method and path:
// it answers 404, or 405 when the path exists for other methods only. A
// built route answers something else (200, 400, 426...). POSTs send an
// empty object, which a built route refuses with a 400.
func (t *tc) routeMissing(method, path string) bool {
	var body any
	if method == http.MethodPost {
		body = map[string]any{}
	}
	st := t.call(method, path, body).status
	return st == http.StatusNotFound || st == http.StatusMethodNotAllowed
}
