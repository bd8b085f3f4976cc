// Package aap serves the Agent Application Protocol, version 1 (seed 002),
// under /aap/v1, so that an unchanged AAP v1 client (the official
// TypeScript client 0.2–0.5, its playground, any app written to the spec)
// works with base URL http://host:port/aap/v1.
//
// It is a projection of Gatehouse's own facts. An AAP agent is an ordinary
// /v0 agent, behind NAT on its outbound stream, that declared its AgentInfo.
// An AAP session is a durable session; each user message is a turn, run as
// an execution of the agent; the agent's text and reasoning are its output
// intents; its server tools are kernel steps (policy, runners, the
// permission bridge); a call to one of the client's own tools is a step the
// client's next POST answers. docs/aap.md says how each piece maps, and
// the extension this surface adds: resumable turn streams.
package aap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/protocol"
	"github.com/gatehouse-dev/gatehouse/session"
)

// Kernel is what the surface needs of the execution kernel.
type Kernel interface {
	Declare(ctx context.Context, agentID string, info json.RawMessage) error
	Declarations() ([]kernel.Declaration, error)
	Get(ctx context.Context, id string) (kernel.View, error)
	ReadEventValues(id string, after uint64, fn func(*event.Event) bool) error
	AnswerStep(ctx context.Context, req kernel.StepResultRequest, meta kernel.Meta) (kernel.After, error)
	Signal(ctx context.Context, id string, req kernel.SignalRequest, meta kernel.Meta) (kernel.After, error)
	ApprovalOf(execID, stepID string) string
	Cancel(ctx context.Context, id string, meta kernel.Meta) (kernel.View, error)
}

// Options configure the surface.
type Options struct {
	Kernel   Kernel
	Sessions *session.Registry
}

// Surface is the AAP v1 surface; see the package doc.
type Surface struct {
	o Options
}

// New returns the surface.
func New(o Options) *Surface { return &Surface{o: o} }

// Mount is where the surface is served.
func (s *Surface) Mount() string { return "/aap/v1" }

// Routes lists the surface's routes: the protocol's, and the agents' own
// (declaring themselves, reading a session's context with its secrets).
func (s *Surface) Routes() []protocol.Route {
	return []protocol.Route{
		{Method: "GET", Pattern: "/meta", Handle: s.meta},
		{Method: "GET", Pattern: "/sessions", Handle: s.listSessions},
		{Method: "PUT", Pattern: "/session", Stream: true, Handle: s.putSession},
		{Method: "POST", Pattern: "/session/{}", Stream: true, Handle: s.postSession},
		{Method: "GET", Pattern: "/session/{}", Handle: s.getSession},
		{Method: "DELETE", Pattern: "/session/{}", Handle: s.deleteSession},
		{Method: "GET", Pattern: "/session/{}/stream", Stream: true, Handle: s.resumeStream},
		{Method: "PUT", Pattern: "/agents/{}", Handle: s.declare},
		{Method: "GET", Pattern: "/agents/{}/sessions/{}", Handle: s.agentContext},
	}
}

// WriteError answers a request the gateway refused: {"error": "..."} as
// AAP clients show it, with a machine code beside.
func (s *Surface) WriteError(ctx *fasthttp.RequestCtx, status int, code, msg string) {
	writeJSON(ctx, status, protocol.ErrorBody{Error: msg, Code: code})
}

// wire is how the surface answers: JSON whose bodies end without a
// newline, as AAP's do.
func wire() protocol.JSON {
	return protocol.JSON{Fallback: `{"error":"internal error","code":"INTERNAL_ERROR"}`}
}

// writeJSON answers with v.
func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) { wire().Write(ctx, status, v) }

// errBusy refuses a turn while another runs.
var errBusy = errors.New("session is busy")

// Fail answers an error a handler returned with the status and code every
// surface gives it (protocol.Failure), or 409 CONFLICT for a busy session.
// AAP's error answer is {error, code} alone: no details.
func (s *Surface) Fail(ctx *fasthttp.RequestCtx, err error) {
	status, body := protocol.Failure(err)
	if errors.Is(err, errBusy) {
		status, body = fasthttp.StatusConflict, protocol.ErrorBody{Error: protocol.Sentence(err.Error()), Code: "CONFLICT"}
	}
	body.Details = nil
	wire().WriteFailure(ctx, status, body)
}

// AgentInfo is what an agent declares: AAP's AgentInfo, kept whole.
type AgentInfo struct {
	Name         string          `json:"name"`
	Title        string          `json:"title,omitempty"`
	Version      string          `json:"version"`
	Description  string          `json:"description,omitempty"`
	Tools        json.RawMessage `json:"tools,omitempty"`
	Options      []AgentOption   `json:"options,omitempty"`
	Capabilities json.RawMessage `json:"capabilities,omitempty"`
}

