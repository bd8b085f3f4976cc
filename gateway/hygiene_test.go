package gateway_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
	"github.com/gatehouse-dev/gatehouse/node"
)

// TestInputHygiene: ids with control characters, bodies that are not
// UTF-8 and numbers beyond float64 are refused with 400, and never echoed.
func TestInputHygiene(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	ag := a.agent("hy-agent", "c1")
	exec, lease := a.assigned(ag, nil)
	for name, c := range map[string]struct {
		method, path string
		body         any
	}{
		"agent id with a newline":   {"POST", "/v0/executions", `{"agent_id":"a\nb"}`},
		"agent id with a NUL":       {"POST", "/v0/executions", `{"agent_id":"a\u0000b"}`},
		"session id with a tab":     {"POST", "/v0/executions", `{"agent_id":"a","session_id":"s\tt"}`},
		"number out of range":       {"POST", "/v0/executions", `{"agent_id":"a","input":1e999999}`},
		"long number out of range":  {"POST", "/v0/executions", `{"agent_id":"a","input":` + "9" + strings.Repeat("9", 400) + `}`},
		"body not UTF-8":            {"POST", "/v0/executions", "{\"agent_id\":\"a\",\"input\":\"\xff\xfe\"}"},
		"tool id with control":      {"POST", "/v0/agents/intent", `{"execution_id":"` + exec + `","session_id":"` + lease + `","intent":{"type":"invoke_tool","tool_id":"t\u001bx"}}`},
		"signal type with a CR":     {"POST", "/v0/executions/" + exec + "/signal", `{"signal_type":"go\r"}`},
		"runner tool with control":  {"POST", "/v0/runners/hy-runner/capabilities", `{"tools":["ok","bad\u0007"]}`},
		"agent stream id with a LF": {"GET", "/v0/agents/stream?agent_id=" + url.QueryEscape("a\nb") + "&consumer_id=c", nil},
	} {
		t.Run(name, func(t *testing.T) {
			out := a.fail(c.method, c.path, c.body, 400, "VALIDATION_ERROR")
			if msg := out["error"].(string); strings.ContainsAny(msg, "\n\r\x00\x07\x1b\t") {
				t.Fatalf("the answer echoes control characters: %q", msg)
			}
		})
	}
	// Numbers in range, and text that is fine, still pass.
	a.json("POST", "/v0/executions", `{"agent_id":"a","input":{"n":1.5e300,"m":-2,"s":"e1\"9e999999"}}`, 201)
}

