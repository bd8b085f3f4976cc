package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// TestRunnerServesBuiltinTools runs `gatehouse runner` against a real
// gateway and has an execution call its tools remotely.
func TestRunnerServesBuiltinTools(t *testing.T) {
	s := nodetest.Start(t, node.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	var out syncbuf.Buffer
	done := make(chan error, 1)
	go func() {
		done <- runnerCmd(ctx, []string{"--url", s.URL, "--runner-id", "edge-1", "--tools", "gatehouse.echo,gatehouse.sha256", "--log-level", "error"}, &out, io.Discard)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("runner: %v", err)
		}
	}()

	post := func(path string, body any) map[string]any {
		t.Helper()
		data, _ := json.Marshal(body)
		resp, err := http.Post(s.URL+path, "application/json", bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		if resp.StatusCode >= 300 {
			t.Fatalf("POST %s: %d %v", path, resp.StatusCode, out)
		}
		return out
	}
	// The agent side over raw HTTP/SSE: start its stream, then the execution.
	req, _ := http.NewRequestWithContext(ctx, "GET", s.URL+"/v0/agents/stream?agent_id=edge-agent&consumer_id=c1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	frames := sseData(resp.Body)
	next := func() map[string]any {
		t.Helper()
		select {
		case f := <-frames:
			return f
		case <-time.After(10 * time.Second):
			t.Fatal("no push within 10s")
		}
		return nil
	}
	ex := post("/v0/executions", map[string]any{"agent_id": "edge-agent"})
	assigned := next()
	lease := assigned["session_id"]
	for tool, args := range map[string]any{"gatehouse.echo": map[string]any{"hello": "edge"}, "gatehouse.sha256": map[string]any{"text": "abc"}} {
		res := post("/v0/agents/intent", map[string]any{"execution_id": ex["id"], "session_id": lease,
			"intent": map[string]any{"type": "invoke_tool", "tool_id": tool, "arguments": args, "remote": true}})
		if res["accepted"] != true {
			t.Fatalf("intent %s: %v", tool, res)
		}
		result := next()
		if result["status"] != "succeeded" {
			t.Fatalf("%s: %v", tool, result)
		}
		switch tool {
		case "gatehouse.echo":
			if result["result"].(map[string]any)["hello"] != "edge" {
				t.Fatalf("echo: %v", result)
			}
		case "gatehouse.sha256":
			if result["result"].(map[string]any)["sha256"] != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
				t.Fatalf("sha256: %v", result)
			}
		}
	}
	if !strings.Contains(out.String(), "runner edge-1 (consumer ") || !strings.Contains(out.String(), ") serving gatehouse.echo, gatehouse.sha256") {
		t.Fatalf("runner banner: %q", out.String())
	}
	if err := runnerCmd(ctx, []string{"--tools", "gatehouse.rm_rf"}, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "unknown tool") {
		t.Fatalf("unknown tool: %v", err)
	}
}

// TestRunnerTakesTheAPIPathInItsURL: a --url that ends in the kernel
// API's /v0 names the same gateway; the runner comes online with it.
func TestRunnerTakesTheAPIPathInItsURL(t *testing.T) {
	s := nodetest.Start(t, node.Options{})
	for _, base := range []string{s.URL + "/v0", s.URL + "/v0/"} {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		id := fmt.Sprintf("edge-%d", len(base))
		go func() {
			done <- runnerCmd(ctx, []string{"--url", base, "--runner-id", id, "--log-level", "error"}, io.Discard, io.Discard)
		}()
		eventually.Check(t, func() error {
			select {
			case err := <-done:
				t.Fatalf("runner --url %s ended: %v", base, err)
			default:
			}
			return runnerOnline(s.URL, id)
		})
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("runner --url %s: %v", base, err)
		}
	}
}

// runnerOnline is nil once the gateway at base lists runner id online.
func runnerOnline(base, id string) error {
	resp, err := http.Get(base + "/v0/peers?role=runner")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Peers []struct{ ID, State string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return err
	}
	for _, p := range body.Peers {
		if p.ID == id && p.State == "online" {
			return nil
		}
	}
	return fmt.Errorf("runner %s not online: %+v", id, body.Peers)
}

