package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

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
