package kernel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/kernel/policy"
	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/segmentio/encoding/json"
)

// agentSet is every consumer of one agent_id and its unassigned executions.
type agentSet struct {
	consumers map[string]*agentConsumer
	rr        int
	pending   []string // execution ids waiting for a consumer, oldest first
}

type agentConsumer struct {
	connection
	id     string
	leases map[string]string // execution id -> lease id
}

func (as *agentSet) removePending(id string) {
	for i, p := range as.pending {
		if p == id {
			as.pending = append(as.pending[:i:i], as.pending[i+1:]...)
			return
		}
	}
}

func (k *Kernel) agentSetLocked(agentID string) *agentSet {
	as := k.agents[agentID]
	if as == nil {
		as = &agentSet{consumers: map[string]*agentConsumer{}}
		k.agents[agentID] = as
	}
	return as
}

func (as *agentSet) consumer(id string) *agentConsumer {
	c := as.consumers[id]
	if c == nil {
		c = &agentConsumer{id: id, leases: map[string]string{}}
		as.consumers[id] = c
	}
	return c
}

// bindLeaseLocked records that consumerID holds execID. The consumer may
// have been declared lost since it was picked; it then comes back as an
// offline consumer with a fresh grace period, so the lease is released like
// any other and never outlives its holder.
func (k *Kernel) bindLeaseLocked(agentID, consumerID, execID, leaseID string) {
	c := k.agentSetLocked(agentID).consumer(consumerID)
	c.leases[execID] = leaseID
	gen := c.gen
	k.awaitLocked(&c.connection, k.opts.AgentGrace, func() { k.agentLost(agentID, consumerID, gen) })
}

// pickAgentConsumer chooses an online consumer round-robin, in name order.
func (k *Kernel) pickAgentConsumer(agentID string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.pickAgentConsumerLocked(agentID)
}

func (k *Kernel) pickAgentConsumerLocked(agentID string) string {
	as := k.agents[agentID]
	if as == nil {
		return ""
	}
	var online []string
	for _, id := range sortedKeys(as.consumers) {
		if as.consumers[id].online {
			online = append(online, id)
		}
	}
	if len(online) == 0 {
		return ""
	}
	as.rr++
	return online[as.rr%len(online)]
}

func (k *Kernel) agentPeer(ex *Execution) Peer {
	return Peer{Role: RoleAgent, ID: ex.AgentID, Consumer: ex.Lease.ConsumerID}
}

// AgentConnected records that an agent consumer has a live connection and
// assigns it waiting executions. The returned function records the end of
// that connection; it does nothing if a newer connection of the same
// consumer took over meanwhile. A consumer that reconnects within the grace
// period keeps its executions.
func (k *Kernel) AgentConnected(agentID, consumerID string) (disconnected func()) {
	k.mu.Lock()
	as := k.agentSetLocked(agentID)
	c := as.consumer(consumerID)
	gen := c.connect()
	k.mu.Unlock()
	k.assignPending(agentID)
	return k.disconnected(&c.connection, gen, k.opts.AgentGrace, func() { k.agentLost(agentID, consumerID, gen) })
}

// agentLost runs when a consumer stayed away past the grace period: its
// running executions go back to pending and are reassigned.
func (k *Kernel) agentLost(agentID, consumerID string, gen uint64) {
	k.mu.Lock()
	as := k.agents[agentID]
	var c *agentConsumer
	if as != nil {
		c = as.consumers[consumerID]
	}
	if c == nil || !c.lostSince(gen) || k.closed {
		k.mu.Unlock()
		return
	}
	delete(as.consumers, consumerID)
	if len(as.consumers) == 0 && len(as.pending) == 0 {
		// An agent id that is neither connected nor awaited is not
		// remembered: ids that connect once and vanish must not add up.
		delete(k.agents, agentID)
	}
	leased := sortedKeys(c.leases)
	k.mu.Unlock()
	k.out.Forget(Peer{Role: RoleAgent, ID: agentID, Consumer: consumerID})
	for _, id := range leased {
		k.releaseLease(id, consumerID, "agent_disconnect")
	}
	k.assignPending(agentID)
}

