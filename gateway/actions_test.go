package gateway_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

const bridgePolicy = `
rules:
  - id: ask
    priority: 1
    when: {tool_id: "deploy*"}
    then: {decision: require_approval, reason: "deploys need a human"}
  - id: ask-quick
    priority: 2
    when: {tool_id: "quick*"}
    then: {decision: require_approval, expires_in: 300ms}
  - id: ask-quick-allow
    priority: 3
    when: {tool_id: "lenient*"}
    then: {decision: require_approval, expires_in: 300ms, on_expiry: allow}
default:
  decision: allow
`

// bridgeNode starts a server with options c under bridgePolicy, for the
// tests that restart it or give it several clients.
func bridgeNode(t *testing.T, c node.Options) *nodetest.Server {
	t.Helper()
	c.Policy = policytest.Parse(t, bridgePolicy)
	return start(t, c)
}

// bridgeServer starts a bridgeNode and returns a client of it.
func bridgeServer(t *testing.T, c node.Options) *api {
	t.Helper()
	return newAPI(t, bridgeNode(t, c))
}

// pendingAction asks for a tool that needs approval and returns the action id.
func pendingAction(t *testing.T, a *api, ag *agent, tool string) (execID, lease, step, action string) {
	t.Helper()
	execID, lease = a.assigned(ag, nil)
	res := a.intent(execID, lease, obj{"type": "invoke_tool", "tool_id": tool, "arguments": obj{"target": "prod"}}, 200)
	step = res["step_id"].(string)
	list := a.json("GET", "/v0/actions?status=pending", nil, 200)["actions"].([]any)
	for _, x := range list {
		rec := x.(obj)
		if rec["step_id"] == step {
			if rec["execution_id"] != execID || rec["tool_id"] != tool || rec["state"] != "pending" || rec["arguments_sha256"] == "" || rec["requested_at"] == nil {
				t.Fatalf("pending record: %v", rec)
			}
			return execID, lease, step, rec["action_id"].(string)
		}
	}
	t.Fatalf("no pending action for step %s in %v", step, list)
	return
}

func TestFirstAnswerWinsAndLateAnswersGetTheRecord(t *testing.T) {
	a := bridgeServer(t, node.Options{})
	ag := a.agent("race-agent", "c1")
	execID, _, step, action := pendingAction(t, a, ag, "deploy.app")

	const racers = 8
	var wg sync.WaitGroup
	statuses := make(chan int, racers)
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			decision := "allow_once"
			if i%2 == 1 {
				decision = "deny"
			}
			status, _, _ := a.do("POST", "/v0/actions/"+action+"/respond", obj{"decision": decision, "channel_id": "phone", "native_peer_id": "u1"})
			statuses <- status
		}()
	}
	wg.Wait()
	close(statuses)
	won := 0
	for st := range statuses {
		switch st {
		case 200:
			won++
		case 409:
		default:
			t.Fatalf("racing answer got %d", st)
		}
	}
	if won != 1 {
		t.Fatalf("%d answers won, want exactly 1", won)
	}
	rec := a.json("GET", "/v0/actions/"+action, nil, 200)
	if rec["state"] != "approved" && rec["state"] != "denied" {
		t.Fatalf("record after the race: %v", rec)
	}
	by := rec["decided_by"].(obj)
	if by["principal"] != "local" || by["channel_id"] != "phone" || by["native_peer_id"] != "u1" || rec["decided_at"] == nil {
		t.Fatalf("audit: %v", rec)
	}
	late := a.fail("POST", "/v0/actions/"+action+"/respond", obj{"decision": "allow_once"}, 409, "CONFLICT")
	if late["details"].(obj)["recorded"].(obj)["state"] != rec["state"] {
		t.Fatalf("late answer details: %v", late)
	}
	p := ag.expect("approval.resolved")
	if p["step_id"] != step || (p["approved"] == true) != (rec["state"] == "approved") {
		t.Fatalf("agent told %v, record says %v", p, rec["state"])
	}
	var requested, resolved int
	for _, e := range a.events(execID) {
		switch e["type"] {
		case "permission.requested":
			requested++
		case "permission.resolved":
			resolved++
			if e["action_id"] != action || e["payload"].(obj)["decided_by"].(obj)["channel_id"] != "phone" {
				t.Fatalf("permission.resolved: %v", e)
			}
		}
	}
	if requested != 1 || resolved != 1 {
		t.Fatalf("permission events: %d requested, %d resolved", requested, resolved)
	}
	_, _, _, next := pendingAction(t, a, ag, "deploy.more")
	settled := a.json("POST", "/v0/actions/"+next+"/respond", obj{"decision": "deny"}, 200)
	if settled["state"] != "denied" || settled["decided_by"] == nil {
		t.Fatalf("the answer to a respond must be the settled record: %v", settled)
	}
	ag.expect("approval.resolved")
	a.fail("POST", "/v0/actions/forged-id/respond", obj{"decision": "allow_once"}, 404, "NOT_FOUND")
	a.fail("GET", "/v0/actions/forged-id", nil, 404, "NOT_FOUND")
	a.fail("POST", "/v0/actions/"+action+"/respond", obj{"decision": "maybe"}, 400, "VALIDATION_ERROR")
	a.fail("GET", "/v0/actions?status=weird", nil, 400, "VALIDATION_ERROR")
}

