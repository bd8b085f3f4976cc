package gateway

import (
	"encoding/base64"
	"errors"
	"slices"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
)

func (s *Server) peerRoutes(r *router) {
	r.add("GET", "/v0/peers", false, s.listPeers)
	r.add("POST", "/v0/peers/ack", false, s.ackPeer)
}

// Peer list pages: GET /v0/peers?limit= defaults to 100 and is clamped to
// 1000, like the events page.
const (
	peersPageDefault = 100
	peersPageMax     = 1000
)

// listPeers answers GET /v0/peers[?role=agent|runner|channel][&limit=N]
// [&cursor=C]: the known consumers the caller may see, in key order, with
// their presence and how far they have acknowledged, a page at a time.
// next_cursor continues the list; it is "" on the last page.
func (s *Server) listPeers(c *call) error {
	p := c.principal
	if err := p.Can(auth.ActRead, auth.KindPeer); err != nil {
		return err
	}
	args := c.ctx.QueryArgs()
	role := string(args.Peek("role"))
	switch role {
	case "", kernel.RoleAgent, kernel.RoleRunner, channel.RoleChannel:
	default:
		return kernelValidation("role must be agent, runner or channel")
	}
	limit, err := strconv.Atoi(string(args.Peek("limit")))
	if err != nil || limit <= 0 {
		limit = peersPageDefault
	}
	limit = min(limit, peersPageMax)
	after, err := base64.RawURLEncoding.DecodeString(string(args.Peek("cursor")))
	if err != nil {
		return kernelValidation("invalid cursor")
	}
	page, more := s.hub.Peers(peer.Query{Role: role, After: string(after), Limit: limit})
	next := ""
	if more {
		last := page[len(page)-1]
		next = base64.RawURLEncoding.EncodeToString([]byte(peer.Key{Role: last.Role, ID: last.ID, Consumer: last.ConsumerID}.String()))
	}
	if !p.Unconfined() {
		page = slices.DeleteFunc(page, func(i peer.Info) bool { return p.Authorize(auth.ActRead, peerResource(i)) != nil })
	}
	if page == nil {
		page = []peer.Info{}
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, map[string]any{"epoch": s.k.Epoch(), "peers": page, "next_cursor": next})
	return nil
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
func (s *Server) ackPeer(c *call) error {
	var req ackRequest
	if err := decode(c.ctx, &req, s.opts.MaxBodyBytes); err != nil {
		return err
	}
	if req.ID == "" || req.ConsumerID == "" {
		return kernelValidation("role, id and consumer_id are required")
	}
	if err := checkIDs(map[string]string{"id": req.ID, "consumer_id": req.ConsumerID}); err != nil {
		return err
	}
	k := peer.Key{Role: req.Role, ID: req.ID, Consumer: req.ConsumerID}
	var err error
	switch req.Role {
	case kernel.RoleAgent:
		err = c.principal.Authorize(auth.ActAct, agentResource(req.ID))
	case kernel.RoleRunner:
		err = s.actAsRunner(c.principal, req.ID)
	case channel.RoleChannel:
		err = s.ownChannel(c.principal, req.ID, req.ConsumerID, notFound("consumer", k.String()))
	default:
		err = kernelValidation("role must be agent, runner or channel")
	}
	if err != nil {
		return err
	}
	if !s.hub.Ack(k, req.Sequence) {
		return notFound("consumer", k.String())
	}
	// The answer says the acknowledgement is durable: a crash after it
	// does not send those deliveries again.
	if err := s.hub.Flush(); err != nil {
		return ackError(err)
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, statusOK)
	return nil
}

// ackError words the failure to persist an acknowledgement: 507 on a full
// disk (the store's error says so), else 503.
func ackError(err error) error {
	if errors.Is(err, kernel.ErrStorageFull) {
		return err
	}
	return &gatewayError{kind: kernel.ErrUnavailable, msg: "service unavailable: " + err.Error()}
}
