package aap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/protocol"
	"github.com/gatehouse-dev/gatehouse/session"
	"github.com/gatehouse-dev/gatehouse/stream"
)

// turnWait bounds how long a request in stream mode none waits for its
// turn to stop; past it the answer is 504 and GET /session/{id}/stream
// follows the rest.
const turnWait = 10 * time.Minute

// agentConfig is a request's agent: its name (PUT only), server tools and
// options. Absent and empty stay distinct (json.RawMessage, maps).
type agentConfig struct {
	Name    *string           `json:"name"`
	Tools   json.RawMessage   `json:"tools"`
	Options map[string]string `json:"options"`
}

// turnRequest is the body of PUT /session and POST /session/{id}.
type turnRequest struct {
	Agent    *agentConfig      `json:"agent"`
	Stream   string            `json:"stream"`
	Messages []json.RawMessage `json:"messages"`
	Tools    json.RawMessage   `json:"tools"`
}

// incoming is what the surface reads of a request's message.
type incoming struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCallID string          `json:"toolCallId"`
	Granted    *bool           `json:"granted"`
	Reason     string          `json:"reason"`
}

func decodeTurn(body []byte) (turnRequest, []incoming, error) {
	var req turnRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return req, nil, protocol.Invalid("invalid JSON: " + err.Error())
	}
	if len(req.Messages) == 0 {
		return req, nil, protocol.Invalid("messages is required")
	}
	msgs := make([]incoming, len(req.Messages))
	for i, raw := range req.Messages {
		if err := json.Unmarshal(raw, &msgs[i]); err != nil {
			return req, nil, protocol.Invalid("message " + strconv.Itoa(i) + ": " + err.Error())
		}
		switch msgs[i].Role {
		case "system", "user", "assistant", "tool", "tool_permission":
		default:
			return req, nil, protocol.Invalid("message " + strconv.Itoa(i) + " has an unknown role " + strconv.Quote(msgs[i].Role))
		}
	}
	return req, msgs, nil
}

// askTools are the session's enabled server tools that a person must
// allow: those without trust (AAP's default).
func askTools(serverTools json.RawMessage) []string {
	var refs []struct {
		Name  string `json:"name"`
		Trust bool   `json:"trust"`
	}
	_ = json.Unmarshal(serverTools, &refs)
	var ask []string
	for _, r := range refs {
		if !r.Trust {
			ask = append(ask, r.Name)
		}
	}
	return ask
}

// putSession answers PUT /session: a new session with the agent, its seed
// history ending with the user's message, which runs as the first turn.
func (s *Surface) putSession(r *protocol.Request) error {
	if err := r.Principal.Can(auth.ActWrite, auth.KindSession); err != nil {
		return err
	}
	req, msgs, err := decodeTurn(r.Ctx.PostBody())
	if err != nil {
		return err
	}
	if req.Agent == nil || req.Agent.Name == nil || *req.Agent.Name == "" {
		return protocol.Invalid("agent.name is required")
	}
	if msgs[len(msgs)-1].Role != "user" {
		return protocol.Invalid("the last message must be a user message")
	}
	infos, _, err := s.declared()
	if err != nil {
		return err
	}
	name := *req.Agent.Name
	if _, ok := infos[name]; !ok {
		return fmt.Errorf("%w: unknown agent %q", session.ErrNotFound, name)
	}
	c := config{Agent: name, ServerTools: req.Agent.Tools, Options: req.Agent.Options, ClientTools: req.Tools}
	attrs, _ := json.Marshal(&c)
	sess, err := s.o.Sessions.Create(r.Ctx, session.CreateRequest{
		AgentID: name, Owner: r.Principal.Subject, Tenant: r.Principal.Tenant, Source: "api",
		Attrs: map[string]json.RawMessage{attrKey: attrs},
	})
	if err != nil {
		return err
	}
	turn, from, err := s.submit(r.Ctx, &sess, c, req.Messages)
	if err != nil {
		return err
	}
	return s.answer(r, sess.ID, turn, from, modeOf(req.Stream), true)
}