func TestSignalApprovalGoesThroughTheRecord(t *testing.T) {
	a := bridgeServer(t, node.Options{})
	ag := a.agent("sig-agent", "c1")
	execID, _, step, action := pendingAction(t, a, ag, "deploy.db")
	a.json("POST", "/v0/executions/"+execID+"/signal", obj{"signal_type": "step.approve", "payload": obj{"step_id": step, "approved": false, "reason": "freeze"}}, 200)
	rec := a.json("GET", "/v0/actions/"+action, nil, 200)
	if rec["state"] != "denied" || rec["decision_reason"] != "freeze" || rec["decided_by"].(obj)["channel_id"] != "signal" {
		t.Fatalf("record after a signal: %v", rec)
	}
	a.fail("POST", "/v0/actions/"+action+"/respond", obj{"decision": "allow_once"}, 409, "CONFLICT")
}

func TestAllowAlwaysIsNotAskedAgain(t *testing.T) {
	a := bridgeServer(t, node.Options{})
	ag := a.agent("always-agent", "c1")
	execID, lease, _, action := pendingAction(t, a, ag, "deploy.web")
	a.json("POST", "/v0/actions/"+action+"/respond", obj{"decision": "allow_always"}, 200)
	ag.expect("approval.resolved")
	if rec := a.json("GET", "/v0/actions/"+action, nil, 200); rec["decision"] != "allow_always" || rec["scope"] != "session" {
		t.Fatalf("allow_always record: %v", rec)
	}
	res := a.intent(execID, lease, obj{"type": "invoke_tool", "tool_id": "deploy.web"}, 200)
	if res["accepted"] != true || res["pending_approval"] != nil {
		t.Fatalf("second call of an always-allowed tool: %v", res)
	}
	// Another tool still asks.
	if res := a.intent(execID, lease, obj{"type": "invoke_tool", "tool_id": "deploy.other"}, 200); res["pending_approval"] != true {
		t.Fatalf("another tool: %v", res)
	}
}

func TestExpiryIsItsOwnOutcome(t *testing.T) {
	a := bridgeServer(t, node.Options{})
	ag := a.agent("exp-agent", "c1")
	_, _, step, action := pendingAction(t, a, ag, "quick.job")
	p := ag.expect("approval.resolved")
	if p["step_id"] != step || p["approved"] != false || p["outcome"] != "expired" {
		t.Fatalf("expired push: %v", p)
	}
	if rec := a.json("GET", "/v0/actions/"+action, nil, 200); rec["state"] != "expired" {
		t.Fatalf("expired record: %v", rec)
	}
	a.fail("POST", "/v0/actions/"+action+"/respond", obj{"decision": "allow_once"}, 409, "CONFLICT")
	// An expiry the policy allows lets the step run, still recorded as expired.
	_, _, step2, action2 := pendingAction(t, a, ag, "lenient.job")
	p = ag.expect("approval.resolved")
	if p["step_id"] != step2 || p["approved"] != true || p["outcome"] != "expired" {
		t.Fatalf("lenient expiry push: %v", p)
	}
	if rec := a.json("GET", "/v0/actions/"+action2, nil, 200); rec["state"] != "expired" {
		t.Fatalf("lenient record: %v", rec)
	}
}

