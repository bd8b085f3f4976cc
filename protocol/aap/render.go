package aap

import (
	"encoding/json"
	"strings"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/session"
)

// Stream modes.
const (
	modeNone    = "none"
	modeMessage = "message"
	modeDelta   = "delta"
)

// Stop reasons.
const (
	stopEndTurn = "end_turn"
	stopToolUse = "tool_use"
	stopError   = "error"
)

// SignalTools is the signal an AAP agent waits on after asking for the
// client's tools (a wait intent): the client's answers resume it.
const SignalTools = "aap.tools"

// sseEvent is one AAP event: its name and data (never with an "event"
// key, which would override the name for the official client).
type sseEvent struct {
	name string
	data any
}

// Payloads of the kernel events the renderer reads, as /v0 documents them.
type (
	stepCreated struct {
		ToolID    string          `json:"tool_id"`
		Arguments json.RawMessage `json:"arguments"`
	}
	stepResult struct {
		Result    json.RawMessage `json:"result"`
		Error     string          `json:"error"`
		Retryable bool            `json:"retryable"`
	}
)

// render turns a fact of an AAP turn into the AAP event of the mode, if it
// has one. A pure function of the fact and the mode: the same fact
// renders the same bytes on every connection. end reports the turn's
// last event (turn_stop).
func render(f *session.Resolved, mode string) (ev sseEvent, show, end bool) {
	it := &f.Item
	switch it.Kind {
	case session.KindDelta:
		if mode != modeDelta {
			return sseEvent{}, false, false
		}
		name := map[string]string{"text_delta": "text_delta", "reasoning_delta": "thinking_delta"}[it.Type]
		return sseEvent{name, map[string]string{"delta": it.Text}}, name != "", false
	case session.KindFact:
		if it.Type != session.FactOutput || mode == modeDelta {
			return sseEvent{}, false, false
		}
		var o session.OutputFact
		_ = json.Unmarshal(it.Data, &o)
		switch o.Kind {
		case "text":
			return sseEvent{"text", map[string]string{"text": o.Text}}, true, false
		case "reasoning":
			return sseEvent{"thinking", map[string]string{"thinking": o.Text}}, true, false
		}
		return sseEvent{}, false, false
	}
	e := f.Event
	if e == nil {
		return sseEvent{}, false, false
	}
	switch e.Type {
	case event.StepCreated:
		var p stepCreated
		_ = json.Unmarshal(e.Payload, &p)
		return sseEvent{"tool_call", map[string]any{"toolCallId": e.StepID, "name": p.ToolID, "input": objectOf(p.Arguments)}}, true, false
	case event.StepCompleted, event.StepFailed, event.StepTimedOut:
		var p stepResult
		_ = json.Unmarshal(e.Payload, &p)
		if p.Retryable {
			return sseEvent{}, false, false // its retry goes on
		}
		return sseEvent{"tool_result", map[string]any{"toolCallId": e.StepID, "content": toolContent(e.Type, p)}}, true, false
	case event.ExecutionBlocked:
		return stop(stopToolUse), true, true
	case event.ExecutionCompleted:
		return stop(stopEndTurn), true, true
	case event.ExecutionFailed, event.ExecutionCancelled:
		return stop(stopError), true, true
	}
	return sseEvent{}, false, false
}

func stop(reason string) sseEvent {
	return sseEvent{"turn_stop", map[string]string{"stopReason": reason}}
}

// objectOf makes tool input a JSON object, as the client requires ({}
// when empty or not an object).
func objectOf(v json.RawMessage) json.RawMessage {
	if len(v) == 0 || v[0] != '{' {
		return json.RawMessage("{}")
	}
	return v
}

// toolContent is a tool's outcome as an AAP tool message's content: the
// result JSON-encoded into a string, or the failure said in words.
func toolContent(typ string, p stepResult) string {
	switch typ {
	case event.StepCompleted:
		if len(p.Result) == 0 {
			return "null"
		}
		var s string
		if json.Unmarshal(p.Result, &s) == nil {
			return s // a string result is the content as it is
		}
		return string(p.Result)
	case event.StepTimedOut:
		return "Tool failed: step timed out"
	}
	if strings.HasPrefix(p.Error, "approval denied") || strings.HasPrefix(p.Error, "approval expired") {
		return "Tool use denied: " + p.Error
	}
	return "Tool failed: " + p.Error
}
