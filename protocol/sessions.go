package protocol

import (
	"context"

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

// ListSessions returns a page of the sessions p may read; req.Visible,
// when set, narrows them further (to the surface's own sessions, say).
func ListSessions(ctx context.Context, sessions *session.Registry, p *auth.Principal, req session.ListRequest) (session.ListPage, error) {
	if err := p.Can(auth.ActRead, auth.KindSession); err != nil {
		return session.ListPage{}, err
	}
	keep := req.Visible
	req.Visible = func(s *session.Session) bool {
		return (keep == nil || keep(s)) && p.Authorize(auth.ActRead, SessionResource(s)) == nil
	}
	return sessions.List(ctx, req)
}
