package agentruntime_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
	"github.com/gatehouse-dev/gatehouse/protocol/agentruntime"
	"github.com/gatehouse-dev/gatehouse/protocol/agentruntime/schema"
	"github.com/gatehouse-dev/gatehouse/stream/ssetest"
)

type obj = map[string]any

// validators compiles the standard's schemas with format assertions on,
// as a strict consumer does.
func validators(t *testing.T) (event, snapshot *jsonschema.Schema) {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	for id, data := range map[string][]byte{schema.EventID: schema.Event(), schema.SnapshotID: schema.Snapshot()} {
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.AddResource(id, doc); err != nil {
			t.Fatal(err)
		}
	}
	return c.MustCompile(schema.EventID), c.MustCompile(schema.SnapshotID)
}

func valid(t *testing.T, s *jsonschema.Schema, what string, data []byte) {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s is not JSON: %v", what, err)
	}
	if err := s.Validate(inst); err != nil {
		t.Fatalf("%s is not valid against the standard's schema: %v\n%s", what, err, data)
	}
}

// client talks to one server.
type client struct {
	t    testing.TB
	base string
}

func (c *client) do(method, path string, body any, hdr ...string) (int, []byte) {
	c.t.Helper()
	if body != nil {
		hdr = append([]string{"Content-Type", "application/json"}, hdr...)
	}
	status, data, _ := nodetest.Do(c.t, nil, method, c.base+path, body, hdr...)
	return status, data
}

func (c *client) json(method, path string, body any, want int) obj {
	c.t.Helper()
	status, data := c.do(method, path, body)
	return nodetest.Object(c.t, method, path, status, data, want)
}

func (c *client) command(name string, in obj, want int) obj {
	c.t.Helper()
	return c.json("POST", "/agent-runtime/commands/"+name, in, want)
}

// sse reads an event stream in the background.
type sse struct {
	events <-chan ssetest.Frame
	cancel context.CancelFunc
}

func (c *client) sse(path string, hdr ...string) *sse {
	c.t.Helper()
	ctx, cancel := context.WithCancel(c.t.Context())
	req, _ := http.NewRequestWithContext(ctx, "GET", c.base+path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		cancel()
		c.t.Fatalf("GET %s: %v %v", path, err, resp)
	}
	c.t.Cleanup(func() { cancel(); resp.Body.Close() })
	return &sse{events: ssetest.Stream(resp.Body, 1024), cancel: cancel}
}

func (s *sse) next(t testing.TB) ssetest.Frame {
	t.Helper()
	select {
	case e, ok := <-s.events:
		if !ok {
			t.Fatal("stream ended")
		}
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
	}
	return ssetest.Frame{}
}

// until reads events until one of type typ.
func (s *sse) until(t *testing.T, typ string) ssetest.Frame {
	t.Helper()
	for {
		if e := s.next(t); e.Event == typ {
			return e
		}
	}
}

const askPolicy = `rules:
  - id: ask
    priority: 1
    when: {tool_id: "ask.*"}
    then: {decision: require_approval}
default: {decision: allow}
`

