package gateway_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
	"github.com/gatehouse-dev/gatehouse/node"
)

func TestLocalToolFlowAndExecutionStream(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	ag := a.agent("local-agent", "c1")
	id, lease := a.assigned(ag, obj{"task": "t"})

	res := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "web.search", "arguments": obj{"q": "x"}}, 200)
	if res["accepted"] != true || res["step_id"] == "" {
		t.Fatalf("intent: %v", res)
	}
	step := res["step_id"].(string)
	a.json("POST", "/v0/agents/step-result", obj{"execution_id": id, "session_id": lease, "step_id": step, "success": true, "data": obj{"hits": 3}}, 200)
	push := ag.expect("tool.result")
	if push["execution_id"] != id || push["step_id"] != step || push["status"] != "succeeded" || push["result"].(obj)["hits"] != 3.0 {
		t.Fatalf("tool.result: %v", push)
	}
	a.fail("POST", "/v0/agents/intent", obj{"execution_id": id, "session_id": "not-mine", "intent": obj{"type": "complete"}}, 401, "UNAUTHORIZED")
	a.intent(id, lease, obj{"type": "complete", "output": obj{"answer": 42}}, 200)
	ex := a.json("GET", "/v0/executions/"+id, nil, 200)
	if ex["status"] != "completed" || ex["output"].(obj)["answer"] != 42.0 {
		t.Fatalf("completed execution: %v", ex)
	}
	want := []string{"execution.created", "execution.started", "intent.accepted", "step.created", "step.completed", "intent.accepted", "execution.completed"}
	evs := a.events(id)
	for i, e := range evs {
		if e["sequence"] != float64(i+1) || e["id"] != e["event_id"] || e["run_id"] != id || e["execution_id"] != id {
			t.Fatalf("event %d envelope: %v", i, e)
		}
	}
	var types []string
	for _, e := range evs {
		types = append(types, e["type"].(string))
	}
	if !typesEqual(types, want...) {
		t.Fatalf("events %v, want %v", types, want)
	}
	if _, ok := evs[0]["step_id"]; ok {
		t.Fatalf("step_id present on an execution event: %v", evs[0])
	}
	if evs[3]["step_id"] != step || evs[3]["tool_call_id"] != step {
		t.Fatalf("step event ids: %v", evs[3])
	}

	// The stream replays, then ends after the terminal event.
	st := a.openSSE("/v0/executions/" + id + "/stream")
	for i, typ := range want {
		f := st.next()
		if f.Event != typ || f.ID != fmt.Sprint(i+1) {
			t.Fatalf("stream frame %d: %s id %s, want %s id %d", i, f.Event, f.ID, typ, i+1)
		}
	}
	st.ended()
	if !strings.HasPrefix(st.raw.String(), "retry: 5000\n\nid: 1\nevent: execution.created\ndata: {") {
		t.Fatalf("stream framing: %q", st.raw.String()[:80])
	}
	// Resuming at or past the terminal event ends at once.
	a.openSSE("/v0/executions/" + id + "/stream?after_sequence=7").ended()
	a.openSSE("/v0/executions/"+id+"/stream", "Last-Event-ID", "99").ended()
	// Last-Event-ID resumes with no gap and no duplicate.
	st = a.openSSE("/v0/executions/"+id+"/stream", "Last-Event-ID", "5")
	if f := st.next(); f.ID != "6" {
		t.Fatalf("resume from Last-Event-ID 5 starts at %s", f.ID)
	}
	st.expect("execution.completed")
	st.ended()

	page := a.json("GET", "/v0/executions/"+id+"/events?after_sequence=2&limit=3", nil, 200)
	if len(page["events"].([]any)) != 3 || page["latest_sequence"] != 5.0 {
		t.Fatalf("events page: latest %v, %d events", page["latest_sequence"], len(page["events"].([]any)))
	}
	// Terminal executions refuse changes.
	a.fail("POST", "/v0/executions/"+id+"/cancel", nil, 409, "CONFLICT")
	a.fail("POST", "/v0/executions/"+id+"/signal", obj{"signal_type": "x"}, 409, "CONFLICT")
	a.fail("POST", "/v0/agents/intent", obj{"execution_id": id, "session_id": lease, "intent": obj{"type": "complete"}}, 409, "CONFLICT")
}

func TestLiveStreamFollowsExecution(t *testing.T) {
	a, _, id, lease := running(t, "live-agent")
	st := a.openSSE("/v0/executions/" + id + "/stream?after_sequence=1")
	st.expect("execution.started")
	a.intent(id, lease, obj{"type": "complete"}, 200)
	st.expect("intent.accepted")
	st.expect("execution.completed")
	st.ended()
}

