package aap

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
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
		return errors.Join(session.ErrNotFound, errors.New("unknown agent "+strconv.Quote(name)))
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
			return errors.Join(errBusy, errors.New("a turn of session "+sess.ID+" is running or waits for tool answers"))
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

// answer answers a turn request: the turn's stream from position from
// (delta or message mode), or, in mode none, the turn's new messages once
// it stops.
func (s *Surface) answer(r *protocol.Request, id, turn string, from uint64, mode string, created bool) error {
	if mode == modeNone {
		return s.answerJSON(r, id, turn, from, created)
	}
	var first []sseEvent
	if created {
		first = append(first, sseEvent{"session_start", map[string]string{"sessionId": id}})
	}
	first = append(first, sseEvent{"turn_start", map[string]any{}})
	s.streamTurn(r, id, turn, from, mode, first)
	return nil
}

// streamTurn answers with the SSE stream of a turn (see turnSource), which
// ends with its turn_stop.
func (s *Surface) streamTurn(r *protocol.Request, id, turn string, from uint64, mode string, first []sseEvent) {
	src := s.turnSource(id, turn, from, mode, first)
	r.Gateway.SSE(r, "aap", renderer, stream.SSEOptions{}, false, func(o *stream.Options) (stream.Source, func()) {
		o.Final = isStop
		return src, nil
	})
}

// answerJSON waits for the turn to stop and answers its new messages.
func (s *Surface) answerJSON(r *protocol.Request, id, turn string, from uint64, created bool) error {
	ctx, cancel := requestContext(r.Ctx, turnWait)
	defer cancel()
	src := s.turnSource(id, turn, from, modeMessage, nil)
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
// turn_stop; without Last-Event-ID, the turn's stream from its start.
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
	var first []sseEvent
	from, ok, err := lastEventID(r.Ctx)
	if err != nil {
		return err
	}
	if !ok {
		from = t.FirstSeq - 1
		first = []sseEvent{{"turn_start", map[string]any{}}}
	}
	s.streamTurn(r, sess.ID, t.ID, from, mode, first)
	return nil
}

// read returns up to limit facts of session id after after, references
// resolved to their execution events.
func (s *Surface) read(ctx context.Context, id string, after uint64, limit int) ([]session.Resolved, error) {
	return s.o.Sessions.ReadResolved(ctx, s.o.Kernel, id, after, limit, nil)
}

// turnSource streams one turn of a session from a position: its facts
// rendered in a mode, after the synthetic first events, until turn_stop.
type turnSource struct {
	s     *Surface
	id    string
	turn  string
	last  uint64
	mode  string
	first []sseEvent
	watch *session.Watch
	done  bool
	held  []sseEvent // the rendered events of the last Next
}

func (s *Surface) turnSource(id, turn string, from uint64, mode string, first []sseEvent) *turnSource {
	return &turnSource{s: s, id: id, turn: turn, last: from, mode: mode, first: first, watch: s.o.Sessions.Watch(id)}
}

func (src *turnSource) Next(buf []stream.Item) (int, error) {
	if src.done {
		return 0, stream.ErrEnd
	}
	src.held = src.held[:0]
	n := 0
	for len(src.first) > 0 && n < len(buf) {
		src.held = append(src.held, src.first[0])
		buf[n] = stream.Item{Seq: src.last, Type: src.first[0].name}
		src.first = src.first[1:]
		n++
	}
	// Facts of other turns and facts the mode does not show give no item:
	// read on until one does or the log has nothing more, since an empty
	// batch tells the stream to wait for the log to grow.
	for n == 0 && !src.done {
		facts, err := src.s.read(context.Background(), src.id, src.last, len(buf))
		if err != nil {
			return n, err
		}
		if len(facts) == 0 {
			break
		}
		for i := range facts {
			src.last = facts[i].Item.Seq
			if facts[i].Item.TurnID != src.turn {
				continue
			}
			ev, show, end := render(&facts[i], src.mode)
			if !show {
				continue
			}
			src.held = append(src.held, ev)
			buf[n] = stream.Item{Seq: facts[i].Item.Seq, Type: ev.name}
			n++
			if end {
				src.done = true
				break
			}
		}
	}
	for i := range n {
		buf[i].Value = &src.held[i]
	}
	return n, nil
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
// JSON object, the id (the session log's sequence) for resuming.
var renderer = stream.RenderFunc(func(f *stream.Frame, it stream.Item) (bool, error) {
	ev := it.Value.(*sseEvent)
	data, err := json.Marshal(ev.data)
	if err != nil {
		return false, err
	}
	f.ID = strconv.AppendUint(f.ID, it.Seq, 10)
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
