package gateway_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/gateway/tlscert"
	"github.com/gatehouse-dev/gatehouse/gateway/tlscert/tlscerttest"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/node"
)

// tlsClient is an HTTP client that trusts ca alone and, like a browser,
// offers HTTP/2 first.
func tlsClient(ca *tlscerttest.CA) *http.Client {
	cfg := ca.ClientConfig()
	cfg.NextProtos = []string{"h2", "http/1.1"}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}
}

// peerSerial returns the serial of the certificate a connection was served.
func peerSerial(t *testing.T, st *tls.ConnectionState) int64 {
	t.Helper()
	if st == nil || len(st.PeerCertificates) == 0 {
		t.Fatal("not a TLS connection")
	}
	return st.PeerCertificates[0].SerialNumber.Int64()
}

// TestTLSStreamsSurviveCertificateSwap runs an agent (SSE) and a runner
// (WebSocket) over TLS with real clients, replaces the certificate files
// while both stay connected, and checks that new handshakes get the new
// certificate while the open stream and socket go on carrying a whole
// execution.
func TestTLSStreamsSurviveCertificateSwap(t *testing.T) {
	ca := tlscerttest.NewCA(t)
	kp, certFile, keyFile := ca.KeyPair(t, 1, tlscert.Options{Interval: 10 * time.Millisecond}, "127.0.0.1")
	s := start(t, node.Options{TLS: kp.TLSConfig()})
	if !strings.HasPrefix(s.URL, "https://") {
		t.Fatalf("URL %s, want https", s.URL)
	}
	a := &api{t: t, base: s.URL, hc: tlsClient(ca)}

	ag := a.agent("tls-agent", "c1")
	if got := peerSerial(t, ag.resp.TLS); got != 1 {
		t.Fatalf("SSE served serial %d, want 1", got)
	}
	if ag.resp.ProtoMajor != 1 {
		t.Fatalf("SSE over %s, want HTTP/1.1", ag.resp.Proto)
	}
	c, resp, err := a.tryWS("/v0/runners/ws?runner_id=tls-runner&consumer_id=r1&capabilities=tls.tool", gateway.SubprotocolJSON)
	if err != nil {
		t.Fatalf("wss dial: %v %s", err, respBody(resp))
	}
	if got := peerSerial(t, resp.TLS); got != 1 {
		t.Fatalf("WebSocket served serial %d, want 1", got)
	}
	run := &wsClient{t: t, c: c, proto: gateway.SubprotocolJSON, frames: make(chan wsFrame, 64)}
	go run.read()
	run.expect("hello")

	ca.WritePair(t, certFile, keyFile, 2, "127.0.0.1")
	addr := strings.TrimPrefix(s.URL, "https://")
	eventually.True(t, "new handshakes get the new certificate", func() bool {
		conn, err := tls.Dial("tcp", addr, ca.ClientConfig())
		if err != nil {
			t.Fatalf("handshake after the swap: %v", err)
		}
		defer conn.Close()
		st := conn.ConnectionState()
		return peerSerial(t, &st) == 2
	})

	// The stream and the socket opened under the old certificate carry a
	// whole execution: assignment (SSE), job (WebSocket), result (a
	// WebSocket command), tool result (SSE).
	id, lease := a.assigned(ag, obj{"task": "over tls"})
	step := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "tls.tool", "remote": true}, 200)["step_id"]
	seq, job := run.delivery("job.assigned")
	if job["step_id"] != step {
		t.Fatalf("job.assigned %v, want step %v", job, step)
	}
	run.ok(run.command("result", obj{"job_id": job["id"], "execution_id": id, "step_id": step, "success": true, "data": obj{"ok": true}}))
	run.ack(seq)
	if tr := ag.expect("tool.result"); tr["step_id"] != step || tr["status"] != "succeeded" {
		t.Fatalf("tool.result: %v", tr)
	}
	a.intent(id, lease, obj{"type": "complete", "output": "done"}, 200)
	a.waitStatus(id, "completed")

	// New connections, SSE and WebSocket, get the new certificate.
	fresh := &api{t: t, base: s.URL, hc: tlsClient(ca)}
	ag2 := fresh.agent("tls-agent", "c2")
	if got := peerSerial(t, ag2.resp.TLS); got != 2 {
		t.Fatalf("new SSE served serial %d, want 2", got)
	}
	c2, resp2, err := fresh.tryWS("/v0/runners/ws?runner_id=tls-runner&consumer_id=r2&capabilities=tls.tool", gateway.SubprotocolJSON)
	if err != nil {
		t.Fatalf("wss dial after the swap: %v %s", err, respBody(resp2))
	}
	if got := peerSerial(t, resp2.TLS); got != 2 {
		t.Fatalf("new WebSocket served serial %d, want 2", got)
	}
	_ = c2.CloseNow()
}

// TestTLSRefusesUntrustedClientsAndPlainHTTP: a client that does not trust
// the certificate fails its handshake, and plain HTTP on the TLS port gets
// no answer, not a hang.
func TestTLSRefusesUntrustedClientsAndPlainHTTP(t *testing.T) {
	ca := tlscerttest.NewCA(t)
	kp, _, _ := ca.KeyPair(t, 1, tlscert.Options{}, "127.0.0.1")
	s := start(t, node.Options{TLS: kp.TLSConfig()})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	other := tlsClient(tlscerttest.NewCA(t))
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/v0/health", nil)
	if resp, err := other.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("a client with another CA got an answer")
	} else if !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("untrusted: %v", err)
	}
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, "http://"+strings.TrimPrefix(s.URL, "https://")+"/v0/health", nil)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("plain HTTP on the TLS port: %s", resp.Status)
	} else if ctx.Err() != nil {
		t.Fatalf("plain HTTP on the TLS port hung: %v", err)
	}
	trusted := tlsClient(ca)
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/v0/health", nil)
	resp, err := trusted.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 1 {
		t.Fatalf("health over TLS: %s %s", resp.Proto, resp.Status)
	}
}

// TestTLSNeverNegotiatesHTTP2: a configuration that offers h2 (such as
// autocert's own) is served with HTTP/1.1 only, which fasthttp speaks;
// a client that prefers HTTP/2 still gets answers.
func TestTLSNeverNegotiatesHTTP2(t *testing.T) {
	ca := tlscerttest.NewCA(t)
	certPEM, keyPEM := ca.Issue(t, 1, "127.0.0.1")
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	s := start(t, node.Options{TLS: &tls.Config{Certificates: []tls.Certificate{pair}, NextProtos: []string{"h2", "http/1.1"}}})
	a := &api{t: t, base: s.URL, hc: tlsClient(ca)}
	status, _, _ := a.do("GET", "/v0/health", nil)
	if status != 200 {
		t.Fatalf("health: %d", status)
	}
	ag := a.agent("h1-agent", "c1")
	if ag.resp.ProtoMajor != 1 || ag.resp.TLS.NegotiatedProtocol != "http/1.1" {
		t.Fatalf("stream over %s (ALPN %q), want HTTP/1.1", ag.resp.Proto, ag.resp.TLS.NegotiatedProtocol)
	}
}