func TestRemoteToolFlowFreesRunnerWithoutConsumerID(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	ag := a.agent("remote-agent", "c1")
	run := a.runner("r1", "r1-aaaa", "fs.read", "other")
	id, lease := a.assigned(ag, nil)
	for i := range 3 { // the same runner connection takes job after job
		res := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "fs.read", "arguments": obj{"n": i}, "remote": true}, 200)
		step := res["step_id"].(string)
		job := run.expect("job.assigned")
		if job["step_id"] != step || job["execution_id"] != id || job["tool_id"] != "fs.read" || job["attempt"] != 1.0 || job["arguments"].(obj)["n"] != float64(i) {
			t.Fatalf("job.assigned: %v", job)
		}
		if job["id"] == "" || job["deadline"] == "" || job["not_before"] == nil {
			t.Fatalf("job.assigned fields: %v", job)
		}
		a.json("POST", "/v0/runners/steps/"+step+"/started", obj{"execution_id": id, "runner_id": "r1"}, 200)
		a.json("POST", "/v0/runners/steps/"+step+"/started", obj{"execution_id": id, "runner_id": "r1"}, 200)
		a.json("POST", "/v0/runners/r1/results", obj{"job_id": job["id"], "execution_id": id, "step_id": step, "success": true, "data": obj{"ok": i}}, 200)
		push := ag.expect("tool.result")
		if push["step_id"] != step || push["status"] != "succeeded" || push["result"].(obj)["ok"] != float64(i) {
			t.Fatalf("tool.result: %v", push)
		}
	}
	types := a.eventTypes(id)
	want := []string{"execution.created", "execution.started", "intent.accepted", "step.created", "step.dispatched", "step.started", "step.completed"}
	if !typesEqual(types[:7], want...) {
		t.Fatalf("events %v", types)
	}
	disp := a.events(id)[4]["payload"].(obj)
	if disp["runner_id"] != "r1" || disp["job_id"] == "" {
		t.Fatalf("step.dispatched records the runner: %v", disp)
	}
	a.fail("POST", "/v0/runners/r1/results", obj{"execution_id": id}, 400, "VALIDATION_ERROR")
	a.fail("POST", "/v0/runners/r1/results", obj{"job_id": "j", "execution_id": id, "step_id": "nope", "success": true}, 404, "NOT_FOUND")
	a.fail("POST", "/v0/runners/steps/nope/started", obj{"execution_id": id, "runner_id": "r1"}, 404, "NOT_FOUND")
	a.fail("POST", "/v0/runners/steps/x/started", obj{"execution_id": id}, 400, "VALIDATION_ERROR")
	a.fail("POST", "/v0/runners/r1/capabilities", "{", 400, "VALIDATION_ERROR")
	a.json("POST", "/v0/runners/unknown/capabilities", obj{"tools": []string{"a"}}, 200)
	a.fail("GET", "/v0/runners/stream?runner_id=r1", nil, 400, "VALIDATION_ERROR")
	a.fail("GET", "/v0/agents/stream?agent_id=a", nil, 400, "VALIDATION_ERROR")
}

func TestJobWaitsForCapableRunnerAndCapabilityUpdate(t *testing.T) {
	a, _, id, lease := running(t, "q-agent")
	step := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "late.tool", "remote": true}, 200)["step_id"]
	other := a.runner("r-other", "x", "something.else")
	other.quiet(100 * time.Millisecond)
	// A capability update makes the queued job dispatchable at once.
	a.json("POST", "/v0/runners/r-other/capabilities", obj{"tools": []string{"late.tool"}}, 200)
	if job := other.expect("job.assigned"); job["step_id"] != step {
		t.Fatalf("job %v", job)
	}
	// A queued job goes to a runner the moment it connects.
	step2 := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "late.tool", "remote": true}, 200)["step_id"]
	fresh := a.runner("r-fresh", "y", "late.tool")
	if job := fresh.expect("job.assigned"); job["step_id"] != step2 {
		t.Fatalf("job %v", job)
	}
}

// remoteStep starts a server with agent agentID and runner runnerID, able
// to run tool, connected, and has an execution assigned to the agent invoke
// tool remotely: the start of the tests of a runner's jobs. It returns the
// client, the agent, the runner and the execution's and step's ids; the
// runner is yet to read its job.assigned.
func remoteStep(t *testing.T, agentID, runnerID, tool string) (a *api, ag *agent, run *sseStream, id, step string) {
	t.Helper()
	a = newAPI(t, start(t, node.Options{}))
	ag = a.agent(agentID, "c1")
	run = a.runner(runnerID, "c1", tool)
	id, lease := a.assigned(ag, nil)
	step = a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": tool, "remote": true}, 200)["step_id"].(string)
	return a, ag, run, id, step
}

