package runtimeapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
	"github.com/gatehouse-dev/gatehouse/stream/ssetest"
)

type obj = map[string]any

// rt talks to one server's Runtime API.
type rt struct {
	t    *testing.T
	base string
}

func (c *rt) do(method, path string, body any, hdr ...string) (int, []byte) {
	c.t.Helper()
	if body != nil {
		hdr = append([]string{"Content-Type", "application/json"}, hdr...)
	}
	status, data, _ := nodetest.Do(c.t, nil, method, c.base+"/runtime/v1"+path, body, hdr...)
	return status, data
}

func (c *rt) json(method, path string, body any, want int, hdr ...string) obj {
	c.t.Helper()
	status, data := c.do(method, path, body, hdr...)
	return nodetest.Object(c.t, method, path, status, data, want)
}

// fail checks an error answer: status, details.code, and a message.
func (c *rt) fail(method, path string, body any, want int, code string) obj {
	c.t.Helper()
	out := c.json(method, path, body, want)
	details, _ := out["details"].(obj)
	if details["code"] != code || out["error"] == "" {
		c.t.Fatalf("%s %s: %v, want code %s", method, path, out, code)
	}
	return details
}

// events reads an execution's event stream until the server ends it.
func (c *rt) events(id, lastEventID string) []ssetest.Frame {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.t.Context(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", c.base+"/runtime/v1/executions/"+id+"/events", nil)
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		body, _ := io.ReadAll(resp.Body)
		c.t.Fatalf("events: %d %s", resp.StatusCode, body)
	}
	out, err := ssetest.NewReader(resp.Body).Frames(-1)
	if ctx.Err() != nil {
		c.t.Fatalf("the stream did not end: %v", out)
	}
	if !errors.Is(err, io.EOF) {
		c.t.Fatalf("events: %v after %v", err, out)
	}
	return out
}

func names(evs []ssetest.Frame) string {
	var n []string
	for _, e := range evs {
		n = append(n, e.Event)
	}
	return strings.Join(n, " ")
}

const peopleSchema = `{"type":"object","properties":{"query":{"type":"string","minLength":1},"limit":{"type":"integer","maximum":50}},"required":["query"]}`

