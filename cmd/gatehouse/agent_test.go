package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/client/sse"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// aapClient speaks AAP v1 as the official client does: JSON on every
// request, SSE parsed by event name, the stream read to EOF.
type aapClient struct {
	t    *testing.T
	base string // ends in /aap/v1
}

type aapEvent struct {
	name string
	data map[string]any
	id   string
}

func (c *aapClient) req(method, path string, body any) *http.Response {
	c.t.Helper()
	var r io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		r = bytes.NewReader(data)
	}
	req, _ := http.NewRequestWithContext(c.t.Context(), method, c.base+path, r)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

func (c *aapClient) json(method, path string, body any, want int) map[string]any {
	c.t.Helper()
	resp := c.req(method, path, body)
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		c.t.Fatalf("%s %s: %d, want %d: %s", method, path, resp.StatusCode, want, data)
	}
	var out map[string]any
	if len(data) > 0 {
		if err := json.Unmarshal(data, &out); err != nil {
			c.t.Fatalf("%s %s: %v: %s", method, path, err, data)
		}
	}
	return out
}

// stream sends a streaming request and reads every event until EOF.
func (c *aapClient) stream(method, path string, body any) []aapEvent {
	c.t.Helper()
	resp := c.req(method, path, body)
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		data, _ := io.ReadAll(resp.Body)
		c.t.Fatalf("%s %s: %d %s: %s", method, path, resp.StatusCode, resp.Header.Get("Content-Type"), data)
	}
	return readAAP(c.t, resp.Body)
}

func readAAP(t *testing.T, r io.Reader) []aapEvent {
	t.Helper()
	var out []aapEvent
	sr := sse.NewReader(r, 1<<20)
	for {
		ev, err := sr.Next()
		if err != nil {
			return out
		}
		e := aapEvent{name: ev.Type, id: ev.ID}
		if err := json.Unmarshal(ev.Data, &e.data); err != nil {
			t.Fatalf("data of %s is not one JSON object: %q", e.name, ev.Data)
		}
		out = append(out, e)
	}
}

func names(evs []aapEvent) string {
	var n []string
	for _, e := range evs {
		n = append(n, e.name)
	}
	return strings.Join(n, " ")
}

// askEcho opens a session whose first turn asks for gatehouse.echo, an
// untrusted server tool: the turn stops with tool_use, the call open, its
// tool_call the event before the stop. It returns the turn's events and the
// session id.
func (c *aapClient) askEcho() ([]aapEvent, string) {
	c.t.Helper()
	agent := map[string]any{"name": "example", "tools": []any{map[string]any{"name": "gatehouse.echo"}}}
	evs := c.stream("PUT", "/session", map[string]any{"agent": agent, "stream": "delta", "messages": []any{userMsg("echo ping")}})
	wantOneStop(c.t, evs, "tool_use")
	return evs, evs[0].data["sessionId"].(string)
}

// wantOneStop checks the AAP rule: exactly one turn_stop, the last event.
func wantOneStop(t *testing.T, evs []aapEvent, reason string) {
	t.Helper()
	stops := strings.Count(" "+names(evs)+" ", " turn_stop ")
	if stops != 1 || evs[len(evs)-1].name != "turn_stop" || evs[len(evs)-1].data["stopReason"] != reason {
		t.Fatalf("want one turn_stop(%s), last: %s", reason, names(evs))
	}
}

func text(evs []aapEvent, name, key string) string {
	var b strings.Builder
	for _, e := range evs {
		if e.name == name {
			b.WriteString(e.data[key].(string))
		}
	}
	return b.String()
}

// aapWorld runs a gateway, `gatehouse runner` and `gatehouse agent`, as
// the README's AAP quick start does.
func aapWorld(t *testing.T) (*nodetest.Server, *aapClient) {
	t.Helper()
	return aapWorldWith(t, node.Options{})
}

