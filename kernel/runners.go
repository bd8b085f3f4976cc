package kernel

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/event"
)

// runnerSet is every consumer (connection identity) of one runner_id.
type runnerSet struct {
	consumers map[string]*runnerConsumer
	// info is what the runner says about its tools, by tool id (see
	// DescribeTools).
	info map[string]json.RawMessage
}

type runnerConsumer struct {
	connection
	runnerID string
	id       string
	caps     map[string]bool
	job      *job // the job it holds; one at a time
}

// job is a remote step waiting for, or held by, a runner.
type job struct {
	execID, stepID, toolID string
	account                string // the connected account its runner must serve
	jobID                  string // set once dispatched
	notBefore              time.Time
}

// capability is what a runner consumer must declare to take the job: the
// tool, or "<tool>@<account>" for a job bound to a connected account.
func (j *job) capability() string { return capability(j.toolID, j.account) }

func capability(toolID, account string) string {
	if account == "" {
		return toolID
	}
	return toolID + "@" + account
}

func (k *Kernel) runnerSetLocked(runnerID string) *runnerSet {
	rs := k.runners[runnerID]
	if rs == nil {
		rs = &runnerSet{consumers: map[string]*runnerConsumer{}}
		k.runners[runnerID] = rs
	}
	return rs
}

// runnerConsumerLocked returns consumer consumerID of runnerID, known
// from now on if it was not. The caller holds k.mu.
func (k *Kernel) runnerConsumerLocked(runnerID, consumerID string) *runnerConsumer {
	rs := k.runnerSetLocked(runnerID)
	c := rs.consumers[consumerID]
	if c == nil {
		c = &runnerConsumer{runnerID: runnerID, id: consumerID}
		rs.consumers[consumerID] = c
		k.runnerOrder = nil
	}
	return c
}

// RunnerConnected records a live runner connection with its capabilities
// (tool ids) and dispatches queued jobs to it. A consumer that reconnects
// within the grace period keeps the job it held; its outbox sends the job
// again unless the runner settled it (reported it started or finished).
// The returned function records the end of the connection.
func (k *Kernel) RunnerConnected(runnerID, consumerID string, caps []string) (disconnected func()) {
	k.mu.Lock()
	c := k.runnerConsumerLocked(runnerID, consumerID)
	c.caps = k.capSetLocked(runnerID, caps)
	gen := c.connect()
	k.mu.Unlock()
	k.dispatch()
	return k.disconnected(&c.connection, gen, k.opts.RunnerGrace, func() { k.runnerLost(runnerID, consumerID, gen) })
}

// capSetLocked is what runnerID may serve of the capabilities caps it
// declares: a tool reserved for a built-in runner (on any account) is left
// out unless runnerID is that runner, so that whatever a door let through,
// no job of a built-in tool ever reaches another runner. The caller holds
// k.mu.
func (k *Kernel) capSetLocked(runnerID string, caps []string) map[string]bool {
	m := make(map[string]bool, len(caps))
	for _, c := range caps {
		if c == "" {
			continue
		}
		if owner, ok := k.reservedLocked(c); ok && owner != runnerID {
			k.log.Warn("a runner declared a tool reserved for a built-in runner; left out", "runner", runnerID, "tool", c, "builtin", owner)
			continue
		}
		m[c] = true
	}
	return m
}

// Reserve makes runnerID a built-in runner of this process that serves
// tools: their names are its own from then on. The kernel hands a job of a
// reserved tool, on any account, to no other runner, whatever it declares,
// and ReservedTool and BuiltinRunner tell the doors, so that they refuse
// such a declaration, and any use of the runner id, with a clear answer.
// Call it before the built-in runner connects and before the server
// serves: a runner already connected keeps what it declared until it
// declares again.
func (k *Kernel) Reserve(runnerID string, tools []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.builtin[runnerID] = true
	for _, t := range tools {
		k.reserved[t] = runnerID
	}
}

