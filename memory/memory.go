// Package memory keeps durable notes for agents and their people: the
// Runtime API's memory (seeds 000 and 003). A note is text at a path,
// scoped to a tenant, versioned, and found again by ranked lexical search
// (BM25 over path and content).
//
// Notes live in the gateway's store: a write is acknowledged once it is on
// disk, and the search index is rebuilt in memory from the store at Open.
// Writes to one tenant's notes are serialized, so concurrent appends never
// lose text and IfVersion checks are exact.
package memory

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gatehouse-dev/gatehouse/internal/option"
	"github.com/gatehouse-dev/gatehouse/store"
)

// kindNote is the store's record kind of notes: id tenantKey + path.
const kindNote = "memnote"

// Errors, matchable with errors.Is.
var (
	ErrInvalidPath = errors.New("invalid path")
	ErrInvalid     = errors.New("invalid input")
	ErrNotFound    = errors.New("note not found")
	ErrConflict    = errors.New("version conflict")
	ErrTooLarge    = errors.New("note too large")
	ErrQuota       = errors.New("too many notes")
)

// Limits of paths; the content and count limits are Options.
const (
	maxPathLen   = 512
	maxPathDepth = 16
)

// Options configure Notes. Store is required.
type Options struct {
	Store *store.Store
	// MaxNoteBytes bounds one note's content (256 KiB when zero).
	MaxNoteBytes int
	// MaxNotes bounds the notes of one tenant (10,000 when zero).
	MaxNotes int
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Note is one note.
type Note struct {
	Path      string    `msgpack:"p" json:"path"`
	Content   string    `msgpack:"c" json:"content"`
	Version   uint64    `msgpack:"v" json:"version"`
	CreatedAt time.Time `msgpack:"ca" json:"createdAt"`
	UpdatedAt time.Time `msgpack:"ua" json:"updatedAt"`
}

// Entry is a note in a listing.
type Entry struct {
	Path      string    `json:"path"`
	Size      int       `json:"size"`
	Version   uint64    `json:"version"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// Hit is a search result.
type Hit struct {
	Path    string  `json:"path"`
	Score   float64 `json:"score"`
	Snippet string  `json:"snippet"`
}

// Notes is the notes of every tenant.
type Notes struct {
	o       Options
	mu      sync.Mutex
	tenants map[string]*tenant
}

// tenant is one tenant's notes: their index, and the lock that orders
// writes to them.
type tenant struct {
	write sync.Mutex // held across a write's store commit
	mu    sync.RWMutex
	idx   index
}

// Open loads the notes' index from the store; ctx bounds the load.
func Open(ctx context.Context, o Options) (*Notes, error) {
	if o.Store == nil {
		return nil, errors.New("memory: Options.Store is required")
	}
	option.Default(&o.MaxNoteBytes, 256<<10)
	option.Default(&o.MaxNotes, 10000)
	if o.Now == nil {
		o.Now = time.Now
	}
	n := &Notes{o: o, tenants: map[string]*tenant{}}
	var iderr error
	err := store.EachRecord(ctx, o.Store, kindNote, "", func(id string, note *Note) bool {
		ten, ok := splitID(id)
		if !ok {
			iderr = fmt.Errorf("memory: malformed record id %q", id)
			return false
		}
		n.tenant(ten).idx.put(note)
		return true
	})
	if err == nil {
		err = iderr
	}
	if err != nil {
		return nil, fmt.Errorf("memory: load: %w", err)
	}
	return n, nil
}

func (n *Notes) tenant(name string) *tenant {
	n.mu.Lock()
	defer n.mu.Unlock()
	t := n.tenants[name]
	if t == nil {
		t = &tenant{idx: newIndex()}
		n.tenants[name] = t
	}
	return t
}

// noteID is a note's record id: the tenant, length-prefixed so that no
// tenant name can reach into another's ids, then the path.
func noteID(ten, p string) string { return strconv.Itoa(len(ten)) + ":" + ten + p }

func splitID(id string) (string, bool) {
	l, rest, ok := strings.Cut(id, ":")
	n, err := strconv.Atoi(l)
	if !ok || err != nil || n < 0 || n > len(rest) {
		return "", false
	}
	return rest[:n], true
}

// CleanPath returns p normalized, or ErrInvalidPath: absolute,
// "/"-separated, no "." or ".." segment, no empty segment, no control
// characters, valid UTF-8, at most 512 bytes and 16 segments.
func CleanPath(p string) (string, error) {
	bad := func(why string) (string, error) { return "", fmt.Errorf("%w %q: %s", ErrInvalidPath, p, why) }
	switch {
	case p == "":
		return bad("empty")
	case len(p) > maxPathLen:
		return bad("longer than " + strconv.Itoa(maxPathLen) + " bytes")
	case !utf8.ValidString(p):
		return bad("not UTF-8")
	case !strings.HasPrefix(p, "/"):
		return bad("must start with /")
	case strings.HasSuffix(p, "/"):
		return bad("names a folder, not a note")
	}
	for _, r := range p {
		if unicode.IsControl(r) || r == '\\' {
			return bad("control characters and backslashes are not allowed")
		}
	}
	segs := strings.Split(p[1:], "/")
	if len(segs) > maxPathDepth {
		return bad("deeper than " + strconv.Itoa(maxPathDepth) + " segments")
	}
	for _, s := range segs {
		if s == "" || s == "." || s == ".." {
			return bad("empty, . and .. segments are not allowed")
		}
	}
	return path.Clean(p), nil
}

// Read returns the note at p.
func (n *Notes) Read(ctx context.Context, ten, p string) (Note, error) {
	p, err := CleanPath(p)
	if err != nil {
		return Note{}, err
	}
	var note Note
	if err := n.o.Store.Get(kindNote, noteID(ten, p), &note); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return Note{}, fmt.Errorf("%w: %s", ErrNotFound, p)
		}
		return Note{}, fmt.Errorf("memory: read %s: %w", p, err)
	}
	return note, nil
}

// Write replaces (or creates) the note at p. With ifVersion > 0 the note
// must be at that version; ifVersion 0 writes whatever is there. It
// returns once the note is durable.
func (n *Notes) Write(ctx context.Context, ten, p, content string, ifVersion uint64) (Note, error) {
	return n.update(ctx, ten, p, func(cur *Note, exists bool) (string, error) {
		if ifVersion > 0 && (!exists || cur.Version != ifVersion) {
			have := uint64(0)
			if exists {
				have = cur.Version
			}
			return "", fmt.Errorf("%w: %s is at version %d, not %d", ErrConflict, p, have, ifVersion)
		}
		return content, nil
	})
}

// Append adds content to the end of the note at p, on a new line, creating
// the note when absent.
func (n *Notes) Append(ctx context.Context, ten, p, content string) (Note, error) {
	return n.update(ctx, ten, p, func(cur *Note, exists bool) (string, error) {
		if !exists || cur.Content == "" {
			return content, nil
		}
		if strings.HasSuffix(cur.Content, "\n") {
			return cur.Content + content, nil
		}
		return cur.Content + "\n" + content, nil
	})
}

// update writes the note at p with the content next returns for what is
// there now, under the tenant's write lock.
func (n *Notes) update(ctx context.Context, ten, p string, next func(cur *Note, exists bool) (string, error)) (Note, error) {
	p, err := CleanPath(p)
	if err != nil {
		return Note{}, err
	}
	t := n.tenant(ten)
	t.write.Lock()
	defer t.write.Unlock()
	var cur Note
	exists := true
	if err := n.o.Store.Get(kindNote, noteID(ten, p), &cur); errors.Is(err, store.ErrNotFound) {
		exists = false
	} else if err != nil {
		return Note{}, fmt.Errorf("memory: read %s: %w", p, err)
	}
	content, err := next(&cur, exists)
	if err != nil {
		return Note{}, err
	}
	if !utf8.ValidString(content) {
		return Note{}, fmt.Errorf("%w: content must be UTF-8", ErrInvalid)
	}
	if len(content) > n.o.MaxNoteBytes {
		return Note{}, fmt.Errorf("%w: %s would hold %d bytes, more than %d", ErrTooLarge, p, len(content), n.o.MaxNoteBytes)
	}
	t.mu.RLock()
	count := t.idx.len()
	t.mu.RUnlock()
	if !exists && count >= n.o.MaxNotes {
		return Note{}, fmt.Errorf("%w: a tenant keeps at most %d notes", ErrQuota, n.o.MaxNotes)
	}
	now := n.o.Now().UTC()
	note := Note{Path: p, Content: content, Version: cur.Version + 1, CreatedAt: cur.CreatedAt, UpdatedAt: now}
	if !exists {
		note.Version, note.CreatedAt = 1, now
	}
	var b store.Batch
	if err := b.Put(kindNote, noteID(ten, p), &note); err != nil {
		return Note{}, err
	}
	if err := n.o.Store.Write(ctx, &b); err != nil {
		return Note{}, fmt.Errorf("memory: write %s: %w", p, err)
	}
	t.mu.Lock()
	if exists {
		t.idx.remove(&cur)
	}
	t.idx.put(&note)
	t.mu.Unlock()
	return note, nil
}

// maxListed bounds a listing.
const maxListed = 1000

// List returns the notes whose path starts with prefix, in path order, at
// most 1,000.
func (n *Notes) List(ctx context.Context, ten, prefix string) ([]Entry, error) {
	t := n.tenant(ten)
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := []Entry{}
	for _, d := range t.idx.sorted() {
		if strings.HasPrefix(d.path, prefix) {
			out = append(out, Entry{Path: d.path, Size: d.size, Version: d.version, UpdatedAt: d.updated})
			if len(out) == maxListed {
				break
			}
		}
	}
	return out, nil
}

// Search returns the notes best matching query, best first, at most limit
// (10 when zero, at most 100), each with a snippet around the first match.
func (n *Notes) Search(ctx context.Context, ten, query, prefix string, limit int) ([]Hit, error) {
	if limit <= 0 {
		limit = 10
	}
	limit = min(limit, 100)
	terms := tokens(query, nil)
	if len(terms) == 0 {
		return []Hit{}, nil
	}
	t := n.tenant(ten)
	t.mu.RLock()
	ranked := t.idx.search(terms, prefix, limit)
	t.mu.RUnlock()
	hits := make([]Hit, 0, len(ranked))
	for _, r := range ranked {
		var note Note
		if err := n.o.Store.Get(kindNote, noteID(ten, r.path), &note); err != nil {
			continue // rewritten or gone meanwhile
		}
		hits = append(hits, Hit{Path: r.path, Score: round(r.score), Snippet: snippet(note.Content, terms)})
	}
	return hits, nil
}

func round(f float64) float64 { return float64(int64(f*1e4+0.5)) / 1e4 }

// snippetRunes is about how much of a note a snippet shows.
const snippetRunes = 160

// snippet is the part of content around the first query term it holds.
func snippet(content string, terms []string) string {
	lower := strings.ToLower(content)
	at := -1
	for _, term := range terms {
		if i := strings.Index(lower, term); i >= 0 && (at < 0 || i < at) {
			at = i
		}
	}
	if at < 0 {
		at = 0
	}
	// Work in runes so that no character is cut in half; lower has the
	// same byte offsets as content only for ASCII, so map back by runes.
	runes := []rune(content)
	pos := utf8.RuneCountInString(lower[:at])
	start := max(0, pos-snippetRunes/4)
	end := min(len(runes), start+snippetRunes)
	s := strings.Join(strings.Fields(string(runes[start:end])), " ")
	if start > 0 {
		s = "…" + s
	}
	if end < len(runes) {
		s += "…"
	}
	return s
}

// sortHits orders hits best first, then by path.
func sortHits(h []ranked) {
	sort.Slice(h, func(i, j int) bool {
		if h[i].score != h[j].score {
			return h[i].score > h[j].score
		}
		return h[i].path < h[j].path
	})
}
