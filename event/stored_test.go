package event

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"
)

// kernelEvent is shaped like the events the kernel writes: UUIDv7 ids, the
// execution id as run id, the step as tool call.
func kernelEvent() Event {
	id, exec, step := NewID(), NewID(), NewID()
	return Event{ID: id, EventID: id, ExecutionID: exec, RunID: exec, StepID: step, ToolCallID: step,
		Type: StepCompleted, SchemaVersion: SchemaVersion, Timestamp: time.Now().UTC(),
		Payload:     json.RawMessage(`{"step_id":"` + step + `","output":{"hits":3}}`),
		CausationID: NewID(), CorrelationID: id, IdempotencyKey: "result-7", Sequence: 9,
		SessionID: "sess-" + exec, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"}
}

// TestStoredRoundTrip: the JSON rendered from the stored form is exactly the
// JSON of the event that was stored, whatever its fields hold.
func TestStoredRoundTrip(t *testing.T) {
	events := sampleEvents()
	maps.Copy(events, map[string]Event{
		"kernel": kernelEvent(),
		"uppercase uuid and hex stay strings": {ID: "0193A1B2-C3D4-7E5F-8A9B-0C1D2E3F4A5B", ExecutionID: "x",
			Type: SignalReceived, TraceID: "4BF92F3577B34DA6A3CE929D0E0E4736", Timestamp: time.Unix(-5, 7).UTC()},
		"run id differs from execution": {ID: "a", ExecutionID: "x", RunID: "other", StepID: "a", ToolCallID: "a", Type: "t"},
		"strings holding the execution id": {ID: "a", ExecutionID: "exec-0001", Type: "t", SessionID: "sess-exec-0001",
			IdempotencyKey: "exec-0001:tool:exec-0001", TraceID: "pre-exec-0001", ActionID: "exec-000"},
		"fields past the decoder's stack room": {ID: "a", ExecutionID: "x", Type: "t",
			IdempotencyKey: strings.Repeat("k", storedScratch), SessionID: strings.Repeat("s", 300)},
		"copies of fields that need escaping are escaped": {ID: `a"<b>&`, ExecutionID: "x\u2028y\"", Type: "t",
			StepID: `a"<b>&`, ToolCallID: `a"<b>&`, CausationID: "c\n", CorrelationID: "c\n", RunID: "x\u2028y\"",
			SessionID: "x\u2028y\"", IdempotencyKey: "\x00"},
		"copies of plain fields": {ID: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", ExecutionID: "x", Type: SignalReceived,
			StepID: "4bf92f3577b34da6a3ce929d0e0e4736", ToolCallID: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
			RunID: "4bf92f3577b34da6a3ce929d0e0e4736", CausationID: "4bf92f3577b34da6a3ce929d0e0e4736",
			CorrelationID: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", EventID: SignalReceived},
		"short execution id is not referred to": {ID: "a", ExecutionID: "x", Type: "t", SessionID: "sess-x"},
		"correlation is the cause": {ID: "a", ExecutionID: "x", Type: "t", CausationID: "c", CorrelationID: "c",
			SessionID: "c", IdempotencyKey: "c"},
		"timestamp outside UTC": {ID: "a", ExecutionID: "x", Type: "t",
			Timestamp: time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("X", 3600))},
	})
	for name, ev := range events {
		t.Run(name, func(t *testing.T) {
			stored := ev.AppendStored(nil)
			got, typ, err := AppendStoredJSON(nil, stored, ev.ExecutionID)
			if err != nil {
				t.Fatal(err)
			}
			if typ != ev.Type {
				t.Fatalf("type %q, want %q", typ, ev.Type)
			}
			ev.Timestamp = ev.Timestamp.UTC()
			if want := ev.AppendJSON(nil); string(got) != string(want) {
				t.Fatalf("rendered\n got  %s\n want %s", got, want)
			}
		})
	}
}

// TestStoredIsCompact: the stored form of a typical kernel event is well
// under half its JSON form, which is the point of having it.
func TestStoredIsCompact(t *testing.T) {
	ev := kernelEvent()
	stored, js := len(ev.AppendStored(nil)), len(ev.AppendJSON(nil))
	if stored*2 > js {
		t.Fatalf("stored form is %d bytes, JSON %d", stored, js)
	}
}

// TestStoredGolden pins the stored form: events already on disk must keep
// decoding, so a change to the field tags or the type table fails here.
func TestStoredGolden(t *testing.T) {
	ev := Event{ID: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", ExecutionID: "x", RunID: "x", Type: PermissionResolved,
		SchemaVersion: 1, Sequence: 3, StepID: "s1", ToolCallID: "s1", CausationID: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", Timestamp: time.Unix(1700000000, 5).UTC(), Payload: json.RawMessage(`{}`)}
	const golden = "01" + // format
		"04" + "0193a1b2c3d47e5f8a9b0c1d2e3f4a5b" + // id: a UUID
		"00" + // event id: empty
		"0616" + // type: storedTypes[22]
		"07027331" + // step: the string "s1"
		"02" + "03" + "01" + // tool call = step, run = execution, causation = id
		"00" + "00" + "00" + // correlation, session, action: empty
		"05" + "4bf92f3577b34da6a3ce929d0e0e4736" + // trace: 16 bytes of hex
		"00" + "00" + // idempotency key, refs: empty
		"01" + "03" + "80c49fd50c" + "05" + // schema, sequence, seconds (zigzag), nanoseconds
		"7b7d" // payload
	got := hex.EncodeToString(ev.AppendStored(nil))
	if got != golden {
		t.Fatalf("stored form changed:\n got  %s\n want %s", got, golden)
	}
}

// TestStoredGoldenReferences pins the references added after the first
// release of the stored form: a correlation equal to the cause, and strings
// that hold the execution id. Events stored without them still decode
// (TestStoredGolden).
func TestStoredGoldenReferences(t *testing.T) {
	const exec = "0193a1b2-c3d4-7e5f-8a9b-000000000001"
	ev := Event{ID: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", ExecutionID: exec, Type: ExecutionStarted,
		CausationID: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5c", CorrelationID: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5c",
		SessionID: "sess-" + exec, IdempotencyKey: exec + ":k",
		SchemaVersion: 1, Sequence: 2, Timestamp: time.Unix(1700000000, 5).UTC()}
	const golden = "01" + // format
		"04" + "0193a1b2c3d47e5f8a9b0c1d2e3f4a5b" + // id: a UUID
		"00" + // event id: empty
		"0601" + // type: storedTypes[1]
		"00" + "00" + "00" + // step, tool call, run: empty
		"04" + "0193a1b2c3d47e5f8a9b0c1d2e3f4a5c" + // causation: a UUID
		"08" + // correlation = causation
		"09" + "05" + "736573732d" + "00" + // session: "sess-", the execution, ""
		"00" + "00" + // action, trace: empty
		"09" + "00" + "02" + "3a6b" + // idempotency key: "", the execution, ":k"
		"00" + // refs: empty
		"01" + "02" + "80c49fd50c" + "05" // schema, sequence, seconds (zigzag), nanoseconds
	stored := ev.AppendStored(nil)
	if got := hex.EncodeToString(stored); got != golden {
		t.Fatalf("stored form changed:\n got  %s\n want %s", got, golden)
	}
	got, _, err := AppendStoredJSON(nil, stored, exec)
	if err != nil {
		t.Fatal(err)
	}
	if want := ev.AppendJSON(nil); string(got) != string(want) {
		t.Fatalf("rendered\n got  %s\n want %s", got, want)
	}
}

func TestDecodeStoredReadsJSONForm(t *testing.T) {
	ev := kernelEvent()
	js := ev.AppendJSON(nil)
	got, err := DecodeStored(js, ev.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.AppendJSON(nil)) != string(js) {
		t.Fatalf("JSON form decoded to %+v", got)
	}
	out, typ, err := AppendStoredJSON([]byte("x"), js, ev.ExecutionID)
	if err != nil || string(out) != "x"+string(js) || typ != ev.Type {
		t.Fatalf("AppendStoredJSON of the JSON form: %s, %q, %v", out, typ, err)
	}
	for _, c := range []struct{ data, want string }{
		{`{"id":"a","type":"custom.kind","payload":{"type":"x"}}`, "custom.kind"},
		{`{"id":"a","payload":{}}`, ""},
		{`{"id":"a","type":"cut`, ""},
	} {
		if _, typ, err := AppendStoredJSON(nil, []byte(c.data), "x"); err != nil || typ != c.want {
			t.Errorf("type of %s: %q, %v; want %q", c.data, typ, err, c.want)
		}
	}
}

// TestDecodeStoredRejectsDamage: every truncation and a few corruptions are
// ErrCorrupt, never a panic.
func TestDecodeStoredRejectsDamage(t *testing.T) {
	ev := kernelEvent()
	stored := ev.AppendStored(nil)
	payloadAt := len(stored) - len(ev.Payload)
	for n := range payloadAt {
		if _, err := DecodeStored(stored[:n], "x"); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d bytes: err %v", n, err)
		}
	}
	for name, data := range map[string][]byte{
		"unknown format": {0x09, 0},
		"bad tag":        {storedFormat, 0x7f},
		"type index":     {storedFormat, fieldType, 0xff},
		"string length":  {storedFormat, fieldString, 0xff, 0x01},
		"exec reference": {storedFormat, fieldWithExec, 0x01},
		"bad JSON":       []byte(`{"id":`),
	} {
		if _, err := DecodeStored(data, "x"); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err %v", name, err)
		}
	}
}