// ReservedTool reports whether capability (a tool id, or
// "<tool>@<account>") names a tool reserved for a built-in runner, and
// which.
func (k *Kernel) ReservedTool(capability string) (runnerID string, reserved bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.reservedLocked(capability)
}

func (k *Kernel) reservedLocked(capability string) (string, bool) {
	tool, _, _ := strings.Cut(capability, "@")
	runnerID, ok := k.reserved[tool]
	return runnerID, ok
}

// BuiltinRunner reports whether runnerID is a built-in runner of this
// process (see Reserve): no credential acts as it.
func (k *Kernel) BuiltinRunner(runnerID string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.builtin[runnerID]
}

// runnerLost runs when a consumer stayed away past the grace period: the job
// it held goes back to the queue (or fails, when its attempts are used up).
func (k *Kernel) runnerLost(runnerID, consumerID string, gen uint64) {
	k.mu.Lock()
	rs := k.runners[runnerID]
	var c *runnerConsumer
	if rs != nil {
		c = rs.consumers[consumerID]
	}
	if c == nil || !c.lostSince(gen) || k.closed {
		k.mu.Unlock()
		return
	}
	delete(rs.consumers, consumerID)
	k.runnerOrder = nil
	if len(rs.consumers) == 0 {
		delete(k.runners, runnerID)
	}
	held := c.job
	c.job = nil
	k.mu.Unlock()
	k.out.Forget(Peer{Role: RoleRunner, ID: runnerID, Consumer: consumerID})
	if held != nil {
		k.requeueLost(held, "runner lost")
	}
	k.dispatch()
}

// requeueLost fails the current attempt of a job whose runner is gone and
// retries it if attempts remain.
func (k *Kernel) requeueLost(j *job, reason string) {
	ex, err := k.lockLive(j.execID)
	if err != nil {
		return
	}
	st := ex.Steps[j.stepID]
	if st == nil || st.Status.Terminal() || st.JobID != j.jobID {
		ex.mu.Unlock()
		return
	}
	var fx effects
	t := k.begin(ex, Meta{})
	k.failAttempt(t, &fx, st, reason, true, nil)
	err = t.commit(context.Background())
	fx.add(t.publish())
	if err == nil && ex.Status.Terminal() {
		k.finish(ex)
	}
	ex.mu.Unlock()
	if err == nil {
		// Effects take execution locks themselves: never run them under ex.mu.
		k.runNow(fx)
	}
}

// failAttempt records a failed attempt: retried with backoff while attempts
// remain and the failure is retryable, otherwise final with a push to the
// agent. The caller holds ex.mu and commits t.
func (k *Kernel) failAttempt(t *tx, fx *effects, st *Step, errText string, retryable bool, data json.RawMessage) {
	ex := t.ex
	if retryable && st.Attempt < st.MaxAttempts {
		backoff := k.opts.RetryBase << st.Attempt // 2×base before attempt 2, 4×base before 3, as the original
		if backoff > k.opts.RetryMax || backoff <= 0 {
			backoff = k.opts.RetryMax
		}
		notBefore := t.now.Add(backoff)
		t.add(event.StepFailed, st.ID, &stepFailedPayload{Error: errText, Retryable: true})
		t.add(event.StepRetried, st.ID, &stepRetriedPayload{NextAttempt: st.Attempt + 1, NotBefore: notBefore})
		k.counters.retries.Add(1)
		execID, stepID := ex.ID, st.ID
		fx.add(func() { k.enqueue(execID, stepID) })
		return
	}
	t.add(event.StepFailed, st.ID, &stepFailedPayload{Error: errText, Retryable: false})
	k.toolResult(t, st, StepFailed, data, errText)
}

