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
	b = append(b, `{"id":`...)
	b = AppendJSONString(b, e.ID)
	b = append(b, `,"execution_id":`...)
	b = AppendJSONString(b, e.ExecutionID)
	if e.StepID != "" {
		b = append(b, `,"step_id":`...)
		b = AppendJSONString(b, e.StepID)
	}
	b = append(b, `,"type":`...)
	b = AppendJSONString(b, e.Type)
	b = append(b, `,"schema_version":`...)
	b = strconv.AppendInt(b, int64(e.SchemaVersion), 10)
	b = append(b, `,"timestamp":"`...)
	b = e.Timestamp.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","payload":`...)
	if len(e.Payload) == 0 {
		b = append(b, "null"...)
	} else {
		b = append(b, e.Payload...)
	}
	b = append(b, `,"causation_id":`...)
	b = AppendJSONString(b, e.CausationID)
	b = append(b, `,"correlation_id":`...)
	b = AppendJSONString(b, e.CorrelationID)
	b = append(b, `,"idempotency_key":`...)
	b = AppendJSONString(b, e.IdempotencyKey)
	b = append(b, `,"sequence":`...)
	b = strconv.AppendUint(b, e.Sequence, 10)
	b = append(b, `,"event_id":`...)
	b = AppendJSONString(b, e.EventID)
	b = appendOptional(b, `,"session_id":`, e.SessionID)
	b = append(b, `,"run_id":`...)
	b = AppendJSONString(b, e.RunID)
	b = appendOptional(b, `,"tool_call_id":`, e.ToolCallID)
	b = appendOptional(b, `,"action_id":`, e.ActionID)
	b = appendOptional(b, `,"trace_id":`, e.TraceID)
	if len(e.Refs) > 0 {
		refs, _ := json.Marshal(e.Refs)
		b = append(b, `,"refs":`...)
		b = append(b, refs...)
	}
	return append(b, '}')
}

func appendOptional(b []byte, key, v string) []byte {
	if v == "" {
		return b
	}
	return AppendJSONString(append(b, key...), v)
}

// appendString quotes s as encoding/json does (HTML-safe). Ids and type
// names take the fast path; anything else goes through encoding/json.
func AppendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if !jsonPlain[s[i]] {
			q, _ := json.Marshal(s)
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
