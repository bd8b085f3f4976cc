package kernel

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/event"
)

// historyLimit bounds the step history kept per execution; an agent that
// takes over an execution gets at most this many entries.
const historyLimit = 50

// fact is an event as the reducer sees it: the typed payload, so the live
// path applies what it wrote without decoding it again.
type fact struct {
	typ     string
	stepID  string
	at      time.Time
	seq     uint64
	payload any
}

// apply folds one fact into the execution. It is the only code that changes
// an execution's state, used both after a commit and when replaying the log
// at start-up, so the two cannot disagree.
func (ex *Execution) apply(f fact) {
	ex.Seq = f.seq
	ex.UpdatedAt = f.at
	switch p := f.payload.(type) {
	case *createdPayload:
		ex.AgentID, ex.Input, ex.Labels, ex.Owner, ex.Tenant, ex.Tool = p.AgentID, p.Input, p.Labels, p.Owner, p.Tenant, p.Tool
		ex.Filed, ex.ThreadID, ex.TurnID, ex.Ask = p.Filed, p.ThreadID, p.TurnID, p.Ask
		ex.Status, ex.CreatedAt = StatusPending, f.at
		if ex.Steps == nil {
			ex.Steps = map[string]*Step{}
		}
	case *startedPayload:
		ex.Status = StatusRunning
		if ex.Tool == nil { // a direct execution runs without an agent's lease
			ex.Lease = &Lease{ID: p.SessionID, ConsumerID: p.ConsumerID}
		}
	case *blockedPayload:
		ex.Status, ex.BlockReason, ex.BlockRef = StatusBlocked, p.Reason, p.Ref
	case *reasonPayload:
		switch f.typ {
		case event.ExecutionResumed:
			if st := ex.Steps[ex.BlockRef]; st != nil && ex.BlockReason == "approval" {
				st.Approval = false // decided: an approved remote step may now be queued
				if st.Status == StepPending {
					// Its time starts now, not while a human was deciding.
					st.Deadline = f.at.Add(st.Deadline.Sub(st.CreatedAt))
				}
			}
			ex.Status, ex.BlockReason, ex.BlockRef = StatusRunning, "", ""
			ex.consumeSignal(p.Reason)
		case event.ExecutionCancelled:
			ex.Status = StatusCancelled
		case event.StepCancelled:
			ex.finishStep(f, StepCancelled, nil, p.Reason)
		}
	case *completedPayload:
		ex.Status, ex.Output, ex.HasOutput = StatusCompleted, p.Output, true
	case *errorPayload:
		ex.Status, ex.Error = StatusFailed, p.Error
	case *resetPayload:
		ex.Status, ex.Lease, ex.BlockReason, ex.BlockRef = StatusPending, nil, "", ""
	case *agentTimeoutPayload:
		ex.Lease = nil
	case *signalPayload:
		ex.Signals = append(ex.Signals, Signal{Type: p.SignalType, Payload: p.Payload, Seq: f.seq})
	case *stepCreatedPayload:
		ex.Steps[f.stepID] = &Step{
			ID: f.stepID, ToolID: p.ToolID, Arguments: p.Arguments, Remote: p.Remote,
			Status: StepPending, Attempt: p.Attempt, MaxAttempts: p.MaxAttempts,
			Timeout: time.Duration(p.TimeoutMS) * time.Millisecond, Deadline: p.Deadline, CreatedAt: f.at,
			Account: p.Account,
		}
		ex.StepOrder = append(ex.StepOrder, f.stepID)
	case *approvalRequiredPayload:
		if st := ex.Steps[f.stepID]; st != nil {
			st.Approval, st.ActionID, st.OnExpiry = true, p.ActionID, p.OnExpiry
			if p.ExpiresAt != nil {
				st.ExpiresAt = *p.ExpiresAt
			}
		}
	case *dispatchedPayload:
		if st := ex.Steps[f.stepID]; st != nil {
			st.Status, st.Approval, st.Deadline = StepDispatched, false, p.Deadline
			st.JobID, st.RunnerID = p.JobID, p.RunnerID
			st.ConsumerID = p.ConsumerID
			if p.JobID != "" {
				if st.Jobs == nil {
					st.Jobs = map[string]string{}
				}
				st.Jobs[p.JobID] = p.RunnerID
			}
		}
	case *stepStartedPayload:
		if st := ex.Steps[f.stepID]; st != nil {
			st.Status, st.Started = StepRunning, true
		}
	case *stepCompletedPayload:
		ex.finishStep(f, StepSucceeded, p.Result, "")
	case *stepFailedPayload:
		ex.finishStep(f, StepFailed, nil, p.Error)
	case *stepRetriedPayload:
		if st := ex.Steps[f.stepID]; st != nil {
			st.Status, st.Attempt, st.NotBefore = StepPending, p.NextAttempt, p.NotBefore
			st.JobID, st.RunnerID, st.ConsumerID, st.Started = "", "", "", false
			st.Deadline, st.Error, st.CompletedAt = time.Time{}, "", time.Time{}
		}
	case *emptyPayload:
		if f.typ == event.StepTimedOut {
			ex.finishStep(f, StepTimedOut, nil, "step timed out")
		}
	}
}

