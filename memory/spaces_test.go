package memory_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/memory"
	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/store/storetest"
)

// callAs runs tool name for o and returns its output, or its error.
func callAs(t *testing.T, n *memory.Notes, o memory.Owner, name, in string) (map[string]any, error) {
	t.Helper()
	out, err := n.Call(context.Background(), o, name, json.RawMessage(in))
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	return m, nil
}

// TestNotesBelongToTheirPrincipal: a principal's notes are, to every other
// principal (of its tenant, of another, without one), notes that do not
// exist: a read answers exactly as for an unknown path, a search and a
// listing find nothing. A tenant's shared space is reached by naming it,
// by every principal of that tenant and by no one else; the principals
// without a tenant share theirs with each other only.
func TestNotesBelongToTheirPrincipal(t *testing.T) {
	n, st := open(t, t.TempDir(), memory.Options{})
	defer st.Close()
	ada := memory.Owner{Tenant: "acme", Principal: "ada"}
	bob := memory.Owner{Tenant: "acme", Principal: "bob"}
	adaElsewhere := memory.Owner{Tenant: "globex", Principal: "ada"}
	carol := memory.Owner{Principal: "carol"}
	dave := memory.Owner{Principal: "dave"}
	if _, err := callAs(t, n, ada, "memory_write", `{"path":"/private/plan.md","content":"acquire globex quietly"}`); err != nil {
		t.Fatal(err)
	}
	if _, err := callAs(t, n, carol, "memory_write", `{"path":"/private/carol.md","content":"carol keeps quiet"}`); err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]memory.Owner{"bob": bob, "ada of another tenant": adaElsewhere, "carol": carol, "dave": dave} {
		_, hidden := callAs(t, n, o, "memory_read", `{"path":"/private/plan.md"}`)
		_, missing := callAs(t, n, o, "memory_read", `{"path":"/private/none.md"}`)
		if !errors.Is(hidden, memory.ErrNotFound) || strings.ReplaceAll(missing.Error(), "none", "plan") != hidden.Error() {
			t.Errorf("%s reading ada's note: %v, unlike an unknown note: %v", name, hidden, missing)
		}
		if got, err := callAs(t, n, o, "memory_search", `{"query":"globex quietly"}`); err != nil || len(got["hits"].([]any)) != 0 {
			t.Errorf("%s's search finds ada's note: %v %v", name, got, err)
		}
		got, err := callAs(t, n, o, "memory_ls", `{"prefix":"/private/p"}`)
		if err != nil || len(got["entries"].([]any)) != 0 {
			t.Errorf("%s lists ada's note: %v %v", name, got, err)
		}
	}
	if got, err := callAs(t, n, ada, "memory_read", `{"path":"/private/plan.md"}`); err != nil || got["content"] != "acquire globex quietly" {
		t.Fatalf("ada's own note: %v %v", got, err)
	}

	// The tenant's shared space, named.
	if _, err := callAs(t, n, ada, "memory_write", `{"path":"/team/tone.md","content":"brief","space":"tenant"}`); err != nil {
		t.Fatal(err)
	}
	if got, err := callAs(t, n, bob, "memory_read", `{"path":"/team/tone.md","space":"tenant"}`); err != nil || got["content"] != "brief" {
		t.Fatalf("bob reading acme's shared note: %v %v", got, err)
	}
	if got, err := callAs(t, n, bob, "memory_search", `{"query":"brief","space":"tenant"}`); err != nil || len(got["hits"].([]any)) != 1 {
		t.Fatalf("bob searching acme's shared notes: %v %v", got, err)
	}
	for name, c := range map[string]struct {
		o     memory.Owner
		space string
	}{"bob's own space": {bob, ""}, "globex's shared space": {adaElsewhere, "tenant"}, "the tenantless' shared space": {carol, "tenant"}} {
		if _, err := callAs(t, n, c.o, "memory_read", `{"path":"/team/tone.md","space":"`+c.space+`"}`); !errors.Is(err, memory.ErrNotFound) {
			t.Errorf("%s holds acme's shared note: %v", name, err)
		}
	}
	// Without a tenant, the shared space is the tenantless principals'.
	if _, err := callAs(t, n, carol, "memory_append", `{"path":"/lobby.md","content":"hello","space":"tenant"}`); err != nil {
		t.Fatal(err)
	}
	if got, err := callAs(t, n, dave, "memory_read", `{"path":"/lobby.md","space":"tenant"}`); err != nil || got["content"] != "hello" {
		t.Fatalf("dave reading the tenantless' shared note: %v %v", got, err)
	}
	if _, err := callAs(t, n, ada, "memory_read", `{"path":"/lobby.md","space":"tenant"}`); !errors.Is(err, memory.ErrNotFound) {
		t.Fatalf("acme reads the tenantless' shared note: %v", err)
	}
	if _, err := callAs(t, n, ada, "memory_ls", `{"space":"everyone"}`); !errors.Is(err, memory.ErrInvalid) {
		t.Fatalf("an unknown space: %v", err)
	}
}

