package session

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/store"
)

// Start gives the registry the kernel that runs its turns, and starts what
// should be running: a turn due to start when the gateway stopped (its
// thread's previous execution ended, or it was submitted, just before).
func (r *Registry) Start(ctx context.Context, k Kernel) error {
	r.mu.Lock()
	r.k = k
	r.mu.Unlock()
	var due []Turn
	var gerr error
	err := store.EachRecord(ctx, r.st, kindSession, "", func(id string, s *Session) bool {
		for _, th := range s.Threads {
			if th.Active == "" {
				continue
			}
			var t Turn
			if gerr = r.st.Get(kindTurn, id+"/"+th.Active, &t); gerr != nil {
				return false
			}
			if t.ExecutionID == "" && t.Status == TurnRunning {
				due = append(due, t)
			}
		}
		return true
	})
	if err == nil {
		err = gerr
	}
	if err != nil {
		return fmt.Errorf("session: start: %w", err)
	}
	for _, t := range due {
		r.startTurn(t)
	}
	if len(due) > 0 {
		r.log.Info("session: restarted due turns", "count", len(due))
	}
	return nil
}

// SubmitRequest is a turn to submit.
type SubmitRequest struct {
	SessionID string
	// ThreadID is the thread to submit on; empty means the session's
	// first thread.
	ThreadID string
	// TurnID, when given, makes the submission idempotent: the same id with
	// the same input returns the turn submitted first.
	TurnID string
	Input  json.RawMessage
	// Ask lists tools a person must allow before each call in the turn's
	// execution.
	Ask []string
}

// Submit submits a turn. It runs at once as an execution of the session's
// agent when its thread is idle; otherwise it waits in the thread's queue.
func (r *Registry) Submit(ctx context.Context, req SubmitRequest) (Turn, error) {
	if req.TurnID != "" {
		if err := validID("turn id", req.TurnID); err != nil {
			return Turn{}, err
		}
	}
	b, err := r.book(ctx, req.SessionID)
	if err != nil {
		return Turn{}, err
	}
	b.mu.Lock()
	if req.TurnID != "" {
		if t, err := r.Turn(ctx, req.SessionID, req.TurnID); err == nil {
			b.mu.Unlock()
			if !bytes.Equal(t.Input, req.Input) && !jsonEqual(t.Input, req.Input) {
				return Turn{}, fmt.Errorf("%w: turn %s was submitted with other input", ErrConflict, req.TurnID)
			}
			return t, nil
		}
	}
	if err := r.st.Admit(); err != nil {
		b.mu.Unlock()
		return Turn{}, err // short of room: new work waits
	}
	t, start, err := r.submitLocked(ctx, b, req)
	b.mu.Unlock()
	if err != nil {
		return Turn{}, err
	}
	if start {
		r.startTurn(t)
	}
	return t, nil
}

func (r *Registry) submitLocked(ctx context.Context, b *book, req SubmitRequest) (Turn, bool, error) {
	s := &b.sess
	if !b.saved {
		return Turn{}, false, fmt.Errorf("%w: session %s", ErrNotFound, b.id)
	}
	if s.Status == StatusArchived {
		return Turn{}, false, fmt.Errorf("%w: session %s takes no new turns", ErrArchived, b.id)
	}
	if s.AgentID == "" {
		return Turn{}, false, fmt.Errorf("%w: session %s has no agent to run turns", ErrInvalid, b.id)
	}
	threadID := req.ThreadID
	if threadID == "" && len(s.Threads) > 0 {
		threadID = s.Threads[0].ID
	}
	th := s.thread(threadID)
	if th == nil {
		return Turn{}, false, fmt.Errorf("%w: thread %s of session %s", ErrNotFound, threadID, b.id)
	}
	if len(th.Queue) >= maxQueue {
		return Turn{}, false, fmt.Errorf("%w: thread %s already has %d queued turns", ErrConflict, threadID, maxQueue)
	}
	id := req.TurnID
	if id == "" {
		id = event.NewID()
	}
	t := Turn{ID: id, SessionID: b.id, ThreadID: threadID, Status: TurnQueued, Input: req.Input, Ask: req.Ask, Submitted: time.Now().UTC()}
	start := th.Active == ""
	err := r.write(ctx, b, func(a *appender, s *Session) error {
		t.Submitted, t.FirstSeq = a.at, a.next
		th := s.thread(threadID)
		if err := a.fact(FactTurnSubmitted, threadID, t.ID, &TurnFact{TurnID: t.ID, ThreadID: threadID, Input: t.Input}); err != nil {
			return err
		}
		if start {
			// It starts at once: the thread is its until its execution ends.
			t.Status, th.Active, th.Status = TurnRunning, t.ID, ThreadRunning
		} else {
			th.Queue = append(th.Queue, t.ID)
			if err := a.fact(FactQueueChanged, threadID, t.ID, &QueueFact{ThreadID: threadID, Queued: th.Queue, Reason: "submitted", TurnID: t.ID}); err != nil {
				return err
			}
		}
		return a.batch.Put(kindTurn, b.id+"/"+t.ID, &t)
	})
	if err != nil {
		return Turn{}, false, err
	}
	return t, start, nil
}

