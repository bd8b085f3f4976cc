package gateway

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/protocol"
	"github.com/gatehouse-dev/gatehouse/session"
)

// Every door asks auth.Principal.Authorize; the helpers below only describe
// the resources to it and turn its "hidden" into the answer a missing
// resource gets on the same route, word for word, so that a refusal never
// tells a caller that someone else's id exists.

// allow applies the access rule to r; missing is the error the route gives
// for a resource that does not exist.
func allow(p *auth.Principal, act auth.Action, r auth.Resource, missing error) error {
	err := p.Authorize(act, r)
	if errors.Is(err, auth.ErrHidden) {
		return missing
	}
	return err
}

// ownerOf turns the owner strings the kernel keeps into an auth.Owner.
func ownerOf(principal, tenant string) auth.Owner {
	return auth.Owner{Principal: principal, Tenant: tenant}
}

func executionResource(v *kernel.View) auth.Resource {
	return auth.Resource{Kind: auth.KindExecution, ID: v.ID, Owner: ownerOf(v.Owner, v.Tenant), AgentID: v.AgentID}
}

func summaryResource(s *kernel.Summary) auth.Resource {
	return auth.Resource{Kind: auth.KindExecution, ID: s.ID, Owner: ownerOf(s.Owner, s.Tenant), AgentID: s.AgentID}
}

func actionResource(r *bridge.Record) auth.Resource {
	return auth.Resource{Kind: auth.KindAction, ID: r.ActionID, Owner: ownerOf(r.Owner, r.Tenant)}
}

func agentResource(id string) auth.Resource {
	return auth.Resource{Kind: auth.KindAgent, ID: id, AgentID: id}
}

func runnerResource(id string) auth.Resource {
	return auth.Resource{Kind: auth.KindRunner, ID: id, RunnerID: id}
}

// actAsRunner applies the access rule to p acting as runner runnerID. A
// built-in runner of the gateway (the memory runner) is no credential's to
// act as, the admin's included: it serves other tenants' memory jobs.
func (s *Server) actAsRunner(p *auth.Principal, runnerID string) error {
	if s.k.BuiltinRunner(runnerID) {
		return fmt.Errorf("%w: runner id %q is the gateway's own built-in runner", auth.ErrForbidden, runnerID)
	}
	return p.Authorize(auth.ActAct, runnerResource(runnerID))
}

// mayServe checks every capability a runner declares: a tool reserved for
// a built-in runner is refused whoever declares it, and any other must be
// one the credential is trusted with (auth.Principal.MayServe). The first
// refusal refuses the whole declaration, which then changes nothing: a
// runner is never left serving less than it said without being told.
func (s *Server) mayServe(p *auth.Principal, caps []string) error {
	for _, c := range caps {
		if owner, reserved := s.k.ReservedTool(c); reserved {
			return fmt.Errorf("%w: %w: %s is reserved for the gateway's built-in runner %q",
				auth.ErrForbidden, auth.ErrToolNotAllowed, strconv.Quote(c), owner)
		}
		if err := p.MayServe(c); err != nil {
			return err
		}
	}
	return nil
}

// channelResource is a person's channels; tenant is that person's, when
// known.
func channelResource(owner, tenant string) auth.Resource {
	return auth.Resource{Kind: auth.KindChannel, ID: owner, Owner: ownerOf(owner, tenant)}
}

// execution looks execution id up for p to act on. missing, when not nil,
// replaces the answer for an execution that does not exist or is hidden
// from p; nil keeps the kernel's "not found: execution <id>".
func (s *Server) execution(ctx context.Context, p *auth.Principal, act auth.Action, id string, missing error) (kernel.View, error) {
	if err := p.Can(act, auth.KindExecution); err != nil {
		return kernel.View{}, err
	}
	v, err := s.k.Get(ctx, id)
	if err != nil {
		if missing != nil && errors.Is(err, kernel.ErrNotFound) {
			return kernel.View{}, missing
		}
		return kernel.View{}, err
	}
	if missing == nil {
		missing = notFound("execution", id)
	}
	if err := allow(p, act, executionResource(&v), missing); err != nil {
		return kernel.View{}, err
	}
	return v, nil
}

// touch checks that p may perform act on execution id, for a route that
// hands the id to the kernel next. An admin without a tenant needs no
// look-up: the kernel answers an unknown id itself, with missing's words
// (nil: the kernel's own). An empty id is left to the kernel to refuse.
func (s *Server) touch(ctx context.Context, p *auth.Principal, act auth.Action, id string, missing error) error {
	if err := p.Can(act, auth.KindExecution); err != nil {
		return err
	}
	if p.Unconfined() || id == "" {
		return nil
	}
	_, err := s.execution(ctx, p, act, id, missing)
	return err
}

// Sessions is what the gateway reads of the durable sessions.
type Sessions interface {
	Get(ctx context.Context, id string) (session.Session, error)
}

// maySessionWork checks that p may file new work in session id: a session
// that exists must be p's (another's answers as a missing one would); one
// that does not is made for p.
func (s *Server) maySessionWork(ctx context.Context, p *auth.Principal, id string) error {
	if id == "" || s.opts.Sessions == nil {
		return nil
	}
	sess, err := s.opts.Sessions.Get(ctx, id)
	switch {
	case errors.Is(err, session.ErrNotFound):
		return nil
	case err != nil:
		return &gatewayError{kind: kernel.ErrUnavailable, msg: "service unavailable: " + err.Error()}
	}
	return allow(p, auth.ActWrite, protocol.SessionResource(&sess), notFound("session", id))
}