// releaseLease ends a lost consumer's hold on an execution.
func (k *Kernel) releaseLease(id, consumerID, reason string) {
	ex, err := k.lockLive(id)
	if err != nil {
		return
	}
	defer ex.mu.Unlock()
	if ex.Lease == nil || ex.Lease.ConsumerID != consumerID {
		return
	}
	t := k.begin(ex, Meta{})
	t.add(event.AgentTimeout, "", &agentTimeoutPayload{SessionID: ex.Lease.ID})
	if ex.Status == StatusRunning {
		k.cancelSteps(t, "agent disconnected")
		t.add(event.ExecutionReset, "", &resetPayload{Reason: reason, FromStatus: ex.Status})
	}
	if err := t.commit(context.Background()); err != nil {
		k.logCommitFailure("release lease", id, err)
		return
	}
	k.mu.Lock()
	k.dropQueuedLocked(ex.ID)
	if ex.Status == StatusPending {
		k.agentSetLocked(ex.AgentID).pending = append(k.agentSetLocked(ex.AgentID).pending, ex.ID)
	}
	k.mu.Unlock()
}

// assignPending hands waiting executions of agentID to online consumers.
func (k *Kernel) assignPending(agentID string) {
	for {
		k.mu.Lock()
		as := k.agents[agentID]
		if as == nil || len(as.pending) == 0 || k.closed {
			k.mu.Unlock()
			return
		}
		consumer := k.pickAgentConsumerLocked(agentID)
		if consumer == "" {
			k.mu.Unlock()
			return
		}
		id := as.pending[0]
		as.pending = as.pending[1:]
		k.mu.Unlock()
		if !k.assign(id, consumer) {
			// The store refused: try again later, not in a loop.
			k.retryLater("agent/"+agentID, func() { k.assignPending(agentID) })
			return
		}
		k.retried("agent/" + agentID)
	}
}

// assign starts execution id on consumer, or puts it back in line and
// reports false when that could not be written.
func (k *Kernel) assign(id, consumer string) bool {
	ex, err := k.lockLive(id)
	if err != nil {
		return true
	}
	defer ex.mu.Unlock()
	if ex.Status != StatusPending || ex.Lease != nil {
		return true
	}
	lease := &Lease{ID: event.NewID(), ConsumerID: consumer}
	push := assignedPush{
		ExecutionID: ex.ID, SessionID: lease.ID, AgentID: ex.AgentID,
		Input: orNull(ex.Input), Labels: ex.Labels, History: trimHistory(ex.History),
	}
	if len(push.Labels) == 0 {
		push.Labels = nil
	}
	t := k.begin(ex, Meta{})
	t.add(event.ExecutionStarted, "", &startedPayload{SessionID: lease.ID, ConsumerID: consumer})
	t.push(Peer{Role: RoleAgent, ID: ex.AgentID, Consumer: consumer}, event.PushExecutionAssigned, &push, "")
	if err := t.commit(context.Background()); err != nil {
		k.mu.Lock()
		as := k.agentSetLocked(ex.AgentID)
		as.pending = append([]string{ex.ID}, as.pending...)
		k.mu.Unlock()
		return false
	}
	k.mu.Lock()
	k.bindLeaseLocked(ex.AgentID, consumer, ex.ID, lease.ID)
	k.mu.Unlock()
	if publish := t.publish(); publish != nil {
		publish()
	}
	return true
}

// maxHistoryBytes bounds the history sent with an assignment.
const maxHistoryBytes = 512 << 10

func trimHistory(h []HistoryEntry) []HistoryEntry {
	size := 0
	for i := len(h) - 1; i >= 0; i-- {
		size += len(h[i].Arguments) + len(h[i].Result) + len(h[i].Error) + 160
		if size > maxHistoryBytes {
			return h[i+1:]
		}
	}
	return h
}

// IntentRequest is the body of POST /v0/agents/intent.
type IntentRequest struct {
	ExecutionID string `json:"execution_id"`
	SessionID   string `json:"session_id"`
	Intent      Intent `json:"intent"`
}

