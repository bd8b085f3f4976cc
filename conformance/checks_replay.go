package conformance

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// largeResult is the size of each of a large execution's five results:
// 2.4 MB in all, more than two batches or pages of a server that bounds
// them at 1 MiB, so a replay that stops at such a bound shows.
const largeResult = 480 << 10

// checkReplayLarge reads a finished execution of 2.4 MB from the start on
// its SSE stream and its JSON WebSocket, and through the session that holds
// it on the Agent Runtime event stream: every event arrives whole, in
// order, and the execution's streams end after the terminal event.
func checkReplayLarge(t *tc) {
	session := newID("conf-session-")
	r := t.newAgent().startWith(map[string]any{"session_id": session})
	tool := newID("conformance.tool.")
	for i := range 5 {
		step := r.invoke(tool, map[string]any{"i": i}, false)
		t.expectOK(r.stepResult(step, true, map[string]any{"blob": strconv.Itoa(i) + strings.Repeat("x", largeResult)}, ""))
		r.push("tool.result", step)
	}
	r.complete(nil)
	evs := t.events(r.id)
	if len(evs) < 17 || evs[len(evs)-1].Type != "execution.completed" {
		t.fatalf("execution %s: unexpected log %s", r.id, typesOf(evs))
	}
	s := t.mustStream("/v0/executions/" + r.id + "/stream")
	t.wantFrames("SSE replay of 2.4 MB", s.readAll(t, 60*time.Second), evs, 0)
	t.replaySession(session)

	if t.routeMissing(http.MethodGet, "/v0/executions/"+r.id+"/ws") {
		return
	}
	ctx, cancel := t.within(60 * time.Second)
	defer cancel()
	h := http.Header{}
	if t.o.Token != "" {
		h.Set("Authorization", "Bearer "+t.o.Token)
	}
	u := "ws" + strings.TrimPrefix(t.o.URL, "http") + "/v0/executions/" + r.id + "/ws"
	c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: t.o.HTTPClient, HTTPHeader: h, Subprotocols: []string{"gatehouse.v1.json"}})
	if err != nil {
		t.fatalf("WebSocket replay: %v", err)
	}
	defer c.CloseNow()
	c.SetReadLimit(8 << 20)
	i := 0
	for {
		_, msg, err := c.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure || i != len(evs) {
				t.fatalf("WebSocket replay of 2.4 MB: %v after %d of %d events", err, i, len(evs))
			}
			return
		}
		var f struct {
			Type string          `json:"type"`
			Seq  uint64          `json:"seq"`
			Data json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(msg, &f); err != nil {
			t.fatalf("WebSocket replay: a frame that is not JSON (%v): %.200s", err, msg)
		}
		if f.Type != "event" {
			continue
		}
		if i >= len(evs) {
			t.fatalf("WebSocket replay: event %d after the terminal event", f.Seq)
		}
		if f.Seq != evs[i].Sequence || !sameJSON(f.Data, evs[i].raw) {
			t.fatalf("WebSocket replay: frame %d is event %d, want %d whole", i, f.Seq, evs[i].Sequence)
		}
		i++
	}
}

// replaySession reads the large execution through the session that holds
// it, on the Agent Runtime event stream, when the server has one: every
// result whole, through task.completed.
func (t *tc) replaySession(session string) {
	if t.routeMissing(http.MethodGet, "/agent-runtime/sessions") {
		return
	}
	s := t.mustStream("/agent-runtime/sessions/"+session+"/events", header("Accept", "text/event-stream"))
	defer s.close()
	results := 0
	s.next(t, "the session's events through the execution's end", func(f frame) bool {
		if f.event == "tool.result" && strings.Contains(f.data, strings.Repeat("x", largeResult)) {
			results++
		}
		return f.event == "task.completed"
	})
	if results < 5 {
		t.fatalf("the session stream reached task.completed after %d whole results of the 5", results)
	}
}
