package main

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
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
	"github.com/gatehouse-dev/gatehouse/gateway/tlscert/tlscerttest"
	"github.com/gatehouse-dev/gatehouse/internal/cutproxy"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
)

// edgeCall sends one JSON request with a bearer token and decodes the
// answer.
func edgeCall(ctx context.Context, method, url, token string, body any) (int, map[string]any, error) {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var out map[string]any
	data, _ := io.ReadAll(resp.Body)
	if len(data) > 0 {
		if err := json.Unmarshal(data, &out); err != nil {
			return resp.StatusCode, nil, fmt.Errorf("%s %s: %d %q: %w", method, url, resp.StatusCode, data, err)
		}
	}
	return resp.StatusCode, out, nil
}

// echoRuns is the echo tool of the test's runners, counting the runs of
// each execution's job by runner.
type echoRuns struct {
	mu   sync.Mutex
	runs map[string][]string // execution id -> the runners that ran its job
}

func (e *echoRuns) tool(runner string) client.ToolFunc {
	return func(_ context.Context, args json.RawMessage) (any, error) {
		var a struct {
			Exec string `json:"exec"`
		}
		if err := json.Unmarshal(args, &a); err != nil {
			return nil, err
		}
		e.mu.Lock()
		e.runs[a.Exec] = append(e.runs[a.Exec], runner)
		e.mu.Unlock()
		return map[string]any{"echo": a.Exec}, nil
	}
}

func (e *echoRuns) of(exec string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.runs[exec])
}

