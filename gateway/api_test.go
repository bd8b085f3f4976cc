package gateway_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/node"
)

func TestHealthReadyMetricsAndRouting(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	if got := a.json("GET", "/v0/health", nil, 200); got["status"] != "ok" {
		t.Fatalf("health: %v", got)
	}
	if got := a.json("GET", "/v0/ready", nil, 200); got["status"] != "ready" {
		t.Fatalf("ready: %v", got)
	}
	status, body, hdr := a.do("GET", "/metrics", nil)
	if status != 200 || !strings.Contains(string(body), "gatehouse_executions_live") || !strings.Contains(string(body), "gatehouse_store_commits_total") || !strings.Contains(string(body), "gatehouse_store_level0_stall_tables") || !strings.Contains(string(body), "\ngatehouse_store_sync_duration_seconds_bucket{le=\"0.000512\"} ") || !strings.Contains(string(body), "\ngatehouse_store_sync_duration_seconds_count ") || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") {
		t.Fatalf("metrics: %d %s %q", status, hdr.Get("Content-Type"), body[:min(200, len(body))])
	}
	a.fail("GET", "/v0/nowhere", nil, 404, "NOT_FOUND")
	_, _, hdr = a.do("DELETE", "/v0/executions", nil)
	if a.fail("DELETE", "/v0/executions", nil, 405, "METHOD_NOT_ALLOWED"); hdr.Get("Allow") != "GET, POST" {
		t.Fatalf("wrong method: Allow=%q", hdr.Get("Allow"))
	}
	_, _, hdr = a.do("GET", "/v0/health", nil, "X-Request-ID", "req-42")
	if hdr.Get("X-Request-ID") != "req-42" {
		t.Fatalf("X-Request-ID not echoed: %q", hdr.Get("X-Request-ID"))
	}
	_, _, hdr = a.do("GET", "/v0/health", nil)
	if hdr.Get("X-Request-ID") == "" {
		t.Fatal("no X-Request-ID made")
	}
}

func TestReadyFailsWhenStoreIsClosed(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	if err := s.Node.Store.Close(); err != nil {
		t.Fatal(err)
	}
	out := a.fail("GET", "/v0/ready", nil, 503, "SERVICE_UNAVAILABLE")
	if out["error"] != "service unavailable: database not reachable" {
		t.Fatalf("ready: %v", out)
	}
	a.fail("POST", "/v0/executions", obj{"agent_id": "a"}, 503, "SERVICE_UNAVAILABLE")
}

func TestBearerToken(t *testing.T) {
	s := start(t, node.Options{Auth: auth.Options{StaticToken: "s3cret"}})
	a := newAPI(t, s)
	a.json("GET", "/v0/health", nil, 200)
	a.json("GET", "/v0/ready", nil, 200)
	for _, h := range []string{"", "Bearer wrong", "bearer s3cret", "Bearer  s3cret", "Basic s3cret"} {
		var hdr []string
		if h != "" {
			hdr = []string{"Authorization", h}
		}
		status, body, _ := a.do("GET", "/v0/executions", nil, hdr...)
		if status != 401 || !strings.Contains(string(body), `"code":"UNAUTHORIZED"`) {
			t.Errorf("Authorization %q: %d %s", h, status, body)
		}
	}
	status, _, _ := a.do("GET", "/metrics", nil)
	if status != 401 {
		t.Errorf("metrics without token: %d", status)
	}
	if _, status, _ := a.trySSE("/v0/agents/stream?agent_id=a&consumer_id=c"); status != 401 {
		t.Errorf("agent stream without token: %d", status)
	}
	a.token = "s3cret"
	a.json("GET", "/v0/executions", nil, 200)
}

func TestCreateGetAndValidation(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	ex := a.json("POST", "/v0/executions", obj{"agent_id": "researcher"}, 201)
	if ex["status"] != "pending" || ex["labels"] != nil || ex["input"] != nil {
		t.Fatalf("create without labels/input: %v", ex)
	}
	if _, ok := ex["output"]; ok {
		t.Fatalf("output present before completion: %v", ex)
	}
	for _, k := range []string{"id", "created_at", "updated_at"} {
		if ex[k] == "" || ex[k] == nil {
			t.Fatalf("create: missing %s: %v", k, ex)
		}
	}
	got := a.json("GET", "/v0/executions/"+ex["id"].(string), nil, 200)
	if got["id"] != ex["id"] || got["status"] != "pending" || got["agent_id"] != "researcher" {
		t.Fatalf("get: %v", got)
	}
	full := a.json("POST", "/v0/executions", obj{"agent_id": "r", "input": obj{"task": "<x>&"}, "labels": obj{"env": "dev"}}, 201)
	if full["input"].(obj)["task"] != "<x>&" || full["labels"].(obj)["env"] != "dev" {
		t.Fatalf("input/labels not echoed: %v", full)
	}
	status, raw, _ := a.do("GET", "/v0/executions/"+full["id"].(string), nil)
	if status != 200 || !strings.Contains(string(raw), `\u003cx\u003e\u0026`) || !strings.HasSuffix(string(raw), "}\n") {
		t.Fatalf("JSON format: %s", raw)
	}

	a.fail("GET", "/v0/executions/nope", nil, 404, "NOT_FOUND")
	a.fail("POST", "/v0/executions/nope/cancel", nil, 404, "NOT_FOUND")
	a.fail("POST", "/v0/executions/nope/signal", obj{"signal_type": "x"}, 404, "NOT_FOUND")
	a.fail("GET", "/v0/executions/nope/events", nil, 404, "NOT_FOUND")
	a.fail("GET", "/v0/executions/nope/stream", nil, 404, "NOT_FOUND")

	for name, body := range map[string]any{
		"empty":          "",
		"not json":       "{",
		"missing agent":  obj{"input": 1},
		"numeric label":  `{"agent_id":"a","labels":{"n":1}}`,
		"agent too long": obj{"agent_id": strings.Repeat("a", 257)},
	} {
		t.Run(name, func(t *testing.T) {
			a := newAPI(t, s)
			out := a.fail("POST", "/v0/executions", body, 400, "VALIDATION_ERROR")
			if !strings.HasPrefix(out["error"].(string), "validation error: ") {
				t.Fatalf("message: %v", out["error"])
			}
		})
	}
	// Over the body limit: 413.
	a.fail("POST", "/v0/executions", `{"agent_id":"a","input":"`+strings.Repeat("x", 1<<20)+`"}`, 413, "PAYLOAD_TOO_LARGE")
	// Unknown fields are ignored, and only the first JSON value counts.
	a.json("POST", "/v0/executions", `{"agent_id":"a","whatever":1} {"ignored":true}`, 201)
}

