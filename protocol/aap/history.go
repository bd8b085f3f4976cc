package aap

import (
	"encoding/json"
	"strings"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/session"
)

// Message is an AAP history message: role system, user, assistant or
// tool. Content is a string or an array of content blocks.
type Message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCallID string          `json:"toolCallId,omitempty"`
}

// block is an assistant content block.
type block struct {
	Type       string          `json:"type"`
	Text       string          `json:"text,omitempty"`
	Thinking   string          `json:"thinking,omitempty"`
	ToolCallID string          `json:"toolCallId,omitempty"`
	Name       string          `json:"name,omitempty"`
	Input      json.RawMessage `json:"input,omitempty"`
}

// turnInput is what a turn of an AAP session submits: the messages the
// client sent (the seed history on PUT), and, in an execution's input, the
// session and turn the agent works for.
type turnInput struct {
	AAP struct {
		SessionID string            `json:"sessionId,omitempty"`
		TurnID    string            `json:"turnId,omitempty"`
		Messages  []json.RawMessage `json:"messages"`
	} `json:"aap"`
}

// historian folds a session's log into its AAP history: the messages the
// clients submitted, the assistant's text, thinking and tool calls, and the
// tools' results. Permission answers are never part of it.
type historian struct {
	out       []Message
	blocks    []block
	deltas    map[string]*strings.Builder // pending deltas by output kind
	deltaKind []string                    // the order they came in
}

func (h *historian) closeAssistant() {
	h.flushDeltas()
	if len(h.blocks) == 0 {
		return
	}
	data, _ := json.Marshal(h.blocks)
	h.out = append(h.out, Message{Role: "assistant", Content: data})
	h.blocks = nil
}

// flushDeltas turns deltas that no whole text followed into blocks.
func (h *historian) flushDeltas() {
	for _, kind := range h.deltaKind {
		text := h.deltas[kind].String()
		if kind == "reasoning_delta" {
			h.blocks = append(h.blocks, block{Type: "thinking", Thinking: text})
		} else {
			h.blocks = append(h.blocks, block{Type: "text", Text: text})
		}
	}
	h.deltas, h.deltaKind = nil, nil
}

func (h *historian) add(f *session.Resolved) {
	it := &f.Item
	switch it.Kind {
	case session.KindDelta:
		if h.deltas == nil {
			h.deltas = map[string]*strings.Builder{}
		}
		b := h.deltas[it.Type]
		if b == nil {
			b = &strings.Builder{}
			h.deltas[it.Type] = b
			h.deltaKind = append(h.deltaKind, it.Type)
		}
		b.WriteString(it.Text)
		return
	case session.KindFact:
		switch it.Type {
		case session.FactTurnSubmitted:
			var p session.TurnFact
			_ = json.Unmarshal(it.Data, &p)
			var in turnInput
			if json.Unmarshal(p.Input, &in) != nil {
				return
			}
			h.closeAssistant()
			for _, raw := range in.AAP.Messages {
				var m Message
				if json.Unmarshal(raw, &m) == nil && m.Role != "tool_permission" {
					h.out = append(h.out, m)
				}
			}
		case session.FactOutput:
			var o session.OutputFact
			_ = json.Unmarshal(it.Data, &o)
			switch o.Kind {
			case "text":
				h.dropDeltas("text_delta")
				h.blocks = append(h.blocks, block{Type: "text", Text: o.Text})
			case "reasoning":
				h.dropDeltas("reasoning_delta")
				h.blocks = append(h.blocks, block{Type: "thinking", Thinking: o.Text})
			}
		case session.FactTurnCompleted, session.FactTurnFailed, session.FactTurnCancelled:
			h.closeAssistant()
		}
		return
	}
	e := f.Event
	if e == nil {
		return
	}
	switch e.Type {
	case event.StepCreated:
		var p stepCreated
		_ = json.Unmarshal(e.Payload, &p)
		h.flushDeltas()
		h.blocks = append(h.blocks, block{Type: "tool_use", ToolCallID: e.StepID, Name: p.ToolID, Input: objectOf(p.Arguments)})
	case event.StepCompleted, event.StepFailed, event.StepTimedOut:
		var p stepResult
		_ = json.Unmarshal(e.Payload, &p)
		if p.Retryable {
			return
		}
		h.closeAssistant()
		content, _ := json.Marshal(toolContent(e.Type, p))
		h.out = append(h.out, Message{Role: "tool", ToolCallID: e.StepID, Content: content})
	}
}

// dropDeltas forgets deltas that a whole block of the same text replaces.
func (h *historian) dropDeltas(kind string) {
	if h.deltas[kind] == nil {
		return
	}
	delete(h.deltas, kind)
	for i, k := range h.deltaKind {
		if k == kind {
			h.deltaKind = append(h.deltaKind[:i], h.deltaKind[i+1:]...)
			break
		}
	}
}

// messages returns the history so far, the open assistant message
// included.
func (h *historian) messages() []Message {
	cp := *h
	cp.out = append([]Message(nil), h.out...)
	cp.blocks = append([]block(nil), h.blocks...)
	cp.closeAssistant()
	if cp.out == nil {
		return []Message{}
	}
	return cp.out
}

// compactedWindow is how many messages compacted history keeps: the last
// ones, never starting with a tool message.
const compactedWindow = 10

func compacted(all []Message) []Message {
	if len(all) <= compactedWindow {
		return all
	}
	out := all[len(all)-compactedWindow:]
	for len(out) > 0 && out[0].Role == "tool" {
		out = out[1:]
	}
	return out
}
