package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// BenchmarkWebSocketDispatchRoundTrip measures a remote tool call over
// WebSocket with durability "always", one call at a time: the agent sends an
// invoke_tool intent as a command frame, the runner gets job.assigned and
// sends its result as a command frame, and the agent gets tool.result.
// Reported as p50/p99 of intent → tool.result and of job.assigned →
// tool.result, as the clients see them.
func BenchmarkWebSocketDispatchRoundTrip(b *testing.B) {
	for _, proto := range []string{gateway.SubprotocolJSON, gateway.SubprotocolMsgpack} {
		b.Run(strings.TrimPrefix(proto, "gatehouse.v1."), func(b *testing.B) { benchDispatch(b, proto) })
	}
}

// stepsPerExecution bounds how long one execution grows: a fresh one is
// created, off the clock, after this many calls.
const stepsPerExecution = 1000

func benchDispatch(b *testing.B, proto string) {
	// The zero Options sync always: every batch is on disk before its answer.
	s := nodetest.Start(b, node.Options{})
	ws := "ws" + strings.TrimPrefix(s.URL, "http")
	agent := dialBench(b, ws+"/v0/agents/ws?agent_id=bench-agent&consumer_id=a1", proto)
	runner := dialBench(b, ws+"/v0/runners/ws?runner_id=bench-runner&consumer_id=r1&capabilities=bench.tool", proto)
	agent.expect(b, "hello")
	runner.expect(b, "hello")

	assigned := make(chan time.Time, 1)
	runnerErr := make(chan error, 1)
	go runner.serveJobs(assigned, runnerErr)

	full := make([]time.Duration, 0, b.N)
	tail := make([]time.Duration, 0, b.N)
	var execID, session string
	b.ResetTimer()
	for i := range b.N {
		if i%stepsPerExecution == 0 {
			b.StopTimer()
			execID, session = agent.newExecution(b, s)
			b.StartTimer()
		}
		id := fmt.Sprintf("i%d", i)
		start := time.Now()
		agent.send(b, benchCommand{Type: "command", ID: id, Command: "intent", Body: map[string]any{
			"execution_id": execID, "session_id": session,
			"intent": map[string]any{"type": "invoke_tool", "tool_id": "bench.tool", "arguments": map[string]any{"q": i}, "remote": true},
		}})
		f := agent.until(b, func(f benchFrame) bool {
			if f.Type == "reply" && f.ID == id && f.Status != http.StatusOK {
				b.Fatalf("intent %s: reply %d", id, f.Status)
			}
			return f.Type == "delivery" && f.Event == "tool.result"
		})
		done := time.Now()
		select {
		case t := <-assigned:
			tail = append(tail, done.Sub(t))
		case err := <-runnerErr:
			b.Fatal(err)
		}
		full = append(full, done.Sub(start))
		agent.send(b, benchCommand{Type: "ack", Seq: f.Seq})
	}
	b.StopTimer()
	b.ReportMetric(percentileMS(full, 50), "intent-p50-ms")
	b.ReportMetric(percentileMS(full, 99), "intent-p99-ms")
	b.ReportMetric(percentileMS(tail, 50), "assigned-p50-ms")
	b.ReportMetric(percentileMS(tail, 99), "assigned-p99-ms")
}

func percentileMS(ds []time.Duration, p int) float64 {
	slices.Sort(ds)
	return float64(ds[(len(ds)-1)*p/100]) / float64(time.Millisecond)
}

// benchSocket is a bare client socket: the test helpers of ws_test.go take a
// *testing.T and decode into maps, which would weigh on the figures.
type benchSocket struct {
	c       *websocket.Conn
	msgpack bool
}

// benchFrame holds the fields of a server frame that the benchmark uses.
type benchFrame struct {
	Type   string    `json:"type" msgpack:"type"`
	ID     string    `json:"id" msgpack:"id"`
	Status int       `json:"status" msgpack:"status"`
	Seq    uint64    `json:"seq" msgpack:"seq"`
	Event  string    `json:"event" msgpack:"event"`
	Data   benchData `json:"data" msgpack:"data"`
}