// TestHeadersTooLargeEchoNothing: a request whose headers do not fit is
// answered 431, and the answer holds nothing of the request.
func TestHeadersTooLargeEchoNothing(t *testing.T) {
	s := start(t, node.Options{})
	c := dialRaw(t, s.URL)
	c.write("GET /v0/health HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer TOPSECRET-TOKEN\r\nX-Padding: " + strings.Repeat("p", 8000) + "\r\n\r\n")
	resp, body := c.response()
	if resp.StatusCode != 431 || !strings.Contains(body, "HEADERS_TOO_LARGE") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if strings.Contains(body, "TOPSECRET") || strings.Contains(body, "ppp") || strings.Contains(body, "Authorization") {
		t.Fatalf("the answer echoes the request: %s", body)
	}
	// A client still sending its headers when the refusal goes out reads
	// the refusal, not a reset: the server drains what it sends on.
	c = dialRaw(t, s.URL)
	c.write("GET /v0/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + strings.Repeat("p", 32<<10))
	time.Sleep(200 * time.Millisecond) // the server has answered, with bytes of ours unread
	c.write(strings.Repeat("p", 32<<10) + "\r\n\r\n")
	if resp, body := c.response(); resp.StatusCode != 431 || !strings.Contains(body, "HEADERS_TOO_LARGE") {
		t.Fatalf("still sending: %d %s", resp.StatusCode, body)
	}
	// Any other malformed request says so without quoting it either.
	c = dialRaw(t, s.URL)
	c.write("BROKEN TOPSECRET\r\n\r\n")
	if resp, body := c.response(); resp.StatusCode != 400 || strings.Contains(body, "TOPSECRET") {
		t.Fatalf("malformed: %d %s", resp.StatusCode, body)
	}
}

// TestCursorSyntax: a cursor that is not "<epoch>.<sequence>" or
// "<sequence>" in decimal digits is a 400 before any stream or upgrade.
func TestCursorSyntax(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	for _, cur := range []string{"x.y", "5.", ".5", "-1", "+1", "18446744073709551616", "1e3", "ab-cd.5", "0x10"} {
		q := "agent_id=cur-agent&consumer_id=c&cursor=" + url.QueryEscape(cur)
		if out := a.fail("GET", "/v0/agents/stream?"+q, nil, 400, "VALIDATION_ERROR"); !strings.Contains(out["error"].(string), "cursor") {
			t.Fatalf("SSE cursor %q: %v", cur, out)
		}
		if _, resp, err := a.tryWS("/v0/runners/ws?runner_id=cur-runner&consumer_id=c&cursor="+url.QueryEscape(cur), gateway.SubprotocolJSON); err == nil || resp == nil || resp.StatusCode != 400 {
			t.Fatalf("WebSocket cursor %q: %v %v", cur, resp, err)
		}
	}
	st := a.openSSE("/v0/agents/stream?agent_id=cur-agent&consumer_id=c&cursor=0")
	st.close()
}

// TestWSTextMustBeUTF8: a text frame that is not UTF-8 closes the socket
// with 1007; the execution socket answers ack and resume frames that carry
// an id instead of ignoring them.
func TestWSTextMustBeUTF8(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	ag := a.dialWS("/v0/agents/ws?agent_id=utf-agent&consumer_id=c1", gateway.SubprotocolJSON)
	ag.expect("hello")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := ag.c.Write(ctx, websocket.MessageText, []byte("{\"type\":\"ack\",\"seq\":1,\"id\":\"\xff\"}")); err != nil {
		t.Fatal(err)
	}
	ag.expectClose(websocket.StatusInvalidFramePayloadData)

	id := a.create("utf-agent", nil)["id"].(string)
	ex := a.dialWS("/v0/executions/"+id+"/ws", gateway.SubprotocolJSON)
	ex.send(obj{"type": "ack", "seq": 1, "id": "a1"})
	if f := ex.replyTo("a1"); f.obj["status"] != 400.0 {
		t.Fatalf("ack on the execution socket: %v", f.obj)
	}
	ex.send(obj{"type": "resume", "cursor": 1, "id": "r1"})
	if f := ex.replyTo("r1"); f.obj["status"] != 400.0 {
		t.Fatalf("resume on the execution socket: %v", f.obj)
	}
}

// startLogged starts a server that logs everything, at debug level, into
// the returned buffer.
func startLogged(t *testing.T) (*api, *syncbuf.Buffer) {
	t.Helper()
	logs := &syncbuf.Buffer{}
	s := start(t, node.Options{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	return newAPI(t, s), logs
}

// answer sends a request and returns its status and up to 5s of its body:
// a stream that should have been refused ends the read, not the test.
func (a *api) answer(method, path string, body any, hdr ...string) (int, []byte) {
	a.t.Helper()
	var r io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			a.t.Fatal(err)
		}
		r = bytes.NewReader(data)
	}
	ctx, cancel := context.WithTimeout(a.t.Context(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, r)
	if err != nil {
		a.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

// evil marks every refused id: no answer and no log line may hold it.
const evil = "EVIL-7f3a"

// TestIDsRefusedAtEveryDoor sends ids with control characters, format
// characters (bidirectional overrides, zero-width spaces), line separators
// and bytes that are not UTF-8 through every door that takes an id: a path,
// a query, a body, a header. Each is a 400 VALIDATION_ERROR whose answer
// names the field and holds nothing of the id, and nothing of it reaches
// the log. Ids that keep the rule (spaces, accents, other scripts) pass.
func TestIDsRefusedAtEveryDoor(t *testing.T) {
	a, logs := startLogged(t)
	execID := a.create("agent-1", nil)["id"].(string)
	bad := map[string]string{
		"newline":        "a\n" + evil,
		"nul":            "a\x00" + evil,
		"escape":         "a\x1b[31m" + evil,
		"bidi override":  "a\u202e" + evil,
		"zero-width":     "bash\u200b" + evil,
		"byte order":     "\ufeff" + evil,
		"line separator": "a\u2028" + evil,
		"long":           evil + strings.Repeat("x", 300),
	}
	q := url.QueryEscape
	for name, id := range bad {
		for _, c := range []struct {
			door, method, path string
			body               any
		}{
			{"create label key", "POST", "/v0/executions", obj{"agent_id": "a", "labels": obj{id: "v"}}},
			{"step result step_id", "POST", "/v0/agents/step-result", obj{"execution_id": execID, "session_id": "s", "step_id": id, "success": true}},
			{"step result idempotency_key", "POST", "/v0/agents/step-result", obj{"execution_id": execID, "session_id": "s", "step_id": "x", "success": true, "idempotency_key": id}},
			{"runner result job_id", "POST", "/v0/runners/r1/results", obj{"job_id": id, "execution_id": execID, "step_id": "s", "success": true}},
			{"started runner_id", "POST", "/v0/runners/steps/s1/started", obj{"execution_id": execID, "runner_id": id}},
			{"respond channel_id", "POST", "/v0/actions/x/respond", obj{"decision": "deny", "channel_id": id}},
			{"respond native_peer_id", "POST", "/v0/actions/x/respond", obj{"decision": "deny", "native_peer_id": id}},
			{"peers ack id", "POST", "/v0/peers/ack", obj{"role": "agent", "id": id, "consumer_id": "c", "sequence": 1}},
			{"tool_info name", "POST", "/v0/runners/r1/capabilities", obj{"tools": []string{"t"}, "tool_info": []obj{{"name": id}}}},
			{"agent stream consumer_id", "GET", "/v0/agents/stream?agent_id=a&consumer_id=" + q(id), nil},
			{"channel stream peer_id", "GET", "/v0/channels/stream?channel_id=web&peer_id=" + q(id), nil},
			{"path execution id", "GET", "/v0/executions/" + url.PathEscape(id), nil},
			{"path runner id", "DELETE", "/v0/runners/" + url.PathEscape(id), nil},
			{"path action id", "POST", "/v0/actions/" + url.PathEscape(id) + "/respond", obj{"decision": "deny"}},
			{"create, Idempotency-Key", "POST", "/v0/executions", obj{"agent_id": "a"}},
			{"intent, Idempotency-Key", "POST", "/v0/agents/intent", obj{"execution_id": execID, "session_id": "s", "intent": obj{"type": "complete"}}},
		} {
			var hdr []string
			if strings.HasSuffix(c.door, "Idempotency-Key") {
				if strings.ContainsAny(id, "\n\x00\x1b") {
					continue // no client library sends these in a header
				}
				hdr = []string{"Idempotency-Key", id}
			}
			status, body := a.answer(c.method, c.path, c.body, hdr...)
			if status != 400 || !bytes.Contains(body, []byte(`"VALIDATION_ERROR"`)) {
				t.Errorf("%s, %s id: status %d, body %s; want 400 VALIDATION_ERROR", c.door, name, status, body)
			}
			if bytes.Contains(body, []byte(evil)) {
				t.Errorf("%s, %s id: the answer echoes the id: %s", c.door, name, body)
			}
		}
	}
	// Bytes that are not UTF-8 can only come in a path or a query: a body
	// that holds them is refused whole.
	for _, path := range []string{"/v0/agents/stream?agent_id=a%FF" + evil + "&consumer_id=c", "/v0/executions/a%FF" + evil} {
		if status, body := a.answer("GET", path, nil); status != 400 || bytes.Contains(body, []byte(evil)) {
			t.Errorf("%s: %d %s; want 400 without the id", path, status, body)
		}
	}
	if strings.Contains(logs.String(), evil) {
		t.Errorf("a refused id reached the log:\n%s", logs.String())
	}
	// Ids that keep the rule work: spaces, accents, other scripts, slashes.
	for _, id := range []string{"my agent", "agent-é", "エージェント", "tools/bash", "alice@example.com"} {
		a.json("POST", "/v0/executions", obj{"agent_id": id, "labels": obj{id: "a value"}}, 201, "Idempotency-Key", id)
	}
}

// TestMalformedRequestsLogNoToken: a request fasthttp cannot parse is
// answered without quoting it, and its Authorization header reaches no
// log line either, at any level.
func TestMalformedRequestsLogNoToken(t *testing.T) {
	a, logs := startLogged(t)
	for _, req := range []string{
		"POST /v0/executions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer tok-" + evil + "\r\nContent-Type: application/json\r\nX-Bad: a\x01b\r\nContent-Length: 2\r\n\r\n{}",
		"GET /v0/health HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer tok-" + evil + "\r\nContent-Length: 1x\r\n\r\n",
		"GET /v0/health HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer tok-" + evil + "\r\nX-Pad: " + strings.Repeat("p", 8000) + "\r\n\r\n",
	} {
		rc := dialRaw(t, a.base)
		rc.write(req)
		resp, body := rc.response()
		if resp.StatusCode/100 != 4 || strings.Contains(body, evil) {
			t.Errorf("%.60q: %d %s; want a 4xx that quotes nothing", req, resp.StatusCode, body)
		}
	}
	a.json("GET", "/v0/health", nil, 200) // the log has caught up with the connections before
	if strings.Contains(logs.String(), evil) {
		t.Errorf("the Authorization header of a malformed request reached the log:\n%s", logs.String())
	}
}

// TestLoneSurrogatesAndMsgpackText: a \u escape of half a surrogate pair
// in a body is 400, as a body that is not UTF-8 is; in a frame, and a
// msgpack string that is not UTF-8, it closes the socket with 1007. Go's
// decoders would otherwise make both U+FFFD without a word.
func TestLoneSurrogatesAndMsgpackText(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	for _, in := range []string{`"\ud800"`, `"x\uDC00y"`, `"\ude00\ud83d"`, `{"\ud83d":1}`, `"\ud800\u0041"`} {
		out := a.fail("POST", "/v0/executions", `{"agent_id":"a","input":`+in+`}`, 400, "VALIDATION_ERROR")
		if !strings.Contains(out["error"].(string), "surrogate") {
			t.Errorf("input %s: %v", in, out)
		}
	}
	for _, in := range []string{`"\ud83d\ude00"`, `"\\ud800"`, `"\u00e9\uFFFD"`} {
		a.json("POST", "/v0/executions", `{"agent_id":"a","input":`+in+`}`, 201)
	}
	const path = "/v0/agents/ws?agent_id=sur-agent&consumer_id=c1"
	for _, c := range []struct {
		proto, data, reason string
	}{
		{gateway.SubprotocolJSON, `{"type":"ack","seq":1,"x":"\ud800"}`, "malformed frame"},
		{gateway.SubprotocolMsgpack, "\x83\xa4type\xa3ack\xa3seq\x01\xa1x\xa1\xff", "malformed frame: msgpack: a string is not valid UTF-8"},
		{gateway.SubprotocolMsgpack, "\x83\xa4type\xa3ack\xa3seq\x01\xa1\xff\x01", "malformed frame: msgpack: a string is not valid UTF-8"},
	} {
		ws := a.dialWS(path, c.proto)
		ws.expect("hello")
		if err := ws.c.Write(t.Context(), ws.msgType(), []byte(c.data)); err != nil {
			t.Fatal(err)
		}
		if reason := ws.expectClose(websocket.StatusInvalidFramePayloadData); !strings.HasPrefix(reason, c.reason) {
			t.Errorf("%q: reason %q, want %q", c.data, reason, c.reason)
		}
	}
}

// TestWSProtocolErrorsClose1002: a frame that breaks RFC 6455 ends the
// socket with 1002, also the unmasked client frame that coder/websocket
// only reports; a clean close by the peer is still answered with 1000.
// The frames are written by hand: WebSocket clients cannot send them.
func TestWSProtocolErrorsClose1002(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	id := a.create("pe-agent", nil)["id"].(string)
	for _, c := range []struct {
		name  string
		frame []byte
		want  int
	}{
		{"unmasked frame", []byte{0x81, 0x02, '{', '}'}, 1002},
		{"reserved opcode", []byte{0x83, 0x80, 0, 0, 0, 0}, 1002},
		{"reserved bit", []byte{0xc1, 0x80, 0, 0, 0, 0}, 1002},
		{"fragmented ping", []byte{0x09, 0x80, 0, 0, 0, 0}, 1002},
		{"continuation first", []byte{0x80, 0x80, 0, 0, 0, 0}, 1002},
		{"clean close", []byte{0x88, 0x82, 0, 0, 0, 0, 0x03, 0xe8}, 1000},
	} {
		for _, path := range []string{"/v0/agents/ws?agent_id=pe-agent&consumer_id=c1", "/v0/executions/" + id + "/ws"} {
			rc := dialRaw(t, a.base)
			rc.upgrade(path)
			if _, err := rc.c.Write(c.frame); err != nil {
				t.Fatal(err)
			}
			if code := rc.closeCode(); code != c.want {
				t.Errorf("%s on %s: closed with %d, want %d", c.name, path, code, c.want)
			}
		}
	}
}

// upgrade opens a WebSocket on the raw connection and reads the server's
// hello frame.
func (r *rawConn) upgrade(path string) {
	r.t.Helper()
	r.write("GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
	_ = r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(r.br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		r.t.Fatalf("upgrade %s: %v %v", path, resp, err)
	}
	if op, _ := r.wsFrame(); op != 1 {
		r.t.Fatalf("upgrade %s: first frame opcode %d, want a text hello", path, op)
	}
}

// wsFrame reads one unmasked server frame: its opcode and payload.
func (r *rawConn) wsFrame() (byte, []byte) {
	r.t.Helper()
	_ = r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var h [2]byte
	if _, err := io.ReadFull(r.br, h[:]); err != nil {
		r.t.Fatalf("read frame: %v", err)
	}
	n := uint64(h[1] & 0x7f)
	if n >= 126 {
		ext := make([]byte, 2+6*(n-126))
		if _, err := io.ReadFull(r.br, ext); err != nil {
			r.t.Fatalf("read frame length: %v", err)
		}
		n = 0
		for _, b := range ext {
			n = n<<8 | uint64(b)
		}
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r.br, payload); err != nil {
		r.t.Fatalf("read frame payload: %v", err)
	}
	return h[0] & 0x0f, payload
}

// closeCode reads frames until a close frame and returns its code.
func (r *rawConn) closeCode() int {
	r.t.Helper()
	for {
		op, p := r.wsFrame()
		if op != 8 {
			continue
		}
		if len(p) < 2 {
			return 1005
		}
		return int(binary.BigEndian.Uint16(p))
	}
}

// TestExecutionCursorSyntax: the execution socket's cursors (after_sequence,
// cursor, Last-Event-ID) and the execution stream's Last-Event-ID are
// sequences; anything else is a 400 before the upgrade or the first stream
// byte, not a silent 0 that replays everything. after_sequence on the SSE
// stream keeps the kernel API's rule: unparsable is 0.
func TestExecutionCursorSyntax(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	id := a.create("cs-agent", nil)["id"].(string)
	a.json("POST", "/v0/executions/"+id+"/cancel", nil, 200)
	ws := "ws" + strings.TrimPrefix(a.base, "http") + "/v0/executions/" + id + "/ws"
	for _, bad := range []string{"x.y", "5.", ".5", "-1", "+1", " 1", "18446744073709551616", "1e3", "0x10"} {
		for _, c := range []struct {
			what, query, header string
		}{
			{"after_sequence", "?after_sequence=" + url.QueryEscape(bad), ""},
			{"cursor", "?cursor=" + url.QueryEscape(bad), ""},
			{"Last-Event-ID", "", bad},
		} {
			h := http.Header{}
			if c.header != "" {
				if bad == " 1" {
					continue // a header value loses its spaces on the way
				}
				h.Set("Last-Event-ID", c.header)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			conn, resp, err := websocket.Dial(ctx, ws+c.query, &websocket.DialOptions{HTTPHeader: h})
			cancel()
			if err == nil {
				conn.CloseNow()
				t.Errorf("socket %s %q: upgraded, want 400", c.what, bad)
				continue
			}
			if resp == nil || resp.StatusCode != 400 || !strings.Contains(respBody(resp), c.what+" must be a sequence") {
				t.Errorf("socket %s %q: %v %v, want 400 naming %s", c.what, bad, resp, err, c.what)
			}
		}
		if bad == " 1" {
			continue // a header value loses its spaces on the way
		}
		status, body := a.answer("GET", "/v0/executions/"+id+"/stream", nil, "Last-Event-ID", bad)
		if status != 400 || !bytes.Contains(body, []byte("Last-Event-ID must be a sequence")) {
			t.Errorf("stream Last-Event-ID %q: %d %s, want 400", bad, status, body)
		}
	}
	// Valid cursors replay after them; the stream's after_sequence keeps the
	// kernel API's lenience.
	all := a.events(id)
	st := a.openSSE("/v0/executions/" + id + "/stream?after_sequence=abc")
	for range all {
		st.next()
	}
	st.ended()
	st = a.openSSE("/v0/executions/"+id+"/stream", "Last-Event-ID", "1")
	if f := st.next(); f.ID != "2" {
		t.Fatalf("Last-Event-ID 1: first frame %s, want 2", f.ID)
	}
	sock := a.dialWS("/v0/executions/"+id+"/ws?cursor=1", gateway.SubprotocolJSON)
	sock.expect("hello")
	if f := sock.expect("event"); f["seq"] != 2.0 {
		t.Fatalf("cursor 1: %v", f)
	}
}
