package gateway_test

import (
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/node"
)

// jwtBridgeServer starts a gateway that takes JWTs and asks for approval of
// deploy* tools.
func jwtBridgeServer(t *testing.T) func(auth.Claims) *api {
	t.Helper()
	s := bridgeNode(t, node.Options{Auth: jwtOptions()})
	return func(c auth.Claims) *api { return newAPIAs(t, s, c) }
}

// sameMissing checks that the answer about a hidden resource is the answer
// about one that does not exist, apart from the id.
func sameMissing(t *testing.T, hidden, missing obj, id, unknown string) {
	t.Helper()
	if hidden["code"] != "NOT_FOUND" || strings.ReplaceAll(missing["error"].(string), unknown, id) != hidden["error"] {
		t.Fatalf("hidden %v differs from missing %v", hidden, missing)
	}
}

// TestAnotherClientsExecutionIsNotThere: with two client tokens, bob can
// neither see nor touch alice's execution or prompt through any door, and
// is answered exactly as for ids that do not exist.
func TestAnotherClientsExecutionIsNotThere(t *testing.T) {
	as := jwtBridgeServer(t)
	alice := as(auth.Claims{Subject: "alice", Role: auth.RoleClient})
	bob := as(auth.Claims{Subject: "bob", Role: auth.RoleClient})
	agentAPI := as(auth.Claims{Subject: "bot", Role: auth.RoleAgent, Agents: []string{"own-agent"}})
	ag := agentAPI.agent("own-agent", "c1")
	id, lease := alice.assigned(ag, obj{"secret": "alice's"})
	step := agentAPI.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "deploy.prod"}, 200)["step_id"].(string)
	action := alice.json("GET", "/v0/actions?status=pending", nil, 200)["actions"].([]any)[0].(obj)["action_id"].(string)
	unknown := "01a00000-0000-7000-8000-000000000000"

	x, u := "/v0/executions/"+id, "/v0/executions/"+unknown
	approve := obj{"signal_type": "step.approve", "payload": obj{"step_id": step, "approved": true}}
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"GET", "", nil},
		{"GET", "/events", nil},
		{"POST", "/cancel", nil},
		{"POST", "/signal", obj{"signal_type": "go"}},
		{"POST", "/signal", approve},
	} {
		hidden := bob.fail(c.method, x+c.path, c.body, 404, "NOT_FOUND")
		sameMissing(t, hidden, bob.fail(c.method, u+c.path, c.body, 404, "NOT_FOUND"), id, unknown)
	}
	if _, status, body := bob.trySSE(x + "/stream"); status != 404 || !strings.Contains(body, "NOT_FOUND") {
		t.Fatalf("bob tails alice's execution: %d %s", status, body)
	}
	bob.wsRefused(x+"/ws", 404, "NOT_FOUND")
	if got := bob.json("GET", "/v0/executions", nil, 200)["executions"].([]any); len(got) != 0 {
		t.Fatalf("bob lists %v", got)
	}
	if got := alice.json("GET", "/v0/executions", nil, 200)["executions"].([]any); len(got) != 1 || got[0].(obj)["id"] != id {
		t.Fatalf("alice lists %v", got)
	}
	hidden := bob.fail("POST", "/v0/actions/"+action+"/respond", obj{"decision": "allow_once"}, 404, "NOT_FOUND")
	sameMissing(t, hidden, bob.fail("POST", "/v0/actions/"+unknown+"/respond", obj{"decision": "allow_once"}, 404, "NOT_FOUND"), action, unknown)
	if got := bob.json("GET", "/v0/actions", nil, 200)["actions"].([]any); len(got) != 0 {
		t.Fatalf("bob lists prompts %v", got)
	}
	// A channel of another person answers over its socket: the reply is
	// the same 404.
	mallory := as(auth.Claims{Subject: "mallory", Role: auth.RoleChannel})
	ch := mallory.dialWS("/v0/channels/ws?channel_id=phone&peer_id=m1", gateway.SubprotocolJSON)
	ch.expect("hello")
	if f := ch.command("respond", obj{"action_id": action, "decision": "allow_once"}); f.obj["status"] != 404.0 {
		t.Fatalf("mallory's socket answer: %v", f.obj)
	}
	// An agent never answers a prompt, also not by signal.
	agentAPI.fail("POST", x+"/signal", approve, 403, "FORBIDDEN")

	// Nothing bob did reached the execution or the prompt.
	if rec := alice.json("GET", "/v0/actions/"+action, nil, 200); rec["state"] != "pending" {
		t.Fatalf("prompt after bob: %v", rec)
	}
	for _, typ := range alice.eventTypes(id) {
		if typ == "signal.received" || typ == "execution.cancelled" {
			t.Fatalf("bob's request left %s in alice's log", typ)
		}
	}
	alice.json("POST", x+"/signal", approve, 200)
	ag.expect("approval.resolved")
	rec := alice.json("GET", "/v0/actions/"+action, nil, 200)
	if by := rec["decided_by"].(obj); rec["state"] != "approved" || by["principal"] != "alice" || by["channel_id"] != "signal" {
		t.Fatalf("record after alice's signal: %v", rec)
	}
}

