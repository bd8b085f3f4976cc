package kernel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/kernel/policy"
	"github.com/gatehouse-dev/gatehouse/store"
)

// Approvals keeps the durable record of every permission prompt and carries
// it to people. The permission bridge implements it. The kernel stays the
// single writer: each record change is staged into the same batch as the
// kernel events it accompanies, and the execution's lock makes the first
// valid answer the only one.
type Approvals interface {
	// Requested stages a new pending approval in b. apply runs right after
	// the commit, before any answer, so readers see the record at once;
	// publish runs after the request's answer to fan the prompt out.
	Requested(b *store.Batch, a Approval) (apply, publish func())
	// Resolved stages the decision of a pending approval in b, with the
	// same apply and publish.
	Resolved(b *store.Batch, actionID string, d Decision) (apply, publish func())
	// AllowedAlways reports whether an earlier allow_always in the session
	// covers calls of the tool, so they are not asked again.
	AllowedAlways(sessionID, toolID string) bool
}

// Approval is one permission prompt: a tool call waiting for a person.
type Approval struct {
	ActionID    string          `json:"action_id" msgpack:"a"`
	SessionID   string          `json:"session_id" msgpack:"s"`
	Owner       string          `json:"owner" msgpack:"o"`
	Tenant      string          `json:"tenant,omitempty" msgpack:"tn,omitempty"`
	ExecutionID string          `json:"execution_id" msgpack:"e"`
	StepID      string          `json:"step_id" msgpack:"st"`
	AgentID     string          `json:"agent_id" msgpack:"ag"`
	ToolID      string          `json:"tool_id" msgpack:"t"`
	Arguments   json.RawMessage `json:"arguments,omitempty" msgpack:"ar"`
	ArgsHash    string          `json:"arguments_sha256" msgpack:"h"`
	Reason      string          `json:"reason" msgpack:"r"`
	RuleID      string          `json:"rule_id" msgpack:"ru"`
	RequestedAt time.Time       `json:"requested_at" msgpack:"rq"`
	ExpiresAt   *time.Time      `json:"expires_at,omitempty" msgpack:"x"`
	OnExpiry    string          `json:"on_expiry,omitempty" msgpack:"ox"`
	// Responders, when set, are the people who may answer through the
	// chat and push channels instead of Owner: the policy rule's list
	// when the prompt was requested, kept with it so that a policy
	// reload does not change who may answer a pending prompt.
	Responders []string `json:"responders,omitempty" msgpack:"rs,omitempty"`
}

// Decision settles an approval.
type Decision struct {
	// Outcome is approved, denied, expired or cancelled.
	Outcome string `json:"outcome" msgpack:"o"`
	// Scope is once, session (allow_always) or empty for non-approvals.
	Scope     string     `json:"scope,omitempty" msgpack:"sc"`
	Reason    string     `json:"reason,omitempty" msgpack:"r"`
	DecidedBy *DecidedBy `json:"decided_by,omitempty" msgpack:"by"`
	DecidedAt time.Time  `json:"decided_at" msgpack:"at"`
}

// DecidedBy says who answered a prompt, and through which channel.
type DecidedBy struct {
	Principal    string `json:"principal" msgpack:"p"`
	ChannelID    string `json:"channel_id,omitempty" msgpack:"c"`
	NativePeerID string `json:"native_peer_id,omitempty" msgpack:"n"`
}

// Approval outcomes and scopes.
const (
	OutcomeApproved  = outcomeApproved
	OutcomeDenied    = outcomeDenied
	OutcomeExpired   = outcomeExpired
	OutcomeCancelled = "cancelled"

	ScopeOnce    = "once"
	ScopeSession = "session"
)

// argsHash binds a prompt to the exact arguments it shows.
func argsHash(args json.RawMessage) string {
	sum := sha256.Sum256(args)
	return hex.EncodeToString(sum[:])
}