func TestRunnerRetryThenFinalFailure(t *testing.T) {
	a, ag, run, id, step := remoteStep(t, "retry-agent", "rr", "flaky")
	var jobs []string
	for attempt := 1; attempt <= 3; attempt++ {
		job := run.expect("job.assigned")
		if job["attempt"] != float64(attempt) {
			t.Fatalf("attempt %v, want %d", job["attempt"], attempt)
		}
		jobs = append(jobs, job["id"].(string))
		a.json("POST", "/v0/runners/rr/results", obj{"job_id": job["id"], "execution_id": id, "step_id": step, "success": false, "error": "boom", "retryable": true}, 200)
	}
	push := ag.expect("tool.result")
	if push["status"] != "failed" || push["error"] != "boom" {
		t.Fatalf("final failure push: %v", push)
	}
	// A retried POST of an earlier attempt's failure changes nothing.
	a.json("POST", "/v0/runners/rr/results", obj{"job_id": jobs[0], "execution_id": id, "step_id": step, "success": false, "error": "boom", "retryable": true}, 200)
	var failed, retried int
	for _, e := range a.events(id) {
		switch e["type"] {
		case "step.failed":
			failed++
		case "step.retried":
			retried++
			if e["payload"].(obj)["next_attempt"] == nil {
				t.Fatalf("step.retried payload: %v", e)
			}
		}
	}
	if failed != 3 || retried != 2 {
		t.Fatalf("step.failed %d, step.retried %d; want 3 and 2", failed, retried)
	}
	out := a.fail("POST", "/v0/runners/rr/results", obj{"job_id": jobs[2], "execution_id": id, "step_id": step, "success": true}, 409, "CONFLICT")
	rec := out["details"].(obj)["recorded"].(obj)
	if rec["status"] != "failed" || rec["error"] != "boom" {
		t.Fatalf("409 details: %v", out)
	}
	a.fail("POST", "/v0/runners/rr/results", obj{"job_id": "made-up", "execution_id": id, "step_id": step, "success": true}, 409, "CONFLICT")
}

func TestPolicyDenyDefaultAndRules(t *testing.T) {
	a, _, id, lease := running(t, "pol-agent")
	res := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "shell", "arguments": obj{"cmd": "rm -rf /"}, "idempotency_key": "k1"}, 200)
	if res["accepted"] != false || res["error"] != "policy denied: Shell commands denied by default (rule: default-deny-shell)" {
		t.Fatalf("deny: %v", res)
	}
	if _, ok := res["step_id"]; ok {
		t.Fatalf("denied intent has a step: %v", res)
	}
	evs := a.events(id)
	last := evs[len(evs)-1]
	p := last["payload"].(obj)
	if last["type"] != "intent.denied" || p["rule_id"] != "default-deny-shell" || p["tool_id"] != "shell" || last["idempotency_key"] != "k1" {
		t.Fatalf("intent.denied: %v", last)
	}

	pol := policytest.Parse(t, `
rules:
  - id: limit
    priority: 1
    when: {tool_id: "limited"}
    then: {decision: allow}
    rate_limit: {max: 1, window: "1h"}
  - id: no-prod
    priority: 2
    when: {labels: {env: prod}}
    then: {decision: deny, reason: "prod is read-only"}
default:
  decision: allow
`)
	s2 := start(t, node.Options{Policy: pol})
	b := newAPI(t, s2)
	ag2 := b.agent("pol2", "c1")
	ex := b.json("POST", "/v0/executions", obj{"agent_id": "pol2", "labels": obj{"env": "prod"}}, 201)
	lease2 := ag2.expect("execution.assigned")["session_id"].(string)
	id2 := ex["id"].(string)
	if r := b.intent(id2, lease2, obj{"type": "invoke_tool", "tool_id": "x"}, 200); r["error"] != "policy denied: prod is read-only (rule: no-prod)" {
		t.Fatalf("label rule: %v", r)
	}
	if r := b.intent(id2, lease2, obj{"type": "invoke_tool", "tool_id": "limited"}, 200); r["accepted"] != true {
		t.Fatalf("first limited call: %v", r)
	}
	if r := b.intent(id2, lease2, obj{"type": "invoke_tool", "tool_id": "limited"}, 200); r["accepted"] != false || !strings.HasPrefix(r["error"].(string), "rate limit exceeded: max 1 per 1h (rule: limit)") {
		t.Fatalf("rate limited call: %v", r)
	}
}

