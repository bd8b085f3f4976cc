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
	b = appendJSONString(b, f[sfID])
	b = append(b, `,"execution_id":`...)
	b = appendJSONString(b, v.exec)
	if len(f[sfStep]) > 0 {
		b = append(b, `,"step_id":`...)
		b = appendJSONString(b, f[sfStep])
	}
	b = append(b, `,"type":`...)
	b = appendJSONString(b, f[sfType])
	b = append(b, `,"schema_version":`...)
	b = strconv.AppendInt(b, int64(v.schema), 10)
	b = append(b, `,"timestamp":"`...)
	b = v.ts.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","payload":`...)
	if len(v.payload) == 0 {
		b = append(b, "null"...)
	} else {
		b = append(b, v.payload...)
	}
	b = append(b, `,"causation_id":`...)
	b = appendJSONString(b, f[sfCause])
	b = append(b, `,"correlation_id":`...)
	b = appendJSONString(b, f[sfCorrelation])
	b = append(b, `,"idempotency_key":`...)
	b = appendJSONString(b, f[sfIdempotency])
	b = append(b, `,"sequence":`...)
	b = strconv.AppendUint(b, v.seq, 10)
	b = append(b, `,"event_id":`...)
	b = appendJSONString(b, f[sfEventID])
	b = appendOptional(b, `,"session_id":`, f[sfSession])
	b = append(b, `,"run_id":`...)
	b = appendJSONString(b, f[sfRun])
	b = appendOptional(b, `,"tool_call_id":`, f[sfToolCall])
	b = appendOptional(b, `,"action_id":`, f[sfAction])
	b = appendOptional(b, `,"trace_id":`, f[sfTrace])
	if len(v.refs) > 0 {
		b = append(b, `,"refs":`...)
		b = append(b, v.refs...)
	}
	return append(b, '}')
}

func appendOptional[S string | []byte](b []byte, key string, v S) []byte {
	if len(v) == 0 {
		return b
	}
	return appendJSONString(append(b, key...), v)
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
