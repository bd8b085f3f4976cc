package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
	"github.com/gatehouse-dev/gatehouse/stream/ssetest"
)

// apiCall sends one JSON request to the test gateway and decodes the answer.
func apiCall(t *testing.T, base, token, method, path string, body any, want int) map[string]any {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != want {
		t.Fatalf("%s %s: status %d (want %d), body %v, %v", method, path, resp.StatusCode, want, out, err)
	}
	return out
}

// returnedEvent waits until the caller's channel log records the answer to
// action as channel.permission_returned, fails the test if it records it
// more than once, and returns its payload.
func returnedEvent(t *testing.T, base, token, action string) map[string]any {
	t.Helper()
	var got []map[string]any
	eventually.True(t, "channel.permission_returned for "+action, func() bool {
		got = nil
		for _, e := range apiCall(t, base, token, "GET", "/v0/channels/events?limit=1000", nil, 200)["events"].([]any) {
			if ev := e.(map[string]any); ev["type"] == "channel.permission_returned" && ev["action_id"] == action {
				got = append(got, ev["payload"].(map[string]any))
			}
		}
		return len(got) > 0
	})
	if len(got) != 1 {
		t.Fatalf("channel.permission_returned logged %d times for %s: %v", len(got), action, got)
	}
	return got[0]
}

// pendingPrompt connects an agent over SSE, starts an execution and has
// the agent call a tool that needs approval. It returns the execution id.
func pendingPrompt(t *testing.T, base, token string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/v0/agents/stream?agent_id=cli-agent&consumer_id=c1", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("agent stream: %v %v", resp, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	execID := apiCall(t, base, token, "POST", "/v0/executions", map[string]any{"agent_id": "cli-agent"}, 201)["id"].(string)
	r := ssetest.NewReader(resp.Body)
	for {
		f, err := r.Next()
		if err != nil {
			t.Fatalf("no execution.assigned push: %v", err)
		}
		if f.Event == "execution.assigned" {
			var push map[string]any
			if err := json.Unmarshal([]byte(f.Data), &push); err != nil {
				t.Fatal(err)
			}
			// A tool id carrying a terminal escape never gets in: ids with
			// control characters are refused at the door.
			bad := map[string]any{"type": "invoke_tool", "tool_id": "deploy.\x1b[2Japp"}
			apiCall(t, base, token, "POST", "/v0/agents/intent", map[string]any{"execution_id": execID, "session_id": push["session_id"], "intent": bad}, 400)
			intent := map[string]any{"type": "invoke_tool", "tool_id": "deploy.app", "arguments": map[string]any{"env": "prod"}}
			res := apiCall(t, base, token, "POST", "/v0/agents/intent", map[string]any{"execution_id": execID, "session_id": push["session_id"], "intent": intent}, 200)
			if res["pending_approval"] != true {
				t.Fatalf("intent: %v", res)
			}
			return execID
		}
	}
}

// TestApproveListsAndAnswers runs `gatehouse approve` against a real
// gateway: it lists the pending prompt, answers it, and a second answer
// fails printing the recorded outcome.
func TestApproveListsAndAnswers(t *testing.T) {
	pol := policytest.Parse(t, policytest.AskDeploys)
	const token = "cli-secret"
	s := nodetest.Start(t, node.Options{Policy: pol, Auth: auth.Options{StaticToken: token}})
	approve := func(args ...string) (string, error) {
		t.Helper()
		var out, errOut bytes.Buffer
		err := approveCmd(t.Context(), args, &out, &errOut)
		return out.String() + errOut.String(), err
	}

	out, err := approve("--url", s.URL, "--token", token)
	if err != nil || out != "no pending prompts\n" {
		t.Fatalf("empty list: %v\n%s", err, out)
	}
	execID := pendingPrompt(t, s.URL, token)
	// The bridge lists a prompt once the intent's answer has gone out,
	// which can be a moment after the agent has it.
	var actions []any
	for deadline := time.Now().Add(5 * time.Second); len(actions) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the prompt is not listed as pending within 5s")
		}
		actions = apiCall(t, s.URL, token, "GET", "/v0/actions?status=pending", nil, 200)["actions"].([]any)
	}
	action := actions[0].(map[string]any)["action_id"].(string)

	// Without the token the API's code is printed.
	if _, err := approve("--url", s.URL); err == nil || !strings.Contains(err.Error(), "UNAUTHORIZED") {
		t.Fatalf("no token: %v", err)
	}
	// The flags also come from GATEHOUSE_* variables.
	t.Setenv("GATEHOUSE_URL", s.URL)
	t.Setenv("GATEHOUSE_TOKEN", token)
	out, err = approve()
	if err != nil {
		t.Fatalf("list: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ACTION") {
		t.Fatalf("list output:\n%s", out)
	}
	for _, want := range []string{action, "deploy.app", execID, "deploys need a human"} {
		if !strings.Contains(lines[1], want) {
			t.Fatalf("list row lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") {
		t.Fatalf("an escape sequence from the agent reached the terminal: %q", out)
	}

	if _, err := approve("no-such-action", "allow_once"); err == nil || !strings.Contains(err.Error(), "NOT_FOUND") {
		t.Fatalf("unknown action: %v", err)
	}
	if _, err := approve(action, "maybe"); err == nil || !strings.Contains(err.Error(), "VALIDATION_ERROR") {
		t.Fatalf("bad decision: %v", err)
	}
	out, err = approve(action, "allow_once", "--reason", "looks fine")
	if err != nil || !strings.Contains(out, action) || !strings.Contains(out, "approved (allow_once)") {
		t.Fatalf("answer: %v\n%s", err, out)
	}
	rec := apiCall(t, s.URL, token, "GET", "/v0/actions/"+action, nil, 200)
	by, _ := rec["decided_by"].(map[string]any)
	if rec["state"] != "approved" || rec["decision_reason"] != "looks fine" || by == nil || by["channel_id"] != "cli" || by["native_peer_id"] == "" {
		t.Fatalf("record after the CLI answered: %v", rec)
	}
	if r := returnedEvent(t, s.URL, token, action); r["channel_id"] != "cli" || r["native_peer_id"] != by["native_peer_id"] || r["decision"] != "allow_once" {
		t.Fatalf("the CLI's answer in the channel log: %v", r)
	}

	out, err = approve(action, "deny")
	if !errors.Is(err, client.ErrConflict) || !strings.Contains(err.Error(), "CONFLICT") {
		t.Fatalf("second answer: err %v, want CONFLICT\n%s", err, out)
	}
	if !strings.Contains(out, "already settled: approved (allow_once) by static via cli") || !strings.Contains(out, "looks fine") {
		t.Fatalf("second answer does not show the recorded outcome:\n%s", out)
	}
	if out, err := approve(); err != nil || out != "no pending prompts\n" {
		t.Fatalf("list after answering: %v\n%s", err, out)
	}
	if _, err := approve("a", "b", "c"); err == nil {
		t.Fatal("three arguments: no error")
	}
}