// submit submits messages as a new turn of the session's agent. from is
// where the turn's stream starts: the log's last sequence before the turn.
func (s *Surface) submit(ctx context.Context, sess *session.Session, c config, messages []json.RawMessage) (turn string, from uint64, err error) {
	from, err = s.o.Sessions.Last(ctx, sess.ID)
	if err != nil {
		return "", 0, err
	}
	var in turnInput
	in.AAP.SessionID, in.AAP.TurnID, in.AAP.Messages = sess.ID, event.NewID(), messages
	data, _ := json.Marshal(&in)
	t, err := s.o.Sessions.Submit(ctx, session.SubmitRequest{SessionID: sess.ID, TurnID: in.AAP.TurnID, Input: data, Ask: askTools(c.ServerTools)})
	if err != nil {
		return "", 0, err
	}
	return t.ID, from, nil
}

// postSession answers POST /session/{id}: the session's overrides, then
// either a user message (a new turn: 409 while one runs) or the client's
// answers to the waiting turn: tool results and permission answers (400
// when one answers no pending call).
func (s *Surface) postSession(r *protocol.Request) error {
	sess, c, err := s.session(r.Ctx, r.Principal, auth.ActWrite, r.Params[0])
	if err != nil {
		return err
	}
	req, msgs, err := decodeTurn(r.Ctx.PostBody())
	if err != nil {
		return err
	}
	if req.Agent != nil && req.Agent.Name != nil && *req.Agent.Name != c.Agent {
		return protocol.Invalid("the agent of a session cannot change")
	}
	if changed := c.override(req); changed {
		data, _ := json.Marshal(&c)
		if _, err := s.o.Sessions.SetAttrs(r.Ctx, sess.ID, attrKey, data); err != nil {
			return err
		}
	}
	mode := modeOf(req.Stream)
	active := ""
	if len(sess.Threads) > 0 {
		active = sess.Threads[0].Active
	}
	if msgs[0].Role == "user" {
		if len(msgs) != 1 {
			return protocol.Invalid("a user message comes alone")
		}
		if active != "" {
			return fmt.Errorf("%w: a turn of session %s is running or waits for tool answers", errBusy, sess.ID)
		}
		turn, from, err := s.submit(r.Ctx, &sess, c, req.Messages)
		if err != nil {
			return err
		}
		return s.answer(r, sess.ID, turn, from, mode, false)
	}
	from, err := s.answerTools(r, &sess, active, msgs)
	if err != nil {
		return err
	}
	return s.answer(r, sess.ID, active, from, mode, false)
}

// override applies a POST's overrides: client tools and server tools
// replace, options merge by key. It reports a change.
func (c *config) override(req turnRequest) bool {
	changed := false
	if req.Tools != nil {
		c.ClientTools, changed = req.Tools, true
	}
	if req.Agent != nil && req.Agent.Tools != nil {
		c.ServerTools, changed = req.Agent.Tools, true
	}
	if req.Agent != nil && len(req.Agent.Options) > 0 {
		if c.Options == nil {
			c.Options = map[string]string{}
		}
		for k, v := range req.Agent.Options {
			if v == "***" {
				continue // a client echoing a loaded, masked config keeps the secret
			}
			c.Options[k], changed = v, true
		}
	}
	return changed
}

