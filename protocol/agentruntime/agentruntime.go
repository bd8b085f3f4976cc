// Package agentruntime serves the Agent Runtime standard (seed 001,
// limecloud/agentruntime v0.3.9) under /agent-runtime: every fact of a
// durable session as a schema-valid Agent Runtime event (replayed and
// tailed over SSE, or paged as JSON), the session snapshot and thread read
// model folded from those events, the control-plane commands that map onto
// Gatehouse's sessions, kernel and permission bridge, and evidence and
// replay exports a third party can verify.
//
// docs/agent-runtime.md maps each Gatehouse fact to its event type and
// says which commands and summaries Gatehouse cannot offer, and why.
package agentruntime

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/internal/option"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/protocol"
	"github.com/gatehouse-dev/gatehouse/session"
	"github.com/gatehouse-dev/gatehouse/stream"
)

// Kernel is what the surface needs of the execution kernel.
type Kernel interface {
	ReadEventValues(id string, after uint64, fn func(*event.Event) bool) error
	Get(ctx context.Context, id string) (kernel.View, error)
	Cancel(ctx context.Context, id string, meta kernel.Meta) (kernel.View, error)
	Signal(ctx context.Context, id string, req kernel.SignalRequest, meta kernel.Meta) (kernel.After, error)
	Tools() []kernel.ServedTool
}

// Options configure the surface.
type Options struct {
	Kernel   Kernel
	Sessions *session.Registry
	// Exports bounds the exports written at once; zero means
	// DefaultExports.
	Exports int
}

// Surface is the Agent Runtime surface; see the package doc.
type Surface struct {
	o Options

	mu      sync.Mutex
	models  map[string]*cachedModel
	exports chan struct{} // a slot per export being written
}

// New returns the surface.
func New(o Options) *Surface {
	option.Default(&o.Exports, DefaultExports)
	return &Surface{o: o, models: map[string]*cachedModel{}, exports: make(chan struct{}, o.Exports)}
}

// Mount is where the surface is served.
func (s *Surface) Mount() string { return "/agent-runtime" }

// Routes lists the surface's routes.
func (s *Surface) Routes() []protocol.Route {
	return []protocol.Route{
		{Method: "GET", Pattern: "/sessions", Handle: s.listSessions},
		{Method: "POST", Pattern: "/sessions", Handle: s.createSession},
		{Method: "GET", Pattern: "/sessions/{}", Handle: s.getSession},
		{Method: "GET", Pattern: "/sessions/{}/events", Stream: true, Handle: s.events},
		{Method: "GET", Pattern: "/sessions/{}/ws", Stream: true, Handle: s.eventsWS},
		{Method: "GET", Pattern: "/sessions/{}/threads/{}", Handle: s.getThread},
		{Method: "POST", Pattern: "/commands/{}", Handle: s.command},
		{Method: "GET", Pattern: "/exports/{}", Handle: s.export},
	}
}

// Error codes of the surface, beside those every surface shares
// (protocol.Status: VALIDATION_ERROR, NOT_FOUND, CONFLICT, CURSOR_EXPIRED, ...).
const (
	codeNotImplemented = "NOT_IMPLEMENTED"
	codeUnknownCommand = "UNKNOWN_COMMAND"
)

// WriteError answers a request the gateway refused.
func (s *Surface) WriteError(ctx *fasthttp.RequestCtx, status int, code, msg string) {
	writeJSON(ctx, status, protocol.ErrorBody{Error: msg, Code: code})
}

// wire is how the surface answers: the kernel API's JSON, a newline ending
// every body.
func wire() protocol.JSON {
	return protocol.JSON{Newline: true, Fallback: `{"error":"internal error","code":"INTERNAL_ERROR"}`}
}

// writeJSON answers with v.
func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) { wire().Write(ctx, status, v) }

// Fail answers an error a handler returned with the status, code and
// details every surface gives it (protocol.Failure).
func (s *Surface) Fail(ctx *fasthttp.RequestCtx, err error) {
	if errors.Is(err, errExportsBusy) {
		ctx.Response.Header.Set("Retry-After", "1")
		wire().Write(ctx, fasthttp.StatusTooManyRequests, protocol.ErrorBody{Error: err.Error(), Code: "RATE_LIMITED"})
		return
	}
	status, body := protocol.Failure(err)
	wire().WriteFailure(ctx, status, body)
}