// scenario runs a session through a turn that calls a remote tool, asks a
// person, streams text and ends, and a second turn queued behind it.
func scenario(t *testing.T) (*nodetest.Server, *client) {
	t.Helper()
	pol := policytest.Parse(t, askPolicy)
	s := nodetest.Start(t, node.Options{Policy: pol, Kernel: kernel.Options{AgentGrace: time.Minute}})
	c := &client{t: t, base: s.URL}
	agent := c.sse("/v0/agents/stream?agent_id=ar-agent&consumer_id=c1")
	runner := c.sse("/v0/runners/stream?runner_id=ar-runner&consumer_id=r1&capabilities=echo")
	c.json("POST", "/agent-runtime/sessions", obj{"sessionId": "s1", "agentId": "ar-agent", "title": "research"}, 201)
	first := c.command("submit_turn", obj{"session_id": "s1", "turn_id": "t1", "input": obj{"q": "papers"}}, 200)
	if first["status"] != "running" {
		t.Fatalf("first turn: %v", first)
	}
	if again := c.command("submit_turn", obj{"session_id": "s1", "turn_id": "t1", "input": obj{"q": "papers"}}, 200); again["turnId"] != "t1" {
		t.Fatalf("retried submit: %v", again)
	}
	// The first turn's start is filed when the agent takes it; wait for that
	// so the log's order is the one asserted below.
	var assigned obj
	_ = json.Unmarshal([]byte(agent.until(t, "execution.assigned").Data), &assigned)
	if second := c.command("submit_turn", obj{"session_id": "s1", "turn_id": "t2", "input": "next"}, 200); second["status"] != "queued" {
		t.Fatalf("second turn: %v", second)
	}
	exec, lease := assigned["execution_id"], assigned["session_id"]
	intent := func(in obj) obj {
		return c.json("POST", "/v0/agents/intent", obj{"execution_id": exec, "session_id": lease, "intent": in}, 200)
	}
	step := intent(obj{"type": "invoke_tool", "tool_id": "echo", "arguments": obj{"x": 1}, "remote": true})["step_id"]
	var job obj
	_ = json.Unmarshal([]byte(runner.until(t, "job.assigned").Data), &job)
	c.json("POST", "/v0/runners/ar-runner/results", obj{"job_id": job["id"], "execution_id": exec, "step_id": step, "success": true, "data": obj{"y": 2}}, 200)
	agent.until(t, "tool.result")
	asked := intent(obj{"type": "invoke_tool", "tool_id": "ask.human", "arguments": obj{"why": "sure?"}})["step_id"]
	snap := c.json("GET", "/agent-runtime/sessions/s1", nil, 200)
	actions := snap["threads"].([]any)[0].(obj)["actions"].([]any)
	if len(actions) != 1 || snap["threads"].([]any)[0].(obj)["waitingFor"] != "permission" {
		t.Fatalf("snapshot while asking: %v", snap["threads"])
	}
	action := actions[0].(obj)["actionId"].(string)
	c.command("respond_action", obj{"action_id": action, "decision": "allow_once"}, 200)
	late := c.command("respond_action", obj{"action_id": action, "decision": "deny"}, 409)
	if late["code"] != "CONFLICT" {
		t.Fatalf("a late answer: %v", late)
	}
	agent.until(t, "approval.resolved")
	c.json("POST", "/v0/agents/step-result", obj{"execution_id": exec, "session_id": lease, "step_id": asked, "success": true, "data": "yes"}, 200)
	agent.until(t, "tool.result")
	for _, d := range []string{"The ", "answer ", "is 42."} {
		intent(obj{"type": "output", "output": obj{"kind": "text_delta", "text": d}})
	}
	intent(obj{"type": "output", "output": obj{"kind": "text", "text": "The answer is 42."}})
	intent(obj{"type": "complete", "output": obj{"answer": 42}})
	// The queued turn starts; it stays running.
	_ = json.Unmarshal([]byte(agent.until(t, "execution.assigned").Data), &assigned)
	return s, c
}

func TestEventsSnapshotAndThreadValidateAgainstTheStandard(t *testing.T) {
	eventSchema, snapshotSchema := validators(t)
	_, c := scenario(t)
	status, data := c.do("GET", "/agent-runtime/sessions/s1/events?limit=1000", nil)
	if status != 200 {
		t.Fatalf("events: %d %s", status, data)
	}
	var page struct {
		Events []json.RawMessage `json:"events"`
		Next   string            `json:"next"`
	}
	if err := json.Unmarshal(data, &page); err != nil {
		t.Fatal(err)
	}
	var last uint64
	var types []string
	for i, e := range page.Events {
		valid(t, eventSchema, fmt.Sprintf("event %d", i), e)
		var env struct {
			Type     string `json:"type"`
			Sequence uint64 `json:"sequence"`
		}
		_ = json.Unmarshal(e, &env)
		if env.Sequence <= last {
			t.Fatalf("event %d: sequence %d after %d", i, env.Sequence, last)
		}
		last = env.Sequence
		types = append(types, env.Type)
	}
	joined := strings.Join(types, " ")
	for _, want := range []string{
		"session.created thread.started turn.submitted turn.started task.created",
		"tool.started job.started tool.result",
		"action.required permission.requested task.blocked",
		"permission.resolved tool.progress action.resolved",
		"model.delta model.delta model.delta model.completed",
		"task.completed turn.completed queue.changed turn.started task.created",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("events lack %q:\n%s", want, joined)
		}
	}
	_, snap := c.do("GET", "/agent-runtime/sessions/s1", nil)
	valid(t, snapshotSchema, "snapshot", snap)
	_, thread := c.do("GET", "/agent-runtime/sessions/s1/threads/main", nil)
	var th obj
	_ = json.Unmarshal(thread, &th)
	if th["status"] != "running" || th["activeTurnId"] != "t2" || th["lastOutcome"].(obj)["status"] != "completed" {
		t.Fatalf("thread read model: %s", thread)
	}
}

