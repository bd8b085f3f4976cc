// Package runtimeapi serves the Runtime API of seeds 000 and 003
// (capabilities, sessions, executions, event streams, memory) under
// /runtime/v1, so that a client with base URL http://host:port/runtime/v1
// works unchanged.
//
// It is a projection of the kernel: one invocation is one direct (agentless,
// one-step) execution filed in a durable session. An integration
// capability is a tool a connected runner serves, behind NAT, described by
// the runner (parameters, accounts); the memory capabilities run on the
// built-in notes through an in-process runner, so that policy, the
// permission bridge, leases, retries and restarts treat every invocation
// alike. docs/runtime-api.md is the contract.
package runtimeapi

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/internal/option"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/memory"
	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/protocol"
	"github.com/gatehouse-dev/gatehouse/session"
)

// Kernel is what the surface needs of the execution kernel.
type Kernel interface {
	Tools() []kernel.ServedTool
	Create(ctx context.Context, req kernel.CreateRequest, meta kernel.Meta) (kernel.View, bool, error)
	Get(ctx context.Context, id string) (kernel.View, error)
	ReadEventValues(id string, after uint64, fn func(*event.Event) bool) error
	Watch(id string) *kernel.Watch
	RunnerResult(ctx context.Context, runnerID string, req kernel.RunnerResultRequest, meta kernel.Meta) (kernel.After, error)
	// Reserve makes the memory tools the built-in runner's alone.
	Reserve(runnerID string, tools []string)
}

// Hub is what the built-in memory runner needs of the delivery hub: it
// attaches as a runner with its tools, which tells the kernel (see
// peer.Presence).
type Hub interface {
	Attach(k peer.Key, cursor *uint64, caps ...string) (*peer.Conn, *peer.Reset)
}

// Memory is the built-in notes store the memory capabilities run on.
type Memory interface {
	// Tools describes the memory tools of both of the seeds' name sets.
	Tools() []memory.Tool
	// Check validates a call of owner before it is run: its input (a path,
	// say) and, for a write, the room its quotas leave.
	Check(ctx context.Context, owner memory.Owner, name string, input json.RawMessage) error
	// Call runs memory tool name for owner on input and returns its
	// output. Errors that are the caller's (a version conflict, a missing
	// note) fail the invocation with their message.
	Call(ctx context.Context, owner memory.Owner, name string, input json.RawMessage) (json.RawMessage, error)
	// Capacity is how many calls Call holds at once, waiting or running.
	Capacity() int
}

// Options configure the surface. Kernel and Sessions are required; without
// Hub and Memory there are no memory capabilities.
type Options struct {
	Kernel   Kernel
	Sessions *session.Registry
	Hub      Hub
	Memory   Memory
	// WaitLimit bounds how long an invocation with "wait": true is held
	// (30 s when zero).
	WaitLimit time.Duration
}

// Surface is the Runtime API; see the package doc.
type Surface struct {
	o       Options
	schemas schemaCache
	memory  map[string]memory.Tool

	mu      sync.Mutex
	stop    context.CancelFunc
	stopped chan struct{}
}

// New returns the surface. Start runs its memory runner.
func New(o Options) *Surface {
	option.Default(&o.WaitLimit, 30*time.Second)
	s := &Surface{o: o, memory: map[string]memory.Tool{}}
	if o.Memory != nil && o.Hub != nil {
		for _, t := range o.Memory.Tools() {
			s.memory[t.Name] = t
		}
	}
	return s
}

// Mount is where the surface is served.
func (s *Surface) Mount() string { return "/runtime/v1" }

