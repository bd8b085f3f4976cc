package memory

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Tool describes one memory tool: its name, what it does, and its input
// as a JSON Schema.
type Tool struct {
	Name        string
	Description string
	Parameters  json.RawMessage
	ReadOnly    bool
}

// spaceSchema is every tool's "space" property.
const spaceSchema = `"space":{"type":"string","enum":["principal","tenant"],"description":"whose notes: the caller's own (principal, the default) or those its whole tenant shares (tenant)"}`

// tools are both of the seeds' name sets: seed 000's memory_search,
// memory_read and save_memory_note; seed 003's memory_ls, memory_read,
// memory_search, memory_write and memory_append. Call checks every bound
// of these schemas itself, for the callers that do not validate against
// them (a /v0 agent's invocation).
var tools = []Tool{
	{"memory_search", "Search the caller's notes; ranked hits with a snippet, best first.",
		json.RawMessage(`{"type":"object","properties":{"query":{"type":"string","minLength":1,"maxLength":1024},"limit":{"type":"integer","minimum":1,"maximum":100},"prefix":{"type":"string","maxLength":512},` + spaceSchema + `},"required":["query"],"additionalProperties":false}`), true},
	{"memory_read", "Read one note by its path.",
		json.RawMessage(`{"type":"object","properties":{"path":{"type":"string","minLength":1,"maxLength":512},` + spaceSchema + `},"required":["path"],"additionalProperties":false}`), true},
	{"memory_ls", "List the notes under a path prefix.",
		json.RawMessage(`{"type":"object","properties":{"prefix":{"type":"string","maxLength":512},` + spaceSchema + `},"additionalProperties":false}`), true},
	{"memory_write", "Create or replace a note; with ifVersion, only if the note is at that version.",
		json.RawMessage(`{"type":"object","properties":{"path":{"type":"string","minLength":1,"maxLength":512},"content":{"type":"string"},"ifVersion":{"type":"integer","minimum":1},` + spaceSchema + `},"required":["path","content"],"additionalProperties":false}`), false},
	{"memory_append", "Append text to a note on a new line, creating it when absent.",
		json.RawMessage(`{"type":"object","properties":{"path":{"type":"string","minLength":1,"maxLength":512},"content":{"type":"string"},` + spaceSchema + `},"required":["path","content"],"additionalProperties":false}`), false},
	{"save_memory_note", "Save a note: at path, or at a path made from its title (and kind), or, with neither, appended to today's daily note.",
		json.RawMessage(`{"type":"object","properties":{"content":{"type":"string"},"path":{"type":"string","minLength":1,"maxLength":512},"title":{"type":"string","minLength":1,"maxLength":200},"kind":{"type":"string","maxLength":64},` + spaceSchema + `},"required":["content"],"additionalProperties":false}`), false},
}

// Bounds of save_memory_note's fields, as its schema says.
const (
	maxTitle = 200
	maxKind  = 64
)

// Tools describes the memory tools.
func (n *Notes) Tools() []Tool { return tools }

// input is every memory tool's input fields. A pointer tells a field left
// out from one given empty.
type input struct {
	Query     *string `json:"query"`
	Limit     *int    `json:"limit"`
	Prefix    string  `json:"prefix"`
	Path      *string `json:"path"`
	Content   *string `json:"content"`
	IfVersion uint64  `json:"ifVersion"`
	Title     *string `json:"title"`
	Kind      string  `json:"kind"`
	Space     string  `json:"space"`
}

// call is a tool call checked: its input and the space it works on.
type call struct {
	name string
	in   input
	sp   Space
}

// writeOp is what a writing tool does: replace the note at path (at
// ifVersion, if not 0) or append to it.
type writeOp struct {
	path      string
	content   string
	append    bool
	ifVersion uint64
}

// Check validates a tool call of o without running it: an unknown tool,
// malformed input, a path that is not allowed, a bound of the tool's
// schema passed, content too large (ErrTooLarge) or a write that would
// pass a quota (a *QuotaError) is an error. Call checks the same again.
func (n *Notes) Check(ctx context.Context, o Owner, name string, raw json.RawMessage) error {
	c, err := n.prepare(o, name, raw)
	if err != nil {
		return err
	}
	op, writes := n.writeOp(&c)
	if !writes {
		return nil
	}
	p, err := CleanPath(op.path)
	if err != nil {
		return err
	}
	cur, exists, err := n.read(c.sp, p)
	if err != nil {
		return err
	}
	next := op.content
	if op.append {
		next = appended(cur.Content, op.content)
	}
	if len(next) > n.o.MaxNoteBytes {
		return fmt.Errorf("%w: %s would hold %d bytes, more than %d", ErrTooLarge, p, len(next), n.o.MaxNoteBytes)
	}
	su, err := n.getUsage(kindSpace, c.sp.id())
	if err != nil {
		return err
	}
	var tu usage
	if c.sp.Tenant != "" {
		if tu, err = n.getUsage(kindTenant, c.sp.Tenant); err != nil {
			return err
		}
	}
	added := 1
	if exists {
		added = 0
	}
	return n.admit(c.sp, su, tu, added, int64(len(next)-len(cur.Content)))
}