// TestQuotas: a space keeps at most MaxNotes notes and MaxBytes bytes, a
// tenant's spaces together MaxTenantNotes and MaxTenantBytes; a refusal
// says which quota, Check refuses the same write before it runs, and a
// write that does not grow passes even at the quota. Principals without a
// tenant have no tenant quota to share.
func TestQuotas(t *testing.T) {
	ctx := context.Background()
	n, st := open(t, t.TempDir(), memory.Options{MaxNotes: 3, MaxBytes: 100, MaxTenantNotes: 4, MaxTenantBytes: 150})
	defer st.Close()
	ada := memory.Owner{Tenant: "acme", Principal: "ada"}
	bob := memory.Owner{Tenant: "acme", Principal: "bob"}
	quota := func(err error, scope, resource string, limit int64) {
		t.Helper()
		var qe *memory.QuotaError
		if !errors.As(err, &qe) || !errors.Is(err, memory.ErrQuota) || *qe != (memory.QuotaError{Scope: scope, Resource: resource, Max: limit}) {
			t.Fatalf("%v, want the %s quota of %d %s", err, scope, limit, resource)
		}
	}
	write := func(o memory.Owner, in string) error {
		t.Helper()
		if err := n.Check(ctx, o, "memory_write", json.RawMessage(in)); err != nil {
			return err
		}
		_, err := n.Call(ctx, o, "memory_write", json.RawMessage(in))
		return err
	}
	for _, p := range []string{"/a", "/b", "/c"} {
		if err := write(ada, `{"path":"`+p+`","content":"0123456789"}`); err != nil {
			t.Fatal(err)
		}
	}
	in := `{"path":"/d","content":"x"}`
	quota(n.Check(ctx, ada, "memory_write", json.RawMessage(in)), "space", "notes", 3)
	_, err := n.Call(ctx, ada, "memory_write", json.RawMessage(in))
	quota(err, "space", "notes", 3)
	quota(write(ada, `{"path":"/a","content":"`+strings.Repeat("x", 81)+`"}`), "space", "bytes", 100)
	if err := write(ada, `{"path":"/a","content":"`+strings.Repeat("x", 80)+`"}`); err != nil {
		t.Fatalf("up to the byte quota: %v", err)
	}
	quota(n.Check(ctx, ada, "memory_append", json.RawMessage(`{"path":"/b","content":""}`)), "space", "bytes", 100)
	// The tenant's quotas count bob's notes with ada's.
	if err := write(bob, `{"path":"/e","content":"0123456789"}`); err != nil {
		t.Fatal(err)
	}
	quota(write(bob, `{"path":"/f","content":"x"}`), "tenant", "notes", 4)
	quota(write(bob, `{"path":"/e","content":"`+strings.Repeat("x", 51)+`"}`), "tenant", "bytes", 150)
	// Shrinking passes at any quota.
	if err := write(bob, `{"path":"/e","content":"y"}`); err != nil {
		t.Fatalf("a write that shrinks: %v", err)
	}
	// Without a tenant, only the space's quotas count.
	for i, o := range []memory.Owner{{Principal: "carol"}, {Principal: "dave"}} {
		for _, p := range []string{"/a", "/b", "/c"} {
			if err := write(o, `{"path":"`+p+`","content":"0123456789"}`); err != nil {
				t.Fatalf("tenantless principal %d: %v", i, err)
			}
		}
	}
	// A quota refusal leaves everything as it was, and the usage holds
	// across a restart.
	dir := t.TempDir()
	n2, st2 := open(t, dir, memory.Options{MaxNotes: 1})
	if _, err := n2.Write(ctx, me, "/one", "1", 0); err != nil {
		t.Fatal(err)
	}
	st2.Close()
	n2, st2 = open(t, dir, memory.Options{MaxNotes: 1})
	defer st2.Close()
	if _, err := n2.Write(ctx, me, "/two", "2", 0); !errors.Is(err, memory.ErrQuota) {
		t.Fatalf("after a restart: %v", err)
	}
	if ls, _ := n2.List(ctx, me, ""); len(ls) != 1 {
		t.Fatalf("after a refused write: %v", ls)
	}
}