func TestApprovalThroughSignal(t *testing.T) {
	pol := policytest.Parse(t, policytest.AskDeploys)
	s := start(t, node.Options{Policy: pol})
	a := newAPI(t, s)
	ag := a.agent("appr", "c1")
	run := a.runner("ra", "ra-1", "deploy.remote")
	id, lease := a.assigned(ag, nil)

	res := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "deploy.local", "arguments": obj{"v": 1}}, 200)
	if res["accepted"] != true || res["pending_approval"] != true {
		t.Fatalf("approval intent: %v", res)
	}
	step := res["step_id"].(string)
	a.waitStatus(id, "blocked")
	evs := a.events(id)
	blocked := evs[len(evs)-1]
	if blocked["type"] != "execution.blocked" || blocked["payload"].(obj)["reason"] != "approval" || blocked["payload"].(obj)["ref"] != step || blocked["action_id"] == nil {
		t.Fatalf("blocked event: %v", blocked)
	}
	out := a.fail("POST", "/v0/agents/intent", obj{"execution_id": id, "session_id": lease, "intent": obj{"type": "complete"}}, 409, "CONFLICT")
	if !strings.Contains(out["error"].(string), "pending approval") {
		t.Fatalf("blocked message: %v", out)
	}
	before := len(a.events(id))
	a.fail("POST", "/v0/executions/"+id+"/signal", obj{"signal_type": "step.approve", "payload": obj{"step_id": "other", "approved": true}}, 400, "VALIDATION_ERROR")
	a.fail("POST", "/v0/executions/"+id+"/signal", obj{"signal_type": "step.approve", "payload": "yes"}, 400, "VALIDATION_ERROR")
	a.fail("POST", "/v0/executions/"+id+"/signal", obj{"signal_type": "step.approve", "payload": obj{"step_id": step}}, 400, "VALIDATION_ERROR")
	if n := len(a.events(id)); n != before {
		t.Fatalf("refused signals wrote %d events", n-before)
	}
	a.json("POST", "/v0/executions/"+id+"/signal", obj{"signal_type": "step.approve", "payload": obj{"step_id": step, "approved": true}}, 200)
	if r := ag.expect("approval.resolved"); r["approved"] != true || r["step_id"] != step || r["execution_id"] != id || r["session_id"] != lease {
		t.Fatalf("approval.resolved: %v", r)
	}
	if sig := ag.expect("signal.received"); sig["signal_type"] != "step.approve" || sig["execution_id"] != id {
		t.Fatalf("signal.received: %v", sig)
	}
	a.waitStatus(id, "running")
	a.json("POST", "/v0/agents/step-result", obj{"execution_id": id, "session_id": lease, "step_id": step, "success": true}, 200)
	ag.expect("tool.result")

	// Approved remote step goes to a runner; a denied one fails the step.
	step2 := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "deploy.remote", "remote": true}, 200)["step_id"].(string)
	run.quiet(50 * time.Millisecond)
	a.json("POST", "/v0/executions/"+id+"/signal", obj{"signal_type": "step.approve", "payload": obj{"step_id": step2, "approved": true}}, 200)
	ag.expect("approval.resolved")
	ag.expect("signal.received")
	if job := run.expect("job.assigned"); job["step_id"] != step2 {
		t.Fatalf("approved remote job: %v", job)
	}
	step3 := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "deploy.x"}, 200)["step_id"].(string)
	a.json("POST", "/v0/executions/"+id+"/signal", obj{"signal_type": "step.approve", "payload": obj{"step_id": step3, "approved": false, "reason": "not today"}}, 200)
	if r := ag.expect("approval.resolved"); r["approved"] != false {
		t.Fatalf("denial: %v", r)
	}
	evs = a.events(id)
	var denied obj
	for _, e := range evs {
		if e["type"] == "step.failed" && e["step_id"] == step3 {
			denied = e["payload"].(obj)
		}
	}
	if denied == nil || denied["error"] != "not today" {
		t.Fatalf("denied step: %v", denied)
	}
}