// aapWorldWith is aapWorld with a gateway of options o.
func aapWorldWith(t *testing.T, o node.Options) (*nodetest.Server, *aapClient) {
	t.Helper()
	o.Kernel.AgentGrace = time.Minute
	s := nodetest.Start(t, o)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		_ = runnerCmd(ctx, []string{"--url", s.URL, "--runner-id", "r1", "--log-level", "error"}, io.Discard, io.Discard)
	}()
	go func() {
		_ = agentCmd(ctx, []string{"--url", s.URL, "--name", "example", "--log-level", "error"}, io.Discard, io.Discard)
	}()
	c := &aapClient{t: t, base: s.URL + "/aap/v1"}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		meta := c.json("GET", "/meta", nil, 200)
		if agents := meta["agents"].([]any); len(agents) == 1 && agents[0].(map[string]any)["online"] == true {
			if meta["version"] != 1.0 || agents[0].(map[string]any)["name"] != "example" {
				t.Fatalf("meta: %v", meta)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the example agent did not come online")
		}
	}
	return s, c
}

func userMsg(text string) map[string]any { return map[string]any{"role": "user", "content": text} }

func TestAAPTurnsInEveryMode(t *testing.T) {
	s, c := aapWorld(t)
	agent := map[string]any{"name": "example", "options": map[string]any{"greeting": "Hi", "api_key": "sk-secret"}}
	c.json("PUT", "/session", map[string]any{"agent": agent, "messages": []any{map[string]any{"role": "assistant", "content": "x"}}}, 400)
	c.json("PUT", "/session", map[string]any{"agent": map[string]any{"name": "nobody"}, "messages": []any{userMsg("hi")}}, 404)

	// none: 201 with the session and this turn's messages only.
	created := c.json("PUT", "/session", map[string]any{"agent": agent, "messages": []any{map[string]any{"role": "system", "content": "be brief"}, userMsg("hello")}}, 201)
	id := created["sessionId"].(string)
	msgs := created["messages"].([]any)
	if created["stopReason"] != "end_turn" || len(msgs) != 1 || !strings.Contains(fmt.Sprint(msgs[0]), "Hi, you said: hello") {
		t.Fatalf("none mode: %v", created)
	}
	// delta: turn_start, thinking, deltas, one turn_stop, then EOF.
	evs := c.stream("POST", "/session/"+id, map[string]any{"stream": "delta", "messages": []any{userMsg("again")}})
	if evs[0].name != "turn_start" || text(evs, "text_delta", "delta") != "Hi, you said: again" || text(evs, "thinking_delta", "delta") != "The user said: again" {
		t.Fatalf("delta mode: %s", names(evs))
	}
	wantOneStop(t, evs, "end_turn")
	var last float64
	for i, e := range evs {
		n, err := strconv.ParseFloat(e.id, 64)
		if err != nil || n <= last {
			t.Fatalf("event %d (%s) has id %q after %v", i, e.name, e.id, last)
		}
		last = n
	}
	// message: whole text and thinking blocks.
	evs = c.stream("POST", "/session/"+id, map[string]any{"stream": "message", "messages": []any{userMsg("third")}})
	if text(evs, "text", "text") != "Hi, you said: third" || text(evs, "thinking", "thinking") != "The user said: third" || strings.Contains(names(evs), "delta") {
		t.Fatalf("message mode: %s", names(evs))
	}
	wantOneStop(t, evs, "end_turn")
	// PUT in a stream mode opens with session_start.
	evs = c.stream("PUT", "/session", map[string]any{"agent": agent, "stream": "delta", "messages": []any{userMsg("new")}})
	if evs[0].name != "session_start" || evs[0].data["sessionId"] == "" || evs[1].name != "turn_start" {
		t.Fatalf("PUT stream: %s", names(evs))
	}

	// GET: secrets masked, history compacted and full from the log.
	got := c.json("GET", "/session/"+id+"?history=full", nil, 200)
	opts := got["agent"].(map[string]any)["options"].(map[string]any)
	if opts["api_key"] != "***" || opts["greeting"] != "Hi" {
		t.Fatalf("options: %v", opts)
	}
	full := got["history"].(map[string]any)["full"].([]any)
	if len(full) != 7 || full[0].(map[string]any)["role"] != "system" {
		t.Fatalf("full history: %v", full)
	}
	if h := c.json("GET", "/session/"+id+"?history=bogus", nil, 200); h["history"] != nil {
		t.Fatalf("an unknown history type: %v", h)
	}
	// Options merge by key; the agent name cannot change; tools replace.
	c.json("POST", "/session/"+id, map[string]any{"agent": map[string]any{"name": "other"}, "messages": []any{userMsg("x")}}, 400)
	post := c.json("POST", "/session/"+id, map[string]any{"agent": map[string]any{"options": map[string]any{"style": "loud"}}, "tools": []any{}, "messages": []any{userMsg("shout")}}, 200)
	if post["sessionId"] != nil || !strings.Contains(fmt.Sprint(post["messages"]), "HI, YOU SAID: SHOUT") {
		t.Fatalf("POST none: %v", post)
	}
	got = c.json("GET", "/session/"+id, nil, 200)
	if o := got["agent"].(map[string]any)["options"].(map[string]any); o["greeting"] != "Hi" || o["style"] != "loud" || got["history"] != nil {
		t.Fatalf("after merging options: %v", got)
	}
	// The secret reached the agent's context, never the session's events.
	export := (&aapClient{t: t, base: s.URL}).json("GET", "/agent-runtime/exports/"+id, nil, 200)
	if strings.Contains(fmt.Sprint(export), "sk-secret") {
		t.Fatal("a secret option reached the session's events")
	}
}