// enqueue puts a remote step in the job queue and dispatches. The step's
// state decides whether it is still wanted, so a stale call is harmless.
func (k *Kernel) enqueue(execID, stepID string) {
	ex, err := k.lockLive(execID)
	if err != nil {
		return
	}
	st := ex.Steps[stepID]
	if st == nil || st.Status != StepPending || st.Approval || !st.Remote {
		ex.mu.Unlock()
		return
	}
	j := &job{execID: execID, stepID: stepID, toolID: st.ToolID, account: st.Account, notBefore: st.NotBefore}
	ex.mu.Unlock()
	k.mu.Lock()
	for _, q := range k.queue {
		if q.execID == execID && q.stepID == stepID {
			k.mu.Unlock()
			return
		}
	}
	k.queue = append(k.queue, j)
	k.mu.Unlock()
	if wait := time.Until(j.notBefore); wait > 0 {
		time.AfterFunc(wait, k.dispatch)
		return
	}
	k.dispatch()
}

// dispatchNow hands a new remote step to an idle runner in the batch that
// creates it, saving a commit on the way to the runner. It declines when no
// capable runner is idle or older jobs for the tool are waiting (they go
// first). The caller holds t.ex.mu.
func (k *Kernel) dispatchNow(t *tx, fx *effects, stepID string, st *stepCreatedPayload) bool {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return false
	}
	j := &job{execID: t.ex.ID, stepID: stepID, toolID: st.ToolID, account: st.Account}
	for _, q := range k.queue {
		if q.capability() == j.capability() {
			k.mu.Unlock()
			return false
		}
	}
	c := k.pickRunnerLocked(j.capability())
	if c == nil {
		k.mu.Unlock()
		return false
	}
	j.jobID = event.NewID()
	c.job = j
	k.mu.Unlock()
	t.onAbort(func() { k.release(c, j.jobID) })
	t.add(event.StepDispatched, stepID, &dispatchedPayload{RunnerID: c.runnerID, JobID: j.jobID, Deadline: st.Deadline, ConsumerID: c.id})
	t.push(Peer{Role: RoleRunner, ID: c.runnerID, Consumer: c.id}, event.PushJobAssigned, &jobPush{
		ID: j.jobID, ExecutionID: t.ex.ID, StepID: stepID, Attempt: st.Attempt, ToolID: st.ToolID,
		Arguments: st.Arguments, Deadline: st.Deadline, Account: st.Account,
	}, j.jobID)
	k.counters.jobs.Add(1)
	return true
}

func (k *Kernel) dropQueuedLocked(execID string) {
	q := k.queue[:0]
	for _, j := range k.queue {
		if j.execID != execID {
			q = append(q, j)
		}
	}
	clear(k.queue[len(q):])
	k.queue = q
}

// dispatch hands ready jobs to idle capable runner consumers. It holds k.mu
// only to match jobs to consumers; the writes happen after, under each
// execution's own lock, so dispatch never waits on the store while holding
// the kernel lock (the original kernel deadlocked here).
func (k *Kernel) dispatch() {
	type assignment struct {
		c *runnerConsumer
		j *job
	}
	var out []assignment
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return
	}
	now := time.Now()
	rest := k.queue[:0]
	for _, j := range k.queue {
		if j.notBefore.After(now) {
			rest = append(rest, j)
			continue
		}
		c := k.pickRunnerLocked(j.capability())
		if c == nil {
			rest = append(rest, j)
			continue
		}
		j.jobID = event.NewID()
		c.job = j
		out = append(out, assignment{c, j})
	}
	clear(k.queue[len(rest):])
	k.queue = rest
	k.mu.Unlock()
	for _, a := range out {
		k.sendJob(a.c, a.j)
	}
}

// pickRunnerLocked picks an idle online consumer that declared capability
// tool, round-robin per capability in (runner, consumer) order.
func (k *Kernel) pickRunnerLocked(tool string) *runnerConsumer {
	if k.runnerOrder == nil {
		for _, rid := range sortedKeys(k.runners) {
			rs := k.runners[rid]
			for _, cid := range sortedKeys(rs.consumers) {
				k.runnerOrder = append(k.runnerOrder, rs.consumers[cid])
			}
		}
	}
	idle := 0
	for _, c := range k.runnerOrder {
		if c.online && c.job == nil && c.caps[tool] {
			idle++
		}
	}
	if idle == 0 {
		return nil
	}
	k.rr[tool]++
	n := k.rr[tool] % idle
	for _, c := range k.runnerOrder {
		if c.online && c.job == nil && c.caps[tool] {
			if n == 0 {
				return c
			}
			n--
		}
	}
	return nil
}

