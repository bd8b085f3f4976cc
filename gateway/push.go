package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
)

// Push is the Web Push channel (package channel/webpush): the approvals
// app's subscriptions, and the answers its notifications give.
type Push interface {
	PublicKey() string
	Subscribe(ctx context.Context, owner string, raw json.RawMessage) (channel.Channel, bool, error)
	Unsubscribe(ctx context.Context, owner, endpoint string) error
	Peek(token, endpoint string) (bridge.Record, error)
	Answer(ctx context.Context, token, actionID, decision, endpoint, principal string) (bridge.Record, bool, error)
}

func (s *Server) pushRoutes(r *router) {
	if s.opts.Push == nil || s.opts.Channels == nil || s.opts.Bridge == nil {
		return
	}
	r.add("GET", "/v0/channels/webpush", false, s.pushInfo)
	r.add("PUT", "/v0/channels/webpush/subscription", false, s.pushSubscribe)
	r.add("DELETE", "/v0/channels/webpush/subscription", false, s.pushUnsubscribe)
	// A notification answers without signing in: its token is the
	// credential, checked by the channel.
	r.add("POST", "/v0/channels/webpush/prompt", true, s.pushPeek)
	r.add("POST", "/v0/channels/webpush/answer", true, s.pushAnswer)
}

// pushError maps the Web Push channel's refusals: an endpoint the address
// rules refuse or a malformed answer is a validation error, a token misused
// is forbidden; details.reason says which refusal. A malformed
// subscription matches channel.ErrInvalid.
func pushError(err error) error {
	var re *channel.RefusedError
	switch {
	case errors.As(err, &re) && (re.Reason == channel.RefusedEndpoint || re.Reason == channel.RefusedMalformed):
		return &detailedError{gatewayError: gatewayError{kind: kernel.ErrValidation, msg: "validation error: " + err.Error()},
			details: map[string]any{"reason": re.Reason}}
	case errors.As(err, &re):
		return &detailedError{gatewayError: gatewayError{kind: auth.ErrForbidden, msg: "forbidden: " + err.Error()},
			details: map[string]any{"reason": re.Reason}}
	case errors.Is(err, channel.ErrNotStarted):
		return &gatewayError{kind: kernel.ErrUnavailable, msg: "service unavailable: " + err.Error()}
	}
	return channelError(err)
}

// pushInfo answers GET /v0/channels/webpush: the key a browser subscribes
// with, and the caller's subscriptions.
func (s *Server) pushInfo(c *call) error {
	owner, err := person(c.principal, auth.ActRead)
	if err != nil {
		return err
	}
	subs := []channel.Channel{}
	for _, ch := range s.opts.Channels.List(owner) {
		if ch.ChannelID == channel.AdapterWebPush {
			subs = append(subs, ch)
		}
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, map[string]any{"public_key": s.opts.Push.PublicKey(), "subscriptions": subs})
	return nil
}

// pushSubscribe answers PUT /v0/channels/webpush/subscription: the body is
// the browser's PushSubscription JSON. A new subscription first receives
// every pending prompt.
func (s *Server) pushSubscribe(c *call) error {
	owner, err := person(c.principal, auth.ActWrite)
	if err != nil {
		return err
	}
	var raw json.RawMessage
	if err := decode(c.ctx, &raw, s.opts.MaxBodyBytes); err != nil {
		return err
	}
	ch, fresh, err := s.opts.Push.Subscribe(c.ctx, owner, raw)
	if err != nil {
		return pushError(err)
	}
	if fresh {
		if err := s.opts.Channels.Backfill(c.ctx, ch, s.opts.Bridge.Pending(owner)); err != nil {
			return channelError(err)
		}
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, ch)
	return nil
}

type endpointRequest struct {
	Endpoint string `json:"endpoint"`
}

func (s *Server) pushUnsubscribe(c *call) error {
	owner, err := person(c.principal, auth.ActWrite)
	if err != nil {
		return err
	}
	var req endpointRequest
	if err := decode(c.ctx, &req, s.opts.MaxBodyBytes); err != nil {
		return err
	}
	if err := s.opts.Push.Unsubscribe(c.ctx, owner, req.Endpoint); err != nil {
		return pushError(err)
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, statusOK)
	return nil
}

type pushAnswerRequest struct {
	Token    string `json:"token"`
	Endpoint string `json:"endpoint"`
	ActionID string `json:"action_id"`
	Decision string `json:"decision"`
}

// pushPeek answers POST /v0/channels/webpush/prompt: the prompt a
// notification's token answers, for the page a notification opens.
func (s *Server) pushPeek(c *call) error {
	var req pushAnswerRequest
	if err := decode(c.ctx, &req, s.opts.MaxBodyBytes); err != nil {
		return err
	}
	rec, err := s.opts.Push.Peek(req.Token, req.Endpoint)
	if err != nil {
		return pushError(err)
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, rec)
	return nil
}

// pushAnswer answers POST /v0/channels/webpush/answer: a notification's
// answer, with its token and its subscription's endpoint. Someone signed
// in (a bearer token) must be the token's person. The first answer wins;
// a later one gets 409 with the recorded outcome, as on every door.
func (s *Server) pushAnswer(c *call) error {
	principal := ""
	if h := c.ctx.Request.Header.Peek("Authorization"); len(h) > 0 {
		p, err := s.auth.Authenticate(h, time.Now())
		if err != nil {
			return err
		}
		principal = p.Subject
	}
	var req pushAnswerRequest
	if err := decode(c.ctx, &req, s.opts.MaxBodyBytes); err != nil {
		return err
	}
	if req.ActionID == "" || req.Token == "" || req.Endpoint == "" {
		return kernelValidation("token, endpoint and action_id are required")
	}
	rec, won, err := s.opts.Push.Answer(c.ctx, req.Token, req.ActionID, req.Decision, req.Endpoint, principal)
	if err != nil {
		return pushError(err)
	}
	if !won {
		return recordedConflict(rec)
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, rec)
	return nil
}