// requestApproval adds the events of a new prompt and stages its record.
func (k *Kernel) requestApproval(t *tx, fx *effects, st stepCreatedPayload, stepID string, dec policy.Result) {
	ex := t.ex
	actionID := event.NewID()
	reason, ruleID, onExpiry := dec.Reason, dec.RuleID, string(dec.OnExpiry)
	var expires *time.Time
	if dec.ExpiresIn > 0 {
		at := t.now.Add(dec.ExpiresIn)
		expires = &at
	}
	if onExpiry == "" {
		onExpiry = "deny"
	}
	hash := argsHash(st.Arguments)
	t.addWith(event.StepApprovalRequired, stepID, actionID, &approvalRequiredPayload{
		ToolID: st.ToolID, Arguments: st.Arguments, Remote: st.Remote,
		Reason: reason, RuleID: ruleID, ActionID: actionID, ExpiresAt: expires, OnExpiry: onExpiry,
	})
	t.addWith(event.PermissionRequested, stepID, actionID, &permissionRequestedPayload{
		ActionID: actionID, ToolID: st.ToolID, ArgsHash: hash, Reason: reason, RuleID: ruleID, Owner: ex.Owner, ExpiresAt: expires,
	})
	var args json.RawMessage
	if !isNull(st.Arguments) {
		args = st.Arguments
	}
	t.addWith(event.ExecutionBlocked, "", actionID, &blockedPayload{
		Reason: "approval", Ref: stepID, ToolID: st.ToolID, Arguments: args, Remote: st.Remote,
	})
	if k.approvals != nil {
		apply, publish := k.approvals.Requested(&t.batch, Approval{
			ActionID: actionID, SessionID: ex.SessionID, Owner: ex.Owner, Tenant: ex.Tenant, ExecutionID: ex.ID, StepID: stepID,
			AgentID: ex.AgentID, ToolID: st.ToolID, Arguments: args, ArgsHash: hash, Reason: reason, RuleID: ruleID,
			RequestedAt: t.now, ExpiresAt: expires, OnExpiry: onExpiry, Responders: dec.Responders,
		})
		t.onCommit(apply)
		fx.add(publish)
	}
}

// settleApproval adds the events and the record change of a decision on
// the approval the execution is blocked on. The caller holds ex.mu.
func (k *Kernel) settleApproval(t *tx, fx *effects, st *Step, d Decision) {
	allow := d.Outcome == outcomeApproved || (d.Outcome == outcomeExpired && st.OnExpiry == "allow")
	t.addWith(event.PermissionResolved, st.ID, st.ActionID, &permissionResolvedPayload{
		ActionID: st.ActionID, Outcome: d.Outcome, Scope: d.Scope, Reason: d.Reason, DecidedBy: d.DecidedBy,
	})
	if d.Outcome != OutcomeCancelled {
		k.resolveApproval(t, fx, st, d.Outcome, allow, d.Reason)
	}
	if k.approvals != nil {
		apply, publish := k.approvals.Resolved(&t.batch, st.ActionID, d)
		t.onCommit(apply)
		fx.add(publish)
	}
}

// pendingApproval returns the step whose approval the execution awaits.
func (ex *Execution) pendingApproval() *Step {
	if ex.Status != StatusBlocked || ex.BlockReason != "approval" {
		return nil
	}
	return ex.Steps[ex.BlockRef]
}

// ResolveApproval answers the prompt actionID of execution execID. Only
// the first answer takes effect: a prompt that is no longer pending is a
// conflict (the bridge answers it with the recorded outcome).
func (k *Kernel) ResolveApproval(ctx context.Context, execID, actionID string, d Decision, meta Meta) (After, error) {
	ex, err := k.lockLive(execID)
	if err != nil {
		return nil, err
	}
	defer ex.mu.Unlock()
	st := ex.pendingApproval()
	if st == nil || st.ActionID != actionID {
		return nil, conflict("conflict: action %s is not pending", actionID)
	}
	if d.DecidedAt.IsZero() {
		d.DecidedAt = k.now()
	}
	var fx effects
	t := k.begin(ex, meta)
	k.settleApproval(t, &fx, st, d)
	if err := t.commit(ctx); err != nil {
		return nil, err
	}
	st.stopExpiry()
	fx.add(t.publish())
	if ex.Status.Terminal() {
		k.finish(ex)
	}
	k.afterResume(ex, &fx)
	return k.after(fx), nil
}

// ApprovalOf returns the action id of the latest permission prompt of step
// stepID of the live execution execID, or "" when there is none: the step
// or the execution is unknown or finished, or the step never needed an
// approval.
func (k *Kernel) ApprovalOf(execID, stepID string) string {
	k.mu.Lock()
	ex := k.live[execID]
	k.mu.Unlock()
	if ex == nil {
		return ""
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if st := ex.Steps[stepID]; st != nil {
		return st.ActionID
	}
	return ""
}

func (st *Step) stopExpiry() {
	if st.expiry != nil {
		st.expiry.Stop()
		st.expiry = nil
	}
}

// armApprovalExpiry starts the expiry timer of a pending approval.
func (k *Kernel) armApprovalExpiry(ex *Execution) {
	st := ex.pendingApproval()
	if st == nil || st.ExpiresAt.IsZero() || st.expiry != nil {
		return
	}
	execID, actionID := ex.ID, st.ActionID
	st.expiry = time.AfterFunc(time.Until(st.ExpiresAt), func() {
		after, err := k.ResolveApproval(context.Background(), execID, actionID, Decision{Outcome: outcomeExpired}, Meta{})
		if err == nil {
			after.Run()
		}
	})
}
