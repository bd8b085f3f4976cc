package session_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/session"
)

// TestListingReadsOnlyTheOwnersSessions: a listing scoped to an owner
// reads that owner's sessions and no one else's (Visible is asked about
// nothing else), in id order, page by page; another tenant's principal of
// the same name is another owner.
func TestListingReadsOnlyTheOwnersSessions(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	var mine []string
	for i := range 5 {
		for _, o := range [][2]string{{"alice", ""}, {"bob", ""}, {"alice", "acme"}} {
			id := fmt.Sprintf("%s-%s-%d", o[0], o[1], i)
			if _, err := w.reg.Create(ctx, session.CreateRequest{ID: id, Owner: o[0], Tenant: o[1]}); err != nil {
				t.Fatal(err)
			}
			if o == [2]string{"alice", ""} {
				mine = append(mine, id)
			}
		}
	}
	// One made implicitly by the execution API is indexed too.
	if _, _, err := w.k.Create(ctx, kernel.CreateRequest{AgentID: "ag", SessionID: "alice--x"}, kernel.Meta{Principal: "alice"}); err != nil {
		t.Fatal(err)
	}
	mine = append(mine, "alice--x")
	slices.Sort(mine)

	var got, asked []string
	after := ""
	for {
		page, err := w.reg.List(ctx, session.ListRequest{Owner: "alice", After: after, Limit: 2, Visible: func(s *session.Session) bool {
			asked = append(asked, s.ID)
			return true
		}})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range page.Sessions {
			got = append(got, s.ID)
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	if !slices.Equal(got, mine) {
		t.Fatalf("alice's listing: %v, want %v", got, mine)
	}
	for _, id := range asked {
		if !slices.Contains(mine, id) {
			t.Fatalf("listing alice's sessions read %s", id)
		}
	}
}

// TestSessionQuota: an owner holds at most MaxPerOwner sessions, however
// they are made (Create, or the execution API naming a new one); past it a
// new one is ErrQuota with the figures, another owner is not affected, a
// create that fails (a taken id) takes no slot, and the count survives a
// restart.
func TestSessionQuota(t *testing.T) {
	dir := t.TempDir()
	w := open(t, dir, session.Options{MaxPerOwner: 3})
	ctx := context.Background()
	create := func(w *world, id, owner string) error {
		_, err := w.reg.Create(ctx, session.CreateRequest{ID: id, Owner: owner})
		return err
	}
	for _, id := range []string{"q1", "q2"} {
		if err := create(w, id, "alice"); err != nil {
			t.Fatal(err)
		}
	}
	if err := create(w, "q1", "alice"); !errors.Is(err, session.ErrExists) {
		t.Fatalf("a taken id: %v, want ErrExists", err)
	}
	if _, _, err := w.k.Create(ctx, kernel.CreateRequest{AgentID: "ag", SessionID: "q3"}, kernel.Meta{Principal: "alice"}); err != nil {
		t.Fatalf("the third session, made by the execution API: %v", err)
	}
	wantQuota := func(err error) {
		t.Helper()
		var qe *session.QuotaError
		if !errors.As(err, &qe) || !errors.Is(err, session.ErrQuota) || qe.Held != 3 || qe.Max != 3 || qe.Owner != "alice" {
			t.Fatalf("past the quota: %v, want a QuotaError for alice holding 3 of 3", err)
		}
	}
	wantQuota(create(w, "q4", "alice"))
	_, _, err := w.k.Create(ctx, kernel.CreateRequest{AgentID: "ag", SessionID: "q5"}, kernel.Meta{Principal: "alice"})
	wantQuota(err)
	if err := create(w, "b1", "bob"); err != nil {
		t.Fatalf("another owner: %v", err)
	}
	w.close()

	w = open(t, dir, session.Options{MaxPerOwner: 3})
	defer w.close()
	wantQuota(create(w, "q6", "alice"))
	if err := create(w, "b2", "bob"); err != nil {
		t.Fatalf("another owner after a restart: %v", err)
	}
}
