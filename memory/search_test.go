package memory_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/gatehouse-dev/gatehouse/memory"
)

// TestSearchBounds: every path to a search has the same bounds: the Go
// API, and a tool call that no schema validated (a /v0 agent's).
func TestSearchBounds(t *testing.T) {
	ctx := context.Background()
	n, st := open(t, t.TempDir(), memory.Options{})
	defer st.Close()
	if _, err := n.Write(ctx, me, "/a.md", "alpha", 0); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("é", memory.MaxQuery)
	var words []string
	for i := range memory.MaxQueryTerms + 1 {
		words = append(words, fmt.Sprintf("w%d", i))
	}
	for _, q := range []string{long, strings.Join(words[:memory.MaxQueryTerms], " ")} {
		if _, err := n.Search(ctx, me, q, "", 10); err != nil {
			t.Errorf("a query at the bounds (%d characters): %v", utf8.RuneCountInString(q), err)
		}
	}
	for name, q := range map[string]string{
		"a character too many": long + "e",
		"a word too many":      strings.Join(words, " "),
	} {
		if _, err := n.Search(ctx, me, q, "", 10); !errors.Is(err, memory.ErrInvalid) {
			t.Errorf("Search, %s: %v", name, err)
		}
		in, _ := json.Marshal(map[string]any{"query": q})
		if _, err := n.Call(ctx, owner, "memory_search", in); !errors.Is(err, memory.ErrInvalid) {
			t.Errorf("Call, %s: %v", name, err)
		}
	}
	for _, in := range []string{
		`{"query":"alpha","limit":0}`,
		`{"query":"alpha","limit":101}`,
		`{"query":""}`,
		`{"limit":3}`,
		`{"query":"alpha","prefix":"/` + strings.Repeat("p", 512) + `"}`,
	} {
		if _, err := n.Call(ctx, owner, "memory_search", json.RawMessage(in)); !errors.Is(err, memory.ErrInvalid) {
			t.Errorf("%s: %v", in, err)
		}
	}
}

// countdown is a context that is cancelled after its Err has been asked
// for a number of times: a caller's deadline passing in the middle of a
// search, at a point the test chooses.
type countdown struct {
	context.Context
	left atomic.Int64
}

func (c *countdown) Err() error {
	if c.left.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

// TestSearchStopsWhenItsContextEnds: a search whose caller gives up while
// it reads the postings stops there, with the context's error, instead
// of ranking and reading snippets for nobody.
func TestSearchStopsWhenItsContextEnds(t *testing.T) {
	ctx := context.Background()
	n, st := open(t, t.TempDir(), memory.Options{})
	defer st.Close()
	for i := range 300 {
		if _, err := n.Write(ctx, me, fmt.Sprintf("/n/%03d.md", i), "common words everywhere", 0); err != nil {
			t.Fatal(err)
		}
	}
	if hits, err := n.Search(ctx, me, "common", "", 5); err != nil || len(hits) != 5 {
		t.Fatalf("uncancelled: %v %v", hits, err)
	}
	// Two looks pass (before the search, at its first posting); the next,
	// 64 postings in, finds the context done.
	c := &countdown{Context: ctx}
	c.left.Store(2)
	hits, err := n.Search(c, me, "common", "", 5)
	if !errors.Is(err, context.Canceled) || hits != nil {
		t.Fatalf("cancelled in the middle: %v %v", hits, err)
	}
}

// TestSnippetIsAroundTheMatch: the snippet of a long note is the text
// around the first match, wherever it is (here across the boundary of two
// of the pieces the note is stored in), whole characters only.
func TestSnippetIsAroundTheMatch(t *testing.T) {
	ctx := context.Background()
	n, st := open(t, t.TempDir(), memory.Options{})
	defer st.Close()
	// The needle is 13 bytes past the end of the first piece of 16 KiB:
	// the text before it is in that piece.
	filler := strings.Repeat("café crème ", 1261) // 16,393 bytes
	content := filler + "the needle is here " + filler
	if _, err := n.Write(ctx, me, "/long.md", content, 0); err != nil {
		t.Fatal(err)
	}
	hits, err := n.Search(ctx, me, "needle", "", 1)
	if err != nil || len(hits) != 1 {
		t.Fatalf("search: %v %v", hits, err)
	}
	s := hits[0].Snippet
	if !strings.Contains(s, "the needle is here café") || !strings.HasPrefix(s, "…") || !strings.HasSuffix(s, "…") || !utf8.ValidString(s) {
		t.Fatalf("snippet %q", s)
	}
	if c := utf8.RuneCountInString(s); c > 162 {
		t.Fatalf("snippet of %d characters", c)
	}
	// A match only in the path shows the note's start.
	if _, err := n.Write(ctx, me, "/pinecone.md", "short note", 0); err != nil {
		t.Fatal(err)
	}
	if hits, _ := n.Search(ctx, me, "pinecone", "", 1); len(hits) != 1 || hits[0].Snippet != "short note" {
		t.Fatalf("path match: %+v", hits)
	}
}

// TestSaveMemoryNoteRefusesEmptyFields: save_memory_note with "path": ""
// or "title": "" is refused, by Check and by Call, instead of appending
// to the daily note; leaving both out still saves to the daily note.
func TestSaveMemoryNoteRefusesEmptyFields(t *testing.T) {
	ctx := context.Background()
	n, st := open(t, t.TempDir(), memory.Options{})
	defer st.Close()
	for in, want := range map[string]error{
		`{"content":"x","path":""}`:                memory.ErrInvalidPath,
		`{"content":"x","title":""}`:               memory.ErrInvalid,
		`{"content":"x","path":"","title":"Plan"}`: memory.ErrInvalidPath,
	} {
		if err := n.Check(ctx, owner, "save_memory_note", json.RawMessage(in)); !errors.Is(err, want) {
			t.Errorf("Check %s: %v", in, err)
		}
		if _, err := n.Call(ctx, owner, "save_memory_note", json.RawMessage(in)); !errors.Is(err, want) {
			t.Errorf("Call %s: %v", in, err)
		}
	}
	if ls, _ := n.List(ctx, me, ""); len(ls) != 0 {
		t.Fatalf("a refused save wrote %v", ls)
	}
	out, err := n.Call(ctx, owner, "save_memory_note", json.RawMessage(`{"content":"x"}`))
	if err != nil || !strings.Contains(string(out), `"/daily/`) {
		t.Fatalf("daily note: %s %v", out, err)
	}
}