func TestSignalsAndWait(t *testing.T) {
	a, ag, id, lease := running(t, "wait-agent")
	a.intent(id, lease, obj{"type": "wait", "signal_type": "go"}, 200)
	a.waitStatus(id, "blocked")
	out := a.fail("POST", "/v0/agents/intent", obj{"execution_id": id, "session_id": lease, "intent": obj{"type": "complete"}}, 409, "CONFLICT")
	if !strings.Contains(out["error"].(string), "waiting for signal go") {
		t.Fatalf("blocked message: %v", out)
	}
	a.json("POST", "/v0/executions/"+id+"/signal", obj{"signal_type": "other", "payload": 1}, 200)
	if sig := ag.expect("signal.received"); sig["signal_type"] != "other" || sig["execution_id"] != id {
		t.Fatalf("push: %v", sig)
	}
	a.waitStatus(id, "blocked")
	a.json("POST", "/v0/executions/"+id+"/signal", obj{"signal_type": "go", "payload": obj{"k": "v"}}, 200)
	if sig := ag.expect("signal.received"); sig["signal_type"] != "go" || sig["payload"].(obj)["k"] != "v" {
		t.Fatalf("push: %v", sig)
	}
	a.waitStatus(id, "running")
	// A signal that arrives before the wait resumes it at once, and is
	// pushed again after the wait is answered.
	a.json("POST", "/v0/executions/"+id+"/signal", obj{"signal_type": "early", "payload": 7}, 200)
	ag.expect("signal.received")
	a.intent(id, lease, obj{"type": "wait", "signal_type": "early"}, 200)
	if sig := ag.expect("signal.received"); sig["signal_type"] != "early" || sig["payload"] != 7.0 {
		t.Fatalf("push after wait: %v", sig)
	}
	if ex := a.json("GET", "/v0/executions/"+id, nil, 200); ex["status"] != "running" {
		t.Fatalf("status after early signal: %v", ex["status"])
	}
	a.fail("POST", "/v0/executions/"+id+"/signal", obj{"payload": 1}, 400, "VALIDATION_ERROR")
	a.fail("POST", "/v0/agents/intent", obj{"execution_id": id, "session_id": lease, "intent": obj{"type": "wait"}}, 400, "VALIDATION_ERROR")
	a.fail("POST", "/v0/agents/intent", obj{"execution_id": id, "session_id": lease, "intent": obj{"type": "fail"}}, 400, "VALIDATION_ERROR")
	a.fail("POST", "/v0/agents/intent", obj{"execution_id": id, "session_id": lease, "intent": obj{"type": "dance"}}, 400, "VALIDATION_ERROR")
	a.fail("POST", "/v0/agents/intent", obj{"execution_id": id, "session_id": lease, "intent": obj{"type": "invoke_tool"}}, 400, "VALIDATION_ERROR")
	a.fail("POST", "/v0/agents/intent", obj{"execution_id": id, "intent": obj{"type": "complete"}}, 400, "VALIDATION_ERROR")
	a.intent(id, lease, obj{"type": "fail", "error": "gave up"}, 200)
	a.waitStatus(id, "failed")
}

func TestCancelInEveryState(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	pending := a.create("nobody-home", nil)["id"].(string)
	ag := a.agent("cancel-agent", "c1")
	running, lease := a.assigned(ag, nil)
	step := a.intent(running, lease, obj{"type": "invoke_tool", "tool_id": "queued.tool", "remote": true}, 200)["step_id"]
	blocked, lease2 := a.assigned(ag, nil)
	a.intent(blocked, lease2, obj{"type": "wait", "signal_type": "never"}, 200)
	a.waitStatus(blocked, "blocked")
	for _, id := range []string{pending, running, blocked} {
		ex := a.json("POST", "/v0/executions/"+id+"/cancel", nil, 200)
		if ex["status"] != "cancelled" {
			t.Fatalf("cancel %s: %v", id, ex)
		}
		a.fail("POST", "/v0/executions/"+id+"/cancel", nil, 409, "CONFLICT")
	}
	types := a.eventTypes(running)
	if types[len(types)-2] != "step.cancelled" || types[len(types)-1] != "execution.cancelled" {
		t.Fatalf("cancel events: %v", types)
	}
	// The cancelled step's queued job never reaches a runner.
	run := a.runner("rc", "rc-1", "queued.tool")
	run.quiet(150 * time.Millisecond)
	a.fail("POST", "/v0/runners/rc/results", obj{"job_id": "j", "execution_id": running, "step_id": step, "success": true}, 409, "CONFLICT")
}

func TestCompleteWithActiveStepsIsRefusedCleanly(t *testing.T) {
	a, _, id, lease := running(t, "active-agent")
	a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "t"}, 200)
	before := len(a.events(id))
	a.fail("POST", "/v0/agents/intent", obj{"execution_id": id, "session_id": lease, "intent": obj{"type": "complete"}}, 409, "CONFLICT")
	if n := len(a.events(id)); n != before {
		t.Fatalf("a refused complete wrote %d events", n-before)
	}
}