// prepare parses and checks a call of tool name by o.
func (n *Notes) prepare(o Owner, name string, raw json.RawMessage) (call, error) {
	c := call{name: name}
	known := false
	for _, t := range tools {
		known = known || t.Name == name
	}
	if !known {
		return c, fmt.Errorf("%w: unknown memory tool %q", ErrInvalid, name)
	}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &c.in); err != nil {
			return c, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	var err error
	if c.sp, err = SpaceOf(o, c.in.Space); err != nil {
		return c, err
	}
	if err := c.sp.check(); err != nil {
		return c, err
	}
	in := &c.in
	required := func(field string, v *string) error {
		if v == nil {
			return fmt.Errorf("%w: %s is required", ErrInvalid, field)
		}
		return nil
	}
	path := func() error {
		if err := required("path", in.Path); err != nil {
			return err
		}
		_, err := CleanPath(*in.Path)
		return err
	}
	content := func() error {
		if err := required("content", in.Content); err != nil {
			return err
		}
		if len(*in.Content) > n.o.MaxNoteBytes {
			return fmt.Errorf("%w: content of %d bytes, more than %d", ErrTooLarge, len(*in.Content), n.o.MaxNoteBytes)
		}
		return nil
	}
	switch name {
	case "memory_search":
		if err := required("query", in.Query); err != nil {
			return c, err
		}
		if *in.Query == "" {
			return c, fmt.Errorf("%w: query is empty", ErrInvalid)
		}
		if in.Limit != nil && (*in.Limit < 1 || *in.Limit > MaxLimit) {
			return c, fmt.Errorf("%w: limit %d is not between 1 and %d", ErrInvalid, *in.Limit, MaxLimit)
		}
		_, err = checkSearch(*in.Query, in.Prefix)
	case "memory_read":
		err = path()
	case "memory_ls":
		err = checkPrefix(in.Prefix)
	case "memory_write", "memory_append":
		if err = path(); err == nil {
			err = content()
		}
	case "save_memory_note":
		err = n.checkSave(in, content)
	}
	return c, err
}

// checkSave checks save_memory_note's fields: a path or title given must
// not be empty, which would otherwise mean the daily note.
func (n *Notes) checkSave(in *input, content func() error) error {
	if err := content(); err != nil {
		return err
	}
	if in.Path != nil {
		if *in.Path == "" {
			return fmt.Errorf("%w: path is empty; leave it out to save by title or to the daily note", ErrInvalidPath)
		}
		if _, err := CleanPath(*in.Path); err != nil {
			return err
		}
	}
	if in.Title != nil {
		if *in.Title == "" {
			return fmt.Errorf("%w: title is empty; leave it out to save to the daily note", ErrInvalid)
		}
		if c := utf8.RuneCountInString(*in.Title); c > maxTitle {
			return fmt.Errorf("%w: title of %d characters, more than %d", ErrInvalid, c, maxTitle)
		}
	}
	if c := utf8.RuneCountInString(in.Kind); c > maxKind {
		return fmt.Errorf("%w: kind of %d characters, more than %d", ErrInvalid, c, maxKind)
	}
	return nil
}

// writeOp returns what a writing tool call does, and false for a reading
// one.
func (n *Notes) writeOp(c *call) (writeOp, bool) {
	in := &c.in
	switch c.name {
	case "memory_write":
		return writeOp{path: *in.Path, content: *in.Content, ifVersion: in.IfVersion}, true
	case "memory_append":
		return writeOp{path: *in.Path, content: *in.Content, append: true}, true
	case "save_memory_note":
		switch {
		case in.Path != nil:
			return writeOp{path: *in.Path, content: *in.Content}, true
		case in.Title != nil:
			folder := slug(in.Kind)
			if folder == "" {
				folder = "notes"
			}
			return writeOp{path: "/" + folder + "/" + slug(*in.Title) + ".md", content: *in.Content}, true
		}
		return writeOp{path: "/daily/" + n.o.Now().UTC().Format(time.DateOnly) + ".md", content: *in.Content, append: true}, true
	}
	return writeOp{}, false
}

// Call runs memory tool name for o on raw input and returns its output,
// in the fact sheet's shapes. Calls queue fairly per tenant (see sched):
// a full queue is ErrBusy, and ctx ending, before or during the call,
// ends it with ctx's error.
func (n *Notes) Call(ctx context.Context, o Owner, name string, raw json.RawMessage) (json.RawMessage, error) {
	c, err := n.prepare(o, name, raw)
	if err != nil {
		return nil, err
	}
	var out any
	err = n.sched.do(ctx, c.sp.turn(), func() error {
		var err error
		out, err = n.run(ctx, &c)
		return err
	})
	if err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

// run runs a checked call.
func (n *Notes) run(ctx context.Context, c *call) (any, error) {
	in := &c.in
	if op, writes := n.writeOp(c); writes {
		var note Note
		var err error
		if op.append {
			note, err = n.Append(ctx, c.sp, op.path, op.content)
		} else {
			note, err = n.Write(ctx, c.sp, op.path, op.content, op.ifVersion)
		}
		if err != nil {
			return nil, err
		}
		return map[string]any{"path": note.Path, "version": note.Version}, nil
	}
	switch c.name {
	case "memory_search":
		limit := 0
		if in.Limit != nil {
			limit = *in.Limit
		}
		hits, err := n.Search(ctx, c.sp, *in.Query, in.Prefix, limit)
		if err != nil {
			return nil, err
		}
		return map[string]any{"hits": hits}, nil
	case "memory_read":
		note, err := n.Read(ctx, c.sp, *in.Path)
		if err != nil {
			return nil, err
		}
		return map[string]any{"path": note.Path, "content": note.Content, "version": note.Version, "updatedAt": note.UpdatedAt}, nil
	}
	entries, err := n.List(ctx, c.sp, in.Prefix)
	if err != nil {
		return nil, err
	}
	return map[string]any{"entries": entries}, nil
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
