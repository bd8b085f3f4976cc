package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/gateway/tlscert/tlscerttest"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
	"github.com/gatehouse-dev/gatehouse/stream/ssetest"
)

// TestServeRefusesBadTLSFlags: contradictory or incomplete TLS flags stop
// serve before it opens anything, with a message naming the flags.
func TestServeRefusesBadTLSFlags(t *testing.T) {
	ca := tlscerttest.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	ca.WritePair(t, certFile, keyFile, 1, "127.0.0.1")
	for _, tc := range []struct {
		name string
		args []string
		env  []string // name, value
		want string
	}{
		{"cert without key", []string{"--tls-cert", certFile}, nil, "--tls-cert needs --tls-key"},
		{"key without cert", []string{"--tls-key", keyFile}, nil, "--tls-key needs --tls-cert"},
		{"key without cert, from the environment", nil, []string{"GATEHOUSE_TLS_KEY", keyFile}, "--tls-key needs --tls-cert"},
		{"files and ACME", []string{"--tls-cert", certFile, "--tls-key", keyFile, "--acme-domain", "gatehouse.example.com"}, nil, "exclude each other"},
		{"ACME email alone", []string{"--acme-email", "ops@example.com"}, nil, "need --acme-domain"},
		{"ACME HTTP alone", []string{"--acme-http", ":80"}, nil, "need --acme-domain"},
		{"missing certificate file", []string{"--tls-cert", filepath.Join(dir, "nope.pem"), "--tls-key", keyFile}, nil, "nope.pem: no such file"},
		{"certificate as key", []string{"--tls-cert", certFile, "--tls-key", certFile}, nil, "unusable certificate or key"},
		{"single-label ACME domain", []string{"--acme-domain", "localhost"}, nil, "single label"},
		{"ACME wildcard", []string{"--acme-domain", "a.example.com,*.example.com"}, nil, "wildcard"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := 0; i+1 < len(tc.env); i += 2 {
				t.Setenv(tc.env[i], tc.env[i+1])
			}
			data := filepath.Join(t.TempDir(), "data")
			args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data", data}, tc.args...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := run(ctx, args, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v: %v, want an error with %q", tc.args, err, tc.want)
			}
			if _, err := os.Stat(data); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the data folder was made before the flags were refused: %v", err)
			}
		})
	}

	// The binary itself: one line on stderr and exit status 2.
	cmd := exec.Command(os.Args[0], "serve", "--addr", "127.0.0.1:0", "--data", t.TempDir(), "--tls-cert", certFile)
	cmd.Env = append(os.Environ(), "GATEHOUSE_TEST_AS_MAIN=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || strings.TrimSpace(stderr.String()) != "gatehouse: serve: --tls-cert needs --tls-key (the private key of the certificate)" {
		t.Fatalf("exit %v, stderr %q; want status 2 and one line", err, stderr.String())
	}
}

