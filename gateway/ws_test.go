package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/peer"
)

// wsProtos returns the two encodings every socket test runs with.
func wsProtos() []string { return []string{gateway.SubprotocolJSON, gateway.SubprotocolMsgpack} }

// wsFrame is one frame a test client read.
type wsFrame struct {
	obj  obj    // decoded; numbers are float64 whatever the encoding
	body []byte // the raw body of a JSON reply
	err  error  // the frame could not be decoded
	typ  websocket.MessageType
	raw  []byte // the frame as read
}

// wsClient is a test client on one gateway socket. A goroutine reads frames
// in the background, which also answers the server's pings.
type wsClient struct {
	t      *testing.T
	c      *websocket.Conn
	proto  string
	frames chan wsFrame
	err    error // why reading stopped; set before frames is closed
	stash  []wsFrame
	ids    int
}

func (a *api) tryWS(path, proto string) (*websocket.Conn, *http.Response, error) {
	a.t.Helper()
	h := http.Header{}
	if a.token != "" {
		h.Set("Authorization", "Bearer "+a.token)
	}
	var protos []string
	if proto != "" {
		protos = []string{proto}
	}
	ctx, cancel := context.WithTimeout(a.t.Context(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(a.base, "http")+path, &websocket.DialOptions{HTTPClient: a.hc, HTTPHeader: h, Subprotocols: protos})
	if err == nil {
		c.SetReadLimit(64 << 20)
		a.t.Cleanup(func() { _ = c.CloseNow() })
	}
	return c, resp, err
}

// dialWS opens a socket and reads it in the background.
func (a *api) dialWS(path, proto string) *wsClient {
	a.t.Helper()
	c, resp, err := a.tryWS(path, proto)
	if err != nil {
		a.t.Fatalf("dial %s: %v %s", path, err, respBody(resp))
	}
	if proto != "" && c.Subprotocol() != proto {
		a.t.Fatalf("dial %s: subprotocol %q, want %q", path, c.Subprotocol(), proto)
	}
	w := &wsClient{t: a.t, c: c, proto: proto, frames: make(chan wsFrame, 4096)}
	go w.read()
	return w
}

// wsRefused dials a socket that must be refused before the upgrade with a
// JSON error.
func (a *api) wsRefused(path string, status int, code string) (obj, http.Header) {
	a.t.Helper()
	_, resp, err := a.tryWS(path, gateway.SubprotocolJSON)
	if err == nil || resp == nil {
		a.t.Fatalf("dial %s: %v, want refusal %d", path, err, status)
	}
	var body obj
	if resp.StatusCode != status || resp.Header.Get("Content-Type") != "application/json" || json.Unmarshal([]byte(respBody(resp)), &body) != nil || body["code"] != code {
		a.t.Fatalf("dial %s: %d %s %q, want %d %s", path, resp.StatusCode, resp.Header.Get("Content-Type"), respBody(resp), status, code)
	}
	return body, resp.Header
}

func respBody(resp *http.Response) string {
	if resp == nil || resp.Body == nil {
		return ""
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return string(b)
}

func (w *wsClient) read() {
	defer close(w.frames)
	for {
		typ, data, err := w.c.Read(context.Background())
		if err != nil {
			w.err = err
			return
		}
		f := decodeWS(w.proto, typ, data)
		f.typ, f.raw = typ, data
		w.frames <- f
	}
}

// decodeWS decodes a frame with the client's own codecs, independent of the
// server's.
func decodeWS(proto string, typ websocket.MessageType, data []byte) wsFrame {
	if proto == gateway.SubprotocolMsgpack {
		if typ != websocket.MessageBinary {
			return wsFrame{err: fmt.Errorf("msgpack socket sent a %v frame", typ)}
		}
		var v any
		if err := msgpack.Unmarshal(data, &v); err != nil {
			return wsFrame{err: fmt.Errorf("frame is not msgpack: %w", err)}
		}
		j, err := json.Marshal(v)
		if err != nil {
			return wsFrame{err: err}
		}
		var o obj
		if err := json.Unmarshal(j, &o); err != nil {
			return wsFrame{err: err}
		}
		return wsFrame{obj: o}
	}
	if typ != websocket.MessageText {
		return wsFrame{err: fmt.Errorf("JSON socket sent a %v frame", typ)}
	}
	var f struct {
		Body json.RawMessage `json:"body"`
	}
	var o obj
	if err := json.Unmarshal(data, &o); err != nil {
		return wsFrame{err: fmt.Errorf("frame is not JSON: %w: %s", err, data)}
	}
	_ = json.Unmarshal(data, &f)
	return wsFrame{obj: o, body: f.Body}
}

func (w *wsClient) encode(v any) []byte {
	w.t.Helper()
	var data []byte
	var err error
	if w.proto == gateway.SubprotocolMsgpack {
		data, err = msgpack.Marshal(v)
	} else {
		data, err = json.Marshal(v)
	}
	if err != nil {
		w.t.Fatal(err)
	}
	return data
}

func (w *wsClient) msgType() websocket.MessageType {
	if w.proto == gateway.SubprotocolMsgpack {
		return websocket.MessageBinary
	}
	return websocket.MessageText
}

// trySend writes a frame; it fails only when the socket is gone.
func (w *wsClient) trySend(v any) error {
	ctx, cancel := context.WithTimeout(w.t.Context(), 10*time.Second)
	defer cancel()
	return w.c.Write(ctx, w.msgType(), w.encode(v))
}

func (w *wsClient) send(v any) {
	w.t.Helper()
	if err := w.trySend(v); err != nil {
		w.t.Fatalf("send: %v", err)
	}
}

// poll returns the next frame, or ok false with closed set when the socket
// ended, or both false when nothing came within d.
func (w *wsClient) poll(d time.Duration) (f wsFrame, ok, closed bool) {
	if len(w.stash) > 0 {
		f, w.stash = w.stash[0], w.stash[1:]
		return f, true, false
	}
	select {
	case f, ok := <-w.frames:
		return f, ok, !ok
	case <-time.After(d):
		return wsFrame{}, false, false
	}
}

func (w *wsClient) next() obj {
	w.t.Helper()
	f, ok, closed := w.poll(10 * time.Second)
	switch {
	case closed:
		w.t.Fatalf("socket ended while a frame was expected: %v", w.err)
	case !ok:
		w.t.Fatalf("no frame within 10s")
	case f.err != nil:
		w.t.Fatal(f.err)
	}
	return f.obj
}

// expect returns the next frame, which must be of type typ.
func (w *wsClient) expect(typ string) obj {
	w.t.Helper()
	f := w.next()
	if f["type"] != typ {
		w.t.Fatalf("frame %v, want type %s", f, typ)
	}
	return f
}

// delivery returns the seq and data of the next frame, which must be a
// delivery of event.
func (w *wsClient) delivery(event string) (uint64, obj) {
	w.t.Helper()
	f := w.expect("delivery")
	if f["event"] != event {
		w.t.Fatalf("delivery %v, want %s", f, event)
	}
	data, _ := f["data"].(obj)
	return uint64(f["seq"].(float64)), data
}

func (w *wsClient) ack(seq uint64) { w.t.Helper(); w.send(obj{"type": "ack", "seq": seq}) }

// command sends a command and returns its reply; frames read meanwhile are
// kept for next.
func (w *wsClient) command(name string, body any) wsFrame {
	w.t.Helper()
	w.ids++
	id := fmt.Sprintf("cmd-%d", w.ids)
	f := obj{"type": "command", "id": id, "command": name}
	if body != nil {
		f["body"] = body
	}
	w.send(f)
	return w.replyTo(id)
}

// refresh sends a refresh frame with token and returns its reply.
func (w *wsClient) refresh(token string) wsFrame {
	w.t.Helper()
	w.ids++
	id := fmt.Sprintf("refresh-%d", w.ids)
	w.send(obj{"type": "refresh", "id": id, "token": token})
	return w.replyTo(id)
}

func (w *wsClient) replyTo(id string) wsFrame {
	w.t.Helper()
	var held []wsFrame
	defer func() { w.stash = append(held, w.stash...) }()
	for {
		f, ok, closed := w.poll(10 * time.Second)
		switch {
		case closed:
			w.t.Fatalf("socket ended while waiting for reply %s: %v", id, w.err)
		case !ok:
			w.t.Fatalf("no reply %s within 10s", id)
		case f.err != nil:
			w.t.Fatal(f.err)
		}
		if f.obj["type"] == "reply" && f.obj["id"] == id {
			return f
		}
		held = append(held, f)
	}
}

// ok checks a reply's status is 200 and returns its body.
func (w *wsClient) ok(f wsFrame) obj {
	w.t.Helper()
	if f.obj["status"] != 200.0 {
		w.t.Fatalf("reply %v, want status 200", f.obj)
	}
	body, _ := f.obj["body"].(obj)
	return body
}

// closed waits for the server to close the socket, skipping frames, and
// returns its close error.
func (w *wsClient) closed() error {
	w.t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case _, ok := <-w.frames:
			if !ok {
				return w.err
			}
		case <-timeout:
			w.t.Fatalf("socket not closed within 15s")
		}
	}
}

