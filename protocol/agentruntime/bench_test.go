package agentruntime_test

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
	"github.com/gatehouse-dev/gatehouse/protocol/agentruntime"
	"github.com/gatehouse-dev/gatehouse/session"
)

// bigSession makes session "big" whose log holds about n events: turns of
// an agent that calls a local tool many times.
func bigSession(b *testing.B, n int) (*nodetest.Server, *client) {
	b.Helper()
	s := nodetest.Start(b, node.Options{Kernel: kernel.Options{AgentGrace: time.Minute}})
	c := &client{t: b, base: s.URL}
	ctx := context.Background()
	defer s.Node.Kernel.AgentConnected("big-agent", "c1")()
	if _, err := s.Node.Sessions.Create(ctx, sessionReq("big", "big-agent")); err != nil {
		b.Fatal(err)
	}
	v, _, err := s.Node.Kernel.Create(ctx, kernel.CreateRequest{AgentID: "big-agent", SessionID: "big"}, kernel.Meta{})
	if err != nil {
		b.Fatal(err)
	}
	lease := leaseOf(b, s, v.ID)
	for i := 0; i < n/3; i++ {
		res, after, err := s.Node.Kernel.Intent(ctx, kernel.IntentRequest{ExecutionID: v.ID, SessionID: lease, Intent: kernel.Intent{Type: kernel.IntentInvokeTool, ToolID: "t"}}, kernel.Meta{})
		if err != nil {
			b.Fatal(err)
		}
		after.Run()
		after, err = s.Node.Kernel.StepResult(ctx, kernel.StepResultRequest{ExecutionID: v.ID, SessionID: lease, StepID: res.StepID, Success: true, Data: json.RawMessage(strconv.Itoa(i))}, kernel.Meta{})
		if err != nil {
			b.Fatal(err)
		}
		after.Run()
	}
	return s, c
}

func leaseOf(b *testing.B, s *nodetest.Server, exec string) string {
	b.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		page, err := s.Node.Kernel.Events(context.Background(), exec, 0, 10)
		if err != nil {
			b.Fatal(err)
		}
		for _, raw := range page.Events {
			var e struct {
				Type    string
				Payload struct {
					SessionID string `json:"session_id"`
				}
			}
			_ = json.Unmarshal(raw, &e)
			if e.Type == "execution.started" {
				return e.Payload.SessionID
			}
		}
	}
	b.Fatal("never assigned")
	return ""
}

func percentile(d []time.Duration, p float64) time.Duration {
	slices.Sort(d)
	return d[min(len(d)-1, int(float64(len(d))*p))]
}

// BenchmarkSnapshot10k reads the snapshot of a session of 10,000 events
// over HTTP, as a client does: the first read folds the whole log, later
// ones fold what is new. It reports the p99 of the warm reads and the cold
// fold.
//
//	go test -run '^$' -bench Snapshot10k -benchtime 200x ./protocol/agentruntime
func BenchmarkSnapshot10k(b *testing.B) {
	s, c := bigSession(b, 10000)
	last, _ := s.Node.Sessions.Last(context.Background(), "big")
	start := time.Now()
	if status, _ := c.do("GET", "/agent-runtime/sessions/big", nil); status != 200 {
		b.Fatalf("snapshot: %d", status)
	}
	cold := time.Since(start)
	var lat []time.Duration
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		if status, _ := c.do("GET", "/agent-runtime/sessions/big", nil); status != 200 {
			b.Fatalf("snapshot: %d", status)
		}
		lat = append(lat, time.Since(t0))
	}
	b.ReportMetric(float64(last), "events")
	b.ReportMetric(float64(cold.Microseconds())/1000, "cold-ms")
	b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
}

