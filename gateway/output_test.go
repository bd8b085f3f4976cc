package gateway_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/session"
)

// TestWebSocketAgentStreamsDeltas: an agent on a WebSocket sends output
// deltas without waiting for each reply; every one is answered once
// durable, and the session's log holds them all, in order, in few writes.
// Over HTTP an output intent answers once durable too.
func TestWebSocketAgentStreamsDeltas(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	ws := a.dialWS("/v0/agents/ws?agent_id=talker&consumer_id=c1", gateway.SubprotocolJSON)
	ws.expect("hello")
	a.json("POST", "/v0/executions", obj{"agent_id": "talker", "session_id": "talk-1"}, 201)
	_, assigned := ws.delivery("execution.assigned")
	exec, lease := assigned["execution_id"], assigned["session_id"]
	const n = 300
	before := s.Node.Store.Stats().Writes
	var want strings.Builder
	for i := range n {
		d := fmt.Sprintf("tok%d ", i)
		want.WriteString(d)
		ws.send(obj{"type": "command", "id": fmt.Sprintf("d%d", i), "command": "intent", "body": obj{
			"execution_id": exec, "session_id": lease, "intent": obj{"type": "output", "output": obj{"kind": "text_delta", "text": d}},
		}})
	}
	for i := range n {
		if body := ws.ok(ws.replyTo(fmt.Sprintf("d%d", i))); body["accepted"] != true {
			t.Fatalf("reply %d: %v", i, body)
		}
	}
	if writes := s.Node.Store.Stats().Writes - before; writes > n/10 {
		t.Errorf("%d deltas took %d store writes", n, writes)
	}
	a.json("POST", "/v0/agents/intent", obj{"execution_id": exec, "session_id": lease, "intent": obj{"type": "output", "output": obj{"kind": "status", "text": "thinking"}}}, 200)
	a.fail("POST", "/v0/agents/intent", obj{"execution_id": exec, "session_id": lease, "intent": obj{"type": "output", "output": obj{"kind": "shout"}}}, 400, "VALIDATION_ERROR")
	var got strings.Builder
	var kinds []string
	err := s.Node.Sessions.Read(context.Background(), "talk-1", 0, func(it session.Item) bool {
		switch it.Kind {
		case session.KindDelta:
			got.WriteString(it.Text)
		case session.KindFact:
			kinds = append(kinds, it.Type)
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != want.String() || kinds[len(kinds)-1] != session.FactOutput {
		t.Fatalf("session log: %d of %d delta bytes, facts %v", got.Len(), want.Len(), kinds)
	}
}

// TestAgentDeclaresOverItsSocket: an agent declares its AgentInfo with a
// declare command on its WebSocket, as over HTTP; /aap/v1/meta lists it,
// online, and a declaration naming another agent is refused.
func TestAgentDeclaresOverItsSocket(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	ws := a.dialWS("/v0/agents/ws?agent_id=decl&consumer_id=c1", gateway.SubprotocolJSON)
	ws.expect("hello")
	ws.ok(ws.command("declare", obj{"name": "decl", "version": "0.1.0", "description": "declared on its socket"}))
	if r := ws.command("declare", obj{"name": "someone-else", "version": "1"}); r.obj["status"] != 400.0 {
		t.Fatalf("declaring another agent: %v", r.obj)
	}
	meta := a.json("GET", "/aap/v1/meta", nil, 200)
	agents := meta["agents"].([]any)
	if len(agents) != 1 || agents[0].(obj)["name"] != "decl" || agents[0].(obj)["online"] != true {
		t.Fatalf("meta: %v", meta)
	}
}
