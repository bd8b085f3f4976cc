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

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// TestTailFollowsUntilTheEnd: tail prints the backlog and the live events of
// an execution and returns after its terminal event.
func TestTailFollowsUntilTheEnd(t *testing.T) {
	s := nodetest.Start(t, node.Options{})
	resp, err := http.Post(s.URL+"/v0/executions", "application/json", strings.NewReader(`{"agent_id":"tail-agent"}`))
	if err != nil {
		t.Fatal(err)
	}
	var ex struct{ ID string }
	_ = json.NewDecoder(resp.Body).Decode(&ex)
	resp.Body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out syncbuf.Buffer
	done := make(chan error, 1)
	go func() { done <- tailCmd(ctx, []string{"--url", s.URL, ex.ID}, &out, io.Discard) }()
	// Signals arrive while tail is following, then the execution is cancelled.
	for _, body := range []string{`{"signal_type":"a"}`, `{"signal_type":"b","payload":"\u001b[31mred"}`} {
		r, err := http.Post(s.URL+"/v0/executions/"+ex.ID+"/signal", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
	}
	r, err := http.Post(s.URL+"/v0/executions/"+ex.ID+"/cancel", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if err := <-done; err != nil {
		t.Fatalf("tail: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{"execution.created", "signal.received", "signal.received", "execution.cancelled"}
	if len(lines) != len(want) {
		t.Fatalf("tail printed %d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i, typ := range want {
		if !strings.Contains(lines[i], typ) {
			t.Fatalf("line %d %q, want %s", i, lines[i], typ)
		}
	}
	if strings.ContainsRune(out.String(), 0x1b) {
		t.Fatal("a control character from a payload reached the terminal")
	}
	var raw bytes.Buffer
	if err := tailCmd(ctx, []string{"--url", s.URL, "--json", "--after", "3", ex.ID}, &raw, io.Discard); err != nil {
		t.Fatal(err)
	}
	var ev struct {
		Sequence int
		Type     string
	}
	if err := json.Unmarshal(raw.Bytes(), &ev); err != nil || ev.Sequence != 4 || ev.Type != "execution.cancelled" {
		t.Fatalf("--json --after 3: %q (%v)", raw.String(), err)
	}
	if err := tailCmd(ctx, []string{"--url", s.URL}, io.Discard, io.Discard); err == nil {
		t.Fatal("tail without an id succeeded")
	}
}

// TestTailLogsItsDropAndResume: tail across a gateway restart logs one
// line when the stream drops and one when it resumes, on stderr, and
// prints every event once.
func TestTailLogsItsDropAndResume(t *testing.T) {
	s := nodetest.Start(t, node.Options{})
	post := func(path, body string) string {
		t.Helper()
		resp, err := http.Post(s.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var ex struct{ ID string }
		_ = json.NewDecoder(resp.Body).Decode(&ex)
		return ex.ID
	}
	id := post("/v0/executions", `{"agent_id":"tail-agent"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, logs syncbuf.Buffer
	done := make(chan error, 1)
	go func() { done <- tailCmd(ctx, []string{"--url", s.URL, "--log-level", "debug", id}, &out, &logs) }()
	eventually.True(t, "the first event", func() bool { return strings.Contains(out.String(), "execution.created") })
	s.Stop()
	eventually.True(t, "a failed reconnect", func() bool { return strings.Contains(logs.String(), "reconnect failed; retrying") })
	s.Restart()
	eventually.True(t, "the resume line", func() bool { return strings.Contains(logs.String(), "execution stream resumed") })
	post("/v0/executions/"+id+"/cancel", "")
	if err := <-done; err != nil {
		t.Fatalf("tail: %v", err)
	}
	reconnectLines(t, logs.String(), "resuming", "execution stream resumed")
	if n := strings.Count(out.String(), "\n"); n != 2 || !strings.Contains(out.String(), "execution.cancelled") {
		t.Fatalf("tail printed %d lines, want execution.created and execution.cancelled:\n%s", n, out.String())
	}
}
