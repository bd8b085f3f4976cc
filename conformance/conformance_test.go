package conformance_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
	"github.com/gatehouse-dev/gatehouse/conformance"
	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel/policy"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/store"
)

// testPolicy denies shells (like the built-in default), sends one tool to
// human approval so the approval checks run, and allows everything else.
const testPolicy = `
rules:
  - {id: deny-shell, priority: 1, when: {tool_ids: ["shell", "bash"]}, then: {decision: deny, reason: "Shell commands denied"}}
  - {id: approve-deploy, priority: 2, when: {tool_id: "conformance.approve"}, then: {decision: require_approval, reason: "deploys need a human"}}
default: {decision: allow, reason: "allowed in tests"}
`

const (
	adminToken = "conformance-admin-token"
	issuer     = "gatehouse-conformance"
	audience   = "gatehouse"
)

const hmacSecret = "conformance-test-hmac-secret-0123456789"

// knownFailures lists checks that fail against Gatehouse today because the
// server is wrong, each with the reason; the lead fixes the server, then
// removes the entry. The test fails if one of them starts passing, so the
// list cannot go stale.
var knownFailures = map[string]string{}

// testGateway runs a real gateway on loopback with a Badger folder, as
// `gatehouse serve` does (node.Open), and can restart it on the same
// folder and port.
type testGateway struct {
	cfg node.Options

	mu   sync.Mutex
	node *node.Node
}

func startGateway(t *testing.T) *testGateway {
	t.Helper()
	pol, err := policy.Parse([]byte(testPolicy), "conformance.yaml")
	if err != nil {
		t.Fatal(err)
	}
	g := &testGateway{cfg: node.Options{
		Addr: "127.0.0.1:0", Data: t.TempDir(), Sync: store.SyncAlways, Policy: pol,
		Auth: auth.Options{
			StaticToken: adminToken,
			HMACSecrets: map[string][]byte{"": []byte(hmacSecret)},
			Issuer:      issuer, Audience: audience,
		},
		Server: gateway.Options{Heartbeat: 500 * time.Millisecond, WriteTimeout: 2 * time.Second},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := g.open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.stop(); err != nil {
			t.Errorf("stop gateway: %v", err)
		}
	})
	return g
}

func (g *testGateway) url() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return "http://" + g.cfg.Addr
}

// open starts the node. A restart reuses the port, which the old listener
// may take a moment to release.
func (g *testGateway) open(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		n, err := node.Open(ctx, g.cfg)
		if err == nil {
			g.node = n
			g.cfg.Addr = n.Addr().String()
			return nil
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("open gateway: %w", err)
		}
	}
}

func (g *testGateway) stop() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.node == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := g.node.Close(ctx)
	g.node = nil
	return err
}

// restart stops the gateway and opens it again on the same folder and port.
func (g *testGateway) restart(ctx context.Context) error {
	if err := g.stop(); err != nil {
		return err
	}
	return g.open(ctx)
}

func mint(t *testing.T, role auth.Role, agents, runners []string) string {
	t.Helper()
	return mintFor(t, "conformance-"+string(role), role, agents, runners)
}

