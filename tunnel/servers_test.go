package tunnel

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/gatehouse-dev/gatehouse/internal/cutproxy"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
)

// The tests run real nats-servers in the process, on random loopback
// ports, and reach them over TCP as the gateway and an edge box do.

// startServer starts a server on a random loopback port; edit adjusts its
// options first.
func startServer(tb testing.TB, edit func(*server.Options)) *server.Server {
	tb.Helper()
	o := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true}
	if edit != nil {
		edit(o)
	}
	s, err := server.NewServer(o)
	if err != nil {
		tb.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		tb.Fatal("nats-server not ready")
	}
	tb.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// connect opens a client connection to s, closed at the end of the test.
func connect(tb testing.TB, s *server.Server) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// leafLink is a hub server with a leaf node listener and a leaf server
// whose remote reaches it through a proxy the test can cut, as an edge box
// links out to a hub.
type leafLink struct {
	hub, leaf *server.Server
	proxy     *cutproxy.Proxy
}

func startLeafLink(tb testing.TB) *leafLink {
	tb.Helper()
	var ho *server.Options
	hub := startServer(tb, func(o *server.Options) {
		ho = o
		o.ServerName = "hub"
		o.LeafNode.Host, o.LeafNode.Port = "127.0.0.1", -1
		// Unadvertised, so that the leaf reconnects through the proxy
		// only, not straight to the address the hub would gossip.
		o.LeafNode.NoAdvertise = true
	})
	// The server writes the port it chose back into its options.
	p := cutproxy.Start(tb, net.JoinHostPort("127.0.0.1", strconv.Itoa(ho.LeafNode.Port)))
	leaf := startServer(tb, func(o *server.Options) {
		o.ServerName = "leaf"
		o.LeafNode.ReconnectInterval = 20 * time.Millisecond
		o.LeafNode.Remotes = []*server.RemoteLeafOpts{{URLs: []*url.URL{{Scheme: "nats-leaf", Host: p.Addr()}}}}
	})
	k := &leafLink{hub: hub, leaf: leaf, proxy: p}
	k.waitLinked(tb)
	return k
}

// waitLinked waits until the leaf link is up on both servers.
func (k *leafLink) waitLinked(tb testing.TB) {
	tb.Helper()
	eventually.True(tb, "the leaf link is up", func() bool {
		return k.hub.NumLeafNodes() == 1 && k.leaf.NumLeafNodes() == 1
	})
}

// dialWhenListening dials subject until the listener's interest has
// crossed to nc's server.
func dialWhenListening(tb testing.TB, nc *nats.Conn, subject string, o Options) *Conn {
	tb.Helper()
	return eventually.Value(tb, "a dial to "+subject+" reaches the listener", func() (*Conn, bool) {
		c, err := Dial(context.Background(), nc, subject, o)
		if err != nil && !errors.Is(err, ErrNoListener) {
			tb.Fatalf("dial %s: %v", subject, err)
		}
		return c, err == nil
	})
}

// accept accepts one conn from l.
func accept(tb testing.TB, l *Listener) *Conn {
	tb.Helper()
	c, err := l.Accept()
	if err != nil {
		tb.Fatalf("accept: %v", err)
	}
	return c.(*Conn)
}

// pair dials a listener on a fresh subject of ncL from ncD and returns the
// dialed and accepted ends, closed at the end of the test.
func pair(tb testing.TB, ncD, ncL *nats.Conn, o Options) (dialed, accepted *Conn, l *Listener) {
	tb.Helper()
	l, err := Listen(ncL, "tunnel.test."+nats.NewInbox()[len("_INBOX."):], o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = l.Close() })
	dialed = dialWhenListening(tb, ncD, l.Addr().String(), o)
	accepted = accept(tb, l)
	tb.Cleanup(func() { _ = dialed.Close(); _ = accepted.Close() })
	return dialed, accepted, l
}