type benchData struct {
	ID          string `json:"id" msgpack:"id"`
	ExecutionID string `json:"execution_id" msgpack:"execution_id"`
	SessionID   string `json:"session_id" msgpack:"session_id"`
	StepID      string `json:"step_id" msgpack:"step_id"`
}

type benchCommand struct {
	Type    string         `json:"type" msgpack:"type"`
	ID      string         `json:"id,omitempty" msgpack:"id,omitempty"`
	Command string         `json:"command,omitempty" msgpack:"command,omitempty"`
	Seq     uint64         `json:"seq,omitempty" msgpack:"seq,omitempty"`
	Body    map[string]any `json:"body,omitempty" msgpack:"body,omitempty"`
}

func dialBench(b *testing.B, url, proto string) *benchSocket {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{proto}})
	if err != nil {
		b.Fatalf("dial %s: %v", url, err)
	}
	b.Cleanup(func() { _ = c.CloseNow() })
	return &benchSocket{c: c, msgpack: proto == gateway.SubprotocolMsgpack}
}

func (s *benchSocket) write(v benchCommand) error {
	var (
		data []byte
		err  error
		typ  = websocket.MessageText
	)
	if s.msgpack {
		data, err = msgpack.Marshal(v)
		typ = websocket.MessageBinary
	} else {
		data, err = json.Marshal(v)
	}
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.c.Write(ctx, typ, data)
}

func (s *benchSocket) read() (benchFrame, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, data, err := s.c.Read(ctx)
	if err != nil {
		return benchFrame{}, err
	}
	var f benchFrame
	if s.msgpack {
		err = msgpack.Unmarshal(data, &f)
	} else {
		err = json.Unmarshal(data, &f)
	}
	return f, err
}

func (s *benchSocket) send(b *testing.B, v benchCommand) {
	b.Helper()
	if err := s.write(v); err != nil {
		b.Fatal(err)
	}
}

// until reads frames until one satisfies done.
func (s *benchSocket) until(b *testing.B, done func(benchFrame) bool) benchFrame {
	b.Helper()
	for {
		f, err := s.read()
		if err != nil {
			b.Fatal(err)
		}
		if done(f) {
			return f
		}
	}
}

func (s *benchSocket) expect(b *testing.B, typ string) benchFrame {
	b.Helper()
	f, err := s.read()
	if err != nil || f.Type != typ {
		b.Fatalf("frame %+v, %v; want %s", f, err, typ)
	}
	return f
}

// newExecution creates an execution for the agent and returns its id and
// session once the agent has it.
func (s *benchSocket) newExecution(b *testing.B, srv *nodetest.Server) (string, string) {
	b.Helper()
	resp, err := http.Post(srv.URL+"/v0/executions", "application/json", strings.NewReader(`{"agent_id":"bench-agent"}`))
	if err != nil {
		b.Fatal(err)
	}
	readAll(resp)
	f := s.until(b, func(f benchFrame) bool { return f.Type == "delivery" && f.Event == "execution.assigned" })
	s.send(b, benchCommand{Type: "ack", Seq: f.Seq})
	return f.Data.ExecutionID, f.Data.SessionID
}

// serveJobs answers every job.assigned with a successful result, after
// telling when it saw the job. It stops at the first error, which it
// reports: once the benchmark is over, that is the socket's end, which
// nobody reads.
func (s *benchSocket) serveJobs(assigned chan<- time.Time, errs chan<- error) {
	for n := 0; ; n++ {
		f, err := s.read()
		if err != nil {
			errs <- err
			return
		}
		switch {
		case f.Type == "delivery" && f.Event == "job.assigned":
			assigned <- time.Now()
			err = s.write(benchCommand{Type: "command", ID: fmt.Sprintf("r%d", n), Command: "result", Body: map[string]any{
				"job_id": f.Data.ID, "execution_id": f.Data.ExecutionID, "step_id": f.Data.StepID,
				"success": true, "data": map[string]any{"hits": 3},
			}})
		case f.Type == "reply" && f.Status != http.StatusOK:
			err = fmt.Errorf("runner command %s: reply %d", f.ID, f.Status)
		}
		if err != nil {
			errs <- err
			return
		}
	}
}
