package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/protocol/agentruntime"
	"github.com/gatehouse-dev/gatehouse/stream/ssetest"
)

// bigExecution runs an execution of steps local steps, each with a result
// of size bytes, to its end, and returns its id and its events as the
// events pages give them: what every replay must deliver.
func bigExecution(t *testing.T, a *api, steps, size int) (string, []json.RawMessage) {
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
	var want []json.RawMessage
	for after := uint64(0); ; {
		status, body, _ := a.do("GET", fmt.Sprintf("/v0/executions/%s/events?after_sequence=%d&limit=1000", id, after), nil)
		var page struct {
			Events []json.RawMessage
			Latest uint64 `json:"latest_sequence"`
		}
		if status != 200 || json.Unmarshal(body, &page) != nil {
			t.Fatalf("events page after %d: %d", after, status)
		}
		if len(page.Events) == 0 {
			return id, want
		}
		want = append(want, page.Events...)
		after = page.Latest
	}
}

// head reads an event's sequence and type from its first and last bytes,
// where every envelope has them, without decoding a payload of megabytes.
func head(t *testing.T, data []byte) string {
	t.Helper()
	field := func(key string) string {
		for _, h := range [][]byte{data[:min(len(data), 2048)], data[max(0, len(data)-2048):]} {
			if i := bytes.Index(h, []byte(key)); i >= 0 {
				rest := h[i+len(key):]
				return string(rest[:bytes.IndexAny(rest, `",}`)])
			}
		}
		t.Fatalf("no %s in %.200s", key, data)
		return ""
	}
	return field(`"sequence":`) + " " + field(`"type":"`)
}

// TestReplayDeliversEverythingToTheEnd reads a finished execution of
// 2.4 MB (five 480 KB results) from the start on its SSE stream and its
// WebSocket, in JSON and msgpack, with a reader that takes frames as they
// come and one that pauses between them: every event arrives, in order,
// whole, and the stream ends after the terminal one. The replay used to
// stop after 2 MB, the limit of two byte-bounded batches.
func TestReplayDeliversEverythingToTheEnd(t *testing.T) {
	t.Parallel()
	a := newAPI(t, start(t, node.Options{}))
	id, want := bigExecution(t, a, 5, 480<<10)
	if len(want) < 17 || !strings.Contains(head(t, want[len(want)-1]), "execution.completed") {
		t.Fatalf("the execution's %d events end with %s", len(want), head(t, want[len(want)-1]))
	}
	// A page is bounded by bytes as well as by its limit.
	status, body, _ := a.do("GET", "/v0/executions/"+id+"/events?limit=1000", nil)
	if status != 200 || len(body) > 2<<20 {
		t.Fatalf("a page of 1000 of the 2.4 MB: %d, %d bytes", status, len(body))
	}
	pause := func(i int, d time.Duration) {
		if d > 0 && i%5 == 4 {
			time.Sleep(d)
		}
	}
	for _, d := range []time.Duration{0, 150 * time.Millisecond} {
		t.Run(fmt.Sprintf("sse/pause=%v", d), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", a.base+"/v0/executions/"+id+"/stream", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			frames, err := ssetest.NewReader(bufio.NewReaderSize(resp.Body, 4096)).Frames(-1)
			if err != io.EOF || len(frames) != len(want) {
				t.Fatalf("%d frames, want %d, then %v", len(frames), len(want), err)
			}
			for i, f := range frames {
				if f.Data != string(want[i]) || head(t, want[i]) != f.ID+" "+f.Event {
					t.Fatalf("frame %d (id %s, %s, %d bytes) is not event %s (%d bytes)", i, f.ID, f.Event, len(f.Data), head(t, want[i]), len(want[i]))
				}
				pause(i, d)
			}
		})
		for _, proto := range wsProtos() {
			t.Run(fmt.Sprintf("ws/%s/pause=%v", proto, d), func(t *testing.T) {
				c, _, err := (&api{t: t, base: a.base}).tryWS("/v0/executions/"+id+"/ws", proto)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
				defer cancel()
				for i := -1; ; i++ { // the hello first
					_, msg, err := c.Read(ctx)
					if err != nil {
						if websocket.CloseStatus(err) != websocket.StatusNormalClosure || i != len(want) {
							t.Fatalf("after %d of %d events: %v", i, len(want), err)
						}
						return
					}
					if i < 0 {
						continue
					}
					if i >= len(want) {
						t.Fatalf("a frame after the terminal event: %.200s", msg)
					}
					if proto == gateway.SubprotocolJSON {
						if !bytes.Contains(msg, want[i]) || !bytes.HasPrefix(msg, []byte(`{"type":"event","seq":`+strings.Fields(head(t, want[i]))[0]+",")) {
							t.Fatalf("frame %d does not carry event %s whole: %.200s", i, head(t, want[i]), msg)
						}
					} else {
						var f struct {
							Seq   uint64         `msgpack:"seq"`
							Event string         `msgpack:"event"`
							Data  map[string]any `msgpack:"data"`
						}
						if err := msgpack.Unmarshal(msg, &f); err != nil {
							t.Fatalf("frame %d: %v", i, err)
						}
						var e map[string]any
						_ = json.Unmarshal(want[i], &e)
						if fmt.Sprintf("%d %s", f.Seq, f.Event) != head(t, want[i]) || fmt.Sprint(f.Data["payload"]) != fmt.Sprint(e["payload"]) {
							t.Fatalf("frame %d (%d %s) is not event %s", i, f.Seq, f.Event, head(t, want[i]))
						}
					}
					pause(i, d)
				}
			})
		}
	}
}

