package gateway

import (
	"slices"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
)

func (s *Server) peerRoutes(r *router) {
	r.add("GET", "/v0/peers", false, s.listPeers)
	r.add("POST", "/v0/peers/ack", false, s.ackPeer)
}

// listPeers answers GET /v0/peers[?role=agent|runner]: every known consumer
// the caller may see, with its presence and how far it has acknowledged.
func (s *Server) listPeers(c *call) {
	p := c.principal
	if err := p.Can(auth.ActRead, auth.KindPeer); err != nil {
		s.writeError(c.ctx, err)
		return
	}
	role := string(c.ctx.QueryArgs().Peek("role"))
	switch role {
	case "", kernel.RoleAgent, kernel.RoleRunner:
	default:
		s.writeError(c.ctx, kernelValidation("role must be agent or runner"))
		return
	}
	peers := s.hub.Peers(role)
	if !p.Unconfined() {
		peers = slices.DeleteFunc(peers, func(i peer.Info) bool { return p.Authorize(auth.ActRead, peerResource(i)) != nil })
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, map[string]any{"epoch": s.k.Epoch(), "peers": peers})
}

// peerResource is what a consumer is, for the access rule: an agent or
// runner id, or a channel, whose owner the hub does not know (so only an
// admin without a tenant sees it here; people list their own channels).
func peerResource(i peer.Info) auth.Resource {
	switch i.Role {
	case kernel.RoleAgent:
		return agentResource(i.ID)
	case kernel.RoleRunner:
		return runnerResource(i.ID)
	}
	return channelResource("", "")
}

type ackRequest struct {
	Role       string `json:"role"`
	ID         string `json:"id"`
	ConsumerID string `json:"consumer_id"`
	Sequence   uint64 `json:"sequence"`
}

// ackPeer answers POST /v0/peers/ack: an SSE consumer that opened its stream
// with ack=explicit acknowledges its deliveries up to a sequence.
func (s *Server) ackPeer(c *call) {
	var req ackRequest
	if err := decode(c.ctx, &req, s.opts.MaxBodyBytes); err != nil {
		s.writeError(c.ctx, err)
		return
	}
	if req.ID == "" || req.ConsumerID == "" {
		s.writeError(c.ctx, kernelValidation("role, id and consumer_id are required"))
		return
	}
	k := peer.Key{Role: req.Role, ID: req.ID, Consumer: req.ConsumerID}
	var err error
	switch req.Role {
	case kernel.RoleAgent:
		err = c.principal.Authorize(auth.ActAct, agentResource(req.ID))
	case kernel.RoleRunner:
		err = c.principal.Authorize(auth.ActAct, runnerResource(req.ID))
	case roleChannel:
		err = s.ownChannel(c.principal, req.ID, req.ConsumerID, notFound("consumer", k.String()))
	default:
		err = kernelValidation("role must be agent, runner or channel")
	}
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	if !s.hub.Ack(k, req.Sequence) {
		s.writeError(c.ctx, notFound("consumer", k.String()))
		return
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, statusOK)
}
