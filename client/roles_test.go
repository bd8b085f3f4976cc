package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
)

// TestAgentAndRunner runs executions end to end: the agent calls a local
// tool, then a remote tool on a runner, and completes with both results.
func TestAgentAndRunner(t *testing.T) {
	g := startGateway(t, gwOptions{})
	c := g.newClient(t, client.Options{})
	var jobs atomic.Int32
	background(t, func(ctx context.Context) error {
		return c.RunRunner(ctx, &client.Runner{RunnerID: "r1", Tools: map[string]client.ToolFunc{
			"math.add": func(_ context.Context, args json.RawMessage) (any, error) {
				jobs.Add(1)
				var in struct{ A, B int }
				if err := json.Unmarshal(args, &in); err != nil {
					return nil, err
				}
				return map[string]int{"sum": in.A + in.B}, nil
			},
		}})
	})
	var finished sync.Map
	background(t, func(ctx context.Context) error {
		return c.RunAgent(ctx, &client.Agent{
			AgentID: "calc",
			Tools: map[string]client.ToolFunc{
				"text.upper": func(_ context.Context, args json.RawMessage) (any, error) {
					var s string
					err := json.Unmarshal(args, &s)
					return strings.ToUpper(s), err
				},
			},
			Handle: func(ctx context.Context, task *client.Task) (any, error) {
				var in struct {
					Name string
					A, B int
				}
				if err := json.Unmarshal(task.Input(), &in); err != nil {
					return nil, err
				}
				upper, err := task.Invoke(ctx, "text.upper", in.Name, false)
				if err != nil {
					return nil, err
				}
				sum, err := task.Invoke(ctx, "math.add", map[string]int{"a": in.A, "b": in.B}, true)
				if err != nil {
					return nil, err
				}
				return map[string]json.RawMessage{"name": upper, "sum": sum}, nil
			},
			Finished: func(task *client.Task, err error) { finished.Store(task.ID(), err) },
		})
	})

	g.waitOnline(t, 1, 1)
	const n = 20
	ids := make([]string, n)
	for i := range n {
		ids[i] = createExecution(t, c, client.CreateRequest{
			AgentID: "calc", Input: map[string]any{"name": fmt.Sprintf("job%d", i), "a": i, "b": 100},
			Labels: map[string]string{"suite": "e2e"},
		}).ID
	}
	for i, id := range ids {
		ex := waitFinished(t, c, id)
		if ex.Status != client.StatusCompleted {
			t.Fatalf("execution %d: status %s", i, ex.Status)
		}
		want := fmt.Sprintf(`{"name":"JOB%d","sum":{"sum":%d}}`, i, i+100)
		if string(ex.Output) != want {
			t.Errorf("execution %d: output %s, want %s", i, ex.Output, want)
		}
	}
	// Finished runs once the agent has read the answer to its complete
	// intent, which can be after the stream showed the execution done.
	deadline := time.Now().Add(5 * time.Second)
	for i, id := range ids {
		ferr, ok := finished.Load(id)
		for !ok && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
			ferr, ok = finished.Load(id)
		}
		if !ok || ferr != nil {
			t.Errorf("execution %d: Finished called: %v, err %v", i, ok, ferr)
		}
	}
	if got := jobs.Load(); got != n {
		t.Errorf("runner ran %d jobs, want %d (each exactly once)", got, n)
	}
	page, err := c.ListExecutions(t.Context(), client.ListOptions{Labels: map[string]string{"suite": "e2e"}, Status: client.StatusCompleted, Limit: 7})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	seen := map[string]bool{}
	for {
		for _, ex := range page.Executions {
			if seen[ex.ID] {
				t.Fatalf("list repeated %s", ex.ID)
			}
			seen[ex.ID] = true
		}
		if page.NextCursor == "" {
			break
		}
		if page, err = c.ListExecutions(t.Context(), client.ListOptions{Cursor: page.NextCursor, Labels: map[string]string{"suite": "e2e"}, Limit: 7}); err != nil {
			t.Fatalf("list next page: %v", err)
		}
	}
	if len(seen) != n {
		t.Errorf("list returned %d executions over its pages, want %d", len(seen), n)
	}
}