// TestConcurrentReplaysEachGetTheirOwnEvents reads four finished
// executions from the start on their SSE streams, three times each, eight
// readers at once: the streams render into arenas that go back to the
// gateway's free list when a stream ends and come out again for the next,
// and every frame of every replay must still be its own execution's event,
// whole (the race detector watches the arenas change hands too).
func TestConcurrentReplaysEachGetTheirOwnEvents(t *testing.T) {
	t.Parallel()
	a := newAPI(t, start(t, node.Options{}))
	type execution struct {
		id   string
		want []json.RawMessage
	}
	var exs []execution
	for range 4 {
		id, want := bigExecution(t, a, 20, 1<<10)
		exs = append(exs, execution{id, want})
	}
	replay := func(ex execution) error {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", a.base+"/v0/executions/"+ex.id+"/stream", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		frames, err := ssetest.NewReader(bufio.NewReader(resp.Body)).Frames(-1)
		if err != io.EOF || len(frames) != len(ex.want) {
			return fmt.Errorf("%s: %d frames, want %d, then %v", ex.id, len(frames), len(ex.want), err)
		}
		for i, f := range frames {
			if f.Data != string(ex.want[i]) {
				return fmt.Errorf("%s: frame %d is not its event: %.120s", ex.id, i, f.Data)
			}
		}
		return nil
	}
	errs := make(chan error, 3*len(exs))
	sem := make(chan struct{}, 8)
	for range 3 {
		for _, ex := range exs {
			go func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				errs <- replay(ex)
			}()
		}
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestEverySurfaceStreamsALargeSessionToItsEnd runs a session turn of
// 4.7 MB of results and 1,200 text deltas, then reads it on each surface's
// streams and pages: the Agent Runtime event stream (SSE and WebSocket)
// and its pages give every event of the export, in order; AAP's turn
// stream reaches turn_stop in delta and in message mode (where the deltas
// are hidden: more than a batch of them once stalled it); the export
// verifies. A direct execution with 900 KB of arguments and of result
// reaches the Runtime API's done.
func TestEverySurfaceStreamsALargeSessionToItsEnd(t *testing.T) {
	t.Parallel()
	s := start(t, node.Options{})
	a := newAPI(t, s)
	ws := a.dialWS("/v0/agents/ws?agent_id=big-agent&consumer_id=c1", gateway.SubprotocolJSON)
	ws.expect("hello")
	a.json("PUT", "/aap/v1/agents/big-agent", obj{"name": "big-agent", "version": "1.0.0"}, 200)
	big := openAAPSession(t, a, "big-agent")
	_, push := ws.delivery("execution.assigned")
	id, lease := push["execution_id"].(string), push["session_id"].(string)
	for i := range 8 {
		step := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "big.tool"}, 200)["step_id"]
		blob := fmt.Sprintf("%d:%s", i, strings.Repeat("x", 600<<10))
		a.json("POST", "/v0/agents/step-result", obj{"execution_id": id, "session_id": lease, "step_id": step, "success": true, "data": obj{"blob": blob}}, 200)
		ws.delivery("tool.result")
	}
	// More deltas than a batch: message mode hides them all.
	var text strings.Builder
	const deltas = 1200
	for i := range deltas {
		d := fmt.Sprintf("w%d ", i)
		text.WriteString(d)
		ws.send(obj{"type": "command", "id": fmt.Sprintf("d%d", i), "command": "intent", "body": obj{
			"execution_id": id, "session_id": lease, "intent": obj{"type": "output", "output": obj{"kind": "text_delta", "text": d}},
		}})
	}
	for i := range deltas {
		ws.ok(ws.replyTo(fmt.Sprintf("d%d", i)))
	}
	a.intent(id, lease, obj{"type": "output", "output": obj{"kind": "text", "text": text.String()}}, 200)
	a.intent(id, lease, obj{"type": "complete"}, 200)
	a.waitStatus(id, "completed")

	// The export, streamed, is the reference: it verifies, and every
	// stream gives its events.
	status, body, _ := a.do("GET", "/agent-runtime/exports/"+big, nil)
	var x agentruntime.Export
	if status != 200 || json.Unmarshal(body, &x) != nil {
		t.Fatalf("export: %d, %d bytes", status, len(body))
	}
	if err := agentruntime.Verify(&x); err != nil || len(body) < 4<<20 {
		t.Fatalf("export of %d bytes, %d events: %v", len(body), len(x.Events), err)
	}
	var want []string
	for _, e := range x.Events {
		want = append(want, head(t, e))
	}
	last := want[len(want)-1]
	check := func(t *testing.T, got []string) {
		t.Helper()
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("%d events, want %d; last %v", len(got), len(want), got[max(0, len(got)-2):])
		}
	}

	t.Run("agent-runtime/sse", func(t *testing.T) {
		t.Parallel()
		a := &api{t: t, base: a.base}
		st := a.openSSE("/agent-runtime/sessions/"+big+"/events", "Accept", "text/event-stream")
		var got []string
		for len(got) == 0 || got[len(got)-1] != last {
			got = append(got, head(t, []byte(st.next().Data)))
		}
		check(t, got)
	})
	t.Run("agent-runtime/ws", func(t *testing.T) {
		t.Parallel()
		a := &api{t: t, base: a.base}
		c, _, err := a.tryWS("/agent-runtime/sessions/"+big+"/ws", "")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		var got []string
		for len(got) == 0 || got[len(got)-1] != last {
			_, msg, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("after %d events: %v", len(got), err)
			}
			got = append(got, head(t, msg))
		}
		check(t, got)
	})
	t.Run("agent-runtime/pages", func(t *testing.T) {
		t.Parallel()
		a := &api{t: t, base: a.base}
		var got []string
		pages := 0
		for after := ""; ; pages++ {
			status, body, _ := a.do("GET", "/agent-runtime/sessions/"+big+"/events?limit=1000&after="+after, nil)
			var page struct {
				Events []json.RawMessage
				Next   string
			}
			if status != 200 || json.Unmarshal(body, &page) != nil {
				t.Fatalf("page after %q: %d", after, status)
			}
			for _, e := range page.Events {
				got = append(got, head(t, e))
			}
			if page.Next == "" {
				break
			}
			after = page.Next
		}
		check(t, got)
		if pages < 3 {
			t.Fatalf("4.7 MB in %d pages: a page is not bounded by bytes", pages)
		}
	})
	t.Run("agent-runtime/exports-bounded", func(t *testing.T) {
		t.Parallel()
		a := &api{t: t, base: a.base}
		// Two exports that nobody reads past their status line hold both
		// slots; a third is refused until one of them ends.
		var held []net.Conn
		for range agentruntime.DefaultExports {
			c := dialSmallTCP(t, strings.TrimPrefix(a.base, "http://"))
			fmt.Fprintf(c, "GET /agent-runtime/exports/%s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", big)
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
				t.Fatalf("an export: %q %v", line, err)
			}
			held = append(held, c)
		}
		status, body, hdr := a.do("GET", "/agent-runtime/exports/"+big, nil)
		var e obj
		if status != 429 || json.Unmarshal(body, &e) != nil || e["code"] != "RATE_LIMITED" || hdr.Get("Retry-After") == "" {
			t.Fatalf("a third export: %d %s", status, body)
		}
		for _, c := range held {
			c.Close()
		}
		eventually.True(t, "an export after the held ones ended", func() bool {
			status, _, _ := a.do("GET", "/agent-runtime/exports/"+big, nil)
			return status == 200
		})
	})
	for _, mode := range []string{"delta", "message"} {
		t.Run("aap/"+mode, func(t *testing.T) {
			t.Parallel()
			a := &api{t: t, base: a.base}
			st := a.openSSE("/aap/v1/session/"+big+"/stream?stream="+mode, "Accept", "text/event-stream")
			var deltas, final strings.Builder
			for {
				f := st.next()
				var d map[string]string
				_ = json.Unmarshal([]byte(f.Data), &d)
				switch f.Event {
				case "text_delta":
					deltas.WriteString(d["delta"])
				case "text":
					final.WriteString(d["text"])
				}
				if f.Event == "turn_stop" {
					break
				}
			}
			got := deltas.String()
			if mode == "message" {
				got = final.String()
			}
			if got != text.String() {
				t.Fatalf("%s mode: text of %d bytes, want %d", mode, len(got), text.Len())
			}
		})
	}
	t.Run("runtime", func(t *testing.T) {
		t.Parallel()
		a := &api{t: t, base: a.base}
		run := a.runner("big-runner", "r1", "big.direct")
		arg := strings.Repeat("a", 900<<10)
		ex := a.json("POST", "/v0/executions", obj{"tool": obj{"tool_id": "big.direct", "arguments": obj{"a": arg}}}, 201)
		job := run.expect("job.assigned")
		res := strings.Repeat("r", 900<<10)
		a.json("POST", "/v0/runners/big-runner/results", obj{"job_id": job["id"], "execution_id": ex["id"], "step_id": job["step_id"], "success": true, "data": obj{"r": res}}, 200)
		a.waitStatus(ex["id"].(string), "completed")
		st := a.openSSE("/runtime/v1/executions/"+ex["id"].(string)+"/events", "Accept", "text/event-stream")
		var names []string
		for len(names) == 0 || names[len(names)-1] != "done" {
			f := st.next()
			names = append(names, f.Event)
			if f.Event == "tool_use" && !strings.Contains(f.Data, arg) || f.Event == "tool_result" && !strings.Contains(f.Data, res) {
				t.Fatalf("%s of %d bytes is not whole", f.Event, len(f.Data))
			}
		}
		if !slices.Contains(names, "tool_use") || !slices.Contains(names, "tool_result") {
			t.Fatalf("runtime events: %v", names)
		}
	})
}

// dialSmallTCP connects to addr with a small receive buffer, so that a
// response the test does not read soon holds the server's writer.
func dialSmallTCP(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		if cerr := rc.Control(func(fd uintptr) {
			err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); cerr != nil {
			return cerr
		}
		return err
	}}
	c, err := d.DialContext(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
