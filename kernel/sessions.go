package kernel

import (
	"context"
	"encoding/json"
	"sort"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/store"
)

// Sessions files executions in durable sessions (the work containers of
// the Agent Runtime, AAP and Runtime API surfaces). The session package
// implements it. An execution created with a session_id belongs to that
// session: every transaction of it is filed in the session's own log in
// the same store batch, so the session's log never misses or reorders what
// the execution's log holds. Executions without a session_id are not filed
// and cost the session package nothing.
type Sessions interface {
	// Open admits a new execution to a session, before its first
	// transaction: the session is made for the execution's owner if it
	// does not exist, and the thread and turn it runs are returned (those
	// of the request, or new ones). It writes nothing; the first Stage of
	// the execution does. Opening an archived session fails.
	Open(ctx context.Context, o Opening) (threadID, turnID string, err error)
	// Stage files transactions of executions of one session in b. The
	// returned function runs once the store write returned: committed
	// says whether b is durable. Between the two, the session's log is
	// held: sequences are handed out in commit order.
	Stage(b *store.Batch, sessionID string, fs []Filing) (done func(committed bool))
	// Output records what an agent said in an execution of the session: a
	// text, a delta of one, reasoning, a status or a checkpoint. It takes
	// its place in the session's log before Output returns (in the order
	// of the calls); the channel reports once it is durable (deltas are
	// coalesced before they reach the disk, so that can take a moment).
	Output(sessionID string, o Output) (<-chan error, error)
}

// Opening is an execution that Sessions.Open admits.
type Opening struct {
	SessionID   string
	ExecutionID string
	AgentID     string
	Owner       string
	Tenant      string
	// ThreadID and TurnID name the turn the execution runs, when the
	// session package started it; empty for an execution created through
	// the execution API, which gets a turn of its own.
	ThreadID string
	TurnID   string
	Input    json.RawMessage
}

// Filing is one transaction of an execution, to be filed in its session.
type Filing struct {
	ExecutionID string
	ThreadID    string
	TurnID      string
	// First and Last are the sequences of the transaction's events in the
	// execution's log.
	First, Last uint64
	// Ended is the status the transaction ends the execution with, or
	// empty.
	Ended Status
}

// Output kinds.
const (
	OutputText           = "text"
	OutputTextDelta      = "text_delta"
	OutputReasoning      = "reasoning"
	OutputReasoningDelta = "reasoning_delta"
	OutputStatus         = "status"
	OutputCheckpoint     = "checkpoint"
)

// Output is what an agent says in an execution: the payload of an output
// intent.
type Output struct {
	ExecutionID string `json:"-"`
	ThreadID    string `json:"-"`
	TurnID      string `json:"-"`
	// Kind is one of the Output* kinds.
	Kind string `json:"kind"`
	// Text is the text, delta, reasoning, status line or checkpoint
	// summary.
	Text string `json:"text"`
	// Data is optional structured detail (a checkpoint's state, say).
	Data json.RawMessage `json:"data,omitempty"`
}

// maxOutputText bounds the text of one output intent.
const maxOutputText = 64 << 10

func validOutput(o *Output) error {
	switch o.Kind {
	case OutputText, OutputTextDelta, OutputReasoning, OutputReasoningDelta, OutputStatus, OutputCheckpoint:
	case "":
		return invalid("output intent requires output.kind")
	default:
		return invalid("unknown output kind %q", o.Kind)
	}
	if len(o.Text) > maxOutputText {
		return invalid("output.text exceeds maximum length of %d bytes", maxOutputText)
	}
	return nil
}

// filing returns the transaction's filing, when its execution is filed in
// a durable session.
func (t *tx) filing() (Filing, bool) {
	ex := t.ex
	if !ex.Filed || len(t.facts) == 0 {
		return Filing{}, false
	}
	f := Filing{ExecutionID: ex.ID, ThreadID: ex.ThreadID, TurnID: ex.TurnID, First: t.facts[0].seq, Last: t.seq}
	status := ex.Status
	for _, fa := range t.facts {
		status = nextStatus(status, fa.typ)
	}
	if status.Terminal() && !ex.Status.Terminal() {
		f.Ended = status
	}
	return f, true
}

// stageSessions files the transactions of txs that belong to durable
// sessions in b, holding each session's log in a fixed order (by id), so
// that two commits touching the same two sessions cannot wait on each
// other. The returned function releases them.
func (k *Kernel) stageSessions(b *store.Batch, txs []*tx) func(committed bool) {
	if k.sessions == nil {
		return func(bool) {}
	}
	bySession := map[string][]Filing{}
	for _, t := range txs {
		if f, ok := t.filing(); ok {
			bySession[t.ex.SessionID] = append(bySession[t.ex.SessionID], f)
		}
	}
	if len(bySession) == 0 {
		return func(bool) {}
	}
	ids := make([]string, 0, len(bySession))
	for id := range bySession {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	dones := make([]func(bool), 0, len(ids))
	for _, id := range ids {
		dones = append(dones, k.sessions.Stage(b, id, bySession[id]))
	}
	return func(committed bool) {
		for i := len(dones) - 1; i >= 0; i-- {
			dones[i](committed)
		}
	}
}

// Say records an output intent (an agent's text, reasoning, status or
// checkpoint; an extension of the kernel API's intents). It takes its place
// in order before Say returns; the channel reports once it is durable, so
// that a caller can answer many in flight (a WebSocket agent streaming
// deltas) without holding up the ones after. An execution filed in a
// session records it in the session's log, coalescing deltas; any other
// records it as an agent.output event of its own log.
func (k *Kernel) Say(ctx context.Context, req IntentRequest, meta Meta) (<-chan error, error) {
	in := &req.Intent
	if req.ExecutionID == "" || req.SessionID == "" {
		return nil, invalid("execution_id and session_id are required")
	}
	if err := checkID("execution_id", req.ExecutionID, maxIDLen); err != nil {
		return nil, err
	}
	if err := checkID("session_id", req.SessionID, maxIDLen); err != nil {
		return nil, err
	}
	if in.Output == nil {
		return nil, invalid("output intent requires output")
	}
	var o Output
	if err := json.Unmarshal(in.Output, &o); err != nil {
		return nil, invalid("output: %v", err)
	}
	if err := validOutput(&o); err != nil {
		return nil, err
	}
	ex, err := k.lockLive(req.ExecutionID)
	if err != nil {
		return nil, err
	}
	defer ex.mu.Unlock()
	if err := k.checkLease(ex, req.SessionID); err != nil {
		return nil, err
	}
	if ex.Filed && k.sessions != nil {
		o.ExecutionID, o.ThreadID, o.TurnID = ex.ID, ex.ThreadID, ex.TurnID
		return k.sessions.Output(ex.SessionID, o)
	}
	t := k.begin(ex, meta)
	t.add(event.AgentOutput, "", &o)
	done := make(chan error, 1)
	done <- t.commit(ctx)
	return done, nil
}

// waitSaid waits for a said output to be durable.
func waitSaid(ctx context.Context, done <-chan error) error {
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return newErr(ErrUnavailable, "service unavailable: %v", ctx.Err())
	}
}