// startTurn runs turn t as an execution of its session's agent, in the
// background: a turn whose execution cannot be made fails, and its thread
// goes on with the next.
func (r *Registry) startTurn(t Turn) {
	r.mu.Lock()
	k, closed := r.k, r.closed
	if k != nil && !closed {
		r.wg.Add(1)
	}
	r.mu.Unlock()
	if k == nil || closed {
		return // Start (re)starts it
	}
	go func() {
		defer r.wg.Done()
		ctx := context.Background()
		b, err := r.book(ctx, t.SessionID)
		if err != nil {
			r.log.Warn("session: turn not started", "session", t.SessionID, "turn", t.ID, "err", err)
			return
		}
		b.mu.Lock()
		s := b.sess.clone()
		b.mu.Unlock()
		for wait := time.Second; ; wait = min(2*wait, maxStartWait) {
			changed := r.st.SpaceChanged()
			_, _, err = k.Create(ctx, kernel.CreateRequest{
				AgentID: s.AgentID, Input: t.Input, SessionID: t.SessionID, ThreadID: t.ThreadID, TurnID: t.ID, Ask: t.Ask,
			}, kernel.Meta{Principal: s.Owner, Tenant: s.Tenant})
			if !errors.Is(err, kernel.ErrStorageFull) {
				break
			}
			// Short of room, new work waits: so does the turn, as it
			// would in its queue, rather than fail; a restart starts it
			// too. The store logs its changes of state.
			select {
			case <-time.After(wait):
			case <-changed:
			case <-r.closing:
				return
			}
		}
		if err != nil {
			r.log.Warn("session: turn failed to start", "session", t.SessionID, "turn", t.ID, "err", err)
			r.endTurn(ctx, b, t.ThreadID, t.ID, TurnFailed, "could not start: "+err.Error())
		}
	}()
}

// maxStartWait bounds the wait between tries to start a turn while the
// store is short of room.
const maxStartWait = 30 * time.Second

// endTurn ends a turn that has no execution (it could not start), and
// starts the next of its thread.
func (r *Registry) endTurn(ctx context.Context, b *book, threadID, turnID string, status TurnStatus, reason string) {
	b.mu.Lock()
	var next *Turn
	err := r.write(ctx, b, func(a *appender, s *Session) error {
		var err error
		next, err = r.finishTurn(a, s, threadID, turnID, status, reason)
		return err
	})
	b.mu.Unlock()
	if err != nil {
		r.log.Warn("session: turn not ended", "session", b.id, "turn", turnID, "err", err)
		return
	}
	if next != nil {
		r.startTurn(*next)
	}
}

