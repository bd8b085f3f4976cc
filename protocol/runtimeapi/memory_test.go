package runtimeapi_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/memory"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
	"github.com/gatehouse-dev/gatehouse/store"
)

const (
	testSecret   = "runtime-api-test-secret-of-32-bytes!"
	testIssuer   = "gatehouse-test"
	testAudience = "gatehouse"
)

// withTokens starts a gateway that takes JWTs and returns a token for
// each of principals (name → tenant), all clients.
func withTokens(t *testing.T, o node.Options, principals map[string]string) (*rt, map[string]string) {
	t.Helper()
	o.Auth = auth.Options{HMACSecrets: map[string][]byte{"": []byte(testSecret)}, Issuer: testIssuer, Audience: testAudience}
	s := nodetest.Start(t, o)
	tokens := map[string]string{}
	for name, tenant := range principals {
		tok, err := auth.MintHS256([]byte(testSecret), auth.Claims{Subject: name, Role: auth.RoleClient, Tenant: tenant,
			TTL: time.Hour, Issuer: testIssuer, Audience: testAudience}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		tokens[name] = "Bearer " + tok
	}
	return &rt{t: t, base: s.URL}, tokens
}

// TestNotesAreTheirPrincipals: through the Runtime API, a principal's
// notes are, to another principal of the same tenant, notes that do not
// exist: the read fails word for word as for an unknown path, a search
// and a listing find nothing. The tenant's shared space is reached by
// naming it, and only from that tenant.
func TestNotesAreTheirPrincipals(t *testing.T) {
	api, tok := withTokens(t, node.Options{}, map[string]string{"alice": "acme", "bob": "acme", "carol": "globex"})
	invoke := func(who, tool string, input obj) obj {
		t.Helper()
		return api.json("POST", "/tools/"+tool, obj{"input": input, "wait": true}, 200, "Authorization", tok[who])
	}
	if got := invoke("alice", "memory_write", obj{"path": "/plan.md", "content": "acquire globex"}); got["status"] != "completed" {
		t.Fatalf("alice's write: %v", got)
	}
	hidden := invoke("bob", "memory_read", obj{"path": "/plan.md"})
	missing := invoke("bob", "memory_read", obj{"path": "/nope.md"})
	if hidden["status"] != "failed" || strings.ReplaceAll(missing["error"].(string), "nope", "plan") != hidden["error"] {
		t.Fatalf("bob reading alice's note: %v; an unknown note: %v", hidden, missing)
	}
	if got := invoke("bob", "memory_search", obj{"query": "acquire globex"}); got["summary"] != "0 hits" {
		t.Fatalf("bob's search: %v", got)
	}
	if got := invoke("bob", "memory_ls", obj{}); got["summary"] != "0 entries" {
		t.Fatalf("bob's listing: %v", got)
	}
	if got := invoke("alice", "memory_read", obj{"path": "/plan.md"}); got["output"].(obj)["content"] != "acquire globex" {
		t.Fatalf("alice's read: %v", got)
	}
	invoke("alice", "memory_write", obj{"path": "/team.md", "content": "be brief", "space": "tenant"})
	if got := invoke("bob", "memory_read", obj{"path": "/team.md", "space": "tenant"}); got["status"] != "completed" || got["output"].(obj)["content"] != "be brief" {
		t.Fatalf("bob reading acme's shared note: %v", got)
	}
	if got := invoke("carol", "memory_read", obj{"path": "/team.md", "space": "tenant"}); got["status"] != "failed" {
		t.Fatalf("carol of globex reads acme's shared note: %v", got)
	}
}

// TestNoteQuotaIsRefusedBeforeItRuns: a write past a quota is refused at
// the invocation, 507 QUOTA_EXCEEDED saying which quota, without the
// Retry-After of a full disk; a write that adds nothing still passes.
func TestNoteQuotaIsRefusedBeforeItRuns(t *testing.T) {
	api := &rt{t: t, base: nodetest.Start(t, node.Options{Memory: memory.Options{MaxNotes: 1}}).URL}
	write := func(p string) (int, []byte) {
		return api.do("POST", "/tools/memory_write", obj{"input": obj{"path": p, "content": "x"}, "wait": true})
	}
	if status, body := write("/a.md"); status != 200 {
		t.Fatalf("first note: %d %s", status, body)
	}
	status, body, hdr := nodetest.Do(t, nil, "POST", api.base+"/runtime/v1/tools/memory_write",
		obj{"input": obj{"path": "/b.md", "content": "x"}}, "Content-Type", "application/json")
	var out struct {
		Error   string
		Details map[string]any
	}
	_ = json.Unmarshal(body, &out)
	if status != 507 || out.Details["code"] != "QUOTA_EXCEEDED" || out.Details["scope"] != "space" || out.Details["resource"] != "notes" || out.Details["max"] != 1.0 || hdr.Get("Retry-After") != "" {
		t.Fatalf("past the quota: %d %s %v", status, body, hdr)
	}
	if status, body := write("/a.md"); status != 200 {
		t.Fatalf("rewriting the note at the quota: %d %s", status, body)
	}
}

// TestMemoryInputIsChecked: at the invocation, save_memory_note with an
// empty path or title is refused instead of appending to the daily note,
// and a path with a format character is refused as ids refuse them.
func TestMemoryInputIsChecked(t *testing.T) {
	api := &rt{t: t, base: nodetest.Start(t, node.Options{}).URL}
	for _, c := range []struct {
		tool  string
		input obj
	}{
		{"save_memory_note", obj{"content": "x", "path": ""}},
		{"save_memory_note", obj{"content": "x", "title": ""}},
		{"memory_write", obj{"path": "/a\u202eb.md", "content": "x"}},
		{"memory_write", obj{"path": "/a\u200bb.md", "content": "x"}},
		{"memory_read", obj{"path": "/\ufeffa.md"}},
		{"memory_search", obj{"query": "x", "space": "everyone"}},
	} {
		api.fail("POST", "/tools/"+c.tool, obj{"input": c.input}, 400, "INVALID_INPUT")
	}
	if got := api.json("POST", "/tools/memory_ls", obj{"input": obj{}, "wait": true}, 200); got["summary"] != "0 entries" {
		t.Fatalf("a refused invocation wrote: %v", got)
	}
}

// TestAgentsKeepTheMemoryBounds: a /v0 agent's memory invocation, which
// no schema validates, meets the same bounds: a query over 1,024
// characters, an empty save path.
func TestAgentsKeepTheMemoryBounds(t *testing.T) {
	_, api, _ := world(t, node.Options{})
	cl, err := client.New(client.Options{BaseURL: api.base})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.CloseIdleConnections()
	errs := make(chan error, 2)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cl.RunAgent(ctx, &client.Agent{AgentID: "bounded", Handle: func(ctx context.Context, task *client.Task) (any, error) {
			_, err := task.Invoke(ctx, "memory_search", obj{"query": strings.Repeat("q", memory.MaxQuery+1)}, true)
			errs <- err
			_, err = task.Invoke(ctx, "save_memory_note", obj{"content": "x", "path": ""}, true)
			errs <- err
			return nil, nil
		}})
	}()
	defer func() { cancel(); <-done }()
	if _, err := cl.CreateExecution(t.Context(), client.CreateRequest{AgentID: "bounded"}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"query of 1025 characters, more than 1024", "path is empty"} {
		select {
		case err := <-errs:
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("got %v, want an error saying %q", err, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the agent's invocations never ended")
		}
	}
}

// TestEarlierNotesStayReadable: notes a release before spaces kept
// without a tenant are, on a gateway in open mode (one principal, who
// wrote them all), that principal's notes after the upgrade: read,
// searched and listed as before, without naming a space.
func TestEarlierNotesStayReadable(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(store.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	var b store.Batch
	at := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	if err := b.Put("memnote", "0:/topics/icp.md", &struct {
		Path      string    `msgpack:"p"`
		Content   string    `msgpack:"c"`
		Version   uint64    `msgpack:"v"`
		CreatedAt time.Time `msgpack:"ca"`
		UpdatedAt time.Time `msgpack:"ua"`
	}{"/topics/icp.md", "Ideal customer: B2B SaaS.", 4, at, at}); err != nil {
		t.Fatal(err)
	}
	if err := st.Write(t.Context(), &b); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	api := &rt{t: t, base: nodetest.Start(t, node.Options{Data: dir}).URL}
	got := api.json("POST", "/tools/memory_read", obj{"input": obj{"path": "/topics/icp.md"}, "wait": true}, 200)
	if out, _ := got["output"].(obj); out["content"] != "Ideal customer: B2B SaaS." || out["version"] != 4.0 {
		t.Fatalf("the earlier note: %v", got)
	}
	if got := api.json("POST", "/tools/memory_search", obj{"input": obj{"query": "customer"}, "wait": true}, 200); got["summary"] != "1 hits" {
		t.Fatalf("searching the earlier note: %v", got)
	}
}

// TestSummaries: an invocation's summary, in its answer and its done
// event, is "N hits" for a search, "N entries" for a listing, the note's
// path for a memory read or write, and "<tool> completed" for any other
// tool, whatever its output holds.
func TestSummaries(t *testing.T) {
	_, api, _ := world(t, node.Options{})
	for _, c := range []struct {
		tool  string
		input obj
		want  string
	}{
		{"memory_write", obj{"path": "/s.md", "content": "summaries"}, "/s.md"},
		{"memory_append", obj{"path": "/s.md", "content": "more"}, "/s.md"},
		{"save_memory_note", obj{"title": "Sum up", "content": "summaries"}, "/notes/sum-up.md"},
		{"memory_read", obj{"path": "/s.md"}, "/s.md"},
		{"memory_ls", obj{}, "2 entries"},
		{"memory_search", obj{"query": "summaries"}, "2 hits"},
		{"gatehouse.echo", obj{"path": "/x.md", "hits": []int{1}}, "gatehouse.echo completed"},
	} {
		got := api.json("POST", "/tools/"+c.tool, obj{"input": c.input, "wait": true}, 200)
		if got["summary"] != c.want {
			t.Fatalf("%s: %v, want summary %q", c.tool, got, c.want)
		}
		evs := api.events(got["executionId"].(string), "")
		var done obj
		_ = json.Unmarshal([]byte(evs[len(evs)-1].Data), &done)
		if done["summary"] != c.want {
			t.Fatalf("%s: done %v, want summary %q", c.tool, done, c.want)
		}
	}
}
