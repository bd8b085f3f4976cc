package conformance

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"
)

const aap = "/aap/v1"

// aapAgent is the suite acting as an AAP agent: a /v0 agent that declared
// its AgentInfo.
func (t *tc) aapAgent() *agent {
	if t.routeMissing(http.MethodGet, aap+"/meta") {
		t.skipf("the gateway serves no /aap/v1 surface")
	}
	a := t.newAgent()
	t.expectJSON(t.call(http.MethodPut, aap+"/agents/"+a.id, map[string]any{"name": a.id, "version": "1.0.0", "description": "the conformance suite"}), http.StatusOK)
	return a
}

// aapAnswer acts as agent a on its next turn: it says text in deltas, then
// as a whole, and completes.
func (a *agent) aapAnswer(t *tc, deltas ...string) {
	_, assigned := a.s.nextEvent(t, "execution.assigned", nil)
	r := &run{a: a, id: t.wantStr(assigned, "execution_id", "execution.assigned"), session: t.wantStr(assigned, "session_id", "execution.assigned")}
	for _, d := range deltas {
		r.accepted(map[string]any{"type": "output", "output": map[string]any{"kind": "text_delta", "text": d}})
	}
	r.accepted(map[string]any{"type": "output", "output": map[string]any{"kind": "text", "text": strings.Join(deltas, "")}})
	r.complete(nil)
}

// aapCall is an AAP request in flight, made off the check's goroutine so
// that the suite can act as the agent meanwhile.
type aapCall struct {
	done   chan struct{}
	status int
	body   []byte
	err    error
}

func (t *tc) aapStart(method, path string, body any) *aapCall {
	req := t.newRequest(t.ctx, method, path, body, nil)
	c := &aapCall{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		resp, err := t.o.HTTPClient.Do(req)
		if err != nil {
			c.err = err
			return
		}
		defer resp.Body.Close()
		c.status = resp.StatusCode
		c.body, c.err = io.ReadAll(resp.Body)
	}()
	return c
}

// wait returns the answer, or fails the check after 20 s.
func (c *aapCall) wait(t *tc) (int, []byte) {
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		t.fatalf("no answer within 20s")
	}
	if c.err != nil {
		t.fatalf("AAP request: %v", c.err)
	}
	return c.status, c.body
}

// aapEvent is one event of an AAP stream.
type aapEvent struct {
	id, name string
	data     obj
}

func parseAAP(body []byte) []aapEvent {
	var out []aapEvent
	var cur aapEvent
	for _, line := range strings.Split(string(body), "\n") {
		switch {
		case line == "":
			if cur.name != "" {
				out = append(out, cur)
			}
			cur = aapEvent{}
		case strings.HasPrefix(line, "id: "):
			cur.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			cur.name = line[7:]
		case strings.HasPrefix(line, "data: "):
			_ = json.Unmarshal([]byte(line[6:]), &cur.data)
		}
	}
	return out
}

func checkAAPMeta(t *tc) {
	a := t.aapAgent()
	meta := t.expectJSON(t.call(http.MethodGet, aap+"/meta", nil), http.StatusOK)
	if v, _ := meta.num("version"); v != 1 {
		t.fatalf("meta version: %v", meta)
	}
	if !t.aapOnline(a.id) {
		t.fatalf("the declared, connected agent %s is not listed online: %v", a.id, meta)
	}
}

// aapOnline reports whether /aap/v1/meta lists agent name as online.
func (t *tc) aapOnline(name string) bool {
	meta := t.expectJSON(t.call(http.MethodGet, aap+"/meta", nil), http.StatusOK)
	for _, ag := range objects(meta, "agents") {
		if n, _ := ag.str("name"); n == name {
			online, _ := ag.boolean("online")
			return online
		}
	}
	return false
}

func userMessage(text string) []any {
	return []any{map[string]any{"role": "user", "content": text}}
}

func checkAAPTurnNone(t *tc) {
	a := t.aapAgent()
	call := t.aapStart(http.MethodPut, aap+"/session", map[string]any{"agent": map[string]any{"name": a.id}, "messages": userMessage("ping")})
	a.aapAnswer(t, "po", "ng")
	status, body := call.wait(t)
	var out obj
	if status != http.StatusCreated || json.Unmarshal(body, &out) != nil {
		t.fatalf("PUT /session (none): %d %s", status, body)
	}
	t.wantStr(out, "sessionId", "the answer")
	if !strings.Contains(string(out["messages"]), `"role":"assistant"`) || !strings.Contains(string(out["messages"]), "pong") {
		t.fatalf("the reply is not an assistant message saying pong: %s", body)
	}
}

