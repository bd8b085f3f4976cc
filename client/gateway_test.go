package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/kernel/policy"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// gwOptions configure a test gateway; the zero value is an open gateway
// with the built-in policy.
type gwOptions struct {
	Policy *policy.Engine
	Token  string
	Kernel kernel.Options
}

// testGateway is a real gateway (Badger in a temporary folder, fasthttp on
// 127.0.0.1) assembled the way `gatehouse serve` assembles it.
type testGateway struct {
	t   *testing.T
	o   gwOptions
	s   *nodetest.Server
	URL string

	// clients made by newClient; their idle connections are closed before
	// each stop, since the gateway's shutdown waits for connections that
	// have not sent a request yet (see stop).
	clients []*client.Client
}

func startGateway(t *testing.T, o gwOptions) *testGateway {
	t.Helper()
	g := &testGateway{t: t, o: o}
	g.s = nodetest.Start(t, node.Options{
		Policy: o.Policy, Auth: auth.Options{StaticToken: o.Token}, Kernel: o.Kernel,
		Server: gateway.Options{Heartbeat: time.Second},
	})
	g.URL = g.s.URL
	t.Cleanup(g.stop)
	return g
}

// stop stops the gateway; the cleanup nodetest registered finds it
// stopped.
func (g *testGateway) stop() {
	// fasthttp does not count a connection that has not sent its first
	// request as idle, so Shutdown would wait out its deadline for the
	// spare connections net/http dials under load.
	for _, c := range g.clients {
		c.CloseIdleConnections()
	}
	g.s.Stop()
}

// restart stops the gateway and starts it again on the same data folder
// and port, as an operator restart would.
func (g *testGateway) restart() {
	g.t.Helper()
	for _, c := range g.clients {
		c.CloseIdleConnections()
	}
	g.s.Restart()
}

// newClient returns a client for g with fast backoffs, so reconnect tests
// finish quickly.
func (g *testGateway) newClient(t *testing.T, o client.Options) *client.Client {
	t.Helper()
	o.BaseURL = g.URL
	if o.MinBackoff == 0 {
		o.MinBackoff, o.MaxBackoff = 10*time.Millisecond, 200*time.Millisecond
	}
	if o.Token == "" {
		o.Token = g.o.Token
	}
	c, err := client.New(o)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	g.clients = append(g.clients, c)
	return c
}

// background runs f until the test ends, then cancels it and checks it
// stopped because of that.
func background(t *testing.T, f func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && err != context.Canceled {
				t.Errorf("background role: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("background role did not stop")
		}
	})
}

// waitOnline waits until the kernel sees the given numbers of agent and
// runner connections. Tests create executions only then: the kernel can
// leave an execution pending when its create races the agent's first
// connection.
func (g *testGateway) waitOnline(t *testing.T, agents, runners int) {
	t.Helper()
	eventually.Check(t, func() error {
		if s := g.s.Node.Kernel.Stats(); s.AgentsOnline < agents || s.RunnersOnline < runners {
			return fmt.Errorf("online: %d agents, %d runners; want %d and %d", s.AgentsOnline, s.RunnersOnline, agents, runners)
		}
		return nil
	})
}

// waitFinished follows execution id until it ends and returns its state.
func waitFinished(t *testing.T, c *client.Client, id string) *client.Execution {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.StreamExecution(ctx, id, 0, func(client.Event) error { return nil }); err != nil {
		if page, perr := c.Events(context.Background(), id, 0, 1000); perr == nil {
			for _, ev := range page.Events {
				t.Logf("event %d %s %s", ev.Sequence, ev.Type, ev.Payload)
			}
		}
		t.Fatalf("stream %s: %v", id, err)
	}
	ex, err := c.GetExecution(ctx, id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return ex
}