// TestPolicyDenied checks that a policy denial reaches the agent as a
// *PolicyError naming the rule, and that an allowed call still runs.
func TestPolicyDenied(t *testing.T) {
	pol := policytest.Parse(t, `
rules:
  - id: no-danger
    priority: 1
    when: {tool_id: "danger.*"}
    then: {decision: deny, reason: "dangerous tools are off"}
default:
  decision: allow
  reason: ok
`)
	g := startGateway(t, gwOptions{Policy: pol})
	c := g.newClient(t, client.Options{})
	background(t, func(ctx context.Context) error {
		return c.RunAgent(ctx, &client.Agent{
			AgentID: "a",
			Tools:   map[string]client.ToolFunc{"safe.echo": func(_ context.Context, args json.RawMessage) (any, error) { return args, nil }},
			Handle: func(ctx context.Context, task *client.Task) (any, error) {
				_, err := task.Invoke(ctx, "danger.rm", map[string]string{"path": "/"}, true)
				var pe *client.PolicyError
				if !errors.As(err, &pe) {
					return nil, fmt.Errorf("want a *PolicyError, got %v", err)
				}
				echo, err := task.Invoke(ctx, "safe.echo", "hi", false)
				if err != nil {
					return nil, err
				}
				return map[string]any{"rule": pe.RuleID, "tool": pe.ToolID, "reason": pe.Reason, "echo": echo}, nil
			},
		})
	})
	g.waitOnline(t, 1, 0)
	ex := createExecution(t, c, client.CreateRequest{AgentID: "a"})
	ex = waitFinished(t, c, ex.ID)
	if ex.Status != client.StatusCompleted {
		t.Fatalf("status %s", ex.Status)
	}
	var out struct{ Rule, Tool, Reason, Echo string }
	if err := json.Unmarshal(ex.Output, &out); err != nil {
		t.Fatalf("output %s: %v", ex.Output, err)
	}
	if out.Rule != "no-danger" || out.Tool != "danger.rm" || !strings.Contains(out.Reason, "dangerous tools are off") || out.Echo != "hi" {
		t.Errorf("output %+v", out)
	}
}

// TestRunnerFailures covers how a tool's failure reaches the agent.
func TestRunnerFailures(t *testing.T) {
	tests := []struct {
		name     string
		tool     func(attempt int32) (any, error)
		want     string // the agent's view, as its output
		attempts int32
	}{
		{
			name: "retryable then success",
			tool: func(attempt int32) (any, error) {
				if attempt == 1 {
					return nil, client.Retryable(errors.New("busy"))
				}
				return "done", nil
			},
			want: `"result: \"done\""`, attempts: 2,
		},
		{
			name:     "retryable until attempts run out",
			tool:     func(int32) (any, error) { return nil, client.Retryable(errors.New("still busy")) },
			want:     `"tool error: still busy"`,
			attempts: 3,
		},
		{
			name:     "permanent failure",
			tool:     func(int32) (any, error) { return nil, errors.New("broken") },
			want:     `"tool error: broken"`,
			attempts: 1,
		},
		{
			name:     "panic",
			tool:     func(int32) (any, error) { panic("boom") },
			want:     `"tool error: tool \"flaky\" panicked: boom"`,
			attempts: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := startGateway(t, gwOptions{Kernel: kernel.Options{RetryBase: 20 * time.Millisecond}})
			c := g.newClient(t, client.Options{})
			var attempts atomic.Int32
			background(t, func(ctx context.Context) error {
				return c.RunRunner(ctx, &client.Runner{RunnerID: "r", Tools: map[string]client.ToolFunc{
					"flaky": func(context.Context, json.RawMessage) (any, error) { return tc.tool(attempts.Add(1)) },
				}})
			})
			background(t, func(ctx context.Context) error {
				return c.RunAgent(ctx, &client.Agent{AgentID: "a", Handle: func(ctx context.Context, task *client.Task) (any, error) {
					res, err := task.Invoke(ctx, "flaky", nil, true)
					var te *client.ToolError
					if errors.As(err, &te) {
						return "tool error: " + te.Message, nil
					}
					if err != nil {
						return nil, err
					}
					return "result: " + string(res), nil
				}})
			})
			g.waitOnline(t, 1, 1)
			ex := createExecution(t, c, client.CreateRequest{AgentID: "a"})
			wantCompleted(t, c, ex.ID, tc.want)
			if got := attempts.Load(); got != tc.attempts {
				t.Errorf("tool ran %d times, want %d", got, tc.attempts)
			}
		})
	}
}

// TestHandleError checks that a failing Handle fails the execution.
func TestHandleError(t *testing.T) {
	g := startGateway(t, gwOptions{})
	c := g.newClient(t, client.Options{})
	background(t, func(ctx context.Context) error {
		return c.RunAgent(ctx, &client.Agent{AgentID: "a", Handle: func(context.Context, *client.Task) (any, error) {
			return nil, errors.New("cannot do it")
		}})
	})
	g.waitOnline(t, 1, 0)
	ex := createExecution(t, c, client.CreateRequest{AgentID: "a"})
	var failure string
	err := c.StreamExecution(t.Context(), ex.ID, 0, func(ev client.Event) error {
		if ev.Type == "execution.failed" {
			var p struct{ Error string }
			if err := json.Unmarshal(ev.Payload, &p); err != nil {
				return err
			}
			failure = p.Error
		}
		return nil
	})
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	if failure != "cannot do it" {
		t.Errorf("failure %q", failure)
	}
}