func TestIdempotentIntentsAndResults(t *testing.T) {
	a, ag, id, lease := running(t, "idem-agent")
	in := obj{"type": "invoke_tool", "tool_id": "t", "arguments": obj{"a": 1}, "idempotency_key": id + ":t:0001"}
	first := a.intent(id, lease, in, 200)
	again := a.intent(id, lease, in, 200)
	if first["step_id"] != again["step_id"] {
		t.Fatalf("retried intent made a new step: %v vs %v", first, again)
	}
	steps := 0
	for _, typ := range a.eventTypes(id) {
		if typ == "step.created" {
			steps++
		}
	}
	if steps != 1 {
		t.Fatalf("%d steps for one idempotency key", steps)
	}
	other := obj{"type": "invoke_tool", "tool_id": "t", "arguments": obj{"a": 2}, "idempotency_key": id + ":t:0001"}
	a.fail("POST", "/v0/agents/intent", obj{"execution_id": id, "session_id": lease, "intent": other}, 409, "CONFLICT")

	res := obj{"execution_id": id, "session_id": lease, "step_id": first["step_id"], "success": true, "data": obj{"x": 1}}
	a.json("POST", "/v0/agents/step-result", res, 200)
	ag.expect("tool.result")
	a.json("POST", "/v0/agents/step-result", res, 200) // a retry of the same outcome
	ag.quiet(50 * time.Millisecond)
	out := a.fail("POST", "/v0/agents/step-result", obj{"execution_id": id, "session_id": lease, "step_id": first["step_id"], "success": false, "error": "no"}, 409, "CONFLICT")
	if out["details"].(obj)["recorded"].(obj)["status"] != "succeeded" {
		t.Fatalf("recorded outcome: %v", out)
	}
	// A completed execution still answers a retried complete with its key.
	done := obj{"type": "complete", "output": 1, "idempotency_key": "done-1"}
	a.intent(id, lease, done, 200)
	if r := a.intent(id, lease, done, 200); r["accepted"] != true {
		t.Fatalf("retried complete: %v", r)
	}
	a.json("POST", "/v0/agents/step-result", res, 200) // even after completion
}

func TestAgentDisconnectGraceAndReassignment(t *testing.T) {
	a, ag, id, lease := running(t, "dc-agent")
	a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "t", "arguments": 1}, 200)

	// A reconnect with the same consumer id within the grace period keeps
	// the execution and its lease.
	ag.close()
	time.Sleep(100 * time.Millisecond)
	ag = a.agent("dc-agent", "c1")
	time.Sleep(400 * time.Millisecond)
	if ex := a.json("GET", "/v0/executions/"+id, nil, 200); ex["status"] != "running" {
		t.Fatalf("after a quick reconnect: %v", ex["status"])
	}
	a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "t2"}, 200)

	// Gone past the grace period: reset and reassigned to another consumer.
	other := a.agent("dc-agent", "c2")
	ag.close()
	push := other.expect("execution.assigned")
	if push["execution_id"] != id || push["session_id"] == lease {
		t.Fatalf("reassignment: %v", push)
	}
	hist := push["history"].([]any)
	if len(hist) != 2 || hist[0].(obj)["status"] != "cancelled" || hist[0].(obj)["error"] != "agent disconnected" {
		t.Fatalf("history: %v", hist)
	}
	types := a.eventTypes(id)
	if !strings.Contains(strings.Join(types, ","), "agent.timeout,step.cancelled,step.cancelled,execution.reset,execution.started") {
		t.Fatalf("events: %v", types)
	}
	a.fail("POST", "/v0/agents/intent", obj{"execution_id": id, "session_id": lease, "intent": obj{"type": "complete"}}, 401, "UNAUTHORIZED")
	a.intent(id, push["session_id"].(string), obj{"type": "complete"}, 200)
}