// expectClose waits for the server to close the socket with code.
func (w *wsClient) expectClose(code websocket.StatusCode) string {
	w.t.Helper()
	err := w.closed()
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != code {
		w.t.Fatalf("socket ended with %v, want close %d", err, code)
	}
	return ce.Reason
}

// quiet asserts that the socket stays open and silent for d.
func (w *wsClient) quiet(d time.Duration) {
	w.t.Helper()
	if f, ok, closed := w.poll(d); ok || closed {
		w.t.Fatalf("frame %v (closed %v: %v) where none was expected", f.obj, closed, w.err)
	}
}

func TestWSAgentAndRunnerFlow(t *testing.T) {
	for _, proto := range wsProtos() {
		t.Run(proto, func(t *testing.T) {
			s := start(t, node.Options{})
			a := newAPI(t, s)
			ag := a.dialWS("/v0/agents/ws?agent_id=ws-agent&consumer_id=c1", proto)
			hello := ag.expect("hello")
			if hello["role"] != "agent" || hello["id"] != "ws-agent" || hello["consumer_id"] != "c1" ||
				hello["epoch"] != s.Node.Kernel.Epoch() || hello["heartbeat_ms"] != 15000.0 {
				t.Fatalf("hello: %v", hello)
			}
			run := a.dialWS("/v0/runners/ws?runner_id=ws-runner&consumer_id=r1&capabilities=ws.tool", proto)
			if h := run.expect("hello"); h["role"] != "runner" || h["id"] != "ws-runner" || h["consumer_id"] != "r1" {
				t.Fatalf("runner hello: %v", h)
			}

			ex := a.create("ws-agent", obj{"task": "t"})
			id := ex["id"].(string)
			seq, assigned := ag.delivery("execution.assigned")
			if seq != 1 || assigned["execution_id"] != id || assigned["input"].(obj)["task"] != "t" {
				t.Fatalf("execution.assigned %d: %v", seq, assigned)
			}
			ag.ack(seq)
			lease := assigned["session_id"].(string)

			// A remote tool: the intent is a command, the job a delivery.
			res := ag.ok(ag.command("intent", obj{"execution_id": id, "session_id": lease,
				"intent": obj{"type": "invoke_tool", "tool_id": "ws.tool", "arguments": obj{"n": 1, "big": 1 << 40, "f": 1.5}, "remote": true}}))
			step, _ := res["step_id"].(string)
			if res["accepted"] != true || step == "" {
				t.Fatalf("intent reply: %v", res)
			}
			jobSeq, job := run.delivery("job.assigned")
			args := job["arguments"].(obj)
			if job["step_id"] != step || args["n"] != 1.0 || args["big"] != float64(1<<40) || args["f"] != 1.5 {
				t.Fatalf("job.assigned: %v", job)
			}
			if b := run.ok(run.command("started", obj{"execution_id": id, "runner_id": "ws-runner", "step_id": step})); b["status"] != "ok" {
				t.Fatalf("started reply: %v", b)
			}
			run.ok(run.command("result", obj{"job_id": job["id"], "execution_id": id, "step_id": step, "success": true, "data": obj{"ok": 1}}))
			run.ack(jobSeq)
			trSeq, tr := ag.delivery("tool.result")
			if tr["step_id"] != step || tr["status"] != "succeeded" || tr["result"].(obj)["ok"] != 1.0 {
				t.Fatalf("tool.result: %v", tr)
			}
			ag.ack(trSeq)

			// A local tool: the step result is a command too.
			step2 := ag.ok(ag.command("intent", obj{"execution_id": id, "session_id": lease,
				"intent": obj{"type": "invoke_tool", "tool_id": "local.tool"}}))["step_id"]
			ag.ok(ag.command("step_result", obj{"execution_id": id, "session_id": lease, "step_id": step2, "success": true, "data": "done"}))
			seq, tr = ag.delivery("tool.result")
			if tr["step_id"] != step2 || tr["result"] != "done" {
				t.Fatalf("local tool.result: %v", tr)
			}
			ag.ack(seq)

			run.ok(run.command("capabilities", obj{"tools": []string{"ws.tool", "other.tool"}}))
			if b := ag.ok(ag.command("intent", obj{"execution_id": id, "session_id": lease, "intent": obj{"type": "complete", "output": obj{"answer": 42}}})); b["accepted"] != true {
				t.Fatalf("complete: %v", b)
			}
			a.waitStatus(id, "completed")

			// Everything was acknowledged or settled: nothing waits for a
			// reconnect.
			agentKey := peer.Key{Role: kernel.RoleAgent, ID: "ws-agent", Consumer: "c1"}
			runnerKey := peer.Key{Role: kernel.RoleRunner, ID: "ws-runner", Consumer: "r1"}
			eventually.True(t, "outboxes drained", func() bool {
				return s.Node.Hub.Pending(agentKey) == 0 && s.Node.Hub.Pending(runnerKey) == 0
			})
			ag.quiet(50 * time.Millisecond)
		})
	}
}

