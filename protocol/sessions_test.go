package protocol_test

import (
	"context"
	"errors"
	"testing"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
	"github.com/gatehouse-dev/gatehouse/protocol"
	"github.com/gatehouse-dev/gatehouse/session"
)

// TestSessionAccess: the one check every surface makes before it shows a
// session, against a real node's sessions: the role first (a refusal that
// says nothing of the session), then the look-up, then the owner rule (a
// refusal a surface answers as "not found").
func TestSessionAccess(t *testing.T) {
	ctx := context.Background()
	reg := nodetest.Start(t, node.Options{}).Node.Sessions
	alices, err := reg.Create(ctx, session.CreateRequest{Owner: "alice", Title: "alice's"})
	if err != nil {
		t.Fatal(err)
	}
	bobs, err := reg.Create(ctx, session.CreateRequest{Owner: "bob", Title: "bob's"})
	if err != nil {
		t.Fatal(err)
	}
	alice := &auth.Principal{Subject: "alice", Role: auth.RoleClient}
	for _, tc := range []struct {
		name string
		p    *auth.Principal
		act  auth.Action
		id   string
		want error
	}{
		{"the owner reads", alice, auth.ActRead, alices.ID, nil},
		{"the owner writes", alice, auth.ActWrite, alices.ID, nil},
		{"another's session", alice, auth.ActRead, bobs.ID, auth.ErrHidden},
		{"a missing session", alice, auth.ActRead, "nope", session.ErrNotFound},
		{"a role that may not, before the look-up", &auth.Principal{Subject: "r", Role: auth.RoleRunner}, auth.ActRead, "nope", auth.ErrForbidden},
		{"a channel may read, not write", &auth.Principal{Subject: "alice", Role: auth.RoleChannel}, auth.ActWrite, alices.ID, auth.ErrForbidden},
		{"an admin reads anyone's", &auth.Principal{Subject: "root", Role: auth.RoleAdmin}, auth.ActRead, bobs.ID, nil},
		{"no principal", nil, auth.ActRead, alices.ID, auth.ErrForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := protocol.Session(ctx, reg, tc.p, tc.act, tc.id)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Session: %v, want %v", err, tc.want)
			}
			if err == nil && s.ID != tc.id {
				t.Fatalf("Session gave %s, want %s", s.ID, tc.id)
			}
		})
	}

	// Lists hold what the caller may read, narrowed by the surface.
	page, err := protocol.ListSessions(ctx, reg, alice, session.ListRequest{})
	if err != nil || len(page.Sessions) != 1 || page.Sessions[0].ID != alices.ID {
		t.Fatalf("alice's list: %+v %v", page.Sessions, err)
	}
	root := &auth.Principal{Subject: "root", Role: auth.RoleAdmin}
	page, err = protocol.ListSessions(ctx, reg, root, session.ListRequest{Visible: func(s *session.Session) bool { return s.Owner == "bob" }})
	if err != nil || len(page.Sessions) != 1 || page.Sessions[0].ID != bobs.ID {
		t.Fatalf("an admin's list narrowed to bob's: %+v %v", page.Sessions, err)
	}
	if _, err := protocol.ListSessions(ctx, reg, &auth.Principal{Subject: "a", Role: auth.RoleAgent}, session.ListRequest{}); !errors.Is(err, auth.ErrForbidden) {
		t.Fatalf("an agent's list: %v, want ErrForbidden", err)
	}
}
