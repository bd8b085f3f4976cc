package event

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
)

// AppendJSON appends the event's JSON to b. It writes exactly what
// json.Marshal writes for an Event whose Payload is what json.Marshal
// produced (compact, HTML-escaped), without reflection and without
// re-validating the payload: events are encoded on the kernel's hottest path.
func (e *Event) AppendJSON(b []byte) []byte {
	var refs []byte
	if len(e.Refs) > 0 {
		refs, _ = json.Marshal(e.Refs)
	}
	return appendJSON(b, &envelope[string]{
		fields: [nStored]string{e.ID, e.EventID, e.Type, e.StepID, e.ToolCallID, e.RunID,
			e.CausationID, e.CorrelationID, e.SessionID, e.ActionID, e.TraceID, e.IdempotencyKey},
		exec: e.ExecutionID, refs: refs, schema: uint64(e.SchemaVersion), seq: e.Sequence,
		ts: e.Timestamp, payload: e.Payload,
	})
}

// envelope is what the JSON form of an event holds, its string fields as
// strings (an Event's) or as bytes (decoded from the stored form without a
// copy each), so that one writer renders both.
type envelope[S string | []byte] struct {
	fields  [nStored]S // in the stored order: see the sf constants
	plain   uint16     // bit i: fields[i] is known to need no escaping
	exec    S
	refs    []byte // the JSON of the refs, nil when none
	schema  uint64
	seq     uint64
	ts      time.Time
	payload []byte
}

// appendJSON writes v in the key order of Event's JSON form.
func appendJSON[S string | []byte](b []byte, v *envelope[S]) []byte {
	f := &v.fields
	b = append(b, `{"id":`...)
	b = v.appendField(b, sfID)
	b = append(b, `,"execution_id":`...)
	b = appendJSONString(b, v.exec)
	if len(f[sfStep]) > 0 {
		b = append(b, `,"step_id":`...)
		b = v.appendField(b, sfStep)
	}
	b = append(b, `,"type":`...)
	b = v.appendField(b, sfType)
	b = append(b, `,"schema_version":`...)
	b = strconv.AppendInt(b, int64(v.schema), 10)
	b = append(b, `,"timestamp":"`...)
	b = appendTimestamp(b, v.ts)
	b = append(b, `","payload":`...)
	if len(v.payload) == 0 {
		b = append(b, "null"...)
	} else {
		b = append(b, v.payload...)
	}
	b = append(b, `,"causation_id":`...)
	b = v.appendField(b, sfCause)
	b = append(b, `,"correlation_id":`...)
	b = v.appendField(b, sfCorrelation)
	b = append(b, `,"idempotency_key":`...)
	b = v.appendField(b, sfIdempotency)
	b = append(b, `,"sequence":`...)
	b = strconv.AppendUint(b, v.seq, 10)
	b = append(b, `,"event_id":`...)
	b = v.appendField(b, sfEventID)
	b = v.appendOptional(b, `,"session_id":`, sfSession)
	b = append(b, `,"run_id":`...)
	b = v.appendField(b, sfRun)
	b = v.appendOptional(b, `,"tool_call_id":`, sfToolCall)
	b = v.appendOptional(b, `,"action_id":`, sfAction)
	b = v.appendOptional(b, `,"trace_id":`, sfTrace)
	if len(v.refs) > 0 {
		b = append(b, `,"refs":`...)
		b = append(b, v.refs...)
	}
	return append(b, '}')
}

// appendField quotes field i. A field the stored form shows to be plain
// (hex, a UUID, a kernel type) is not scanned: most of an event's strings
// are such ids, and the scan was a tenth of a replay's CPU.
func (v *envelope[S]) appendField(b []byte, i int) []byte {
	if v.plain&(1<<i) != 0 {
		b = append(b, '"')
		b = append(b, v.fields[i]...)
		return append(b, '"')
	}
	return appendJSONString(b, v.fields[i])
}

// appendOptional writes key and field i, when the field is not empty.
func (v *envelope[S]) appendOptional(b []byte, key string, i int) []byte {
	if len(v.fields[i]) == 0 {
		return b
	}
	return v.appendField(append(b, key...), i)
}

// AppendJSONString quotes s as encoding/json does (HTML-safe). Ids and
// type names take the fast path; anything else goes through encoding/json.
func AppendJSONString(b []byte, s string) []byte { return appendJSONString(b, s) }

func appendJSONString[S string | []byte](b []byte, s S) []byte {
	for i := 0; i < len(s); i++ {
		if !jsonPlain[s[i]] {
			q, _ := json.Marshal(string(s))
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// jsonPlain marks the bytes encoding/json writes as they are in a string:
// printable ASCII but the quote, the backslash and the HTML-escaped <, >
// and &. One lookup a byte is what keeps a replay's rendering cheap.
var jsonPlain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = true
	}
	for _, c := range `"\<>&` {
		t[c] = false
	}
	return t
}()
