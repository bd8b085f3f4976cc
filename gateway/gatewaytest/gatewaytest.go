// Package gatewaytest starts real Gatehouse gateways for tests, the way
// net/http/httptest starts real HTTP servers: a real Badger folder, a real
// listener on 127.0.0.1, real connections. Nothing is mocked.
package gatewaytest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/gateway"
)

// Server is a gateway running for a test. Close is registered as a cleanup.
type Server struct {
	// URL is the base URL, e.g. "http://127.0.0.1:41234"; https when the
	// config has TLS.
	URL string
	// Node is the running node; it changes on Restart.
	Node *gateway.Node

	tb     testing.TB
	config gateway.Config
}

// Start runs a gateway on a fresh temporary data folder (unless c.Data or
// c.InMemory is set) on 127.0.0.1 with a free port.
func Start(tb testing.TB, c gateway.Config) *Server {
	tb.Helper()
	if c.Data == "" && !c.InMemory {
		c.Data = tb.TempDir()
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:0"
	}
	s := &Server{tb: tb, config: c}
	s.open()
	tb.Cleanup(s.Close)
	return s
}

func (s *Server) open() {
	s.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := gateway.Open(ctx, s.config)
	if err != nil {
		s.tb.Fatalf("gatewaytest: open gateway: %v", err)
	}
	s.Node = n
	scheme := "http://"
	if s.config.TLS != nil {
		scheme = "https://"
	}
	s.URL = scheme + n.Addr().String()
	// A restart reuses the port so that clients reconnect to the same URL.
	s.config.Addr = n.Addr().String()
}

// Restart stops the gateway and starts it again on the same data folder and
// port, as an operator restart would.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ln, err := net.Listen("tcp", s.config.Addr)
		if err == nil {
			ln.Close()
			break
		}
		if time.Now().After(deadline) {
			s.tb.Fatalf("gatewaytest: port %s not free after stop: %v", s.config.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.open()
}

// Stop shuts the gateway down; Restart or Close may follow.
func (s *Server) Stop() {
	if s.Node == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Node.Close(ctx); err != nil {
		s.tb.Errorf("gatewaytest: close gateway: %v", err)
	}
	s.Node = nil
}

// Close stops the gateway for good.
func (s *Server) Close() { s.Stop() }
