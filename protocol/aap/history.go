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
//
// An assistant message's text and thinking blocks come in the order the
// agent said them. Deltas of one kind in a row make one block, a run; a
// delta of the other kind, or after a whole block, starts another. A whole
// block (an output of kind text or reasoning) completes the last run of its
// kind, taking its place, or else follows the blocks before it: an agent
// may say each block's deltas and then the block, or all deltas and then
// every block. Empty text says nothing.
type historian struct {
	out    []Message
	blocks []hblock
}

// hblock is a block of the open assistant message; run holds the deltas
// of a run that no whole block completed yet (nil otherwise).
type hblock struct {
	block
	run *strings.Builder
}

// blockType is the AAP block type an output kind says ("" for none).
func blockType(kind string) string {
	switch kind {
	case "text", "text_delta":
		return "text"
	case "reasoning", "reasoning_delta":
		return "thinking"
	}
	return ""
}

// textBlock is a block of type typ (text or thinking) saying text.
func textBlock(typ, text string) block {
	if typ == "thinking" {
		return block{Type: typ, Thinking: text}
	}
	return block{Type: typ, Text: text}
}

// final is the block as history shows it.
func (b *hblock) final() block {
	if b.run == nil {
		return b.block
	}
	return textBlock(b.Type, b.run.String())
}

func (h *historian) closeAssistant() {
	if len(h.blocks) == 0 {
		return
	}
	blocks := make([]block, len(h.blocks))
	for i := range h.blocks {
		blocks[i] = h.blocks[i].final()
	}
	data, _ := json.Marshal(blocks)
	h.out = append(h.out, Message{Role: "assistant", Content: data})
	h.blocks = nil
}

// delta adds a delta of block type typ to the open assistant message: to
// the run of that type that is its last block, or as a new run. It
// returns the run's index.
func (h *historian) delta(typ, text string) int {
	if n := len(h.blocks); n > 0 && h.blocks[n-1].run != nil && h.blocks[n-1].Type == typ {
		h.blocks[n-1].run.WriteString(text)
		return n - 1
	}
	run := &strings.Builder{}
	run.WriteString(text)
	h.blocks = append(h.blocks, hblock{block: block{Type: typ}, run: run})
	return len(h.blocks) - 1
}

// whole adds a whole block of type typ: in place of the last run of that
// type, whose text was old (replaced), or after the other blocks. It
// returns the block's index.
func (h *historian) whole(typ, text string) (i int, old string, replaced bool) {
	for i := len(h.blocks) - 1; i >= 0; i-- {
		if b := &h.blocks[i]; b.run != nil && b.Type == typ {
			old = b.run.String()
			*b = hblock{block: textBlock(typ, text)}
			return i, old, true
		}
	}
	h.blocks = append(h.blocks, hblock{block: textBlock(typ, text)})
	return len(h.blocks) - 1, "", false
}

func (h *historian) add(f *session.Resolved) {
	it := &f.Item
	switch it.Kind {
	case session.KindDelta:
		if typ := blockType(it.Type); typ != "" && it.Text != "" {
			h.delta(typ, it.Text)
		}
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
			if typ := blockType(o.Kind); typ != "" && o.Text != "" {
				h.whole(typ, o.Text)
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
		h.blocks = append(h.blocks, hblock{block: block{Type: "tool_use", ToolCallID: e.StepID, Name: p.ToolID, Input: objectOf(p.Arguments)}})
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

// messages returns the history so far, the open assistant message
// included.
func (h *historian) messages() []Message {
	cp := historian{out: append([]Message(nil), h.out...), blocks: h.blocks}
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