// finishTurn appends the end of turn turnID and hands its thread to the
// next queued turn, if any, which it returns (to be started once durable).
func (r *Registry) finishTurn(a *appender, s *Session, threadID, turnID string, status TurnStatus, reason string) (*Turn, error) {
	var t Turn
	if err := r.st.Get(kindTurn, s.ID+"/"+turnID, &t); err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	t.ID, t.SessionID, t.ThreadID = turnID, s.ID, threadID
	t.Status, t.Ended = status, a.at
	if status == TurnFailed {
		t.Error = reason
	}
	typ := map[TurnStatus]string{TurnCompleted: FactTurnCompleted, TurnFailed: FactTurnFailed, TurnCancelled: FactTurnCancelled}[status]
	if err := a.fact(typ, threadID, turnID, &TurnFact{TurnID: turnID, ThreadID: threadID, ExecutionID: t.ExecutionID, Error: t.Error, Reason: reason}); err != nil {
		return nil, err
	}
	if err := a.batch.Put(kindTurn, s.ID+"/"+turnID, &t); err != nil {
		return nil, err
	}
	th := s.thread(threadID)
	if th == nil || th.Active != turnID {
		return nil, nil
	}
	th.Active, th.Status = "", ThreadIdle
	if len(th.Queue) == 0 || s.Status == StatusArchived {
		return nil, nil
	}
	var next Turn
	if err := r.st.Get(kindTurn, s.ID+"/"+th.Queue[0], &next); err != nil {
		return nil, fmt.Errorf("session: next turn: %w", err)
	}
	th.Queue = th.Queue[1:]
	next.Status, th.Active, th.Status = TurnRunning, next.ID, ThreadRunning
	if err := a.fact(FactQueueChanged, threadID, next.ID, &QueueFact{ThreadID: threadID, Queued: th.Queue, Reason: "started", TurnID: next.ID}); err != nil {
		return nil, err
	}
	if err := a.batch.Put(kindTurn, s.ID+"/"+next.ID, &next); err != nil {
		return nil, err
	}
	return &next, nil
}