func mintFor(t *testing.T, subject string, role auth.Role, agents, runners []string) string {
	t.Helper()
	tok, err := auth.MintHS256([]byte(hmacSecret), auth.Claims{
		Subject: subject, Role: role, Agents: agents, Runners: runners,
		TTL: time.Hour, Issuer: issuer, Audience: audience,
	}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// aapAgent runs an AAP agent against g for the whole test, as `gatehouse
// agent` would: it declares itself and answers every turn with text.
func aapAgent(t *testing.T, g *testGateway) string {
	t.Helper()
	const name = "conf-aap-agent"
	c, err := client.New(client.Options{BaseURL: g.url(), Token: adminToken})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeclareAgent(t.Context(), map[string]any{"name": name, "version": "1.0.0"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.RunAgent(ctx, &client.Agent{AgentID: name, Handle: func(ctx context.Context, task *client.Task) (any, error) {
			for _, d := range []string{"hello ", "back"} {
				if err := task.Say(ctx, "text_delta", d); err != nil {
					return nil, err
				}
			}
			return nil, task.Say(ctx, "text", "hello back")
		}})
	}()
	t.Cleanup(func() { cancel(); <-done; c.CloseIdleConnections() })
	return name
}

// options configures the suite for a test gateway, with every optional
// check enabled.
func options(t *testing.T, g *testGateway) conformance.Options {
	return conformance.Options{
		URL:              g.url(),
		Token:            adminToken,
		Restart:          g.restart,
		Timeout:          60 * time.Second, // the race detector slows the heaviest checks several times
		ApprovalTool:     "conformance.approve",
		RunnerToken:      mint(t, auth.RoleRunner, nil, []string{"conf-scoped-runner"}),
		RunnerTokenID:    "conf-scoped-runner",
		AgentToken:       mint(t, auth.RoleAgent, []string{"conf-scoped-agent"}, nil),
		AgentTokenID:     "conf-scoped-agent",
		ClientToken:      mintFor(t, "conformance-alice", auth.RoleClient, nil, nil),
		OtherClientToken: mintFor(t, "conformance-bob", auth.RoleClient, nil, nil),
		AAPAgent:         aapAgent(t, g),
	}
}

func run(t *testing.T, o conformance.Options, only ...string) []conformance.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	results, err := conformance.Run(ctx, o, only...)
	if err != nil {
		t.Fatal(err)
	}
	return results
}

func report(t *testing.T, results []conformance.Result) {
	t.Helper()
	var b strings.Builder
	if err := conformance.WriteTable(&b, results); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
}

// TestGatehouse runs the whole suite, restarts included, against a real
// gateway and requires every check to pass or to skip for a feature that
// is not built.
func TestGatehouse(t *testing.T) {
	g := startGateway(t)
	results := run(t, options(t, g))
	report(t, results)
	if len(results) != len(conformance.Checks()) {
		t.Fatalf("ran %d checks, the suite has %d", len(results), len(conformance.Checks()))
	}
	for _, r := range results {
		known, isKnown := knownFailures[r.ID]
		switch {
		case r.Status == conformance.Fail && !isKnown:
			t.Errorf("%s failed: %s", r.ID, r.Reason)
		case r.Status != conformance.Fail && isKnown:
			t.Errorf("%s is listed as a known failure (%s) but now %s: remove it from knownFailures", r.ID, known, r.Status)
		case r.Status == conformance.Skip && !strings.HasPrefix(r.Reason, "not built"):
			t.Errorf("%s skipped although every option is given: %s", r.ID, r.Reason)
		}
	}
}

// TestWithoutOptions checks that checks needing an option skip, saying
// which, instead of failing or passing.
func TestWithoutOptions(t *testing.T) {
	g := startGateway(t)
	o := conformance.Options{URL: g.url(), Token: adminToken}
	results := run(t, o, "^api/policy-approval$", "^delivery/durable-restart$", "^security/runner-token-scope$", "^api/health$")
	want := map[string]string{
		"api/policy-approval":         "--approval-tool",
		"delivery/durable-restart":    "--restart-cmd",
		"security/runner-token-scope": "--runner-token",
	}
	for _, r := range results {
		if r.ID == "api/health" {
			if r.Status != conformance.Pass {
				t.Errorf("api/health: %s %s", r.Status, r.Reason)
			}
			continue
		}
		if r.Status != conformance.Skip || !strings.Contains(r.Reason, want[r.ID]) {
			t.Errorf("%s: %s %q, want a skip naming %s", r.ID, r.Status, r.Reason, want[r.ID])
		}
	}
	if len(results) != 4 {
		t.Errorf("ran %d checks, want 4", len(results))
	}
}

// TestWrongServer runs the suite against a server that answers everything
// with the same wrong JSON: no check may pass, so none is vacuous.
func TestWrongServer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"nope"}`+"\n")
	}))
	defer srv.Close()
	o := conformance.Options{
		URL: srv.URL, Token: "t", Timeout: 5 * time.Second, ApprovalTool: "conformance.approve",
		Restart:     func(context.Context) error { return nil },
		RunnerToken: "r", RunnerTokenID: "r", AgentToken: "a", AgentTokenID: "a",
		ClientToken: "c", OtherClientToken: "d",
	}
	results := run(t, o)
	for _, r := range results {
		if r.Status == conformance.Pass {
			t.Errorf("%s passed against a server that answers every request with {\"status\":\"nope\"}", r.ID)
		}
		if goBytes.MatchString(r.Reason) {
			t.Errorf("%s: the reason prints bytes, not text: %s", r.ID, r.Reason)
		}
	}
	if s := conformance.Summarize(results); s.Fail < len(results)/2 {
		t.Errorf("only %d of %d checks failed against a wrong server", s.Fail, len(results))
	}
}

// TestMutatedStream puts a proxy in front of a real gateway that drops the
// id: lines of SSE streams: the framing and resume checks must notice.
func TestMutatedStream(t *testing.T) {
	g := startGateway(t)
	target, err := url.Parse(g.url())
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1
	proxy.ModifyResponse = func(resp *http.Response) error {
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			resp.Body = dropIDLines(resp.Body)
		}
		return nil
	}
	srv := httptest.NewServer(proxy)
	defer srv.Close()
	o := options(t, g)
	o.URL = srv.URL
	o.Restart = nil
	results := run(t, o, "^api/stream-framing$", "^delivery/resume-cuts$", "^api/health$")
	want := map[string]conformance.Status{"api/stream-framing": conformance.Fail, "delivery/resume-cuts": conformance.Fail, "api/health": conformance.Pass}
	for _, r := range results {
		if r.Status != want[r.ID] {
			t.Errorf("%s: %s (%s), want %s", r.ID, r.Status, r.Reason, want[r.ID])
		}
	}
}

// dropIDLines removes "id:" lines from an SSE body as it streams.
func dropIDLines(body io.ReadCloser) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		defer body.Close()
		br := bufio.NewReader(body)
		for {
			line, err := br.ReadString('\n')
			if !strings.HasPrefix(line, "id:") {
				if _, werr := io.WriteString(pw, line); werr != nil {
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				pw.CloseWithError(err)
				return
			}
		}
	}()
	return pr
}

// TestUnreachable checks that a wrong address is one clear error.
func TestUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = conformance.Run(context.Background(), conformance.Options{URL: "http://" + addr})
	if err == nil || !strings.Contains(err.Error(), "not reachable") {
		t.Fatalf("Run against a closed port: %v, want a not reachable error", err)
	}
	if _, err := conformance.Run(context.Background(), conformance.Options{URL: "ftp://x"}); err == nil {
		t.Fatal("Run accepted an ftp URL")
	}
}

// goBytes matches a byte slice as fmt prints it ([34 112 111 ...]): a
// JSON value printed with %v instead of as text.
var goBytes = regexp.MustCompile(`\[\d+( \d+){3,}\]`)

// TestExamplePolicyGateway runs the suite against the gateway the README
// starts (docs/examples/policy.yaml, no token, loopback), with the base
// URL as people copy it from the API docs (…/v0): nothing fails; the
// checks that need a made-up tool the policy denies skip, saying so; every
// reason is text; and each result was reported as its check ended, one at
// a time. The two slowest checks, which no policy touches and TestGatehouse
// runs, are left out (70 s of the run under the race detector).
func TestExamplePolicyGateway(t *testing.T) {
	pol, err := policy.Load("../docs/examples/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	g := &testGateway{cfg: node.Options{Addr: "127.0.0.1:0", Data: t.TempDir(), Policy: pol,
		Server: gateway.Options{Heartbeat: 500 * time.Millisecond, WriteTimeout: 2 * time.Second}}}
	if err := g.open(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.stop(); err != nil {
			t.Errorf("stop gateway: %v", err)
		}
	})
	var inFlight atomic.Int32
	var mu sync.Mutex
	reported := map[string]conformance.Status{}
	o := conformance.Options{URL: g.url() + "/v0", Timeout: 60 * time.Second, Progress: func(r conformance.Result) {
		if inFlight.Add(1) != 1 {
			t.Errorf("Progress called for %s while another call was running", r.ID)
		}
		defer inFlight.Add(-1)
		mu.Lock()
		defer mu.Unlock()
		if _, twice := reported[r.ID]; twice {
			t.Errorf("Progress called twice for %s", r.ID)
		}
		reported[r.ID] = r.Status
	}}
	var only []string
	for _, c := range conformance.Checks() {
		if c.ID != "delivery/slow-consumer" && c.ID != "api/list-pagination" {
			only = append(only, "^"+regexp.QuoteMeta(c.ID)+"$")
		}
	}
	results := run(t, o, only...)
	report(t, results)
	policySkips := 0
	for _, r := range results {
		switch {
		case r.Status == conformance.Fail:
			t.Errorf("%s failed: %s", r.ID, r.Reason)
		case r.Status == conformance.Skip && strings.Contains(r.Reason, "the server's policy denies it (policy denied: "):
			policySkips++
		}
		if goBytes.MatchString(r.Reason) {
			t.Errorf("%s: the reason prints bytes, not text: %s", r.ID, r.Reason)
		}
		if reported[r.ID] != r.Status {
			t.Errorf("%s: Progress reported %q, Run returned %q", r.ID, reported[r.ID], r.Status)
		}
	}
	if policySkips == 0 {
		t.Error("no check skipped for the policy, which denies every tool the suite makes up")
	}
	for _, id := range []string{"runtime/memory", "runtime/stream", "runtime/sessions", "api/policy-deny"} {
		if reported[id] != conformance.Pass {
			t.Errorf("%s: %s, want pass: the example policy allows the memory tools and denies shells", id, reported[id])
		}
	}
}
