package memory_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/memory"
	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/store/storetest"
)

// me is the space most tests write in.
var me = memory.Space{Tenant: "t", Principal: "me"}

// owner is the caller of the tools in tests.
var owner = memory.Owner{Tenant: "t", Principal: "me"}

func open(t testing.TB, dir string, o memory.Options) (*memory.Notes, *store.Store) {
	t.Helper()
	st := storetest.Open(t, store.Options{Dir: dir})
	o.Store = st
	n, err := memory.Open(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	return n, st
}

func TestCleanPath(t *testing.T) {
	for p, want := range map[string]string{
		"/topics/icp.md":               "/topics/icp.md",
		"/a":                           "/a",
		"/über/notes.md":               "/über/notes.md",
		"":                             "",
		"topics/icp.md":                "",
		"/topics/":                     "",
		"/topics/../secrets":           "",
		"/./x":                         "",
		"//x":                          "",
		"/x\ny":                        "",
		"/x\x00y":                      "",
		"/x\\y":                        "",
		"/" + strings.Repeat("a", 600): "",
		strings.Repeat("/a", 17):       "",
		// Format characters and line separators, refused as in ids.
		"/a\u202eb.md": "",
		"/a\u200bb.md": "",
		"/a\u2066b.md": "",
		"/\ufeffa.md":  "",
		"/a\u00adb.md": "",
		"/a\u2028b.md": "",
		"/a\u0085b.md": "",
		"/a\xffb.md":   "",
	} {
		got, err := memory.CleanPath(p)
		if want == "" {
			if !errors.Is(err, memory.ErrInvalidPath) {
				t.Errorf("%q: %q %v, want ErrInvalidPath", p, got, err)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", p, got, err, want)
		}
	}
}

func TestWriteReadAppendVersions(t *testing.T) {
	ctx := context.Background()
	n, st := open(t, t.TempDir(), memory.Options{MaxNoteBytes: 64, MaxNotes: 2})
	defer st.Close()
	acme := memory.Space{Tenant: "acme", Principal: "ada"}
	a, err := n.Write(ctx, acme, "/topics/icp.md", "B2B SaaS", 0)
	if err != nil || a.Version != 1 {
		t.Fatalf("write: %+v %v", a, err)
	}
	if _, err := n.Write(ctx, acme, "/topics/icp.md", "x", 7); !errors.Is(err, memory.ErrConflict) {
		t.Fatalf("ifVersion mismatch: %v", err)
	}
	b, err := n.Write(ctx, acme, "/topics/icp.md", "B2B SaaS, 50-500 staff", 1)
	if err != nil || b.Version != 2 || !b.CreatedAt.Equal(a.CreatedAt) {
		t.Fatalf("write at version: %+v %v", b, err)
	}
	c, err := n.Append(ctx, acme, "/topics/icp.md", "EU first")
	if err != nil || c.Version != 3 || c.Content != "B2B SaaS, 50-500 staff\nEU first" {
		t.Fatalf("append: %+v %v", c, err)
	}
	if _, err := n.Append(ctx, acme, "/topics/icp.md", strings.Repeat("x", 64)); !errors.Is(err, memory.ErrTooLarge) {
		t.Fatalf("over the size: %v", err)
	}
	if _, err := n.Read(ctx, memory.Space{Tenant: "other", Principal: "ada"}, "/topics/icp.md"); !errors.Is(err, memory.ErrNotFound) {
		t.Fatalf("another tenant sees it: %v", err)
	}
	if _, err := n.Write(ctx, acme, "/b", "", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Write(ctx, acme, "/c", "", 0); !errors.Is(err, memory.ErrQuota) {
		t.Fatalf("over the count: %v", err)
	}
	if _, err := n.Write(ctx, acme, "/../etc/passwd", "", 0); !errors.Is(err, memory.ErrInvalidPath) {
		t.Fatalf("path escape: %v", err)
	}
	ls, _ := n.List(ctx, acme, "/topics/")
	if len(ls) != 1 || ls[0].Path != "/topics/icp.md" || ls[0].Version != 3 {
		t.Fatalf("list: %+v", ls)
	}
}

// TestConcurrentAppendsLoseNothing: appends racing on one note all land,
// and a reopened store has every one of them.
func TestConcurrentAppendsLoseNothing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	n, st := open(t, dir, memory.Options{})
	const writers, each = 8, 25
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if _, err := n.Append(ctx, me, "/log.md", fmt.Sprintf("w%d-%d", w, i)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	st.Close()
	n, st = open(t, dir, memory.Options{})
	defer st.Close()
	note, err := n.Read(ctx, me, "/log.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(note.Content, "\n")
	if len(lines) != writers*each || note.Version != writers*each {
		t.Fatalf("%d lines at version %d, want %d", len(lines), note.Version, writers*each)
	}
	for w := range writers {
		for i := range each {
			if !strings.Contains(note.Content, fmt.Sprintf("w%d-%d\n", w, i)) && !strings.HasSuffix(note.Content, fmt.Sprintf("w%d-%d", w, i)) {
				t.Fatalf("lost w%d-%d", w, i)
			}
		}
	}
	// The index came back with the store.
	if hits, _ := n.Search(ctx, me, "w3", "", 5); len(hits) != 1 || hits[0].Path != "/log.md" {
		t.Fatalf("search after reopen: %+v", hits)
	}
}

func TestSearchRanksAndSnippets(t *testing.T) {
	ctx := context.Background()
	n, st := open(t, t.TempDir(), memory.Options{})
	defer st.Close()
	for p, c := range map[string]string{
		"/topics/icp.md":         "Our ideal customer profile: B2B SaaS companies, 50-500 employees, Europe.",
		"/playbooks/outreach.md": "Open with the customer's problem. Never pitch in the first message.",
		"/tone.md":               "Friendly, short sentences. No jargon.",
	} {
		if _, err := n.Write(ctx, me, p, c, 0); err != nil {
			t.Fatal(err)
		}
	}
	hits, err := n.Search(ctx, me, "ideal customer", "", 10)
	if err != nil || len(hits) != 2 || hits[0].Path != "/topics/icp.md" || hits[0].Score <= hits[1].Score {
		t.Fatalf("ranking: %+v %v", hits, err)
	}
	if !strings.Contains(hits[0].Snippet, "ideal customer") {
		t.Fatalf("snippet: %q", hits[0].Snippet)
	}
	// The path counts: a note named for the query ranks first.
	if hits, _ := n.Search(ctx, me, "outreach", "", 10); len(hits) != 1 || hits[0].Path != "/playbooks/outreach.md" {
		t.Fatalf("path match: %+v", hits)
	}
	if hits, _ := n.Search(ctx, me, "customer", "/playbooks/", 10); len(hits) != 1 {
		t.Fatalf("prefix: %+v", hits)
	}
	if hits, _ := n.Search(ctx, memory.Space{Tenant: "other", Principal: "me"}, "customer", "", 10); len(hits) != 0 {
		t.Fatalf("another tenant's notes: %+v", hits)
	}
	// A rewrite moves the note in the index.
	if _, err := n.Write(ctx, me, "/tone.md", "Formal.", 0); err != nil {
		t.Fatal(err)
	}
	if hits, _ := n.Search(ctx, me, "jargon", "", 10); len(hits) != 0 {
		t.Fatalf("stale index: %+v", hits)
	}
}

func TestTools(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 11, 25, 8, 0, 0, 0, time.UTC)
	n, st := open(t, t.TempDir(), memory.Options{Now: func() time.Time { return now }})
	defer st.Close()
	call := func(name, in string) map[string]any {
		t.Helper()
		out, err := n.Call(ctx, owner, name, json.RawMessage(in))
		if err != nil {
			t.Fatalf("%s %s: %v", name, in, err)
		}
		var m map[string]any
		_ = json.Unmarshal(out, &m)
		return m
	}
	if got := call("save_memory_note", `{"content":"met Ada"}`); got["path"] != "/daily/2026-11-25.md" {
		t.Fatalf("daily note: %v", got)
	}
	if got := call("save_memory_note", `{"content":"more","title":"Q4 Plan!","kind":"Plans"}`); got["path"] != "/plans/q4-plan.md" {
		t.Fatalf("titled note: %v", got)
	}
	call("memory_write", `{"path":"/topics/icp.md","content":"B2B"}`)
	if got := call("memory_append", `{"path":"/topics/icp.md","content":"EU"}`); got["version"] != 2.0 {
		t.Fatalf("append: %v", got)
	}
	if got := call("memory_read", `{"path":"/topics/icp.md"}`); got["content"] != "B2B\nEU" {
		t.Fatalf("read: %v", got)
	}
	if got := call("memory_ls", `{"prefix":"/plans"}`); len(got["entries"].([]any)) != 1 {
		t.Fatalf("ls: %v", got)
	}
	if got := call("memory_search", `{"query":"ada"}`); len(got["hits"].([]any)) != 1 {
		t.Fatalf("search: %v", got)
	}
	for name, in := range map[string]string{
		"memory_write": `{"path":"/x","content":"y","ifVersion":3}`,
		"memory_read":  `{"path":"/nope"}`,
		"nope":         `{}`,
	} {
		if _, err := n.Call(ctx, owner, name, json.RawMessage(in)); err == nil {
			t.Errorf("%s %s: no error", name, in)
		}
	}
	if err := n.Check(ctx, owner, "memory_read", json.RawMessage(`{"path":"/a/../b"}`)); !errors.Is(err, memory.ErrInvalidPath) {
		t.Fatalf("check: %v", err)
	}
	if len(n.Tools()) != 6 {
		t.Fatalf("tools: %d", len(n.Tools()))
	}
}

// BenchmarkSearch10k measures memory_search over 10,000 notes of about
// 60 words each (the goal: p99 under 10 ms):
//
//	go test -run '^$' -bench Search10k ./memory
func BenchmarkSearch10k(b *testing.B) {
	ctx := context.Background()
	n, st := open(b, b.TempDir(), memory.Options{MaxNotes: 20000})
	defer st.Close()
	words := strings.Fields("customer profile outreach playbook tone pricing europe saas founder cto hiring churn renewal pipeline demo trial onboarding security compliance integration")
	for i := range 10000 {
		var sb strings.Builder
		for j := range 60 {
			sb.WriteString(words[(i*7+j*13)%len(words)])
			fmt.Fprintf(&sb, "%d ", (i+j)%97)
		}
		if _, err := n.Write(ctx, me, fmt.Sprintf("/notes/%05d.md", i), sb.String(), 0); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		if _, err := n.Search(ctx, me, words[i%len(words)]+" "+words[(i+5)%len(words)]+"3", "", 10); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	reportP99(b, lat)
}

// BenchmarkWrite measures durable note writes (each acknowledged on disk).
//
//	go test -run '^$' -bench 'Write$' ./memory
func BenchmarkWrite(b *testing.B) {
	ctx := context.Background()
	n, st := open(b, b.TempDir(), memory.Options{MaxNotes: 1 << 30})
	defer st.Close()
	for i := 0; b.Loop(); i++ {
		if _, err := n.Write(ctx, me, fmt.Sprintf("/w/%d.md", i%5000), "a note about customers and outreach", 0); err != nil {
			b.Fatal(err)
		}
	}
}

func reportP99(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
}
