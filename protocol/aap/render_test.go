package aap

import (
	"encoding/json"
	"reflect"
	"strconv"
	"testing"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/session"
)

// said is one thing an agent says in a turn: a delta (kind text_delta or
// reasoning_delta), a whole block (text or reasoning), a tool call and its
// result ("tool").
type said struct{ kind, text string }

// facts are the session log of a turn in which an agent says what.
func facts(what []said) []session.Resolved {
	var out []session.Resolved
	add := func(it session.Item, ev *event.Event) {
		it.Seq, it.TurnID = uint64(len(out)+1), "t1"
		out = append(out, session.Resolved{Item: it, Event: ev})
	}
	for i, w := range what {
		switch w.kind {
		case "text_delta", "reasoning_delta":
			add(session.Item{Kind: session.KindDelta, Type: w.kind, Text: w.text}, nil)
		case "text", "reasoning":
			data, _ := json.Marshal(session.OutputFact{Kind: w.kind, Text: w.text})
			add(session.Item{Kind: session.KindFact, Type: session.FactOutput, Data: data}, nil)
		case "tool":
			step := "s" + strconv.Itoa(i)
			add(session.Item{Kind: session.KindEvent}, &event.Event{Type: event.StepCreated, StepID: step, Payload: json.RawMessage(`{"tool_id":"echo","arguments":{}}`)})
			add(session.Item{Kind: session.KindEvent}, &event.Event{Type: event.StepCompleted, StepID: step, Payload: json.RawMessage(`{"result":"` + w.text + `"}`)})
		}
	}
	add(session.Item{Kind: session.KindEvent}, &event.Event{Type: event.ExecutionCompleted})
	add(session.Item{Kind: session.KindFact, Type: session.FactTurnCompleted}, nil)
	return out
}

// clientFold folds events as the official AAP client does (typescript-sdk
// core, sseEventsToMessages): deltas accumulate until any other event,
// which ends the text block first and then the thinking one.
func clientFold(evs []sseEvent) []Message {
	var out []Message
	var blocks []block
	var text, thinking string
	closeMsg := func() {
		if len(blocks) > 0 {
			data, _ := json.Marshal(blocks)
			out = append(out, Message{Role: "assistant", Content: data})
			blocks = nil
		}
	}
	for _, e := range evs {
		d, _ := e.data.(map[string]string)
		if e.name != "text_delta" && e.name != "thinking_delta" {
			if text != "" {
				blocks = append(blocks, block{Type: "text", Text: text})
				text = ""
			}
			if thinking != "" {
				blocks = append(blocks, block{Type: "thinking", Thinking: thinking})
				thinking = ""
			}
		}
		switch e.name {
		case "text_delta":
			text += d["delta"]
		case "thinking_delta":
			thinking += d["delta"]
		case "text":
			blocks = append(blocks, block{Type: "text", Text: d["text"]})
		case "thinking":
			blocks = append(blocks, block{Type: "thinking", Thinking: d["thinking"]})
		case "tool_call":
			m := e.data.(map[string]any)
			blocks = append(blocks, block{Type: "tool_use", ToolCallID: m["toolCallId"].(string), Name: m["name"].(string), Input: m["input"].(json.RawMessage)})
		case "tool_result":
			closeMsg()
			m := e.data.(map[string]any)
			content, _ := json.Marshal(m["content"])
			out = append(out, Message{Role: "tool", ToolCallID: m["toolCallId"].(string), Content: content})
		case "turn_stop":
			closeMsg()
		}
	}
	return out
}

// TestStreamFoldsIntoTheServersHistory: whatever order an agent says its
// deltas and blocks in, a client folding the delta stream as the official
// client does holds exactly the history the server keeps; a client of
// message mode does too when the agent says every block whole, as the
// surface asks. Every event has an id of its own, in order.
func TestStreamFoldsIntoTheServersHistory(t *testing.T) {
	for _, tc := range []struct {
		name  string
		said  []said
		whole bool // every run is completed by its whole block
	}{
		{"reasoning whole, then text deltas and whole (the example agent)",
			[]said{{"reasoning", "R"}, {"text_delta", "He"}, {"text_delta", "llo"}, {"text", "Hello"}}, true},
		{"each block's deltas then the block",
			[]said{{"reasoning_delta", "R1"}, {"reasoning_delta", "R2"}, {"reasoning", "R1R2"}, {"text_delta", "T"}, {"text", "T"}}, true},
		{"every delta, then every block",
			[]said{{"reasoning_delta", "R"}, {"text_delta", "T1"}, {"text_delta", "T2"}, {"reasoning", "R"}, {"text", "T1T2"}}, true},
		{"a whole that says more than its deltas",
			[]said{{"text_delta", "Hel"}, {"text", "Hello"}}, true},
		{"deltas alone, alternating",
			[]said{{"reasoning_delta", "R1"}, {"text_delta", "T1"}, {"reasoning_delta", "R2"}, {"text_delta", "T2"}}, false},
		{"text deltas then thinking deltas",
			[]said{{"text_delta", "T"}, {"reasoning_delta", "R"}}, false},
		{"whole blocks alone",
			[]said{{"text", "A"}, {"reasoning", "R"}, {"text", "B"}}, true},
		{"two text blocks, each streamed",
			[]said{{"text_delta", "A"}, {"text", "A"}, {"text_delta", "B"}, {"text", "B"}}, true},
		{"thinking, a tool, then text",
			[]said{{"reasoning_delta", "R"}, {"reasoning", "R"}, {"tool", "42"}, {"reasoning_delta", "S"}, {"text_delta", "T"}, {"reasoning", "S"}, {"text", "T"}}, true},
		{"empty text says nothing",
			[]said{{"text_delta", ""}, {"reasoning", ""}, {"text", "A"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := facts(tc.said)
			var h historian
			for i := range fs {
				h.add(&fs[i])
			}
			want := h.messages()
			modes := []string{modeDelta}
			if tc.whole {
				modes = append(modes, modeMessage)
			}
			for _, mode := range modes {
				r := newTurnRender(mode)
				var evs []sseEvent
				for i := range fs {
					evs = r.events(&fs[i], evs)
				}
				var last position
				for i, e := range evs {
					if !e.id.after(last) {
						t.Fatalf("%s: event %d (%s) at %s, not after %s", mode, i, e.name, e.id.appendTo(nil), last.appendTo(nil))
					}
					last = e.id
				}
				if got := clientFold(evs); !reflect.DeepEqual(got, want) {
					gj, _ := json.Marshal(got)
					wj, _ := json.Marshal(want)
					t.Fatalf("%s: the client holds\n%s\nthe server\n%s", mode, gj, wj)
				}
			}
		})
	}
}

// TestPositionsReadAsSent: an id reads back as the position it was sent
// for; anything else is refused.
func TestPositionsReadAsSent(t *testing.T) {
	for _, p := range []position{{7, 0}, {7, subSessionStart}, {7, subTurnStart}, {7, subBlockEnd}, {1<<64 - 1, 0}} {
		if got, err := parsePosition(string(p.appendTo(nil))); err != nil || got != p {
			t.Fatalf("%s read as %+v, %v", p.appendTo(nil), got, err)
		}
	}
	for _, bad := range []string{"", "x", "x.y", "5.", "5.0", "5.4", ".1", "-1", "+5", "18446744073709551616", "5.1.1"} {
		if _, err := parsePosition(bad); err == nil {
			t.Fatalf("%q read as a position", bad)
		}
	}
}