func TestStreamReplaysTailsAndResumes(t *testing.T) {
	_, c := scenario(t)
	_, data := c.do("GET", "/agent-runtime/sessions/s1/events?limit=1000", nil)
	var page struct{ Events []json.RawMessage }
	_ = json.Unmarshal(data, &page)
	st := c.sse("/agent-runtime/sessions/s1/events", "Accept", "text/event-stream")
	for i, want := range page.Events {
		got := st.next(t)
		if got.Data != string(want) {
			t.Fatalf("event %d: the stream says\n%s\nthe page says\n%s", i, got.Data, want)
		}
	}
	resumed := c.sse("/agent-runtime/sessions/s1/events", "Accept", "text/event-stream", "Last-Event-ID", "10")
	if got := resumed.next(t); !strings.Contains(got.Data, `"sequence":11,`) || got.ID != "11" {
		t.Fatalf("resumed after 10 with %v", got)
	}
	// The WebSocket twin: the same events, one per text message.
	ws, _, err := websocket.Dial(t.Context(), "ws"+strings.TrimPrefix(c.base, "http")+"/agent-runtime/sessions/s1/ws?after=2", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	ws.SetReadLimit(1 << 20)
	for i := 2; i < 6; i++ {
		_, msg, err := ws.Read(t.Context())
		if err != nil || string(msg) != string(page.Events[i]) {
			t.Fatalf("websocket message %d: %v\n%s\nwant\n%s", i, err, msg, page.Events[i])
		}
	}
	// The live tail: a new turn's submission reaches both.
	c.command("submit_turn", obj{"session_id": "s1", "turn_id": "t3", "input": "later"}, 200)
	if e := st.next(t); e.Event != "turn.submitted" {
		t.Fatalf("live event %v", e)
	}
}

func TestExportVerifiesAndRefolds(t *testing.T) {
	_, c := scenario(t)
	status, data := c.do("GET", "/agent-runtime/exports/s1", nil)
	if status != 200 {
		t.Fatalf("export: %d %s", status, data)
	}
	var x agentruntime.Export
	if err := json.Unmarshal(data, &x); err != nil {
		t.Fatal(err)
	}
	if err := agentruntime.Verify(&x); err != nil {
		t.Fatal(err)
	}
	// The gateway's own snapshot, folded without encoding, is the export's.
	var live, exported any
	_, snap := c.do("GET", "/agent-runtime/sessions/s1", nil)
	_ = json.Unmarshal(snap, &live)
	_ = json.Unmarshal(x.Snapshot, &exported)
	if fmt.Sprint(live) != fmt.Sprint(exported) {
		t.Fatalf("the live snapshot differs from the export's:\n%s\n%s", snap, x.Snapshot)
	}
	x.Events[3] = json.RawMessage(strings.Replace(string(x.Events[3]), `"sequence"`, `"sequence" `, 1))
	if err := agentruntime.Verify(&x); err == nil {
		t.Fatal("a changed event verified")
	}
}

func TestCommandsOfferedAndNot(t *testing.T) {
	_, c := scenario(t)
	if e := c.command("spawn_subagent", obj{}, 501); e["code"] != "NOT_IMPLEMENTED" || !strings.Contains(e["error"].(string), "spawn_subagent") {
		t.Fatalf("an unoffered standard command: %v", e)
	}
	if e := c.command("make_coffee", obj{}, 404); e["code"] != "UNKNOWN_COMMAND" {
		t.Fatalf("an unknown command: %v", e)
	}
	c.command("submit_turn", obj{"session_id": "s1", "turn_id": "t3", "input": 3}, 200)
	c.command("submit_turn", obj{"session_id": "s1", "turn_id": "t4", "input": 4}, 200)
	q := c.command("promote_queued_turn", obj{"session_id": "s1", "queued_turn_id": "t4"}, 200)
	if fmt.Sprint(q["queues"].(obj)["main"]) != "[t4 t3]" {
		t.Fatalf("after promote: %v", q)
	}
	q = c.command("remove_queued_turn", obj{"session_id": "s1", "queued_turn_id": "t3"}, 200)
	if fmt.Sprint(q["queues"].(obj)["main"]) != "[t4]" {
		t.Fatalf("after remove: %v", q)
	}
	tasks := c.command("list_tasks", obj{"session_id": "s1"}, 200)["tasks"].([]any)
	running := tasks[len(tasks)-1].(obj)["taskId"].(string)
	if got := c.command("cancel_task", obj{"task_id": running}, 200); got["status"] != "cancelled" {
		t.Fatalf("cancel_task: %v", got)
	}
	// The runner's echo, beside the built-in memory tools.
	if inv := c.command("get_tool_inventory", obj{}, 200)["tools"].([]any); len(inv) != 7 || inv[0].(obj)["name"] != "echo" {
		t.Fatalf("tool inventory: %v", inv)
	}
	if got := c.command("ack_events", obj{"session_id": "s1", "sequence": 5}, 200); got["acknowledged"] != 5.0 {
		t.Fatalf("ack_events: %v", got)
	}
	c.command("get_task", obj{"task_id": "nope"}, 404)
}

func TestSessionsSurviveARestart(t *testing.T) {
	s, c := scenario(t)
	_, before := c.do("GET", "/agent-runtime/exports/s1", nil)
	s.Restart()
	_, after := c.do("GET", "/agent-runtime/exports/s1", nil)
	var x, y agentruntime.Export
	_ = json.Unmarshal(before, &x)
	_ = json.Unmarshal(after, &y)
	if x.Digest != y.Digest || string(x.Snapshot) != string(y.Snapshot) {
		t.Fatalf("the export changed across a restart:\n%s\n%s", x.Snapshot, y.Snapshot)
	}
}

// TestInputRequestIsAnAction: an agent that waits for input opens an
// action of its own, answered with respond_action whose input reaches the
// agent as the signal's payload, independently of permission prompts.
func TestInputRequestIsAnAction(t *testing.T) {
	eventSchema, snapshotSchema := validators(t)
	s := nodetest.Start(t, node.Options{Kernel: kernel.Options{AgentGrace: time.Minute}})
	c := &client{t: t, base: s.URL}
	agent := c.sse("/v0/agents/stream?agent_id=form-agent&consumer_id=c1")
	c.json("POST", "/agent-runtime/sessions", obj{"sessionId": "f1", "agentId": "form-agent"}, 201)
	c.command("submit_turn", obj{"session_id": "f1", "turn_id": "t1", "input": "book a flight"}, 200)
	var assigned obj
	_ = json.Unmarshal([]byte(agent.until(t, "execution.assigned").Data), &assigned)
	exec, lease := assigned["execution_id"].(string), assigned["session_id"]
	c.json("POST", "/v0/agents/intent", obj{"execution_id": exec, "session_id": lease, "intent": obj{"type": "wait", "signal_type": "traveller"}}, 200)
	action := agentruntime.InputActionID(exec, "traveller")
	snap := c.json("GET", "/agent-runtime/sessions/f1", nil, 200)
	actions := snap["threads"].([]any)[0].(obj)["actions"].([]any)
	if len(actions) != 1 || actions[0].(obj)["actionId"] != action || actions[0].(obj)["actionType"] != "user_input" || actions[0].(obj)["status"] != "pending" {
		t.Fatalf("snapshot while waiting for input: %v", actions)
	}
	c.command("respond_action", obj{"action_id": action, "input": obj{"name": "Ada"}}, 200)
	var sig obj
	_ = json.Unmarshal([]byte(agent.until(t, "signal.received").Data), &sig)
	if sig["signal_type"] != "traveller" || sig["payload"].(obj)["name"] != "Ada" {
		t.Fatalf("the agent got %v", sig)
	}
	if late := c.command("respond_action", obj{"action_id": action, "input": obj{"name": "Bob"}}, 409); late["code"] != "CONFLICT" {
		t.Fatalf("a second answer: %v", late)
	}
	c.command("respond_action", obj{"action_id": "input:nope:traveller"}, 404)
	_, data := c.do("GET", "/agent-runtime/sessions/f1/events?limit=1000", nil)
	var page struct{ Events []json.RawMessage }
	_ = json.Unmarshal(data, &page)
	var types []string
	for i, e := range page.Events {
		valid(t, eventSchema, fmt.Sprintf("event %d", i), e)
		var env struct{ Type string }
		_ = json.Unmarshal(e, &env)
		types = append(types, env.Type)
	}
	if joined := strings.Join(types, " "); !strings.Contains(joined, "action.required task.blocked") || !strings.Contains(joined, "action.resolved") {
		t.Fatalf("events: %s", joined)
	}
	_, raw := c.do("GET", "/agent-runtime/sessions/f1", nil)
	valid(t, snapshotSchema, "snapshot", raw)
	snap = c.json("GET", "/agent-runtime/sessions/f1", nil, 200)
	if a := snap["threads"].([]any)[0].(obj)["actions"].([]any)[0].(obj); a["status"] != "resolved" {
		t.Fatalf("the answered request: %v", a)
	}
}

// TestWebSocketTwinRefusesBadText: the event socket takes no messages, but
// one that breaks the rules of the protocol still ends it with the code
// that says so: 1007 for a text message that is not UTF-8.
func TestWebSocketTwinRefusesBadText(t *testing.T) {
	_, c := scenario(t)
	ws, _, err := websocket.Dial(t.Context(), "ws"+strings.TrimPrefix(c.base, "http")+"/agent-runtime/sessions/s1/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	ws.SetReadLimit(1 << 20)
	if err := ws.Write(t.Context(), websocket.MessageText, []byte("\xff")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		if _, _, err = ws.Read(ctx); err != nil {
			break
		}
	}
	if websocket.CloseStatus(err) != websocket.StatusInvalidFramePayloadData {
		t.Fatalf("the socket ended with %v, want 1007", err)
	}
}
