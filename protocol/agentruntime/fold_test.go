package agentruntime

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/session"
)

// appendFact appends to facts the next event of execution x, of type typ
// for step (and its tool call) and action, as session s's log refers to
// it: one turn t on thread main, at a fixed time.
func appendFact(facts []fact, typ, step, action, payload string) []fact {
	at := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	seq := uint64(len(facts) + 1)
	return append(facts, fact{sessionID: "s", item: session.Item{Seq: seq, Kind: session.KindEvent, At: at, ThreadID: "main", TurnID: "t", ExecutionID: "x", ExecutionSeq: seq},
		event: &event.Event{ID: "e" + strconv.Itoa(int(seq)), ExecutionID: "x", RunID: "x", StepID: step, ToolCallID: step, ActionID: action, Type: typ, Timestamp: at, Sequence: seq, Payload: json.RawMessage(payload)}})
}

// syntheticFacts is a session log of n facts: a turn whose execution calls
// tools in a loop, as the gateway reads it.
func syntheticFacts(n int) []fact {
	facts := make([]fact, 0, n)
	add := func(typ, step string, payload string) { facts = appendFact(facts, typ, step, "", payload) }
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
	live, decoded := newModel("s"), newModel("s")
	foldRendered(t, syntheticFacts(2000), live, decoded)
	a, _ := json.Marshal(live.snapshot())
	b, _ := json.Marshal(decoded.snapshot())
	if string(a) != string(b) {
		t.Fatalf("folds differ:\n%s\n%s", a, b)
	}
}

// factsFrom builds a session log from arbitrary bytes: each byte picks the
// next kernel fact among those the renderer maps (tools, jobs, prompts,
// input requests, signals, the execution's ends), so that the property
// below sees logs no scenario writes.
func factsFrom(data []byte) []fact {
	templates := []struct{ typ, payload string }{
		{event.StepCreated, `{"tool_id":"search","arguments":{"q":1},"attempt":1,"max_attempts":3,"remote":true}`},
		{event.StepDispatched, `{"runner_id":"r","job_id":"j"}`},
		{event.StepStarted, `{}`},
		{event.StepCompleted, `{"result":{"hits":3}}`},
		{event.StepFailed, `{"error":"boom","retryable":true}`},
		{event.StepRetried, `{"attempt":2}`},
		{event.StepApprovalRequired, `{"tool_id":"deploy","arguments":{},"reason":"ask","rule_id":"r1"}`},
		{event.PermissionRequested, `{"tool_id":"deploy","reason":"ask","rule_id":"r1"}`},
		{event.PermissionResolved, `{"outcome":"allowed","decision":"allow_once"}`},
		{event.ExecutionBlocked, `{"reason":"approval","ref":"s"}`},
		{event.ExecutionBlocked, `{"reason":"signal","ref":"form"}`},
		{event.IntentAccepted, `{"intent_type":"wait","details":{"signal_type":"form"}}`},
		{event.ExecutionResumed, `{"reason":"signal received: form"}`},
		{event.ExecutionResumed, `{"reason":"approved"}`},
		{event.SignalReceived, `{"signal_type":"form","payload":{"a":1}}`},
		{event.ExecutionCompleted, `{"output":{"ok":true}}`},
	}
	facts := appendFact(nil, event.ExecutionCreated, "", "", `{"agent_id":"a","input":null}`)
	facts = appendFact(facts, event.ExecutionStarted, "", "", `{}`)
	for i, b := range data {
		tp := templates[int(b)%len(templates)]
		step := "s" + strconv.Itoa(int(b)/len(templates)%4)
		action := ""
		if tp.typ == event.StepApprovalRequired || tp.typ == event.PermissionResolved || tp.typ == event.PermissionRequested {
			action = "act-" + step
		}
		facts = appendFact(facts, tp.typ, step, action, tp.payload)
		if i > 2000 {
			break
		}
	}
	return facts
}

// FuzzReplayRebuildsReadModels is the export's promise as a property: for
// any log, folding its events as exported (JSON) rebuilds byte-identical
// read models to the gateway's own fold, and folding is deterministic.
func FuzzReplayRebuildsReadModels(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3})
	f.Add([]byte{6, 7, 9, 8, 13, 0, 1, 3, 15})
	f.Add([]byte{11, 10, 14, 12, 11, 10, 14, 12, 15})
	f.Fuzz(func(t *testing.T, data []byte) {
		live, decoded, again := newModel("s"), newModel("s"), newModel("s")
		foldRendered(t, factsFrom(data), live, decoded, again)
		a, _ := json.Marshal(live.snapshot())
		b, _ := json.Marshal(decoded.snapshot())
		c, _ := json.Marshal(again.snapshot())
		if string(a) != string(b) || string(b) != string(c) {
			t.Fatalf("replay differs:\n%s\n%s", a, b)
		}
	})
}

// foldRendered renders facts into events and folds each into live
// directly, as the gateway does, and into every model of decoded from its
// JSON, as a client replaying an export does.
func foldRendered(t testing.TB, facts []fact, live *model, decoded ...*model) {
	t.Helper()
	for i := range facts {
		e, ok := render(&facts[i])
		if !ok {
			continue
		}
		live.foldEvent(&e)
		data, err := json.Marshal(&e)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range decoded {
			if err := m.fold(data); err != nil {
				t.Fatal(err)
			}
		}
	}
}
