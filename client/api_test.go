package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
)

// TestAPIErrors checks that error answers become *APIError values matching
// the sentinel of their code.
func TestAPIErrors(t *testing.T) {
	g := startGateway(t, gwOptions{Token: "secret-token"})
	c := g.newClient(t, client.Options{})
	ctx := t.Context()
	done, err := c.CreateExecution(ctx, client.CreateRequest{AgentID: "nobody"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if _, err := c.CancelExecution(ctx, done.ID); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	wrongToken := g.newClient(t, client.Options{Token: "wrong"})
	tests := []struct {
		name   string
		call   func() error
		want   error
		status int
		code   string
	}{
		{"unknown execution", func() error { _, err := c.GetExecution(ctx, "no-such-id"); return err },
			client.ErrNotFound, 404, "NOT_FOUND"},
		{"missing agent id", func() error { _, err := c.CreateExecution(ctx, client.CreateRequest{}); return err },
			client.ErrValidation, 400, "VALIDATION_ERROR"},
		{"bad status filter", func() error { _, err := c.ListExecutions(ctx, client.ListOptions{Status: "sleeping"}); return err },
			client.ErrValidation, 400, "VALIDATION_ERROR"},
		{"cancel twice", func() error { _, err := c.CancelExecution(ctx, done.ID); return err },
			client.ErrConflict, 409, "CONFLICT"},
		{"signal a finished execution", func() error { return c.Signal(ctx, done.ID, "go", nil) },
			client.ErrConflict, 409, "CONFLICT"},
		{"signal without type", func() error { return c.Signal(ctx, done.ID, "", nil) },
			client.ErrValidation, 400, "VALIDATION_ERROR"},
		{"wrong token", func() error { _, err := wrongToken.GetExecution(ctx, done.ID); return err },
			client.ErrUnauthorized, 401, "UNAUTHORIZED"},
		{"stream of an unknown execution", func() error {
			return c.StreamExecution(ctx, "no-such-id", 0, func(client.Event) error { return nil })
		}, client.ErrNotFound, 404, "NOT_FOUND"},
		{"runner refused", func() error {
			return wrongToken.RunRunner(ctx, &client.Runner{RunnerID: "r", Tools: map[string]client.ToolFunc{"t": nil}})
		}, client.ErrUnauthorized, 401, "UNAUTHORIZED"},
		{"agent refused", func() error {
			return wrongToken.RunAgent(ctx, &client.Agent{AgentID: "a", Handle: func(context.Context, *client.Task) (any, error) { return nil, nil }})
		}, client.ErrUnauthorized, 401, "UNAUTHORIZED"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			var aerr *client.APIError
			if !errors.As(err, &aerr) {
				t.Fatalf("err %T is not an *APIError", err)
			}
			if aerr.Status != tc.status || aerr.Code != tc.code || aerr.Message == "" {
				t.Errorf("got %d %s %q, want %d %s", aerr.Status, aerr.Code, aerr.Message, tc.status, tc.code)
			}
		})
	}
}

// TestRetries checks that reads are retried on 5xx and that 429 waits for
// Retry-After, against a stub that fails the first attempts.
func TestRetries(t *testing.T) {
	tests := []struct {
		name     string
		status   int
		header   string
		call     func(c *client.Client) error
		attempts int32
		minTime  time.Duration
		want     error
	}{
		{"get retried on 503", http.StatusServiceUnavailable, "",
			func(c *client.Client) error { _, err := c.GetExecution(t.Context(), "x"); return err }, 3, 0, nil},
		{"create not retried on 500", http.StatusInternalServerError, "",
			func(c *client.Client) error {
				_, err := c.CreateExecution(t.Context(), client.CreateRequest{AgentID: "a"})
				return err
			}, 1, 0, client.ErrInternal},
		{"create retried after 429", http.StatusTooManyRequests, "1",
			func(c *client.Client) error {
				_, err := c.CreateExecution(t.Context(), client.CreateRequest{AgentID: "a"})
				return err
			}, 3, 2 * time.Second, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			url := stub(t, func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) < 3 {
					if tc.header != "" {
						w.Header().Set("Retry-After", tc.header)
					}
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(tc.status)
					fmt.Fprintf(w, `{"error":"try later","code":"%s"}`, map[int]string{500: "INTERNAL_ERROR", 503: "SERVICE_UNAVAILABLE", 429: "RATE_LIMITED"}[tc.status])
					return
				}
				w.WriteHeader(http.StatusOK)
				fmt.Fprint(w, `{"id":"x","status":"running"}`)
			})
			c, err := client.New(client.Options{BaseURL: url, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err = tc.call(c)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if got := calls.Load(); got != tc.attempts {
				t.Errorf("%d attempts, want %d", got, tc.attempts)
			}
			if d := time.Since(start); d < tc.minTime {
				t.Errorf("took %s, want at least %s", d, tc.minTime)
			}
		})
	}
}