// answerTools gives the client's answers to the turn waiting for them:
// results of its own tools, then permission answers for server tools,
// through the bridge like every channel. It returns where the turn's
// stream continues: after the results (the client has them), before what
// the answers cause.
func (s *Surface) answerTools(r *protocol.Request, sess *session.Session, active string, msgs []incoming) (uint64, error) {
	if active == "" {
		return 0, protocol.Invalid("no call of session " + sess.ID + " waits for an answer")
	}
	t, err := s.o.Sessions.Turn(r.Ctx, sess.ID, active)
	if err != nil || t.ExecutionID == "" {
		return 0, protocol.Invalid("no call of session " + sess.ID + " waits for an answer")
	}
	exec := t.ExecutionID
	meta := kernel.Meta{Principal: r.Principal.Subject, Tenant: r.Principal.Tenant}
	answeredTools := false
	for _, m := range msgs {
		if m.Role != "tool" {
			continue
		}
		if m.ToolCallID == "" {
			return 0, protocol.Invalid("a tool message needs toolCallId")
		}
		content, _ := json.Marshal(contentText(m.Content))
		after, err := s.o.Kernel.AnswerStep(r.Ctx, kernel.StepResultRequest{ExecutionID: exec, StepID: m.ToolCallID, Success: true, Data: content}, meta)
		if err != nil {
			if errors.Is(err, kernel.ErrNotFound) || errors.Is(err, kernel.ErrConflict) {
				return 0, protocol.Invalid("tool message " + m.ToolCallID + " answers no pending call: " + err.Error())
			}
			return 0, err
		}
		after.Run()
		answeredTools = true
	}
	from, err := s.o.Sessions.Last(r.Ctx, sess.ID)
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		switch {
		case m.Role == "tool":
		case m.Role != "tool_permission":
			return 0, protocol.Invalid("answers are tool and tool_permission messages only, not " + m.Role)
		case m.Granted == nil || m.ToolCallID == "":
			return 0, protocol.Invalid("a tool_permission message needs toolCallId and granted")
		default:
			action := s.o.Kernel.ApprovalOf(exec, m.ToolCallID)
			if action == "" {
				return 0, protocol.Invalid("tool_permission " + m.ToolCallID + " answers no pending call")
			}
			decision := "deny"
			if *m.Granted {
				decision = "allow_once"
			}
			_, after, err := r.Gateway.Respond(r.Ctx, r.Principal, action, protocol.Response{Decision: decision, Reason: m.Reason, ChannelID: "aap"})
			if err != nil && !errors.Is(err, kernel.ErrConflict) {
				return 0, err // a conflict: a channel answered first, and its answer stands
			}
			if after != nil {
				after.Run()
			}
		}
	}
	if answeredTools {
		v, err := s.o.Kernel.Get(r.Ctx, exec)
		if err == nil && v.Status == kernel.StatusBlocked && v.BlockReason == "signal" && v.BlockRef == SignalTools {
			after, err := s.o.Kernel.Signal(r.Ctx, exec, kernel.SignalRequest{SignalType: SignalTools}, meta)
			if err != nil {
				return 0, err
			}
			after.Run()
		}
	}
	return from, nil
}

// contentText is a tool message's content as the agent reads it: a string
// as it is, blocks as their JSON.
func contentText(c json.RawMessage) string {
	var s string
	if json.Unmarshal(c, &s) == nil {
		return s
	}
	return string(c)
}

// answer answers a turn request: the turn's stream after log position
// from (delta or message mode), or, in mode none, the turn's new messages
// once it stops.
func (s *Surface) answer(r *protocol.Request, id, turn string, from uint64, mode string, created bool) error {
	if mode == modeNone {
		return s.answerJSON(r, id, turn, from, created)
	}
	var first []sseEvent
	if created {
		first = append(first, sseEvent{position{from, subSessionStart}, "session_start", map[string]string{"sessionId": id}})
	}
	first = append(first, sseEvent{position{from, subTurnStart}, "turn_start", map[string]any{}})
	src, err := s.turnSource(r.Ctx, id, turn, position{seq: from}, mode, first)
	if err != nil {
		return err
	}
	s.streamTurn(r, src)
	return nil
}

// streamTurn answers with the SSE stream of a turn (see turnSource), which
// ends with its turn_stop.
func (s *Surface) streamTurn(r *protocol.Request, src *turnSource) {
	r.Gateway.SSE(r, "aap", renderer, stream.SSEOptions{}, false, func(o *stream.Options) (stream.Source, func()) {
		o.Final = isStop
		return src, nil
	})
}

// answerJSON waits for the turn to stop and answers its new messages.
func (s *Surface) answerJSON(r *protocol.Request, id, turn string, from uint64, created bool) error {
	ctx, cancel := requestContext(r.Ctx, turnWait)
	defer cancel()
	src := s.turnSourceAt(id, turn, from, position{seq: from}, modeMessage, nil)
	defer src.Close()
	reason, err := src.waitStop(ctx)
	if err != nil {
		if ctx.Err() != nil {
			writeJSON(r.Ctx, fasthttp.StatusGatewayTimeout, protocol.ErrorBody{Error: "the turn still runs; GET /session/" + id + "/stream follows it", Code: "TIMEOUT"})
			return nil
		}
		return err
	}
	var h historian
	facts, err := s.read(ctx, id, from, 100000)
	if err != nil {
		return err
	}
	for i := range facts {
		if facts[i].Item.TurnID == turn {
			h.add(&facts[i])
		}
	}
	msgs := []Message{}
	for _, m := range h.messages() {
		if m.Role == "assistant" || m.Role == "tool" {
			msgs = append(msgs, m)
		}
	}
	out := map[string]any{"stopReason": reason, "messages": msgs}
	status := fasthttp.StatusOK
	if created {
		out["sessionId"] = id
		status = fasthttp.StatusCreated
	}
	writeJSON(r.Ctx, status, out)
	return nil
}

