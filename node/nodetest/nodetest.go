// Package nodetest starts real Gatehouse nodes for tests, the way
// net/http/httptest starts real HTTP servers: a real Badger folder, a real
// listener on 127.0.0.1, real connections. Nothing is mocked.
package nodetest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/node"
)

// Server is a node running for a test. Close is registered as a cleanup.
type Server struct {
	// URL is the base URL, e.g. "http://127.0.0.1:41234"; https when the
	// options have TLS.
	URL string
	// Node is the running node; it changes on Restart.
	Node *node.Node

	tb   testing.TB
	opts node.Options
}

// Start runs a node on a fresh temporary data folder (unless o.Data or
// o.InMemory is set) on 127.0.0.1 with a free port.
func Start(tb testing.TB, o node.Options) *Server {
	tb.Helper()
	if o.Data == "" && !o.InMemory {
		o.Data = tb.TempDir()
	}
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	s := &Server{tb: tb, opts: o}
	s.open()
	tb.Cleanup(s.Close)
	return s
}

func (s *Server) open() {
	s.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := node.Open(ctx, s.opts)
	if err != nil {
		s.tb.Fatalf("nodetest: open node: %v", err)
	}
	s.Node = n
	scheme := "http://"
	if s.opts.TLS != nil {
		scheme = "https://"
	}
	s.URL = scheme + n.Addr().String()
	// A restart reuses the port so that clients reconnect to the same URL.
	s.opts.Addr = n.Addr().String()
}

// Restart stops the node and starts it again on the same data folder and
// port, as an operator restart would.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ln, err := net.Listen("tcp", s.opts.Addr)
		if err == nil {
			ln.Close()
			break
		}
		if time.Now().After(deadline) {
			s.tb.Fatalf("nodetest: port %s not free after stop: %v", s.opts.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.open()
}

// Stop shuts the node down; Restart or Close may follow.
func (s *Server) Stop() {
	if s.Node == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), node.ShutdownTimeout)
	defer cancel()
	if err := s.Node.Close(ctx); err != nil {
		s.tb.Errorf("nodetest: close node: %v", err)
	}
	s.Node = nil
}

// Close stops the node for good.
func (s *Server) Close() { s.Stop() }
