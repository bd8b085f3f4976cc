package gateway

import (
	"context"
	"errors"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
)

func (s *Server) actionRoutes(r *router) {
	if s.opts.Bridge == nil {
		return
	}
	r.add("GET", "/v0/actions", false, s.listActions)
	r.add("GET", "/v0/actions/{}", false, s.getAction)
	r.add("POST", "/v0/actions/{}/respond", false, s.respondAction)
}

// mayRead reports whether p may see the prompts of owner: admins see all;
// a person (channel or client role) sees their own.
func mayRead(p *auth.Principal, owner string) error {
	switch {
	case p.Role == auth.RoleAdmin:
		return nil
	case (p.Role == auth.RoleChannel || p.Role == auth.RoleClient) && p.Subject == owner:
		return nil
	}
	return &gatewayError{kind: auth.ErrForbidden, msg: "forbidden: " + string(p.Role) + " " + strconv.Quote(p.Subject) + " may not see or answer prompts of " + strconv.Quote(owner)}
}

// actionError maps bridge errors like the kernel's.
func actionError(err error) error {
	if errors.Is(err, bridge.ErrNotFound) {
		return &gatewayError{kind: kernel.ErrNotFound, msg: "not found: " + err.Error()}
	}
	if errors.Is(err, bridge.ErrDecision) {
		return kernelValidation(err.Error())
	}
	return err
}

// listActions answers GET /v0/actions[?status=&cursor=&limit=].
func (s *Server) listActions(c *call) {
	args := c.ctx.QueryArgs()
	state := string(args.Peek("status"))
	switch state {
	case "", bridge.StatePending, bridge.StateApproved, bridge.StateDenied, bridge.StateExpired, bridge.StateCancelled:
	default:
		s.writeError(c.ctx, kernelValidation("invalid status filter "+strconv.Quote(state)))
		return
	}
	owner := ""
	if c.principal.Role != auth.RoleAdmin {
		if err := mayRead(c.principal, c.principal.Subject); err != nil {
			s.writeError(c.ctx, err)
			return
		}
		owner = c.principal.Subject
	}
	limit, _ := strconv.Atoi(string(args.Peek("limit")))
	if limit <= 0 || limit > 200 {
		limit = 50
	}
	recs, next, err := s.opts.Bridge.List(c.ctx, state, owner, string(args.Peek("cursor")), limit)
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, map[string]any{"actions": recs, "next_cursor": next})
}

func (s *Server) getAction(c *call) {
	rec, err := s.opts.Bridge.Get(c.params[0])
	if err != nil {
		s.writeError(c.ctx, actionError(err))
		return
	}
	if err := mayRead(c.principal, rec.Owner); err != nil {
		s.writeError(c.ctx, err)
		return
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, rec)
}

// RespondRequest is the body of POST /v0/actions/{id}/respond.
type RespondRequest struct {
	Decision     string `json:"decision"` // allow_once, allow_always or deny
	Reason       string `json:"reason"`
	ChannelID    string `json:"channel_id"`
	NativePeerID string `json:"native_peer_id"`
}

// respondAction answers a prompt. The first valid answer wins; any later
// one gets 409 with the recorded outcome in details.recorded.
func (s *Server) respondAction(c *call) {
	var req RespondRequest
	if err := decode(c.ctx, &req, s.opts.MaxBodyBytes); err != nil {
		s.writeError(c.ctx, err)
		return
	}
	status, body, after, err := s.respond(c.ctx, c.principal, c.params[0], req, meta(c.ctx))
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	s.writeJSONThen(c.ctx, status, body, after)
}

// respond is the shared answer path of HTTP and channel sockets.
func (s *Server) respond(ctx context.Context, p *auth.Principal, actionID string, req RespondRequest, m kernel.Meta) (int, any, kernel.After, error) {
	if len(req.Reason) > 4096 || len(req.ChannelID) > 256 || len(req.NativePeerID) > 256 {
		return 0, nil, nil, kernelValidation("reason is limited to 4096 bytes, channel_id and native_peer_id to 256")
	}
	outcome, scope, err := bridge.ParseDecision(req.Decision)
	if err != nil {
		return 0, nil, nil, actionError(err)
	}
	rec, err := s.opts.Bridge.Get(actionID)
	if err != nil {
		return 0, nil, nil, actionError(err)
	}
	if p.Role == auth.RoleAgent || p.Role == auth.RoleRunner {
		// An agent must never approve its own tool calls, nor a runner.
		return 0, nil, nil, &gatewayError{kind: auth.ErrForbidden, msg: "forbidden: an " + string(p.Role) + " may not answer permission prompts"}
	}
	if err := mayRead(p, rec.Owner); err != nil {
		return 0, nil, nil, err
	}
	if rec.State != bridge.StatePending {
		return 0, nil, nil, recordedConflict(rec)
	}
	d := kernel.Decision{Outcome: outcome, Scope: scope, Reason: req.Reason, DecidedBy: &kernel.DecidedBy{
		Principal: p.Subject, ChannelID: req.ChannelID, NativePeerID: req.NativePeerID,
	}}
	after, err := s.k.ResolveApproval(ctx, rec.ExecutionID, actionID, d, m)
	if err != nil {
		if errors.Is(err, kernel.ErrConflict) {
			// Someone answered first (or the execution ended): say what won.
			if cur, gerr := s.opts.Bridge.Get(actionID); gerr == nil {
				return 0, nil, nil, recordedConflict(cur)
			}
		}
		return 0, nil, nil, err
	}
	if s.opts.Channels != nil && req.ChannelID != "" {
		s.opts.Channels.Returned(rec.Owner, req.ChannelID, req.NativePeerID, actionID, req.Decision)
	}
	cur, err := s.opts.Bridge.Get(actionID)
	if err != nil {
		after.Run()
		return 0, nil, nil, actionError(err)
	}
	return fasthttp.StatusOK, cur, after, nil
}

// recordedConflict is the answer to a late or repeated response.
func recordedConflict(rec bridge.Record) error {
	e := &detailedError{gatewayError: gatewayError{kind: kernel.ErrConflict,
		msg: "conflict: action " + rec.ActionID + " is already " + rec.State}, details: map[string]any{"recorded": rec}}
	return e
}

// detailedError is a gateway error with details for the error body.
type detailedError struct {
	gatewayError
	details any
}

// Details returns the error's details for the error body.
func (e *detailedError) Details() any { return e.details }