// resumeStream answers GET /session/{id}/stream (extension): the stream of
// the session's current (or last) turn after Last-Event-ID, ending with its
// turn_stop (at once when the client has the turn's last one); without
// Last-Event-ID, or with an id from before the turn, the turn's stream
// from its turn_start.
func (s *Surface) resumeStream(r *protocol.Request) error {
	sess, _, err := s.session(r.Ctx, r.Principal, auth.ActRead, r.Params[0])
	if err != nil {
		return err
	}
	turns, err := s.o.Sessions.Turns(r.Ctx, sess.ID)
	if err != nil {
		return err
	}
	if len(turns) == 0 {
		return protocol.Invalid("session " + sess.ID + " has no turn yet")
	}
	t := turns[len(turns)-1]
	if len(sess.Threads) > 0 && sess.Threads[0].Active != "" {
		t.ID = sess.Threads[0].Active
	}
	mode := modeOf(string(r.Ctx.QueryArgs().Peek("stream")))
	if mode == modeNone {
		mode = modeDelta
	}
	start, err := s.turnStart(r.Ctx, sess.ID, &t)
	if err != nil {
		return err
	}
	seen := position{seq: start, sub: subSessionStart}
	if h := strings.TrimSpace(string(r.Ctx.Request.Header.Peek("Last-Event-ID"))); h != "" {
		p, err := parsePosition(h)
		if err != nil {
			return err
		}
		last, err := s.o.Sessions.Last(r.Ctx, sess.ID)
		if err != nil {
			return err
		}
		if p.seq > last {
			return protocol.Invalid("Last-Event-ID " + h + " is ahead of the session's log, which ends at " + strconv.FormatUint(last, 10))
		}
		if p.after(seen) {
			seen = p
		}
	}
	var first []sseEvent
	if seen.sub == subSessionStart {
		first = []sseEvent{{position{seen.seq, subTurnStart}, "turn_start", map[string]any{}}}
	}
	s.streamTurn(r, s.turnSourceAt(sess.ID, t.ID, start, seen, mode, first))
	return nil
}

// read returns up to limit facts of session id after after, references
// resolved to their execution events.
func (s *Surface) read(ctx context.Context, id string, after uint64, limit int) ([]session.Resolved, error) {
	return s.o.Sessions.ReadResolved(ctx, s.o.Kernel, id, after, limit, nil)
}

// turnSource streams one turn of a session to a client that has its
// events up to seen: it renders the turn's facts from the turn's start
// (what the client has is folded, not sent, so that every stream of the
// turn renders alike), sends first once the log is folded up to seen, and
// ends after the turn_stop that follows them, or at once when the client
// has the turn's last turn_stop.
type turnSource struct {
	s     *Surface
	id    string
	turn  string
	last  uint64   // the log position read up to
	seen  position // events up to it are the client's already
	first []sseEvent
	open  bool // the log is folded up to seen
	r     turnRender
	watch *session.Watch
	done  bool
	queue []sseEvent // rendered, not handed out yet
	held  []sseEvent // the events of the last Next
}

// turnSource returns the source of turn's stream for a client that has
// its events up to seen, folding the turn from its start.
func (s *Surface) turnSource(ctx context.Context, id, turn string, seen position, mode string, first []sseEvent) (*turnSource, error) {
	t, err := s.o.Sessions.Turn(ctx, id, turn)
	if err != nil {
		return nil, err
	}
	start, err := s.turnStart(ctx, id, &t)
	if err != nil {
		return nil, err
	}
	return s.turnSourceAt(id, turn, start, seen, mode, first), nil
}

// turnStart is the log position before turn t's first fact. A turn whose
// beginning retention removed (an ended one: a running turn's facts are
// kept) cannot be rendered as its streams were, and is CURSOR_EXPIRED.
func (s *Surface) turnStart(ctx context.Context, id string, t *session.Turn) (uint64, error) {
	oldest, err := s.o.Sessions.First(ctx, id)
	if err != nil {
		return 0, err
	}
	if t.FirstSeq == 0 || oldest > t.FirstSeq {
		return 0, fmt.Errorf("%w: the beginning of turn %s of session %s is no longer kept", session.ErrCursorExpired, t.ID, id)
	}
	return t.FirstSeq - 1, nil
}

// turnSourceAt returns the source of turn's stream, folding the log from
// position start.
func (s *Surface) turnSourceAt(id, turn string, start uint64, seen position, mode string, first []sseEvent) *turnSource {
	return &turnSource{s: s, id: id, turn: turn, last: start, seen: seen, first: first, r: newTurnRender(mode), watch: s.o.Sessions.Watch(id)}
}

