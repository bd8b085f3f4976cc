package client_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
	"github.com/gatehouse-dev/gatehouse/gateway/tlscert"
	"github.com/gatehouse-dev/gatehouse/gateway/tlscert/tlscerttest"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// TestTLSConfigTrustsThePrivateCA: with Options.TLSConfig trusting the
// gateway's CA the client works over https; without it, requests and
// streams fail at once with the certificate error instead of retrying.
func TestTLSConfigTrustsThePrivateCA(t *testing.T) {
	ca := tlscerttest.NewCA(t)
	kp, _, _ := ca.KeyPair(t, 1, tlscert.Options{}, "127.0.0.1")
	s := nodetest.Start(t, node.Options{TLS: kp.TLSConfig()})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	c, err := client.New(client.Options{BaseURL: s.URL, TLSConfig: ca.ClientConfig()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	ex, err := c.CreateExecution(ctx, client.CreateRequest{AgentID: "tls-agent"})
	if err != nil {
		t.Fatalf("create over TLS: %v", err)
	}
	if _, err := c.GetExecution(ctx, ex.ID); err != nil {
		t.Fatalf("get over TLS: %v", err)
	}

	// Long backoffs: a retry would outlast the test's deadline.
	untrusted, err := client.New(client.Options{BaseURL: s.URL, MinBackoff: time.Minute, MaxBackoff: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer untrusted.CloseIdleConnections()
	var cerr *tls.CertificateVerificationError
	if _, err := untrusted.GetExecution(ctx, ex.ID); !errors.As(err, &cerr) || ctx.Err() != nil {
		t.Fatalf("get without the CA: %v, want a certificate error at once", err)
	}
	err = untrusted.RunRunner(ctx, &client.Runner{RunnerID: "r1", Tools: map[string]client.ToolFunc{
		"t": func(context.Context, json.RawMessage) (any, error) { return nil, nil },
	}})
	if !errors.As(err, &cerr) || ctx.Err() != nil {
		t.Fatalf("runner without the CA: %v, want a certificate error at once", err)
	}
	err = untrusted.StreamExecution(ctx, ex.ID, 0, func(client.Event) error { return nil })
	if !errors.As(err, &cerr) || ctx.Err() != nil {
		t.Fatalf("stream without the CA: %v, want a certificate error at once", err)
	}
}
