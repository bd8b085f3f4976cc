// Package kernel is Gatehouse's execution kernel: executions, steps, jobs,
// signals, timers and the policy gate, with the state machines of the kernel
// API (seed 004).
//
// Every change is a set of events committed to the store before it is
// applied in memory or answered; the in-memory state of live executions is
// the fold of their events, and the same fold rebuilds it at start-up. The
// kernel knows nothing about HTTP or sockets: it hands deliveries for agents
// and runners to a Deliverer and is told by the gateway when they connect.
package kernel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/option"
	"github.com/gatehouse-dev/gatehouse/internal/watch"
	"github.com/gatehouse-dev/gatehouse/kernel/policy"
	"github.com/gatehouse-dev/gatehouse/store"
)

// Peer names one consumer of deliveries: a connection identity of an agent or
// a runner. Deliveries for a consumer survive its reconnects.
type Peer struct {
	Role     string // "agent" or "runner"
	ID       string // agent_id or runner_id
	Consumer string // consumer_id
}

// Peer roles.
const (
	RoleAgent  = "agent"
	RoleRunner = "runner"
)

// Deliverer carries pushes to agents and runners through durable outboxes.
// The gateway implements it.
type Deliverer interface {
	// Stage adds a push for p to b, the batch of the fact that causes it, so
	// both are written atomically. The push reaches p only after Publish.
	// settle, if not empty, names it for Settle.
	Stage(b *store.Batch, p Peer, typ string, data []byte, settle string) Staged
	// Settle acknowledges the push named settle on p's behalf, in batch b;
	// the returned function applies it once b is committed.
	Settle(b *store.Batch, p Peer, settle string) func()
	// Forget drops p's undelivered pushes and ends its connection, if any:
	// the kernel has given up on that consumer.
	Forget(p Peer)
}

// Staged is a push written into a batch that is not committed yet.
type Staged interface {
	// Publish hands the push to its consumer's connection.
	Publish()
	// Abort withdraws it after the batch failed.
	Abort()
}

// Policy decides tool invocations.
type Policy interface {
	Evaluate(in policy.Input) policy.Result
}

// Options configure a Kernel. Zero durations and limits take the values
// of Defaults.
type Options struct {
	Store     *store.Store // required
	Deliverer Deliverer    // required
	Policy    Policy       // nil: the built-in default policy
	Approvals Approvals    // nil: approvals only through the step.approve signal
	Sessions  Sessions     // nil: no durable sessions; session_id only labels executions
	Logger    *slog.Logger

	StepTimeout       time.Duration // step deadline unless policy sets one
	ExecutionTimeout  time.Duration // from creation, in any non-terminal state
	AgentGrace        time.Duration // how long a disconnected agent consumer keeps its executions
	RunnerGrace       time.Duration // how long a disconnected runner consumer keeps its job
	RetryBase         time.Duration // first retry backoff of a remote job
	RetryMax          time.Duration // backoff cap
	RemoteMaxAttempts int           // attempts of a remote step
	MaxSteps          int           // steps per execution
	MaxSignals        int           // unconsumed signals per execution
	MaxLive           int           // non-terminal executions

	// Idempotency-Key of creates: a retried create with the same key (from
	// the same owner) answers with the execution the first one made.
	IdempotencyWindow time.Duration // how long a key is remembered
	IdempotencyKeys   int           // keys remembered at most; the oldest make room
}

// Defaults returns the value each zero duration and limit of Options
// takes; the other fields are zero.
func Defaults() Options {
	return Options{
		StepTimeout:       5 * time.Minute,
		ExecutionTimeout:  time.Hour,
		AgentGrace:        30 * time.Second,
		RunnerGrace:       30 * time.Second,
		RetryBase:         time.Second,
		RetryMax:          30 * time.Second,
		RemoteMaxAttempts: 3,
		MaxSteps:          10000,
		MaxSignals:        1000,
		MaxLive:           100000,
		IdempotencyWindow: 24 * time.Hour,
		IdempotencyKeys:   100000,
	}
}