func TestAAPServerToolAskedAndAnsweredByTheClient(t *testing.T) {
	s, c := aapWorld(t)
	evs, id := c.askEcho()
	call := evs[len(evs)-2]
	if call.name != "tool_call" || call.data["name"] != "gatehouse.echo" {
		t.Fatalf("before the stop: %s", names(evs))
	}
	callID := call.data["toolCallId"].(string)
	c.json("POST", "/session/"+id, map[string]any{"messages": []any{userMsg("hi")}}, 409)
	c.json("POST", "/session/"+id, map[string]any{"messages": []any{map[string]any{"role": "tool_permission", "toolCallId": "nope", "granted": true}}}, 400)
	// Granted: the result is reported, and the turn goes on.
	evs = c.stream("POST", "/session/"+id, map[string]any{"stream": "delta", "messages": []any{map[string]any{"role": "tool_permission", "toolCallId": callID, "granted": true}}})
	if !strings.Contains(names(evs), "tool_result") || text(evs, "text_delta", "delta") != "The runner echoed: ping" {
		t.Fatalf("after granting: %s", names(evs))
	}
	wantOneStop(t, evs, "end_turn")
	// The answer is the owner's channel log's, as every door's is.
	var action string
	for _, x := range apiCall(t, s.URL, "", "GET", "/v0/actions", nil, 200)["actions"].([]any) {
		if rec := x.(map[string]any); rec["step_id"] == callID {
			action = rec["action_id"].(string)
		}
	}
	if r := returnedEvent(t, s.URL, "", action); r["channel_id"] != "aap" || r["native_peer_id"] != "local" || r["decision"] != "allow_once" {
		t.Fatalf("the AAP client's answer in the channel log: %v", r)
	}
	// Denied: the agent is told and says so.
	evs = c.stream("POST", "/session/"+id, map[string]any{"stream": "delta", "messages": []any{userMsg("echo pong")}})
	call = evs[len(evs)-2]
	evs = c.stream("POST", "/session/"+id, map[string]any{"stream": "message", "messages": []any{map[string]any{"role": "tool_permission", "toolCallId": call.data["toolCallId"], "granted": false, "reason": "not now"}}})
	if !strings.HasPrefix(text(evs, "text", "text"), "I may not echo") {
		t.Fatalf("after denying: %s", names(evs))
	}
	wantOneStop(t, evs, "end_turn")
	// A trusted tool runs inline: tool_call, tool_result, and on.
	trusted := []any{map[string]any{"name": "gatehouse.echo", "trust": true}}
	evs = c.stream("POST", "/session/"+id, map[string]any{"agent": map[string]any{"tools": trusted}, "stream": "delta", "messages": []any{userMsg("echo trusted")}})
	if !strings.Contains(names(evs), "tool_call tool_result") {
		t.Fatalf("trusted: %s", names(evs))
	}
	wantOneStop(t, evs, "end_turn")
}

