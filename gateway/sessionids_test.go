package gateway_test

import (
	"bytes"
	"testing"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/node"
)

// TestTakenSessionIDAnswersAsAnUnknownOne: a session id that someone else
// took is refused on every surface that lets a client choose one (the
// Runtime API's and the Agent Runtime's creates, submit_turn that creates,
// the execution API's session_id) exactly as a read of that id is answered,
// which is word for word the answer for an id no one took: nothing says
// "exists", nor whose. The caller's own taken id stays a 409.
func TestTakenSessionIDAnswersAsAnUnknownOne(t *testing.T) {
	s := start(t, node.Options{Auth: jwtOptions()})
	alice := newAPIAs(t, s, auth.Claims{Subject: "alice", Role: auth.RoleClient})
	bob := newAPIAs(t, s, auth.Claims{Subject: "bob", Role: auth.RoleClient})
	alice.json("POST", "/runtime/v1/sessions", obj{"id": "taken-rt"}, 201)
	alice.json("POST", "/agent-runtime/sessions", obj{"sessionId": "taken-ar", "agentId": "ag"}, 201)

	// same checks two answers are equal once each one's id is put aside.
	same := func(what string, got, want []byte, gotID, wantID string) {
		t.Helper()
		if g, w := bytes.ReplaceAll(got, []byte(gotID), []byte("ID")), bytes.ReplaceAll(want, []byte(wantID), []byte("ID")); !bytes.Equal(g, w) {
			t.Fatalf("%s:\n%s\nwant, as for an unknown id:\n%s", what, got, want)
		}
	}
	answer := func(a *api, method, path string, body any, status int) []byte {
		t.Helper()
		got, data, _ := a.do(method, path, body)
		if got != status {
			t.Fatalf("%s %s: %d %s, want %d", method, path, got, data, status)
		}
		return data
	}
	for _, c := range []struct {
		surface, taken, free string
		create               func(id string) (string, any)
		read                 func(id string) string
	}{
		{"runtime", "taken-rt", "free-rt1",
			func(id string) (string, any) { return "/runtime/v1/sessions", obj{"id": id} },
			func(id string) string { return "/runtime/v1/sessions/" + id }},
		{"agent-runtime", "taken-ar", "free-ar1",
			func(id string) (string, any) { return "/agent-runtime/sessions", obj{"sessionId": id, "agentId": "ag"} },
			func(id string) string { return "/agent-runtime/sessions/" + id }},
		{"agent-runtime submit_turn", "taken-ar", "free-ar1",
			func(id string) (string, any) {
				return "/agent-runtime/commands/submit_turn", obj{"session_id": id, "agent_id": "ag", "input": "hi"}
			},
			func(id string) string { return "/agent-runtime/sessions/" + id }},
	} {
		t.Run(c.surface, func(t *testing.T) {
			unknown := answer(bob, "GET", c.read(c.free), nil, 404)
			same("reading another's session", answer(bob, "GET", c.read(c.taken), nil, 404), unknown, c.taken, c.free)
			path, body := c.create(c.taken)
			same("creating another's session id", answer(bob, "POST", path, body, 404), unknown, c.taken, c.free)
			answer(alice, "POST", path, body, map[bool]int{true: 200, false: 409}[c.surface == "agent-runtime submit_turn"])
		})
	}
	// The execution API answered so already; it still does.
	bob.fail("POST", "/v0/executions", obj{"agent_id": "ag", "session_id": "taken-rt"}, 404, "NOT_FOUND")
}

// TestSessionQuotaOnEverySurface: a principal at its quota is refused a new
// session however it asks, 403 QUOTA_EXCEEDED with the figures, while
// another principal is not; a session it has still takes work.
func TestSessionQuotaOnEverySurface(t *testing.T) {
	s := start(t, node.Options{Auth: jwtOptions(), SessionsPerPrincipal: 2})
	alice := newAPIAs(t, s, auth.Claims{Subject: "alice", Role: auth.RoleClient})
	bob := newAPIAs(t, s, auth.Claims{Subject: "bob", Role: auth.RoleClient})
	alice.json("POST", "/runtime/v1/sessions", obj{"id": "q-1"}, 201)
	alice.json("POST", "/agent-runtime/sessions", obj{"sessionId": "q-2", "agentId": "ag"}, 201)

	details := func(out obj) obj {
		t.Helper()
		d, _ := out["details"].(obj)
		if d["held"] != 2.0 || d["max"] != 2.0 {
			t.Fatalf("quota refusal without its figures: %v", out)
		}
		return d
	}
	out := alice.json("POST", "/runtime/v1/sessions", obj{"id": "q-3"}, 403)
	if details(out)["code"] != "QUOTA_EXCEEDED" {
		t.Fatalf("runtime create: %v", out)
	}
	out = alice.json("POST", "/runtime/v1/tools/memory_search", obj{"input": obj{"query": "x"}}, 403)
	if details(out)["code"] != "QUOTA_EXCEEDED" {
		t.Fatalf("runtime invocation without a session: %v", out)
	}
	details(alice.fail("POST", "/agent-runtime/sessions", obj{"agentId": "ag"}, 403, "QUOTA_EXCEEDED"))
	details(alice.fail("POST", "/agent-runtime/commands/submit_turn", obj{"session_id": "q-4", "agent_id": "ag", "input": "hi"}, 403, "QUOTA_EXCEEDED"))
	details(alice.fail("POST", "/v0/executions", obj{"agent_id": "ag", "session_id": "q-5"}, 403, "QUOTA_EXCEEDED"))

	// Her own sessions still take work, and bob has his own room.
	alice.json("POST", "/runtime/v1/sessions/q-1/tools/memory_search", obj{"input": obj{"query": "x"}}, 202)
	alice.json("POST", "/v0/executions", obj{"agent_id": "ag", "session_id": "q-2"}, 201)
	bob.json("POST", "/runtime/v1/sessions", obj{"id": "b-1"}, 201)
}