// TestWSRepliesEqualHTTPAnswers sends the same requests over HTTP and as
// command frames: the reply carries the HTTP status and exactly the HTTP
// body.
func TestWSRepliesEqualHTTPAnswers(t *testing.T) {
	for _, proto := range wsProtos() {
		t.Run(proto, func(t *testing.T) {
			s := start(t, node.Options{})
			a := newAPI(t, s)
			ag := a.dialWS("/v0/agents/ws?agent_id=eq-agent&consumer_id=c1", proto)
			ag.expect("hello")
			run := a.dialWS("/v0/runners/ws?runner_id=eq-runner&consumer_id=r1&capabilities=eq.tool", proto)
			run.expect("hello")
			id := a.create("eq-agent", nil)["id"].(string)
			_, assigned := ag.delivery("execution.assigned")
			lease := assigned["session_id"].(string)
			step := ag.ok(ag.command("intent", obj{"execution_id": id, "session_id": lease,
				"intent": obj{"type": "invoke_tool", "tool_id": "eq.tool", "remote": true}}))["step_id"].(string)
			_, job := run.delivery("job.assigned")
			local := ag.ok(ag.command("intent", obj{"execution_id": id, "session_id": lease,
				"intent": obj{"type": "invoke_tool", "tool_id": "local"}}))["step_id"].(string)
			ag.ok(ag.command("step_result", obj{"execution_id": id, "session_id": lease, "step_id": local, "success": true, "data": 1}))
			ag.delivery("tool.result")
			done := a.create("eq-agent", nil)["id"].(string)
			_, assigned2 := ag.delivery("execution.assigned")
			a.intent(done, assigned2["session_id"].(string), obj{"type": "complete"}, 200)

			cases := []struct {
				name       string
				sock       *wsClient
				command    string
				body       any
				method     string
				path       string
				wantStatus int
			}{
				{"intent not an object", ag, "intent", "x", "POST", "/v0/agents/intent", 400},
				{"intent without fields", ag, "intent", obj{}, "POST", "/v0/agents/intent", 400},
				{"intent without body", ag, "intent", nil, "POST", "/v0/agents/intent", 400},
				{"intent of a wrong lease", ag, "intent", obj{"execution_id": id, "session_id": "not-mine", "intent": obj{"type": "complete"}}, "POST", "/v0/agents/intent", 401},
				{"intent of an unknown execution", ag, "intent", obj{"execution_id": "nope", "session_id": lease, "intent": obj{"type": "complete"}}, "POST", "/v0/agents/intent", 404},
				{"intent of a finished execution", ag, "intent", obj{"execution_id": done, "session_id": "x", "intent": obj{"type": "complete"}}, "POST", "/v0/agents/intent", 409},
				{"step result repeated", ag, "step_result", obj{"execution_id": id, "session_id": lease, "step_id": local, "success": true, "data": 1}, "POST", "/v0/agents/step-result", 200},
				{"step result changed", ag, "step_result", obj{"execution_id": id, "session_id": lease, "step_id": local, "success": false, "error": "no"}, "POST", "/v0/agents/step-result", 409},
				{"step result of an unknown step", ag, "step_result", obj{"execution_id": id, "session_id": lease, "step_id": "nope", "success": true}, "POST", "/v0/agents/step-result", 404},
				{"result without fields", run, "result", obj{"execution_id": id}, "POST", "/v0/runners/eq-runner/results", 400},
				{"result of an unknown step", run, "result", obj{"job_id": "j", "execution_id": id, "step_id": "nope", "success": true}, "POST", "/v0/runners/eq-runner/results", 404},
				{"result of a foreign job", run, "result", obj{"job_id": "made-up", "execution_id": id, "step_id": step, "success": true}, "POST", "/v0/runners/eq-runner/results", 409},
				{"started of an unknown step", run, "started", obj{"execution_id": id, "runner_id": "eq-runner", "step_id": "nope"}, "POST", "/v0/runners/steps/nope/started", 404},
				{"started without runner", run, "started", obj{"execution_id": id, "step_id": step}, "POST", "/v0/runners/steps/" + step + "/started", 400},
				{"started", run, "started", obj{"execution_id": id, "runner_id": "eq-runner", "step_id": step}, "POST", "/v0/runners/steps/" + step + "/started", 200},
				{"capabilities", run, "capabilities", obj{"tools": []string{"eq.tool"}}, "POST", "/v0/runners/eq-runner/capabilities", 200},
				{"capabilities too long", run, "capabilities", obj{"tools": []string{strings.Repeat("t", 300)}}, "POST", "/v0/runners/eq-runner/capabilities", 400},
			}
			for _, c := range cases {
				var httpBody any
				switch b := c.body.(type) {
				case nil:
					httpBody = ""
				case string:
					httpBody = `"` + b + `"`
				default:
					httpBody = b
				}
				status, want, _ := a.do(c.method, c.path, httpBody)
				if status != c.wantStatus {
					t.Fatalf("%s: HTTP %d %s, want %d", c.name, status, want, c.wantStatus)
				}
				f := c.sock.command(c.command, c.body)
				if f.obj["status"] != float64(status) {
					t.Errorf("%s: reply status %v, HTTP %d", c.name, f.obj["status"], status)
				}
				want = bytes.TrimSuffix(want, []byte("\n"))
				if proto == gateway.SubprotocolJSON {
					if !bytes.Equal(f.body, want) {
						t.Errorf("%s: reply body\n %s\nHTTP body\n %s", c.name, f.body, want)
					}
					continue
				}
				var wantObj any
				if err := json.Unmarshal(want, &wantObj); err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(f.obj["body"], wantObj) {
					t.Errorf("%s: reply body %v, HTTP body %s", c.name, f.obj["body"], want)
				}
			}
			// The job settles with its result: the runner is free again.
			run.ok(run.command("result", obj{"job_id": job["id"], "execution_id": id, "step_id": step, "success": true}))
		})
	}
}