func TestAAPClientToolRoundTrip(t *testing.T) {
	_, c := aapWorld(t)
	tools := []any{map[string]any{"name": "lookup", "description": "look something up", "inputSchema": map[string]any{"type": "object"}}}
	evs := c.stream("PUT", "/session", map[string]any{"agent": map[string]any{"name": "example"}, "tools": tools, "stream": "delta", "messages": []any{userMsg("use lookup")}})
	wantOneStop(t, evs, "tool_use")
	id := evs[0].data["sessionId"].(string)
	call := evs[len(evs)-2]
	if call.name != "tool_call" || call.data["name"] != "lookup" {
		t.Fatalf("client tool call: %s", names(evs))
	}
	got := c.json("GET", "/session/"+id+"?history=full", nil, 200)
	if got["tools"] == nil || !strings.Contains(fmt.Sprint(got["history"]), "tool_use") {
		t.Fatalf("a resumed client needs its tools and the open call: %v", got)
	}
	evs = c.stream("POST", "/session/"+id, map[string]any{"stream": "delta", "messages": []any{map[string]any{"role": "tool", "toolCallId": call.data["toolCallId"], "content": "42"}}})
	if text(evs, "text_delta", "delta") != "Your tool said: 42" || strings.Contains(names(evs), "tool_result") {
		t.Fatalf("after the client's result: %s", names(evs))
	}
	wantOneStop(t, evs, "end_turn")
	c.json("POST", "/session/"+id, map[string]any{"messages": []any{map[string]any{"role": "tool", "toolCallId": call.data["toolCallId"], "content": "again"}}}, 400)
}

func TestAAPListDeleteAndOwners(t *testing.T) {
	_, c := aapWorld(t)
	var ids []string
	for range 3 {
		ids = append(ids, c.json("PUT", "/session", map[string]any{"agent": map[string]any{"name": "example"}, "messages": []any{userMsg("hi")}}, 201)["sessionId"].(string))
	}
	list := c.json("GET", "/sessions", nil, 200)
	if len(list["sessions"].([]any)) != 3 || list["next"] != nil {
		t.Fatalf("list: %v", list)
	}
	resp := c.req("DELETE", "/session/"+ids[0], nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 204 || len(body) != 0 {
		t.Fatalf("DELETE: %d %q", resp.StatusCode, body)
	}
	c.json("GET", "/session/"+ids[0], nil, 404)
	c.json("POST", "/session/"+ids[0], map[string]any{"messages": []any{userMsg("hi")}}, 404)
	if list := c.json("GET", "/sessions", nil, 200); len(list["sessions"].([]any)) != 2 {
		t.Fatalf("after DELETE: %v", list)
	}
}

func TestAAPStreamResumesAfterLastEventID(t *testing.T) {
	_, c := aapWorld(t)
	evs := c.stream("PUT", "/session", map[string]any{"agent": map[string]any{"name": "example"}, "stream": "delta", "messages": []any{userMsg("resume me please")}})
	id := evs[0].data["sessionId"].(string)
	cut := 3
	req, _ := http.NewRequestWithContext(t.Context(), "GET", c.base+"/session/"+id+"/stream", nil)
	req.Header.Set("Last-Event-ID", evs[cut].id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rest := readAAP(t, resp.Body)
	if names(rest) != names(evs[cut+1:]) || rest[0].id != evs[cut+1].id {
		t.Fatalf("resumed after %s:\n got %s\nwant %s", evs[cut].id, names(rest), names(evs[cut+1:]))
	}
	// An id the stream never sent is a 400, not a replay from the start.
	for _, bad := range []string{"x.y", "5.", "-1", "18446744073709551616"} {
		req.Header.Set("Last-Event-ID", bad)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("Last-Event-ID %q: %d, want 400", bad, resp.StatusCode)
		}
	}
}

// TestAAPPermissionAnsweredByAChannel: the prompt of an untrusted server
// tool is a bridge prompt like any other: a person's channel answers it,
// the turn goes on to its end, and the AAP client's late answer finds no
// call waiting.
func TestAAPPermissionAnsweredByAChannel(t *testing.T) {
	s, c := aapWorld(t)
	evs, id := c.askEcho()
	callID := evs[len(evs)-2].data["toolCallId"].(string)
	v0 := &aapClient{t: t, base: s.URL + "/v0"}
	var action string
	for deadline := time.Now().Add(10 * time.Second); action == ""; time.Sleep(20 * time.Millisecond) {
		for _, x := range v0.json("GET", "/actions?status=pending", nil, 200)["actions"].([]any) {
			action = x.(map[string]any)["action_id"].(string)
		}
		if time.Now().After(deadline) {
			t.Fatal("no pending prompt for the AAP tool call")
		}
	}
	v0.json("POST", "/actions/"+action+"/respond", map[string]any{"decision": "allow_once"}, 200)
	ar := &aapClient{t: t, base: s.URL + "/agent-runtime"}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		th := ar.json("GET", "/sessions/"+id+"/threads/main", nil, 200)
		if th["status"] == "idle" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the turn did not end after the channel's answer: %v", th)
		}
	}
	if h := fmt.Sprint(c.json("GET", "/session/"+id+"?history=full", nil, 200)["history"]); !strings.Contains(h, "The runner echoed: ping") {
		t.Fatalf("the allowed call's result is not in the history: %s", h)
	}
	// The client's late denial answers no pending call: the channel's
	// allow stood.
	late := c.json("POST", "/session/"+id, map[string]any{"messages": []any{map[string]any{"role": "tool_permission", "toolCallId": callID, "granted": false}}}, 400)
	if !strings.Contains(fmt.Sprint(late["error"]), "waits for an answer") {
		t.Fatalf("the late answer: %v", late)
	}
}