// AgentOption is one configurable option of an agent.
type AgentOption struct {
	Type        string   `json:"type"`
	Name        string   `json:"name"`
	Title       string   `json:"title,omitempty"`
	Description string   `json:"description,omitempty"`
	Options     []string `json:"options,omitempty"`
	Default     string   `json:"default"`
}

// declare answers PUT /agents/{name}: an agent declares its AgentInfo. The
// caller must be allowed to act as that agent.
func (s *Surface) declare(r *protocol.Request) error {
	name := r.Params[0]
	if err := r.Principal.Authorize(auth.ActAct, auth.Resource{Kind: auth.KindAgent, ID: name, AgentID: name}); err != nil {
		return err
	}
	var info AgentInfo
	if err := json.Unmarshal(r.Ctx.PostBody(), &info); err != nil {
		return protocol.Invalid("invalid AgentInfo: " + err.Error())
	}
	if info.Name != name || info.Version == "" {
		return protocol.Invalid("AgentInfo needs name (the agent id of the path) and version")
	}
	data, _ := json.Marshal(&info)
	if err := s.o.Kernel.Declare(r.Ctx, name, data); err != nil {
		return err
	}
	writeJSON(r.Ctx, fasthttp.StatusOK, &info)
	return nil
}

// declared returns the declared agents, by name, with whether each is
// online.
func (s *Surface) declared() (map[string]AgentInfo, []kernel.Declaration, error) {
	decls, err := s.o.Kernel.Declarations()
	if err != nil {
		return nil, nil, err
	}
	out := map[string]AgentInfo{}
	var kept []kernel.Declaration
	for _, d := range decls {
		var info AgentInfo
		if json.Unmarshal(d.Info, &info) == nil && info.Name == d.AgentID {
			out[d.AgentID] = info
			kept = append(kept, d)
		}
	}
	return out, kept, nil
}

// meta answers GET /meta: version 1 and every declared agent (extension:
// "online" says whether one of its consumers is connected).
func (s *Surface) meta(r *protocol.Request) error {
	infos, decls, err := s.declared()
	if err != nil {
		return err
	}
	type listed struct {
		AgentInfo
		Online bool `json:"online"`
	}
	agents := []listed{}
	for _, d := range decls {
		agents = append(agents, listed{AgentInfo: infos[d.AgentID], Online: d.Online})
	}
	writeJSON(r.Ctx, fasthttp.StatusOK, map[string]any{"version": 1, "agents": agents})
	return nil
}

// config is what the surface keeps about an AAP session, in the session's
// attributes: never in its log (options may hold secrets).
type config struct {
	Agent       string            `json:"agent"`
	ServerTools json.RawMessage   `json:"serverTools,omitempty"` // the session's agent.tools, absent: none enabled
	Options     map[string]string `json:"options,omitempty"`
	ClientTools json.RawMessage   `json:"tools,omitempty"`
	Deleted     bool              `json:"deleted,omitempty"`
}

const attrKey = "aap"

func configOf(sess *session.Session) config {
	var c config
	_ = json.Unmarshal(sess.Attrs[attrKey], &c)
	return c
}

// session returns AAP session id if p may act on it; another's, a deleted
// one and a session that is not AAP's are not found.
func (s *Surface) session(ctx context.Context, p *auth.Principal, act auth.Action, id string) (session.Session, config, error) {
	sess, err := protocol.Session(ctx, s.o.Sessions, p, act, id)
	if err != nil && !errors.Is(err, auth.ErrHidden) {
		return session.Session{}, config{}, err
	}
	c := configOf(&sess)
	if err != nil || c.Agent == "" || c.Deleted {
		return session.Session{}, config{}, fmt.Errorf("%w: unknown session %s", session.ErrNotFound, id)
	}
	return sess, c, nil
}

// listSessions answers GET /sessions?after=: the caller's AAP session
// ids; next only when there are more.
func (s *Surface) listSessions(r *protocol.Request) error {
	page, err := protocol.ListSessions(r.Ctx, s.o.Sessions, r.Principal, session.ListRequest{
		After: string(r.Ctx.QueryArgs().Peek("after")),
		Visible: func(x *session.Session) bool {
			c := configOf(x)
			return c.Agent != "" && !c.Deleted
		},
	})
	if err != nil {
		return err
	}
	ids := []string{}
	for _, x := range page.Sessions {
		ids = append(ids, x.ID)
	}
	out := map[string]any{"sessions": ids}
	if page.Next != "" {
		out["next"] = page.Next
	}
	writeJSON(r.Ctx, fasthttp.StatusOK, out)
	return nil
}

