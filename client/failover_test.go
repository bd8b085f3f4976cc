package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// failoverClient is a client for the gateways at urls, in that order, with
// the fast backoffs of the other tests.
func failoverClient(t *testing.T, urls ...string) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{BaseURLs: urls, MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func waitRoles(t *testing.T, n *node.Node, agents, runners int) {
	t.Helper()
	eventually.Check(t, func() error {
		if s := n.Kernel.Stats(); s.AgentsOnline < agents || s.RunnersOnline < runners {
			return fmt.Errorf("online: %d agents, %d runners; want %d and %d", s.AgentsOnline, s.RunnersOnline, agents, runners)
		}
		return nil
	})
}

// TestFailoverSkipsAGatewayThatRefusesConnections gives the client a list
// whose first gateway refuses connections: the create (a request that is
// not safe to repeat, but that never reached anyone), the agent's and the
// runner's streams and the execution's stream all go to the second, and the
// execution completes.
func TestFailoverSkipsAGatewayThatRefusesConnections(t *testing.T) {
	live := nodetest.Start(t, node.Options{Server: gateway.Options{Heartbeat: time.Second}})
	c := failoverClient(t, "http://"+loopback.FreeAddr(t), live.URL)
	background(t, func(ctx context.Context) error {
		return c.RunRunner(ctx, &client.Runner{RunnerID: "r", Tools: map[string]client.ToolFunc{
			"echo": func(_ context.Context, args json.RawMessage) (any, error) { return args, nil },
		}})
	})
	background(t, func(ctx context.Context) error {
		return c.RunAgent(ctx, &client.Agent{AgentID: "a", Handle: func(ctx context.Context, task *client.Task) (any, error) {
			return task.Invoke(ctx, "echo", "hi", true)
		}})
	})
	waitRoles(t, live.Node, 1, 1)
	ex := createExecution(t, c, client.CreateRequest{AgentID: "a"})
	wantCompleted(t, c, ex.ID, `"hi"`)
	if c.BaseURL() != live.URL {
		t.Errorf("client uses %s, want %s", c.BaseURL(), live.URL)
	}
}

// TestFailoverResumesStreamsOnTheNextGateway stops the gateway a client
// uses while a runner holds a job and the execution's stream is followed,
// and starts it again on the same data folder at the second address of the
// client's list, as a cluster's other node would take over. The runner,
// the agent and the execution's reader all move there and resume from
// their cursors: the job's result is accepted, the second job runs, each
// tool runs once, and the reader sees every event once, in order.
func TestFailoverResumesStreamsOnTheNextGateway(t *testing.T) {
	data := t.TempDir()
	second := loopback.FreeAddr(t)
	o := node.Options{Data: data, Server: gateway.Options{Heartbeat: time.Second}}
	first := nodetest.Start(t, o)
	c := failoverClient(t, first.URL, "http://"+second)

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
	waitRoles(t, first.Node, 1, 1)
	ex := createExecution(t, c, client.CreateRequest{AgentID: "a"})

	var mu sync.Mutex
	var seen []client.Event
	streamed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		streamed <- c.StreamExecution(ctx, ex.ID, 0, func(ev client.Event) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, ev)
			return nil
		})
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the runner never got the job")
	}
	eventually.Check(t, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == 0 {
			return errors.New("the reader has seen no event yet")
		}
		return nil
	})

	first.Stop()
	o.Addr = second
	moved := nodetest.Start(t, o)
	close(release)

	if err := <-streamed; err != nil {
		t.Fatalf("stream: %v", err)
	}
	wantCompleted(t, c, ex.ID, `["slow done","fast done"]`)
	if slowRuns.Load() != 1 || fastRuns.Load() != 1 {
		t.Errorf("tools ran slow=%d fast=%d times, want once each", slowRuns.Load(), fastRuns.Load())
	}
	page, err := c.Events(t.Context(), ex.ID, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != len(page.Events) {
		t.Errorf("the reader saw %d events, the log holds %d", len(seen), len(page.Events))
	}
	for i, ev := range seen {
		if ev.Sequence != uint64(i+1) {
			t.Fatalf("event %d has sequence %d: a gap or a duplicate", i, ev.Sequence)
		}
	}
	if c.BaseURL() != moved.URL {
		t.Errorf("client uses %s, want %s", c.BaseURL(), moved.URL)
	}
}

// TestNewRefusesBadBaseURLs checks the list of gateways: none, or one
// that is not an http(s) URL, is refused with an error naming it.
func TestNewRefusesBadBaseURLs(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    client.Options
		want string
	}{
		{"none", client.Options{}, "no base URL"},
		{"bad in the list", client.Options{BaseURL: "http://127.0.0.1:1", BaseURLs: []string{"ftp://x"}}, `"ftp://x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.New(tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v, want an error naming %s", err, tc.want)
			}
		})
	}
	if _, err := client.New(client.Options{}); !errors.Is(err, client.ErrNoBaseURL) {
		t.Errorf("New with no URL: %v, want ErrNoBaseURL", err)
	}
}
