package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/stream/ssetest"
)

// BenchmarkOneExecutionAtATime runs executions one after another, the
// way kbench's remote_k1_c1 case loads a server, in process: a client
// creates each and waits on its SSE stream for execution.completed while
// an agent (an SSE stream) invokes a remote tool, a runner (another)
// answers it, and the agent completes. The store runs with SyncNone, so
// the figure is the path without the disk: ns/op is one execution's
// latency, and writes/op the system calls the server made on its sockets
// for it (a counting listener). Client and server share the machine, as
// they do under kbench.
func BenchmarkOneExecutionAtATime(b *testing.B) {
	s := nodetest.Start(b, node.Options{Sync: store.SyncNone})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = s.Node.Server.Serve(cl)
	}()
	b.Cleanup(func() {
		s.Close()
		<-served
	})
	base := "http://" + ln.Addr().String()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agent := openBenchStream(b, ctx, hc, base+"/v0/agents/stream?agent_id=bench&consumer_id=c1")
	runner := openBenchStream(b, ctx, hc, base+"/v0/runners/stream?runner_id=bench-runner&consumer_id=c1&capabilities=echo")
	go benchAgent(ctx, hc, base, agent)
	go benchRunner(ctx, hc, base, runner)

	one := func() {
		var ex struct {
			ID string `json:"id"`
		}
		if err := postJSON(ctx, hc, base+"/v0/executions", `{"agent_id":"bench","input":{"n":1}}`, &ex); err != nil || ex.ID == "" {
			b.Fatalf("create: %v (%+v)", err, ex)
		}
		st := openBenchStream(b, ctx, hc, base+"/v0/executions/"+ex.ID+"/stream")
		for f := range st {
			if f.Event == "execution.completed" {
				break
			}
		}
		for range st { // to the end of the response, so its connection is reused
		}
	}
	for range 20 { // connections and pools warm
		one()
	}
	b.ResetTimer()
	start := cl.writes.Load()
	for range b.N {
		one()
	}
	b.StopTimer()
	b.ReportMetric(float64(cl.writes.Load()-start)/float64(b.N), "writes/op")
}

// countingListener counts the writes the server makes on the connections
// it accepts.
type countingListener struct {
	net.Listener
	writes atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countedConn{Conn: c, writes: &l.writes}, nil
}

type countedConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countedConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// openBenchStream opens an SSE stream and returns its frames; the channel
// closes when the response ends.
func openBenchStream(b *testing.B, ctx context.Context, hc *http.Client, url string) <-chan ssetest.Frame {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		b.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("GET %s: %s", url, resp.Status)
	}
	frames := make(chan ssetest.Frame, 16)
	go func() {
		defer close(frames)
		defer resp.Body.Close()
		for f := range ssetest.Stream(resp.Body, 16) {
			frames <- f
		}
	}()
	return frames
}

// benchAgent invokes the remote tool echo for each execution assigned to
// it and completes the execution when the tool's result arrives.
func benchAgent(ctx context.Context, hc *http.Client, base string, frames <-chan ssetest.Frame) {
	leases := map[string]string{}
	for f := range frames {
		var p struct {
			ExecutionID string `json:"execution_id"`
			SessionID   string `json:"session_id"`
		}
		if json.Unmarshal([]byte(f.Data), &p) != nil {
			continue
		}
		switch f.Event {
		case "execution.assigned":
			leases[p.ExecutionID] = p.SessionID
			_ = postJSON(ctx, hc, base+"/v0/agents/intent", fmt.Sprintf(
				`{"execution_id":%q,"session_id":%q,"intent":{"type":"invoke_tool","tool_id":"echo","remote":true,"arguments":{"n":1}}}`,
				p.ExecutionID, p.SessionID), nil)
		case "tool.result":
			lease := leases[p.ExecutionID]
			delete(leases, p.ExecutionID)
			_ = postJSON(ctx, hc, base+"/v0/agents/intent", fmt.Sprintf(
				`{"execution_id":%q,"session_id":%q,"intent":{"type":"complete","output":{"ok":true}}}`, p.ExecutionID, lease), nil)
		}
	}
}

// benchRunner answers every job with its arguments.
func benchRunner(ctx context.Context, hc *http.Client, base string, frames <-chan ssetest.Frame) {
	for f := range frames {
		if f.Event != "job.assigned" {
			continue
		}
		var j struct {
			ID          string          `json:"id"`
			ExecutionID string          `json:"execution_id"`
			StepID      string          `json:"step_id"`
			Arguments   json.RawMessage `json:"arguments"`
		}
		if json.Unmarshal([]byte(f.Data), &j) != nil {
			continue
		}
		body, _ := json.Marshal(map[string]any{"job_id": j.ID, "execution_id": j.ExecutionID, "step_id": j.StepID, "success": true, "data": j.Arguments})
		_ = postJSON(ctx, hc, base+"/v0/runners/bench-runner/results", string(body), nil)
	}
}

// postJSON posts body and decodes a 2xx answer into out (when not nil).
func postJSON(ctx context.Context, hc *http.Client, url, body string, out any) error {
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s: %s", url, resp.Status, bytes.TrimSpace(data))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}
