package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gatehouse-dev/gatehouse/client/sse"
)

// Agent drives executions: the kernel assigns them on the agent's stream,
// and Handle runs each one in its own goroutine.
type Agent struct {
	// AgentID names the agent executions are created for; required.
	AgentID string
	// ConsumerID names this process's connection; it is kept across
	// reconnects so the kernel keeps routing the executions it holds here.
	// Zero means AgentID + "-" + 8 random hex digits, chosen once per
	// RunAgent call.
	ConsumerID string
	// Handle runs one execution; required. Its result becomes the
	// execution's output (a complete intent); an error fails the execution
	// with the error's text. ctx ends when the agent stops or the kernel
	// hands the execution to another consumer; nothing is reported then.
	Handle func(ctx context.Context, t *Task) (output any, err error)
	// Tools are tools the agent runs itself (Task.Invoke with remote=false).
	Tools map[string]ToolFunc
	// WaitTimeout bounds each wait for a tool result, an approval or a
	// signal; zero means one hour. The kernel tells the agent nothing when
	// an execution is cancelled, so an unbounded wait could last forever.
	WaitTimeout time.Duration
	// Finished, when set, is called after each execution's final intent
	// was answered (err nil: the kernel accepted it), or with the reason
	// none was sent.
	Finished func(t *Task, err error)
}

// HistoryEntry is one finished step of an execution, as handed to an agent
// that takes the execution over.
type HistoryEntry struct {
	StepID      string          `json:"step_id"`
	ToolID      string          `json:"tool_id"`
	Status      string          `json:"status"` // succeeded, failed, timed_out or cancelled
	Arguments   json.RawMessage `json:"arguments,omitempty"`
	Result      json.RawMessage `json:"result,omitempty"`
	Error       string          `json:"error,omitempty"`
	CompletedAt *time.Time      `json:"completed_at,omitempty"`
}

// Limits of the buffer for pushes that arrive before their waiter: the
// kernel answers an intent before it pushes what the intent caused, but
// the push travels on another connection and can overtake the answer.
const (
	maxEarlyPushes = 10000
	earlyPushTTL   = 5 * time.Minute
)

// Push types the agent stream carries.
const (
	pushAssigned   = "execution.assigned"
	pushToolResult = "tool.result"
	pushApproval   = "approval.resolved"
	pushSignal     = "signal.received"
)

type assignment struct {
	ExecutionID string            `json:"execution_id"`
	SessionID   string            `json:"session_id"`
	AgentID     string            `json:"agent_id"`
	Input       json.RawMessage   `json:"input"`
	Labels      map[string]string `json:"labels"`
	History     []HistoryEntry    `json:"history"`
}

// RunAgent serves a until ctx is done, reconnecting with jittered backoff
// whenever the stream drops. It returns ctx.Err(), or earlier an error that
// reconnecting cannot fix (the server refused the stream with a 4xx, or its
// TLS certificate is not trusted), once the Handle calls in flight, whose
// context is then cancelled, have returned.
func (c *Client) RunAgent(ctx context.Context, a *Agent) error {
	if a.AgentID == "" || a.Handle == nil {
		return errors.New("client: Agent.AgentID and Agent.Handle are required")
	}
	ar := &agentRun{c: c, a: a, consumer: a.ConsumerID, box: newMailbox(maxEarlyPushes, earlyPushTTL), tasks: map[string]*Task{},
		workers: newWorkers()}
	if ar.consumer == "" {
		ar.consumer = a.AgentID + "-" + randomHex(4)
	}
	ar.wait = a.WaitTimeout
	if ar.wait <= 0 {
		ar.wait = time.Hour
	}
	ar.log = c.log.With("agent", a.AgentID, "consumer", ar.consumer)
	// Explicit acks: a delivery counts as received only once this process
	// handled it, so a push in flight when the connection breaks is sent
	// again instead of lost.
	q := url.Values{"agent_id": {a.AgentID}, "consumer_id": {ar.consumer}, "ack": {"explicit"}}
	// Handlers and the acker end with RunAgent, also when it returns early
	// because the gateway refused the stream.
	ctx, cancel := context.WithCancel(ctx)
	ack := newAcker(c, ackBody{Role: "agent", ID: a.AgentID, ConsumerID: ar.consumer}, ar.log)
	ackDone := make(chan struct{})
	go func() { defer close(ackDone); ack.run(ctx) }()
	defer func() {
		cancel()
		ar.workers.wait()
		<-ackDone
	}()
	return c.serveStream(ctx, "/v0/agents/stream", q, ar.log, nil, func(ev sse.Event) {
		defer ack.note(ev.ID)
		switch ev.Type {
		case pushAssigned:
			var as assignment
			if err := json.Unmarshal(ev.Data, &as); err != nil || as.ExecutionID == "" || as.SessionID == "" {
				ar.log.Warn("malformed assignment dropped", "err", err)
				return
			}
			ar.start(ctx, &as)
		case pushToolResult, pushApproval, pushSignal:
			ar.box.deliver(ev.Type, ev.Data, ar.log)
		}
	})
}

