package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/protocol"
)

func (s *Server) actionRoutes(r *router) {
	if s.opts.Bridge == nil {
		return
	}
	r.add("GET", "/v0/actions", false, s.listActions)
	r.add("GET", "/v0/actions/{}", false, s.getAction)
	r.add("POST", "/v0/actions/{}/respond", false, s.respondAction)
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

// actionMissing is the answer for an unknown prompt, and for another's.
func actionMissing(actionID string) error {
	return actionError(fmt.Errorf("%w: %s", bridge.ErrNotFound, actionID))
}

// listActions answers GET /v0/actions[?status=&cursor=&limit=].
func (s *Server) listActions(c *call) error {
	args := c.ctx.QueryArgs()
	state := string(args.Peek("status"))
	switch state {
	case "", bridge.StatePending, bridge.StateApproved, bridge.StateDenied, bridge.StateExpired, bridge.StateCancelled:
	default:
		return kernelValidation("invalid status filter " + strconv.Quote(state))
	}
	p := c.principal
	if err := p.Can(auth.ActRead, auth.KindAction); err != nil {
		return err
	}
	var visible func(*bridge.Record) bool
	if !p.Unconfined() {
		visible = func(r *bridge.Record) bool { return p.Authorize(auth.ActRead, actionResource(r)) == nil }
	}
	limit, _ := strconv.Atoi(string(args.Peek("limit")))
	if limit <= 0 || limit > 200 {
		limit = 50
	}
	recs, next, err := s.opts.Bridge.List(c.ctx, state, visible, string(args.Peek("cursor")), limit)
	if err != nil {
		return err
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, map[string]any{"actions": recs, "next_cursor": next})
	return nil
}

func (s *Server) getAction(c *call) error {
	if err := c.principal.Can(auth.ActRead, auth.KindAction); err != nil {
		return err
	}
	rec, err := s.opts.Bridge.Get(c.params[0])
	if err != nil {
		return actionError(err)
	}
	if err := allow(c.principal, auth.ActRead, actionResource(&rec), actionMissing(rec.ActionID)); err != nil {
		return err
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, rec)
	return nil
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
func (s *Server) respondAction(c *call) error {
	var req RespondRequest
	if err := decode(c.ctx, &req, s.opts.MaxBodyBytes); err != nil {
		return err
	}
	status, body, after, err := s.respond(c.ctx, c.principal, c.params[0], req, meta(c.ctx))
	if err != nil {
		return err
	}
	s.writeJSONThen(c.ctx, status, body, after)
	return nil
}

// respond is the shared answer path of HTTP, channel sockets and chat bots
// (which answer over HTTP).
func (s *Server) respond(ctx context.Context, p *auth.Principal, actionID string, req RespondRequest, m kernel.Meta) (int, any, kernel.After, error) {
	if len(req.Reason) > 4096 {
		return 0, nil, nil, kernelValidation("reason is limited to 4096 bytes")
	}
	if err := checkIDs(map[string]string{"channel_id": req.ChannelID, "native_peer_id": req.NativePeerID}); err != nil {
		return 0, nil, nil, err
	}
	outcome, scope, err := bridge.ParseDecision(req.Decision)
	if err != nil {
		return 0, nil, nil, actionError(err)
	}
	rec, err := s.decidable(p, actionID, actionMissing(actionID))
	if err != nil {
		return 0, nil, nil, err
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
	cur, err := s.opts.Bridge.Get(actionID)
	if err != nil {
		after.Run()
		return 0, nil, nil, actionError(err)
	}
	return fasthttp.StatusOK, cur, after, nil
}

// decidable returns the prompt actionID if p may answer it now: every door
// to a decision asks it. An agent or runner never may (403): an agent must
// never approve its own tool calls. Another owner's prompt answers
// missing; a settled one is 409 with its record.
func (s *Server) decidable(p *auth.Principal, actionID string, missing error) (bridge.Record, error) {
	if err := p.Can(auth.ActDecide, auth.KindAction); err != nil {
		return bridge.Record{}, err
	}
	rec, err := s.opts.Bridge.Get(actionID)
	if err != nil {
		return bridge.Record{}, actionError(err)
	}
	if err := allow(p, auth.ActDecide, actionResource(&rec), missing); err != nil {
		return bridge.Record{}, err
	}
	if rec.State != bridge.StatePending {
		return bridge.Record{}, recordedConflict(rec)
	}
	return rec, nil
}

// signal delivers a signal to an execution the caller may write to. A
// step.approve that answers a permission prompt is a decision like the
// answers of channels: the same rule decides who may give it (no agent or
// runner ever does), the first answer wins, a late one gets 409 with the
// recorded outcome, and the record's audit names the channel "signal".
func (s *Server) signal(ctx context.Context, p *auth.Principal, execID string, req kernel.SignalRequest, m kernel.Meta) (kernel.After, error) {
	actionID := ""
	if req.SignalType == signalStepApprove && s.opts.Bridge != nil {
		var ref struct {
			StepID string `json:"step_id"`
		}
		if json.Unmarshal(req.Payload, &ref) == nil && ref.StepID != "" {
			actionID = s.k.ApprovalOf(execID, ref.StepID)
		}
	}
	if actionID != "" {
		if _, err := s.decidable(p, actionID, notFound("execution", execID)); err != nil {
			return nil, err
		}
	}
	after, err := s.k.Signal(ctx, execID, req, m)
	if err != nil && actionID != "" && errors.Is(err, kernel.ErrConflict) {
		// Another answer won between the check and the kernel's lock.
		if rec, gerr := s.opts.Bridge.Get(actionID); gerr == nil && rec.State != bridge.StatePending {
			return nil, recordedConflict(rec)
		}
	}
	return after, err
}

// signalStepApprove is the kernel API's signal that answers an approval.
const signalStepApprove = "step.approve"

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

// Respond answers a permission prompt for a protocol surface, on the path
// of POST /v0/actions/{id}/respond (protocol.Gateway).
func (s *Server) Respond(ctx context.Context, p *auth.Principal, actionID string, r protocol.Response) (bridge.Record, kernel.After, error) {
	if s.opts.Bridge == nil {
		return bridge.Record{}, nil, notFound("action", actionID)
	}
	_, _, after, err := s.respond(ctx, p, actionID, RespondRequest{Decision: r.Decision, Reason: r.Reason, ChannelID: r.ChannelID, NativePeerID: r.NativePeerID}, kernel.Meta{Principal: p.Subject, Tenant: p.Tenant})
	if err != nil {
		return bridge.Record{}, nil, err
	}
	rec, err := s.opts.Bridge.Get(actionID)
	if err != nil {
		after.Run()
		return bridge.Record{}, nil, actionError(err)
	}
	return rec, after, nil
}
