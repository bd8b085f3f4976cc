package event

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestEnvelopeShape pins the wire form: the kernel API's keys first, in its
// order, step_id left out when empty, then the Agent Runtime keys.
func TestEnvelopeShape(t *testing.T) {
	ev := Event{ID: "e1", ExecutionID: "x1", Type: ExecutionCreated, SchemaVersion: SchemaVersion,
		Timestamp: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), Payload: json.RawMessage(`{"a":1}`),
		CausationID: "e1", CorrelationID: "e1", Sequence: 1, EventID: "e1", RunID: "x1"}
	data, err := json.Marshal(&ev)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"e1","execution_id":"x1","type":"execution.created","schema_version":1,"timestamp":"2026-01-02T03:04:05.000000006Z","payload":{"a":1},"causation_id":"e1","correlation_id":"e1","idempotency_key":"","sequence":1,"event_id":"e1","run_id":"x1"}`
	if string(data) != want {
		t.Fatalf("envelope\n got  %s\n want %s", data, want)
	}
}

func TestIsTerminal(t *testing.T) {
	for typ, want := range map[string]bool{
		ExecutionCompleted: true, ExecutionFailed: true, ExecutionCancelled: true,
		ExecutionBlocked: false, StepFailed: false, "": false,
	} {
		if got := IsTerminal(typ); got != want {
			t.Errorf("IsTerminal(%q) = %v", typ, got)
		}
		if got := (&Event{Type: typ}).Terminal(); got != want {
			t.Errorf("Event{Type: %q}.Terminal() = %v", typ, got)
		}
	}
}

func TestNewIDIsTimeOrderedAndUnique(t *testing.T) {
	seen := map[string]bool{}
	prev := ""
	for range 1000 {
		id := NewID()
		if seen[id] || len(id) != 36 || strings.Count(id, "-") != 4 {
			t.Fatalf("bad or repeated id %q", id)
		}
		if id[:13] < prev[:min(13, len(prev))] {
			t.Fatalf("ids not time-ordered: %s after %s", id, prev)
		}
		seen[id], prev = true, id
	}
}

// sampleEvents are plain and awkward events for the encoder tests.
func sampleEvents() map[string]Event {
	return map[string]Event{
		"minimal": {ID: "a", ExecutionID: "x", Type: StepCreated, Payload: json.RawMessage(`{}`)},
		"full": {ID: "01a2-b", ExecutionID: "x", StepID: "s", Type: ExecutionBlocked, SchemaVersion: 1,
			Timestamp: time.Date(2026, 11, 21, 23, 0, 0, 123456789, time.UTC), Payload: json.RawMessage(`{"a":[1,"\u003cb\u003e"]}`),
			CausationID: "c", CorrelationID: "r", IdempotencyKey: "k", Sequence: 42, EventID: "01a2-b",
			SessionID: "sess-1", RunID: "x", ToolCallID: "s", ActionID: "act", TraceID: "4bf9",
			Refs: []Ref{{Kind: "execution.input", URI: "/v0/x", Bytes: 3}}},
		"escapes": {ID: "a", ExecutionID: "x", Type: "t", IdempotencyKey: "quote\" back\\ <tag> & ünïcode \u2028 \x01",
			SessionID: "tab\there", Payload: json.RawMessage(`null`)},
		"zero time and no payload": {ID: "a", ExecutionID: "x", Type: "t"},
	}
}

// TestAppendJSONMatchesMarshal: the hand-written encoder writes what
// encoding/json writes, for plain and awkward values.
func TestAppendJSONMatchesMarshal(t *testing.T) {
	for name, ev := range sampleEvents() {
		want, err := json.Marshal(&ev)
		if err != nil {
			t.Fatal(err)
		}
		if got := ev.AppendJSON(nil); string(got) != string(want) {
			t.Errorf("%s:\n got  %s\n want %s", name, got, want)
		}
	}
}

// jsonStrings are plain and awkward strings for the string writer.
var jsonStrings = []string{
	"", "plain", "0197a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "execution.completed", `quote " and \ backslash`,
	"new\nline\ttab\rcr\bback\fform", "\x00\x01\x1f\x7f", "é ü 日本 🙂", "bad \xff utf8 \xc3", "\u2028\u2029", "<tag> & more",
}

// TestAppendJSONStringMatchesMarshal: the string writer writes what
// encoding/json writes, byte for byte.
func TestAppendJSONStringMatchesMarshal(t *testing.T) {
	every := make([]string, 0, 256)
	for c := range 256 {
		every = append(every, "id-"+string([]byte{byte(c)})+"-x")
	}
	for _, s := range append(every, jsonStrings...) {
		want, _ := json.Marshal(s)
		if got := AppendJSONString([]byte("x"), s); string(got) != "x"+string(want) {
			t.Errorf("AppendJSONString(%q) = %s, want x%s", s, got, want)
		}
	}
}

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range jsonStrings {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := AppendJSONString(nil, s); string(got) != string(want) {
			t.Fatalf("AppendJSONString(%q) = %s, want %s", s, got, want)
		}
	})
}

// BenchmarkAppendJSONString compares the string writer with encoding/json
// on what it writes on the hot paths (ids and type names) and on a string
// that needs escaping:
//
//	go test -run '^$' -bench 'JSONString|EventJSON' -benchmem ./event/
func BenchmarkAppendJSONString(b *testing.B) {
	for _, c := range []struct{ name, s string }{
		{"id", NewID()},
		{"type", StepCompleted},
		{"escaped", `say "<hi>"` + "\n"},
	} {
		buf := make([]byte, 0, 128)
		b.Run(c.name+"/ours", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				buf = AppendJSONString(buf[:0], c.s)
			}
		})
		b.Run(c.name+"/encoding-json", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				q, _ := json.Marshal(c.s)
				buf = append(buf[:0], q...)
			}
		})
	}
}

// BenchmarkEventJSON renders one event, as every replay and stream read
// does, with the hand-written encoder and with encoding/json.
func BenchmarkEventJSON(b *testing.B) {
	ev := Event{ID: NewID(), ExecutionID: NewID(), StepID: NewID(), Type: StepCompleted, SchemaVersion: 1,
		Timestamp: time.Now(), Payload: json.RawMessage(`{"result":{"hits":3,"items":["a","b"]}}`),
		CausationID: NewID(), CorrelationID: NewID(), Sequence: 9, RunID: NewID(), SessionID: "sess-x"}
	ev.EventID = ev.ID
	buf := make([]byte, 0, 1024)
	b.Run("ours", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf = ev.AppendJSON(buf[:0])
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			q, _ := json.Marshal(&ev)
			buf = append(buf[:0], q...)
		}
	})
}