// TestWait checks Task.Wait with the signal sent after the wait and before
// it (the kernel then holds it for the wait).
func TestWait(t *testing.T) {
	for _, early := range []bool{false, true} {
		t.Run(fmt.Sprintf("signal first=%v", early), func(t *testing.T) {
			g := startGateway(t, gwOptions{})
			c := g.newClient(t, client.Options{})
			ready := make(chan string, 1)
			proceed := make(chan struct{})
			background(t, func(ctx context.Context) error {
				return c.RunAgent(ctx, &client.Agent{AgentID: "a", Handle: func(ctx context.Context, task *client.Task) (any, error) {
					ready <- task.ID()
					<-proceed
					first, err := task.Wait(ctx, "go")
					if err != nil {
						return nil, err
					}
					// A second wait must not be satisfied by a stale push of
					// the first signal.
					second, err := task.Wait(ctx, "go")
					if err != nil {
						return nil, err
					}
					return []json.RawMessage{first, second}, nil
				}})
			})
			g.waitOnline(t, 1, 0)
			ex := createExecution(t, c, client.CreateRequest{AgentID: "a"})
			<-ready
			if early {
				if err := c.Signal(t.Context(), ex.ID, "go", map[string]int{"n": 1}); err != nil {
					t.Fatalf("signal: %v", err)
				}
				close(proceed)
			} else {
				close(proceed)
				waitStatus(t, c, ex.ID, client.StatusBlocked)
				if err := c.Signal(t.Context(), ex.ID, "go", map[string]int{"n": 1}); err != nil {
					t.Fatalf("signal: %v", err)
				}
			}
			waitStatus(t, c, ex.ID, client.StatusBlocked)
			if err := c.Signal(t.Context(), ex.ID, "go", map[string]int{"n": 2}); err != nil {
				t.Fatalf("signal: %v", err)
			}
			wantCompleted(t, c, ex.ID, `[{"n":1},{"n":2}]`)
		})
	}
}

