package agentruntime

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/session"
)

// SchemaVersion is the Agent Runtime version the events and snapshots
// follow: limecloud/agentruntime v0.3.9 (commit 65ae1ec), whose schemas
// schema/ vendors.
const SchemaVersion = "0.3.9"

// Event is an Agent Runtime event: the standard's envelope, camelCase, with
// the ids that apply. Optional ids are left out when empty (the schema
// wants them non-empty when present).
type Event struct {
	Type          string            `json:"type"`
	EventID       string            `json:"eventId"`
	Timestamp     string            `json:"timestamp"`
	SchemaVersion string            `json:"schemaVersion"`
	Sequence      uint64            `json:"sequence"`
	SessionID     string            `json:"sessionId"`
	ThreadID      string            `json:"threadId,omitempty"`
	TurnID        string            `json:"turnId,omitempty"`
	TaskID        string            `json:"taskId,omitempty"`
	RunID         string            `json:"runId,omitempty"`
	StepID        string            `json:"stepId,omitempty"`
	ToolCallID    string            `json:"toolCallId,omitempty"`
	ActionID      string            `json:"actionId,omitempty"`
	JobID         string            `json:"jobId,omitempty"`
	QueueID       string            `json:"queueId,omitempty"`
	TraceID       string            `json:"traceId,omitempty"`
	Status        string            `json:"status,omitempty"`
	StatusReason  string            `json:"statusReason,omitempty"`
	NativeStatus  string            `json:"nativeStatus,omitempty"`
	Payload       any               `json:"payload,omitempty"`
	Refs          map[string]string `json:"refs,omitempty"`
}

// fact is one item of a session's log, with the execution event it refers
// to when it is a reference.
type fact struct {
	sessionID string
	item      session.Item
	event     *event.Event
}

// timestamp formats t as the schema's date-time: RFC 3339, UTC.
func timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// render turns a fact into its Agent Runtime event. It is a pure function
// of the fact: rendering a stored fact again gives the same event, byte for
// byte once encoded. It reports false for a fact the standard has no event
// for.
func render(f *fact) (Event, bool) {
	it := &f.item
	e := Event{
		SchemaVersion: SchemaVersion, Sequence: it.Seq, SessionID: f.sessionID,
		ThreadID: it.ThreadID, TurnID: it.TurnID, Timestamp: timestamp(it.At),
		EventID: f.sessionID + ":" + strconv.FormatUint(it.Seq, 10),
	}
	switch it.Kind {
	case session.KindDelta:
		e.Type = map[string]string{"text_delta": "model.delta", "reasoning_delta": "reasoning.delta"}[it.Type]
		e.TaskID, e.RunID = it.ExecutionID, it.ExecutionID
		e.Payload = map[string]string{"delta": it.Text}
		return e, e.Type != ""
	case session.KindEvent:
		return renderEvent(e, f.event)
	}
	return renderSessionFact(e, it)
}

// Payloads of the session facts, as the log holds them.
func renderSessionFact(e Event, it *session.Item) (Event, bool) {
	switch it.Type {
	case session.FactSessionCreated, session.FactSessionUpdated:
		var p session.SessionFact
		_ = json.Unmarshal(it.Data, &p)
		e.Type, e.Status = it.Type, string(p.Status)
		e.Payload = map[string]any{"title": p.Title, "source": p.Source, "agentId": p.AgentID, "changed": p.Changed}
	case session.FactThreadStarted:
		e.Type, e.Status = "thread.started", "idle"
	case session.FactTurnSubmitted, session.FactTurnStarted, session.FactTurnCompleted, session.FactTurnFailed, session.FactTurnCancelled:
		var p session.TurnFact
		_ = json.Unmarshal(it.Data, &p)
		e.TaskID, e.RunID = p.ExecutionID, p.ExecutionID
		switch it.Type {
		case session.FactTurnSubmitted:
			e.Type, e.Status = "turn.submitted", "queued"
			e.Payload = map[string]any{"input": p.Input}
		case session.FactTurnStarted:
			e.Type, e.Status = "turn.started", "running"
		case session.FactTurnCompleted:
			e.Type, e.Status = "turn.completed", "completed"
		default:
			// The standard has no turn.cancelled: a cancelled turn is a
			// failed one with status cancelled.
			e.Type, e.Status = "turn.failed", "failed"
			if it.Type == session.FactTurnCancelled {
				e.Status = "cancelled"
			}
			e.StatusReason = firstOf(p.Error, p.Reason)
		}
	case session.FactQueueChanged:
		var p session.QueueFact
		_ = json.Unmarshal(it.Data, &p)
		queued := p.Queued
		if queued == nil {
			queued = []string{}
		}
		e.Type, e.QueueID, e.StatusReason = "queue.changed", p.ThreadID, p.Reason
		e.Payload = map[string]any{"queuedTurnIds": queued, "turnId": p.TurnID}
	case session.FactOutput:
		var p session.OutputFact
		_ = json.Unmarshal(it.Data, &p)
		e.TaskID, e.RunID = p.ExecutionID, p.ExecutionID
		switch p.Kind {
		case "text":
			e.Type, e.Payload = "model.completed", map[string]any{"text": p.Text}
		case "reasoning":
			e.Type, e.Payload = "reasoning.summary", map[string]any{"text": p.Text}
		default: // status and checkpoint
			e.Type, e.Payload = "task.progress", map[string]any{"kind": p.Kind, "summary": p.Text, "data": p.Data}
		}
	default:
		return e, false
	}
	return e, true
}