func TestWSScopesAndHandshakeRefusals(t *testing.T) {
	s := start(t, node.Options{Auth: jwtOptions()})
	admin := newAPIAs(t, s, auth.Claims{Subject: "ops", Role: auth.RoleAdmin})
	agentA := newAPIAs(t, s, auth.Claims{Subject: "agent-a", Role: auth.RoleAgent, Agents: []string{"scoped-a"}})

	// Refusals come before the upgrade, as JSON.
	newAPI(t, s).wsRefused("/v0/agents/ws?agent_id=scoped-a&consumer_id=c", 401, "UNAUTHORIZED")
	agentA.wsRefused("/v0/agents/ws?agent_id=scoped-b&consumer_id=c", 403, "FORBIDDEN")
	agentA.wsRefused("/v0/runners/ws?runner_id=r&consumer_id=c", 403, "FORBIDDEN")
	agentA.wsRefused("/v0/executions/x/ws", 403, "FORBIDDEN")
	admin.wsRefused("/v0/agents/ws?agent_id=scoped-a", 400, "VALIDATION_ERROR")
	admin.wsRefused("/v0/runners/ws?consumer_id=c", 400, "VALIDATION_ERROR")
	admin.wsRefused("/v0/agents/ws?agent_id=scoped-a&consumer_id=c&cursor=abc", 400, "VALIDATION_ERROR")
	admin.wsRefused("/v0/runners/ws?runner_id=r&consumer_id=c&capabilities="+strings.Repeat("t", 300), 400, "VALIDATION_ERROR")
	admin.wsRefused("/v0/executions/nope/ws", 404, "NOT_FOUND")
	// A plain GET is told to upgrade, in JSON.
	status, body, hdr := admin.do("GET", "/v0/agents/ws?agent_id=scoped-a&consumer_id=c", nil)
	if status != 426 || hdr.Get("Upgrade") != "websocket" || !strings.Contains(string(body), `"code":"VALIDATION_ERROR"`) {
		t.Fatalf("plain GET: %d %v %s", status, hdr, body)
	}

	// A command runs with the rights of the token that opened the socket.
	ag := agentA.dialWS("/v0/agents/ws?agent_id=scoped-a&consumer_id=c1", gateway.SubprotocolJSON)
	ag.expect("hello")
	other := admin.create("scoped-b", nil)["id"].(string)
	intent := obj{"execution_id": other, "session_id": "x", "intent": obj{"type": "complete"}}
	_, want, _ := agentA.do("POST", "/v0/agents/intent", intent)
	f := ag.command("intent", intent)
	// Another agent's execution is not there for this one: 404, as on HTTP.
	if f.obj["status"] != 404.0 || !bytes.Equal(f.body, bytes.TrimSuffix(want, []byte("\n"))) {
		t.Fatalf("reply %v %s, HTTP %s", f.obj, f.body, want)
	}

	// No subprotocol, or only unknown ones, means JSON.
	for _, proto := range []string{"", "other.v9"} {
		c, _, err := admin.tryWS("/v0/agents/ws?agent_id=scoped-a&consumer_id=c-"+proto, proto)
		if err != nil {
			t.Fatal(err)
		}
		typ, data, err := c.Read(t.Context())
		if err != nil || typ != websocket.MessageText || !bytes.HasPrefix(data, []byte(`{"type":"hello"`)) {
			t.Fatalf("subprotocol %q: %v %s %v", proto, typ, data, err)
		}
	}
}

func TestWSTokenExpiryEndsTheSocket(t *testing.T) {
	s := start(t, node.Options{Auth: jwtOptions()})
	a := newAPIAs(t, s, auth.Claims{Subject: "agent-a", Role: auth.RoleAgent, Agents: []string{"exp-a"}, TTL: 2 * time.Second})
	ag := a.dialWS("/v0/agents/ws?agent_id=exp-a&consumer_id=c1", gateway.SubprotocolMsgpack)
	ag.expect("hello")
	if reason := ag.expectClose(gateway.CloseTokenExpired); reason != "token expired" {
		t.Fatalf("reason %q", reason)
	}
}

// TestWSTokenRefresh: a refresh frame moves a socket to a new token of the
// same caller, and the socket outlives the token that opened it.
func TestWSTokenRefresh(t *testing.T) {
	s := start(t, node.Options{Auth: jwtOptions()})
	adminClaims := auth.Claims{Subject: "ops", Role: auth.RoleAdmin}
	agentClaims := auth.Claims{Subject: "agent-a", Role: auth.RoleAgent, Agents: []string{"fresh-a"}}
	short := func(c auth.Claims) *api {
		a := newAPI(t, s)
		c.TTL = 2 * time.Second
		a.token = mint(t, c)
		return a
	}
	admin := newAPIAs(t, s, adminClaims)
	id := admin.create("other-agent", nil)["id"].(string)

	// An agent socket and an execution socket, opened with tokens that
	// expire within two seconds.
	ag := short(agentClaims).dialWS("/v0/agents/ws?agent_id=fresh-a&consumer_id=c1", gateway.SubprotocolMsgpack)
	ag.expect("hello")
	ex := short(adminClaims).dialWS("/v0/executions/"+id+"/ws", gateway.SubprotocolJSON)
	ex.expect("hello")
	firstExpiry := time.Now().Add(2 * time.Second)

	for _, c := range []struct {
		w      *wsClient
		claims auth.Claims
	}{{ag, agentClaims}, {ex, adminClaims}} {
		c.claims.TTL = time.Hour
		body := c.w.ok(c.w.refresh(mint(t, c.claims)))
		at, err := time.Parse(time.RFC3339, fmt.Sprint(body["expires_at"]))
		if err != nil || at.Before(time.Now().Add(59*time.Minute)) {
			t.Fatalf("refresh reply %v: expires_at %v, %v", body, at, err)
		}
	}

	// Past the first tokens' expiry, both sockets still answer.
	time.Sleep(time.Until(firstExpiry) + 500*time.Millisecond)
	if f := ag.command("intent", obj{}); f.obj["status"] != 400.0 {
		t.Fatalf("agent socket after the first expiry: %v", f.obj)
	}
	claims := adminClaims
	claims.TTL = time.Hour
	ex.ok(ex.refresh(mint(t, claims)))
}