// TestLateApprovalSignalGetsTheRecord: the first answer wins whichever door
// it took; a step.approve after it is refused with the recorded outcome and
// leaves nothing in the log.
func TestLateApprovalSignalGetsTheRecord(t *testing.T) {
	a := bridgeServer(t, node.Options{})
	ag := a.agent("late-agent", "c1")
	execID, _, step, action := pendingAction(t, a, ag, "deploy.late")
	a.json("POST", "/v0/actions/"+action+"/respond", obj{"decision": "deny", "channel_id": "phone"}, 200)
	ag.expect("approval.resolved")
	before := len(a.events(execID))
	late := a.fail("POST", "/v0/executions/"+execID+"/signal", obj{"signal_type": "step.approve", "payload": obj{"step_id": step, "approved": true}}, 409, "CONFLICT")
	if rec := late["details"].(obj)["recorded"].(obj); rec["state"] != "denied" || rec["decided_by"].(obj)["channel_id"] != "phone" {
		t.Fatalf("late signal: %v", late)
	}
	if after := len(a.events(execID)); after != before {
		t.Fatalf("a late answer wrote %d events", after-before)
	}
}

// TestTenantsPartitionOwners: the same subject in two tenants is two
// owners, and an admin with a tenant sees its tenant only.
func TestTenantsPartitionOwners(t *testing.T) {
	as := jwtBridgeServer(t)
	acme := as(auth.Claims{Subject: "alice", Role: auth.RoleClient, Tenant: "acme"})
	beta := as(auth.Claims{Subject: "alice", Role: auth.RoleClient, Tenant: "beta"})
	acmeAdmin := as(auth.Claims{Subject: "ops", Role: auth.RoleAdmin, Tenant: "acme"})
	root := as(auth.Claims{Subject: "root", Role: auth.RoleAdmin})
	id := acme.create("t-agent", nil)["id"].(string)
	other := beta.create("t-agent", nil)["id"].(string)
	beta.fail("GET", "/v0/executions/"+id, nil, 404, "NOT_FOUND")
	acmeAdmin.json("GET", "/v0/executions/"+id, nil, 200)
	acmeAdmin.fail("GET", "/v0/executions/"+other, nil, 404, "NOT_FOUND")
	if got := acmeAdmin.json("GET", "/v0/executions", nil, 200)["executions"].([]any); len(got) != 1 || got[0].(obj)["id"] != id {
		t.Fatalf("acme's admin lists %v", got)
	}
	if got := root.json("GET", "/v0/executions", nil, 200)["executions"].([]any); len(got) != 2 {
		t.Fatalf("the admin without a tenant lists %v", got)
	}
}