// finishStep records a terminal step transition and its history entry.
func (ex *Execution) finishStep(f fact, status StepStatus, result json.RawMessage, errText string) {
	st := ex.Steps[f.stepID]
	if st == nil {
		return
	}
	st.Status, st.Result, st.Error, st.CompletedAt = status, result, errText, f.at
	st.Approval = false
	at := f.at
	ex.History = append(ex.History, HistoryEntry{
		StepID: st.ID, ToolID: st.ToolID, Status: status, Arguments: st.Arguments,
		Result: result, Error: errText, CompletedAt: &at,
	})
	if n := len(ex.History); n > historyLimit {
		ex.History = append(ex.History[:0:0], ex.History[n-historyLimit:]...)
	}
}

// consumeSignal removes the signal a resume used up.
func (ex *Execution) consumeSignal(reason string) {
	typ, ok := strings.CutPrefix(reason, "signal received: ")
	if !ok {
		if reason != reasonApprovalGranted && reason != reasonApprovalDenied && reason != reasonApprovalExpired {
			return
		}
		typ = signalStepApprove
	}
	for i, s := range ex.Signals {
		if s.Type == typ {
			ex.Signals = append(ex.Signals[:i:i], ex.Signals[i+1:]...)
			return
		}
	}
}

type emptyPayload struct{}

// decodeFact turns a stored event back into a fact for replay.
func decodeFact(ev *event.Event) (fact, error) {
	var p any
	switch ev.Type {
	case event.ExecutionCreated:
		p = &createdPayload{}
	case event.ExecutionStarted:
		p = &startedPayload{}
	case event.ExecutionBlocked:
		p = &blockedPayload{}
	case event.ExecutionResumed, event.ExecutionCancelled, event.StepCancelled:
		p = &reasonPayload{}
	case event.ExecutionCompleted:
		p = &completedPayload{}
	case event.ExecutionFailed:
		p = &errorPayload{}
	case event.ExecutionReset:
		p = &resetPayload{}
	case event.AgentTimeout:
		p = &agentTimeoutPayload{}
	case event.SignalReceived:
		p = &signalPayload{}
	case event.StepCreated:
		p = &stepCreatedPayload{}
	case event.StepApprovalRequired:
		p = &approvalRequiredPayload{}
	case event.StepDispatched:
		p = &dispatchedPayload{}
	case event.StepStarted:
		p = &stepStartedPayload{}
	case event.StepCompleted:
		p = &stepCompletedPayload{}
	case event.StepFailed:
		p = &stepFailedPayload{}
	case event.StepRetried:
		p = &stepRetriedPayload{}
	case event.StepTimedOut:
		p = &emptyPayload{}
	case event.PermissionRequested:
		p = &permissionRequestedPayload{}
	case event.PermissionResolved:
		p = &permissionResolvedPayload{}
	default:
		// Facts that do not change state (intents, permission records).
		return fact{typ: ev.Type, stepID: ev.StepID, at: ev.Timestamp, seq: ev.Sequence}, nil
	}
	if err := json.Unmarshal(ev.Payload, p); err != nil {
		return fact{}, fmt.Errorf("decode %s payload (sequence %d): %w", ev.Type, ev.Sequence, err)
	}
	return fact{typ: ev.Type, stepID: ev.StepID, at: ev.Timestamp, seq: ev.Sequence, payload: p}, nil
}