// Intent is what an agent asks the kernel to do next.
type Intent struct {
	Type           string          `json:"type"`
	ToolID         string          `json:"tool_id"`
	Arguments      json.RawMessage `json:"arguments"`
	IdempotencyKey string          `json:"idempotency_key"`
	Remote         bool            `json:"remote"`
	Output         json.RawMessage `json:"output"`
	Error          string          `json:"error"`
	SignalType     string          `json:"signal_type"`
	// Account (extension) names the connected account a remote tool runs
	// with: only a runner that serves it (capability "<tool>@<account>")
	// gets the job.
	Account string `json:"account,omitempty"`
}

// IntentResult answers an intent. A policy denial is a result, not an error.
type IntentResult struct {
	Accepted        bool   `json:"accepted"`
	StepID          string `json:"step_id,omitempty"`
	PendingApproval bool   `json:"pending_approval,omitempty"`
	Error           string `json:"error,omitempty"`
}

// Intent types.
const (
	IntentInvokeTool = "invoke_tool"
	IntentComplete   = "complete"
	IntentFail       = "fail"
	IntentWait       = "wait"
	// IntentOutput (extension) is an agent's text, reasoning, status or
	// checkpoint; see Kernel.Say.
	IntentOutput = "output"
)

// Intent handles an agent's intent. Retrying it with the same idempotency
// key returns the first answer and changes nothing.
func (k *Kernel) Intent(ctx context.Context, req IntentRequest, meta Meta) (IntentResult, After, error) {
	in := &req.Intent
	if req.ExecutionID == "" || req.SessionID == "" || in.Type == "" {
		return IntentResult{}, nil, invalid("execution_id, session_id and intent.type are required")
	}
	for _, f := range []struct {
		name, v string
		max     int
	}{{"execution_id", req.ExecutionID, maxIDLen}, {"session_id", req.SessionID, maxIDLen},
		{"intent.tool_id", in.ToolID, maxIDLen},
		{"intent.signal_type", in.SignalType, maxIDLen}, {"intent.idempotency_key", in.IdempotencyKey, maxIdempotencyKey},
		{"intent.account", in.Account, maxIDLen}} {
		if err := checkID(f.name, f.v, f.max); err != nil {
			return IntentResult{}, nil, err
		}
	}
	if err := checkLen("intent.error", in.Error, maxErrorLen); err != nil {
		return IntentResult{}, nil, err
	}
	if isNull(in.Arguments) {
		in.Arguments = nil
	}
	if in.Type == IntentOutput {
		said, err := k.Say(ctx, req, meta)
		if err == nil {
			err = waitSaid(ctx, said)
		}
		if err != nil {
			return IntentResult{}, nil, err
		}
		return IntentResult{Accepted: true}, nil, nil
	}
	meta.IdempotencyKey = in.IdempotencyKey
	hash := requestHash(req)
	ex, done, err := k.idempotent(req.ExecutionID, in.IdempotencyKey, hash)
	if done != nil || err != nil {
		var res IntentResult
		if done != nil {
			err = json.Unmarshal(done, &res)
		}
		return res, nil, err
	}
	defer ex.mu.Unlock()
	k.counters.intents.Add(1)
	if err := k.checkLease(ex, req.SessionID); err != nil {
		return IntentResult{}, nil, err
	}
	if ex.Status == StatusBlocked {
		what := "waiting for signal " + ex.BlockRef
		if ex.BlockReason == "approval" {
			what = "pending approval of step " + ex.BlockRef
		}
		e := conflict("execution is blocked: execution %s is blocked %s", ex.ID, what)
		e.Details = map[string]any{"status": ex.Status, "reason": ex.BlockReason, "ref": ex.BlockRef}
		return IntentResult{}, nil, e
	}
	t := k.begin(ex, meta)
	var fx effects
	var res IntentResult
	switch in.Type {
	case IntentInvokeTool:
		if in.ToolID == "" {
			return IntentResult{}, nil, invalid("invoke_tool intent requires tool_id")
		}
		if len(ex.Steps) >= k.opts.MaxSteps {
			return IntentResult{}, nil, conflict("conflict: execution %s reached the maximum of %d steps", ex.ID, k.opts.MaxSteps)
		}
		res = k.invokeTool(t, &fx, in)
	case IntentComplete, IntentFail:
		if in.Type == IntentFail && in.Error == "" {
			return IntentResult{}, nil, invalid("fail intent requires error")
		}
		if ex.activeSteps() > 0 {
			e := conflict("conflict: cannot %s with active steps in progress", in.Type)
			e.Details = map[string]any{"active_steps": ex.activeSteps()}
			return IntentResult{}, nil, e
		}
		if in.Type == IntentComplete {
			var details any
			if !isNull(in.Output) {
				details = map[string]json.RawMessage{"output": in.Output}
			}
			t.add(event.IntentAccepted, "", &intentAcceptedPayload{IntentType: in.Type, Details: details})
			t.add(event.ExecutionCompleted, "", &completedPayload{Output: orNull(in.Output)})
		} else {
			t.add(event.IntentAccepted, "", &intentAcceptedPayload{IntentType: in.Type, Details: errorPayload{Error: in.Error}})
			t.add(event.ExecutionFailed, "", &errorPayload{Error: in.Error})
		}
		res = IntentResult{Accepted: true}
	case IntentWait:
		if in.SignalType == "" {
			return IntentResult{}, nil, invalid("wait intent requires signal_type")
		}
		t.add(event.IntentAccepted, "", &intentAcceptedPayload{IntentType: in.Type, Details: map[string]string{"signal_type": in.SignalType}})
		if sig, ok := ex.pendingSignal(in.SignalType); ok {
			t.add(event.ExecutionResumed, "", &reasonPayload{Reason: "signal received: " + in.SignalType})
			t.push(k.agentPeer(ex), event.PushSignalReceived, &signalPush{ExecutionID: ex.ID, SignalType: sig.Type, Payload: orNull(sig.Payload), Sequence: sig.Seq}, "")
		} else {
			t.add(event.ExecutionBlocked, "", &blockedPayload{Reason: "signal", Ref: in.SignalType})
		}
		res = IntentResult{Accepted: true}
	default:
		return IntentResult{}, nil, invalid("unknown intent type %s", in.Type)
	}
	body, _ := json.Marshal(res)
	t.remember(in.IdempotencyKey, idemRecord{Hash: hash, Result: body})
	if err := t.commit(ctx); err != nil {
		return IntentResult{}, nil, err
	}
	fx.add(t.publish())
	if ex.Status.Terminal() {
		k.finish(ex)
	}
	k.armStepTimers(ex)
	k.armApprovalExpiry(ex)
	return res, k.after(fx), nil
}

