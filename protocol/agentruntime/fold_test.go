package agentruntime

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/session"
)

// syntheticFacts is a session log of n facts: a turn whose execution calls
// tools in a loop, as the gateway reads it.
func syntheticFacts(n int) []fact {
	at := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	facts := make([]fact, 0, n)
	add := func(typ, step string, payload string) {
		seq := uint64(len(facts) + 1)
		facts = append(facts, fact{sessionID: "s", item: session.Item{Seq: seq, Kind: session.KindEvent, At: at, ThreadID: "main", TurnID: "t", ExecutionID: "x", ExecutionSeq: seq},
			event: &event.Event{ID: "e" + strconv.Itoa(int(seq)), ExecutionID: "x", RunID: "x", StepID: step, ToolCallID: step, Type: typ, Timestamp: at, Sequence: seq, Payload: json.RawMessage(payload)}})
	}
	add(event.ExecutionCreated, "", `{"agent_id":"a","input":null}`)
	add(event.ExecutionStarted, "", `{"session_id":"l","consumer_id":"c"}`)
	for i := 0; len(facts) < n; i++ {
		step := "s" + strconv.Itoa(i)
		add(event.StepCreated, step, `{"tool_id":"search","arguments":{"q":1},"attempt":1,"max_attempts":3,"remote":true}`)
		add(event.StepDispatched, step, `{"runner_id":"r","job_id":"j`+strconv.Itoa(i)+`"}`)
		add(event.StepCompleted, step, `{"result":{"hits":3}}`)
	}
	return facts[:n]
}

// BenchmarkProjectionLive renders a session's facts and folds them into
// the read models, as the gateway does for a snapshot, on one goroutine.
//
//	go test -run '^$' -bench ProjectionLive ./protocol/agentruntime
func BenchmarkProjectionLive(b *testing.B) {
	facts := syntheticFacts(10000)
	b.ResetTimer()
	folded := 0
	for b.Loop() {
		m := newModel("s")
		for i := range facts {
			e, ok := render(&facts[i])
			if ok {
				m.foldEvent(&e)
				folded++
			}
		}
	}
	b.ReportMetric(float64(folded)/b.Elapsed().Seconds(), "events/s")
}

// TestFoldsAgree: folding rendered events directly and folding their JSON
// give the same read models.
func TestFoldsAgree(t *testing.T) {
	facts := syntheticFacts(2000)
	live, decoded := newModel("s"), newModel("s")
	for i := range facts {
		e, ok := render(&facts[i])
		if !ok {
			continue
		}
		live.foldEvent(&e)
		data, _ := json.Marshal(&e)
		if err := decoded.fold(data); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := json.Marshal(live.snapshot())
	b, _ := json.Marshal(decoded.snapshot())
	if string(a) != string(b) {
		t.Fatalf("folds differ:\n%s\n%s", a, b)
	}
}
