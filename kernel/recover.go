package kernel

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/gatehouse-dev/gatehouse/event"
)

// recover rebuilds every live execution from its log. Agents and runners
// that held work get their grace period to reconnect with the same consumer
// id; after it, their executions go back to pending and their jobs back to
// the queue, exactly as after a disconnect.
func (k *Kernel) recover(ctx context.Context) error {
	var ids []string
	err := k.store.Records(kindLive, func(id string, _ func(any) error) bool {
		ids = append(ids, id)
		return ctx.Err() == nil
	})
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var exs []*Execution
	for _, id := range ids {
		ex, err := k.replay(id)
		if err != nil {
			return err
		}
		if ex.Status.Terminal() {
			continue
		}
		exs = append(exs, ex)
	}
	sort.Slice(exs, func(i, j int) bool { return exs[i].CreatedAt.Before(exs[j].CreatedAt) })
	// Every execution is in place before any timer is armed: a deadline
	// that passed while the kernel was down fires at once, and its
	// callback looks the others up. The grace timers armed here take mu,
	// so they wait for it.
	k.mu.Lock()
	for _, ex := range exs {
		ex.row.Store(ex.summary(k.noLabels))
		k.live[ex.ID] = ex
		switch {
		case ex.Tool != nil:
			// A direct execution has no agent: its step is all there is.
		case ex.Lease != nil:
			// Its agent gets the grace period to come back after the restart.
			k.bindLeaseLocked(ex.AgentID, ex.Lease.ConsumerID, ex.ID, ex.Lease.ID)
		case ex.Status == StatusPending:
			as := k.agentSetLocked(ex.AgentID)
			as.pending = append(as.pending, ex.ID)
		}
		for _, sid := range ex.StepOrder {
			st := ex.Steps[sid]
			if !st.Remote || st.Status.Terminal() || st.Approval {
				continue
			}
			if st.JobID == "" {
				k.queue = append(k.queue, &job{execID: ex.ID, stepID: st.ID, toolID: st.ToolID, account: st.Account, notBefore: st.NotBefore})
				continue
			}
			// A runner that held a job before the restart has its grace
			// period to come back for it.
			c := k.runnerConsumerLocked(st.RunnerID, st.ConsumerID)
			runnerID, consumerID, gen := c.runnerID, c.id, c.gen
			k.awaitLocked(&c.connection, k.opts.RunnerGrace, func() { k.runnerLost(runnerID, consumerID, gen) })
			c.job = &job{execID: ex.ID, stepID: st.ID, toolID: st.ToolID, account: st.Account, jobID: st.JobID}
		}
	}
	queued := len(k.queue)
	for _, j := range k.queue {
		if wait := time.Until(j.notBefore); wait > 0 {
			time.AfterFunc(wait, k.dispatch)
		}
	}
	k.mu.Unlock()
	// Timers' callbacks take the execution's lock: arm them under it.
	for _, ex := range exs {
		ex.mu.Lock()
		k.armExecutionTimer(ex)
		k.armStepTimers(ex)
		k.armApprovalExpiry(ex)
		ex.mu.Unlock()
	}
	if n := len(exs); n > 0 {
		k.log.Info("recovered live executions", "count", n, "queued_jobs", queued)
	}
	return nil
}

// replay folds an execution's whole log into a fresh Execution. Its
// session is the one its events name; the summary is read only for a log
// whose first event names none (an earlier release's).
func (k *Kernel) replay(id string) (*Execution, error) {
	ex := &Execution{ID: id, Steps: map[string]*Step{}, replayed: true}
	var ferr error
	err := k.store.Scan(streamOf(id), 0, func(seq uint64, data []byte) bool {
		var ev event.Event
		if ev, ferr = event.DecodeStored(data, id); ferr != nil {
			return false
		}
		if seq == 1 {
			ex.TraceID, ex.SessionID = ev.TraceID, ev.SessionID
		}
		f, err := decodeFact(&ev)
		if err != nil {
			ferr = err
			return false
		}
		ex.apply(f)
		return true
	})
	if err == nil {
		err = ferr
	}
	if err != nil {
		return nil, fmt.Errorf("replay execution %s: %w", id, err)
	}
	if ex.SessionID == "" {
		sum, err := k.summary(id)
		if err != nil {
			return nil, err
		}
		ex.SessionID = sum.SessionID
	}
	if isNull(ex.Input) {
		ex.Input = nil
	}
	return ex, nil
}
