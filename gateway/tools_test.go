package gateway_test

import (
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// declare is one way a runner declares what it serves: on the query of
// its SSE stream or socket, by POST /v0/runners/{id}/capabilities, or by a
// capabilities frame on its socket. It returns the answer's status and
// machine code (200 and "" when accepted).
type declare func(t *testing.T, a *api, runnerID, consumer string, caps []string) (int, string)

func declareBySSE(t *testing.T, a *api, runnerID, consumer string, caps []string) (int, string) {
	t.Helper()
	_, status, body := a.trySSE(runnerPath("stream", runnerID, consumer, caps))
	return status, codeOf(t, status, []byte(body))
}

func declareByWSQuery(t *testing.T, a *api, runnerID, consumer string, caps []string) (int, string) {
	t.Helper()
	c, resp, err := a.tryWS(runnerPath("ws", runnerID, consumer, caps), gateway.SubprotocolJSON)
	if err == nil {
		_ = c.CloseNow()
		return 200, ""
	}
	if resp == nil {
		t.Fatalf("dial: %v", err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("refused upgrade: %d with content type %q", resp.StatusCode, ct)
	}
	return resp.StatusCode, codeOf(t, resp.StatusCode, []byte(respBody(resp)))
}

func declareByPOST(t *testing.T, a *api, runnerID, _ string, caps []string) (int, string) {
	t.Helper()
	status, body, _ := a.do("POST", "/v0/runners/"+runnerID+"/capabilities", obj{"tools": caps})
	return status, codeOf(t, status, body)
}

func declareByFrame(t *testing.T, a *api, runnerID, consumer string, caps []string) (int, string) {
	t.Helper()
	w := a.dialWS(runnerPath("ws", runnerID, consumer, nil), gateway.SubprotocolMsgpack)
	w.expect("hello")
	f := w.command("capabilities", obj{"tools": caps})
	status := int(f.obj["status"].(float64))
	if status == 200 {
		return 200, ""
	}
	body, _ := f.obj["body"].(obj)
	if msg, _ := body["error"].(string); msg == "" {
		t.Fatalf("refusal without a message: %v", f.obj)
	}
	code, _ := body["code"].(string)
	return status, code
}

func runnerPath(kind, runnerID, consumer string, caps []string) string {
	q := url.Values{"runner_id": {runnerID}, "consumer_id": {consumer}}
	if len(caps) > 0 {
		q.Set("capabilities", strings.Join(caps, ","))
	}
	return "/v0/runners/" + kind + "?" + q.Encode()
}

// codeOf returns the machine code of an error answer, "" for a 200.
func codeOf(t *testing.T, status int, body []byte) string {
	t.Helper()
	if status == 200 {
		return ""
	}
	out := nodetest.Object(t, "the answer", "", status, body, status)
	if msg, _ := out["error"].(string); msg == "" {
		t.Fatalf("%d without a message: %s", status, body)
	}
	code, _ := out["code"].(string)
	return code
}

// TestToolSquattingRefused: a tool is served only by the runners the
// deployment trusts with it, by every door a runner declares its tools
// through (SSE and socket query, HTTP, socket frame, JSON and msgpack): the
// built-in memory tools by the built-in runner alone, whoever asks, an
// admin included; any other tool by an admin credential without a tools
// claim, and by a credential whose tools claim matches it. A refusal is
// 403 TOOL_NOT_ALLOWED before the stream starts or the socket upgrades,
// and the capabilities list names every runner that serves each tool.
func TestToolSquattingRefused(t *testing.T) {
	s := start(t, node.Options{Auth: jwtOptions()})
	admin := newAPIAs(t, s, auth.Claims{Subject: "ops", Role: auth.RoleAdmin})
	unclaimed := newAPIAs(t, s, auth.Claims{Subject: "r-none", Role: auth.RoleRunner, Runners: []string{"r-none"}})
	crm := newAPIAs(t, s, auth.Claims{Subject: "r-crm", Role: auth.RoleRunner, Runners: []string{"r-crm"}, Tools: []string{"crm.*"}})
	everything := newAPIAs(t, s, auth.Claims{Subject: "r-all", Role: auth.RoleRunner, Runners: []string{"r-all"}, Tools: []string{"*"}})

	const refused = "TOOL_NOT_ALLOWED"
	tests := []struct {
		name   string
		as     *api
		runner string
		caps   []string
		code   string
	}{
		{"an admin may not serve a memory tool", admin, "squat", []string{"memory_read"}, refused},
		{"nor a memory tool on an account", admin, "squat", []string{"mail.send", "memory_write@acme"}, refused},
		{"nor may a runner trusted with everything", everything, "r-all", []string{"save_memory_note"}, refused},
		{"a runner token without a tools claim serves nothing", unclaimed, "r-none", []string{"crm.search"}, refused},
		{"a runner token serves nothing its claim does not match", crm, "r-crm", []string{"crm.search", "mail.send"}, refused},
		{"a runner token serves what its claim matches", crm, "r-crm", []string{"crm.search", "crm.lookup@acme-1"}, ""},
		{"an admin without a claim serves any other tool", admin, "any", []string{"mail.send"}, ""},
	}
	doors := []struct {
		name string
		do   declare
	}{{"sse-query", declareBySSE}, {"ws-query", declareByWSQuery}, {"http", declareByPOST}, {"ws-frame", declareByFrame}}
	for _, tt := range tests {
		for _, door := range doors {
			t.Run(tt.name+"/"+door.name, func(t *testing.T) {
				status, code := door.do(t, tt.as, tt.runner, "c-"+door.name, tt.caps)
				want := 200
				if tt.code != "" {
					want = 403
				}
				if status != want || code != tt.code {
					t.Fatalf("declaring %v as %s: %d %s, want %d %s", tt.caps, tt.runner, status, code, want, tt.code)
				}
			})
		}
	}

	// Every runner serving a tool is listed with it; no other runner is
	// listed with a memory tool.
	caps := admin.json("GET", "/runtime/v1/capabilities", nil, 200)["capabilities"].([]any)
	runners := map[string][]string{}
	for _, c := range caps {
		c := c.(obj)
		for _, r := range c["runners"].([]any) {
			runners[c["name"].(string)] = append(runners[c["name"].(string)], r.(string))
		}
	}
	for _, name := range []string{"memory_read", "memory_write", "memory_search", "save_memory_note"} {
		if got := runners[name]; !slices.Equal(got, []string{"gatehouse.memory"}) {
			t.Errorf("%s served by %v, want the built-in runner only", name, got)
		}
	}
	if got := runners["crm.search"]; !slices.Equal(got, []string{"r-crm"}) {
		t.Errorf("crm.search served by %v, want r-crm", got)
	}
	if got := runners["mail.send"]; !slices.Equal(got, []string{"any"}) {
		t.Errorf("mail.send served by %v, want any", got)
	}
}

// TestBuiltinRunnerIDIsNoCredentials: no credential, an admin's included,
// acts as the built-in memory runner's id: its streams, results, started
// reports, acknowledgements and removal are refused with 403.
func TestBuiltinRunnerIDIsNoCredentials(t *testing.T) {
	admin := newAPI(t, start(t, node.Options{}))
	const id = "gatehouse.memory"
	if _, status, body := admin.trySSE(runnerPath("stream", id, "c", nil)); status != 403 || !strings.Contains(body, `"FORBIDDEN"`) {
		t.Fatalf("stream as the built-in runner: %d %s", status, body)
	}
	admin.wsRefused(runnerPath("ws", id, "c", nil), 403, "FORBIDDEN")
	admin.fail("POST", "/v0/runners/"+id+"/results", obj{"job_id": "j", "execution_id": "e", "step_id": "s", "success": true}, 403, "FORBIDDEN")
	admin.fail("POST", "/v0/runners/steps/s/started", obj{"execution_id": "e", "runner_id": id}, 403, "FORBIDDEN")
	admin.fail("POST", "/v0/runners/"+id+"/capabilities", obj{"tools": []string{}}, 403, "FORBIDDEN")
	admin.fail("POST", "/v0/peers/ack", obj{"role": "runner", "id": id, "consumer_id": "builtin", "sequence": 1}, 403, "FORBIDDEN")
	admin.fail("DELETE", "/v0/runners/"+id, nil, 403, "FORBIDDEN")

	// The built-in runner still serves: a memory call completes.
	out := admin.json("POST", "/runtime/v1/tools/memory_search", obj{"input": obj{"query": "x"}, "wait": true}, 200)
	if out["status"] != "completed" {
		t.Fatalf("memory_search after the refusals: %v", out)
	}
}

// TestWSRunnerRefreshMustStillServeItsTools: a runner socket's refreshed
// credential must still be trusted with every tool the runner serves; a
// narrower tools claim is refused with 403 TOOL_NOT_ALLOWED and the socket
// keeps the credential it has.
func TestWSRunnerRefreshMustStillServeItsTools(t *testing.T) {
	s := start(t, node.Options{Auth: jwtOptions()})
	claims := auth.Claims{Subject: "r-crm", Role: auth.RoleRunner, Runners: []string{"r-crm"}, Tools: []string{"crm.*"}}
	a := newAPIAs(t, s, claims)
	r := a.dialWS(runnerPath("ws", "r-crm", "c1", []string{"crm.search", "crm.lookup"}), gateway.SubprotocolJSON)
	r.expect("hello")
	for _, c := range []struct {
		name  string
		tools []string
		code  string
	}{
		{"a claim matching another tool only", []string{"mail.*"}, "TOOL_NOT_ALLOWED"},
		{"a claim matching one of its two tools", []string{"crm.search"}, "TOOL_NOT_ALLOWED"},
		{"no tools claim", nil, "TOOL_NOT_ALLOWED"},
		{"a claim matching both", []string{"crm.search", "crm.lookup", "mail.*"}, ""},
	} {
		narrowed := claims
		narrowed.Tools = c.tools
		f := r.refresh(mint(t, narrowed))
		body, _ := f.obj["body"].(obj)
		if c.code == "" {
			if f.obj["status"] != 200.0 {
				t.Fatalf("%s: reply %v, want 200", c.name, f.obj)
			}
			continue
		}
		if f.obj["status"] != 403.0 || body["code"] != c.code {
			t.Fatalf("%s: reply %v, want 403 %s", c.name, f.obj, c.code)
		}
	}
}