// TestClusterEdgeBoxServedThroughItsHubAndCaughtUpAfterALinkCut runs a hub
// and an edge box as two `gatehouse serve` processes, the edge linked to
// the hub as a NATS leaf node over mutual TLS, through a proxy the test
// can cut. Each has its own token; the edge asks for approval before its
// echo tool runs.
//
// While linked, a runner and a person (a client answering prompts) that
// reach only the hub serve the edge box's executions under
// /edge/edge/...: the prompt is answered through the hub and the job runs
// on the hub's runner. A stream of an edge execution is followed through
// the hub. The link is cut: the hub answers 503 EDGE_NOT_LINKED, and the
// edge box works alone with its own runner and person. Restored: the
// hub's runner and stream come back by themselves; a prompt raised while
// the link was down is answered through the hub and on the edge at once,
// and exactly one answer wins; the followed stream has every event once,
// in order; every job ran exactly once.
func TestClusterEdgeBoxServedThroughItsHubAndCaughtUpAfterALinkCut(t *testing.T) {
	t.Parallel()
	const hubToken, edgeToken = "hub-token-0123456789", "edge-token-0123456789"
	ca := tlscerttest.NewCA(t)
	dir := t.TempDir()
	caPath, policy := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(caPath, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	rules := "rules:\n  - id: ask\n    priority: 1\n    when: {tool_id: \"gatehouse.echo\"}\n    then: {decision: require_approval, reason: \"a person decides\"}\n"
	if err := os.WriteFile(policy, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	hubCert, hubKey := ca.WriteNodePair(t, 10, "127.0.0.1")
	edgeCert, edgeKey := ca.WriteEdgePair(t, 11, "edge", "127.0.0.1")
	leaf := loopback.FreeAddr(t)
	link := cutproxy.Start(t, leaf)
	// The hub advertises the proxy: an edge box redials what its hub
	// advertises, which would otherwise go round the cut.
	hub := newNATSNode(t, "hub", "--token", hubToken, "--leaf-listen", leaf, "--leaf-advertise", link.Addr(),
		"--leaf-tls-cert", hubCert, "--leaf-tls-key", hubKey, "--leaf-tls-ca", caPath)
	edge := newNATSNode(t, "edge", "--token", edgeToken, "--policy", policy, "--nats-domain", "edge",
		"--leaf-remote", "tls://"+link.Addr(), "--leaf-tls-cert", edgeCert, "--leaf-tls-key", edgeKey, "--leaf-tls-ca", caPath)
	startAll(t, hub, edge)
	via := hub.base + "/edge/edge"

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	newClient := func(base string) *client.Client {
		c, err := client.New(client.Options{BaseURL: base, Token: edgeToken, MinBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	throughHub, onEdge := newClient(via), newClient(edge.base)
	reachable := func() error {
		code, body, err := edgeCall(ctx, "GET", via+"/v0/executions?limit=1", edgeToken, nil)
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("the edge through the hub: %d %v %v", code, body, err)
		}
		return nil
	}
	eventually.Check(t, reachable)
	// The edge box authenticates the hub's clients itself: the hub's token
	// is not the edge's.
	if code, body, err := edgeCall(ctx, "GET", via+"/v0/executions", hubToken, nil); err != nil || code != http.StatusUnauthorized {
		t.Fatalf("the hub's token on the edge: %d %v %v", code, body, err)
	}

	runs := &echoRuns{runs: map[string][]string{}}
	runnerDone := make(chan error, 1)
	go func() {
		runnerDone <- throughHub.RunRunner(ctx, &client.Runner{RunnerID: "hub-runner", Tools: map[string]client.ToolFunc{"gatehouse.echo": runs.tool("hub-runner")}})
	}()

	// create starts an execution of the echo tool through base and returns
	// its id and its prompt's.
	create := func(base string, c *client.Client, n int) (exec, action string) {
		t.Helper()
		code, ex, err := edgeCall(ctx, "POST", base+"/v0/executions", edgeToken,
			map[string]any{"tool": map[string]any{"tool_id": "gatehouse.echo", "arguments": map[string]any{"exec": fmt.Sprint(n)}}})
		if err != nil || code != http.StatusCreated {
			t.Fatalf("create through %s: %d %v %v", base, code, ex, err)
		}
		exec = ex["id"].(string)
		action = eventually.Value(t, "the prompt of "+exec, func() (string, bool) {
			page, err := c.ListActions(ctx, client.ActionListOptions{State: client.ActionPending})
			if err != nil {
				return "", false
			}
			for _, a := range page.Actions {
				if a.ExecutionID == exec {
					return a.ActionID, true
				}
			}
			return "", false
		})
		return exec, action
	}
	completed := func(c *client.Client, exec string, runner string, n int) {
		t.Helper()
		eventually.Check(t, func() error {
			ex, err := c.GetExecution(ctx, exec)
			if err != nil {
				return err
			}
			if ex.Status != client.StatusCompleted {
				return fmt.Errorf("execution %s is %s", exec, ex.Status)
			}
			return nil
		})
		if got := runs.of(fmt.Sprint(n)); !slices.Equal(got, []string{runner}) {
			t.Fatalf("the job of execution %d ran on %v, want once on %s", n, got, runner)
		}
	}

	// Linked: a prompt answered and a job run through the hub.
	exec1, action1 := create(via, throughHub, 1)
	if _, err := throughHub.Respond(ctx, action1, client.Answer{Decision: client.DecisionAllowOnce}); err != nil {
		t.Fatalf("answer through the hub: %v", err)
	}
	completed(throughHub, exec1, "hub-runner", 1)

	// An execution of the edge followed through the hub.
	followed, err := throughHub.CreateExecution(ctx, client.CreateRequest{AgentID: "nobody"})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen []uint64
	)
	streamed := make(chan error, 1)
	go func() {
		streamed <- throughHub.StreamExecution(ctx, followed.ID, 0, func(e client.Event) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, e.Sequence)
			return nil
		})
	}()
	eventually.Check(t, func() error { return throughHub.Signal(ctx, followed.ID, "linked", nil) })
	eventually.True(t, "the followed stream's first events", func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) == 2 })

	// Cut: the hub says the edge is not linked; the edge works alone.
	link.Cut()
	eventually.Check(t, func() error {
		code, body, err := edgeCall(ctx, "GET", via+"/v0/executions?limit=1", edgeToken, nil)
		if err != nil || code != http.StatusServiceUnavailable || body["code"] != "EDGE_NOT_LINKED" {
			return fmt.Errorf("the edge through the hub while cut: %d %v %v", code, body, err)
		}
		return nil
	})
	localCtx, stopLocal := context.WithCancel(ctx)
	localDone := make(chan error, 1)
	go func() {
		localDone <- onEdge.RunRunner(localCtx, &client.Runner{RunnerID: "edge-runner", Tools: map[string]client.ToolFunc{"gatehouse.echo": runs.tool("edge-runner")}})
	}()
	exec2, action2 := create(edge.base, onEdge, 2)
	if _, err := onEdge.Respond(ctx, action2, client.Answer{Decision: client.DecisionAllowOnce}); err != nil {
		t.Fatalf("answer on the edge alone: %v", err)
	}
	completed(onEdge, exec2, "edge-runner", 2)
	if err := onEdge.Signal(ctx, followed.ID, "alone", nil); err != nil {
		t.Fatal(err)
	}
	stopLocal()
	if err := <-localDone; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("the edge's runner: %v", err)
	}
	exec3, action3 := create(edge.base, onEdge, 3)

	// Restored: the same clients of the hub carry on.
	link.Restore()
	eventually.Check(t, reachable)
	// While the link settles, the hub may answer 503 EDGE_NOT_LINKED, or
	// 502 EDGE_UNREACHABLE for an answer its tunnel dropped (which may
	// have reached the edge): the person sends it again, as a client
	// would. A request with no answer at all fails the test.
	answers := make(chan error, 2)
	dropped := make(chan bool, 1)
	for _, c := range []*client.Client{throughHub, onEdge} {
		go func() {
			var aerr *client.APIError
			maybe := false
			for {
				_, err := c.Respond(ctx, action3, client.Answer{Decision: client.DecisionAllowOnce})
				if c == throughHub && errors.As(err, &aerr) && (aerr.Code == "EDGE_NOT_LINKED" || aerr.Code == "EDGE_UNREACHABLE") && ctx.Err() == nil {
					maybe = maybe || aerr.Code == "EDGE_UNREACHABLE"
					select {
					case <-time.After(100 * time.Millisecond):
					case <-ctx.Done():
					}
					continue
				}
				if c == throughHub {
					dropped <- maybe
				}
				answers <- err
				return
			}
		}()
	}
	won, settled := 0, 0
	for range 2 {
		err := <-answers
		var se *client.SettledError
		switch {
		case err == nil:
			won++
		case errors.As(err, &se) && se.Recorded.State == client.ActionApproved:
			settled++
		default:
			t.Fatalf("an answer to the prompt raised while cut: %v", err)
		}
	}
	// An answer through the hub whose 502 hid that it won comes back
	// settled when sent again: then neither saw itself win.
	if maybeWon := <-dropped; won+settled != 2 || won > 1 || won == 0 && !maybeWon {
		t.Fatalf("two answers to one prompt: %d won, %d found it settled", won, settled)
	}
	completed(throughHub, exec3, "hub-runner", 3)
	resolved := 0
	page, err := throughHub.Events(ctx, exec3, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range page.Events {
		if e.Type == "permission.resolved" {
			resolved++
		}
	}
	if resolved != 1 {
		t.Fatalf("execution %s has %d permission.resolved events, want 1", exec3, resolved)
	}

	if err := throughHub.Signal(ctx, followed.ID, "relinked", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := throughHub.CancelExecution(ctx, followed.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-streamed:
		if err != nil {
			t.Fatalf("the followed stream: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the followed stream did not end")
	}
	mu.Lock()
	defer mu.Unlock()
	for i, s := range seen {
		if s != uint64(i+1) {
			t.Fatalf("the followed stream saw %v: a gap or a duplicate", seen)
		}
	}
	// created, three signals, cancelled.
	if len(seen) != 5 {
		t.Fatalf("the followed stream saw %v, want 5 events", seen)
	}
	cancel()
	if err := <-runnerDone; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("the hub's runner: %v", err)
	}
}
