package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"

	segjson "github.com/segmentio/encoding/json"
	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/ident"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/protocol"
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
	r.add("GET", "/v0/executions/{}/stream", false, s.admit(s.streamExecution))
	r.add("GET", "/v0/executions/{}/ws", false, s.admit(s.executionWS))

	r.add("GET", "/v0/agents/stream", false, s.admit(s.streamAgent))
	r.add("GET", "/v0/agents/ws", false, s.admit(s.agentWS))
	r.add("POST", "/v0/agents/intent", false, s.commandRoute(cmdIntent))
	r.add("POST", "/v0/agents/step-result", false, s.commandRoute(cmdStepResult))

	r.add("GET", "/v0/runners/stream", false, s.admit(s.streamRunner))
	r.add("GET", "/v0/runners/ws", false, s.admit(s.runnerWS))
	r.add("POST", "/v0/runners/steps/{}/started", false, s.commandRoute(cmdStarted))
	r.add("POST", "/v0/runners/{}/results", false, s.commandRoute(cmdResult))
	r.add("POST", "/v0/runners/{}/capabilities", false, s.commandRoute(cmdCapabilities))
	r.add("DELETE", "/v0/runners/{}", false, s.deleteRunner)
	return r
}

var statusOK = map[string]string{"status": "ok"}

func (s *Server) health(c *call) error {
	s.writeJSON(c.ctx, fasthttp.StatusOK, statusOK)
	return nil
}

func (s *Server) ready(c *call) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2e9)
	defer cancel()
	if err := s.k.Ready(ctx); err != nil {
		var serr *kernel.SpaceError
		if errors.As(err, &serr) {
			// Said in the log once per change, by the store.
			c.ctx.Response.Header.Set("Retry-After", protocol.StorageRetryAfter)
			s.writeJSON(c.ctx, fasthttp.StatusServiceUnavailable, protocol.ErrorBody{
				Error: err.Error(), Code: CodeStorageFull, Details: spaceDetails(serr.Space),
			})
			return nil
		}
		s.log.Warn("not ready", "err", err)
		s.writeJSON(c.ctx, fasthttp.StatusServiceUnavailable, protocol.ErrorBody{
			Error: "service unavailable: database not reachable", Code: CodeUnavailable,
		})
		return nil
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, map[string]string{"status": "ready"})
	return nil
}

// createExecution answers POST /v0/executions: 201 with the new execution,
// owned by the caller, or 200 with the one an earlier create with the same
// Idempotency-Key made.
func (s *Server) createExecution(c *call) error {
	if err := c.principal.Can(auth.ActWrite, auth.KindExecution); err != nil {
		return err
	}
	var req kernel.CreateRequest
	if err := decode(c.ctx, &req, s.opts.MaxBodyBytes); err != nil {
		return err
	}
	if err := s.maySessionWork(c.ctx, c.principal, req.SessionID); err != nil {
		return err
	}
	v, replayed, err := s.k.Create(c.ctx, req, meta(c.ctx))
	if err != nil {
		return err
	}
	status := fasthttp.StatusCreated
	if replayed {
		status = fasthttp.StatusOK
	}
	s.writeJSON(c.ctx, status, v)
	return nil
}

func (s *Server) listExecutions(c *call) error {
	p := c.principal
	if err := p.Can(auth.ActRead, auth.KindExecution); err != nil {
		return err
	}
	args := c.ctx.QueryArgs()
	req := kernel.ListRequest{AgentID: string(args.Peek("agent_id")), Cursor: string(args.Peek("cursor"))}
	if st := string(args.Peek("status")); st != "" {
		status, ok := kernel.ParseStatus(st)
		if !ok {
			return kernelValidation("invalid status filter " + strconv.Quote(st))
		}
		req.Status = status
	}
	for _, l := range args.PeekMulti("label") {
		key, val, ok := strings.Cut(string(l), ":")
		if !ok || key == "" {
			return kernelValidation("invalid label filter " + strconv.Quote(string(l)) + ": want key:value")
		}
		if req.Labels == nil {
			req.Labels = map[string]string{}
		}
		req.Labels[key] = val
	}
	req.Limit, _ = strconv.Atoi(string(args.Peek("limit")))
	if !p.Unconfined() {
		req.Visible = func(sum *kernel.Summary) bool { return p.Authorize(auth.ActRead, summaryResource(sum)) == nil }
	}
	page, err := s.k.List(c.ctx, req)
	if err != nil {
		return err
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, page)
	return nil
}

func (s *Server) getExecution(c *call) error {
	v, err := s.execution(c.ctx, c.principal, auth.ActRead, c.params[0], nil)
	if err != nil {
		return err
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, v)
	return nil
}

func (s *Server) cancelExecution(c *call) error {
	if err := s.touch(c.ctx, c.principal, auth.ActWrite, c.params[0], nil); err != nil {
		return err
	}
	v, err := s.k.Cancel(c.ctx, c.params[0], meta(c.ctx))
	if err != nil {
		return err
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, v)
	return nil
}

