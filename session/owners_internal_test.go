package session

import (
	"context"
	"slices"
	"testing"

	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/store/storetest"
)

// TestOwnerKeys: an owner's index prefix is one no other owner's starts
// with, whatever the characters, and parses back.
func TestOwnerKeys(t *testing.T) {
	owners := [][2]string{{"", "a"}, {"", "ab"}, {"a", "b"}, {"ab", ""}, {"a", "b/c"}, {"a/1:", "x"}, {"1:a", "2:b"}}
	for i, a := range owners {
		ka := ownerKey(a[0], a[1])
		prefix, id, ok := parseOwned(ka + "s-1")
		if !ok || prefix != ka || id != "s-1" {
			t.Fatalf("parseOwned(%q) = %q %q %v", ka+"s-1", prefix, id, ok)
		}
		for j, b := range owners {
			if i != j && len(ownerKey(b[0], b[1])) >= len(ka) && ownerKey(b[0], b[1])[:len(ka)] == ka {
				t.Fatalf("owner %q's prefix %q starts owner %q's %q", a, ka, b, ownerKey(b[0], b[1]))
			}
		}
	}
}

// TestOwnerIndexCoversSessionsOfAnEarlierRelease: sessions a release
// without the owner index wrote are indexed when the registry opens, once,
// and are then listed and counted like any.
func TestOwnerIndexCoversSessionsOfAnEarlierRelease(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	st := storetest.Open(t, store.Options{Dir: dir})
	r, err := New(Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"old-1", "old-2"} {
		if _, err := r.Create(ctx, CreateRequest{ID: id, Owner: "alice"}); err != nil {
			t.Fatal(err)
		}
	}
	r.Close()
	// What the earlier release left: sessions, no index.
	var b store.Batch
	b.Delete(kindMeta, metaOwnerIndex)
	for _, id := range []string{"old-1", "old-2"} {
		b.Delete(kindOwned, ownerKey("", "alice")+id)
	}
	if err := st.Write(ctx, &b); err != nil {
		t.Fatal(err)
	}
	if page, err := r.List(ctx, ListRequest{Owner: "alice"}); err != nil || len(page.Sessions) != 0 {
		t.Fatalf("the index was not removed: %+v %v", page, err)
	}

	r, err = New(Options{Store: st, MaxPerOwner: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	page, err := r.List(ctx, ListRequest{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range page.Sessions {
		ids = append(ids, s.ID)
	}
	if !slices.Equal(ids, []string{"old-1", "old-2"}) {
		t.Fatalf("alice's sessions after indexing: %v", ids)
	}
	if _, err := r.Create(ctx, CreateRequest{ID: "new", Owner: "alice"}); err == nil {
		t.Fatal("the indexed sessions do not count toward the quota")
	}
}