func TestListFiltersAndPagination(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	var ids []string
	for i := range 7 {
		env := "dev"
		if i%2 == 1 {
			env = "prod"
		}
		ex := a.json("POST", "/v0/executions", obj{"agent_id": fmt.Sprintf("ag%d", i%3), "labels": obj{"env": env, "team": "t"}}, 201)
		ids = append(ids, ex["id"].(string))
	}
	a.json("POST", "/v0/executions/"+ids[0]+"/cancel", nil, 200)

	list := func(q string) ([]string, string) {
		page := a.json("GET", "/v0/executions"+q, nil, 200)
		var got []string
		for _, e := range page["executions"].([]any) {
			m := e.(obj)
			if _, ok := m["input"]; ok {
				t.Fatalf("summary carries input: %v", m)
			}
			got = append(got, m["id"].(string))
		}
		return got, page["next_cursor"].(string)
	}
	all, cur := list("")
	if len(all) != 7 || cur != "" || all[0] != ids[6] || all[6] != ids[0] {
		t.Fatalf("list newest first: %v (cursor %q)", all, cur)
	}
	var paged []string
	cursor := ""
	for pages := 0; ; pages++ {
		got, next := list("?limit=3&cursor=" + cursor)
		paged = append(paged, got...)
		if next == "" {
			break
		}
		if pages > 5 {
			t.Fatal("pagination does not end")
		}
		cursor = next
	}
	if strings.Join(paged, ",") != strings.Join(all, ",") {
		t.Fatalf("pages %v, want %v (no repeat, no gap)", paged, all)
	}
	if got, _ := list("?status=cancelled"); len(got) != 1 || got[0] != ids[0] {
		t.Fatalf("status filter: %v", got)
	}
	if got, _ := list("?agent_id=ag1"); len(got) != 2 {
		t.Fatalf("agent filter: %v", got)
	}
	if got, _ := list("?label=env:prod&label=team:t"); len(got) != 3 {
		t.Fatalf("label filter: %v", got)
	}
	if got, _ := list("?label=env:prod&agent_id=ag1"); len(got) != 1 {
		t.Fatalf("label+agent filter: %v", got)
	}
	if got, _ := list("?limit=0"); len(got) != 7 {
		t.Fatalf("limit 0 means the default: %v", got)
	}
	if got, _ := list("?limit=100000"); len(got) != 7 {
		t.Fatalf("limit clamp: %v", got)
	}
	empty := a.json("GET", "/v0/executions?agent_id=none", nil, 200)
	if arr, ok := empty["executions"].([]any); !ok || len(arr) != 0 {
		t.Fatalf("empty list must be [] not null: %v", empty)
	}
	a.fail("GET", "/v0/executions?status=done", nil, 400, "VALIDATION_ERROR")
	a.fail("GET", "/v0/executions?label=novalue", nil, 400, "VALIDATION_ERROR")
	a.fail("GET", "/v0/executions?label=:v", nil, 400, "VALIDATION_ERROR")
	a.fail("GET", "/v0/executions?cursor=%%%", nil, 400, "VALIDATION_ERROR")
	a.fail("GET", "/v0/executions?cursor="+base64.StdEncoding.EncodeToString([]byte("garbage")), nil, 400, "VALIDATION_ERROR")
}

func TestCORS(t *testing.T) {
	s := start(t, node.Options{Server: gateway.Options{CORSOrigins: []string{"https://app.example"}}})
	a := newAPI(t, s)
	status, _, hdr := a.do("OPTIONS", "/v0/executions", nil, "Origin", "https://app.example", "Access-Control-Request-Method", "POST")
	if status != 204 || hdr.Get("Access-Control-Allow-Origin") != "https://app.example" || !strings.Contains(hdr.Get("Access-Control-Allow-Headers"), "Authorization") {
		t.Fatalf("preflight: %d %v", status, hdr)
	}
	_, _, hdr = a.do("GET", "/v0/health", nil, "Origin", "https://evil.example")
	if hdr.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("a foreign origin was allowed: %v", hdr)
	}
	plain := start(t, node.Options{})
	_, _, hdr = newAPI(t, plain).do("GET", "/v0/health", nil, "Origin", "https://app.example")
	if hdr.Get("Access-Control-Allow-Origin") != "" {
		t.Fatal("CORS headers without configured origins")
	}
}

func TestTraceparentIsKept(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	status, body, _ := a.do("POST", "/v0/executions", obj{"agent_id": "traced"}, "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if status != 201 {
		t.Fatalf("create: %d %s", status, body)
	}
	var ex obj
	if err := json.Unmarshal(body, &ex); err != nil {
		t.Fatal(err)
	}
	if evs := a.events(ex["id"].(string)); evs[0]["trace_id"] != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("trace id: %v", evs[0])
	}
}