// createExecution starts an execution, failing the test if the gateway
// refuses it.
func createExecution(t *testing.T, c *client.Client, req client.CreateRequest) *client.Execution {
	t.Helper()
	ex, err := c.CreateExecution(t.Context(), req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	return ex
}

// wantCompleted waits for execution id to end and checks that it completed
// with output want.
func wantCompleted(t *testing.T, c *client.Client, id, want string) {
	t.Helper()
	ex := waitFinished(t, c, id)
	if ex.Status != client.StatusCompleted || string(ex.Output) != want {
		t.Errorf("got %s %s, want completed %s", ex.Status, ex.Output, want)
	}
}

// waitStatus polls until execution id has status want.
func waitStatus(t *testing.T, c *client.Client, id string, want client.Status) {
	t.Helper()
	eventually.Check(t, func() error {
		ex, err := c.GetExecution(t.Context(), id)
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		if ex.Status != want {
			return fmt.Errorf("execution %s is %s, want %s", id, ex.Status, want)
		}
		return nil
	})
}

// TestRunnerSurvivesRestart restarts the gateway, on the same folder and
// port, while a runner holds a job: the runner and the agent reconnect
// with their consumer ids, the job's result is accepted by the new process
// and the execution goes on to a second job and completes.
func TestRunnerSurvivesRestart(t *testing.T) {
	g := startGateway(t, gwOptions{})
	c := g.newClient(t, client.Options{})
	entered := make(chan struct{})
	release := make(chan struct{})
	var slowRuns, fastRuns atomic.Int32
	background(t, func(ctx context.Context) error {
		return c.RunRunner(ctx, &client.Runner{RunnerID: "r", Tools: map[string]client.ToolFunc{
			"slow": func(ctx context.Context, _ json.RawMessage) (any, error) {
				if slowRuns.Add(1) == 1 {
					close(entered)
				}
				select {
				case <-release:
					return "slow done", nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			},
			"fast": func(context.Context, json.RawMessage) (any, error) {
				fastRuns.Add(1)
				return "fast done", nil
			},
		}})
	})
	background(t, func(ctx context.Context) error {
		return c.RunAgent(ctx, &client.Agent{AgentID: "a", Handle: func(ctx context.Context, task *client.Task) (any, error) {
			slow, err := task.Invoke(ctx, "slow", nil, true)
			if err != nil {
				return nil, err
			}
			fast, err := task.Invoke(ctx, "fast", nil, true)
			if err != nil {
				return nil, err
			}
			return []json.RawMessage{slow, fast}, nil
		}})
	})
	g.waitOnline(t, 1, 1)
	ex := createExecution(t, c, client.CreateRequest{AgentID: "a"})
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the runner never got the job")
	}
	g.restart()
	close(release)
	wantCompleted(t, c, ex.ID, `["slow done","fast done"]`)
	if slowRuns.Load() != 1 || fastRuns.Load() != 1 {
		t.Errorf("tools ran slow=%d fast=%d times, want once each", slowRuns.Load(), fastRuns.Load())
	}
}

// TestApproval covers a tool call held for a human decision: approved, it
// runs; denied, the agent gets a *PolicyError marked as an approval.
func TestApproval(t *testing.T) {
	pol := policytest.Parse(t, `
rules:
  - id: ask-first
    priority: 1
    when: {tool_id: "payments.*"}
    then: {decision: require_approval, reason: "money moves"}
default:
  decision: allow
`)
	for _, approve := range []bool{true, false} {
		t.Run(fmt.Sprintf("approved=%v", approve), func(t *testing.T) {
			g := startGateway(t, gwOptions{Policy: pol})
			c := g.newClient(t, client.Options{})
			background(t, func(ctx context.Context) error {
				return c.RunAgent(ctx, &client.Agent{
					AgentID: "a",
					Tools: map[string]client.ToolFunc{
						"payments.send": func(context.Context, json.RawMessage) (any, error) { return "sent", nil },
					},
					Handle: func(ctx context.Context, task *client.Task) (any, error) {
						res, err := task.Invoke(ctx, "payments.send", map[string]int{"amount": 5}, false)
						var pe *client.PolicyError
						if errors.As(err, &pe) {
							return fmt.Sprintf("refused by approver=%v: %s", pe.Approval, pe.Reason), nil
						}
						if err != nil {
							return nil, err
						}
						return res, nil
					},
				})
			})
			g.waitOnline(t, 1, 0)
			ex := createExecution(t, c, client.CreateRequest{AgentID: "a"})
			var step string
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			err := c.StreamExecution(ctx, ex.ID, 0, func(ev client.Event) error {
				if ev.Type != "execution.blocked" {
					return nil
				}
				var p struct{ Reason, Ref string }
				if err := json.Unmarshal(ev.Payload, &p); err != nil {
					return err
				}
				step = p.Ref
				return c.Signal(ctx, ex.ID, "step.approve", map[string]any{"step_id": step, "approved": approve, "reason": "not today"})
			})
			if err != nil || step == "" {
				t.Fatalf("stream: %v (blocked on step %q)", err, step)
			}
			want := `"sent"`
			if !approve {
				want = `"refused by approver=true: not today"`
			}
			wantCompleted(t, c, ex.ID, want)
		})
	}
}

// TestStartReportedOnlyForSlowTools: a tool that returns at once is not
// reported started (its result says when it ran); one still running after
// the report delay is, before its result.
func TestStartReportedOnlyForSlowTools(t *testing.T) {
	g := startGateway(t, gwOptions{})
	c := g.newClient(t, client.Options{})
	background(t, func(ctx context.Context) error {
		return c.RunRunner(ctx, &client.Runner{RunnerID: "r1", Tools: map[string]client.ToolFunc{
			"quick": func(context.Context, json.RawMessage) (any, error) { return "ok", nil },
			"slow": func(ctx context.Context, _ json.RawMessage) (any, error) {
				select {
				case <-time.After(300 * time.Millisecond):
				case <-ctx.Done():
				}
				return "ok", nil
			},
		}})
	})
	background(t, func(ctx context.Context) error {
		return c.RunAgent(ctx, &client.Agent{AgentID: "a", Handle: func(ctx context.Context, task *client.Task) (any, error) {
			var tool string
			if err := json.Unmarshal(task.Input(), &tool); err != nil {
				return nil, err
			}
			return task.Invoke(ctx, tool, nil, true)
		}})
	})
	g.waitOnline(t, 1, 1)
	for _, tc := range []struct {
		tool    string
		started bool
	}{{"quick", false}, {"slow", true}} {
		ex := createExecution(t, c, client.CreateRequest{AgentID: "a", Input: tc.tool})
		if got := waitFinished(t, c, ex.ID); got.Status != client.StatusCompleted {
			t.Fatalf("%s: status %s", tc.tool, got.Status)
		}
		page, err := c.Events(t.Context(), ex.ID, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		var types []string
		for _, ev := range page.Events {
			types = append(types, ev.Type)
		}
		started := slices.Index(types, "step.started")
		if (started >= 0) != tc.started {
			t.Errorf("%s: events %v: step.started present = %v, want %v", tc.tool, types, started >= 0, tc.started)
		}
		if started >= 0 && started > slices.Index(types, "step.completed") {
			t.Errorf("%s: step.started after step.completed: %v", tc.tool, types)
		}
	}
}