// ackInterval spaces acknowledgements: one request covers every delivery
// handled in the interval.
const ackInterval = 50 * time.Millisecond

type ackBody struct {
	Role       string `json:"role"`
	ID         string `json:"id"`
	ConsumerID string `json:"consumer_id"`
	Sequence   uint64 `json:"sequence"`
}

// acker acknowledges the deliveries of an explicit-ack stream in batches.
type acker struct {
	c    *Client
	body ackBody
	log  *slog.Logger
	wake chan struct{}

	mu      sync.Mutex
	handled uint64
}

func newAcker(c *Client, body ackBody, log *slog.Logger) *acker {
	return &acker{c: c, body: body, log: log, wake: make(chan struct{}, 1)}
}

// note records that the delivery with SSE id "<epoch>.<sequence>" was
// handled.
func (a *acker) note(id string) {
	if i := strings.LastIndexByte(id, '.'); i >= 0 {
		id = id[i+1:]
	}
	seq, err := strconv.ParseUint(id, 10, 64)
	if err != nil {
		return
	}
	a.mu.Lock()
	a.handled = max(a.handled, seq)
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// run sends acknowledgements until ctx is done, then a last one.
func (a *acker) run(ctx context.Context) {
	var sent uint64
	flush := func(ctx context.Context) {
		a.mu.Lock()
		seq := a.handled
		a.mu.Unlock()
		if seq <= sent {
			return
		}
		body := a.body
		body.Sequence = seq
		if err := a.c.do(ctx, call{method: http.MethodPost, path: "/v0/peers/ack", body: &body}, nil); err != nil {
			// Harmless: the next ack, or the cursor of the next connection,
			// covers these deliveries too.
			a.log.Debug("ack not recorded", "sequence", seq, "err", err)
			return
		}
		sent = seq
	}
	for {
		select {
		case <-a.wake:
			flush(ctx)
			if sleep(ctx, ackInterval) == nil {
				continue
			}
		case <-ctx.Done():
		}
		final, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		flush(final)
		cancel()
		return
	}
}

// agentRun is the state of one RunAgent call.
type agentRun struct {
	c        *Client
	a        *Agent
	consumer string
	wait     time.Duration
	log      *slog.Logger
	box      *mailbox
	workers  *workers // run the tasks

	mu    sync.Mutex
	tasks map[string]*Task // by execution id
}

// start runs an assigned execution. An assignment repeated with the same
// session is a duplicate; one with a new session means the kernel took the
// execution back and gave it out again, so the old run is abandoned.
func (ar *agentRun) start(ctx context.Context, as *assignment) {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	if old := ar.tasks[as.ExecutionID]; old != nil {
		if old.session == as.SessionID {
			return
		}
		old.cancel()
	}
	tctx, cancel := context.WithCancel(ctx)
	t := &Task{ar: ar, id: as.ExecutionID, session: as.SessionID, input: as.Input, labels: as.Labels,
		history: as.History, cancel: cancel}
	if len(t.input) == 0 {
		t.input = json.RawMessage("null")
	}
	ar.tasks[t.id] = t
	ar.box.open(t.id, t)
	ar.workers.run(ctx, func() { ar.run(tctx, t) })
}

// run runs Handle and reports its outcome as the final intent.
func (ar *agentRun) run(ctx context.Context, t *Task) {
	defer func() {
		t.cancel()
		ar.mu.Lock()
		if ar.tasks[t.id] == t {
			delete(ar.tasks, t.id)
		}
		ar.mu.Unlock()
		ar.box.close(t.id, t)
	}()
	out, err := t.handle(ctx)
	var ferr error
	switch {
	case ctx.Err() != nil:
		// Abandoned (shutdown or reassignment): whoever holds the
		// execution now reports it.
		ferr = fmt.Errorf("client: execution %s abandoned: %w", t.id, context.Cause(ctx))
	case err != nil:
		_, ferr = t.intent(ctx, &intent{Type: "fail", Error: truncate(err.Error(), maxErrorLen)}, "fail")
	default:
		var raw json.RawMessage
		if raw, ferr = encodeJSON(out); ferr == nil {
			_, ferr = t.intent(ctx, &intent{Type: "complete", Output: raw}, "complete")
		}
	}
	if ferr != nil && ctx.Err() == nil {
		ar.log.Warn("execution outcome not recorded", "execution", t.id, "err", ferr)
	}
	if ar.a.Finished != nil {
		ar.a.Finished(t, ferr)
	}
}

// Task is one execution assigned to an Agent. Its methods may be called
// from several goroutines.
type Task struct {
	ar      *agentRun
	id      string
	session string
	input   json.RawMessage
	labels  map[string]string
	history []HistoryEntry
	cancel  context.CancelFunc
}

// ID returns the execution id.
func (t *Task) ID() string { return t.id }

// Input returns the execution's input (JSON null when it has none).
func (t *Task) Input() json.RawMessage { return t.input }

// Labels returns the execution's labels.
func (t *Task) Labels() map[string]string { return t.labels }

// History returns the steps that finished before this agent took the
// execution over, oldest first; empty for a fresh execution.
func (t *Task) History() []HistoryEntry { return t.history }

func (t *Task) handle(ctx context.Context) (out any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return t.ar.a.Handle(ctx, t)
}

type intent struct {
	Type           string          `json:"type"`
	ToolID         string          `json:"tool_id,omitempty"`
	Arguments      json.RawMessage `json:"arguments,omitempty"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	Remote         bool            `json:"remote,omitempty"`
	Output         json.RawMessage `json:"output,omitempty"`
	Error          string          `json:"error,omitempty"`
	SignalType     string          `json:"signal_type,omitempty"`
}

type intentResult struct {
	Accepted        bool   `json:"accepted"`
	StepID          string `json:"step_id"`
	PendingApproval bool   `json:"pending_approval"`
	Error           string `json:"error"`
}

// intent submits an intent. Every intent carries an idempotency key, which
// makes it safe to retry: the kernel answers a repeat with the first answer.
func (t *Task) intent(ctx context.Context, in *intent, name string) (*intentResult, error) {
	in.IdempotencyKey = t.id + ":" + name + ":" + randomHex(4)
	body := struct {
		ExecutionID string  `json:"execution_id"`
		SessionID   string  `json:"session_id"`
		Intent      *intent `json:"intent"`
	}{t.id, t.session, in}
	var res intentResult
	if err := t.ar.c.do(ctx, call{method: http.MethodPost, path: "/v0/agents/intent", body: &body, retry: true}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Invoke calls a tool through the kernel and returns its result. With
// remote the kernel hands the call to a runner; otherwise the agent runs
// the tool from Agent.Tools itself and reports the result. The kernel's
// policy may refuse the call (*PolicyError, also when a human denies a
// required approval); a tool that fails returns a *ToolError (remote) or
// the tool's own error (local).
func (t *Task) Invoke(ctx context.Context, toolID string, args any, remote bool) (json.RawMessage, error) {
	var local ToolFunc
	if !remote {
		if local = t.ar.a.Tools[toolID]; local == nil {
			return nil, fmt.Errorf("client: invoke %s: not in Agent.Tools; invoke it as remote", toolID)
		}
	}
	rawArgs, err := encodeJSON(args)
	if err != nil {
		return nil, fmt.Errorf("client: invoke %s: %w", toolID, err)
	}
	res, err := t.intent(ctx, &intent{Type: "invoke_tool", ToolID: toolID, Arguments: rawArgs, Remote: remote}, toolID)
	if err != nil {
		return nil, fmt.Errorf("client: invoke %s: %w", toolID, err)
	}
	if !res.Accepted {
		return nil, newPolicyError(toolID, res.Error)
	}
	if res.StepID == "" {
		return nil, fmt.Errorf("client: invoke %s: accepted without a step id", toolID)
	}
	if res.PendingApproval {
		data, err := t.await(ctx, pushApproval, res.StepID)
		if err != nil {
			return nil, fmt.Errorf("client: invoke %s: wait for approval: %w", toolID, err)
		}
		var ap struct {
			Approved bool   `json:"approved"`
			Reason   string `json:"reason"`
		}
		if err := json.Unmarshal(data, &ap); err != nil {
			return nil, fmt.Errorf("client: invoke %s: decode approval: %w", toolID, err)
		}
		if !ap.Approved {
			if ap.Reason == "" {
				ap.Reason = "denied"
			}
			return nil, &PolicyError{ToolID: toolID, Reason: ap.Reason, Approval: true}
		}
	}
	if remote {
		return t.remoteResult(ctx, toolID, res.StepID)
	}
	return t.runLocal(ctx, local, toolID, res.StepID, rawArgs)
}

func (t *Task) remoteResult(ctx context.Context, toolID, stepID string) (json.RawMessage, error) {
	data, err := t.await(ctx, pushToolResult, stepID)
	if err != nil {
		return nil, fmt.Errorf("client: invoke %s: wait for result: %w", toolID, err)
	}
	var tr struct {
		Status string          `json:"status"`
		Result json.RawMessage `json:"result"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.Unmarshal(data, &tr); err != nil {
		return nil, fmt.Errorf("client: invoke %s: decode result: %w", toolID, err)
	}
	if tr.Result == nil {
		tr.Result = tr.Data
	}
	if tr.Status == "failed" {
		return nil, &ToolError{ToolID: toolID, StepID: stepID, Message: tr.Error, Result: tr.Result}
	}
	if tr.Result == nil {
		tr.Result = json.RawMessage("null")
	}
	return tr.Result, nil
}

// runLocal runs a local tool for an accepted step and records its outcome.
func (t *Task) runLocal(ctx context.Context, fn ToolFunc, toolID, stepID string, args json.RawMessage) (json.RawMessage, error) {
	out, terr := runTool(ctx, fn, toolID, args)
	body := struct {
		ExecutionID string          `json:"execution_id"`
		SessionID   string          `json:"session_id"`
		StepID      string          `json:"step_id"`
		Success     bool            `json:"success"`
		Data        json.RawMessage `json:"data,omitempty"`
		Error       string          `json:"error,omitempty"`
	}{ExecutionID: t.id, SessionID: t.session, StepID: stepID, Success: terr == nil, Data: out}
	if terr != nil {
		body.Error = truncate(terr.Error(), maxErrorLen)
	}
	// The kernel echoes the outcome as a tool.result push that nobody
	// needs; claiming it keeps it out of the early-push buffer.
	t.ar.box.discard(t.id, pushToolResult, stepID)
	err := t.ar.c.do(ctx, call{method: http.MethodPost, path: "/v0/agents/step-result", body: &body, retry: true}, nil)
	if err != nil {
		return nil, fmt.Errorf("client: invoke %s: report result: %w", toolID, err)
	}
	if terr != nil {
		return nil, terr
	}
	return out, nil
}

// Wait blocks the execution until a signal of signalType arrives (or takes
// one that arrived earlier) and returns its payload (JSON null when none).
func (t *Task) Wait(ctx context.Context, signalType string) (json.RawMessage, error) {
	// The waiter goes in before the intent: the push that ends the wait may
	// overtake the intent's answer (see mailbox).
	ch, answered, stop := t.ar.box.waitSignal(t.id, signalType)
	defer stop()
	res, err := t.intent(ctx, &intent{Type: "wait", SignalType: signalType}, "wait")
	if err != nil {
		return nil, fmt.Errorf("client: wait for %s: %w", signalType, err)
	}
	if !res.Accepted {
		return nil, fmt.Errorf("client: wait for %s: refused: %s", signalType, res.Error)
	}
	answered()
	data, err := t.receive(ctx, ch)
	if err != nil {
		return nil, fmt.Errorf("client: wait for %s: %w", signalType, err)
	}
	var sig struct {
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(data, &sig); err != nil {
		return nil, fmt.Errorf("client: wait for %s: decode signal: %w", signalType, err)
	}
	if sig.Payload == nil {
		sig.Payload = json.RawMessage("null")
	}
	return sig.Payload, nil
}

// await waits for the push of type typ about step stepID.
func (t *Task) await(ctx context.Context, typ, stepID string) (json.RawMessage, error) {
	ch, stop := t.ar.box.waitStep(t.id, typ, stepID)
	defer stop()
	return t.receive(ctx, ch)
}

func (t *Task) receive(ctx context.Context, ch <-chan json.RawMessage) (json.RawMessage, error) {
	timer := time.NewTimer(t.ar.wait)
	defer timer.Stop()
	select {
	case data, ok := <-ch:
		if !ok {
			return nil, errors.New("execution no longer handled here")
		}
		return data, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-timer.C:
		return nil, fmt.Errorf("nothing arrived within %s", t.ar.wait)
	}
}

// encodeJSON encodes v, passing a json.RawMessage through; nil stays nil.
func encodeJSON(v any) (json.RawMessage, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		if len(x) == 0 {
			return nil, nil
		}
		if !json.Valid(x) {
			return nil, errors.New("invalid JSON")
		}
		return x, nil
	}
	return json.Marshal(v)
}