func TestRunnerLostJobIsRequeued(t *testing.T) {
	a, ag, r1, id, step := remoteStep(t, "lost-agent", "lost-r1", "slow")
	job1 := r1.expect("job.assigned")
	r1.close()
	r2 := a.runner("lost-r2", "y", "slow")
	job2 := r2.expect("job.assigned")
	if job2["step_id"] != step || job2["attempt"] != 2.0 || job2["id"] == job1["id"] {
		t.Fatalf("requeued job: %v", job2)
	}
	a.json("POST", "/v0/runners/lost-r2/results", obj{"job_id": job2["id"], "execution_id": id, "step_id": step, "success": true, "data": "second"}, 200)
	ag.expect("tool.result")
	// The first runner's late result gets the recorded outcome.
	out := a.fail("POST", "/v0/runners/lost-r1/results", obj{"job_id": job1["id"], "execution_id": id, "step_id": step, "success": true, "data": "first"}, 409, "CONFLICT")
	if out["details"].(obj)["recorded"].(obj)["result"] != "second" {
		t.Fatalf("late result: %v", out)
	}
}

func TestDeleteRunnerEndsStreamAndRequeues(t *testing.T) {
	a, _, r1, _, _ := remoteStep(t, "del-agent", "del-r1", "tool")
	r1.expect("job.assigned")
	status, body, _ := a.do("DELETE", "/v0/runners/del-r1", nil)
	if status != 204 || len(body) != 0 {
		t.Fatalf("delete: %d %q", status, body)
	}
	r1.ended()
	r2 := a.runner("del-r2", "y", "tool")
	if job := r2.expect("job.assigned"); job["attempt"] != 2.0 {
		t.Fatalf("requeued: %v", job)
	}
	status, _, _ = a.do("DELETE", "/v0/runners/never-seen", nil)
	if status != 204 {
		t.Fatalf("delete unknown: %d", status)
	}
}

func TestStepDeadlineAndExecutionTimeout(t *testing.T) {
	pol := policytest.Parse(t, `
rules:
  - id: quick
    priority: 1
    when: {tool_id: "quick"}
    then: {decision: allow, timeout_ms: 150}
default: {decision: allow}
`)
	ko := testKernel()
	ko.ExecutionTimeout = 1500 * time.Millisecond
	s := start(t, node.Options{Policy: pol, Kernel: ko})
	a := newAPI(t, s)
	ag := a.agent("timer-agent", "c1")
	id, lease := a.assigned(ag, nil)
	step := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "quick"}, 200)["step_id"]
	push := ag.expect("tool.result")
	if push["step_id"] != step || push["status"] != "failed" || push["error"] != "step timed out" {
		t.Fatalf("timeout push: %v", push)
	}
	if ex := a.json("GET", "/v0/executions/"+id, nil, 200); ex["status"] != "running" {
		t.Fatalf("a step timeout must not fail the execution: %v", ex["status"])
	}
	a.fail("POST", "/v0/agents/step-result", obj{"execution_id": id, "session_id": lease, "step_id": step, "success": true}, 409, "CONFLICT")
	a.waitStatus(id, "failed")
	types := a.eventTypes(id)
	if types[len(types)-1] != "execution.failed" {
		t.Fatalf("events: %v", types)
	}
	evs := a.events(id)
	if evs[len(evs)-1]["payload"].(obj)["error"] != "execution exceeded maximum duration" {
		t.Fatalf("timeout reason: %v", evs[len(evs)-1])
	}
}

func TestConcurrentExecutions(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	const n = 40
	ag := a.agent("conc-agent", "c1")
	run := a.runner("conc-r", "x", "work")
	var wg sync.WaitGroup
	// The runner: run every job it gets.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < n; i++ {
			f := run.next()
			job := f.obj(t)
			a.json("POST", "/v0/runners/conc-r/results", obj{"job_id": job["id"], "execution_id": job["execution_id"], "step_id": job["step_id"], "success": true, "data": job["arguments"]}, 200)
		}
	}()
	ids := make(chan string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ex := a.create("conc-agent", obj{"i": i})
			ids <- ex["id"].(string)
		}(i)
	}
	leases := map[string]string{}
	for i := 0; i < n; i++ {
		p := ag.expect("execution.assigned")
		leases[p["execution_id"].(string)] = p["session_id"].(string)
	}
	for id, lease := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "work", "arguments": id, "remote": true}, 200)
		}()
	}
	for i := 0; i < n; i++ {
		p := ag.expect("tool.result")
		id := p["execution_id"].(string)
		if p["result"] != id {
			t.Fatalf("result routed wrong: %v", p)
		}
		a.intent(id, leases[id], obj{"type": "complete"}, 200)
	}
	wg.Wait()
	close(ids)
	for id := range ids {
		evs := a.events(id)
		for i, e := range evs {
			if e["sequence"] != float64(i+1) {
				t.Fatalf("execution %s: gap at %d", id, i)
			}
		}
		if evs[len(evs)-1]["type"] != "execution.completed" {
			t.Fatalf("execution %s not completed", id)
		}
	}
}

