package gateway

import (
	"errors"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
)

func (s *Server) channelRoutes(r *router) {
	if s.opts.Channels == nil || s.opts.Bridge == nil {
		return
	}
	r.add("GET", "/v0/channels/stream", false, s.admit(s.streamChannel))
	r.add("GET", "/v0/channels/ws", false, s.admit(s.channelWS))
	r.add("GET", "/v0/channels", false, s.listChannels)
	r.add("GET", "/v0/channels/events", false, s.channelEvents)
	r.add("PUT", "/v0/channels/webhook", false, s.setWebhook)
	r.add("DELETE", "/v0/channels/webhook", false, s.removeWebhook)
}

// person returns the principal whose own channels p uses for act: channel
// and client principals act for themselves, an admin (and the open
// embedded default, whose caller is the admin "local") for itself too.
// Agents and runners have no human channels.
func person(p *auth.Principal, act auth.Action) (string, error) {
	if err := p.Authorize(act, channelResource(p.Subject, p.Tenant)); err != nil {
		return "", err
	}
	return p.Subject, nil
}

// ownChannel checks that the channel (channelID, peerID) is one of p's own;
// missing answers for a channel that is not, or does not exist.
func (s *Server) ownChannel(p *auth.Principal, channelID, peerID string, missing error) error {
	owner, err := person(p, auth.ActWrite)
	if err != nil {
		return err
	}
	if s.opts.Channels != nil {
		for _, ch := range s.opts.Channels.List(owner) {
			if ch.ChannelID == channelID && ch.PeerID == peerID {
				return nil
			}
		}
	}
	return missing
}

// channelError maps channel registry errors like the kernel's.
func channelError(err error) error {
	switch {
	case errors.Is(err, channel.ErrNotFound):
		return &gatewayError{kind: kernel.ErrNotFound, msg: "not found: " + err.Error()}
	case errors.Is(err, channel.ErrOwned):
		return &gatewayError{kind: auth.ErrForbidden, msg: "forbidden: " + err.Error()}
	case errors.Is(err, channel.ErrTooMany):
		return &gatewayError{kind: kernel.ErrConflict, msg: "conflict: " + err.Error()}
	case errors.Is(err, channel.ErrInvalid), errors.Is(err, channel.ErrTooLarge):
		return kernelValidation(err.Error())
	case errors.Is(err, channel.ErrClosed):
		return &gatewayError{kind: kernel.ErrUnavailable, msg: "service unavailable: " + err.Error()}
	}
	return err
}

// streamChannel serves a human channel over SSE: the owner's prompts
// (permission.requested) and their retractions (permission.resolved),
// from the channel's durable outbox. A channel registering for the first
// time first receives every prompt still pending.
func (s *Server) streamChannel(c *call) error {
	key, err := s.connectChannel(c)
	if err != nil {
		return err
	}
	return s.streamPeer(c, "channel", key, nil)
}

// channelWS serves a human channel over WebSocket: the same deliveries as
// the SSE stream, plus the commands respond (answer a prompt) and message.
func (s *Server) channelWS(c *call) error {
	key, err := s.connectChannel(c)
	if err != nil {
		return err
	}
	ps := &peerSocket{role: channel.RoleChannel, key: key}
	return s.upgradePeer(c, ps)
}

// connectChannel reads a channel's query, registers it for the caller and,
// the first time, forwards the prompts already pending.
func (s *Server) connectChannel(c *call) (peer.Key, error) {
	args := c.ctx.QueryArgs()
	channelID, peerID := string(args.Peek("channel_id")), string(args.Peek("peer_id"))
	if channelID == "" || peerID == "" {
		return peer.Key{}, kernelValidation("channel_id and peer_id query params are required")
	}
	owner, err := person(c.principal, auth.ActWrite)
	if err != nil {
		return peer.Key{}, err
	}
	ch, fresh, err := s.opts.Channels.Connect(c.ctx, owner, channelID, peerID)
	if err != nil {
		return peer.Key{}, channelError(err)
	}
	if fresh {
		if err := s.opts.Channels.Backfill(c.ctx, ch, s.opts.Bridge.Pending(owner)); err != nil {
			return peer.Key{}, channelError(err)
		}
	}
	return channel.Key(channelID, peerID), nil
}