// session returns session id if p may act on it; another's is not found,
// word for word as a missing one.
func (s *Surface) session(ctx context.Context, p *auth.Principal, act auth.Action, id string) (session.Session, error) {
	sess, err := protocol.Session(ctx, s.o.Sessions, p, act, id)
	if errors.Is(err, auth.ErrHidden) {
		// Word for word what an unknown id gets: a different answer would
		// tell that someone's session has that id.
		return session.Session{}, session.NotFound(id)
	}
	return sess, err
}

// sessionView is a session in a list.
type sessionView struct {
	SessionID string `json:"sessionId"`
	Title     string `json:"title"`
	Status    string `json:"status"`
	Source    string `json:"source"`
	AgentID   string `json:"agentId,omitempty"`
	CreatedAt string `json:"createdAt"`
	UpdatedAt string `json:"updatedAt"`
}

func viewOf(s *session.Session) sessionView {
	return sessionView{SessionID: s.ID, Title: s.Title, Status: string(s.Status), Source: s.Source, AgentID: s.AgentID,
		CreatedAt: timestamp(s.Created), UpdatedAt: timestamp(s.Updated)}
}

// listSessions answers GET /sessions?after=&limit= (extension): the
// caller's sessions, in id order; next is absent on the last page.
func (s *Surface) listSessions(r *protocol.Request) error {
	args := r.Ctx.QueryArgs()
	limit, _ := strconv.Atoi(string(r.Ctx.QueryArgs().Peek("limit")))
	page, err := protocol.ListSessions(r.Ctx, s.o.Sessions, r.Principal, session.ListRequest{After: string(args.Peek("after")), Limit: limit})
	if err != nil {
		return err
	}
	out := struct {
		Sessions []sessionView `json:"sessions"`
		Next     string        `json:"next,omitempty"`
	}{Sessions: []sessionView{}, Next: page.Next}
	for i := range page.Sessions {
		out.Sessions = append(out.Sessions, viewOf(&page.Sessions[i]))
	}
	writeJSON(r.Ctx, fasthttp.StatusOK, out)
	return nil
}

// createSession answers POST /sessions (extension): a session for the
// caller with the agent that runs its turns.
func (s *Surface) createSession(r *protocol.Request) error {
	if err := r.Principal.Can(auth.ActWrite, auth.KindSession); err != nil {
		return err
	}
	var req struct {
		SessionID string `json:"sessionId"`
		Title     string `json:"title"`
		AgentID   string `json:"agentId"`
	}
	if err := decode(r.Ctx.PostBody(), &req); err != nil {
		return err
	}
	sess, err := protocol.CreateSession(r.Ctx, s.o.Sessions, r.Principal, session.CreateRequest{
		ID: req.SessionID, Title: req.Title, AgentID: req.AgentID,
	})
	if errors.Is(err, auth.ErrHidden) {
		return session.NotFound(req.SessionID) // as a read of it answers
	}
	if err != nil {
		return err
	}
	snap, err := s.snapshot(r.Ctx, sess.ID)
	if err != nil {
		return err
	}
	writeJSON(r.Ctx, fasthttp.StatusCreated, snap)
	return nil
}

// snapshotOf returns session id's snapshot, decoded: a copy the caller
// owns.
func (s *Surface) snapshotOf(ctx context.Context, id string) (Snapshot, error) {
	var snap Snapshot
	data, err := s.snapshot(ctx, id)
	if err == nil {
		err = json.Unmarshal(data, &snap)
	}
	return snap, err
}

// decode reads a JSON body; an empty body is an empty object.
func decode(body []byte, v any) error {
	if len(body) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return protocol.Invalid("invalid JSON: " + err.Error())
	}
	return nil
}

// getSession answers GET /sessions/{id}: the session snapshot.
func (s *Surface) getSession(r *protocol.Request) error {
	if _, err := s.session(r.Ctx, r.Principal, auth.ActRead, r.Params[0]); err != nil {
		return err
	}
	snap, err := s.snapshot(r.Ctx, r.Params[0])
	if err != nil {
		return err
	}
	writeJSON(r.Ctx, fasthttp.StatusOK, snap)
	return nil
}

// getThread answers GET /sessions/{id}/threads/{threadId}: the thread read
// model.
func (s *Surface) getThread(r *protocol.Request) error {
	th, err := s.thread(r, r.Params[0], r.Params[1])
	if err != nil {
		return err
	}
	writeJSON(r.Ctx, fasthttp.StatusOK, th)
	return nil
}