// deleteSession answers DELETE /session/{id}: 204 with no body. The
// session is archived and no longer an AAP session: AAP answers 404 for it
// from then on; its log stays for the other surfaces until retention. A
// running turn is cancelled.
func (s *Surface) deleteSession(r *protocol.Request) error {
	sess, c, err := s.session(r.Ctx, r.Principal, auth.ActWrite, r.Params[0])
	if err != nil {
		return err
	}
	if exec := s.activeExecution(r.Ctx, &sess); exec != "" {
		_, _ = s.o.Kernel.Cancel(r.Ctx, exec, kernel.Meta{Principal: r.Principal.Subject, Tenant: r.Principal.Tenant})
	}
	c.Deleted = true
	data, _ := json.Marshal(&c)
	if _, err := s.o.Sessions.SetAttrs(r.Ctx, sess.ID, attrKey, data); err != nil {
		return err
	}
	if _, err := s.o.Sessions.Archive(r.Ctx, sess.ID); err != nil {
		return err
	}
	r.Ctx.SetStatusCode(fasthttp.StatusNoContent)
	return nil
}

// activeExecution returns the execution running the session's turn, if
// any.
func (s *Surface) activeExecution(ctx context.Context, sess *session.Session) string {
	if len(sess.Threads) == 0 || sess.Threads[0].Active == "" {
		return ""
	}
	t, err := s.o.Sessions.Turn(ctx, sess.ID, sess.Threads[0].Active)
	if err != nil {
		return ""
	}
	return t.ExecutionID
}

// history folds session id's log into its AAP history.
func (s *Surface) history(ctx context.Context, id string) ([]Message, error) {
	var h historian
	err := s.o.Sessions.WalkResolved(ctx, s.o.Kernel, id, 0, func(facts []session.Resolved) (bool, error) {
		for i := range facts {
			h.add(&facts[i])
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	return h.messages(), nil
}

// getSession answers GET /session/{id}?history=compacted|full: the agent
// config (secret options masked), the client's tools, and the history
// asked for.
func (s *Surface) getSession(r *protocol.Request) error {
	sess, c, err := s.session(r.Ctx, r.Principal, auth.ActRead, r.Params[0])
	if err != nil {
		return err
	}
	agent := map[string]any{"name": c.Agent}
	if len(c.ServerTools) > 0 {
		agent["tools"] = c.ServerTools
	}
	if len(c.Options) > 0 {
		agent["options"] = s.masked(c.Agent, c.Options)
	}
	out := map[string]any{"sessionId": sess.ID, "agent": agent}
	if len(c.ClientTools) > 0 && string(c.ClientTools) != "[]" {
		out["tools"] = c.ClientTools
	}
	switch want := string(r.Ctx.QueryArgs().Peek("history")); want {
	case "compacted", "full":
		msgs, err := s.history(r.Ctx, sess.ID)
		if err != nil {
			return err
		}
		if want == "compacted" {
			msgs = compacted(msgs)
		}
		out["history"] = map[string]any{want: msgs}
	}
	writeJSON(r.Ctx, fasthttp.StatusOK, out)
	return nil
}

// masked returns options with the value of every option the agent
// declares secret replaced by "***".
func (s *Surface) masked(agent string, opts map[string]string) map[string]string {
	infos, _, _ := s.declared()
	out := make(map[string]string, len(opts))
	for k, v := range opts {
		out[k] = v
		for _, o := range infos[agent].Options {
			if o.Name == k && o.Type == "secret" {
				out[k] = "***"
			}
		}
	}
	return out
}

// agentContext answers GET /agents/{name}/sessions/{id}: what the agent
// needs for its turn, for the agent alone: the full history, the client's
// tools, the server tools enabled with their trust, and the options with
// their secrets. Secrets reach the agent this way only, never an event.
func (s *Surface) agentContext(r *protocol.Request) error {
	name, id := r.Params[0], r.Params[1]
	if err := r.Principal.Authorize(auth.ActAct, auth.Resource{Kind: auth.KindAgent, ID: name, AgentID: name}); err != nil {
		return err
	}
	sess, err := s.o.Sessions.Get(r.Ctx, id)
	if err != nil {
		return err
	}
	c := configOf(&sess)
	if c.Agent != name || c.Deleted {
		return session.ErrNotFound
	}
	msgs, err := s.history(r.Ctx, id)
	if err != nil {
		return err
	}
	writeJSON(r.Ctx, fasthttp.StatusOK, map[string]any{
		"sessionId": id, "messages": msgs, "tools": rawOr(c.ClientTools, "[]"), "agentTools": rawOr(c.ServerTools, "[]"), "options": c.Options,
	})
	return nil
}

func rawOr(v json.RawMessage, def string) json.RawMessage {
	if len(v) == 0 {
		return json.RawMessage(def)
	}
	return v
}

// modeOf reads a request's stream mode: delta and message stream, any
// other value (or none) answers JSON, as the official client expects.
func modeOf(v string) string {
	switch v {
	case modeDelta, modeMessage:
		return v
	}
	return modeNone
}
