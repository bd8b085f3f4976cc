package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// readSSE parses body with the bench's SSE reader, returning its events as
// "type|data|id" and the error that ended it.
func readSSE(body io.Reader) ([]string, error) {
	r := newSSEReader(body)
	var got []string
	var ev sseEvent
	for {
		if err := r.next(&ev); err != nil {
			return got, err
		}
		got = append(got, ev.Type+"|"+string(ev.Data)+"|"+string(ev.ID))
	}
}

func TestSSEReader(t *testing.T) {
	long := strings.Repeat("x", 100<<10) // past the reader's buffer
	for _, tc := range []struct {
		name, body string
		want       []string
		err        error
	}{{
		name: "gateway frames",
		body: "retry: 5000\n\n" +
			"id: 7.1\nevent: execution.assigned\ndata: {\"a\":1}\n\n" +
			":heartbeat\n\n" +
			"id: 7.2\nevent: tool.result\ndata: {\"b\":2}\n\n",
		want: []string{`execution.assigned|{"a":1}|7.1`, `tool.result|{"b":2}|7.2`},
		err:  io.EOF,
	}, {
		name: "standard details",
		body: "data:one\r\ndata: two\r\n\r\n" + // no space after the colon, CRLF, two data lines
			"event: only-type\n\n" + // no data: nothing dispatched, the type is forgotten
			"id: 1\ndata\n\n" + // a field without a colon has an empty value
			"id: bad\x00id\nevent: x\ndata: 3\nunknown: field\n\n", // an id with NUL is ignored; the last one stays
		want: []string{"message|one\ntwo|", "message||1", "x|3|1"},
		err:  io.EOF,
	}, {
		name: "long line",
		body: "event: big\ndata: " + long + "\n\n",
		want: []string{"big|" + long + "|"},
		err:  io.EOF,
	}, {
		name: "cut inside an event",
		body: "event: x\ndata: 1\n\nevent: y\ndata: 2\n",
		want: []string{"x|1|"},
		err:  io.ErrUnexpectedEOF,
	}, {
		name: "cut inside a line",
		body: "event: x\ndata: 1\n\ndata: {\"trunc",
		want: []string{"x|1|"},
		err:  io.ErrUnexpectedEOF,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			// One byte per read exercises every split of lines across reads.
			for _, body := range []io.Reader{strings.NewReader(tc.body), iotest.OneByteReader(strings.NewReader(tc.body))} {
				got, err := readSSE(body)
				if !errors.Is(err, tc.err) {
					t.Errorf("ended with %v, want %v", err, tc.err)
				}
				if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", tc.want) {
					t.Errorf("events\n got %q\nwant %q", got, tc.want)
				}
			}
		})
	}
}

func TestSSEReaderLineLimit(t *testing.T) {
	body := "data: " + strings.Repeat("x", maxBenchSSELine+10) + "\n\n"
	got, err := readSSE(strings.NewReader(body))
	if err == nil || errors.Is(err, io.EOF) || len(got) > 0 {
		t.Fatalf("got %d events, err %v; want a line-length error", len(got), err)
	}
}

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
		k.note([]byte(tc.id))
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