// idempotent returns the stored answer of a keyed request, or the locked
// live execution to handle it. A key reused with another request is a
// conflict: answering it with the first request's outcome would hide a bug.
func (k *Kernel) idempotent(execID, key, hash string) (*Execution, json.RawMessage, error) {
	ex, err := k.lockLive(execID)
	if key == "" {
		return ex, nil, err
	}
	if ex == nil && !errors.Is(err, ErrConflict) {
		return nil, nil, err
	}
	var rec idemRecord
	var gerr error
	if known, ok := ex.cachedAnswer(key); ok {
		rec = known
	} else if ex != nil && !ex.replayed {
		gerr = store.ErrNotFound // every answer of this execution is in memory
	} else {
		gerr = k.store.Get(kindExec, idemKey(execID, key), &rec)
	}
	switch {
	case gerr == nil && rec.Hash != hash:
		if ex != nil {
			ex.mu.Unlock()
		}
		return nil, nil, conflict("conflict: idempotency key %q was used for a different request", key)
	case gerr == nil:
		if ex != nil {
			ex.mu.Unlock()
		}
		return nil, rec.Result, nil
	case !errors.Is(gerr, store.ErrNotFound):
		if ex != nil {
			ex.mu.Unlock()
		}
		return nil, nil, newErr(ErrUnavailable, "service unavailable: %v", gerr)
	}
	return ex, nil, err
}

