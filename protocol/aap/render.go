package aap

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/protocol"
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

// sseEvent is one AAP event: its id, name and data (never with an "event"
// key, which would override the name for the official client).
type sseEvent struct {
	id   position
	name string
	data any
}

// position is an event's place in a turn's stream, its SSE id. An event
// that renders a fact of the session's log is at the fact's sequence
// ("17"); an event a stream adds is after the sequence it follows, by kind
// ("16.2"): no two events of a stream share an id, and each id says what
// follows it. Ids stay decimal sequences of the log for what the log
// holds, as they were; stock AAP clients ignore them.
type position struct {
	seq uint64
	sub uint8 // 0: the fact at seq; else one of the sub* kinds after it
}

// The kinds of events a stream adds, in the order they come after one
// sequence.
const (
	subSessionStart = 1 // session_start, opening a PUT's stream
	subTurnStart    = 2 // turn_start, opening every stream
	subBlockEnd     = 3 // block_end, before a delta that starts a block
)

// after reports whether p comes after q in a stream.
func (p position) after(q position) bool {
	return p.seq > q.seq || p.seq == q.seq && p.sub > q.sub
}

// appendTo appends p as an SSE id.
func (p position) appendTo(b []byte) []byte {
	b = strconv.AppendUint(b, p.seq, 10)
	if p.sub != 0 {
		b = append(b, '.')
		b = strconv.AppendUint(b, uint64(p.sub), 10)
	}
	return b
}

// parsePosition reads an id a stream sent: "<sequence>" or
// "<sequence>.<kind>".
func parsePosition(s string) (position, error) {
	seqText, subText, dotted := strings.Cut(s, ".")
	seq, err := strconv.ParseUint(seqText, 10, 64)
	if err != nil {
		return position{}, errBadPosition
	}
	if !dotted {
		return position{seq: seq}, nil
	}
	switch subText {
	case "1":
		return position{seq, subSessionStart}, nil
	case "2":
		return position{seq, subTurnStart}, nil
	case "3":
		return position{seq, subBlockEnd}, nil
	}
	return position{}, errBadPosition
}

// errBadPosition refuses a Last-Event-ID that no stream sent: taken as
// none, the turn would be replayed from its start into a client that has
// seen it.
var errBadPosition = protocol.Invalid(`Last-Event-ID must be an id the stream sent: "<sequence>" or "<sequence>.<n>"`)

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

// turnRender renders the facts of a turn, in order, in a stream mode. It
// folds them into the turn's history as the server keeps it (h), and, in
// delta mode, keeps what a client folding the stream holds: which block of
// h each of its text and thinking accumulators is filling. The official
// client folds a run of deltas into one text block followed by one
// thinking block, whatever their order, and ends them only at another
// event; a delta that would land in the wrong block (thinking followed by
// text, or a second block of a kind) is preceded by block_end, an event of
// Gatehouse's that ends them (a client ignores an event it does not know,
// and the official one ends its blocks at it). A client then holds exactly
// the server's history.
type turnRender struct {
	mode string
	h    historian
	acc  map[string]int // delta mode: block type -> index+1 in h.blocks of the block the client fills
}

func newTurnRender(mode string) turnRender {
	return turnRender{mode: mode, acc: map[string]int{}}
}

// events appends the events fact f renders into (none, one, or a
// block_end and a delta).
func (r *turnRender) events(f *session.Resolved, into []sseEvent) []sseEvent {
	it := &f.Item
	at := position{seq: it.Seq}
	switch {
	case it.Kind == session.KindDelta:
		typ := blockType(it.Type)
		if typ == "" || it.Text == "" {
			return into
		}
		i := r.h.delta(typ, it.Text)
		if r.mode != modeDelta {
			return into
		}
		return r.delta(into, at, typ, i, it.Text)
	case it.Kind == session.KindFact && it.Type == session.FactOutput:
		var o session.OutputFact
		_ = json.Unmarshal(it.Data, &o)
		typ := blockType(o.Kind)
		if typ == "" || o.Text == "" {
			return into
		}
		i, old, replaced := r.h.whole(typ, o.Text)
		switch {
		case r.mode == modeMessage:
			return append(into, sseEvent{at, typ, map[string]string{typ: o.Text}})
		case r.mode != modeDelta:
			return into
		case !replaced:
			return r.delta(into, at, typ, i, o.Text)
		case r.acc[typ] == i+1 && len(o.Text) > len(old) && strings.HasPrefix(o.Text, old):
			// The client has the run's deltas: it gets the rest. A
			// whole block that says what they said needs nothing more.
			return append(into, deltaEvent(at, typ, o.Text[len(old):]))
		}
		return into
	}
	r.h.add(f)
	ev, show := render(f)
	if !show {
		return into
	}
	clear(r.acc) // any other event ends the client's blocks
	ev.id = at
	return append(into, ev)
}

// delta appends the delta of block type typ that goes into h's block i,
// after a block_end when the client would fold it into another block, or
// put a text block before the thinking one it follows.
func (r *turnRender) delta(into []sseEvent, at position, typ string, i int, text string) []sseEvent {
	if cur := r.acc[typ]; cur != i+1 && (cur != 0 || typ == "text" && r.acc["thinking"] != 0) {
		into = append(into, sseEvent{position{at.seq - 1, subBlockEnd}, "block_end", map[string]any{}})
		clear(r.acc)
	}
	r.acc[typ] = i + 1
	return append(into, deltaEvent(at, typ, text))
}

func deltaEvent(at position, typ, text string) sseEvent {
	return sseEvent{at, typ + "_delta", map[string]string{"delta": text}}
}

// render turns an execution's event, filed in a turn, into its AAP event,
// if it has one. A pure function of the event: the same fact renders the
// same bytes on every connection.
func render(f *session.Resolved) (ev sseEvent, show bool) {
	e := f.Event
	if e == nil {
		return sseEvent{}, false
	}
	switch e.Type {
	case event.StepCreated:
		var p stepCreated
		_ = json.Unmarshal(e.Payload, &p)
		return sseEvent{name: "tool_call", data: map[string]any{"toolCallId": e.StepID, "name": p.ToolID, "input": objectOf(p.Arguments)}}, true
	case event.StepCompleted, event.StepFailed, event.StepTimedOut:
		var p stepResult
		_ = json.Unmarshal(e.Payload, &p)
		if p.Retryable {
			return sseEvent{}, false // its retry goes on
		}
		return sseEvent{name: "tool_result", data: map[string]any{"toolCallId": e.StepID, "content": toolContent(e.Type, p)}}, true
	case event.ExecutionBlocked:
		return stop(stopToolUse), true
	case event.ExecutionCompleted:
		return stop(stopEndTurn), true
	case event.ExecutionFailed, event.ExecutionCancelled:
		return stop(stopError), true
	}
	return sseEvent{}, false
}

func stop(reason string) sseEvent {
	return sseEvent{name: "turn_stop", data: map[string]string{"stopReason": reason}}
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
