package gateway_test

import (
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/node"
)

// maxCursor is the largest sequence a cursor can name: 2^64-1. Plus one,
// it wrapped to 0 and replayed a log from its start.
const maxCursor = "18446744073709551615"

// TestLargestCursorReplaysNothing: a cursor of 2^64-1 is a position after
// everything: every stream and page that takes a cursor gives nothing
// after it (or says the cursor is ahead: a peer's outbox resets, AAP's turn
// stream refuses it), and none replays its log from the start.
func TestLargestCursorReplaysNothing(t *testing.T) {
	a := newAPI(t, start(t, node.Options{}))
	ag := a.agent("wrap-agent", "c1")
	ex := a.json("POST", "/v0/executions", obj{"agent_id": "wrap-agent", "session_id": "wrap-s"}, 201)
	id := ex["id"].(string)
	push := ag.expect("execution.assigned")
	a.intent(id, push["session_id"].(string), obj{"type": "complete"}, 200)
	a.waitStatus(id, "completed")
	direct := a.json("POST", "/runtime/v1/tools/memory_search", obj{"input": obj{"query": "x"}, "wait": true}, 200)["executionId"].(string)
	a.json("PUT", "/aap/v1/agents/wrap-agent", obj{"name": "wrap-agent", "version": "1.0.0"}, 200)
	aapSession := openAAPSession(t, a, "wrap-agent")
	a.channel("wrap-phone", "u1")
	eventually.True(t, "the channel's connection logged", func() bool {
		evs, _ := a.json("GET", "/v0/channels/events", nil, 200)["events"].([]any)
		return len(evs) > 0
	})

	cases := []struct {
		name string
		run  func(t *testing.T, a *api)
	}{
		{"v0 events page", func(t *testing.T, a *api) { noEvents(t, a, "/v0/executions/"+id+"/events?after_sequence="+maxCursor) }},
		{"v0 stream after_sequence", func(t *testing.T, a *api) { sseEnds(t, a, "/v0/executions/"+id+"/stream?after_sequence="+maxCursor) }},
		{"v0 stream Last-Event-ID", func(t *testing.T, a *api) {
			sseEnds(t, a, "/v0/executions/"+id+"/stream", "Last-Event-ID", maxCursor)
		}},
		{"v0 execution socket", func(t *testing.T, a *api) {
			w := a.dialWS("/v0/executions/"+id+"/ws?after_sequence="+maxCursor, "")
			w.expect("hello")
			if f, ok, closed := w.poll(10 * time.Second); ok || !closed {
				t.Fatalf("frame %v after the largest cursor, want the socket closed", f.obj)
			}
			if code := websocket.CloseStatus(w.err); code != websocket.StatusNormalClosure {
				t.Fatalf("closed with %v (%v), want 1000", code, w.err)
			}
		}},
		{"v0 agent outbox", func(t *testing.T, a *api) {
			s := a.openSSE("/v0/agents/stream?agent_id=wrap-agent&consumer_id=c2", "Last-Event-ID", maxCursor)
			if f := s.next(); f.Event != "stream.reset" {
				t.Fatalf("first frame %s %s, want stream.reset (cursor ahead)", f.Event, f.Data)
			}
		}},
		{"v0 channel log", func(t *testing.T, a *api) { noEvents(t, a, "/v0/channels/events?after_sequence="+maxCursor) }},
		{"agent-runtime page", func(t *testing.T, a *api) { noEvents(t, a, "/agent-runtime/sessions/wrap-s/events?after="+maxCursor) }},
		{"agent-runtime SSE", func(t *testing.T, a *api) {
			sseQuiet(t, a, "/agent-runtime/sessions/wrap-s/events", "Accept", "text/event-stream", "Last-Event-ID", maxCursor)
		}},
		{"agent-runtime socket", func(t *testing.T, a *api) {
			a.dialWS("/agent-runtime/sessions/wrap-s/ws?after="+maxCursor, "").quiet(300 * time.Millisecond)
		}},
		{"AAP turn stream", func(t *testing.T, a *api) {
			// AAP refuses a position its turn never reached.
			s, status, body := a.trySSE("/aap/v1/session/"+aapSession+"/stream", "Last-Event-ID", maxCursor)
			if s != nil || status != 400 || !strings.Contains(body, "VALIDATION_ERROR") {
				t.Fatalf("AAP stream after the largest cursor: %d %s, want 400 VALIDATION_ERROR", status, body)
			}
		}},
		{"runtime API stream", func(t *testing.T, a *api) {
			for _, last := range []string{maxCursor, maxCursor + ".0"} {
				sseEnds(t, a, "/runtime/v1/executions/"+direct+"/events", "Last-Event-ID", last)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sub := *a
			sub.t = t
			c.run(t, &sub)
		})
	}
}

// noEvents checks a page of events after the largest cursor: empty.
func noEvents(t *testing.T, a *api, path string) {
	t.Helper()
	page := a.json("GET", path, nil, 200)
	if evs, _ := page["events"].([]any); len(evs) != 0 {
		t.Fatalf("GET %s: %d events after the largest cursor, want none", path, len(evs))
	}
}

// sseEnds opens the SSE stream of a finished log, which must end at once
// with no event.
func sseEnds(t *testing.T, a *api, path string, hdr ...string) {
	t.Helper()
	s := a.openSSE(path, hdr...)
	for {
		select {
		case f, ok := <-s.frames:
			if !ok {
				return
			}
			if f.Event != "" && f.Data != "" {
				t.Fatalf("GET %s: frame %s %s after the largest cursor", path, f.Event, f.Data)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("GET %s: the stream of a finished log did not end", path)
		}
	}
}

// sseQuiet opens a live SSE stream, which must send no event for a while.
func sseQuiet(t *testing.T, a *api, path string, hdr ...string) {
	t.Helper()
	s := a.openSSE(path, hdr...)
	deadline := time.After(300 * time.Millisecond)
	for {
		select {
		case f, ok := <-s.frames:
			if !ok {
				return
			}
			if f.Event != "" {
				t.Fatalf("GET %s: frame %s %s after the largest cursor", path, f.Event, f.Data)
			}
		case <-deadline:
			return
		}
	}
}
