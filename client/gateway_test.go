package client_test

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/kernel/policy"
	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/store"
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
	t    *testing.T
	o    gwOptions
	dir  string
	addr string
	URL  string

	// clients made by newClient; their idle connections are closed before
	// each stop, since the gateway's shutdown waits for connections that
	// have not sent a request yet (see stop).
	clients []*client.Client

	st     *store.Store
	k      *kernel.Kernel
	srv    *gateway.Server
	served chan error
}

func startGateway(t *testing.T, o gwOptions) *testGateway {
	t.Helper()
	g := &testGateway{t: t, o: o, dir: t.TempDir(), addr: "127.0.0.1:0"}
	g.start()
	t.Cleanup(g.stop)
	return g
}

func (g *testGateway) start() {
	g.t.Helper()
	log := slog.New(slog.DiscardHandler)
	st, err := store.Open(store.Options{Dir: g.dir, Sync: store.SyncAlways, Logger: log})
	if err != nil {
		g.t.Fatalf("open store: %v", err)
	}
	hub, err := peer.NewHub(context.Background(), peer.Options{Store: st})
	if err != nil {
		g.t.Fatalf("open hub: %v", err)
	}
	ko := g.o.Kernel
	ko.Store, ko.Deliverer, ko.Logger = st, gateway.Deliverer(hub), log
	if g.o.Policy != nil {
		ko.Policy = g.o.Policy
	}
	k, err := kernel.New(context.Background(), ko)
	if err != nil {
		_ = st.Close()
		g.t.Fatalf("start kernel: %v", err)
	}
	authn, err := auth.New(auth.Options{StaticToken: g.o.Token})
	if err != nil {
		g.t.Fatalf("auth: %v", err)
	}
	srv, err := gateway.New(gateway.Options{Kernel: k, Hub: hub, Auth: authn, Logger: log, Heartbeat: time.Second})
	if err != nil {
		g.t.Fatalf("gateway: %v", err)
	}
	ln := g.listen()
	g.st, g.k, g.srv, g.served = st, k, srv, make(chan error, 1)
	g.addr = ln.Addr().String()
	g.URL = "http://" + g.addr
	go func() { g.served <- srv.Serve(ln) }()
}

// listen binds g.addr; after a restart the old port may take a moment to
// be released.
func (g *testGateway) listen() net.Listener {
	g.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ln, err := net.Listen("tcp", g.addr)
		if err == nil {
			return ln
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("listen %s: %v", g.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (g *testGateway) stop() {
	if g.srv == nil {
		return
	}
	// fasthttp does not count a connection that has not sent its first
	// request as idle, so Shutdown would wait out its deadline for the
	// spare connections net/http dials under load.
	for _, c := range g.clients {
		c.CloseIdleConnections()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.srv.Shutdown(ctx); err != nil {
		g.t.Errorf("shutdown: %v", err)
	}
	if err := <-g.served; err != nil {
		g.t.Errorf("serve: %v", err)
	}
	g.k.Close()
	if err := g.st.Close(); err != nil {
		g.t.Errorf("close store: %v", err)
	}
	g.srv = nil
}

// restart stops the gateway and starts it again on the same data folder
// and port, as an operator restart would.
func (g *testGateway) restart() {
	g.t.Helper()
	g.stop()
	g.start()
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
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := g.k.Stats()
		if s.AgentsOnline >= agents && s.RunnersOnline >= runners {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("online: %d agents, %d runners; want %d and %d", s.AgentsOnline, s.RunnersOnline, agents, runners)
		}
		time.Sleep(2 * time.Millisecond)
	}
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
