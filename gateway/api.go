package gateway

import (
	"context"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/kernel"
)

func (s *Server) buildRoutes() *router {
	r := &router{}
	r.add("GET", "/v0/health", true, s.health)
	r.add("GET", "/v0/ready", true, s.ready)
	r.add("GET", "/metrics", false, s.serveMetrics)

	r.add("POST", "/v0/executions", false, s.createExecution)
	r.add("GET", "/v0/executions", false, s.listExecutions)
	r.add("GET", "/v0/executions/{}", false, s.getExecution)
	r.add("POST", "/v0/executions/{}/cancel", false, s.cancelExecution)
	r.add("POST", "/v0/executions/{}/signal", false, s.signalExecution)
	r.add("GET", "/v0/executions/{}/events", false, s.listEvents)
	r.add("GET", "/v0/executions/{}/stream", false, s.streamExecution)

	r.add("GET", "/v0/agents/stream", false, s.streamAgent)
	r.add("POST", "/v0/agents/intent", false, s.intent)
	r.add("POST", "/v0/agents/step-result", false, s.stepResult)

	r.add("GET", "/v0/runners/stream", false, s.streamRunner)
	r.add("POST", "/v0/runners/steps/{}/started", false, s.stepStarted)
	r.add("POST", "/v0/runners/{}/results", false, s.runnerResult)
	r.add("POST", "/v0/runners/{}/capabilities", false, s.runnerCapabilities)
	r.add("DELETE", "/v0/runners/{}", false, s.deleteRunner)
	return r
}

var statusOK = map[string]string{"status": "ok"}

func (s *Server) health(c *call) { s.writeJSON(c.ctx, fasthttp.StatusOK, statusOK) }

func (s *Server) ready(c *call) {
	ctx, cancel := context.WithTimeout(context.Background(), 2e9)
	defer cancel()
	if err := s.k.Ready(ctx); err != nil {
		s.log.Warn("not ready", "err", err)
		s.writeJSON(c.ctx, fasthttp.StatusServiceUnavailable, errorBody{
			Error: "service unavailable: database not reachable", Code: CodeUnavailable,
		})
		return
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, map[string]string{"status": "ready"})
}

// admin checks that the caller may use the execution API.
func (s *Server) admin(c *call) bool {
	if err := c.principal.MayAdminister(); err != nil {
		s.writeError(c.ctx, err)
		return false
	}
	return true
}

func (s *Server) createExecution(c *call) {
	if !s.admin(c) {
		return
	}
	var req kernel.CreateRequest
	if err := decode(c.ctx, &req, s.opts.MaxBodyBytes); err != nil {
		s.writeError(c.ctx, err)
		return
	}
	v, err := s.k.Create(c.ctx, req, meta(c.ctx))
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	s.writeJSON(c.ctx, fasthttp.StatusCreated, v)
}

func (s *Server) listExecutions(c *call) {
	if !s.admin(c) {
		return
	}
	args := c.ctx.QueryArgs()
	req := kernel.ListRequest{AgentID: string(args.Peek("agent_id")), Cursor: string(args.Peek("cursor"))}
	if st := string(args.Peek("status")); st != "" {
		status, ok := kernel.ParseStatus(st)
		if !ok {
			s.writeError(c.ctx, kernelValidation("invalid status filter "+strconv.Quote(st)))
			return
		}
		req.Status = status
	}
	for _, l := range args.PeekMulti("label") {
		key, val, ok := strings.Cut(string(l), ":")
		if !ok || key == "" {
			s.writeError(c.ctx, kernelValidation("invalid label filter "+strconv.Quote(string(l))+": want key:value"))
			return
		}
		if req.Labels == nil {
			req.Labels = map[string]string{}
		}
		req.Labels[key] = val
	}
	req.Limit, _ = strconv.Atoi(string(args.Peek("limit")))
	page, err := s.k.List(c.ctx, req)
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, page)
}

func (s *Server) getExecution(c *call) {
	if !s.admin(c) {
		return
	}
	v, err := s.k.Get(c.ctx, c.params[0])
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, v)
}

func (s *Server) cancelExecution(c *call) {
	if !s.admin(c) {
		return
	}
	v, err := s.k.Cancel(c.ctx, c.params[0], meta(c.ctx))
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, v)
}

func (s *Server) signalExecution(c *call) {
	if !s.admin(c) {
		return
	}
	var req kernel.SignalRequest
	if err := decode(c.ctx, &req, s.opts.MaxBodyBytes); err != nil {
		s.writeError(c.ctx, err)
		return
	}
	after, err := s.k.Signal(c.ctx, c.params[0], req, meta(c.ctx))
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	s.writeJSONThen(c.ctx, fasthttp.StatusOK, statusOK, after)
}

func (s *Server) listEvents(c *call) {
	if !s.admin(c) {
		return
	}
	args := c.ctx.QueryArgs()
	after := parseSeq(args.Peek("after_sequence"))
	limit, _ := strconv.Atoi(string(args.Peek("limit")))
	page, err := s.k.Events(c.ctx, c.params[0], after, limit)
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, page)
}