// events answers GET /sessions/{id}/events: with Accept: text/event-stream
// the events after the cursor (after, or Last-Event-ID), then the live
// tail; otherwise a JSON page {events, next}.
func (s *Surface) events(r *protocol.Request) error {
	id, after, err := s.resume(r)
	if err != nil {
		return err
	}
	if wantsSSE(r.Ctx) {
		src := s.source(id, after)
		r.Gateway.SSE(r, "agent_runtime", renderer, stream.SSEOptions{Retry: 5e9}, false, func(*stream.Options) (stream.Source, func()) {
			return src, nil
		})
		return nil
	}
	limit, _ := strconv.Atoi(string(r.Ctx.QueryArgs().Peek("limit")))
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	facts, err := s.read(r.Ctx, id, after, limit+1, nil)
	if err != nil {
		return err
	}
	page := struct {
		Events []Event `json:"events"`
		Next   string  `json:"next,omitempty"`
	}{Events: []Event{}}
	if len(facts) > limit {
		facts = facts[:limit]
		page.Next = strconv.FormatUint(facts[limit-1].item.Seq, 10)
	} else if n := len(facts); n > 0 {
		// A page bounded by bytes can end before the log does: one more
		// item tells.
		last := facts[n-1].item.Seq
		more, err := s.read(r.Ctx, id, last, 1, nil)
		if err != nil {
			return err
		}
		if len(more) > 0 {
			page.Next = strconv.FormatUint(last, 10)
		}
	}
	for i := range facts {
		if e, ok := render(&facts[i]); ok {
			page.Events = append(page.Events, e)
		}
	}
	writeJSON(r.Ctx, fasthttp.StatusOK, page)
	return nil
}

// eventsWS answers GET /sessions/{id}/ws: the event stream's WebSocket
// twin, each event a text message, resuming after ?after= or
// Last-Event-ID.
func (s *Surface) eventsWS(r *protocol.Request) error {
	id, after, err := s.resume(r)
	if err != nil {
		return err
	}
	r.Gateway.WebSocket(r, "agent_runtime_ws", renderer, s.source(id, after))
	return nil
}

// resume reads which session's events r follows, if its caller may read
// them, and from where: after the sequence of ?after=, or of Last-Event-ID
// when a reconnecting EventSource sends one. A malformed cursor is refused
// wherever it is.
func (s *Surface) resume(r *protocol.Request) (id string, after uint64, err error) {
	id = r.Params[0]
	if _, err := s.session(r.Ctx, r.Principal, auth.ActRead, id); err != nil {
		return "", 0, err
	}
	after, err = cursor(string(r.Ctx.QueryArgs().Peek("after")))
	if h := r.Ctx.Request.Header.Peek("Last-Event-ID"); err == nil && len(h) > 0 {
		after, err = cursor(string(h))
	}
	return id, after, err
}

// cursor reads a sequence cursor: empty is the start.
func cursor(v string) (uint64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, protocol.Invalid("a cursor is a sequence: a non-negative integer")
	}
	return n, nil
}

// wantsSSE reports a request for an event stream.
func wantsSSE(ctx *fasthttp.RequestCtx) bool {
	return string(ctx.Request.Header.Peek("Accept")) == "text/event-stream"
}

// cachedModel is a session's read models folded up to a sequence.
type cachedModel struct {
	mu sync.Mutex
	m  *model
}

// maxCachedModels bounds the sessions whose models stay folded in memory.
const maxCachedModels = 256

// snapshot folds the events of session id not yet folded into its cached
// model and returns the snapshot, encoded while the model is held.
func (s *Surface) snapshot(ctx context.Context, id string) (json.RawMessage, error) {
	s.mu.Lock()
	c := s.models[id]
	if c == nil {
		if len(s.models) >= maxCachedModels {
			for k := range s.models {
				delete(s.models, k)
				break
			}
		}
		c = &cachedModel{m: newModel(id)}
		s.models[id] = c
	}
	s.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	err := s.o.Sessions.WalkResolved(ctx, s.o.Kernel, id, c.m.snap.Sequence, func(items []session.Resolved) (bool, error) {
		for i := range items {
			f := factOf(id, &items[i])
			e, ok := render(&f)
			if !ok {
				c.m.snap.Sequence = f.item.Seq
				continue
			}
			c.m.foldEvent(&e)
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	snap := c.m.snapshot()
	return json.Marshal(&snap)
}