// channelCommand runs a command of a channel socket: respond answers a
// prompt through this channel, message records a free-form message.
func (s *Server) channelCommand(w *wsConn, ps *peerSocket, fr inFrame) (int, any, kernel.After) {
	p := w.principal.Load()
	switch fr.Command {
	case cmdRespond:
		var req struct {
			ActionID string `json:"action_id"`
			RespondRequest
		}
		if err := decodeBody(fr.Body, &req, s.opts.MaxBodyBytes); err != nil {
			return commandError(err)
		}
		if req.ActionID == "" {
			return commandError(kernelValidation("action_id is required"))
		}
		req.ChannelID, req.NativePeerID = ps.key.ID, ps.key.Consumer
		status, body, after, err := s.respond(w.ctx, p, req.ActionID, req.RespondRequest, kernel.Meta{Principal: p.Subject, Tenant: p.Tenant})
		if err != nil {
			return commandError(err)
		}
		return status, body, after
	case cmdMessage:
		owner, err := person(p, auth.ActWrite)
		if err == nil {
			err = s.opts.Channels.Message(owner, ps.key.ID, ps.key.Consumer, fr.Body)
		}
		if err != nil {
			return commandError(channelError(err))
		}
		return fasthttp.StatusOK, statusOK, nil
	}
	return commandError(kernelValidation("the channel socket takes the commands respond and message, not " + strconv.Quote(fr.Command)))
}

// Commands of channel sockets.
const (
	cmdRespond = "respond"
	cmdMessage = "message"
)

func (s *Server) listChannels(c *call) error {
	owner, err := person(c.principal, auth.ActRead)
	if err != nil {
		return err
	}
	chans := []channel.Channel{}
	if other := string(c.ctx.QueryArgs().Peek("owner")); other != "" {
		// Channel registrations keep no tenant: another person's channels
		// are for an admin without one to see.
		owner = other
		if c.principal.Authorize(auth.ActRead, channelResource(other, "")) != nil {
			owner = ""
		}
	}
	if owner != "" {
		chans = s.opts.Channels.List(owner)
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, map[string]any{"channels": chans})
	return nil
}

// channelEvents answers GET /v0/channels/events: the caller's channel.*
// log, paged like an execution's events.
func (s *Server) channelEvents(c *call) error {
	owner, err := person(c.principal, auth.ActRead)
	if err != nil {
		return err
	}
	args := c.ctx.QueryArgs()
	limit, _ := strconv.Atoi(string(args.Peek("limit")))
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	evs, latest, err := s.opts.Channels.Events(owner, parseSeq(args.Peek("after_sequence")), limit)
	if err != nil {
		return channelError(err)
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, map[string]any{"events": evs, "latest_sequence": latest})
	return nil
}

type webhookRequest struct {
	URL    string `json:"url"`
	Secret string `json:"secret"`
}

// setWebhook answers PUT /v0/channels/webhook: the caller's chat-bot
// channel. A new webhook first receives every pending prompt.
func (s *Server) setWebhook(c *call) error {
	owner, err := person(c.principal, auth.ActWrite)
	if err != nil {
		return err
	}
	var req webhookRequest
	if err := decode(c.ctx, &req, s.opts.MaxBodyBytes); err != nil {
		return err
	}
	ch, fresh, err := s.opts.Channels.SetWebhook(c.ctx, owner, req.URL, req.Secret)
	if err != nil {
		return channelError(err)
	}
	if fresh {
		if err := s.opts.Channels.Backfill(c.ctx, ch, s.opts.Bridge.Pending(owner)); err != nil {
			return channelError(err)
		}
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, ch)
	return nil
}

func (s *Server) removeWebhook(c *call) error {
	owner, err := person(c.principal, auth.ActWrite)
	if err != nil {
		return err
	}
	if err := s.opts.Channels.RemoveWebhook(c.ctx, owner); err != nil {
		return channelError(err)
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, statusOK)
	return nil
}