// TestClientCommandErrorsHaveOnePrefix: a client command that the gateway
// refuses prints one last line with one "gatehouse:" prefix, also for an
// answer that is not the API's (a URL that leads elsewhere).
func TestClientCommandErrorsHaveOnePrefix(t *testing.T) {
	s := nodetest.Start(t, node.Options{})
	dir := t.TempDir()
	for _, args := range [][]string{
		{"runner", "--url", s.URL + "/elsewhere"},
		{"agent", "--url", s.URL + "/elsewhere"},
		{"tail", "--url", s.URL + "/elsewhere", "some-execution"},
		{"approve", "--url", s.URL + "/elsewhere"},
		{"tail", "--url", s.URL + "/v0", "no-such-execution"},
	} {
		out, code := runMain(t, dir, args...)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		last := lines[len(lines)-1]
		if code != 2 || strings.Count(out, "gatehouse:") != 1 || !strings.HasPrefix(last, "gatehouse: "+args[0]) {
			t.Errorf("gatehouse %v: exit %d, want 2 and one prefixed last line:\n%s", args, code, out)
		}
	}
}

// TestCLIErrorAsksAboutAURLThatLeadsElsewhere: a 404 that is not the
// API's (no code) asks whether --url is a gateway's base URL; the API's
// own 404 says its code and message only.
func TestCLIErrorAsksAboutAURLThatLeadsElsewhere(t *testing.T) {
	base := "http://127.0.0.1:8080/elsewhere"
	for _, tc := range []struct {
		err  *client.APIError
		want string
	}{
		{&client.APIError{Status: 404, Message: "404 page not found"}, "runner: Not Found: 404 page not found (is " + base + " a gateway's base URL?)"},
		{&client.APIError{Status: 404, Code: "NOT_FOUND", Message: "no such execution"}, "runner: NOT_FOUND: no such execution"},
	} {
		err := cliError("runner", base, fmt.Errorf("stream: %w", tc.err))
		if err.Error() != tc.want || !errors.Is(err, client.ErrNotFound) {
			t.Errorf("cliError = %q, want %q matching client.ErrNotFound", err, tc.want)
		}
	}
}

// reconnectLines checks a log of a stream that dropped once and came back:
// exactly one line at info or above says it dropped, with why (drop), and
// one that it is back (back), after failed attempts logged at debug only.
func reconnectLines(t *testing.T, log, drop, back string) {
	t.Helper()
	var drops, backs int
	for line := range strings.Lines(log) {
		if strings.Contains(line, "level=DEBUG") {
			continue
		}
		if strings.Contains(line, drop) {
			drops++
		}
		if strings.Contains(line, back) {
			backs++
			if strings.Contains(line, "failed_attempts=0") || !strings.Contains(line, " down=") {
				t.Errorf("the reconnect line does not say how long and how many attempts: %s", line)
			}
		}
	}
	if drops != 1 || backs != 1 {
		t.Fatalf("%d lines %q and %d lines %q at info or above, want one each:\n%s", drops, drop, backs, back, log)
	}
}

// TestRunnerLogsItsDropAndReconnect: a runner whose gateway restarts logs
// one line when its stream drops, with the reason, and one when it is
// connected again; its failed attempts in between are debug lines.
func TestRunnerLogsItsDropAndReconnect(t *testing.T) {
	s := nodetest.Start(t, node.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	var logs syncbuf.Buffer
	done := make(chan error, 1)
	go func() {
		done <- runnerCmd(ctx, []string{"--url", s.URL, "--runner-id", "edge-r", "--log-level", "debug"}, io.Discard, &logs)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("runner: %v", err)
		}
	}()
	eventually.Check(t, func() error { return runnerOnline(s.URL, "edge-r") })
	s.Stop()
	eventually.True(t, "a failed reconnect", func() bool { return strings.Contains(logs.String(), "reconnect failed; retrying") })
	s.Restart()
	eventually.True(t, "the reconnect line", func() bool { return strings.Contains(logs.String(), "stream reconnected") })
	reconnectLines(t, logs.String(), "reconnecting", "stream reconnected")
}