// Payloads of the kernel's events, as /v0 documents them.
type (
	stepCreated struct {
		ToolID      string          `json:"tool_id"`
		Arguments   json.RawMessage `json:"arguments"`
		Attempt     int             `json:"attempt"`
		MaxAttempts int             `json:"max_attempts"`
		Remote      bool            `json:"remote"`
		Account     string          `json:"account"`
	}
	stepDispatched struct {
		RunnerID string `json:"runner_id"`
		JobID    string `json:"job_id"`
	}
	stepResult struct {
		Result    json.RawMessage `json:"result"`
		Error     string          `json:"error"`
		Retryable bool            `json:"retryable"`
		Reason    string          `json:"reason"`
	}
	approvalRequired struct {
		ToolID    string          `json:"tool_id"`
		Arguments json.RawMessage `json:"arguments"`
		Reason    string          `json:"reason"`
		RuleID    string          `json:"rule_id"`
		ExpiresAt *time.Time      `json:"expires_at"`
		OnExpiry  string          `json:"on_expiry"`
	}
	permissionRequested struct {
		ToolID   string `json:"tool_id"`
		ArgsHash string `json:"arguments_sha256"`
		Reason   string `json:"reason"`
		RuleID   string `json:"rule_id"`
	}
	permissionResolved struct {
		Outcome   string          `json:"outcome"`
		Scope     string          `json:"scope"`
		Reason    string          `json:"reason"`
		DecidedBy json.RawMessage `json:"decided_by"`
	}
	executionPayload struct {
		AgentID    string          `json:"agent_id"`
		Input      json.RawMessage `json:"input"`
		Output     json.RawMessage `json:"output"`
		Error      string          `json:"error"`
		Reason     string          `json:"reason"`
		Ref        string          `json:"ref"`
		SignalType string          `json:"signal_type"`
		Payload    json.RawMessage `json:"payload"`
		Tool       json.RawMessage `json:"tool"`
	}
)

// decisions offered by a permission prompt, as the bridge takes them.
var decisions = []string{"allow_once", "allow_always", "deny"}

// permissionOutcome maps the bridge's outcomes onto the standard's
// permission decisions.
var permissionOutcome = map[string]string{"approved": "allowed", "denied": "denied", "expired": "timed_out", "cancelled": "cancelled"}