// BenchmarkProjection folds a session's events into its read models on one
// goroutine and reports events folded per second.
//
//	go test -run '^$' -bench Projection ./protocol/agentruntime
func BenchmarkProjection(b *testing.B) {
	_, c := bigSession(b, 3000)
	_, data := c.do("GET", "/agent-runtime/sessions/big/events?limit=1000", nil)
	var page struct{ Events []json.RawMessage }
	if err := json.Unmarshal(data, &page); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	folded := 0
	for b.Loop() {
		folded += foldAll(b, page.Events)
	}
	b.ReportMetric(float64(folded)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkDeltaStream has an agent stream 1,000 text deltas a second over
// a WebSocket for 5 s while a reader follows the session's events over
// SSE. It reports the store writes per second the deltas cost and the p99
// delay from sending a delta to reading it.
//
//	go test -run '^$' -bench DeltaStream -benchtime 1x ./protocol/agentruntime
func BenchmarkDeltaStream(b *testing.B) {
	s := nodetest.Start(b, node.Options{Kernel: kernel.Options{AgentGrace: time.Minute}})
	c := &client{t: b, base: s.URL}
	ctx := context.Background()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(s.URL, "http")+"/v0/agents/ws?agent_id=talker&consumer_id=c1", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer ws.CloseNow()
	read := func() map[string]any {
		_, data, err := ws.Read(ctx)
		if err != nil {
			b.Fatal(err)
		}
		var f map[string]any
		_ = json.Unmarshal(data, &f)
		return f
	}
	read() // hello
	if _, err := s.Node.Sessions.Create(ctx, sessionReq("talk", "talker")); err != nil {
		b.Fatal(err)
	}
	if _, _, err := s.Node.Kernel.Create(ctx, kernel.CreateRequest{AgentID: "talker", SessionID: "talk"}, kernel.Meta{}); err != nil {
		b.Fatal(err)
	}
	var exec, lease string
	for exec == "" {
		if f := read(); f["event"] == "execution.assigned" {
			d := f["data"].(map[string]any)
			exec, lease = d["execution_id"].(string), d["session_id"].(string)
		}
	}
	go func() {
		for {
			if _, _, err := ws.Read(ctx); err != nil {
				return
			}
		}
	}()
	reader := c.sse("/agent-runtime/sessions/talk/events", "Accept", "text/event-stream")
	const rate, seconds = 1000, 5
	sent := make(map[string]time.Time, rate*seconds)
	sentCh := make(chan [2]any, rate*seconds)
	before := s.Node.Store.Stats().Writes
	b.ResetTimer()
	go func() {
		tick := time.NewTicker(time.Second / rate)
		defer tick.Stop()
		for i := range rate * seconds {
			<-tick.C
			text := "d" + strconv.Itoa(i) + " "
			frame, _ := json.Marshal(map[string]any{"type": "command", "id": "x" + strconv.Itoa(i), "command": "intent", "body": map[string]any{
				"execution_id": exec, "session_id": lease, "intent": map[string]any{"type": "output", "output": map[string]any{"kind": "text_delta", "text": text}},
			}})
			sentCh <- [2]any{text, time.Now()}
			if err := ws.Write(ctx, websocket.MessageText, frame); err != nil {
				return
			}
		}
	}()
	var delays []time.Duration
	for len(delays) < rate*seconds {
		e := reader.next(b)
		if e.Event != "model.delta" {
			continue
		}
		now := time.Now()
		var ev struct{ Payload struct{ Delta string } }
		_ = json.Unmarshal([]byte(e.Data), &ev)
		for {
			if at, ok := sent[ev.Payload.Delta]; ok {
				delays = append(delays, now.Sub(at))
				break
			}
			x := <-sentCh
			sent[x[0].(string)] = x[1].(time.Time)
		}
	}
	elapsed := b.Elapsed()
	writes := s.Node.Store.Stats().Writes - before
	b.ReportMetric(float64(writes)/elapsed.Seconds(), "writes/s")
	b.ReportMetric(float64(percentile(delays, 0.99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(percentile(delays, 0.5).Microseconds())/1000, "p50-ms")
}

func sessionReq(id, agent string) session.CreateRequest {
	return session.CreateRequest{ID: id, AgentID: agent, Owner: "local"}
}

func foldAll(b *testing.B, events []json.RawMessage) int {
	if err := agentruntime.FoldEvents("big", events); err != nil {
		b.Fatal(err)
	}
	return len(events)
}