// resume reads GET /session/{id}/stream after Last-Event-ID last ("" for
// none) to EOF.
func (c *aapClient) resume(id, mode, last string) []aapEvent {
	c.t.Helper()
	req, _ := http.NewRequestWithContext(c.t.Context(), "GET", c.base+"/session/"+id+"/stream?stream="+mode, nil)
	if last != "" {
		req.Header.Set("Last-Event-ID", last)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		data, _ := io.ReadAll(resp.Body)
		c.t.Fatalf("resume after %q: %d %s", last, resp.StatusCode, data)
	}
	return readAAP(c.t, resp.Body)
}

// wantResumable checks that every event of a stream has an id of its own
// and that resuming from each one gives exactly the events after it, ids
// and data included. A stream that stopped for tool_use is not resumed from
// its last event: the turn goes on after it.
func (c *aapClient) wantResumable(id, mode string, evs []aapEvent) {
	c.t.Helper()
	seen := map[string]int{}
	for i, e := range evs {
		if e.id == "" {
			c.t.Fatalf("event %d (%s) has no id", i, e.name)
		}
		if j, dup := seen[e.id]; dup {
			c.t.Fatalf("events %d (%s) and %d (%s) share id %s", j, evs[j].name, i, e.name, e.id)
		}
		seen[e.id] = i
	}
	last := len(evs)
	if evs[len(evs)-1].data["stopReason"] == "tool_use" {
		last--
	}
	for i := range last {
		rest := c.resume(id, mode, evs[i].id)
		if got, want := fmt.Sprint(rest), fmt.Sprint(evs[i+1:]); got != want {
			c.t.Fatalf("resumed after %s (%s):\n got %s\nwant %s", evs[i].id, evs[i].name, got, want)
		}
	}
}

// TestAAPEveryEventHasItsOwnID: session_start and turn_start used to share
// the id of the log position before the turn, so a resume from it skipped
// turn_start. Every event of every stream (a PUT's, a POST's after a
// permission, in both modes) has its own id, and a resume from any of them
// gives exactly the rest.
func TestAAPEveryEventHasItsOwnID(t *testing.T) {
	_, c := aapWorld(t)
	for _, mode := range []string{"delta", "message"} {
		t.Run(mode, func(t *testing.T) {
			c := &aapClient{t: t, base: c.base}
			agent := map[string]any{"name": "example", "tools": []any{map[string]any{"name": "gatehouse.echo"}}}
			evs := c.stream("PUT", "/session", map[string]any{"agent": agent, "stream": mode, "messages": []any{userMsg("echo ping")}})
			wantOneStop(t, evs, "tool_use")
			id := evs[0].data["sessionId"].(string)
			c.wantResumable(id, mode, evs)
			// Without Last-Event-ID: the turn from its turn_start.
			if all := c.resume(id, mode, ""); fmt.Sprint(all) != fmt.Sprint(evs[1:]) {
				t.Fatalf("the turn from its start:\n got %v\nwant %v", all, evs[1:])
			}
			callID := evs[len(evs)-2].data["toolCallId"]
			evs = c.stream("POST", "/session/"+id, map[string]any{"stream": mode, "messages": []any{map[string]any{"role": "tool_permission", "toolCallId": callID, "granted": true}}})
			wantOneStop(t, evs, "end_turn")
			c.wantResumable(id, mode, evs)
			// After the last turn_stop there is nothing: the stream ends.
			if rest := c.resume(id, mode, evs[len(evs)-1].id); len(rest) != 0 {
				t.Fatalf("after the turn's end: %v", rest)
			}
			evs = c.stream("POST", "/session/"+id, map[string]any{"stream": mode, "messages": []any{userMsg("hello again")}})
			c.wantResumable(id, mode, evs)
		})
	}
}