// legacyNote is a note as the release before spaces stored it.
type legacyNote struct {
	Path      string    `msgpack:"p"`
	Content   string    `msgpack:"c"`
	Version   uint64    `msgpack:"v"`
	CreatedAt time.Time `msgpack:"ca"`
	UpdatedAt time.Time `msgpack:"ua"`
}

// TestEarlierNotesMoveIntoSpaces: notes stored per tenant by the release
// before spaces are, after the next start, in their tenant's shared space
// with their content, version and times, found by search; a note without
// a tenant is in the sole principal's own space when there is one, else
// in the shared space of the principals without a tenant. The old records
// are gone, and a further start moves nothing again.
func TestEarlierNotesMoveIntoSpaces(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		legacyOwner string
		tenantless  memory.Space
	}{
		{"local", memory.Space{Principal: "local"}},
		{"", memory.Space{Shared: true}},
	} {
		dir := t.TempDir()
		st := storetest.Open(t, store.Options{Dir: dir})
		var b store.Batch
		for id, note := range map[string]legacyNote{
			"4:acme/topics/icp.md":   {Path: "/topics/icp.md", Content: "Ideal customer: B2B SaaS.", Version: 3, CreatedAt: at, UpdatedAt: at.Add(time.Hour)},
			"0:/daily/2026-01-02.md": {Path: "/daily/2026-01-02.md", Content: "met Ada", Version: 1, CreatedAt: at, UpdatedAt: at},
		} {
			if err := b.Put("memnote", id, &note); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.Write(ctx, &b); err != nil {
			t.Fatal(err)
		}
		st.Close()
		for range 2 {
			st = storetest.Open(t, store.Options{Dir: dir})
			n, err := memory.Open(ctx, memory.Options{Store: st, LegacyOwner: c.legacyOwner})
			if err != nil {
				t.Fatal(err)
			}
			acme := memory.Space{Tenant: "acme", Shared: true}
			note, err := n.Read(ctx, acme, "/topics/icp.md")
			if err != nil || note.Content != "Ideal customer: B2B SaaS." || note.Version != 3 || !note.CreatedAt.Equal(at) || !note.UpdatedAt.Equal(at.Add(time.Hour)) {
				t.Fatalf("acme's note: %+v %v", note, err)
			}
			if hits, err := n.Search(ctx, acme, "customer", "", 10); err != nil || len(hits) != 1 {
				t.Fatalf("acme's note is not found: %v %v", hits, err)
			}
			if note, err := n.Read(ctx, c.tenantless, "/daily/2026-01-02.md"); err != nil || note.Content != "met Ada" {
				t.Fatalf("legacy owner %q: the tenantless note: %+v %v", c.legacyOwner, note, err)
			}
			if _, err := n.Read(ctx, memory.Space{Tenant: "acme", Principal: "ada"}, "/topics/icp.md"); !errors.Is(err, memory.ErrNotFound) {
				t.Fatalf("the note is in a principal's space too: %v", err)
			}
			left := 0
			if err := st.Records("memnote", func(string, func(any) error) bool { left++; return true }); err != nil || left != 0 {
				t.Fatalf("%d records of the old layout left: %v", left, err)
			}
			st.Close()
		}
	}
}
