// Package natstest runs NATS deployments for tests: servers with
// JetStream in the test process, on loopback, as an operator's deployment
// that Gatehouse does not run and joins by URL (--nats-url).
package natstest

import (
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
)

// Deployment starts size servers named s1, s2, ... with JetStream, each
// storing in its own temporary folder and listening for clients on a free
// loopback port, with users as its only users. Past one server they are
// routed to each other on loopback (cluster "ops"), so that streams of
// three replicas can be placed. Their max_payload takes the journal's
// groups, as docs/cluster.md asks of an operator. It returns the servers'
// client URLs (nats://host:port, without credentials) once JetStream
// serves on each; the test's cleanup shuts them down.
func Deployment(tb testing.TB, size int, users []*server.User) []string {
	tb.Helper()
	var routes []*url.URL
	routePorts := make([]int, size)
	for i := range routePorts {
		routePorts[i] = freePort(tb)
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", routePorts[i])})
	}
	servers := make([]*server.Server, size)
	for i := range servers {
		o := &server.Options{
			ServerName: fmt.Sprintf("s%d", i+1),
			Host:       "127.0.0.1",
			Port:       server.RANDOM_PORT,
			JetStream:  true,
			StoreDir:   tb.TempDir(),
			NoSigs:     true,
			MaxPayload: cluster.MaxGroupBytes + 64<<10,
			Users:      users,
		}
		if size > 1 {
			o.Cluster = server.ClusterOpts{Name: "ops", Host: "127.0.0.1", Port: routePorts[i]}
			o.Routes = routes
		}
		s, err := server.NewServer(o)
		if err != nil {
			tb.Fatal(err)
		}
		servers[i] = s
		go s.Start()
		tb.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	}
	var out []string
	for _, s := range servers {
		if !s.ReadyForConnections(10 * time.Second) {
			tb.Fatalf("NATS server %s did not start", s.Name())
		}
		out = append(out, "nats://"+s.Addr().String())
	}
	for _, s := range servers {
		eventually.Check(tb, func() error {
			if h := s.Healthz(&server.HealthzOptions{JSMetaOnly: true}); h.Error != "" {
				return fmt.Errorf("%s: %s", s.Name(), h.Error)
			}
			return nil
		})
	}
	return out
}

// freePort is a loopback port free a moment ago.
func freePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