// TestWSTokenRefreshRefused: a refresh with a token of another caller, a
// narrower scope, or no valid token gets the HTTP error, and the socket still
// closes when the token that opened it expires.
func TestWSTokenRefreshRefused(t *testing.T) {
	s := start(t, node.Options{Auth: jwtOptions()})
	a := newAPI(t, s)
	// exp counts whole seconds: the token expires 1 to 2 s from minted.
	minted := time.Now()
	a.token = mint(t, auth.Claims{Subject: "agent-a", Role: auth.RoleAgent, Agents: []string{"fresh-b"}, TTL: 2 * time.Second})
	ag := a.dialWS("/v0/agents/ws?agent_id=fresh-b&consumer_id=c1", gateway.SubprotocolJSON)
	ag.expect("hello")

	// Signed 10 s ago and expired 5 s ago: within the authenticator's leeway,
	// yet no use to a socket.
	stale, err := auth.MintHS256([]byte(testSecret), auth.Claims{
		Subject: "agent-a", Role: auth.RoleAgent, Agents: []string{"fresh-b"},
		TTL: 5 * time.Second, Issuer: testIss, Audience: testAud,
	}, time.Now().Add(-10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		token  string
		status float64
		code   string
	}{
		{"another subject", mint(t, auth.Claims{Subject: "agent-b", Role: auth.RoleAgent, Agents: []string{"fresh-b"}}), 403, "FORBIDDEN"},
		{"another role", mint(t, auth.Claims{Subject: "agent-a", Role: auth.RoleAdmin}), 403, "FORBIDDEN"},
		{"narrower scope", mint(t, auth.Claims{Subject: "agent-a", Role: auth.RoleAgent, Agents: []string{"other"}}), 403, "FORBIDDEN"},
		{"another key", mintOther(t), 401, "UNAUTHORIZED"},
		{"expired", stale, 401, "UNAUTHORIZED"},
		{"not a token", "x y", 401, "UNAUTHORIZED"},
	} {
		f := ag.refresh(c.token)
		body, _ := f.obj["body"].(obj)
		if f.obj["status"] != c.status || body["code"] != c.code {
			t.Fatalf("%s: reply %v, want %v %s", c.name, f.obj, c.status, c.code)
		}
	}
	if reason := ag.expectClose(gateway.CloseTokenExpired); reason != "token expired" {
		t.Fatalf("reason %q", reason)
	}
	if d := time.Since(minted); d < time.Second {
		t.Fatalf("closed %v after the token was minted, before it expired", d)
	}
}

func TestWSExecutionSocket(t *testing.T) {
	for _, proto := range wsProtos() {
		t.Run(proto, func(t *testing.T) {
			s := start(t, node.Options{})
			a := newAPI(t, s)
			ag := a.agent("ex-agent", "c1")
			id, lease := a.assigned(ag, nil)

			// Live: replay from a cursor, then events as they are committed,
			// then 1000 after the terminal event.
			live := a.dialWS("/v0/executions/"+id+"/ws?after_sequence=1", proto)
			if h := live.expect("hello"); h["role"] != "execution" || h["id"] != id || h["epoch"] != s.Node.Kernel.Epoch() {
				t.Fatalf("hello: %v", h)
			}
			if f := live.expect("event"); f["seq"] != 2.0 || f["event"] != "execution.started" || f["data"].(obj)["sequence"] != 2.0 {
				t.Fatalf("event: %v", f)
			}
			step := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "t"}, 200)["step_id"]
			a.json("POST", "/v0/agents/step-result", obj{"execution_id": id, "session_id": lease, "step_id": step, "success": true}, 200)
			ag.expect("tool.result")
			a.intent(id, lease, obj{"type": "complete"}, 200)
			want := a.events(id)
			for _, e := range want[2:] {
				f := live.expect("event")
				if f["seq"] != e["sequence"] || f["event"] != e["type"] || !reflect.DeepEqual(f["data"], e) {
					t.Fatalf("event %v, want %v", f, e)
				}
			}
			if reason := live.expectClose(websocket.StatusNormalClosure); reason != "execution finished" {
				t.Fatalf("close reason %q", reason)
			}

			// Replay of a finished execution, from the start and from a
			// cursor, Last-Event-ID style or not.
			for _, q := range []string{"", "?after_sequence=3", "?cursor=3"} {
				st := a.dialWS("/v0/executions/"+id+"/ws"+q, proto)
				st.expect("hello")
				from := 0
				if q != "" {
					from = 3
				}
				for _, e := range want[from:] {
					if f := st.expect("event"); f["seq"] != e["sequence"] {
						t.Fatalf("replay %q: %v, want seq %v", q, f, e["sequence"])
					}
				}
				st.expectClose(websocket.StatusNormalClosure)
			}
			// A cursor at or past the end closes at once.
			st := a.dialWS(fmt.Sprintf("/v0/executions/%s/ws?after_sequence=%d", id, len(want)), proto)
			st.expect("hello")
			st.expectClose(websocket.StatusNormalClosure)

			// The execution socket takes no commands.
			id2, _ := a.assigned(ag, nil)
			st = a.dialWS("/v0/executions/"+id2+"/ws", proto)
			st.expect("hello")
			st.send(obj{"type": "ack", "seq": 1})
			f := st.command("intent", obj{})
			if f.obj["status"] != 400.0 || !strings.Contains(f.obj["body"].(obj)["error"].(string), "takes no commands") {
				t.Fatalf("command on the execution socket: %v", f.obj)
			}
		})
	}
}

// TestWSResumeFromCursor: acked deliveries never come again, unacked ones
// do, and a cursor (query or first frame) acknowledges up to it; a cursor
// that cannot be honoured gets an explicit reset.
func TestWSResumeFromCursor(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	const path = "/v0/agents/ws?agent_id=res-agent&consumer_id=c1"
	ag := a.dialWS(path, gateway.SubprotocolJSON)
	ag.expect("hello")
	for range 4 {
		a.create("res-agent", nil)
	}
	for want := uint64(1); want <= 4; want++ {
		if seq, _ := ag.delivery("execution.assigned"); seq != want {
			t.Fatalf("seq %d, want %d", seq, want)
		}
	}
	ag.ack(1)
	_ = ag.c.Close(websocket.StatusNormalClosure, "")

	// Unacked deliveries come again, in order.
	ag = a.dialWS(path, gateway.SubprotocolJSON)
	ag.expect("hello")
	for want := uint64(2); want <= 4; want++ {
		if seq, _ := ag.delivery("execution.assigned"); seq != want {
			t.Fatalf("replay seq %d, want %d", seq, want)
		}
	}
	_ = ag.c.CloseNow()

	// The cursor parameter acknowledges up to it before the replay.
	ag = a.dialWS(path+"&cursor="+s.Node.Kernel.Epoch()+".2", gateway.SubprotocolJSON)
	ag.expect("hello")
	if seq, _ := ag.delivery("execution.assigned"); seq != 3 {
		t.Fatalf("after cursor 2: seq %d", seq)
	}
	_ = ag.c.CloseNow()

	// So does a resume frame, sent first.
	ag = a.dialWS(path, gateway.SubprotocolMsgpack)
	ag.send(obj{"type": "resume", "cursor": 3})
	ag.expect("hello")
	for {
		seq, _ := ag.delivery("execution.assigned")
		if seq == 4 {
			break
		}
		if seq != 3 {
			t.Fatalf("after resume 3: seq %d", seq)
		}
		// 3 may have been written before the resume frame was read; a
		// client drops what its cursor covers.
	}
	ag.ack(4)
	if f := ag.command("intent", obj{}); f.obj["status"] != 400.0 {
		t.Fatalf("the socket does not work after a resume: %v", f.obj)
	}
	// A resume that is not the first frame is refused.
	ag.send(obj{"type": "resume", "cursor": 4, "id": "late"})
	if f := ag.replyTo("late"); f.obj["status"] != 400.0 || !strings.Contains(f.obj["body"].(obj)["error"].(string), "first frame") {
		t.Fatalf("late resume: %v", f.obj)
	}
	_ = ag.c.CloseNow()
	eventually.True(t, "all acknowledged", func() bool {
		return s.Node.Hub.Pending(peer.Key{Role: kernel.RoleAgent, ID: "res-agent", Consumer: "c1"}) == 0
	})

	// Cursors that cannot be honoured.
	for _, c := range []struct{ q, frameEpoch, reason string }{
		{q: "&cursor=otherepoch.2", reason: "epoch_changed"},
		{q: "&cursor=500", reason: "cursor_ahead"},
		{frameEpoch: "otherepoch", reason: "epoch_changed"},
	} {
		ag = a.dialWS(path+c.q, gateway.SubprotocolJSON)
		if c.frameEpoch != "" {
			ag.send(obj{"type": "resume", "cursor": 2, "epoch": c.frameEpoch})
		}
		ag.expect("hello")
		r := ag.expect("reset")["data"].(obj)
		if r["reason"] != c.reason || r["epoch"] != s.Node.Kernel.Epoch() || (c.reason == "epoch_changed" && r["previous_epoch"] != "otherepoch") {
			t.Fatalf("reset %+v: %v", c, r)
		}
		_ = ag.c.CloseNow()
	}
}