// officialFold folds a stream's events into history messages as the
// official AAP client does (typescript-sdk core, sseEventsToMessages): text
// and thinking deltas accumulate until any other event, which flushes the
// text first and then the thinking; tool_call adds a tool_use block;
// tool_result and turn_stop close the assistant message.
func officialFold(evs []aapEvent) []map[string]any {
	var history, blocks []map[string]any
	var text, thinking string
	for _, e := range evs {
		if e.name != "text_delta" && e.name != "thinking_delta" {
			if text != "" {
				blocks = append(blocks, map[string]any{"type": "text", "text": text})
				text = ""
			}
			if thinking != "" {
				blocks = append(blocks, map[string]any{"type": "thinking", "thinking": thinking})
				thinking = ""
			}
		}
		switch e.name {
		case "text_delta":
			text += e.data["delta"].(string)
		case "thinking_delta":
			thinking += e.data["delta"].(string)
		case "text":
			blocks = append(blocks, map[string]any{"type": "text", "text": e.data["text"]})
		case "thinking":
			blocks = append(blocks, map[string]any{"type": "thinking", "thinking": e.data["thinking"]})
		case "tool_call":
			blocks = append(blocks, map[string]any{"type": "tool_use", "toolCallId": e.data["toolCallId"], "name": e.data["name"], "input": e.data["input"]})
		case "tool_result":
			if len(blocks) > 0 {
				history = append(history, map[string]any{"role": "assistant", "content": blocks})
				blocks = nil
			}
			history = append(history, map[string]any{"role": "tool", "toolCallId": e.data["toolCallId"], "content": e.data["content"]})
		case "turn_stop":
			if len(blocks) > 0 {
				history = append(history, map[string]any{"role": "assistant", "content": blocks})
			}
		}
	}
	return history
}

// TestAAPClientHistoryIsTheServers: a client in delta mode that keeps its
// history as the official client does (the messages it sent, then the
// stream folded) holds exactly the server's full history, thinking
// included; so does one in message mode.
func TestAAPClientHistoryIsTheServers(t *testing.T) {
	_, c := aapWorld(t)
	for _, mode := range []string{"delta", "message"} {
		t.Run(mode, func(t *testing.T) {
			c := &aapClient{t: t, base: c.base}
			var mine []map[string]any
			send := func(method, path string, msgs ...map[string]any) []aapEvent {
				body := map[string]any{"stream": mode, "messages": msgs}
				if method == "PUT" {
					body["agent"] = map[string]any{"name": "example", "tools": []any{map[string]any{"name": "gatehouse.echo"}}}
				}
				evs := c.stream(method, path, body)
				for _, m := range msgs {
					if m["role"] != "tool_permission" { // the official client keeps these; the server never does
						mine = append(mine, m)
					}
				}
				return evs
			}
			evs := send("PUT", "/session", userMsg("hello"))
			id := evs[0].data["sessionId"].(string)
			mine = append(mine, officialFold(evs)...)
			evs = send("POST", "/session/"+id, userMsg("echo ping"))
			mine = append(mine, officialFold(evs)...)
			evs = send("POST", "/session/"+id, map[string]any{"role": "tool_permission", "toolCallId": evs[len(evs)-2].data["toolCallId"], "granted": true})
			mine = append(mine, officialFold(evs)...)

			full := c.json("GET", "/session/"+id+"?history=full", nil, 200)["history"].(map[string]any)["full"]
			got, _ := json.Marshal(mine)
			want, _ := json.Marshal(full)
			var g, w any
			_ = json.Unmarshal(got, &g)
			_ = json.Unmarshal(want, &w)
			if !reflect.DeepEqual(g, w) {
				t.Fatalf("the client's history differs from the server's:\nclient %s\nserver %s", got, want)
			}
			if !strings.Contains(string(want), `"thinking":"The user said: hello"`) {
				t.Fatalf("the server's history has no thinking: %s", want)
			}
		})
	}
}
