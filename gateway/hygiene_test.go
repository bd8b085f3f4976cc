package gateway_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/gatehouse-dev/gatehouse/gateway"
)

// TestInputHygiene: ids with control characters, bodies that are not
// UTF-8 and numbers beyond float64 are refused with 400, and never echoed.
func TestInputHygiene(t *testing.T) {
	s := start(t, gateway.Config{})
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
	s := start(t, gateway.Config{})
	c := dialRaw(t, s.URL)
	c.write("GET /v0/health HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer TOPSECRET-TOKEN\r\nX-Padding: " + strings.Repeat("p", 8000) + "\r\n\r\n")
	resp, body := c.response()
	if resp.StatusCode != 431 || !strings.Contains(body, "HEADERS_TOO_LARGE") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if strings.Contains(body, "TOPSECRET") || strings.Contains(body, "ppp") || strings.Contains(body, "Authorization") {
		t.Fatalf("the answer echoes the request: %s", body)
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
	s := start(t, gateway.Config{})
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
	s := start(t, gateway.Config{})
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