// cachedAnswer returns the in-memory answer to key; ex may be nil.
func (ex *Execution) cachedAnswer(key string) (idemRecord, bool) {
	if ex == nil {
		return idemRecord{}, false
	}
	rec, ok := ex.idem[key]
	return rec, ok
}

func requestHash(v any) string {
	data, _ := json.Marshal(v)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:16])
}

// checkLease validates the agent's lease (the wire's session_id).
func (k *Kernel) checkLease(ex *Execution, leaseID string) error {
	if ex.Lease != nil && ex.Lease.ID == leaseID {
		return nil
	}
	return newErr(ErrUnauthorized, "session not found: session %s", leaseID)
}

func (ex *Execution) pendingSignal(typ string) (Signal, bool) {
	for _, s := range ex.Signals {
		if s.Type == typ {
			return s, true
		}
	}
	return Signal{}, false
}

// invokeTool gates a tool call through policy and creates its step.
func (k *Kernel) invokeTool(t *tx, fx *effects, in *Intent) IntentResult {
	ex := t.ex
	dec := k.pol.Evaluate(policy.Input{
		ToolID: in.ToolID, AgentID: ex.AgentID, Labels: ex.Labels, Arguments: in.Arguments,
		StepCount: len(ex.Steps), Elapsed: t.now.Sub(ex.CreatedAt), Now: t.now,
	})
	if dec.Decision == policy.Allow && slices.Contains(ex.Ask, in.ToolID) {
		dec.Decision, dec.Reason, dec.RuleID = policy.RequireApproval, "the caller asks a person before "+in.ToolID, "ask_tools"
	}
	allowedAlways := false
	if dec.Decision == policy.RequireApproval && k.approvals != nil && k.approvals.AllowedAlways(ex.SessionID, in.ToolID) {
		// A person already allowed this tool for the whole session.
		dec.Decision, allowedAlways = policy.Allow, true
	}
	if dec.Decision != policy.Allow && dec.Decision != policy.RequireApproval {
		k.counters.denied.Add(1)
		t.add(event.IntentDenied, "", &intentDeniedPayload{
			IntentType: in.Type, ToolID: in.ToolID, Arguments: in.Arguments,
			IdempotencyKey: in.IdempotencyKey, Reason: dec.Reason, RuleID: dec.RuleID,
		})
		msg := fmt.Sprintf("policy denied: %s (rule: %s)", dec.Reason, dec.RuleID)
		if dec.RateLimited {
			msg = fmt.Sprintf("%s (rule: %s)", dec.Reason, dec.RuleID)
		}
		return IntentResult{Accepted: false, Error: msg}
	}
	stepID := event.NewID()
	timeout := k.opts.StepTimeout
	if dec.Timeout > 0 {
		timeout = dec.Timeout
	}
	maxAttempts := 1
	if in.Remote {
		maxAttempts = k.opts.RemoteMaxAttempts
	}
	k.counters.steps.Add(1)
	t.add(event.IntentAccepted, "", &intentAcceptedPayload{IntentType: in.Type, Details: toolDetails{
		ToolID: in.ToolID, Arguments: in.Arguments, IdempotencyKey: in.IdempotencyKey, AllowedAlways: allowedAlways,
	}})
	created := stepCreatedPayload{
		ToolID: in.ToolID, Arguments: orNull(in.Arguments), MaxAttempts: maxAttempts, Attempt: 1,
		Deadline: t.now.Add(timeout), Remote: in.Remote, TimeoutMS: dec.Timeout.Milliseconds(), Account: in.Account,
	}
	t.add(event.StepCreated, stepID, &created)
	if dec.Decision == policy.RequireApproval {
		k.requestApproval(t, fx, created, stepID, dec)
		return IntentResult{Accepted: true, StepID: stepID, PendingApproval: true}
	}
	if in.Remote && !k.dispatchNow(t, fx, stepID, &created) {
		execID := ex.ID
		fx.add(func() { k.enqueue(execID, stepID) })
	}
	return IntentResult{Accepted: true, StepID: stepID}
}

