package conformance

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/coder/websocket"
)

func checkCrossOrigin(t *tc) {
	body := map[string]any{"agent_id": newID("conf-agent-")}
	for _, h := range [][2]string{{"Origin", "http://conformance.invalid"}, {"Sec-Fetch-Site", "cross-site"}} {
		t.expectError(t.call(http.MethodPost, "/v0/executions", body, header(h[0], h[1])), http.StatusForbidden, "FORBIDDEN_ORIGIN")
	}
	t.expectError(t.call(http.MethodGet, "/v0/executions", nil, header("Sec-Fetch-Site", "cross-site"), header("Sec-Fetch-Mode", "cors")), http.StatusForbidden, "FORBIDDEN_ORIGIN")
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"} {
		t.expectError(t.call(http.MethodPost, "/v0/executions", body, header("Content-Type", ct)), http.StatusUnsupportedMediaType, "UNSUPPORTED_MEDIA_TYPE")
	}
}

func checkHost(t *tc) {
	r := t.call(http.MethodGet, "/v0/executions", nil, func(r *http.Request) { r.Host = "rebind.invalid" })
	if t.o.Token != "" {
		// A token is what a rebound page cannot have: any Host is served.
		if o := t.expectJSON(r, http.StatusOK); !o.has("executions") {
			t.fatalf("a token-bearing request with another Host is not the executions page: %s", r)
		}
		return
	}
	t.expectError(r, http.StatusMisdirectedRequest, "HOST_NOT_ALLOWED")
}

// wantForbidden fails unless the answer is a 403 FORBIDDEN JSON error.
func (t *tc) wantForbidden(r *response, what string) {
	if r.status != http.StatusForbidden {
		t.fatalf("%s: want 403: %s", what, r)
	}
	t.expectError(r, http.StatusForbidden, "FORBIDDEN")
}

// streamAs opens a stream with a token and returns the non-stream answer,
// or nil when it opened (and is closed again at once).
func (t *tc) streamAs(path, tok string) *response {
	s, r := t.openStream(path, bearer(tok))
	if s != nil {
		s.close()
		return nil
	}
	return r
}

func checkRunnerTokenScope(t *tc) {
	tok, own := t.o.RunnerToken, t.o.RunnerTokenID
	if tok == "" || own == "" {
		t.skipf("needs a token scoped to one runner: pass --runner-token and --runner-token-id")
	}
	stream := func(id string) string {
		return "/v0/runners/stream?" + url.Values{"runner_id": {id}, "consumer_id": {newID("c-")}}.Encode()
	}
	if r := t.streamAs(stream(own), tok); r != nil {
		t.fatalf("the runner token cannot open its own runner stream: %s", r)
	}
	other := newID("conf-runner-")
	if r := t.streamAs(stream(other), tok); r != nil {
		t.wantForbidden(r, "runner stream of another runner id")
	} else {
		t.fatalf("a runner token opened the stream of another runner id")
	}
	t.wantForbidden(t.call(http.MethodPost, "/v0/runners/"+other+"/results", map[string]any{"job_id": "j", "execution_id": "e", "step_id": "s", "success": true}, bearer(tok)), "results for another runner id")
	t.wantForbidden(t.call(http.MethodGet, "/v0/executions", nil, bearer(tok)), "listing executions with a runner token")
	t.wantForbidden(t.call(http.MethodPost, "/v0/executions", map[string]any{"agent_id": newID("conf-agent-")}, bearer(tok)), "creating an execution with a runner token")
	if r := t.streamAs("/v0/agents/stream?agent_id="+own+"&consumer_id=c", tok); r != nil {
		t.wantForbidden(r, "agent stream with a runner token")
	} else {
		t.fatalf("a runner token opened an agent stream")
	}
}

func checkAgentTokenScope(t *tc) {
	tok, own := t.o.AgentToken, t.o.AgentTokenID
	if tok == "" || own == "" {
		t.skipf("needs a token scoped to one agent: pass --agent-token and --agent-token-id")
	}
	a := &agent{t: t, id: own, consumer: newID("conf-consumer-")}
	a.connect(bearer(tok))
	o := t.create(map[string]any{"agent_id": own})
	id, _ := o.str("id")
	_, p := a.s.nextEvent(t, "execution.assigned", func(p obj) bool { s, _ := p.str("execution_id"); return s == id })
	mine := &run{a: a, id: id, session: t.wantStr(p, "session_id", "execution.assigned")}

	other := newID("conf-agent-")
	if r := t.streamAs("/v0/agents/stream?agent_id="+other+"&consumer_id=c", tok); r != nil {
		t.wantForbidden(r, "agent stream of another agent id")
	} else {
		t.fatalf("an agent token opened the stream of another agent id")
	}
	if r := t.streamAs("/v0/runners/stream?runner_id="+own+"&consumer_id=c", tok); r != nil {
		t.wantForbidden(r, "runner stream with an agent token")
	} else {
		t.fatalf("an agent token opened a runner stream")
	}
	theirs, _ := t.create(map[string]any{"agent_id": other}).str("id")
	// Another agent's execution is not there for this token.
	t.expectError(t.call(http.MethodPost, "/v0/agents/intent", map[string]any{
		"execution_id": theirs, "session_id": uuidLike(), "intent": map[string]any{"type": "complete"},
	}, bearer(tok)), http.StatusNotFound, "NOT_FOUND")
	t.expectJSON(mine.intent(map[string]any{"type": "complete"}, bearer(tok)), http.StatusOK)
}