// world starts a gateway and a runner behind it serving
// linkedin_search_people on two connected accounts, as the seeds' example
// does, and gatehouse.echo on none.
func world(t *testing.T, c node.Options) (*nodetest.Server, *rt, context.CancelFunc) {
	t.Helper()
	s := nodetest.Start(t, c)
	api := &rt{t: t, base: s.URL}
	cl, err := client.New(client.Options{BaseURL: s.URL})
	if err != nil {
		t.Fatal(err)
	}
	on := func(account string) client.ToolFunc {
		return func(_ context.Context, args json.RawMessage) (any, error) {
			return obj{"account": account, "people": []string{"Ada"}, "args": json.RawMessage(args)}, nil
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cl.RunRunner(ctx, &client.Runner{RunnerID: "li-runner", Tools: map[string]client.ToolFunc{
			"linkedin_search_people":       on(""),
			"linkedin_search_people@acc_1": on("acc_1"),
			"linkedin_search_people@acc_2": on("acc_2"),
			"gatehouse.echo": func(_ context.Context, args json.RawMessage) (any, error) {
				return args, nil
			},
		}, Info: []client.ToolInfo{{
			Name: "linkedin_search_people", Description: "Search people on LinkedIn.", Parameters: json.RawMessage(peopleSchema),
			IsReadOnly: true, SupportsIdempotency: true,
			Accounts: []client.Account{{ConnectedAccountID: "acc_1", IntegrationID: "linkedin", Backend: "unipile"}, {ConnectedAccountID: "acc_2", IntegrationID: "linkedin", Backend: "unipile"}},
		}}})
	}()
	stop := func() { cancel(); <-done; cl.CloseIdleConnections() }
	t.Cleanup(stop)
	// Wait for the runner and its descriptions.
	eventually.Check(t, func() error {
		caps := api.json("GET", "/capabilities", nil, 200)["capabilities"].([]any)
		for _, x := range caps {
			if c := x.(obj); c["name"] == "linkedin_search_people" && c["description"] != "" && len(c["accounts"].([]any)) == 2 {
				return nil
			}
		}
		return fmt.Errorf("the runner's capabilities never showed: %v", caps)
	})
	return s, api, stop
}

// integrations returns the integration capabilities of a listing.
func integrations(list obj) []obj {
	var out []obj
	for _, x := range list["capabilities"].([]any) {
		if c := x.(obj); c["kind"] == "integration" {
			out = append(out, c)
		}
	}
	return out
}

func TestCapabilitiesComeAndGoWithTheirRunner(t *testing.T) {
	_, api, stop := world(t, node.Options{})
	caps := api.json("GET", "/capabilities", nil, 200)["capabilities"].([]any)
	var li, echo obj
	for _, x := range caps {
		switch c := x.(obj); c["name"] {
		case "linkedin_search_people":
			li = c
		case "gatehouse.echo":
			echo = c
		}
	}
	if li["kind"] != "integration" || li["isReadOnly"] != true || li["supportsIdempotency"] != true ||
		li["parameters"].(obj)["required"].([]any)[0] != "query" {
		t.Fatalf("described capability: %v", li)
	}
	accounts := li["accounts"].([]any)
	if a := accounts[0].(obj); a["connectedAccountId"] != "acc_1" || a["integrationId"] != "linkedin" || a["backend"] != "unipile" {
		t.Fatalf("accounts: %v", accounts)
	}
	// A tool the runner did not describe takes any object.
	if echo["kind"] != "integration" || echo["parameters"].(obj)["type"] != "object" || echo["accounts"] != nil {
		t.Fatalf("undescribed capability: %v", echo)
	}
	if n := len(integrations(api.json("GET", "/capabilities", nil, 200))); n != 2 {
		t.Fatalf("%d integration capabilities, want 2", n)
	}
	stop()
	eventually.True(t, "the capabilities of a runner that went away withdrawn", func() bool {
		return len(integrations(api.json("GET", "/capabilities", nil, 200))) == 0
	})
	api.fail("POST", "/tools/linkedin_search_people", obj{"input": obj{"query": "x"}}, 404, "NOT_FOUND")
}

func TestInvocationAccountsAndInput(t *testing.T) {
	_, api, _ := world(t, node.Options{})
	in := obj{"query": "founders in Lyon"}
	details := api.fail("POST", "/tools/linkedin_search_people", obj{"input": in}, 409, "ACCOUNT_REQUIRED")
	if accs := details["accounts"].([]any); len(accs) != 2 || accs[1].(obj)["connectedAccountId"] != "acc_2" {
		t.Fatalf("409 lists: %v", details)
	}
	api.fail("POST", "/tools/linkedin_search_people", obj{"input": in, "connectedAccountId": "acc_9"}, 400, "UNKNOWN_ACCOUNT")
	bad := api.fail("POST", "/tools/linkedin_search_people", obj{"input": obj{"query": "", "limit": 99}, "connectedAccountId": "acc_1"}, 400, "INVALID_INPUT")
	if errs := bad["errors"].([]any); len(errs) != 2 {
		t.Fatalf("want both schema errors listed: %v", bad)
	}
	api.fail("POST", "/tools/linkedin_search_people", `{"input":`, 400, "VALIDATION_ERROR")
	api.fail("POST", "/tools/no_such_tool", obj{"input": obj{}}, 404, "NOT_FOUND")

	// The retry with the account runs on that account's runner tool.
	got := api.json("POST", "/tools/linkedin_search_people", obj{"input": in, "connectedAccountId": "acc_2", "wait": true}, 200)
	if got["status"] != "completed" || got["output"].(obj)["account"] != "acc_2" || got["runId"] == "" || got["summary"] == "" {
		t.Fatalf("waited invocation: %v", got)
	}
	// A session was made for it, and lists it.
	sess := api.json("GET", "/sessions/"+got["sessionId"].(string), nil, 200)
	if sess["title"] != "Agent Runtime Session" || sess["source"] != "api" || sess["interactionMode"] != "execute" || sess["status"] != "active" {
		t.Fatalf("session: %v", sess)
	}
	if ex := sess["executions"].([]any); len(ex) != 1 || ex[0].(obj)["executionId"] != got["executionId"] || ex[0].(obj)["tool"] != "linkedin_search_people" {
		t.Fatalf("session executions: %v", ex)
	}
	x := api.json("GET", "/executions/"+got["executionId"].(string), nil, 200)
	if x["status"] != "completed" || x["connectedAccountId"] != "acc_2" || x["input"].(obj)["query"] != "founders in Lyon" || x["completedAt"] == nil {
		t.Fatalf("execution: %v", x)
	}
	api.fail("GET", "/executions/nope", nil, 404, "NOT_FOUND")
}

func TestSessionsAndArchive(t *testing.T) {
	_, api, _ := world(t, node.Options{})
	s := api.json("POST", "/sessions", obj{"title": "prospecting", "id": "rt-s1"}, 201)
	if s["id"] != "rt-s1" || s["title"] != "prospecting" || s["createdAt"] == nil {
		t.Fatalf("created: %v", s)
	}
	api.fail("POST", "/sessions", obj{"id": "rt-s1"}, 409, "CONFLICT")
	first := api.json("POST", "/sessions/rt-s1/tools/gatehouse.echo", obj{"input": obj{"n": 1}}, 202)
	if first["sessionId"] != "rt-s1" || first["status"] != "executing" {
		t.Fatalf("invocation in a session: %v", first)
	}
	if caps := integrations(api.json("GET", "/sessions/rt-s1/capabilities", nil, 200)); len(caps) != 2 {
		t.Fatalf("session capabilities: %v", caps)
	}
	if list := api.json("GET", "/sessions", nil, 200)["sessions"].([]any); len(list) == 0 {
		t.Fatal("sessions not listed")
	}
	if a := api.json("POST", "/sessions/rt-s1/archive", nil, 200); a["status"] != "archived" {
		t.Fatalf("archive: %v", a)
	}
	api.fail("POST", "/sessions/rt-s1/tools/gatehouse.echo", obj{"input": obj{}}, 409, "SESSION_ARCHIVED")
	api.fail("POST", "/tools/gatehouse.echo", obj{"input": obj{}, "sessionId": "rt-s1"}, 409, "SESSION_ARCHIVED")
	api.fail("GET", "/sessions/nope", nil, 404, "NOT_FOUND")
}

func TestIdempotentInvocation(t *testing.T) {
	_, api, _ := world(t, node.Options{})
	a := api.json("POST", "/tools/gatehouse.echo", obj{"input": obj{"v": 1}}, 202, "Idempotency-Key", "inv-1")
	// The retry answers 202 or, when the first has finished, 200.
	status, data := api.do("POST", "/tools/gatehouse.echo", obj{"input": obj{"v": 1}}, "Idempotency-Key", "inv-1")
	var b obj
	_ = json.Unmarshal(data, &b)
	if (status != 202 && status != 200) || a["executionId"] != b["executionId"] || a["sessionId"] != b["sessionId"] {
		t.Fatalf("a retry made a second execution: %v, then %d %v", a, status, b)
	}
	// The same key with another request is a conflict.
	if c := api.json("POST", "/tools/gatehouse.echo", obj{"input": obj{"v": 2}}, 409, "Idempotency-Key", "inv-1"); c["details"].(obj)["code"] != "CONFLICT" {
		t.Fatalf("reused key: %v", c)
	}
}

// TestEventStreamReplaysAndResumes: the stream has the seeds' order, is
// the same whenever it is opened (during the run, after it, after a
// restart), and resumes after any event with no gap and no duplicate.
func TestEventStreamReplaysAndResumes(t *testing.T) {
	s, api, _ := world(t, node.Options{})
	got := api.json("POST", "/tools/linkedin_search_people", obj{"input": obj{"query": "cto"}, "connectedAccountId": "acc_1"}, 202)
	id := got["executionId"].(string)
	live := api.events(id, "")
	if n := names(live); n != "session run_status tool_use tool_result run_status done" {
		t.Fatalf("events: %s", n)
	}
	var sess, use, done obj
	_ = json.Unmarshal([]byte(live[0].Data), &sess)
	_ = json.Unmarshal([]byte(live[2].Data), &use)
	_ = json.Unmarshal([]byte(live[5].Data), &done)
	if sess["id"] != got["sessionId"] || sess["executionId"] != id || sess["runId"] != got["runId"] || sess["interactionMode"] != "execute" {
		t.Fatalf("session event: %v", sess)
	}
	if use["name"] != "linkedin_search_people" || use["input"].(obj)["query"] != "cto" || use["runId"] != got["runId"] {
		t.Fatalf("tool_use: %v", use)
	}
	if done["status"] != "completed" || done["executionId"] != id {
		t.Fatalf("done: %v", done)
	}
	for i, e := range live {
		if e.ID == "" || (i > 0 && e.ID == live[i-1].ID) {
			t.Fatalf("event %d id %q", i, e.ID)
		}
	}
	for cut := range live {
		rest := api.events(id, live[cut].ID)
		if len(rest) != len(live)-cut-1 || (len(rest) > 0 && rest[0] != live[cut+1]) {
			t.Fatalf("resumed after %s: %v", live[cut].ID, rest)
		}
	}
	s.Restart()
	api = &rt{t: t, base: s.URL}
	if again := api.events(id, ""); len(again) != len(live) || again[3] != live[3] {
		t.Fatalf("replay after restart: %v", again)
	}
	if status, _ := api.do("GET", "/executions/"+id+"/events", nil, "Last-Event-ID", "x.y"); status != 400 {
		t.Fatalf("a malformed Last-Event-ID: %d", status)
	}
}

const askPolicy = `rules:
  - id: ask
    priority: 1
    when: {tool_id: "linkedin_*"}
    then: {decision: require_approval}
default: {decision: allow}
`

// TestPermissionPromptWaits: a capability that policy makes ask a person
// shows run_status waiting until the prompt is answered, then runs.
func TestPermissionPromptWaits(t *testing.T) {
	pol := policytest.Parse(t, askPolicy)
	s, api, _ := world(t, node.Options{Policy: pol})
	got := api.json("POST", "/tools/linkedin_search_people", obj{"input": obj{"query": "cto"}, "connectedAccountId": "acc_1"}, 202)
	id := got["executionId"].(string)
	eventually.True(t, "the invocation waiting for its prompt", func() bool {
		return api.json("GET", "/executions/"+id, nil, 200)["status"] == "waiting"
	})
	req, _ := http.NewRequestWithContext(t.Context(), "GET", s.URL+"/v0/actions?status=pending", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var page struct{ Actions []obj }
	_ = json.NewDecoder(resp.Body).Decode(&page)
	resp.Body.Close()
	if len(page.Actions) != 1 {
		t.Fatalf("pending prompts: %v", page.Actions)
	}
	body, _ := json.Marshal(obj{"decision": "allow_once"})
	req, _ = http.NewRequestWithContext(t.Context(), "POST", s.URL+"/v0/actions/"+page.Actions[0]["action_id"].(string)+"/respond", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if resp, err = http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("respond: %v %v", err, resp)
	}
	resp.Body.Close()
	if n := names(api.events(id, "")); n != "session run_status tool_use run_status run_status tool_result run_status done" {
		t.Fatalf("events: %s", n)
	}
}

// TestMemoryFlow is the seeds' memory example: a search that finds
// nothing, a note saved, the same search finding it; each invocation's
// stream tells the story. Memory is per tenant and checks its paths.
func TestMemoryFlow(t *testing.T) {
	_, api, _ := world(t, node.Options{})
	caps := api.json("GET", "/capabilities", nil, 200)["capabilities"].([]any)
	mem := map[string]bool{}
	for _, x := range caps {
		if c := x.(obj); c["kind"] == "memory" {
			mem[c["name"].(string)] = true
		}
	}
	for _, name := range []string{"memory_search", "memory_read", "save_memory_note", "memory_ls", "memory_write", "memory_append"} {
		if !mem[name] {
			t.Fatalf("memory capability %s missing: %v", name, mem)
		}
	}
	search := func() obj {
		t.Helper()
		return api.json("POST", "/tools/memory_search", obj{"input": obj{"query": "ideal customer"}, "wait": true}, 200)
	}
	if got := search(); got["summary"] != "0 hits" {
		t.Fatalf("empty search: %v", got)
	}
	saved := api.json("POST", "/tools/save_memory_note", obj{"input": obj{"path": "/topics/icp.md", "content": "Ideal customer: B2B SaaS, 50-500 staff."}, "wait": true}, 200)
	if saved["output"].(obj)["path"] != "/topics/icp.md" || saved["output"].(obj)["version"] != 1.0 {
		t.Fatalf("save: %v", saved)
	}
	found := search()
	hits := found["output"].(obj)["hits"].([]any)
	if found["summary"] != "1 hits" || len(hits) != 1 || hits[0].(obj)["path"] != "/topics/icp.md" || hits[0].(obj)["snippet"] == "" {
		t.Fatalf("search after save: %v", found)
	}
	evs := api.events(found["executionId"].(string), "")
	if n := names(evs); n != "session run_status tool_use tool_result run_status done" {
		t.Fatalf("events: %s", n)
	}
	var done obj
	_ = json.Unmarshal([]byte(evs[5].Data), &done)
	if done["summary"] != "1 hits" {
		t.Fatalf("done: %v", done)
	}
	// Paths are confined before anything runs.
	bad := api.fail("POST", "/tools/memory_read", obj{"input": obj{"path": "/topics/../../etc/passwd"}}, 400, "INVALID_INPUT")
	_ = bad
	api.fail("POST", "/tools/memory_write", obj{"input": obj{"path": "/x\ny", "content": "c"}}, 400, "INVALID_INPUT")
	api.fail("POST", "/tools/memory_write", obj{"input": obj{"path": "/big.md", "content": strings.Repeat("x", 300<<10)}}, 413, "PAYLOAD_TOO_LARGE")
	// A version conflict fails the invocation with its reason.
	conflict := api.json("POST", "/tools/memory_write", obj{"input": obj{"path": "/topics/icp.md", "content": "x", "ifVersion": 7}, "wait": true}, 200)
	if conflict["status"] != "failed" || !strings.Contains(conflict["error"].(string), "version conflict") {
		t.Fatalf("conflict: %v", conflict)
	}
}

// TestAgentsShareTheNotes: a /v0 agent reads the notes saved through the
// Runtime API by invoking a memory tool remotely, as it would any tool.
func TestAgentsShareTheNotes(t *testing.T) {
	_, api, _ := world(t, node.Options{})
	api.json("POST", "/tools/memory_write", obj{"input": obj{"path": "/tone.md", "content": "Be brief."}, "wait": true}, 200)
	cl, err := client.New(client.Options{BaseURL: api.base})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.CloseIdleConnections()
	got := make(chan string, 1)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cl.RunAgent(ctx, &client.Agent{AgentID: "noter", Handle: func(ctx context.Context, task *client.Task) (any, error) {
			out, err := task.Invoke(ctx, "memory_read", obj{"path": "/tone.md"}, true)
			if err != nil {
				return nil, err
			}
			var note struct{ Content string }
			_ = json.Unmarshal(out, &note)
			got <- note.Content
			return note.Content, nil
		}})
	}()
	defer func() { cancel(); <-done }()
	if _, err := cl.CreateExecution(t.Context(), client.CreateRequest{AgentID: "noter"}); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-got:
		if c != "Be brief." {
			t.Fatalf("the agent read %q", c)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the agent never read the note")
	}
}

// TestToolSchemaCannotReadFiles: a runner describes two tools whose
// parameters reference a file of the gateway's machine, one that exists
// (and would refuse the input) and one that does not. Invoked alike, they
// answer alike: the reference is refused without reading anything, so the
// file neither judges the input nor tells that it exists.
func TestToolSchemaCannotReadFiles(t *testing.T) {
	s := nodetest.Start(t, node.Options{})
	api := &rt{t: t, base: s.URL}
	existing := filepath.Join(t.TempDir(), "secret.json")
	if err := os.WriteFile(existing, []byte(`{"type":"object","required":["secret"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := existing + ".gone"
	cl, err := client.New(client.Options{BaseURL: s.URL})
	if err != nil {
		t.Fatal(err)
	}
	echo := func(_ context.Context, args json.RawMessage) (any, error) { return args, nil }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cl.RunRunner(ctx, &client.Runner{RunnerID: "probe-runner", Tools: map[string]client.ToolFunc{"probe.here": echo, "probe.gone": echo},
			Info: []client.ToolInfo{
				{Name: "probe.here", Parameters: json.RawMessage(`{"$ref":"file://` + existing + `"}`)},
				{Name: "probe.gone", Parameters: json.RawMessage(`{"$ref":"file://` + missing + `"}`)},
			}})
	}()
	t.Cleanup(func() { cancel(); <-done; cl.CloseIdleConnections() })
	eventually.Check(t, func() error {
		n := 0
		for _, c := range integrations(api.json("GET", "/capabilities", nil, 200)) {
			if p, _ := c["parameters"].(obj); p["$ref"] != nil {
				n++
			}
		}
		if n != 2 {
			return fmt.Errorf("%d of the 2 described probes listed", n)
		}
		return nil
	})
	answer := func(tool string) string {
		status, data := api.do("POST", "/tools/"+tool, obj{"input": obj{}, "wait": true})
		var out obj
		if err := json.Unmarshal(data, &out); err != nil {
			t.Fatalf("%s: %d %s", tool, status, data)
		}
		return fmt.Sprintf("%d %v %v", status, out["status"], out["output"])
	}
	here, gone := answer("probe.here"), answer("probe.gone")
	if here != gone || here != "200 completed map[]" {
		t.Fatalf("a schema naming a file that exists answers %q, one naming a missing file %q; want both 200 completed with the input", here, gone)
	}
}