func checkAAPTurnDelta(t *tc) {
	a := t.aapAgent()
	call := t.aapStart(http.MethodPut, aap+"/session", map[string]any{"agent": map[string]any{"name": a.id}, "stream": "delta", "messages": userMessage("count")})
	a.aapAnswer(t, "one ", "two ", "three")
	status, body := call.wait(t)
	if status != http.StatusOK {
		t.fatalf("PUT /session (delta): %d %s", status, body)
	}
	evs := parseAAP(body)
	var deltas []string
	stops, started := 0, false
	for _, e := range evs {
		if e.id == "" {
			t.fatalf("event %s without an id", e.name)
		}
		switch e.name {
		case "turn_start":
			started = true
		case "text_delta":
			d, _ := e.data.str("delta")
			deltas = append(deltas, d)
		case "turn_stop":
			stops++
		}
	}
	if !started || stops != 1 || strings.Join(deltas, "") != "one two three" || evs[len(evs)-1].name != "turn_stop" {
		t.fatalf("delta stream: turn_start %v, %d turn_stop, deltas %q: %s", started, stops, deltas, body)
	}
}

func checkAAPHistoryListDelete(t *tc) {
	a := t.aapAgent()
	call := t.aapStart(http.MethodPut, aap+"/session", map[string]any{"agent": map[string]any{"name": a.id}, "messages": userMessage("remember me")})
	a.aapAnswer(t, "remembered")
	status, body := call.wait(t)
	var out obj
	if status != http.StatusCreated || json.Unmarshal(body, &out) != nil {
		t.fatalf("PUT /session: %d %s", status, body)
	}
	id := t.wantStr(out, "sessionId", "the answer")
	h := t.expectJSON(t.call(http.MethodGet, aap+"/session/"+id+"?history=full", nil), http.StatusOK)
	if s := string(h["history"]); !strings.Contains(s, "remember me") || !strings.Contains(s, "remembered") {
		t.fatalf("history: %s", h["history"])
	}
	listed := false
	for after := ""; ; {
		page := t.expectJSON(t.call(http.MethodGet, aap+"/sessions?after="+after, nil), http.StatusOK)
		var ids []string
		_ = json.Unmarshal(page["sessions"], &ids)
		for _, x := range ids {
			listed = listed || x == id
		}
		next, ok := page.str("next")
		if !ok || listed {
			break
		}
		after = next
	}
	if !listed {
		t.fatalf("session %s is not listed", id)
	}
	r := t.call(http.MethodDelete, aap+"/session/"+id, nil)
	if r.status != http.StatusNoContent || len(r.body) != 0 {
		t.fatalf("DELETE: want 204 with no body: %s", r)
	}
	if r := t.call(http.MethodGet, aap+"/session/"+id, nil); r.status != http.StatusNotFound {
		t.fatalf("a deleted session: want 404: %s", r)
	}
}

func checkAAPExternalAgent(t *tc) {
	if t.o.AAPAgent == "" {
		t.skipf("needs a running AAP agent: pass --aap-agent NAME")
	}
	// The agent may still be starting: wait for it to be declared online.
	for deadline := time.Now().Add(20 * time.Second); !t.aapOnline(t.o.AAPAgent); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.fatalf("agent %s is not declared and online in /aap/v1/meta", t.o.AAPAgent)
		}
	}
	call := t.aapStart(http.MethodPut, aap+"/session", map[string]any{"agent": map[string]any{"name": t.o.AAPAgent}, "stream": "delta", "messages": userMessage("hello")})
	status, body := call.wait(t)
	if status != http.StatusOK {
		t.fatalf("PUT /session to %s: %d %s", t.o.AAPAgent, status, body)
	}
	stops, text := 0, false
	for _, e := range parseAAP(body) {
		switch e.name {
		case "turn_stop":
			stops++
		case "text_delta", "text":
			text = true
		}
	}
	if stops != 1 || !text {
		t.fatalf("agent %s: %d turn_stop, text %v: %s", t.o.AAPAgent, stops, text, body)
	}
}