func checkHeaders431(t *tc) {
	r := t.call(http.MethodGet, "/v0/health", nil, header("X-Conformance-Secret", "SECRET-"+strings.Repeat("p", 16<<10)))
	if r.status != http.StatusRequestHeaderFieldsTooLarge {
		t.fatalf("want 431: %s", r)
	}
	if strings.Contains(string(r.body), "SECRET-") || strings.Contains(string(r.body), "ppp") {
		t.fatalf("the 431 echoes the request: %s", r.body)
	}
	if t.o.Token != "" && strings.Contains(string(r.body), t.o.Token) {
		t.fatalf("the 431 echoes the token: %s", r.body)
	}
}

func checkCursorSyntax(t *tc) {
	for _, cur := range []string{"x.y", "5.", ".5", "-1", "18446744073709551616"} {
		q := url.Values{"agent_id": {newID("conf-agent-")}, "consumer_id": {"c"}, "cursor": {cur}}.Encode()
		s, r := t.openStream("/v0/agents/stream?" + q)
		if s != nil {
			s.close()
			t.fatalf("cursor %q opened a stream", cur)
		}
		t.expectError(r, http.StatusBadRequest, "VALIDATION_ERROR")
		r = t.call(http.MethodGet, "/v0/agents/ws?"+q, nil, header("Connection", "Upgrade"), header("Upgrade", "websocket"),
			header("Sec-WebSocket-Version", "13"), header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="))
		if r.status != http.StatusBadRequest {
			t.fatalf("WebSocket with cursor %q: want 400 before the upgrade: %s", cur, r)
		}
	}
}

// wsUpgrade are the headers of a WebSocket handshake, sent with a plain
// request: a refusal comes back as an ordinary answer.
var wsUpgrade = []reqOpt{header("Connection", "Upgrade"), header("Upgrade", "websocket"),
	header("Sec-WebSocket-Version", "13"), header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")}

func checkExecutionCursorSyntax(t *tc) {
	id := t.wantStr(t.create(map[string]any{"agent_id": newID("conf-agent-")}), "id", "created execution")
	for _, cur := range []string{"x.y", "5.", ".5", "-1", "18446744073709551616"} {
		for _, q := range []string{"after_sequence", "cursor"} {
			r := t.call(http.MethodGet, "/v0/executions/"+id+"/ws?"+url.Values{q: {cur}}.Encode(), nil, wsUpgrade...)
			if r.status != http.StatusBadRequest {
				t.fatalf("execution socket with %s %q: want 400 before the upgrade: %s", q, cur, r)
			}
		}
		r := t.call(http.MethodGet, "/v0/executions/"+id+"/ws", nil, append([]reqOpt{header("Last-Event-ID", cur)}, wsUpgrade...)...)
		if r.status != http.StatusBadRequest {
			t.fatalf("execution socket with Last-Event-ID %q: want 400 before the upgrade: %s", cur, r)
		}
		s, r := t.openStream("/v0/executions/"+id+"/stream", header("Last-Event-ID", cur))
		if s != nil {
			s.close()
			t.fatalf("execution stream with Last-Event-ID %q opened", cur)
		}
		t.expectError(r, http.StatusBadRequest, "VALIDATION_ERROR")
	}
}

func checkIDSyntax(t *tc) {
	const mark = "CONF-ID-MARK"
	for _, bad := range []string{"a\n" + mark, "a\x00" + mark, "a\u202e" + mark, "bash\u200b" + mark} {
		s, streamed := t.openStream("/v0/agents/stream?" + url.Values{"agent_id": {bad}, "consumer_id": {"c"}}.Encode())
		if s != nil {
			s.close()
			t.fatalf("an agent stream opened for an id with a control or format character")
		}
		for _, r := range []*response{
			t.call(http.MethodPost, "/v0/executions", map[string]any{"agent_id": bad}),
			t.call(http.MethodGet, "/v0/executions/"+url.PathEscape(bad), nil),
			streamed,
		} {
			t.expectError(r, http.StatusBadRequest, "VALIDATION_ERROR")
			if strings.Contains(string(r.body), mark) {
				t.fatalf("the answer echoes the id: %s", r.body)
			}
		}
	}
}

// checkToolSquatting: the built-in memory tools are served by the gateway
// alone. A runner that declares one, bare or on an account, on its stream's
// query (SSE or WebSocket), by POST /v0/runners/{id}/capabilities or by a
// capabilities frame on its socket, is refused with 403 TOOL_NOT_ALLOWED,
// before any stream byte or the upgrade, whatever its credential (the
// suite's own, an admin's), and the memory capabilities name no runner of
// its.
func checkToolSquatting(t *tc) {
	t.rtRequire()
	var memory []string
	for _, c := range objects(t.expectJSON(t.call(http.MethodGet, rt+"/capabilities", nil), http.StatusOK), "capabilities") {
		if kind, _ := c.str("kind"); kind == "memory" {
			name, _ := c.str("name")
			memory = append(memory, name)
		}
	}
	if len(memory) == 0 {
		t.skipf("the gateway lists no memory capability")
	}
	runner := newID("conf-squatter-")
	for _, tool := range []string{memory[0], memory[len(memory)-1] + "@" + newID("acc-")} {
		query := url.Values{"runner_id": {runner}, "consumer_id": {newID("c-")}, "capabilities": {tool}}.Encode()
		if s, r := t.openStream("/v0/runners/stream?" + query); s != nil {
			s.close()
			t.fatalf("a runner declaring the built-in tool %s opened its stream", tool)
		} else {
			t.expectError(r, http.StatusForbidden, "TOOL_NOT_ALLOWED")
		}
		if r := t.wsRefusal("/v0/runners/ws?" + query); r != nil {
			t.expectError(r, http.StatusForbidden, "TOOL_NOT_ALLOWED")
		}
		t.expectError(t.call(http.MethodPost, "/v0/runners/"+url.PathEscape(runner)+"/capabilities", map[string]any{"tools": []string{"conf.tool", tool}}),
			http.StatusForbidden, "TOOL_NOT_ALLOWED")
		t.wantFrameRefused(runner, tool)
	}
	for _, c := range objects(t.expectJSON(t.call(http.MethodGet, rt+"/capabilities", nil), http.StatusOK), "capabilities") {
		var runners []string
		_ = json.Unmarshal(c["runners"], &runners)
		if slices.Contains(runners, runner) {
			t.fatalf("the refused runner is listed as serving %s: %v", c["name"], runners)
		}
	}
}

// wsRefusal dials path, a socket the gateway must refuse, and returns its
// answer; nil when the gateway has no such socket (404 or 405). A socket
// that opens fails the check.
func (t *tc) wsRefusal(path string) *response {
	ctx, cancel := t.within(10 * time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(t.o.URL, "http")+path, &websocket.DialOptions{
		HTTPClient: t.o.HTTPClient, HTTPHeader: t.authHeader(), Subprotocols: []string{"gatehouse.v1.json"}})
	if err == nil {
		c.CloseNow()
		t.fatalf("the socket %s opened; want a refusal", path)
	}
	if resp == nil {
		t.fatalf("dial %s: %v", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
		return nil
	}
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return &response{method: http.MethodGet, path: path, status: resp.StatusCode, header: resp.Header, body: data}
}

// wantFrameRefused opens runner's socket declaring nothing and sends a
// capabilities frame declaring tool: its reply must be 403
// TOOL_NOT_ALLOWED. A gateway without the runner socket is not checked.
func (t *tc) wantFrameRefused(runner, tool string) {
	ctx, cancel := t.within(10 * time.Second)
	defer cancel()
	path := "/v0/runners/ws?" + url.Values{"runner_id": {runner}, "consumer_id": {newID("c-")}}.Encode()
	c, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(t.o.URL, "http")+path, &websocket.DialOptions{
		HTTPClient: t.o.HTTPClient, HTTPHeader: t.authHeader(), Subprotocols: []string{"gatehouse.v1.json"}})
	if err != nil {
		if resp != nil && (resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed) {
			return
		}
		t.fatalf("dial %s: %v", path, err)
	}
	defer c.CloseNow()
	cmd, _ := json.Marshal(map[string]any{"type": "command", "id": "squat", "command": "capabilities", "body": map[string]any{"tools": []string{tool}}})
	if err := c.Write(ctx, websocket.MessageText, cmd); err != nil {
		t.fatalf("send the capabilities frame: %v", err)
	}
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			t.fatalf("no reply to a capabilities frame declaring %s: %v", tool, err)
		}
		var f struct {
			Type   string `json:"type"`
			ID     string `json:"id"`
			Status int    `json:"status"`
			Body   struct {
				Error, Code string
			} `json:"body"`
		}
		if json.Unmarshal(data, &f) != nil || f.Type != "reply" || f.ID != "squat" {
			continue // hello, heartbeats
		}
		if f.Status != http.StatusForbidden || f.Body.Code != "TOOL_NOT_ALLOWED" || f.Body.Error == "" {
			t.fatalf("a capabilities frame declaring %s: reply %s, want 403 TOOL_NOT_ALLOWED", tool, data)
		}
		return
	}
}

// authHeader is the suite's credential as a header, for WebSocket dials.
func (t *tc) authHeader() http.Header {
	h := http.Header{}
	if t.o.Token != "" {
		h.Set("Authorization", "Bearer "+t.o.Token)
	}
	return h
}