func (o *Options) defaults() {
	d := Defaults()
	option.Default(&o.StepTimeout, d.StepTimeout)
	option.Default(&o.ExecutionTimeout, d.ExecutionTimeout)
	option.Default(&o.AgentGrace, d.AgentGrace)
	option.Default(&o.RunnerGrace, d.RunnerGrace)
	option.Default(&o.RetryBase, d.RetryBase)
	option.Default(&o.RetryMax, d.RetryMax)
	option.Default(&o.RemoteMaxAttempts, d.RemoteMaxAttempts)
	option.Default(&o.MaxSteps, d.MaxSteps)
	option.Default(&o.MaxSignals, d.MaxSignals)
	option.Default(&o.MaxLive, d.MaxLive)
	option.Default(&o.IdempotencyWindow, d.IdempotencyWindow)
	option.Default(&o.IdempotencyKeys, d.IdempotencyKeys)
	if o.Policy == nil {
		o.Policy = policy.Default()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Kernel runs executions. It is safe for concurrent use.
type Kernel struct {
	opts      Options
	store     *store.Store
	out       Deliverer
	pol       Policy
	approvals Approvals
	sessions  Sessions
	log       *slog.Logger

	// mu guards the maps below. It is never held while waiting for the
	// store or while taking an execution's lock: an execution's lock may be
	// held when taking mu, never the other way round.
	mu      sync.Mutex
	live    map[string]*Execution
	agents  map[string]*agentSet
	runners map[string]*runnerSet
	// runnerOrder caches every runner consumer in (runner, consumer) order
	// for dispatch; nil means it must be rebuilt (membership changed).
	runnerOrder []*runnerConsumer
	queue       []*job // remote jobs waiting for a runner, in arrival order
	rr          map[string]int
	closed      bool
	// reserved maps each tool of a built-in runner to that runner (see
	// Reserve); builtin holds those runners' ids.
	reserved map[string]string
	builtin  map[string]bool

	// watches wakes the readers of execution logs (see Watch).
	watches watch.Set
	// tailMu guards the tails (see tail.go); it is taken before the
	// watches' lock, never after.
	tailMu    sync.Mutex
	tails     map[string]*tail
	tailBytes int

	creates *createKeys // idempotency keys of creates
	retries *retries    // work to try again after a failed commit

	counters counters
	wg       sync.WaitGroup // running effects, so Close can wait for them

	// noLabels is the labels of the list entries of executions without
	// any: a map, as {} is stored and sent where nil would be null, and
	// one for all of them. Never written.
	noLabels map[string]string
}

type counters struct {
	created, completed, failed, cancelled atomic.Uint64
	intents, denied, steps, jobs, retries atomic.Uint64
	events                                atomic.Uint64
}

// New recovers the kernel's state from the store and returns it ready.
func New(ctx context.Context, o Options) (*Kernel, error) {
	if o.Store == nil || o.Deliverer == nil {
		return nil, errors.New("kernel: Options.Store and Options.Deliverer are required")
	}
	o.defaults()
	k := &Kernel{
		opts: o, store: o.Store, out: o.Deliverer, pol: o.Policy, approvals: o.Approvals, sessions: o.Sessions, log: o.Logger,
		live: map[string]*Execution{}, agents: map[string]*agentSet{}, runners: map[string]*runnerSet{},
		rr: map[string]int{}, tails: map[string]*tail{}, reserved: map[string]string{}, builtin: map[string]bool{},
		noLabels: map[string]string{},
		creates:  newCreateKeys(o.IdempotencyWindow, o.IdempotencyKeys),
		retries:  newRetries(),
	}
	k.watches.Idle = k.unwatched
	if err := k.settleLayout(ctx); err != nil {
		return nil, err
	}
	if err := k.recover(ctx); err != nil {
		return nil, fmt.Errorf("kernel: recover: %w", err)
	}
	if err := k.creates.load(ctx, k.store, time.Now()); err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	return k, nil
}

// Close stops timers and waits for running effects. It writes nothing: a
// restart resumes from the log, giving connected peers their grace period.
func (k *Kernel) Close() {
	k.mu.Lock()
	k.closed = true
	live := make([]*Execution, 0, len(k.live))
	for _, ex := range k.live {
		live = append(live, ex)
	}
	for _, as := range k.agents {
		for _, c := range as.consumers {
			c.stopGrace()
		}
	}
	for _, rs := range k.runners {
		for _, c := range rs.consumers {
			c.stopGrace()
		}
	}
	if !k.closedRetries() {
		close(k.retries.stop)
	}
	k.mu.Unlock()
	// Execution locks are taken before k.mu everywhere else, so never
	// while holding it.
	for _, ex := range live {
		ex.mu.Lock()
		ex.stopTimers()
		ex.mu.Unlock()
	}
	k.wg.Wait()
	k.watches.Close()
}

func (k *Kernel) now() time.Time { return time.Now().UTC() }

// Stats is a snapshot of the kernel's gauges and counters, for metrics.
type Stats struct {
	Live, QueuedJobs, AgentsOnline, RunnersOnline, RunnersBusy int
	Created, Completed, Failed, Cancelled                      uint64
	Intents, Denied, Steps, Jobs, Retries, Events              uint64
}

// Stats returns current figures.
func (k *Kernel) Stats() Stats {
	k.mu.Lock()
	s := Stats{Live: len(k.live), QueuedJobs: len(k.queue)}
	for _, as := range k.agents {
		for _, c := range as.consumers {
			if c.online {
				s.AgentsOnline++
			}
		}
	}
	for _, rs := range k.runners {
		for _, c := range rs.consumers {
			if c.online {
				s.RunnersOnline++
			}
			if c.job != nil {
				s.RunnersBusy++
			}
		}
	}
	k.mu.Unlock()
	c := &k.counters
	s.Created, s.Completed, s.Failed, s.Cancelled = c.created.Load(), c.completed.Load(), c.failed.Load(), c.cancelled.Load()
	s.Intents, s.Denied, s.Steps, s.Jobs, s.Retries, s.Events = c.intents.Load(), c.denied.Load(), c.steps.Load(), c.jobs.Load(), c.retries.Load(), c.events.Load()
	return s
}

// Ready reports whether the kernel can take writes.
func (k *Kernel) Ready(ctx context.Context) error { return k.store.Ping(ctx) }

// After is work to run once the caller has answered the request that caused
// it. Pushes that answer a request (a tool.result for a step the intent
// created) must not overtake that request's response: clients register their
// waiters only after reading it. A nil After is valid and does nothing.
type After func()

// Run runs a; it is safe on nil.
func (a After) Run() {
	if a != nil {
		a()
	}
}

// effects collects work for after the response.
type effects []func()

func (e *effects) add(f func()) {
	if f != nil {
		*e = append(*e, f)
	}
}

func (k *Kernel) after(e effects) After {
	if len(e) == 0 {
		return nil
	}
	k.wg.Add(1)
	return func() {
		defer k.wg.Done()
		for _, f := range e {
			f()
		}
	}
}

// spawn runs f in the background unless the kernel is closing; Close waits
// for it.
func (k *Kernel) spawn(f func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return
	}
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		f()
	}()
}

