package protocol

import (
	"context"
	"errors"
	"fmt"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/session"
)

// SessionResource describes a session to the access rule.
func SessionResource(s *session.Session) auth.Resource {
	return auth.Resource{Kind: auth.KindSession, ID: s.ID, Owner: auth.Owner{Principal: s.Owner, Tenant: s.Tenant}, AgentID: s.AgentID}
}

// Session returns session id if p may perform act on it. Its errors say
// which check refused, for each surface to word in its protocol: the
// role's (auth.ErrForbidden), the registry's (session.ErrNotFound, ...),
// then the access rule's for another's session (auth.ErrHidden).
func Session(ctx context.Context, sessions *session.Registry, p *auth.Principal, act auth.Action, id string) (session.Session, error) {
	if err := p.Can(act, auth.KindSession); err != nil {
		return session.Session{}, err
	}
	sess, err := sessions.Get(ctx, id)
	if err != nil {
		return session.Session{}, err
	}
	if err := p.Authorize(act, SessionResource(&sess)); err != nil {
		return session.Session{}, err
	}
	return sess, nil
}

// CreateSession makes a session for p, who owns it. An id that is taken
// is refused the way a read of it would be: p's own session (or one p may
// read) is session.ErrExists, 409, as p may learn that; anyone else's is
// ErrHidden, which every surface words exactly as a session that does not
// exist. A create cannot help telling that an id is not free, but it
// tells no more than that: not whose, not "exists".
func CreateSession(ctx context.Context, sessions *session.Registry, p *auth.Principal, req session.CreateRequest) (session.Session, error) {
	if err := p.Can(auth.ActWrite, auth.KindSession); err != nil {
		return session.Session{}, err
	}
	req.Owner, req.Tenant = p.Subject, p.Tenant
	sess, err := sessions.Create(ctx, req)
	if !errors.Is(err, session.ErrExists) {
		return sess, err
	}
	taken, gerr := sessions.Get(ctx, req.ID)
	if gerr != nil || p.Authorize(auth.ActRead, SessionResource(&taken)) != nil {
		return session.Session{}, fmt.Errorf("%w: session %s", auth.ErrHidden, req.ID)
	}
	return session.Session{}, err
}

// ListSessions returns a page of the sessions p may read; req.Visible,
// when set, narrows them further (to the surface's own sessions, say). A
// caller that reads only its own sessions (all but admins) lists them
// through the owner index, never reading another's.
func ListSessions(ctx context.Context, sessions *session.Registry, p *auth.Principal, req session.ListRequest) (session.ListPage, error) {
	if err := p.Can(auth.ActRead, auth.KindSession); err != nil {
		return session.ListPage{}, err
	}
	if p.Role != auth.RoleAdmin {
		req.Owner, req.Tenant = p.Subject, p.Tenant
	}
	keep := req.Visible
	req.Visible = func(s *session.Session) bool {
		return (keep == nil || keep(s)) && p.Authorize(auth.ActRead, SessionResource(s)) == nil
	}
	return sessions.List(ctx, req)
}