// sendJob records the dispatch and pushes the job to its runner.
func (k *Kernel) sendJob(c *runnerConsumer, j *job) {
	ex, err := k.lockLive(j.execID)
	if err != nil {
		k.release(c, j.jobID)
		k.dispatch()
		return
	}
	t := k.jobTx(ex, c, j)
	if t == nil {
		ex.mu.Unlock()
		k.release(c, j.jobID)
		k.dispatch()
		return
	}
	if err := t.commit(context.Background()); err != nil {
		ex.mu.Unlock()
		k.unsend(c, j)
		// The store refused: dispatch again later, not in a loop.
		k.retryLater("dispatch", k.dispatch)
		return
	}
	k.retried("dispatch")
	k.sent(ex)
	ex.mu.Unlock()
	if publish := t.publish(); publish != nil {
		publish()
	}
}

// jobTx builds the dispatch of j to c, or returns nil when its step no
// longer waits for a runner. The caller holds ex.mu.
func (k *Kernel) jobTx(ex *Execution, c *runnerConsumer, j *job) *tx {
	st := ex.Steps[j.stepID]
	if st == nil || st.Status != StepPending || st.Approval {
		return nil
	}
	timeout := k.opts.StepTimeout
	if st.Timeout > 0 {
		timeout = st.Timeout
	}
	t := k.begin(ex, Meta{})
	deadline := t.now.Add(timeout)
	t.add(event.StepDispatched, st.ID, &dispatchedPayload{
		RunnerID: c.runnerID, JobID: j.jobID, Deadline: deadline, ConsumerID: c.id,
	})
	t.push(Peer{Role: RoleRunner, ID: c.runnerID, Consumer: c.id}, event.PushJobAssigned, &jobPush{
		ID: j.jobID, ExecutionID: ex.ID, StepID: st.ID, Attempt: st.Attempt, ToolID: st.ToolID,
		Arguments: orNull(st.Arguments), Deadline: deadline, NotBefore: st.NotBefore, Account: st.Account,
	}, j.jobID)
	return t
}

// sent finishes a committed dispatch. The caller holds ex.mu.
func (k *Kernel) sent(ex *Execution) {
	k.counters.jobs.Add(1)
	k.armStepTimers(ex)
}

// unsend frees c and queues j again after its dispatch failed to commit.
func (k *Kernel) unsend(c *runnerConsumer, j *job) {
	k.release(c, j.jobID)
	k.mu.Lock()
	k.queue = append(k.queue, &job{execID: j.execID, stepID: j.stepID, toolID: j.toolID, account: j.account})
	k.mu.Unlock()
}

// claimNext takes, for c, which just finished a job of execution held, the
// oldest queued job c can run, so that its dispatch rides on the commit of
// that job's result rather than waiting for a commit of its own. The caller
// holds held's lock, so the job's execution must be lockable without
// waiting (waiting could deadlock); a job whose execution is busy is left
// to the ordinary dispatch. It returns the job's execution locked, or nil.
func (k *Kernel) claimNext(c *runnerConsumer, held string) (*Execution, *job) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed || c == nil || !c.online || c.job != nil {
		return nil, nil
	}
	now := time.Now()
	for i, j := range k.queue {
		if j.execID == held || j.notBefore.After(now) || !c.caps[j.capability()] {
			continue
		}
		ex := k.live[j.execID]
		if ex == nil || !ex.mu.TryLock() {
			continue
		}
		if ex.Status.Terminal() {
			ex.mu.Unlock()
			continue
		}
		j.jobID = event.NewID()
		c.job = j
		k.queue = slices.Delete(k.queue, i, i+1)
		return ex, j
	}
	return nil, nil
}