func (s *Server) signalExecution(c *call) error {
	if err := s.touch(c.ctx, c.principal, auth.ActWrite, c.params[0], nil); err != nil {
		return err
	}
	var req kernel.SignalRequest
	if err := decode(c.ctx, &req, s.opts.MaxBodyBytes); err != nil {
		return err
	}
	after, err := s.signal(c.ctx, c.principal, c.params[0], req, meta(c.ctx))
	if err != nil {
		return err
	}
	s.writeJSONThen(c.ctx, fasthttp.StatusOK, statusOK, after)
	return nil
}

func (s *Server) listEvents(c *call) error {
	if err := s.touch(c.ctx, c.principal, auth.ActRead, c.params[0], nil); err != nil {
		return err
	}
	args := c.ctx.QueryArgs()
	after := parseSeq(args.Peek("after_sequence"))
	limit, _ := strconv.Atoi(string(args.Peek("limit")))
	page, err := s.k.Events(c.ctx, c.params[0], after, limit)
	if err != nil {
		return err
	}
	s.writeJSON(c.ctx, fasthttp.StatusOK, page)
	return nil
}

// parseSeq reads a sequence parameter; negative or unparsable means 0, as
// the kernel API specifies.
func parseSeq(b []byte) uint64 {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		// Absent, as it mostly is: ParseUint's error would allocate.
		return 0
	}
	n, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// Command names: the WebSocket command frames and the HTTP routes that run
// the same code through command.
const (
	cmdIntent       = "intent"
	cmdStepResult   = "step_result"
	cmdResult       = "result"
	cmdStarted      = "started"
	cmdCapabilities = "capabilities"
	// cmdDeclare is an agent socket's declaration of what the agent is (an
	// AAP agent's AgentInfo; PUT /aap/v1/agents/{name} over HTTP).
	cmdDeclare = "declare"
)

// commandRoute serves a command over HTTP; the route's path parameter, if
// any, is the command's path id.
func (s *Server) commandRoute(name string) func(*call) error {
	return func(c *call) error {
		var pathID string
		if len(c.params) > 0 {
			pathID = c.params[0]
		}
		status, resp, after := s.command(c.ctx, c.principal, name, pathID, c.ctx.PostBody(), meta(c.ctx))
		if status == fasthttp.StatusServiceUnavailable {
			c.ctx.Response.Header.Set("Retry-After", "1")
		}
		s.writeJSONThen(c.ctx, status, resp, after)
		return nil
	}
}

// command runs one of the commands an agent or runner may send, for HTTP
// and WebSocket alike, so that both transports give the same answer: the
// status, the value to encode as the body and the work to run once that
// answer is on its way.
func (s *Server) command(ctx context.Context, p *auth.Principal, name, pathID string, body []byte, m kernel.Meta) (int, any, kernel.After) {
	var (
		resp  any = statusOK
		after kernel.After
		err   error
	)
	switch name {
	case cmdIntent:
		resp, after, err = s.intent(ctx, p, body, m)
	case cmdStepResult:
		after, err = s.stepResult(ctx, p, body, m)
	case cmdResult:
		after, err = s.runnerResult(ctx, p, pathID, body, m)
	case cmdStarted:
		err = s.stepStarted(ctx, p, pathID, body, m)
	case cmdCapabilities:
		err = s.runnerCapabilities(p, pathID, body)
	case cmdDeclare:
		err = s.declare(ctx, p, pathID, body)
	default:
		err = kernelValidation("unknown command " + strconv.Quote(name))
	}
	if err != nil {
		status, eb := statusOf(err)
		if status == fasthttp.StatusInternalServerError {
			s.log.Error("command failed", "command", name, "err", err)
		}
		return status, eb, after
	}
	return fasthttp.StatusOK, resp, after
}

func (s *Server) intent(ctx context.Context, p *auth.Principal, body []byte, m kernel.Meta) (any, kernel.After, error) {
	var req kernel.IntentRequest
	if err := decodeBody(body, &req, s.opts.MaxBodyBytes); err != nil {
		return nil, nil, err
	}
	if err := s.touch(ctx, p, auth.ActAct, req.ExecutionID, nil); err != nil {
		return nil, nil, err
	}
	if req.Intent.IdempotencyKey == "" {
		req.Intent.IdempotencyKey = m.IdempotencyKey
	}
	res, after, err := s.k.Intent(ctx, req, m)
	if err != nil {
		return nil, after, err
	}
	return res, after, nil
}

func (s *Server) stepResult(ctx context.Context, p *auth.Principal, body []byte, m kernel.Meta) (kernel.After, error) {
	var req kernel.StepResultRequest
	if err := decodeBody(body, &req, s.opts.MaxBodyBytes); err != nil {
		return nil, err
	}
	// A step of an execution that does not exist is an unknown step.
	if err := s.touch(ctx, p, auth.ActAct, req.ExecutionID, notFound("step", req.StepID)); err != nil {
		return nil, err
	}
	return s.k.StepResult(ctx, req, m)
}

