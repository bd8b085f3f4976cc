package runtimeapi

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/protocol"
	"github.com/gatehouse-dev/gatehouse/session"
)

// interactionMode is the only mode the seeds define ("plan" is reserved).
const interactionMode = "execute"

// maxListedExecutions bounds the executions GET /sessions/{id} shows: the
// newest are kept.
const maxListedExecutions = 100

// Session is a session as the Runtime API shows it.
type Session struct {
	ID              string           `json:"id"`
	Title           string           `json:"title"`
	Source          string           `json:"source"`
	InteractionMode string           `json:"interactionMode"`
	Status          string           `json:"status"`
	CreatedAt       time.Time        `json:"createdAt"`
	Executions      []ExecutionBrief `json:"executions,omitempty"`
}

// ExecutionBrief is one execution of a session.
type ExecutionBrief struct {
	ExecutionID string    `json:"executionId"`
	Tool        string    `json:"tool"`
	Status      string    `json:"status"`
	CreatedAt   time.Time `json:"createdAt"`
	UpdatedAt   time.Time `json:"updatedAt"`
}

func show(sess *session.Session) Session {
	return Session{ID: sess.ID, Title: sess.Title, Source: sess.Source, InteractionMode: interactionMode,
		Status: string(sess.Status), CreatedAt: sess.Created}
}

// session returns session id if p may act on it; another's is not found.
func (s *Surface) session(ctx context.Context, p *auth.Principal, act auth.Action, id string) (session.Session, error) {
	sess, err := protocol.Session(ctx, s.o.Sessions, p, act, id)
	if err != nil && !errors.Is(err, auth.ErrForbidden) {
		return session.Session{}, notFound("session", id)
	}
	return sess, err
}

// createSession answers POST /sessions {title?, id?}: 201 with the session.
func (s *Surface) createSession(r *protocol.Request) error {
	if err := r.Principal.Can(auth.ActWrite, auth.KindSession); err != nil {
		return err
	}
	var in struct {
		ID    string `json:"id"`
		Title string `json:"title"`
	}
	if err := decode(r.Ctx, &in); err != nil {
		return err
	}
	sess, err := s.newSession(r.Ctx, r.Principal, in.ID, in.Title)
	if errors.Is(err, auth.ErrHidden) {
		return notFound("session", in.ID) // as a read of it answers
	}
	if err != nil {
		return err
	}
	writeJSON(r.Ctx, fasthttp.StatusCreated, show(&sess))
	return nil
}

// newSession makes a session for p; a session made with a token is the
// seeds' "api" source. A taken id of another is auth.ErrHidden (see
// protocol.CreateSession).
func (s *Surface) newSession(ctx context.Context, p *auth.Principal, id, title string) (session.Session, error) {
	return protocol.CreateSession(ctx, s.o.Sessions, p, session.CreateRequest{ID: id, Title: title, Source: "api"})
}

// getSession answers GET /sessions/{id}: the session with its newest
// executions.
func (s *Surface) getSession(r *protocol.Request) error {
	sess, err := s.session(r.Ctx, r.Principal, auth.ActRead, r.Params[0])
	if err != nil {
		return err
	}
	turns, err := s.o.Sessions.Turns(r.Ctx, sess.ID)
	if err != nil {
		return err
	}
	out := show(&sess)
	out.Executions = []ExecutionBrief{}
	if len(turns) > maxListedExecutions {
		turns = turns[len(turns)-maxListedExecutions:]
	}
	for _, t := range turns {
		if t.ExecutionID == "" {
			continue
		}
		v, err := s.o.Kernel.Get(r.Ctx, t.ExecutionID)
		if err != nil {
			continue // pruned by retention
		}
		b := ExecutionBrief{ExecutionID: v.ID, Status: runStatus(v.Status), CreatedAt: v.CreatedAt, UpdatedAt: v.UpdatedAt}
		if v.Tool != nil {
			b.Tool = v.Tool.ToolID
		}
		out.Executions = append(out.Executions, b)
	}
	writeJSON(r.Ctx, fasthttp.StatusOK, out)
	return nil
}

// listSessions answers GET /sessions?after=&limit= (extension): the
// caller's sessions, in id order; next only when there are more.
func (s *Surface) listSessions(r *protocol.Request) error {
	args := r.Ctx.QueryArgs()
	limit, _ := strconv.Atoi(string(args.Peek("limit")))
	page, err := protocol.ListSessions(r.Ctx, s.o.Sessions, r.Principal, session.ListRequest{After: string(args.Peek("after")), Limit: limit})
	if err != nil {
		return err
	}
	list := make([]Session, 0, len(page.Sessions))
	for i := range page.Sessions {
		list = append(list, show(&page.Sessions[i]))
	}
	out := map[string]any{"sessions": list}
	if page.Next != "" {
		out["next"] = page.Next
	}
	writeJSON(r.Ctx, fasthttp.StatusOK, out)
	return nil
}

// archiveSession answers POST /sessions/{id}/archive (extension): the
// session takes no more invocations (409).
func (s *Surface) archiveSession(r *protocol.Request) error {
	sess, err := s.session(r.Ctx, r.Principal, auth.ActWrite, r.Params[0])
	if err != nil {
		return err
	}
	if sess, err = s.o.Sessions.Archive(r.Ctx, sess.ID); err != nil {
		return err
	}
	writeJSON(r.Ctx, fasthttp.StatusOK, show(&sess))
	return nil
}

// listCapabilities answers GET /capabilities.
func (s *Surface) listCapabilities(r *protocol.Request) error {
	if err := r.Principal.Can(auth.ActRead, auth.KindSession); err != nil {
		return err
	}
	writeJSON(r.Ctx, fasthttp.StatusOK, map[string]any{"capabilities": s.capabilities()})
	return nil
}

// sessionCapabilities answers GET /sessions/{id}/capabilities: what can be
// invoked in the session (every capability, while it is active).
func (s *Surface) sessionCapabilities(r *protocol.Request) error {
	sess, err := s.session(r.Ctx, r.Principal, auth.ActRead, r.Params[0])
	if err != nil {
		return err
	}
	caps := []Capability{}
	if sess.Status == session.StatusActive {
		caps = s.capabilities()
	}
	writeJSON(r.Ctx, fasthttp.StatusOK, map[string]any{"capabilities": caps})
	return nil
}