// parseSeq reads a sequence parameter; negative or unparsable means 0, as
// the kernel API specifies.
func parseSeq(b []byte) uint64 {
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

func (s *Server) intent(c *call) {
	var req kernel.IntentRequest
	if err := decode(c.ctx, &req, s.opts.MaxBodyBytes); err != nil {
		s.writeError(c.ctx, err)
		return
	}
	if !s.mayActForExecution(c, req.ExecutionID) {
		return
	}
	m := meta(c.ctx)
	if req.Intent.IdempotencyKey == "" {
		req.Intent.IdempotencyKey = m.IdempotencyKey
	}
	res, after, err := s.k.Intent(c.ctx, req, m)
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	s.writeJSONThen(c.ctx, fasthttp.StatusOK, res, after)
}

func (s *Server) stepResult(c *call) {
	var req kernel.StepResultRequest
	if err := decode(c.ctx, &req, s.opts.MaxBodyBytes); err != nil {
		s.writeError(c.ctx, err)
		return
	}
	if !s.mayActForExecution(c, req.ExecutionID) {
		return
	}
	after, err := s.k.StepResult(c.ctx, req, meta(c.ctx))
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	s.writeJSONThen(c.ctx, fasthttp.StatusOK, statusOK, after)
}

// mayActForExecution checks that an agent principal holds the agent id of
// the execution it writes to. Admins pass without a lookup.
func (s *Server) mayActForExecution(c *call, execID string) bool {
	p := c.principal
	if p.MayAdminister() == nil {
		return true
	}
	if execID == "" {
		return true // the kernel answers the missing field
	}
	v, err := s.k.Get(c.ctx, execID)
	if err != nil {
		s.writeError(c.ctx, err)
		return false
	}
	if err := p.MayActAsAgent(v.AgentID); err != nil {
		s.writeError(c.ctx, err)
		return false
	}
	return true
}

func (s *Server) mayActAsRunner(c *call, runnerID string) bool {
	if err := c.principal.MayActAsRunner(runnerID); err != nil {
		s.writeError(c.ctx, err)
		return false
	}
	return true
}

func (s *Server) runnerResult(c *call) {
	runnerID := c.params[0]
	if !s.mayActAsRunner(c, runnerID) {
		return
	}
	var req kernel.RunnerResultRequest
	if err := decode(c.ctx, &req, s.opts.MaxBodyBytes); err != nil {
		s.writeError(c.ctx, err)
		return
	}
	m := meta(c.ctx)
	if req.IdempotencyKey == "" {
		req.IdempotencyKey = m.IdempotencyKey
	}
	after, err := s.k.RunnerResult(c.ctx, runnerID, req, m)
	if err != nil {
		s.writeError(c.ctx, err)
		return
	}
	s.writeJSONThen(c.ctx, fasthttp.StatusOK, statusOK, after)
}

func (s *Server) stepStarted(c *call) {
	var req kernel.StepStartedRequest
	if err := decode(c.ctx, &req, s.opts.MaxBodyBytes); err != nil {
		s.writeError(c.ctx, err)
		return
	}
	if req.RunnerID != "" && !s.mayActAsRunner(c, req.RunnerID) {
		return
	}
	if err := s.k.StepStarted(c.ctx, c.params[0], req, meta(c.ctx)); err != nil {
		s.writeError(c.ctx, err)
		return
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, statusOK)
}

type capabilitiesRequest struct {
	Tools []string `json:"tools"`
}

// maxCapabilities bounds a runner's tool list.
const maxCapabilities = 4096

func (s *Server) runnerCapabilities(c *call) {
	runnerID := c.params[0]
	if !s.mayActAsRunner(c, runnerID) {
		return
	}
	var req capabilitiesRequest
	if err := decode(c.ctx, &req, s.opts.MaxBodyBytes); err != nil {
		s.writeError(c.ctx, err)
		return
	}
	if err := validTools(req.Tools); err != nil {
		s.writeError(c.ctx, err)
		return
	}
	s.k.UpdateCapabilities(runnerID, req.Tools)
	s.writeJSON(c.ctx, fasthttp.StatusOK, statusOK)
}

func validTools(tools []string) error {
	if len(tools) > maxCapabilities {
		return kernelValidation("tools: at most " + strconv.Itoa(maxCapabilities) + " tool ids")
	}
	for _, t := range tools {
		if len(t) > 256 {
			return kernelValidation("tools: tool id exceeds maximum length of 256 characters")
		}
	}
	return nil
}

// deleteRunner unregisters a runner. It answers 204 with no body, as the
// kernel API documents; unlike the original it also ends the runner's
// streams and re-queues the jobs it held.
func (s *Server) deleteRunner(c *call) {
	runnerID := c.params[0]
	if !s.mayActAsRunner(c, runnerID) {
		return
	}
	s.k.RemoveRunner(runnerID)
	c.ctx.SetStatusCode(fasthttp.StatusNoContent)
}