// stub serves h on 127.0.0.1 for the test.
func stub(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// cutDialer hands out connections that break after reading a budget of
// bytes, the way a flaky network drops a long-lived stream.
type cutDialer struct {
	budget int
	dials  atomic.Int32
}

func (d *cutDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	d.dials.Add(1)
	return &cutConn{Conn: conn, left: d.budget}, nil
}

type cutConn struct {
	net.Conn
	mu   sync.Mutex
	left int
}

func (c *cutConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	left := c.left
	c.mu.Unlock()
	if left <= 0 {
		_ = c.Conn.Close()
		return 0, errors.New("connection cut by the test")
	}
	if len(p) > left {
		p = p[:left]
	}
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.left -= n
	c.mu.Unlock()
	return n, err
}

// TestStreamExecutionResumes follows an execution through a connection
// that keeps breaking mid-stream: the stream resumes from the last event
// it delivered and delivers the whole log exactly once, in order.
func TestStreamExecutionResumes(t *testing.T) {
	g := startGateway(t, gwOptions{})
	c := g.newClient(t, client.Options{})
	const steps = 15
	start := make(chan struct{})
	background(t, func(ctx context.Context) error {
		return c.RunAgent(ctx, &client.Agent{
			AgentID: "a",
			Tools:   map[string]client.ToolFunc{"noop": func(context.Context, json.RawMessage) (any, error) { return 1, nil }},
			Handle: func(ctx context.Context, task *client.Task) (any, error) {
				<-start
				for i := range steps {
					if _, err := task.Invoke(ctx, "noop", i, false); err != nil {
						return nil, err
					}
					time.Sleep(time.Millisecond)
				}
				return "ok", nil
			},
		})
	})
	g.waitOnline(t, 1, 0)
	ex, err := c.CreateExecution(t.Context(), client.CreateRequest{AgentID: "a"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	d := &cutDialer{budget: 1500}
	flaky := g.newClient(t, client.Options{HTTPClient: &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}})
	var got []client.Event
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	err = flaky.StreamExecution(ctx, ex.ID, 0, func(ev client.Event) error {
		if len(got) == 0 {
			close(start) // the rest of the log is written while we follow it
		}
		got = append(got, ev)
		return nil
	})
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	page, err := c.Events(t.Context(), ex.ID, 0, 1000)
	if err != nil {
		t.Fatalf("events: %v", err)
	}
	if len(got) != len(page.Events) {
		t.Fatalf("stream delivered %d events, the log holds %d", len(got), len(page.Events))
	}
	for i, ev := range got {
		if ev.Sequence != uint64(i+1) || ev.ID != page.Events[i].ID {
			t.Fatalf("event %d: sequence %d id %s, want %d %s", i, ev.Sequence, ev.ID, i+1, page.Events[i].ID)
		}
	}
	if last := got[len(got)-1]; last.Type != "execution.completed" {
		t.Errorf("last event %s", last.Type)
	}
	if n := d.dials.Load(); n < 5 {
		t.Errorf("only %d connections: the test did not cut the stream", n)
	}
	t.Logf("%d events over %d connections", len(got), d.dials.Load())

	// Resuming at or past the end returns at once.
	for _, after := range []uint64{uint64(len(got)) - 1, uint64(len(got)), uint64(len(got)) + 5} {
		n := 0
		if err := c.StreamExecution(ctx, ex.ID, after, func(client.Event) error { n++; return nil }); err != nil {
			t.Fatalf("resume after %d: %v", after, err)
		}
		if want := max(0, len(got)-int(after)); n != want {
			t.Errorf("resume after %d: %d events, want %d", after, n, want)
		}
	}
}
