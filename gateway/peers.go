package gateway

import (
	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
)

func (s *Server) peerRoutes(r *router) {
	r.add("GET", "/v0/peers", false, s.listPeers)
	r.add("POST", "/v0/peers/ack", false, s.ackPeer)
}

// listPeers answers GET /v0/peers[?role=agent|runner]: every known consumer
// with its presence and how far it has acknowledged.
func (s *Server) listPeers(c *call) {
	if !s.admin(c) {
		return
	}
	role := string(c.ctx.QueryArgs().Peek("role"))
	switch role {
	case "", kernel.RoleAgent, kernel.RoleRunner:
	default:
		s.writeError(c.ctx, kernelValidation("role must be agent or runner"))
		return
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, map[string]any{"epoch": s.k.Epoch(), "peers": s.hub.Peers(role)})
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
	var err error
	switch req.Role {
	case kernel.RoleAgent:
		err = c.principal.MayActAsAgent(req.ID)
	case kernel.RoleRunner:
		err = c.principal.MayActAsRunner(req.ID)
	default:
		err = kernelValidation("role must be agent or runner")
	}
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	k := peer.Key{Role: req.Role, ID: req.ID, Consumer: req.ConsumerID}
	if !s.hub.Ack(k, req.Sequence) {
		s.writeError(c.ctx, notFound("consumer", k.String()))
		return
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, statusOK)
}
