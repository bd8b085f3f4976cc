package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestBenchBodies checks the hand-built bodies byte for byte against what
// encoding/json makes of the SDK's request types (copied here: they are
// unexported in package client).
func TestBenchBodies(t *testing.T) {
	for _, s := range []string{"", "bench.echo", "0197a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", `q"b\s`, "<&>", "tab\there", "é\u2028"} {
		want, _ := json.Marshal(s)
		if got := appendJSONString([]byte("x"), s); string(got) != "x"+string(want) {
			t.Errorf("appendJSONString(%q) = %s, want x%s", s, got, want)
		}
	}

	type intent struct { // client.intent
		Type           string          `json:"type"`
		ToolID         string          `json:"tool_id,omitempty"`
		Arguments      json.RawMessage `json:"arguments,omitempty"`
		IdempotencyKey string          `json:"idempotency_key,omitempty"`
		Remote         bool            `json:"remote,omitempty"`
		Output         json.RawMessage `json:"output,omitempty"`
	}
	type intentBody struct { // client.Task.intent's body
		ExecutionID string  `json:"execution_id"`
		SessionID   string  `json:"session_id"`
		Intent      *intent `json:"intent"`
	}
	// key returns the idempotency key of body, checking its form.
	key := func(body []byte, name string) string {
		var b intentBody
		if err := json.Unmarshal(body, &b); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		k := b.Intent.IdempotencyKey
		if prefix := "ex-1:" + name + ":"; !strings.HasPrefix(k, prefix) || len(k) != len(prefix)+8 {
			t.Errorf("idempotency key %q, want %s and 8 hex digits", k, prefix)
		}
		return k
	}
	check := func(what string, got []byte, want any) {
		t.Helper()
		w, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(w) {
			t.Errorf("%s body\n got %s\nwant %s", what, got, w)
		}
	}
	for _, input := range []json.RawMessage{json.RawMessage(`{"n":3}`), nil} {
		as := &benchAssignment{ExecutionID: "ex-1", SessionID: "lease-1", Input: input}
		args := input
		if args == nil {
			args = json.RawMessage("null") // Task.Input of an execution without input
		}
		body := appendInvokeBody(nil, as)
		check("invoke", body, intentBody{"ex-1", "lease-1", &intent{Type: "invoke_tool", ToolID: benchTool, Arguments: args,
			IdempotencyKey: key(body, benchTool), Remote: true}})
		body = appendCompleteBody(nil, as, input)
		check("complete", body, intentBody{"ex-1", "lease-1", &intent{Type: "complete", IdempotencyKey: key(body, "complete"), Output: args}})
	}

	check("create", appendCreateBody(nil, 42), struct { // client.CreateRequest
		AgentID string         `json:"agent_id"`
		Input   map[string]int `json:"input,omitempty"`
	}{benchAgent, map[string]int{"n": 42}})

	type jobResult struct { // client.jobResult
		JobID       string          `json:"job_id"`
		ExecutionID string          `json:"execution_id"`
		StepID      string          `json:"step_id"`
		Success     bool            `json:"success"`
		Data        json.RawMessage `json:"data,omitempty"`
		Error       string          `json:"error,omitempty"`
		Retryable   bool            `json:"retryable,omitempty"`
		ConsumerID  string          `json:"consumer_id"`
		StartedAt   time.Time       `json:"started_at"`
		CompletedAt time.Time       `json:"completed_at"`
	}
	started := time.Now().UTC()
	for _, j := range []benchJob{
		{ID: "job-1", ExecutionID: "ex-1", StepID: "st-1", ToolID: benchTool, Arguments: json.RawMessage(`{"n":3}`)},
		{ID: "job-2", ExecutionID: "ex-1", StepID: "st-2", ToolID: "other.tool"},
	} {
		body := appendResultBody(nil, "c-1", &j, started)
		var got jobResult
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		want := jobResult{JobID: j.ID, ExecutionID: "ex-1", StepID: j.StepID, Success: true, Data: j.Arguments,
			ConsumerID: "c-1", StartedAt: started, CompletedAt: got.CompletedAt}
		if j.ToolID != benchTool {
			want.Success, want.Data, want.Error = false, nil, `tool "other.tool" is not offered by this process`
		}
		check("result", body, want)
	}
}

// TestAckerNote checks that SSE ids become acknowledged sequences.
func TestAckerNote(t *testing.T) {
	k := &acker{wake: make(chan struct{}, 1)}
	for _, tc := range []struct {
		id   string
		want uint64
	}{{"e.42", 42}, {"e.7", 42}, {"43", 43}, {"e.", 43}, {"e.x1", 43}, {"e.-1", 43}, {"e.99999999999999999999", 43}} {
		k.note(tc.id)
		if got := k.handled.Load(); got != tc.want {
			t.Errorf("after %q: handled %d, want %d", tc.id, got, tc.want)
		}
	}
}

// TestStepBox checks the pairing of tool results with their waiters,
// either coming first, and the bound on results nobody waits for.
func TestStepBox(t *testing.T) {
	ctx := t.Context()
	soon := func() time.Time { return time.Now().Add(5 * time.Second) }
	b := newStepBox(2)

	b.deliver("early", &benchToolResult{StepID: "early", Status: "succeeded"})
	b.deliver("early", &benchToolResult{StepID: "early", Status: "failed"}) // a repeat is dropped
	if tr, err := b.wait(ctx, "early", soon()); err != nil || tr.Status != "succeeded" {
		t.Fatalf("early push: %v, %v", tr, err)
	}

	got := make(chan *benchToolResult)
	go func() {
		tr, _ := b.wait(ctx, "late", soon())
		got <- tr
	}()
	for {
		b.mu.Lock()
		waiting := b.slots["late"] != nil
		b.mu.Unlock()
		if waiting {
			break
		}
		time.Sleep(time.Millisecond)
	}
	b.deliver("late", &benchToolResult{StepID: "late", Status: "succeeded"})
	if tr := <-got; tr == nil || tr.StepID != "late" {
		t.Fatalf("late push: %v", tr)
	}

	for _, id := range []string{"a", "b", "c"} {
		b.deliver(id, &benchToolResult{StepID: id})
	}
	if len(b.slots) != 2 || b.early.Len() != 2 || b.slots["a"] != nil {
		t.Fatalf("after 3 unclaimed pushes with room for 2: %d slots, %d early, oldest kept: %v", len(b.slots), b.early.Len(), b.slots["a"] != nil)
	}
	if _, err := b.wait(ctx, "a", time.Now().Add(20*time.Millisecond)); err == nil {
		t.Fatal("an evicted push was delivered")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.wait(cctx, "nothing", soon()); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with a cancelled context: %v", err)
	}
	if len(b.slots) != 2 {
		t.Fatalf("waits left %d slots, want the 2 unclaimed", len(b.slots))
	}
}