// Routes lists the seeds' endpoints and the documented extensions.
func (s *Surface) Routes() []protocol.Route {
	return []protocol.Route{
		{Method: "GET", Pattern: "/capabilities", Handle: s.listCapabilities},
		{Method: "POST", Pattern: "/tools/{}", Handle: s.invokeTool},
		{Method: "POST", Pattern: "/sessions", Handle: s.createSession},
		{Method: "GET", Pattern: "/sessions", Handle: s.listSessions},
		{Method: "GET", Pattern: "/sessions/{}", Handle: s.getSession},
		{Method: "GET", Pattern: "/sessions/{}/capabilities", Handle: s.sessionCapabilities},
		{Method: "POST", Pattern: "/sessions/{}/tools/{}", Handle: s.invokeSessionTool},
		{Method: "POST", Pattern: "/sessions/{}/archive", Handle: s.archiveSession},
		{Method: "GET", Pattern: "/executions/{}", Handle: s.getExecution},
		{Method: "GET", Pattern: "/executions/{}/events", Stream: true, Handle: s.streamEvents},
	}
}

// Machine codes of the surface's own errors, in details.code; the shared
// ones come from protocol.Status.
const (
	codeValidation      = "VALIDATION_ERROR"
	codeNotFound        = "NOT_FOUND"
	codeAccountRequired = "ACCOUNT_REQUIRED"
	codeUnknownAccount  = "UNKNOWN_ACCOUNT"
	codeArchived        = "SESSION_ARCHIVED"
	codeInvalidInput    = "INVALID_INPUT"
	codeTooLarge        = "PAYLOAD_TOO_LARGE"
	codeQuota           = "QUOTA_EXCEEDED"
	codeInternal        = "INTERNAL_ERROR"
)

// apiError is an answer of the surface's own: its status, code, message
// and further details.
type apiError struct {
	status  int
	code    string
	msg     string
	details map[string]any
}

func (e *apiError) Error() string { return e.msg }

// WriteError answers a request the gateway refused, in the Runtime API's
// shape: {"error": "...", "details": {"code": "..."}}.
func (s *Surface) WriteError(ctx *fasthttp.RequestCtx, status int, code, msg string) {
	writeJSON(ctx, status, map[string]any{"error": msg, "details": map[string]any{"code": code}})
}

// writeJSON answers with v, a newline ending the body.
func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	protocol.JSON{Newline: true, Fallback: `{"error":"internal error","details":{"code":"INTERNAL_ERROR"}}`}.Write(ctx, status, v)
}

// Fail answers an error a handler returned with its status and code.
func (s *Surface) Fail(ctx *fasthttp.RequestCtx, err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = classify(err)
	}
	details := map[string]any{"code": ae.code}
	for k, v := range ae.details {
		details[k] = v
	}
	// A full disk is passing; a quota is not.
	if ae.status == fasthttp.StatusInsufficientStorage && ae.code != codeQuota {
		ctx.Response.Header.Set("Retry-After", protocol.StorageRetryAfter)
	}
	writeJSON(ctx, ae.status, map[string]any{"error": protocol.Sentence(ae.msg), "details": details})
}

// classify maps the kernel's, the sessions' and the access rule's errors:
// an archived session has a code of its own here, the rest are shared by
// every surface (protocol.Status).
func classify(err error) *apiError {
	if errors.Is(err, session.ErrArchived) {
		return &apiError{fasthttp.StatusConflict, codeArchived, err.Error(), nil}
	}
	status, code, known := protocol.Status(err)
	if !known {
		return &apiError{status, codeInternal, "internal error", nil}
	}
	var qerr *session.QuotaError
	if errors.As(err, &qerr) {
		return &apiError{status, code, err.Error(), map[string]any{"held": qerr.Held, "max": qerr.Max}}
	}
	return &apiError{status, code, err.Error(), nil}
}

func notFound(what, id string) error {
	return &apiError{fasthttp.StatusNotFound, codeNotFound, "unknown " + what + " " + strconv.Quote(id), nil}
}

func badRequest(msg string) error {
	return &apiError{fasthttp.StatusBadRequest, codeValidation, msg, nil}
}

// decode reads the request's JSON body into v; an empty body leaves v as
// it is.
func decode(ctx *fasthttp.RequestCtx, v any) error {
	body := ctx.PostBody()
	if len(body) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return badRequest("malformed JSON body: " + err.Error())
	}
	return nil
}

// meta is what the kernel records of the caller.
func meta(p *auth.Principal) kernel.Meta {
	return kernel.Meta{Principal: p.Subject, Tenant: p.Tenant}
}
