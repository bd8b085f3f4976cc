package conformance

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// largeExecution runs an execution whose six local steps each return
// 600 KB, 3.5 MB in all: more than any batch or page a server bounds by
// bytes, so a replay that stops at such a bound shows.
func (t *tc) largeExecution(body map[string]any) (*run, []event) {
	a := t.newAgent()
	r := a.startWith(body)
	tool := newID("conformance.tool.")
	for i := range 6 {
		step := r.invoke(tool, map[string]any{"i": i}, false)
		t.expectOK(r.stepResult(step, true, map[string]any{"blob": strconv.Itoa(i) + strings.Repeat("x", 600<<10)}, ""))
		r.push("tool.result", step)
	}
	r.complete(nil)
	evs := t.events(r.id)
	if len(evs) < 20 || evs[len(evs)-1].Type != "execution.completed" {
		t.fatalf("execution %s: unexpected log %s", r.id, typesOf(evs))
	}
	return r, evs
}

// checkReplayLarge reads a finished execution of 3.5 MB from the start on
// its SSE stream and its JSON WebSocket: every event arrives whole, in
// order, and the stream ends after the terminal event.
func checkReplayLarge(t *tc) {
	r, evs := t.largeExecution(map[string]any{})
	s := t.mustStream("/v0/executions/" + r.id + "/stream")
	t.wantFrames("SSE replay of 3.5 MB", s.readAll(t, 60*time.Second), evs, 0)

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
				t.fatalf("WebSocket replay of 3.5 MB: %v after %d of %d events", err, i, len(evs))
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

// checkReplayLargeSession reads the same 3.5 MB through the session that
// holds it, on the Agent Runtime event stream: every event of the
// execution, through its terminal one.
func checkReplayLargeSession(t *tc) {
	if t.routeMissing(http.MethodGet, "/agent-runtime/sessions") {
		t.skipf("not built: no /agent-runtime surface")
	}
	session := newID("conf-session-")
	_, evs := t.largeExecution(map[string]any{"session_id": session})
	s := t.mustStream("/agent-runtime/sessions/"+session+"/events", header("Accept", "text/event-stream"))
	defer s.close()
	var steps int
	f := s.next(t, "the session's events through the execution's end", func(f frame) bool {
		if f.event == "tool.result" && strings.Contains(f.data, strings.Repeat("x", 600<<10)) {
			steps++
		}
		return f.event == "task.completed"
	})
	if steps < 6 {
		t.fatalf("the session stream reached %s after %d whole results of the 6 (the execution has %d events)", f.event, steps, len(evs))
	}
}