// TestStepLimit: an execution takes no more steps than Options.MaxSteps.
func TestStepLimit(t *testing.T) {
	s := start(t, node.Options{Kernel: kernel.Options{MaxSteps: 2}})
	a := newAPI(t, s)
	ag := a.agent("limit-agent", "c1")
	id, lease := a.assigned(ag, nil)
	a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "t"}, 200)
	a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "t"}, 200)
	a.fail("POST", "/v0/agents/intent", obj{"execution_id": id, "session_id": lease, "intent": obj{"type": "invoke_tool", "tool_id": "t"}}, 409, "CONFLICT")
}

func TestIdempotencyKeyHeaderIsRecordedOnResults(t *testing.T) {
	a, _, id, lease := running(t, "hdr-agent")
	step := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "t"}, 200)["step_id"]
	a.json("POST", "/v0/agents/step-result", obj{"execution_id": id, "session_id": lease, "step_id": step, "success": true}, 200, "Idempotency-Key", "res-1")
	evs := a.events(id)
	if last := evs[len(evs)-1]; last["type"] != "step.completed" || last["idempotency_key"] != "res-1" {
		t.Fatalf("step.completed: %v", last)
	}
}

// TestBlockedExecutionOutlivesItsAgent: an execution blocked on a signal
// stays blocked when its agent is lost; when the signal comes it goes back
// to pending and the next agent consumer takes it over, with its history.
func TestBlockedExecutionOutlivesItsAgent(t *testing.T) {
	a, ag, id, lease := running(t, "lone-agent")
	a.intent(id, lease, obj{"type": "wait", "signal_type": "go"}, 200)
	a.waitStatus(id, "blocked")
	ag.close()
	time.Sleep(600 * time.Millisecond) // past the 300ms grace
	if ex := a.json("GET", "/v0/executions/"+id, nil, 200); ex["status"] != "blocked" {
		t.Fatalf("a blocked execution must wait for its signal, not its agent: %v", ex["status"])
	}
	a.json("POST", "/v0/executions/"+id+"/signal", obj{"signal_type": "go"}, 200)
	a.waitStatus(id, "pending")
	next := a.agent("lone-agent", "c2")
	if p := next.expect("execution.assigned"); p["execution_id"] != id || p["session_id"] == lease {
		t.Fatalf("takeover: %v", p)
	}
	types := strings.Join(a.eventTypes(id), ",")
	if !strings.Contains(types, "agent.timeout") || !strings.Contains(types, "execution.resumed,execution.reset,execution.started") {
		t.Fatalf("events: %s", types)
	}
}

// TestQueuedJobRidesOnResultCommit: while the only runner is busy, jobs
// queue; its result frees it, and the next queued job is dispatched to it
// in the same store write as the result, oldest job first.
func TestQueuedJobRidesOnResultCommit(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	// The agent acknowledges explicitly (and never does here), so reading
	// its pushes makes the hub write nothing in the background; what the
	// hub still had to write is flushed before each measured window.
	ag := &agent{sseStream: a.openSSE("/v0/agents/stream?agent_id=q-agent&consumer_id=c1&ack=explicit"), id: "q-agent", consumer: "c1"}
	r := a.runner("q-runner", "c1", "work")
	var steps []any
	var ids []string
	for range 3 {
		id, lease := a.assigned(ag, nil)
		ids = append(ids, id)
		steps = append(steps, a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "work", "remote": true}, 200)["step_id"])
	}
	job := r.expect("job.assigned")
	for i := range 3 {
		if job["step_id"] != steps[i] {
			t.Fatalf("job %d is for step %v, want %v (oldest first)", i, job["step_id"], steps[i])
		}
		s.Node.Hub.Flush()
		before := s.Node.Store.Stats().Writes
		a.json("POST", "/v0/runners/q-runner/results", obj{"job_id": job["id"], "execution_id": ids[i], "step_id": steps[i], "success": true, "data": i}, 200)
		ag.expect("tool.result")
		if i == 2 {
			break
		}
		job = r.expect("job.assigned")
		if got := s.Node.Store.Stats().Writes - before; got != 1 {
			t.Errorf("result %d and the next job's dispatch took %d store writes, want 1", i, got)
		}
	}
	for i, id := range ids {
		var types []string
		for _, ev := range a.events(id) {
			types = append(types, ev["type"].(string))
		}
		if !slices.Contains(types, "step.dispatched") || !slices.Contains(types, "step.completed") {
			t.Errorf("execution %d: events %v", i, types)
		}
	}
}
