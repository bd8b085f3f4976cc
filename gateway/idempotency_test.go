package gateway_test

import (
	"testing"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/node"
)

// TestIdempotentCreateAcrossRestart: a create retried with its
// Idempotency-Key answers 200 with the execution the first one made (201),
// also after a restart on the same data folder; the key with another body
// is 409; another principal's key of the same name is another key.
func TestIdempotentCreateAcrossRestart(t *testing.T) {
	s := start(t, node.Options{Auth: jwtOptions()})
	alice, bob := newAPI(t, s), newAPI(t, s)
	alice.token = mint(t, auth.Claims{Subject: "alice", Role: auth.RoleClient})
	bob.token = mint(t, auth.Claims{Subject: "bob", Role: auth.RoleClient})
	body := obj{"agent_id": "idem-agent", "input": obj{"n": 1}}
	key := []string{"Idempotency-Key", "create-1"}

	first := alice.json("POST", "/v0/executions", body, 201, key...)
	again := alice.json("POST", "/v0/executions", body, 200, key...)
	if again["id"] != first["id"] {
		t.Fatalf("retry made %v, first %v", again["id"], first["id"])
	}
	if c := alice.json("POST", "/v0/executions", obj{"agent_id": "idem-agent", "input": obj{"n": 2}}, 409, key...); c["code"] != "CONFLICT" {
		t.Fatalf("the key with another body: %v", c)
	}
	if theirs := bob.json("POST", "/v0/executions", body, 201, key...); theirs["id"] == first["id"] {
		t.Fatal("bob's key of the same name returned alice's execution")
	}
	if got := alice.json("GET", "/v0/executions", nil, 200)["executions"].([]any); len(got) != 1 {
		t.Fatalf("alice has %d executions after her retries", len(got))
	}

	s.Restart()
	if after := alice.json("POST", "/v0/executions", body, 200, key...); after["id"] != first["id"] {
		t.Fatalf("after restart the retry made %v, first %v", after["id"], first["id"])
	}
	if c := alice.json("POST", "/v0/executions", obj{"agent_id": "other"}, 409, key...); c["code"] != "CONFLICT" {
		t.Fatalf("after restart, the key with another body: %v", c)
	}
	alice.json("POST", "/v0/executions/"+first["id"].(string)+"/cancel", nil, 200)
	if replay := alice.json("POST", "/v0/executions", body, 200, key...); replay["status"] != "cancelled" {
		t.Fatalf("a replay shows the execution as it is: %v", replay)
	}
	// Without a key every create is new.
	a1 := alice.json("POST", "/v0/executions", body, 201)
	a2 := alice.json("POST", "/v0/executions", body, 201)
	if a1["id"] == a2["id"] {
		t.Fatal("two creates without a key made one execution")
	}
}