// TestWSAckWithAnIDIsReplied: an ack frame that carries an id gets a reply
// (once the acknowledgement is durable: cmd/gatehouse's
// TestKill9KeepsAcknowledgedAcks kills the gateway right after it), and
// the acknowledged delivery is not sent again.
func TestWSAckWithAnIDIsReplied(t *testing.T) {
	a := newAPI(t, start(t, node.Options{}))
	const path = "/v0/agents/ws?agent_id=ack-agent&consumer_id=c1"
	ag := a.dialWS(path, gateway.SubprotocolJSON)
	ag.expect("hello")
	a.create("ack-agent", nil)
	a.create("ack-agent", nil)
	seq, _ := ag.delivery("execution.assigned")
	ag.send(obj{"type": "ack", "seq": seq, "id": "a1"})
	if body := ag.ok(ag.replyTo("a1")); body["status"] != "ok" {
		t.Fatalf("ack reply body %v", body)
	}
	_ = ag.c.CloseNow()
	ag = a.dialWS(path, gateway.SubprotocolJSON)
	ag.expect("hello")
	if next, _ := ag.delivery("execution.assigned"); next != seq+1 {
		t.Fatalf("after acknowledging %d: delivery %d", seq, next)
	}
}

// TestWSCutsProcessEachJobOnce cuts a runner's socket at random points of a
// long run of jobs (before acting, after acting but before the result,
// between the result and its reply, before the ack; sometimes from another
// goroutine in the middle of a write) and reconnects with the same consumer
// id. Deliveries come at least once; deduplicating by sequence and job id,
// each job runs exactly once and each step completes exactly once.
func TestWSCutsProcessEachJobOnce(t *testing.T) {
	t.Parallel()
	for i, proto := range wsProtos() {
		t.Run(proto, func(t *testing.T) {
			ko := testKernel()
			ko.RunnerGrace = time.Minute // a cut is a reconnect, never a lost runner
			s := start(t, node.Options{Kernel: ko})
			a := newAPI(t, s)
			const execs, perExec = 4, 50
			const n = execs * perExec
			ag := a.agent("cut-ws-agent", "c1")
			steps := map[string]string{} // step id -> execution id
			for range execs {
				id, lease := a.assigned(ag, nil)
				for j := range perExec {
					st := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "cut.tool", "arguments": obj{"j": j}, "remote": true}, 200)["step_id"].(string)
					steps[st] = id
				}
			}

			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			runs := map[string]int{}    // step id -> times the tool ran
			results := map[string]obj{} // job id -> its result, sent again after a cut
			jobOfStep := map[string]string{}
			var cursor uint64 // everything up to it was processed
			cuts, reconnects := 0, 0
			const path = "/v0/runners/ws?runner_id=cut-ws-runner&consumer_id=rc&capabilities=cut.tool"
			dial := func() *wsClient {
				q := path
				if cursor > 0 {
					q += fmt.Sprintf("&cursor=%d", cursor)
				}
				reconnects++
				w := a.dialWS(q, proto)
				w.expect("hello")
				return w
			}
			cut := func(w *wsClient) {
				cuts++
				if rng.IntN(2) == 0 {
					_ = w.c.CloseNow()
				} else {
					_ = w.c.Close(websocket.StatusNormalClosure, "cut")
				}
			}
			completed := func() int {
				c := 0
				for _, id := range a.uniqueExecs(steps) {
					for _, e := range a.events(id) {
						if e["type"] == "step.completed" {
							c++
						}
					}
				}
				return c
			}

			w := dial()
			deadline := time.Now().Add(2 * time.Minute)
			for time.Now().Before(deadline) {
				f, ok, closed := w.poll(200 * time.Millisecond)
				if closed {
					w = dial()
					continue
				}
				if !ok {
					// Idle: either everything is done, or a result landed
					// whose reply a cut swallowed (the job is settled then).
					if completed() == n {
						break
					}
					continue
				}
				if f.err != nil {
					t.Fatal(f.err)
				}
				if f.obj["type"] != "delivery" {
					continue // a reply that arrived after its waiter gave up
				}
				seq := uint64(f.obj["seq"].(float64))
				if seq <= cursor {
					continue // already processed
				}
				job := f.obj["data"].(obj)
				jobID, step := job["id"].(string), job["step_id"].(string)
				if prev, seen := jobOfStep[step]; seen && prev != jobID {
					t.Fatalf("step %s got a second job %s after %s: it was re-queued", step, jobID, prev)
				}
				jobOfStep[step] = jobID
				if rng.IntN(8) == 0 { // cut before acting
					cut(w)
					continue
				}
				if _, done := results[jobID]; !done {
					runs[step]++ // the tool runs
					results[jobID] = obj{"job_id": jobID, "execution_id": job["execution_id"], "step_id": step, "success": true, "data": job["arguments"]}
				}
				if rng.IntN(8) == 0 { // cut after acting, before reporting
					cut(w)
					continue
				}
				if rng.IntN(10) == 0 { // cut from elsewhere, in the middle of anything
					c := w.c
					time.AfterFunc(time.Duration(rng.IntN(2000))*time.Microsecond, func() { _ = c.CloseNow() })
					cuts++
				}
				w.ids++
				id := fmt.Sprintf("r-%d", w.ids)
				if w.trySend(obj{"type": "command", "id": id, "command": "result", "body": results[jobID]}) != nil {
					continue
				}
				if rng.IntN(8) == 0 { // cut before the reply
					cut(w)
					continue
				}
				reply, ok := w.waitReply(id)
				if !ok {
					continue
				}
				if reply["status"] != 200.0 {
					t.Fatalf("result reply: %v", reply)
				}
				cursor = seq
				if rng.IntN(8) == 0 { // cut before the ack
					cut(w)
					continue
				}
				_ = w.trySend(obj{"type": "ack", "seq": seq})
			}
			if got := completed(); got != n {
				t.Fatalf("%d of %d steps completed", got, n)
			}
			for step := range steps {
				if runs[step] != 1 {
					t.Fatalf("step %s ran %d times", step, runs[step])
				}
			}
			for _, id := range a.uniqueExecs(steps) {
				perStep := map[string]int{}
				for _, e := range a.events(id) {
					switch e["type"] {
					case "step.completed":
						perStep[e["step_id"].(string)]++
					case "step.failed", "step.retried":
						t.Fatalf("execution %s: %v", id, e)
					}
				}
				for st, c := range perStep {
					if c != 1 {
						t.Fatalf("step %s completed %d times", st, c)
					}
				}
			}
			if cuts < 20 {
				t.Fatalf("only %d cuts; the test did not exercise reconnects", cuts)
			}
			key := peer.Key{Role: kernel.RoleRunner, ID: "cut-ws-runner", Consumer: "rc"}
			eventually.True(t, "runner outbox drained", func() bool { return s.Node.Hub.Pending(key) == 0 })
			t.Logf("%d jobs, %d cuts, %d connections", n, cuts, reconnects)
		})
	}
}