// Approval outcomes.
const (
	outcomeApproved = "approved"
	outcomeDenied   = "denied"
	outcomeExpired  = "expired"

	reasonApprovalGranted = "approval granted"
	reasonApprovalDenied  = "approval denied"
	reasonApprovalExpired = "approval expired"
)

// resolveApproval adds the events that settle a pending approval and the
// push that tells the agent. allow says whether the step may run: an
// approval, or an expiry whose policy allows. The caller holds ex.mu and
// commits t.
func (k *Kernel) resolveApproval(t *tx, fx *effects, st *Step, outcome string, allow bool, reason string) {
	ex := t.ex
	resumed := reasonApprovalGranted
	switch {
	case allow:
		if outcome == outcomeExpired {
			resumed = reasonApprovalExpired
		}
		if st.Remote {
			execID, stepID := ex.ID, st.ID
			fx.add(func() { k.enqueue(execID, stepID) })
		} else {
			timeout := k.opts.StepTimeout
			if st.Timeout > 0 {
				timeout = st.Timeout
			}
			t.addWith(event.StepDispatched, st.ID, st.ActionID, &dispatchedPayload{Deadline: t.now.Add(timeout)})
		}
	default:
		resumed = reasonApprovalDenied
		if reason == "" {
			reason = "approval denied by human"
		}
		if outcome == outcomeExpired {
			resumed = reasonApprovalExpired
			if reason == "approval denied by human" {
				reason = "approval expired"
			}
		}
		t.add(event.StepFailed, st.ID, &stepFailedPayload{Error: reason, Retryable: false})
	}
	t.addWith(event.ExecutionResumed, "", st.ActionID, &reasonPayload{Reason: resumed})
	if !allow && ex.Tool != nil {
		t.add(event.ExecutionFailed, "", &errorPayload{Error: reason})
	}
	if ex.Lease != nil {
		t.push(k.agentPeer(ex), event.PushApprovalResolved, &approvalResolvedPush{
			Approved: allow, ExecutionID: ex.ID, SessionID: ex.Lease.ID,
			StepID: st.ID, Outcome: outcome, Reason: reason,
		}, "")
	}
}

// afterResume handles an execution that resumed without an agent holding
// it (its agent was lost while it was blocked): it goes back to pending.
// The caller holds ex.mu, after a commit.
func (k *Kernel) afterResume(ex *Execution, fx *effects) {
	k.armStepTimers(ex)
	if ex.Status != StatusRunning || ex.Lease != nil || ex.Tool != nil {
		return
	}
	t := k.begin(ex, Meta{})
	k.cancelSteps(t, "agent disconnected")
	t.add(event.ExecutionReset, "", &resetPayload{Reason: "agent_disconnect", FromStatus: StatusRunning})
	if err := t.commit(context.Background()); err != nil {
		return
	}
	k.mu.Lock()
	k.dropQueuedLocked(ex.ID)
	k.agentSetLocked(ex.AgentID).pending = append(k.agentSetLocked(ex.AgentID).pending, ex.ID)
	k.mu.Unlock()
	agentID := ex.AgentID
	fx.add(func() { k.assignPending(agentID) })
}

// StepResultRequest is the body of POST /v0/agents/step-result.
type StepResultRequest struct {
	ExecutionID    string          `json:"execution_id"`
	SessionID      string          `json:"session_id"`
	StepID         string          `json:"step_id"`
	Success        bool            `json:"success"`
	Data           json.RawMessage `json:"data"`
	Error          string          `json:"error"`
	IdempotencyKey string          `json:"idempotency_key"` // extension
}

// StepResult records the outcome of a step the agent ran itself. A retry
// that repeats the recorded outcome succeeds again; a different outcome for
// a resolved step is a conflict whose details carry the recorded one.
func (k *Kernel) StepResult(ctx context.Context, req StepResultRequest, meta Meta) (After, error) {
	if req.SessionID == "" {
		return nil, invalid("execution_id, session_id, and step_id are required")
	}
	return k.stepResult(ctx, req, meta, true)
}