// runNow runs effects that have no response to wait for (timers, connects).
func (k *Kernel) runNow(e effects) { k.after(e).Run() }

// lockLive returns the live execution id, locked. Terminal executions are not
// live; the second result tells whether a finished one exists in the store.
func (k *Kernel) lockLive(id string) (*Execution, error) {
	k.mu.Lock()
	ex := k.live[id]
	k.mu.Unlock()
	if ex == nil {
		return nil, k.finishedOrMissing(id)
	}
	ex.mu.Lock()
	if ex.Status.Terminal() {
		// Finished while we waited for the lock.
		defer ex.mu.Unlock()
		return nil, terminalConflict(ex)
	}
	return ex, nil
}

// finishedOrMissing builds the error for an execution that is not live.
func (k *Kernel) finishedOrMissing(id string) error {
	sum, err := k.summary(id)
	if err != nil {
		return err
	}
	e := newErr(ErrConflict, "execution is in terminal state: execution %s is already %s", id, sum.Status)
	e.Details = map[string]any{"status": sum.Status}
	return e
}

func (k *Kernel) summary(id string) (*Summary, error) {
	var key string
	if err := k.store.Get(kindExec, indexKey(id), &key); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, notFound("execution", id)
		}
		return nil, newErr(ErrUnavailable, "service unavailable: %v", err)
	}
	var sum Summary
	if err := k.store.Get(kindExec, key, &sum); err != nil {
		return nil, newErr(ErrUnavailable, "service unavailable: %v", err)
	}
	return &sum, nil
}

// finish drops a terminal execution from memory; its state stays in the store.
func (k *Kernel) finish(ex *Execution) {
	ex.stopTimers()
	k.mu.Lock()
	delete(k.live, ex.ID)
	k.dropQueuedLocked(ex.ID)
	if as := k.agents[ex.AgentID]; as != nil {
		as.removePending(ex.ID)
		if ex.Lease != nil {
			if c := as.consumers[ex.Lease.ConsumerID]; c != nil {
				delete(c.leases, ex.ID)
			}
		}
	}
	k.mu.Unlock()
	switch ex.Status {
	case StatusCompleted:
		k.counters.completed.Add(1)
	case StatusFailed:
		k.counters.failed.Add(1)
	case StatusCancelled:
		k.counters.cancelled.Add(1)
	}
}

func (ex *Execution) stopTimers() {
	if ex.timer != nil {
		ex.timer.Stop()
		ex.timer = nil
	}
	for _, st := range ex.Steps {
		st.stopTimer()
		st.stopExpiry()
	}
}

func (st *Step) stopTimer() {
	if st.timer != nil {
		st.timer.Stop()
		st.timer = nil
	}
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Live reports whether execution id is live (exists and is not terminal).
func (k *Kernel) Live(id string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.live[id]
	return ok
}

// Epoch identifies the store's lifetime; cursors carry it so that a cursor
// from a wiped store is recognised.
func (k *Kernel) Epoch() string { return k.store.Epoch() }