func (a *api) uniqueExecs(steps map[string]string) []string {
	seen := map[string]bool{}
	var ids []string
	for _, id := range steps {
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

// waitReply waits for the reply to id without failing the test when the
// socket ends first; frames read meanwhile are kept for poll.
func (w *wsClient) waitReply(id string) (obj, bool) {
	var held []wsFrame
	defer func() { w.stash = append(held, w.stash...) }()
	for {
		f, ok, closed := w.poll(10 * time.Second)
		if closed || !ok {
			return nil, false
		}
		if f.obj["type"] == "reply" && f.obj["id"] == id {
			return f.obj, true
		}
		held = append(held, f)
	}
}

// coderCloseWindow is how long coder/websocket's Conn.Close lets a write in
// progress hold its close frame up before it cuts the connection mid-frame.
const coderCloseWindow = 5 * time.Second

// TestWSSlowConsumer: an agent that stops reading while large deliveries
// pile up is closed with 4001 once a write has been stuck past the write
// timeout; memory stays bounded (the outbox is the queue), and the next
// connection resumes from the first unacknowledged delivery. The agent
// starts reading only once the server has given up on it, and only after
// coder/websocket's own close window has passed: within the gateway's
// CloseTimeout, which alone decides how long the frame in flight and the
// close frame may take, whatever the machine's speed.
func TestWSSlowConsumer(t *testing.T) {
	t.Parallel()
	ko := testKernel()
	ko.AgentGrace = time.Minute
	s := start(t, node.Options{Kernel: ko, Server: gateway.Options{WriteTimeout: 300 * time.Millisecond, CloseTimeout: time.Minute, PingInterval: time.Minute}})
	a := newAPI(t, s)
	const path = "/v0/agents/ws?agent_id=slow-agent&consumer_id=c1"
	c := dialSmallBuffer(t, s.URL+path)
	input := strings.Repeat("x", 128<<10)
	const n = 40
	created := make(chan struct{})
	go func() {
		defer close(created)
		for range n {
			if status, body, _ := a.do("POST", "/v0/executions", obj{"agent_id": "slow-agent", "input": input}); status != 201 {
				t.Errorf("create: %d %s", status, body)
				return
			}
		}
	}()
	// Once a write has been stuck past the timeout the server gives up on
	// the consumer, which /v0/peers shows at once; the close frame waits
	// for the client to read.
	eventually.True(t, "the server to give up on the consumer", func() bool {
		for _, p := range a.json("GET", "/v0/peers?role=agent", nil, 200)["peers"].([]any) {
			if p.(obj)["consumer_id"] == "c1" && p.(obj)["state"] == "offline" {
				return true
			}
		}
		return false
	})
	// A sleep, as nothing on the server marks the moment: a reader late by
	// more than coder/websocket's window still gets the frame in flight
	// whole and the close frame.
	time.Sleep(coderCloseWindow + time.Second)
	w := &wsClient{t: t, c: c, proto: gateway.SubprotocolJSON, frames: make(chan wsFrame, 4096)}
	go w.read()
	w.expect("hello")
	got := 0
	for {
		f, ok, closed := w.poll(10 * time.Second)
		if closed {
			break
		}
		if !ok {
			t.Fatal("neither frames nor a close within 10s")
		}
		if f.obj["type"] != "delivery" || f.obj["seq"] != float64(got+1) {
			t.Fatalf("frame %d: %v", got+1, f.obj["seq"])
		}
		got++
	}
	<-created
	var ce websocket.CloseError
	if !errors.As(w.err, &ce) || ce.Code != gateway.CloseSlowConsumer || ce.Reason != "slow consumer" {
		t.Fatalf("socket ended with %v after %d deliveries, want 4001", w.err, got)
	}
	if got == n {
		t.Fatalf("all %d deliveries arrived: the consumer was never slow", n)
	}
	// Nothing was acknowledged: the next connection starts over at 1.
	ag := a.dialWS(path, gateway.SubprotocolJSON)
	ag.expect("hello")
	if seq, _ := ag.delivery("execution.assigned"); seq != 1 {
		t.Fatalf("resumed at %d", seq)
	}
	t.Logf("%d of %d deliveries before 4001", got, n)
}

// dialSmallBuffer opens a JSON socket whose receive buffer is small, so
// that little data fills the way to a client that does not read.
func dialSmallBuffer(t *testing.T, url string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	dial := func(_ context.Context, _, addr string) (net.Conn, error) { return dialSmallTCP(t, addr), nil }
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(url, "http"), &websocket.DialOptions{
		HTTPClient:   &http.Client{Transport: &http.Transport{DialContext: dial}},
		Subprotocols: []string{gateway.SubprotocolJSON},
	})
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadLimit(1 << 20)
	t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

func TestWSFrameLimits(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	const path = "/v0/agents/ws?agent_id=lim-agent&consumer_id=c1"
	ag := a.dialWS(path, gateway.SubprotocolJSON)
	ag.expect("hello")
	// Under the frame limit but over the body limit: the HTTP answer.
	big := obj{"execution_id": strings.Repeat("x", 1<<20)}
	_, want, _ := a.do("POST", "/v0/agents/intent", big)
	f := ag.command("intent", big)
	if f.obj["status"] != 413.0 || !bytes.Equal(f.body, bytes.TrimSuffix(want, []byte("\n"))) {
		t.Fatalf("reply %v %s, HTTP %s", f.obj["status"], f.body, want)
	}
	// Over the frame limit: 1009.
	ag.send(obj{"type": "command", "id": "huge", "command": "intent", "body": strings.Repeat("y", 2<<20)})
	ag.expectClose(websocket.StatusMessageTooBig)

	// The limit is an option.
	s2 := start(t, node.Options{Server: gateway.Options{MaxFrameBytes: 256}})
	a2 := newAPI(t, s2)
	ag = a2.dialWS(path, gateway.SubprotocolMsgpack)
	ag.expect("hello")
	ag.send(obj{"type": "ack", "seq": 1, "pad": strings.Repeat("p", 300)})
	ag.expectClose(websocket.StatusMessageTooBig)
}

func TestWSMalformedFrames(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	const path = "/v0/agents/ws?agent_id=bad-agent&consumer_id=c1"

	// Frames with a usable id get an error reply, and the socket lives on.
	for _, proto := range wsProtos() {
		ag := a.dialWS(path, proto)
		ag.expect("hello")
		for _, c := range []struct {
			frame obj
			msg   string
		}{
			{obj{"type": "bogus", "id": "b1"}, `unknown frame type "bogus"`},
			{obj{"id": "b2"}, "missing frame type"},
			{obj{"type": "ack", "id": "b3", "seq": "x"}, "cannot unmarshal"},
			{obj{"type": "ack", "id": "b4"}, "seq of at least 1"},
			{obj{"type": "command", "id": "b5"}, "needs a command name"},
			{obj{"type": "command", "id": "b6", "command": "result", "body": obj{}}, `not "result"`},
			{obj{"type": "refresh", "id": "b7"}, "needs a token"},
		} {
			ag.send(c.frame)
			f := ag.replyTo(c.frame["id"].(string))
			body, _ := f.obj["body"].(obj)
			if f.obj["status"] != 400.0 || body["code"] != "VALIDATION_ERROR" || !strings.Contains(body["error"].(string), c.msg) {
				t.Fatalf("%s %v: reply %v, want 400 with %q", proto, c.frame, f.obj, c.msg)
			}
		}
		if f := ag.command("intent", obj{}); f.obj["status"] != 400.0 {
			t.Fatalf("socket unusable after malformed frames: %v", f.obj)
		}
		_ = ag.c.CloseNow()
	}

	// Without an id, nothing can be correlated: 1007.
	for _, c := range []struct {
		proto string
		typ   websocket.MessageType
		data  string
	}{
		{gateway.SubprotocolJSON, websocket.MessageText, "not json"},
		{gateway.SubprotocolJSON, websocket.MessageText, `{"type":"bogus"}`},
		{gateway.SubprotocolJSON, websocket.MessageText, `[1,2]`},
		{gateway.SubprotocolJSON, websocket.MessageText, `{"type":"command","command":"intent"}`},
		{gateway.SubprotocolJSON, websocket.MessageText, `{"type":"refresh","token":"t"}`},
		{gateway.SubprotocolJSON, websocket.MessageText, `{"type":"ack","seq":1,"id":"` + strings.Repeat("i", 129) + `"}`},
		{gateway.SubprotocolMsgpack, websocket.MessageBinary, "\xc1"},
		{gateway.SubprotocolMsgpack, websocket.MessageBinary, "\x81\x01\x02"},                     // an integer map key
		{gateway.SubprotocolMsgpack, websocket.MessageBinary, "\x81\xa4type\xc6\xff\xff\xff\xff"}, // a 4 GiB string in 10 bytes
		{gateway.SubprotocolMsgpack, websocket.MessageBinary, "\x81\xa4type\xa3ack\x00"},          // trailing bytes
	} {
		ag := a.dialWS(path, c.proto)
		ag.expect("hello")
		if err := ag.c.Write(t.Context(), c.typ, []byte(c.data)); err != nil {
			t.Fatal(err)
		}
		if reason := ag.expectClose(websocket.StatusInvalidFramePayloadData); !strings.HasPrefix(reason, "malformed frame") {
			t.Fatalf("%q: reason %q", c.data, reason)
		}
	}
}

func TestWSSupersededForgottenAndShutdown(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	const path = "/v0/runners/ws?runner_id=sup-runner&consumer_id=c1&capabilities=t"
	first := a.dialWS(path, gateway.SubprotocolJSON)
	first.expect("hello")
	second := a.dialWS(path, gateway.SubprotocolMsgpack)
	second.expect("hello")
	if reason := first.expectClose(gateway.CloseSuperseded); !strings.Contains(reason, "superseded") {
		t.Fatalf("reason %q", reason)
	}
	second.quiet(50 * time.Millisecond)
	a.do("DELETE", "/v0/runners/sup-runner", nil)
	second.expectClose(gateway.CloseForgotten)

	// Shutdown closes every socket with 1001.
	ag := a.agent("sd-agent", "c1")
	id, _ := a.assigned(ag, nil)
	peerSock := a.dialWS("/v0/agents/ws?agent_id=sd-agent&consumer_id=c2", gateway.SubprotocolJSON)
	peerSock.expect("hello")
	exSock := a.dialWS("/v0/executions/"+id+"/ws", gateway.SubprotocolJSON)
	exSock.expect("hello")
	s.Stop()
	peerSock.expectClose(websocket.StatusGoingAway)
	exSock.expectClose(websocket.StatusGoingAway)
}

func TestWSPingTimeout(t *testing.T) {
	s := start(t, node.Options{Server: gateway.Options{PingInterval: 100 * time.Millisecond}})
	a := newAPI(t, s)
	// A reading client answers pings and stays.
	alive := a.dialWS("/v0/agents/ws?agent_id=ping-agent&consumer_id=alive", gateway.SubprotocolJSON)
	if h := alive.expect("hello"); h["heartbeat_ms"] != 100.0 {
		t.Fatalf("hello %v", h)
	}
	// One that does not read cannot answer them.
	deaf, _, err := a.tryWS("/v0/agents/ws?agent_id=ping-agent&consumer_id=deaf", gateway.SubprotocolJSON)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond)
	alive.quiet(10 * time.Millisecond)
	w := &wsClient{t: t, c: deaf, proto: gateway.SubprotocolJSON, frames: make(chan wsFrame, 16)}
	go w.read()
	w.expect("hello")
	if reason := w.expectClose(gateway.ClosePingTimeout); reason != "ping timeout" {
		t.Fatalf("reason %q", reason)
	}
}

// TestAdmissionControl: past the connection rate, stream requests of either
// transport get 429 with Retry-After before any upgrade; other requests are
// not limited.
func TestAdmissionControl(t *testing.T) {
	s := start(t, node.Options{Server: gateway.Options{ConnectRate: 0.5, ConnectBurst: 2}})
	a := newAPI(t, s)
	a.dialWS("/v0/agents/ws?agent_id=adm&consumer_id=c1", gateway.SubprotocolJSON).expect("hello")
	a.dialWS("/v0/agents/ws?agent_id=adm&consumer_id=c2", gateway.SubprotocolJSON).expect("hello")
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, resp, err := a.tryWS("/v0/runners/ws?runner_id=adm&consumer_id=c", gateway.SubprotocolJSON)
			if err == nil || resp == nil || resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
				t.Errorf("dial past the rate: %v %v", err, resp)
			}
		}()
	}
	wg.Wait()
	body, hdr := a.wsRefused("/v0/agents/ws?agent_id=adm&consumer_id=c3", 429, "RATE_LIMITED")
	if hdr.Get("Retry-After") == "" || !strings.Contains(body["error"].(string), "too many new connections") {
		t.Fatalf("429: %v %v", body, hdr)
	}
	if _, status, _ := a.trySSE("/v0/agents/stream?agent_id=adm&consumer_id=c4"); status != 429 {
		t.Fatalf("SSE past the rate: %d", status)
	}
	a.json("GET", "/v0/executions", nil, 200)
	a.json("POST", "/v0/executions", obj{"agent_id": "adm"}, 201)
}