// AnswerStep records the outcome of a local step that someone other than
// the agent ran: an AAP client running one of its own tools. It is
// StepResult without the agent's lease; the first outcome wins, a
// different later one is a conflict.
func (k *Kernel) AnswerStep(ctx context.Context, req StepResultRequest, meta Meta) (After, error) {
	return k.stepResult(ctx, req, meta, false)
}

func (k *Kernel) stepResult(ctx context.Context, req StepResultRequest, meta Meta, byAgent bool) (After, error) {
	if req.ExecutionID == "" || req.StepID == "" {
		return nil, invalid("execution_id, session_id, and step_id are required")
	}
	for _, f := range [][2]string{{"execution_id", req.ExecutionID}, {"session_id", req.SessionID},
		{"step_id", req.StepID}, {"idempotency_key", req.IdempotencyKey}} {
		if err := checkID(f[0], f[1], maxIDLen); err != nil {
			return nil, err
		}
	}
	if err := checkLen("error", req.Error, maxErrorLen); err != nil {
		return nil, err
	}
	if isNull(req.Data) {
		req.Data = nil
	}
	ex, err := k.lockStep(req.ExecutionID, req.StepID)
	if err != nil {
		return nil, err
	}
	defer ex.mu.Unlock()
	if byAgent {
		if err := k.checkLease(ex, req.SessionID); err != nil {
			return nil, err
		}
	}
	st := ex.Steps[req.StepID]
	if st == nil {
		return nil, notFound("step", req.StepID)
	}
	if !byAgent && st.Remote {
		return nil, conflict("conflict: step %s runs on a runner", st.ID)
	}
	if st.Status.Terminal() {
		return nil, settled(st, req.Success, req.Data, req.Error)
	}
	if st.Approval {
		return nil, conflict("conflict: step %s is waiting for approval", st.ID)
	}
	if req.IdempotencyKey != "" {
		meta.IdempotencyKey = req.IdempotencyKey // the body's key wins over the header's
	}
	t := k.begin(ex, meta)
	if req.Success {
		t.add(event.StepCompleted, st.ID, &stepCompletedPayload{Result: orNull(req.Data)})
		k.toolResult(t, st, StepSucceeded, req.Data, "")
	} else {
		t.add(event.StepFailed, st.ID, &stepFailedPayload{Error: req.Error})
		k.toolResult(t, st, StepFailed, req.Data, req.Error)
	}
	if err := t.commit(ctx); err != nil {
		return nil, err
	}
	st.stopTimer()
	var fx effects
	fx.add(t.publish())
	return k.after(fx), nil
}

// lockStep locks the execution holding a step. Unlike lockLive it accepts a
// finished execution, so that a retried result can be answered from the
// recorded outcome; the returned execution is then a read-only replay.
func (k *Kernel) lockStep(execID, stepID string) (*Execution, error) {
	ex, err := k.lockLive(execID)
	if err == nil {
		return ex, nil
	}
	if !errors.Is(err, ErrConflict) {
		if errors.Is(err, ErrNotFound) {
			return nil, notFound("step", stepID)
		}
		return nil, err
	}
	ex, rerr := k.replay(execID)
	if rerr != nil {
		return nil, rerr
	}
	ex.mu.Lock()
	return ex, nil
}

// settled answers a result for a step that is already terminal.
func settled(st *Step, success bool, data json.RawMessage, errText string) error {
	same := (success && st.Status == StepSucceeded && jsonEqual(data, st.Result)) ||
		(!success && st.Status == StepFailed && errText == st.Error)
	if same {
		return nil
	}
	e := conflict("step already resolved")
	rec := map[string]any{"step_id": st.ID, "status": st.Status}
	if !isNull(st.Result) {
		rec["result"] = st.Result
	}
	if st.Error != "" {
		rec["error"] = st.Error
	}
	e.Details = map[string]any{"recorded": rec}
	return e
}

func jsonEqual(a, b json.RawMessage) bool {
	if isNull(a) && isNull(b) {
		return true
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}