func (src *turnSource) Next(buf []stream.Item) (int, error) {
	src.held = src.held[:0]
	var err error
	for len(src.held) < len(buf) {
		if len(src.queue) == 0 {
			if src.done {
				break
			}
			// A read may fold only what the client has: read on until
			// something is queued or the log has no more now.
			var more bool
			if more, err = src.fill(len(buf)); err != nil || len(src.queue) == 0 && !more {
				break
			}
			continue
		}
		ev := src.queue[0]
		src.queue = src.queue[1:]
		src.held = append(src.held, ev)
	}
	for i := range src.held {
		buf[i] = stream.Item{Seq: src.held[i].id.seq, Type: src.held[i].name, Value: &src.held[i]}
	}
	if len(src.held) == 0 && src.done && err == nil {
		err = stream.ErrEnd
	}
	return len(src.held), err
}

// fill renders up to limit facts after the position read up to into the
// queue: those of the turn that the client does not have, and first once
// the log is folded up to what it has. more reports that the log may hold
// more facts now.
func (src *turnSource) fill(limit int) (more bool, err error) {
	facts, err := src.s.read(context.Background(), src.id, src.last, limit)
	if err != nil {
		return false, err
	}
	// A read bounded by bytes may hold fewer facts than asked while the
	// log has more: only an empty one says that it has none now.
	more = len(facts) > 0
	var evs []sseEvent
	for i := range facts {
		f := &facts[i]
		if f.Item.Seq > src.seen.seq {
			src.opened()
		}
		src.last = f.Item.Seq
		if f.Item.TurnID != src.turn {
			continue
		}
		evs = src.r.events(f, evs[:0])
		for _, ev := range evs {
			stop := ev.name == "turn_stop"
			if !ev.id.after(src.seen) {
				// The client has it. Past the turn's last turn_stop there
				// is nothing more to send; after one for tool_use the turn
				// goes on.
				src.done = src.done || stop && ev.data.(map[string]string)["stopReason"] != stopToolUse
				continue
			}
			src.queue = append(src.queue, ev)
			if stop {
				src.done = true
				return false, nil
			}
		}
		if src.done {
			return false, nil
		}
	}
	if src.last >= src.seen.seq {
		src.opened()
	}
	return more, nil
}

// opened queues the stream's first events, once the log is folded up to
// what the client has. A turn_start, sent now or had by the client, ends
// the client's blocks.
func (src *turnSource) opened() {
	if src.open {
		return
	}
	src.open = true
	if len(src.first) > 0 || src.seen.sub == subTurnStart {
		clear(src.r.acc)
	}
	src.queue = append(src.queue, src.first...)
	src.first = nil
}

func (src *turnSource) OnWake(f func()) { src.watch.OnWake(f) }

func (src *turnSource) Close() { src.watch.Stop() }

// waitStop reads the turn until its turn_stop and returns the stop reason.
func (src *turnSource) waitStop(ctx context.Context) (string, error) {
	buf := make([]stream.Item, 256)
	for {
		n, err := src.Next(buf)
		for _, it := range buf[:n] {
			if it.Type == "turn_stop" {
				return it.Value.(*sseEvent).data.(map[string]string)["stopReason"], nil
			}
		}
		if err != nil {
			return "", err
		}
		if n > 0 {
			continue
		}
		select {
		case <-src.watch.C():
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

func isStop(it stream.Item) bool { return it.Type == "turn_stop" }

// renderer shows AAP events: the name on the event line, the data as one
// JSON object, the id for resuming.
var renderer = stream.RenderFunc(func(f *stream.Frame, it stream.Item) (bool, error) {
	ev := it.Value.(*sseEvent)
	data, err := json.Marshal(ev.data)
	if err != nil {
		return false, err
	}
	f.ID = ev.id.appendTo(f.ID)
	f.Event = ev.name
	f.Data = append(f.Data, data...)
	return true, nil
})

// requestContext is a context for a handler's wait: it ends after d, or
// when the server shuts down (rc.Done). It is not derived from rc, since a
// context derived from a fasthttp.RequestCtx reads it from a goroutine
// that may outlive the request, racing with the server's shutdown; the
// watcher here is joined by cancel, which the handler calls before it
// returns.
func requestContext(rc *fasthttp.RequestCtx, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-rc.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		cancel()
		<-stopped
	}
}