func TestCancelRetractsThePrompt(t *testing.T) {
	a := bridgeServer(t, node.Options{})
	ag := a.agent("cx-agent", "c1")
	execID, _, _, action := pendingAction(t, a, ag, "deploy.x")
	a.json("POST", "/v0/executions/"+execID+"/cancel", nil, 200)
	if rec := a.json("GET", "/v0/actions/"+action, nil, 200); rec["state"] != "cancelled" {
		t.Fatalf("record after cancel: %v", rec)
	}
	if got := a.json("GET", "/v0/actions?status=pending", nil, 200)["actions"].([]any); len(got) != 0 {
		t.Fatalf("pending after cancel: %v", got)
	}
}

func TestPendingPromptsSurviveRestart(t *testing.T) {
	s := bridgeNode(t, node.Options{})
	a := newAPI(t, s)
	ag := a.agent("rs-bridge", "c1")
	_, _, step, action := pendingAction(t, a, ag, "deploy.later")
	s.Restart()
	a = newAPI(t, s)
	ag = a.agent("rs-bridge", "c1")
	if got := a.json("GET", "/v0/actions?status=pending", nil, 200)["actions"].([]any); len(got) != 1 || got[0].(obj)["action_id"] != action {
		t.Fatalf("pending after restart: %v", got)
	}
	a.json("POST", "/v0/actions/"+action+"/respond", obj{"decision": "allow_once"}, 200)
	if p := ag.expect("approval.resolved"); p["step_id"] != step || p["approved"] != true {
		t.Fatalf("after restart: %v", p)
	}
}

func TestWhoMayAnswer(t *testing.T) {
	a := bridgeServer(t, node.Options{Auth: jwtOptions()})
	alice := mint(t, auth.Claims{Subject: "alice", Role: auth.RoleClient})
	a.token = alice
	agentTok := mint(t, auth.Claims{Subject: "bot", Role: auth.RoleAgent, Agents: []string{"who-agent"}})
	a.token = agentTok
	ag := a.agent("who-agent", "c1")
	a.token = alice
	execID := a.create("who-agent", nil)["id"].(string)
	lease := ag.expect("execution.assigned")["session_id"].(string)
	a.token = agentTok
	step := a.intent(execID, lease, obj{"type": "invoke_tool", "tool_id": "deploy.z"}, 200)["step_id"]
	a.token = alice
	list := a.json("GET", "/v0/actions?status=pending", nil, 200)["actions"].([]any)
	if len(list) != 1 || list[0].(obj)["owner"] != "alice" || list[0].(obj)["step_id"] != step {
		t.Fatalf("alice's prompts: %v", list)
	}
	action := list[0].(obj)["action_id"].(string)

	a.token = agentTok // the agent can never answer its own prompt
	a.fail("POST", "/v0/actions/"+action+"/respond", obj{"decision": "allow_once"}, 403, "FORBIDDEN")
	a.token = mint(t, auth.Claims{Subject: "mallory", Role: auth.RoleChannel})
	// Another person's prompt is not there for mallory: 404, word for word
	// the answer for an id that does not exist.
	hidden := a.fail("POST", "/v0/actions/"+action+"/respond", obj{"decision": "allow_once"}, 404, "NOT_FOUND")
	if missing := a.fail("POST", "/v0/actions/"+action+"x/respond", obj{"decision": "allow_once"}, 404, "NOT_FOUND"); strings.ReplaceAll(missing["error"].(string), action+"x", action) != hidden["error"] {
		t.Fatalf("hidden %q, missing %q", hidden["error"], missing["error"])
	}
	a.fail("GET", "/v0/actions/"+action, nil, 404, "NOT_FOUND")
	if got := a.json("GET", "/v0/actions?status=pending", nil, 200)["actions"].([]any); len(got) != 0 {
		t.Fatalf("mallory sees %v", got)
	}
	a.token = mint(t, auth.Claims{Subject: "alice", Role: auth.RoleChannel})
	a.json("POST", "/v0/actions/"+action+"/respond", obj{"decision": "deny", "channel_id": "chat"}, 200)
}
