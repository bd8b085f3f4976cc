package memory

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode"
)

// Tool describes one memory tool: its name, what it does, and its input
// as a JSON Schema.
type Tool struct {
	Name        string
	Description string
	Parameters  json.RawMessage
	ReadOnly    bool
}

// tools are both of the seeds' name sets: seed 000's memory_search,
// memory_read and save_memory_note; seed 003's memory_ls, memory_read,
// memory_search, memory_write and memory_append.
var tools = []Tool{
	{"memory_search", "Search the organisation's notes; ranked hits with a snippet, best first.",
		json.RawMessage(`{"type":"object","properties":{"query":{"type":"string","minLength":1,"maxLength":1024},"limit":{"type":"integer","minimum":1,"maximum":100},"prefix":{"type":"string","maxLength":512}},"required":["query"],"additionalProperties":false}`), true},
	{"memory_read", "Read one note by its path.",
		json.RawMessage(`{"type":"object","properties":{"path":{"type":"string","minLength":1,"maxLength":512}},"required":["path"],"additionalProperties":false}`), true},
	{"memory_ls", "List the notes under a path prefix.",
		json.RawMessage(`{"type":"object","properties":{"prefix":{"type":"string","maxLength":512}},"additionalProperties":false}`), true},
	{"memory_write", "Create or replace a note; with ifVersion, only if the note is at that version.",
		json.RawMessage(`{"type":"object","properties":{"path":{"type":"string","minLength":1,"maxLength":512},"content":{"type":"string"},"ifVersion":{"type":"integer","minimum":1}},"required":["path","content"],"additionalProperties":false}`), false},
	{"memory_append", "Append text to a note on a new line, creating it when absent.",
		json.RawMessage(`{"type":"object","properties":{"path":{"type":"string","minLength":1,"maxLength":512},"content":{"type":"string"}},"required":["path","content"],"additionalProperties":false}`), false},
	{"save_memory_note", "Save a note: at path, or at a path made from its title (and kind), or appended to today's daily note.",
		json.RawMessage(`{"type":"object","properties":{"content":{"type":"string"},"path":{"type":"string","maxLength":512},"title":{"type":"string","maxLength":200},"kind":{"type":"string","maxLength":64}},"required":["content"],"additionalProperties":false}`), false},
}

// Tools describes the memory tools.
func (n *Notes) Tools() []Tool { return tools }

// input is every memory tool's input fields.
type input struct {
	Query     string  `json:"query"`
	Limit     int     `json:"limit"`
	Prefix    string  `json:"prefix"`
	Path      string  `json:"path"`
	Content   *string `json:"content"`
	IfVersion uint64  `json:"ifVersion"`
	Title     string  `json:"title"`
	Kind      string  `json:"kind"`
}

// Check validates a tool call's input without running it: an unknown
// tool, malformed input or a path that is not allowed is an error.
func (n *Notes) Check(name string, raw json.RawMessage) error {
	in, err := parse(name, raw)
	if err != nil {
		return err
	}
	if in.Path != "" {
		if _, err = CleanPath(in.Path); err != nil {
			return err
		}
	}
	if in.Content != nil && len(*in.Content) > n.o.MaxNoteBytes {
		return fmt.Errorf("%w: content of %d bytes, more than %d", ErrTooLarge, len(*in.Content), n.o.MaxNoteBytes)
	}
	return nil
}

func parse(name string, raw json.RawMessage) (input, error) {
	var in input
	known := false
	for _, t := range tools {
		known = known || t.Name == name
	}
	if !known {
		return in, fmt.Errorf("%w: unknown memory tool %q", ErrInvalid, name)
	}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &in); err != nil {
			return in, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	}
	return in, nil
}

// Call runs memory tool name for tenant ten on raw input and returns its
// output, in the fact sheet's shapes.
func (n *Notes) Call(ctx context.Context, ten, name string, raw json.RawMessage) (json.RawMessage, error) {
	in, err := parse(name, raw)
	if err != nil {
		return nil, err
	}
	var out any
	switch name {
	case "memory_search":
		var hits []Hit
		if hits, err = n.Search(ctx, ten, in.Query, in.Prefix, in.Limit); err == nil {
			out = map[string]any{"hits": hits}
		}
	case "memory_read":
		var note Note
		if note, err = n.Read(ctx, ten, in.Path); err == nil {
			out = map[string]any{"path": note.Path, "content": note.Content, "version": note.Version, "updatedAt": note.UpdatedAt}
		}
	case "memory_ls":
		var entries []Entry
		if entries, err = n.List(ctx, ten, in.Prefix); err == nil {
			out = map[string]any{"entries": entries}
		}
	case "memory_write", "memory_append":
		if in.Content == nil {
			return nil, fmt.Errorf("%w: content is required", ErrInvalid)
		}
		var note Note
		if name == "memory_write" {
			note, err = n.Write(ctx, ten, in.Path, *in.Content, in.IfVersion)
		} else {
			note, err = n.Append(ctx, ten, in.Path, *in.Content)
		}
		if err == nil {
			out = map[string]any{"path": note.Path, "version": note.Version}
		}
	case "save_memory_note":
		out, err = n.save(ctx, ten, in)
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

// save is save_memory_note: a note at its path, or at /<kind>/<slug of
// title>.md, replaced; without either, appended to /daily/<date>.md.
func (n *Notes) save(ctx context.Context, ten string, in input) (any, error) {
	if in.Content == nil {
		return nil, fmt.Errorf("%w: content is required", ErrInvalid)
	}
	p := in.Path
	var note Note
	var err error
	switch {
	case p != "":
		note, err = n.Write(ctx, ten, p, *in.Content, 0)
	case in.Title != "":
		folder := slug(in.Kind)
		if folder == "" {
			folder = "notes"
		}
		note, err = n.Write(ctx, ten, "/"+folder+"/"+slug(in.Title)+".md", *in.Content, 0)
	default:
		note, err = n.Append(ctx, ten, "/daily/"+n.o.Now().UTC().Format(time.DateOnly)+".md", *in.Content)
	}
	if err != nil {
		return nil, err
	}
	return map[string]any{"path": note.Path, "version": note.Version}, nil
}

// slug makes a path segment of a title: lower-case letters and digits
// joined by dashes, at most 80 bytes.
func slug(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteRune(r)
		} else {
			dash = true
		}
		if b.Len() >= 80 {
			break
		}
	}
	if b.Len() == 0 && s != "" {
		return "untitled"
	}
	return b.String()
}
