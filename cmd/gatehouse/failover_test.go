package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// TestAgentAndRunnerCommandsSkipADeadURL runs `gatehouse runner` and
// `gatehouse agent` with a --url list whose first gateway refuses
// connections (comma-separated for one, the flag repeated for the other):
// both come online on the second, and a turn that calls the runner's tool
// is answered.
func TestAgentAndRunnerCommandsSkipADeadURL(t *testing.T) {
	s := nodetest.Start(t, node.Options{})
	dead := "http://" + loopback.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		_ = runnerCmd(ctx, []string{"--url", dead + "," + s.URL, "--runner-id", "r1", "--log-level", "error"}, io.Discard, io.Discard)
	}()
	go func() {
		_ = agentCmd(ctx, []string{"--url", dead, "--url", s.URL, "--name", "example", "--log-level", "error"}, io.Discard, io.Discard)
	}()
	c := &aapClient{t: t, base: s.URL + "/aap/v1"}
	eventually.True(t, "the example agent online", func() bool {
		agents, _ := c.json("GET", "/meta", nil, 200)["agents"].([]any)
		return len(agents) == 1 && agents[0].(map[string]any)["online"] == true
	})
	agent := map[string]any{"name": "example", "tools": []any{map[string]any{"name": "gatehouse.echo", "trust": true}}}
	evs := c.stream("PUT", "/session", map[string]any{"agent": agent, "stream": "delta", "messages": []any{userMsg("echo ping")}})
	if got := text(evs, "text_delta", "delta"); got != "The runner echoed: ping" {
		t.Fatalf("turn: %q (%s)", got, names(evs))
	}
}

// TestTailResumesOnTheNextURL follows an execution with two URLs while the
// gateway at the first stops and comes back, on the same data folder, at
// the second, as another node of a cluster would serve it: tail says it
// moved, resumes there from its cursor, and prints every event once.
func TestTailResumesOnTheNextURL(t *testing.T) {
	o := node.Options{Data: t.TempDir()}
	s := nodetest.Start(t, o)
	second := loopback.FreeAddr(t)
	post := func(base, path, body string) string {
		t.Helper()
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var ex struct{ ID string }
		_ = json.NewDecoder(resp.Body).Decode(&ex)
		return ex.ID
	}
	id := post(s.URL, "/v0/executions", `{"agent_id":"tail-agent"}`)
	post(s.URL, "/v0/executions/"+id+"/signal", `{"signal_type":"before"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, logs syncbuf.Buffer
	done := make(chan error, 1)
	go func() {
		done <- tailCmd(ctx, []string{"--url", s.URL + ",http://" + second, "--log-level", "info", id}, &out, &logs)
	}()
	eventually.True(t, "the first two events", func() bool { return strings.Count(out.String(), "\n") == 2 })
	s.Stop()
	o.Addr = second
	moved := nodetest.Start(t, o)
	eventually.True(t, "the resume line", func() bool { return strings.Contains(logs.String(), "execution stream resumed") })
	post(moved.URL, "/v0/executions/"+id+"/signal", `{"signal_type":"after"}`)
	post(moved.URL, "/v0/executions/"+id+"/cancel", "")
	if err := <-done; err != nil {
		t.Fatalf("tail: %v", err)
	}
	if !strings.Contains(logs.String(), "moving to the next") {
		t.Errorf("tail did not say it moved to the next gateway:\n%s", logs.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{"execution.created", "signal.received", "signal.received", "execution.cancelled"}
	if len(lines) != len(want) {
		t.Fatalf("tail printed %d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i, typ := range want {
		if seq := strings.Fields(lines[i])[0]; seq != string(rune('1'+i)) || !strings.Contains(lines[i], typ) {
			t.Fatalf("line %d %q, want sequence %d %s", i, lines[i], i+1, typ)
		}
	}
}