// release frees the consumer holding jobID, if any.
func (k *Kernel) release(c *runnerConsumer, jobID string) {
	k.mu.Lock()
	if c.job != nil && c.job.jobID == jobID {
		c.job = nil
	}
	k.mu.Unlock()
}

// releaseJob frees the consumer of runnerID that holds jobID and returns
// it, or nil. Only the runner's own consumers are looked at: a runner that
// names another's job must not free that runner for a second job while it
// still runs the first.
func (k *Kernel) releaseJob(runnerID, jobID string) *runnerConsumer {
	if jobID == "" {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if rs := k.runners[runnerID]; rs != nil {
		for _, c := range rs.consumers {
			if c.job != nil && c.job.jobID == jobID {
				c.job = nil
				return c
			}
		}
	}
	return nil
}

// RunnerResultRequest is the body of POST /v0/runners/{id}/results.
type RunnerResultRequest struct {
	JobID          string          `json:"job_id"`
	ExecutionID    string          `json:"execution_id"`
	StepID         string          `json:"step_id"`
	Success        bool            `json:"success"`
	Data           json.RawMessage `json:"data"`
	Error          string          `json:"error"`
	Retryable      bool            `json:"retryable"`
	StartedAt      *time.Time      `json:"started_at"`
	CompletedAt    *time.Time      `json:"completed_at"`
	ConsumerID     string          `json:"consumer_id"`
	IdempotencyKey string          `json:"idempotency_key"` // extension
}

// RunnerResult records a job's outcome. The runner that held the job is
// freed whatever the outcome, so it is never stuck busy. A result for an
// earlier attempt of the step is acknowledged without effect unless it is a
// success the step still needs.
func (k *Kernel) RunnerResult(ctx context.Context, runnerID string, req RunnerResultRequest, meta Meta) (After, error) {
	if req.JobID == "" || req.ExecutionID == "" || req.StepID == "" {
		return nil, invalid("job_id, execution_id, and step_id are required")
	}
	for _, f := range [][2]string{{"runner_id", runnerID}, {"job_id", req.JobID}, {"execution_id", req.ExecutionID},
		{"step_id", req.StepID}, {"consumer_id", req.ConsumerID}, {"idempotency_key", req.IdempotencyKey}} {
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
	// The runner is free once this returns, whatever the outcome. A job
	// waiting for it is dispatched in the background: this answer waits
	// for its own commit and nothing more.
	defer k.dispatchQueued()
	defer k.releaseJob(runnerID, req.JobID)
	ex, err := k.lockStep(req.ExecutionID, req.StepID)
	if err != nil {
		return nil, err
	}
	defer ex.mu.Unlock()
	st := ex.Steps[req.StepID]
	if st == nil {
		return nil, notFound("step", req.StepID)
	}
	owner, known := st.Jobs[req.JobID]
	if !known {
		return nil, conflict("conflict: job %s is not a job of step %s", req.JobID, st.ID)
	}
	if owner != runnerID {
		return nil, conflict("conflict: job %s was dispatched to runner %s, not %s", req.JobID, owner, runnerID)
	}
	if st.Status.Terminal() {
		return nil, settled(st, req.Success, req.Data, req.Error)
	}
	if st.JobID != req.JobID && !req.Success {
		return nil, nil // an earlier attempt's failure, already handled
	}
	// The runner is done with the job whatever is written next: free it now
	// and write its next job's dispatch in this result's commit, or, when
	// that job's execution is busy, let the ordinary dispatch find it.
	c := k.releaseJob(runnerID, req.JobID)
	nextEx, next := k.claimNext(c, ex.ID)
	var nt *tx
	if next != nil {
		if nt = k.jobTx(nextEx, c, next); nt == nil {
			nextEx.mu.Unlock()
			k.release(c, next.jobID)
			next = nil
		}
	}
	if next == nil {
		// Started before the commit, so that a dispatch it makes can share
		// this result's group commit.
		k.dispatchQueued()
	}
	if req.IdempotencyKey != "" {
		meta.IdempotencyKey = req.IdempotencyKey // the body's key wins over the header's
	}
	var fx effects
	t := k.begin(ex, meta)
	t.settlePush(Peer{Role: RoleRunner, ID: st.RunnerID, Consumer: st.ConsumerID}, req.JobID)
	if req.Success {
		t.add(event.StepCompleted, st.ID, &stepCompletedPayload{Result: orNull(req.Data)})
		k.toolResult(t, st, StepSucceeded, req.Data, "")
	} else {
		k.failAttempt(t, &fx, st, req.Error, req.Retryable, req.Data)
	}
	err = t.commitWith(ctx, nt)
	if next != nil {
		if err == nil {
			k.sent(nextEx)
		}
		nextEx.mu.Unlock()
		if err != nil {
			k.unsend(c, next)
		} else if publish := nt.publish(); publish != nil {
			publish() // the runner's next job need not wait for this answer
		}
	}
	if err != nil {
		return nil, err
	}
	// The step's outcome does not answer this request: the intent that
	// named the step was answered before its job was sent (enqueue and
	// dispatch run after that answer). It goes to the agent now rather
	// than after the runner's answer.
	if publish := t.publish(); publish != nil {
		publish()
	}
	if st.Status.Terminal() {
		st.stopTimer()
	}
	if ex.Status.Terminal() {
		k.finish(ex)
	}
	k.mu.Lock()
	k.dropQueuedStepLocked(ex.ID, st.ID)
	k.mu.Unlock()
	if !st.Status.Terminal() {
		execID, stepID := ex.ID, st.ID
		fx.add(func() { k.enqueue(execID, stepID) })
	}
	return k.after(fx), nil
}

// dispatchQueued runs dispatch in the background when jobs wait for a
// runner; with none queued it starts nothing.
func (k *Kernel) dispatchQueued() {
	k.mu.Lock()
	queued := len(k.queue) > 0
	k.mu.Unlock()
	if queued {
		k.spawn(k.dispatch)
	}
}

func (k *Kernel) dropQueuedStepLocked(execID, stepID string) {
	q := k.queue[:0]
	for _, j := range k.queue {
		if j.execID != execID || j.stepID != stepID {
			q = append(q, j)
		}
	}
	clear(k.queue[len(q):])
	k.queue = q
}

// StepStartedRequest is the body of POST /v0/runners/steps/{id}/started.
type StepStartedRequest struct {
	ExecutionID string `json:"execution_id"`
	RunnerID    string `json:"runner_id"`
}

// StepStarted records that a runner began a step. Calls for a step already
// running or finished change nothing.
func (k *Kernel) StepStarted(ctx context.Context, stepID string, req StepStartedRequest, meta Meta) error {
	if req.ExecutionID == "" || req.RunnerID == "" {
		return invalid("execution_id and runner_id are required")
	}
	for _, f := range [][2]string{{"step_id", stepID}, {"execution_id", req.ExecutionID}, {"runner_id", req.RunnerID}} {
		if err := checkID(f[0], f[1], maxIDLen); err != nil {
			return err
		}
	}
	ex, err := k.lockStep(req.ExecutionID, stepID)
	if err != nil {
		return err
	}
	defer ex.mu.Unlock()
	st := ex.Steps[stepID]
	if st == nil {
		return notFound("step", stepID)
	}
	if st.Remote && !st.dispatchedTo(req.RunnerID) {
		// A runner speaks only for the jobs it was given.
		return conflict("conflict: step %s was never dispatched to runner %s", st.ID, req.RunnerID)
	}
	if st.Status != StepPending && st.Status != StepDispatched {
		return nil
	}
	if st.Remote && (st.JobID == "" || st.RunnerID != req.RunnerID) {
		// A late call for an attempt that already failed: the retry is
		// queued or held by another runner, so nothing of this runner's
		// has started.
		return nil
	}
	if st.Approval {
		return conflict("conflict: step %s is waiting for approval", st.ID)
	}
	t := k.begin(ex, meta)
	t.add(event.StepStarted, st.ID, &stepStartedPayload{RunnerID: req.RunnerID})
	t.settlePush(Peer{Role: RoleRunner, ID: st.RunnerID, Consumer: st.ConsumerID}, st.JobID)
	return t.commit(ctx)
}

// dispatchedTo reports whether a job of the step was ever dispatched to
// runnerID.
func (st *Step) dispatchedTo(runnerID string) bool {
	for _, r := range st.Jobs {
		if r == runnerID {
			return true
		}
	}
	return false
}

// UpdateCapabilities replaces the tool list of every connection of a runner.
func (k *Kernel) UpdateCapabilities(runnerID string, tools []string) {
	k.mu.Lock()
	if rs := k.runners[runnerID]; rs != nil {
		caps := k.capSetLocked(runnerID, tools)
		for _, c := range rs.consumers {
			c.caps = caps
		}
	}
	k.mu.Unlock()
	k.dispatch()
}

// RunnerCapabilities returns, sorted, the capabilities runnerID's
// connections serve now.
func (k *Kernel) RunnerCapabilities(runnerID string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var caps []string
	if rs := k.runners[runnerID]; rs != nil {
		seen := map[string]bool{}
		for _, c := range rs.consumers {
			for cp := range c.caps {
				if !seen[cp] {
					seen[cp] = true
					caps = append(caps, cp)
				}
			}
		}
	}
	slices.Sort(caps)
	return caps
}

// RemoveRunner unregisters a runner: its connections end and the jobs it
// held go back to the queue at once.
func (k *Kernel) RemoveRunner(runnerID string) {
	k.mu.Lock()
	rs := k.runners[runnerID]
	delete(k.runners, runnerID)
	k.runnerOrder = nil
	var held []*job
	var peers []Peer
	if rs != nil {
		for _, c := range rs.consumers {
			c.stopGrace()
			c.gen++ // the connection's disconnect must not resurrect it
			if c.job != nil {
				held = append(held, c.job)
				c.job = nil
			}
			peers = append(peers, Peer{Role: RoleRunner, ID: runnerID, Consumer: c.id})
		}
	}
	k.mu.Unlock()
	for _, p := range peers {
		k.out.Forget(p)
	}
	for _, j := range held {
		k.requeueLost(j, "runner removed")
	}
	k.dispatch()
}

// ServedTool is a capability that connected runners serve: a tool id, or
// "<tool>@<account>" for a connected account.
type ServedTool struct {
	ID string `json:"id"`
	// Runners are the runner ids with an online connection that serves it.
	Runners []string `json:"runners"`
	// Info is what the first of those runners that described the tool
	// said about it (see DescribeTools); nil when none did.
	Info json.RawMessage `json:"info,omitempty"`
}

// Tools returns what connected runners serve, by capability.
func (k *Kernel) Tools() []ServedTool {
	k.mu.Lock()
	by := map[string]map[string]bool{}
	for rid, rs := range k.runners {
		for _, c := range rs.consumers {
			if !c.online {
				continue
			}
			for tool := range c.caps {
				if by[tool] == nil {
					by[tool] = map[string]bool{}
				}
				by[tool][rid] = true
			}
		}
	}
	out := make([]ServedTool, 0, len(by))
	for _, id := range sortedKeys(by) {
		st := ServedTool{ID: id, Runners: sortedKeys(by[id])}
		for _, rid := range st.Runners {
			if info := k.runners[rid].info[id]; info != nil {
				st.Info = info
				break
			}
		}
		out = append(out, st)
	}
	k.mu.Unlock()
	return out
}

// DescribeTools records what a connected runner says about its tools (a
// protocol's capability metadata: description, parameters, accounts), by
// tool id, replacing what it said before. The kernel keeps it while the
// runner is known, forgets it with the runner, and means nothing by it;
// Tools returns it beside the tools. An unknown runner changes nothing, as
// for UpdateCapabilities.
func (k *Kernel) DescribeTools(runnerID string, info map[string]json.RawMessage) {
	k.mu.Lock()
	if rs := k.runners[runnerID]; rs != nil {
		rs.info = info
	}
	k.mu.Unlock()
}
