package kernel

import (
	"context"
	"time"

	"github.com/gatehouse-dev/gatehouse/event"
)

// armExecutionTimer fails the execution when its overall timeout passes.
// The caller holds ex.mu or owns ex exclusively.
func (k *Kernel) armExecutionTimer(ex *Execution) {
	if ex.timer != nil || ex.Status.Terminal() {
		return
	}
	id := ex.ID
	ex.timer = time.AfterFunc(time.Until(ex.CreatedAt.Add(k.opts.ExecutionTimeout)), func() { k.executionTimedOut(id, 0) })
}

// timerRetry is the wait before a timer whose commit failed fires again:
// retryFirst, doubling up to retryMax.
func timerRetry(last time.Duration) time.Duration {
	if last == 0 {
		return retryFirst
	}
	return min(2*last, retryMax)
}

// executionTimedOut fails an execution past its timeout; wait is how long
// the last failed try waited.
func (k *Kernel) executionTimedOut(id string, wait time.Duration) {
	ex, err := k.lockLive(id)
	if err != nil {
		return
	}
	defer ex.mu.Unlock()
	ex.timer = nil
	var fx effects
	t := k.begin(ex, Meta{})
	k.cancelApproval(t, &fx, "execution timed out")
	k.cancelSteps(t, "execution timed out")
	t.add(event.ExecutionFailed, "", &errorPayload{Error: "execution exceeded maximum duration"})
	if err := t.commit(context.Background()); err != nil {
		// Try again rather than leave the execution running forever, after
		// a wait that grows while the store refuses.
		wait = timerRetry(wait)
		ex.timer = time.AfterFunc(wait, func() { k.executionTimedOut(id, wait) })
		return
	}
	k.finish(ex)
	k.spawn(func() { k.runNow(fx) }) // effects take locks of their own; ex.mu is held here
}

// armStepTimers (re)arms the deadline timer of every active step. Deadlines
// are not enforced while the execution is blocked; they are re-armed when it
// resumes. The caller holds ex.mu.
func (k *Kernel) armStepTimers(ex *Execution) {
	if ex.Status.Terminal() {
		return
	}
	for _, id := range ex.StepOrder {
		st := ex.Steps[id]
		if st.Status.Terminal() || st.Deadline.IsZero() || st.Approval {
			st.stopTimer()
			continue
		}
		st.stopTimer()
		execID, stepID, deadline := ex.ID, st.ID, st.Deadline
		st.timer = time.AfterFunc(time.Until(deadline), func() { k.stepTimedOut(execID, stepID, deadline, 0) })
	}
}

// stepTimedOut ends a step whose deadline passed. Only the step fails; the
// agent is told through tool.result and decides what to do (the original
// kernel failed the whole execution and told nobody).
func (k *Kernel) stepTimedOut(execID, stepID string, deadline time.Time, wait time.Duration) {
	ex, err := k.lockLive(execID)
	if err != nil {
		return
	}
	defer ex.mu.Unlock()
	st := ex.Steps[stepID]
	if st == nil || st.Status.Terminal() || !st.Deadline.Equal(deadline) || ex.Status == StatusBlocked {
		return
	}
	st.timer = nil
	runnerID, jobID := st.RunnerID, st.JobID
	t := k.begin(ex, Meta{})
	t.add(event.StepTimedOut, st.ID, &emptyPayload{})
	t.settlePush(Peer{Role: RoleRunner, ID: st.RunnerID, Consumer: st.ConsumerID}, jobID)
	k.toolResult(t, st, StepFailed, nil, "step timed out")
	if err := t.commit(context.Background()); err != nil {
		wait = timerRetry(wait)
		st.timer = time.AfterFunc(wait, func() { k.stepTimedOut(execID, stepID, deadline, wait) })
		return
	}
	if ex.Status.Terminal() {
		k.finish(ex)
	}
	k.releaseJob(runnerID, jobID)
	k.mu.Lock()
	k.dropQueuedStepLocked(execID, stepID)
	k.mu.Unlock()
	var fx effects
	fx.add(t.publish())
	fx.add(k.dispatch)
	// Effects take execution locks themselves, and ex.mu is held here.
	k.spawn(func() { k.runNow(fx) })
}