func (s *Server) runnerResult(ctx context.Context, p *auth.Principal, runnerID string, body []byte, m kernel.Meta) (kernel.After, error) {
	if err := s.actAsRunner(p, runnerID); err != nil {
		return nil, err
	}
	var req kernel.RunnerResultRequest
	if err := decodeBody(body, &req, s.opts.MaxBodyBytes); err != nil {
		return nil, err
	}
	if req.IdempotencyKey == "" {
		req.IdempotencyKey = m.IdempotencyKey
	}
	return s.k.RunnerResult(ctx, runnerID, req, m)
}

func (s *Server) stepStarted(ctx context.Context, p *auth.Principal, stepID string, body []byte, m kernel.Meta) error {
	var req kernel.StepStartedRequest
	if err := decodeBody(body, &req, s.opts.MaxBodyBytes); err != nil {
		return err
	}
	if req.ExecutionID == "" || req.RunnerID == "" {
		return kernelValidation("execution_id and runner_id are required")
	}
	if err := s.actAsRunner(p, req.RunnerID); err != nil {
		return err
	}
	return s.k.StepStarted(ctx, stepID, req, m)
}

type capabilitiesRequest struct {
	Tools []string `json:"tools"`
	// ToolInfo (extension) describes tools for the Runtime API: one object
	// per tool, its "name" the tool id, the rest the capability's metadata
	// (docs/runtime-api.md).
	ToolInfo []json.RawMessage `json:"tool_info,omitempty"`
}

// maxCapabilities bounds a runner's tool list.
const maxCapabilities = 4096

func (s *Server) runnerCapabilities(p *auth.Principal, runnerID string, body []byte) error {
	if err := s.actAsRunner(p, runnerID); err != nil {
		return err
	}
	var req capabilitiesRequest
	if err := decodeBody(body, &req, s.opts.MaxBodyBytes); err != nil {
		return err
	}
	if err := validTools(req.Tools); err != nil {
		return err
	}
	if err := s.mayServe(p, req.Tools); err != nil {
		return err
	}
	if req.ToolInfo != nil {
		info, err := toolInfo(req.ToolInfo)
		if err != nil {
			return err
		}
		s.k.DescribeTools(runnerID, info)
	}
	s.k.UpdateCapabilities(runnerID, req.Tools)
	return nil
}

// toolInfo indexes a runner's tool descriptions by tool name.
func toolInfo(list []json.RawMessage) (map[string]json.RawMessage, error) {
	if len(list) > maxCapabilities {
		return nil, kernelValidation("tool_info: at most " + strconv.Itoa(maxCapabilities) + " tools")
	}
	out := make(map[string]json.RawMessage, len(list))
	for _, raw := range list {
		var head struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(raw, &head); err != nil || ident.Check("", head.Name) != nil {
			return nil, kernelValidation("tool_info: each entry is an object whose name is a tool id (1-256 bytes of UTF-8 without control or format characters)")
		}
		out[head.Name] = raw
	}
	return out, nil
}

func validTools(tools []string) error {
	if len(tools) > maxCapabilities {
		return kernelValidation("tools: at most " + strconv.Itoa(maxCapabilities) + " tool ids")
	}
	for _, t := range tools {
		if err := checkIDs(map[string]string{"tools: a tool id": t}); err != nil {
			return err
		}
	}
	return nil
}

// decodeBody reads a command body as one JSON value into v, with the same
// answers as an HTTP request body: the WebSocket commands share it.
func decodeBody(body []byte, v any, max int) error {
	if len(body) > max {
		return errTooLarge
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return kernelValidation("invalid JSON: empty body")
	}
	// A body of one JSON value, the usual case, decodes without a
	// Decoder's buffer and copy, with segmentio's decoder (the same
	// results as encoding/json's, in about half the CPU). Anything else
	// goes to encoding/json's Decoder, which reads the first value only,
	// as the kernel API does, and whose errors the answers quote; it
	// starts from v's zero value, not from what the failed attempt
	// filled in.
	if segjson.Unmarshal(body, v) == nil {
		return nil
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv.Elem().SetZero()
	}
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(v); err != nil {
		return kernelValidation("invalid JSON: " + err.Error())
	}
	return nil
}

// deleteRunner unregisters a runner. It answers 204 with no body, as the
// kernel API documents; unlike the original it also ends the runner's
// streams and re-queues the jobs it held.
func (s *Server) deleteRunner(c *call) error {
	runnerID := c.params[0]
	if err := s.actAsRunner(c.principal, runnerID); err != nil {
		return err
	}
	s.k.RemoveRunner(runnerID)
	c.ctx.SetStatusCode(fasthttp.StatusNoContent)
	return nil
}

// declare records what an agent declares about itself: one JSON object
// naming the agent, kept by the kernel for the surfaces that read it.
func (s *Server) declare(ctx context.Context, p *auth.Principal, agentID string, body []byte) error {
	if err := p.Authorize(auth.ActAct, agentResource(agentID)); err != nil {
		return err
	}
	var named struct {
		Name string `json:"name"`
	}
	if err := decodeBody(body, &named, s.opts.MaxBodyBytes); err != nil {
		return err
	}
	if named.Name != agentID {
		return kernelValidation("a declaration's name must be the agent id " + strconv.Quote(agentID))
	}
	return s.k.Declare(ctx, agentID, body)
}
