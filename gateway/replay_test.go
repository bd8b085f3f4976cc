package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/stream/ssetest"
)

// bigExecution runs an execution of steps local steps, each with a result
// of size bytes, to its end, and returns its id and the sequence and type
// of every event it stored.
func bigExecution(t *testing.T, a *api, steps, size int) (string, []string) {
	t.Helper()
	ag := a.agent("big-agent", "c1")
	id, lease := a.assigned(ag, nil)
	for i := range steps {
		step := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "big.tool"}, 200)["step_id"]
		blob := fmt.Sprintf("%d:%s", i, strings.Repeat("x", size))
		a.json("POST", "/v0/agents/step-result", obj{"execution_id": id, "session_id": lease, "step_id": step, "success": true, "data": obj{"blob": blob}}, 200)
		ag.expect("tool.result")
	}
	a.intent(id, lease, obj{"type": "complete"}, 200)
	a.waitStatus(id, "completed")
	var want []string
	for after := 0; ; {
		page := a.json("GET", fmt.Sprintf("/v0/executions/%s/events?after_sequence=%d&limit=1000", id, after), nil, 200)
		evs := page["events"].([]any)
		if len(evs) == 0 {
			break
		}
		for _, e := range evs {
			e := e.(obj)
			want = append(want, fmt.Sprintf("%v %v", e["sequence"], e["type"]))
			after = int(e["sequence"].(float64))
		}
	}
	return id, want
}

// TestReplayDeliversEverythingToTheEnd reads a finished execution of
// 7 MB (twelve 600 KB results) from the start on its SSE stream and its
// WebSocket, in JSON and msgpack, with a reader that takes frames as they
// come and one that pauses between them: every event arrives, in order,
// whole, and the stream ends after the terminal one. The replay used to
// stop after 2 MB, the limit of two byte-bounded batches.
func TestReplayDeliversEverythingToTheEnd(t *testing.T) {
	a := newAPI(t, start(t, node.Options{}))
	id, want := bigExecution(t, a, 12, 600<<10)
	if len(want) < 30 || !strings.HasSuffix(want[len(want)-1], "execution.completed") {
		t.Fatalf("the execution's events: %v", want)
	}
	for _, pause := range []time.Duration{0, 150 * time.Millisecond} {
		t.Run(fmt.Sprintf("sse/pause=%v", pause), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", a.base+"/v0/executions/"+id+"/stream", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			r := ssetest.NewReader(bufio.NewReaderSize(resp.Body, 4096))
			var got []string
			for {
				f, err := r.Next()
				if err != nil {
					break
				}
				var e obj
				if err := json.Unmarshal([]byte(f.Data), &e); err != nil {
					t.Fatalf("frame %s after %d: %v", f.ID, len(got), err)
				}
				got = append(got, fmt.Sprintf("%v %v", e["sequence"], e["type"]))
				if f.ID != fmt.Sprint(e["sequence"]) || f.Event != e["type"] {
					t.Fatalf("frame id %s event %s for %s", f.ID, f.Event, got[len(got)-1])
				}
				if pause > 0 && len(got)%5 == 0 {
					time.Sleep(pause)
				}
			}
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Fatalf("delivered %d events, want %d: ends with %v", len(got), len(want), got[max(0, len(got)-2):])
			}
		})
		for _, proto := range wsProtos() {
			t.Run(fmt.Sprintf("ws/%s/pause=%v", proto, pause), func(t *testing.T) {
				a := &api{t: t, base: a.base}
				w := a.dialWS("/v0/executions/"+id+"/ws", proto)
				w.expect("hello")
				var got []string
				for range want {
					f := w.expect("event")
					got = append(got, fmt.Sprintf("%v %v", f["seq"], f["event"]))
					if d := f["data"].(obj); d["sequence"] != f["seq"] {
						t.Fatalf("frame %v carries event %v", f["seq"], d["sequence"])
					}
					if pause > 0 && len(got)%5 == 0 {
						time.Sleep(pause)
					}
				}
				if strings.Join(got, ",") != strings.Join(want, ",") {
					t.Fatalf("delivered %v, want %v", got, want)
				}
				if reason := w.expectClose(websocket.StatusNormalClosure); reason != "execution finished" {
					t.Fatalf("close reason %q", reason)
				}
			})
		}
	}
}