// tlsServe runs `gatehouse serve` on a free port and the data folder data
// with the given TLS flags until the test ends, and returns its https base
// URL once it answers a client configured with cfg, and its log.
func tlsServe(t *testing.T, cfg *tls.Config, data string, flags ...string) (string, *syncbuf.Buffer) {
	t.Helper()
	addr := loopback.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	logs := &syncbuf.Buffer{}
	go func() {
		done <- serve(ctx, append([]string{"--addr", addr, "--data", data, "--log-level", "info"}, flags...), logs)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	base := "https://" + addr
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := hc.Get(base + "/v0/ready")
		if err == nil {
			resp.Body.Close()
			// The start-up line, which the tests read, is logged once Open
			// has returned: a moment after the listener answers.
			if resp.StatusCode == 200 && strings.Contains(logs.String(), "gatehouse listening") {
				return base, logs
			}
		}
		select {
		case err := <-done:
			t.Fatalf("serve ended: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no https answer: %v\n%s", err, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestServeACME: serve --acme-domain prepares its private cache in
// <data>/acme, serves a certificate found there to handshakes naming the
// domain without contacting the authority, and with --acme-http answers
// plain HTTP with a redirect to https.
func TestServeACME(t *testing.T) {
	ca := tlscerttest.NewCA(t)
	data := t.TempDir()
	certPEM, keyPEM := ca.Issue(t, 77, "gatehouse.test")
	if err := os.MkdirAll(filepath.Join(data, "acme"), 0o755); err != nil {
		t.Fatal(err)
	}
	// autocert's cache entry: the key, then the chain, under the domain.
	if err := os.WriteFile(filepath.Join(data, "acme", "gatehouse.test"), append(keyPEM, certPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	httpAddr := loopback.FreeAddr(t)
	cfg := ca.ClientConfig()
	cfg.ServerName = "gatehouse.test"
	// Nothing listens at the directory: contacting the authority would fail.
	_, logs := tlsServe(t, cfg, data, "--acme-domain", "gatehouse.test", "--acme-email", "ops@example.com",
		"--acme-directory", "http://127.0.0.1:1/directory", "--acme-http", httpAddr)
	if fi, err := os.Stat(filepath.Join(data, "acme")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("cache folder: %v %v, want mode 0700", fi.Mode(), err)
	}
	for _, want := range []string{"tls=acme", "acme_domains=gatehouse.test", "acme_http=" + httpAddr} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	if strings.Contains(logs.String(), "TLS-ALPN-01 challenges arrive on port 443") {
		t.Errorf("port warning although --acme-http is given:\n%s", logs.String())
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequest(http.MethodGet, "http://"+httpAddr+"/v0/health", nil)
	req.Host = "gatehouse.test"
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "https://gatehouse.test/v0/health" {
		t.Fatalf("plain HTTP: %s %q, want a redirect to https", resp.Status, resp.Header.Get("Location"))
	}
}

// TestClientCommandsOverTLS: serve --tls-cert/--tls-key serves HTTPS;
// runner, agent, tail, approve, bench and conformance reach it with
// --ca-file, and without the right CA each fails at once with one error
// that says to give it.
func TestClientCommandsOverTLS(t *testing.T) {
	ca := tlscerttest.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	ca.WritePair(t, certFile, keyFile, 1, "127.0.0.1")
	base, logs := tlsServe(t, ca.ClientConfig(), t.TempDir(), "--tls-cert", certFile, "--tls-key", keyFile)
	if !strings.Contains(logs.String(), "tls=files") {
		t.Fatalf("start-up line does not say TLS:\n%s", logs.String())
	}
	caFile := ca.WriteFile(t)
	wrongCA := tlscerttest.NewCA(t).WriteFile(t)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: ca.ClientConfig()}}
	defer hc.CloseIdleConnections()

	// A runner with the CA connects and runs a job.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rctx, stopRunner := context.WithCancel(ctx)
	runnerDone := make(chan error, 1)
	go func() {
		runnerDone <- runnerCmd(rctx, []string{"--url", base, "--ca-file", caFile, "--runner-id", "tls-runner", "--log-level", "error"}, io.Discard, io.Discard)
	}()
	defer func() {
		stopRunner()
		if err := <-runnerDone; err != nil {
			t.Errorf("runner: %v", err)
		}
	}()
	ex := tlsPost(t, hc, base+"/v0/executions", map[string]any{"agent_id": "tls-agent"})
	id := ex["id"].(string)
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v0/agents/stream?agent_id=tls-agent&consumer_id=c1", nil)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	frames := sseData(resp.Body)
	lease := (<-frames)["session_id"]
	tlsPost(t, hc, base+"/v0/agents/intent", map[string]any{"execution_id": id, "session_id": lease,
		"intent": map[string]any{"type": "invoke_tool", "tool_id": "gatehouse.echo", "arguments": map[string]any{"via": "tls"}, "remote": true}})
	select {
	case res := <-frames:
		if res["status"] != "succeeded" || res["result"].(map[string]any)["via"] != "tls" {
			t.Fatalf("tool result: %v", res)
		}
	case <-ctx.Done():
		t.Fatal("no tool result over TLS")
	}
	tlsPost(t, hc, base+"/v0/agents/intent", map[string]any{"execution_id": id, "session_id": lease,
		"intent": map[string]any{"type": "complete", "output": "ok"}})

	// The one-shot commands with the CA.
	var out syncbuf.Buffer
	if err := tailCmd(ctx, []string{"--url", base, "--ca-file", caFile, id}, &out, io.Discard); err != nil || !strings.Contains(out.String(), "execution.completed") {
		t.Fatalf("tail: %v\n%s", err, out.String())
	}
	if err := approveCmd(ctx, []string{"--url", base, "--ca-file", caFile}, io.Discard, io.Discard); err != nil {
		t.Fatalf("approve: %v", err)
	}
	if err := conformanceCmd(ctx, []string{"--url", base, "--ca-file", caFile, "--run", "^(api/health|api/stream-live|delivery/websocket-twins)$"}, io.Discard, io.Discard); err != nil {
		t.Fatalf("conformance: %v", err)
	}
	if err := bench(ctx, []string{"--url", base, "--ca-file", caFile, "--executions", "20", "--concurrency", "2", "--agents", "1", "--runners", "1"}, io.Discard, io.Discard); err != nil {
		t.Fatalf("bench: %v", err)
	}

	// Every client command with the wrong CA, or none, fails at once.
	for _, args := range [][]string{
		{"runner", "--url", base, "--ca-file", wrongCA},
		{"runner", "--url", base},
		{"agent", "--url", base, "--ca-file", wrongCA},
		{"tail", "--url", base, "--ca-file", wrongCA, id},
		{"approve", "--url", base, "--ca-file", wrongCA},
		{"conformance", "--url", base, "--ca-file", wrongCA},
		{"bench", "--url", base, "--ca-file", wrongCA, "--executions", "1"},
	} {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := run(cctx, args, io.Discard, io.Discard)
		expired := cctx.Err() != nil
		cancel()
		if expired || err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") ||
			!strings.Contains(err.Error(), "give the CA that signed it with --ca-file") {
			t.Errorf("%v: %v (timed out: %v), want one error that asks for --ca-file", args, err, expired)
		}
	}
	if err := run(ctx, []string{"runner", "--url", base, "--ca-file", filepath.Join(dir, "none.pem")}, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "--ca-file") {
		t.Errorf("missing CA file: %v", err)
	}
	if err := run(ctx, []string{"tail", "--url", base, "--ca-file", keyFile, id}, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("CA file without a certificate: %v", err)
	}
}

func tlsPost(t *testing.T, hc *http.Client, url string, body any) map[string]any {
	t.Helper()
	code, out, err := post(context.Background(), hc, url, body)
	if err != nil || code >= 300 {
		t.Fatalf("POST %s: %d %v %v", url, code, out, err)
	}
	return out
}

// sseData decodes the data of an SSE body's frames as JSON objects.
func sseData(body io.Reader) <-chan map[string]any {
	frames := make(chan map[string]any, 16)
	go func() {
		defer close(frames)
		r := ssetest.NewReader(body)
		for {
			f, err := r.Next()
			if err != nil {
				return
			}
			var m map[string]any
			if json.Unmarshal([]byte(f.Data), &m) == nil {
				frames <- m
			}
		}
	}()
	return frames
}