// TestStaticTokenIsOneOwner: the static token (like the open default) is a
// single owner that sees and answers everything.
func TestStaticTokenIsOneOwner(t *testing.T) {
	s := start(t, node.Options{Auth: auth.Options{StaticToken: "the-token"}})
	a := newAPI(t, s)
	a.token = "the-token"
	ag := a.agent("single", "c1")
	id, _ := a.assigned(ag, nil)
	a.json("GET", "/v0/executions/"+id, nil, 200)
	if got := a.json("GET", "/v0/executions", nil, 200)["executions"].([]any); len(got) != 1 {
		t.Fatalf("list: %v", got)
	}
	a.json("GET", "/v0/peers", nil, 200)
	a.json("POST", "/v0/executions/"+id+"/cancel", nil, 200)
}

// TestRunnerStartsOnlyItsOwnSteps: a runner reports started only for a step
// dispatched to it; the runner that holds the job still can.
func TestRunnerStartsOnlyItsOwnSteps(t *testing.T) {
	a, _, run, id, step := remoteStep(t, "st-agent", "st-runner", "work")
	run.expect("job.assigned")
	a.fail("POST", "/v0/runners/steps/"+step+"/started", obj{"execution_id": id, "runner_id": "intruder"}, 409, "CONFLICT")
	for _, typ := range a.eventTypes(id) {
		if typ == "step.started" {
			t.Fatal("another runner's started was recorded")
		}
	}
	a.json("POST", "/v0/runners/steps/"+step+"/started", obj{"execution_id": id, "runner_id": "st-runner"}, 200)
	if evs := a.events(id); evs[len(evs)-1]["type"] != "step.started" || evs[len(evs)-1]["payload"].(obj)["runner_id"] != "st-runner" {
		t.Fatalf("last event: %v", evs[len(evs)-1])
	}
}

// TestChannelAckIsTheOwnersOnly: a person acknowledges the deliveries of
// their own channels over HTTP; another person's channel is not there.
func TestChannelAckIsTheOwnersOnly(t *testing.T) {
	as := jwtBridgeServer(t)
	alice := as(auth.Claims{Subject: "alice", Role: auth.RoleChannel})
	mallory := as(auth.Claims{Subject: "mallory", Role: auth.RoleChannel})
	agentAPI := as(auth.Claims{Subject: "bot", Role: auth.RoleAgent, Agents: []string{"x"}})
	alice.openSSE("/v0/channels/stream?channel_id=phone&peer_id=a1&ack=explicit").close()
	ack := obj{"role": "channel", "id": "phone", "consumer_id": "a1", "sequence": 0}
	alice.json("POST", "/v0/peers/ack", ack, 200)
	mallory.fail("POST", "/v0/peers/ack", ack, 404, "NOT_FOUND")
	agentAPI.fail("POST", "/v0/peers/ack", ack, 403, "FORBIDDEN")
	alice.fail("POST", "/v0/peers/ack", obj{"role": "channel", "id": "phone", "consumer_id": "nobody"}, 404, "NOT_FOUND")
}

// TestSessionsAreTheirOwnersOnly: an execution filed under a durable
// session makes the session its creator's; another client filing work
// there is answered as for a session that does not exist.
func TestSessionsAreTheirOwnersOnly(t *testing.T) {
	as := jwtBridgeServer(t)
	alice := as(auth.Claims{Subject: "alice", Role: auth.RoleClient})
	bob := as(auth.Claims{Subject: "bob", Role: auth.RoleClient})
	alice.json("POST", "/v0/executions", obj{"agent_id": "a", "session_id": "alice-chat"}, 201)
	alice.json("POST", "/v0/executions", obj{"agent_id": "a", "session_id": "alice-chat"}, 201)
	hidden := bob.fail("POST", "/v0/executions", obj{"agent_id": "a", "session_id": "alice-chat"}, 404, "NOT_FOUND")
	if !strings.Contains(hidden["error"].(string), "session alice-chat") {
		t.Fatalf("hidden session: %v", hidden)
	}
	bob.json("POST", "/v0/executions", obj{"agent_id": "a", "session_id": "bob-chat"}, 201)
	alice.fail("POST", "/v0/executions", obj{"agent_id": "a", "session_id": "bad id/with slash"}, 400, "VALIDATION_ERROR")
}