// Open admits an execution to a session (kernel.Sessions): the session is
// made for the execution's owner if it does not exist. An execution that
// runs a turn of the registry keeps that turn; any other (made through the
// execution API) gets a turn of its own on a new thread, so that it never
// waits behind a queue it did not join.
func (r *Registry) Open(ctx context.Context, o kernel.Opening) (string, string, error) {
	if err := validID("session id", o.SessionID); err != nil {
		return "", "", err
	}
	b, err := r.book(ctx, o.SessionID)
	if errors.Is(err, ErrNotFound) {
		if err := r.roomFor(o.Tenant, o.Owner); err != nil {
			return "", "", err
		}
		now := time.Now().UTC()
		nb := &book{id: o.SessionID, opened: map[string]*opening{}, sess: Session{
			ID: o.SessionID, Title: DefaultTitle, Source: "api", Status: StatusActive, Owner: o.Owner, Tenant: o.Tenant,
			AgentID: o.AgentID, Created: now, Updated: now,
			Threads: []Thread{{ID: DefaultThread, Status: ThreadIdle, Created: now}},
		}}
		r.mu.Lock()
		if b = r.books[o.SessionID]; b == nil {
			b = nb
			r.books[o.SessionID] = b
		}
		r.mu.Unlock()
		err = nil
	}
	if err != nil {
		return "", "", err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sess.Status == StatusArchived {
		return "", "", fmt.Errorf("%w: session %s takes no new executions", ErrArchived, o.SessionID)
	}
	if o.TurnID != "" {
		b.opened[o.ExecutionID] = &opening{thread: o.ThreadID}
		return o.ThreadID, o.TurnID, nil
	}
	thread := "x-" + o.ExecutionID
	turn := &Turn{ID: event.NewID(), SessionID: o.SessionID, ThreadID: thread, Status: TurnRunning, Input: o.Input}
	b.opened[o.ExecutionID] = &opening{thread: thread, newThread: true, turn: turn}
	return thread, turn.ID, nil
}

// Stage files transactions of executions of session id in batch
// (kernel.Sessions). It holds the session's log until done runs.
func (r *Registry) Stage(batch *store.Batch, id string, fs []kernel.Filing) func(bool) {
	b, err := r.book(context.Background(), id)
	if err != nil {
		// Open made the book; only a registry that lost it could get here.
		r.log.Error("session: filing for an unknown session", "session", id, "err", err)
		return func(bool) {}
	}
	b.mu.Lock()
	sealed := r.sealInto(batch, b)
	s := b.sess.clone()
	a := &appender{id: id, batch: batch, next: b.last + 1, at: time.Now().UTC()}
	if sealed != nil {
		a.next = sealed.last() + 1
	}
	var (
		next    []Turn
		opened  []string
		changed = !b.saved
		fresh   = !b.saved
		err2    error
	)
	if !b.saved {
		s.Created = a.at
		err2 = r.created(a, &s)
	}
	for _, f := range fs {
		if err2 != nil {
			break
		}
		if op := b.opened[f.ExecutionID]; op != nil && f.First == 1 {
			opened = append(opened, f.ExecutionID)
			changed = true
			err2 = r.fileStart(a, &s, op, f)
		}
		if err2 == nil {
			a.pointer(f.ThreadID, f.TurnID, f.ExecutionID, f.First, f.Last)
		}
		if err2 == nil && f.Ended != "" {
			changed = true
			var nt *Turn
			nt, err2 = r.finishTurn(a, &s, f.ThreadID, f.TurnID, turnStatus(f.Ended), string(f.Ended))
			if nt != nil {
				next = append(next, *nt)
			}
		}
	}
	if err2 == nil && changed {
		s.Updated = a.at
		err2 = batch.Put(kindSession, id, &s)
	}
	if err2 != nil {
		// The batch cannot be taken back: the kernel's write goes on, and
		// the session's log misses these events. Say so loudly.
		r.log.Error("session: filing failed", "session", id, "err", err2)
	}
	last := a.next - 1
	return func(committed bool) {
		defer b.mu.Unlock()
		for _, x := range opened {
			delete(b.opened, x)
		}
		if !committed {
			r.unseal(b, sealed)
			return
		}
		r.committed(b, sealed, last)
		if changed {
			b.sess, b.saved = s, true
		}
		if fresh && err2 == nil {
			r.counted(s.Tenant, s.Owner)
		}
		r.notify(id)
		for _, t := range next {
			r.startTurn(t)
		}
	}
}

// fileStart appends what the first transaction of an execution starts: a
// new thread and an implicit turn for an execution made through the
// execution API, and the turn's start.
func (r *Registry) fileStart(a *appender, s *Session, op *opening, f kernel.Filing) error {
	if op.newThread && s.thread(op.thread) == nil {
		s.Threads = append(s.Threads, Thread{ID: op.thread, Status: ThreadRunning, Active: f.TurnID, Created: a.at})
		if err := a.fact(FactThreadStarted, op.thread, "", &ThreadFact{ThreadID: op.thread}); err != nil {
			return err
		}
	}
	t := op.turn
	if t == nil {
		t = &Turn{}
		if err := r.st.Get(kindTurn, s.ID+"/"+f.TurnID, t); err != nil {
			return fmt.Errorf("session: turn %s: %w", f.TurnID, err)
		}
	} else {
		t.Submitted, t.FirstSeq = a.at, a.next
		if err := a.fact(FactTurnSubmitted, t.ThreadID, t.ID, &TurnFact{TurnID: t.ID, ThreadID: t.ThreadID, Input: t.Input}); err != nil {
			return err
		}
	}
	t.Status, t.ExecutionID, t.Started = TurnRunning, f.ExecutionID, a.at
	if err := a.fact(FactTurnStarted, t.ThreadID, t.ID, &TurnFact{TurnID: t.ID, ThreadID: t.ThreadID, ExecutionID: f.ExecutionID}); err != nil {
		return err
	}
	return a.batch.Put(kindTurn, s.ID+"/"+t.ID, t)
}

func turnStatus(s kernel.Status) TurnStatus {
	switch s {
	case kernel.StatusCompleted:
		return TurnCompleted
	case kernel.StatusCancelled:
		return TurnCancelled
	}
	return TurnFailed
}

// Interrupt cancels the execution running on a thread of session id (its
// first when threadID is empty). The queue is kept: the next turn starts.
func (r *Registry) Interrupt(ctx context.Context, id, threadID string) (Turn, error) {
	b, err := r.book(ctx, id)
	if err != nil {
		return Turn{}, err
	}
	b.mu.Lock()
	s := b.sess.clone()
	b.mu.Unlock()
	if threadID == "" && len(s.Threads) > 0 {
		threadID = s.Threads[0].ID
	}
	th := s.thread(threadID)
	if th == nil {
		return Turn{}, fmt.Errorf("%w: thread %s of session %s", ErrNotFound, threadID, id)
	}
	if th.Active == "" {
		return Turn{}, fmt.Errorf("%w: thread %s runs no turn", ErrConflict, threadID)
	}
	t, err := r.Turn(ctx, id, th.Active)
	if err != nil {
		return Turn{}, err
	}
	if t.ExecutionID == "" {
		return Turn{}, fmt.Errorf("%w: turn %s is still starting", ErrConflict, t.ID)
	}
	r.mu.Lock()
	k := r.k
	r.mu.Unlock()
	if k == nil {
		return Turn{}, ErrClosed
	}
	if _, err := k.Cancel(ctx, t.ExecutionID, kernel.Meta{Principal: s.Owner, Tenant: s.Tenant}); err != nil && !errors.Is(err, kernel.ErrConflict) {
		return Turn{}, err
	}
	return r.Turn(ctx, id, t.ID)
}

// RemoveQueued takes a queued turn out of its thread's queue; it ends
// cancelled.
func (r *Registry) RemoveQueued(ctx context.Context, id, turnID string) error {
	return r.requeue(ctx, id, turnID, func(q []string, i int) []string { return slices.Delete(q, i, i+1) }, "removed")
}

// Promote moves a queued turn to the head of its thread's queue.
func (r *Registry) Promote(ctx context.Context, id, turnID string) error {
	return r.requeue(ctx, id, turnID, func(q []string, i int) []string {
		t := q[i]
		return append([]string{t}, slices.Delete(q, i, i+1)...)
	}, "promoted")
}

func (r *Registry) requeue(ctx context.Context, id, turnID string, change func([]string, int) []string, reason string) error {
	b, err := r.book(ctx, id)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var thread string
	for _, th := range b.sess.Threads {
		if slices.Contains(th.Queue, turnID) {
			thread = th.ID
		}
	}
	if thread == "" {
		return fmt.Errorf("%w: turn %s is not queued in session %s", ErrConflict, turnID, id)
	}
	return r.write(ctx, b, func(a *appender, s *Session) error {
		th := s.thread(thread)
		th.Queue = change(th.Queue, slices.Index(th.Queue, turnID))
		if err := a.fact(FactQueueChanged, thread, turnID, &QueueFact{ThreadID: thread, Queued: th.Queue, Reason: reason, TurnID: turnID}); err != nil {
			return err
		}
		if reason != "removed" {
			return nil
		}
		var t Turn
		if err := r.st.Get(kindTurn, id+"/"+turnID, &t); err != nil {
			return err
		}
		t.Status, t.Ended = TurnCancelled, a.at
		if err := a.fact(FactTurnCancelled, thread, turnID, &TurnFact{TurnID: turnID, ThreadID: thread, Reason: "removed from the queue"}); err != nil {
			return err
		}
		return a.batch.Put(kindTurn, id+"/"+turnID, &t)
	})
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	ax, _ := json.Marshal(x)
	by, _ := json.Marshal(y)
	return bytes.Equal(ax, by)
}

// Resume makes a thread of session id go on when it can: an idle thread
// with queued turns starts the first (a session archived with turns queued
// keeps them until it is resumed like this). It returns the thread.
func (r *Registry) Resume(ctx context.Context, id, threadID string) (Thread, error) {
	b, err := r.book(ctx, id)
	if err != nil {
		return Thread{}, err
	}
	b.mu.Lock()
	if threadID == "" && len(b.sess.Threads) > 0 {
		threadID = b.sess.Threads[0].ID
	}
	th := b.sess.thread(threadID)
	if th == nil {
		b.mu.Unlock()
		return Thread{}, fmt.Errorf("%w: thread %s of session %s", ErrNotFound, threadID, id)
	}
	if th.Active != "" || len(th.Queue) == 0 {
		cur := *th
		b.mu.Unlock()
		return cur, nil
	}
	var next Turn
	err = r.write(ctx, b, func(a *appender, s *Session) error {
		th := s.thread(threadID)
		if err := r.st.Get(kindTurn, id+"/"+th.Queue[0], &next); err != nil {
			return err
		}
		th.Queue = th.Queue[1:]
		next.Status, th.Active, th.Status = TurnRunning, next.ID, ThreadRunning
		if err := a.fact(FactQueueChanged, threadID, next.ID, &QueueFact{ThreadID: threadID, Queued: th.Queue, Reason: "resumed", TurnID: next.ID}); err != nil {
			return err
		}
		return a.batch.Put(kindTurn, id+"/"+next.ID, &next)
	})
	cur := *b.sess.thread(threadID)
	b.mu.Unlock()
	if err != nil {
		return Thread{}, err
	}
	r.startTurn(next)
	return cur, nil
}
