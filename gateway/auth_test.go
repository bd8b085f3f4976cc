package gateway_test

import (
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

const (
	testSecret = "0123456789abcdef0123456789abcdef"
	testIss    = "gatehouse-test"
	testAud    = "gatehouse"
)

func mint(t *testing.T, c auth.Claims) string {
	t.Helper()
	c.Issuer, c.Audience = testIss, testAud
	if c.TTL == 0 {
		c.TTL = time.Hour
	}
	tok, err := auth.MintHS256([]byte(testSecret), c, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// jwtOptions are the authentication options that accept the tokens mint
// makes.
func jwtOptions() auth.Options {
	return auth.Options{HMACSecrets: map[string][]byte{"": []byte(testSecret)}, Issuer: testIss, Audience: testAud}
}

// newAPIAs is a client of s that presents a token minted for c.
func newAPIAs(t *testing.T, s *nodetest.Server, c auth.Claims) *api {
	t.Helper()
	a := newAPI(t, s)
	a.token = mint(t, c)
	return a
}

func TestJWTScopes(t *testing.T) {
	s := start(t, node.Options{Auth: jwtOptions()})
	admin := newAPIAs(t, s, auth.Claims{Subject: "ops", Role: auth.RoleAdmin})
	agentA := newAPIAs(t, s, auth.Claims{Subject: "agent-a", Role: auth.RoleAgent, Agents: []string{"scoped-a"}})
	runner1 := newAPIAs(t, s, auth.Claims{Subject: "r1", Role: auth.RoleRunner, Runners: []string{"scoped-r1"}, Tools: []string{"tool"}})

	// Each role opens only its own streams.
	ag := agentA.agent("scoped-a", "c1")
	if _, status, _ := agentA.trySSE("/v0/agents/stream?agent_id=scoped-b&consumer_id=c"); status != 403 {
		t.Fatalf("agent token on another agent's stream: %d", status)
	}
	run := runner1.runner("scoped-r1", "c1", "tool")
	if _, status, _ := runner1.trySSE("/v0/runners/stream?runner_id=scoped-r2&consumer_id=c"); status != 403 {
		t.Fatalf("runner token on another runner's stream: %d", status)
	}
	if _, status, _ := runner1.trySSE("/v0/agents/stream?agent_id=scoped-a&consumer_id=c"); status != 403 {
		t.Fatalf("runner token on an agent stream: %d", status)
	}
	// Only admins (and clients) drive the execution API.
	agentA.fail("POST", "/v0/executions", obj{"agent_id": "scoped-a"}, 403, "FORBIDDEN")
	runner1.fail("GET", "/v0/executions", nil, 403, "FORBIDDEN")

	id, lease := admin.assigned(ag, nil)
	step := agentA.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "tool", "remote": true}, 200)["step_id"]
	job := run.expect("job.assigned")
	runner1.fail("POST", "/v0/runners/scoped-r2/results", obj{"job_id": job["id"], "execution_id": id, "step_id": step, "success": true}, 403, "FORBIDDEN")
	runner1.json("POST", "/v0/runners/scoped-r1/results", obj{"job_id": job["id"], "execution_id": id, "step_id": step, "success": true}, 200)
	ag.expect("tool.result")

	// An agent token cannot write to another agent's execution, and is not
	// told that it exists.
	other := admin.create("scoped-b", nil)["id"].(string)
	agentA.fail("POST", "/v0/agents/intent", obj{"execution_id": other, "session_id": "x", "intent": obj{"type": "complete"}}, 404, "NOT_FOUND")
	runner1.fail("POST", "/v0/agents/intent", obj{"execution_id": id, "session_id": lease, "intent": obj{"type": "complete"}}, 403, "FORBIDDEN")
	client := newAPIAs(t, s, auth.Claims{Subject: "dashboard", Role: auth.RoleClient})
	client.fail("POST", "/v0/agents/intent", obj{"execution_id": id, "session_id": lease, "intent": obj{"type": "complete"}}, 403, "FORBIDDEN")
	client.fail("POST", "/v0/agents/step-result", obj{"execution_id": id, "session_id": lease, "step_id": step, "success": true}, 403, "FORBIDDEN")
	// A client sees the executions it created, not the admin's.
	client.fail("GET", "/v0/executions/"+id, nil, 404, "NOT_FOUND")
	mine := client.create("scoped-b", nil)["id"].(string)
	client.json("GET", "/v0/executions/"+mine, nil, 200)
	agentA.intent(id, lease, obj{"type": "complete"}, 200)

	for name, tok := range map[string]string{
		"expired":      mintExpired(t),
		"garbage":      "not.a.jwt",
		"other secret": mintOther(t),
	} {
		bad := newAPI(t, s)
		bad.token = tok
		status, body, _ := bad.do("GET", "/v0/executions", nil)
		if status != 401 {
			t.Errorf("%s token: %d %s", name, status, body)
		}
	}
}

func mintOther(t *testing.T) string {
	t.Helper()
	tok, err := auth.MintHS256([]byte("another-secret-of-at-least-32-bytes!"), auth.Claims{Subject: "x", Role: auth.RoleAdmin, TTL: time.Hour, Issuer: testIss, Audience: testAud}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func mintExpired(t *testing.T) string {
	t.Helper()
	tok, err := auth.MintHS256([]byte(testSecret), auth.Claims{Subject: "old", Role: auth.RoleAdmin, TTL: time.Minute, Issuer: testIss, Audience: testAud}, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestStreamEndsWhenTokenExpires(t *testing.T) {
	o := jwtOptions()
	o.Leeway = time.Millisecond
	s := start(t, node.Options{Auth: o})
	a := newAPIAs(t, s, auth.Claims{Subject: "short", Role: auth.RoleAgent, Agents: []string{"brief"}, TTL: 1500 * time.Millisecond})
	st := a.openSSE("/v0/agents/stream?agent_id=brief&consumer_id=c")
	if f := st.next(); f.Event != "stream.expired" {
		t.Fatalf("frame %s, want stream.expired", f.Event)
	}
	st.ended()
}