func FuzzDecodeStored(f *testing.F) {
	ev := kernelEvent()
	f.Add(ev.AppendStored(nil))
	f.Add([]byte{storedFormat})
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := DecodeStored(data, "x")
		if err != nil {
			return
		}
		// Whatever decodes renders, and its stored form decodes the same.
		// (The JSON form carries its own execution id.)
		ev.ExecutionID = "x"
		again, err := DecodeStored(ev.AppendStored(nil), "x")
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if string(again.AppendJSON(nil)) != string(ev.AppendJSON(nil)) {
			t.Fatalf("unstable: %s vs %s", again.AppendJSON(nil), ev.AppendJSON(nil))
		}
	})
}

func BenchmarkAppendStored(b *testing.B) {
	ev := kernelEvent()
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = ev.AppendStored(buf[:0])
	}
}

// BenchmarkAppendStoredJSON is the rendering a replay does per event: the
// stored form back to the JSON clients read.
func BenchmarkAppendStoredJSON(b *testing.B) {
	ev := kernelEvent()
	stored := ev.AppendStored(nil)
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, _, err = AppendStoredJSON(buf[:0], stored, ev.ExecutionID); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeStored is the kernel's read of a stored event.
func BenchmarkDecodeStored(b *testing.B) {
	ev := kernelEvent()
	stored := ev.AppendStored(nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeStored(stored, ev.ExecutionID); err != nil {
			b.Fatal(err)
		}
	}
}