func renderEvent(e Event, ev *event.Event) (Event, bool) {
	if ev == nil {
		return e, false
	}
	e.EventID = ev.ID
	e.Timestamp = timestamp(ev.Timestamp)
	e.TaskID, e.RunID, e.TraceID = ev.ExecutionID, ev.RunID, ev.TraceID
	e.StepID, e.ToolCallID, e.ActionID = ev.StepID, ev.ToolCallID, ev.ActionID
	e.NativeStatus = ev.Type
	e.Refs = map[string]string{"event": "/v0/executions/" + ev.ExecutionID + "/events?after_sequence=" + strconv.FormatUint(ev.Sequence-1, 10) + "&limit=1"}
	var x executionPayload
	switch ev.Type {
	case event.ExecutionCreated:
		_ = json.Unmarshal(ev.Payload, &x)
		e.Type, e.Status = "task.created", "queued"
		e.Payload = map[string]any{"agentId": x.AgentID, "input": x.Input, "tool": x.Tool}
	case event.ExecutionStarted:
		e.Type, e.Status = "task.started", "running"
	case event.ExecutionBlocked:
		_ = json.Unmarshal(ev.Payload, &x)
		e.Type, e.Status = "task.blocked", "blocked"
		e.StatusReason = map[string]string{"approval": "waiting_permission", "signal": "waiting_input"}[x.Reason]
		e.Payload = map[string]any{"waitingFor": x.Reason, "ref": x.Ref}
	case event.ExecutionResumed:
		_ = json.Unmarshal(ev.Payload, &x)
		if signal, ok := strings.CutPrefix(x.Reason, signalResumed); ok {
			// The answer to an agent's request for input.
			e.ActionID = InputActionID(ev.ExecutionID, signal)
		}
		if e.ActionID != "" {
			e.Type, e.Status = "action.resolved", "resolved"
		} else {
			e.Type, e.Status = "task.resumed", "running"
		}
		e.StatusReason = x.Reason
	case event.ExecutionCompleted:
		_ = json.Unmarshal(ev.Payload, &x)
		e.Type, e.Status = "task.completed", "completed"
		e.Payload = map[string]any{"output": x.Output}
	case event.ExecutionFailed:
		_ = json.Unmarshal(ev.Payload, &x)
		e.Type, e.Status, e.StatusReason = "task.failed", "failed", x.Error
	case event.ExecutionCancelled:
		_ = json.Unmarshal(ev.Payload, &x)
		e.Type, e.Status, e.StatusReason = "task.cancelled", "cancelled", x.Reason
	case event.ExecutionReset:
		_ = json.Unmarshal(ev.Payload, &x)
		e.Type, e.Status, e.StatusReason = "task.retrying", "retrying", x.Reason
	case event.IntentAccepted, event.IntentDenied:
		var in struct {
			IntentType string `json:"intent_type"`
			Details    struct {
				SignalType string `json:"signal_type"`
			} `json:"details"`
		}
		_ = json.Unmarshal(ev.Payload, &in)
		if ev.Type == event.IntentAccepted && in.IntentType == "wait" {
			// A structured input request: an action of its own, which
			// respond_action answers with the signal's payload.
			e.Type, e.Status = "action.required", "pending"
			e.ActionID = InputActionID(ev.ExecutionID, in.Details.SignalType)
			e.Payload = map[string]any{"actionType": "user_input", "prompt": in.Details.SignalType, "signal": in.Details.SignalType}
			break
		}
		e.Type = "task.updated"
		e.Payload = map[string]any{"intent": json.RawMessage(orNull(ev.Payload)), "accepted": ev.Type == event.IntentAccepted}
	case event.SignalReceived:
		_ = json.Unmarshal(ev.Payload, &x)
		e.Type = "task.updated"
		e.Payload = map[string]any{"signal": x.SignalType, "data": x.Payload}
	case event.AgentTimeout:
		e.Type, e.StatusReason = "runtime.warning", "agent lost: the execution waits for its agent's grace period, then another agent"
	case event.StepCreated:
		var p stepCreated
		_ = json.Unmarshal(ev.Payload, &p)
		e.Type, e.Status = "tool.started", "pending"
		e.Payload = map[string]any{"toolName": p.ToolID, "arguments": p.Arguments, "attempt": p.Attempt, "maxAttempts": p.MaxAttempts, "remote": p.Remote, "account": p.Account}
	case event.StepDispatched:
		var p stepDispatched
		_ = json.Unmarshal(ev.Payload, &p)
		if p.JobID == "" {
			e.Type, e.Status = "tool.progress", "running"
			break
		}
		e.Type, e.Status, e.JobID = "job.started", "running", p.JobID
		e.Payload = map[string]any{"runnerId": p.RunnerID}
	case event.StepStarted:
		e.Type, e.Status = "tool.progress", "running"
	case event.StepCompleted:
		var p stepResult
		_ = json.Unmarshal(ev.Payload, &p)
		e.Type, e.Status = "tool.result", "completed"
		e.Payload = map[string]any{"result": p.Result}
	case event.StepFailed, event.StepTimedOut, event.StepCancelled:
		var p stepResult
		_ = json.Unmarshal(ev.Payload, &p)
		e.Type, e.Status, e.StatusReason = "tool.failed", "failed", firstOf(p.Error, p.Reason)
		switch ev.Type {
		case event.StepTimedOut:
			e.Status, e.StatusReason = "timed_out", "step timed out"
		case event.StepCancelled:
			e.Status = "cancelled"
		}
		e.Payload = map[string]any{"retryable": p.Retryable}
	case event.StepRetried:
		e.Type, e.Status = "tool.progress", "retrying"
		e.Payload = json.RawMessage(orNull(ev.Payload))
	case event.StepApprovalRequired:
		var p approvalRequired
		_ = json.Unmarshal(ev.Payload, &p)
		e.Type, e.Status = "action.required", "pending"
		e.Payload = map[string]any{
			"actionType": "tool_permission", "toolName": p.ToolID, "arguments": p.Arguments, "prompt": p.Reason,
			"decisions": decisions, "ruleId": p.RuleID, "expiresAt": p.ExpiresAt, "onExpiry": p.OnExpiry,
		}
	case event.PermissionRequested:
		var p permissionRequested
		_ = json.Unmarshal(ev.Payload, &p)
		e.Type, e.Status = "permission.requested", "pending"
		e.Payload = map[string]any{"toolName": p.ToolID, "argumentsSha256": p.ArgsHash, "reason": p.Reason, "ruleRefs": []string{p.RuleID}}
	case event.PermissionResolved:
		var p permissionResolved
		_ = json.Unmarshal(ev.Payload, &p)
		e.Type, e.Status = "permission.resolved", permissionOutcome[p.Outcome]
		e.Payload = map[string]any{"decision": permissionOutcome[p.Outcome], "scope": p.Scope, "decisionReason": p.Reason, "decidedBy": p.DecidedBy}
	case event.AgentOutput:
		e.Type = "task.progress"
		e.Payload = json.RawMessage(orNull(ev.Payload))
	default:
		return e, false
	}
	return e, true
}

func orNull(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return b
}

func firstOf(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// signalResumed starts the reason of an execution a signal resumed.
const signalResumed = "signal received: "

// InputActionID names the action of an agent's request for input (a wait
// for a signal in execution exec); respond_action answers it by sending
// the signal with the answer's input as its payload.
func InputActionID(exec, signal string) string { return "input:" + exec + ":" + signal }
