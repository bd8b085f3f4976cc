package kernel

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/segmentio/encoding/json"
)

// kindLive holds id -> nothing, for every non-terminal execution: written
// lazily, read at start-up. The other records of executions are in
// kindExec (keys.go).
const kindLive = "live"

func streamOf(execID string) string { return "x/" + execID }

// Meta describes the request that writes a transaction's events.
type Meta struct {
	// TraceID is the W3C trace id from the request's traceparent header.
	TraceID string
	// IdempotencyKey is the producer's key for the request.
	IdempotencyKey string
	// Principal is who made the request (the token's subject). An
	// execution it creates is owned by it: kernel records keep the owner as
	// plain strings; the gateway decides what an owner may do.
	Principal string
	// Tenant is the principal's tenant, stored with the owner.
	Tenant string
}

// tx collects the events and records of one change to one execution. The
// caller holds ex.mu from begin to commit, so sequences are assigned in order.
type tx struct {
	k      *Kernel
	ex     *Execution
	meta   Meta
	now    time.Time
	batch  store.Batch
	facts  []fact
	first  string
	prev   string
	err    error
	seq    uint64
	staged []Staged
	// events are the stored forms of the events added, for the tail.
	events []tailEntry
	// buf is the free room of the buffer the stored forms are encoded in,
	// one for the events of a transaction rather than two (the payload,
	// then the event) for each. Only ever appended to past the events
	// already in it, whose slices are capped at their length: the store
	// and the tail keep them.
	buf []byte
	// Room for the facts and events of a usual transaction (up to three
	// events), so that adding them allocates nothing.
	factsRoom  [3]fact
	eventsRoom [3]tailEntry
	// applied runs right after a successful commit, before the answer:
	// in-memory views of what the batch wrote (settled pushes, records).
	applied []func()
	// aborted runs when the commit fails: undo in-memory reservations.
	aborted []func()
}

// onAbort adds f to what runs when the commit fails.
func (t *tx) onAbort(f func()) { t.aborted = append(t.aborted, f) }

func (t *tx) abort() {
	for _, s := range t.staged {
		s.Abort()
	}
	for _, f := range t.aborted {
		f()
	}
}

// push stages a push to p in the transaction's batch. It reaches p once the
// caller runs publish (after its response, when the push answers a request).
func (t *tx) push(p Peer, typ string, payload any, settle string) {
	if t.err != nil {
		return
	}
	data, err := json.Marshal(payload)
	if err != nil {
		t.err = fmt.Errorf("encode %s push: %w", typ, err)
		return
	}
	t.staged = append(t.staged, t.k.out.Stage(&t.batch, p, typ, data, settle))
}

// settlePush acknowledges, for p, the push named key (a runner acted on its job).
func (t *tx) settlePush(p Peer, key string) {
	if p.Consumer == "" || key == "" {
		return
	}
	t.onCommit(t.k.out.Settle(&t.batch, p, key))
}

// onCommit adds f to what runs right after a successful commit.
func (t *tx) onCommit(f func()) {
	if f != nil {
		t.applied = append(t.applied, f)
	}
}

// publish returns the function that hands the committed pushes to their
// consumers, or nil when there are none.
func (t *tx) publish() func() {
	if len(t.staged) == 0 {
		return nil
	}
	staged := t.staged
	return func() {
		for _, s := range staged {
			s.Publish()
		}
	}
}

func (k *Kernel) begin(ex *Execution, meta Meta) *tx {
	if meta.TraceID == "" {
		meta.TraceID = ex.TraceID
	}
	t := &tx{k: k, ex: ex, meta: meta, now: k.now(), seq: ex.Seq}
	t.facts, t.events = t.factsRoom[:0], t.eventsRoom[:0]
	return t
}

// eventsBufSize is the size of a buffer for stored events. Most events
// take 100 to 250 bytes: it holds those of most transactions, and wastes
// little of the ones with a single event.
const eventsBufSize = 512

// jsonFlags are those of json.Marshal: a payload's bytes are what
// Marshal would give.
const jsonFlags = json.EscapeHTML | json.SortMapKeys

// add appends an event; payload is one of the typed payload structs.
func (t *tx) add(typ, stepID string, payload any) {
	t.addWith(typ, stepID, "", payload)
}

// addWith is add with an action id for events about a human decision.
func (t *tx) addWith(typ, stepID, actionID string, payload any) {
	if t.err != nil {
		return
	}
	seq := t.seq + 1
	id := event.NewID()
	first, cause := t.first, t.prev
	if first == "" {
		first, cause = id, id
	}
	ev := event.Event{
		ID: id, ExecutionID: t.ex.ID, StepID: stepID, Type: typ,
		SchemaVersion: event.SchemaVersion, Timestamp: t.now,
		CausationID: cause, CorrelationID: first, IdempotencyKey: t.meta.IdempotencyKey,
		Sequence: seq, EventID: id, SessionID: t.ex.SessionID, RunID: t.ex.ID,
		ActionID: actionID, TraceID: t.meta.TraceID,
	}
	if stepID != "" {
		ev.ToolCallID = stepID
	}
	// Logs keep the compact stored form (a third of the JSON form's bytes):
	// every byte written passes through the journal, Badger's memory table
	// and its compactions. Its ids and references take at most about 200
	// bytes: a new buffer is started when those might not fit. The
	// payload ends the stored form, so it is encoded in place after the
	// rest (the stored form of an event without a payload); one that does
	// not fit moves this event, alone, to a larger buffer.
	b := t.buf
	if need := 200 + len(ev.IdempotencyKey) + len(ev.SessionID); cap(b) < need {
		b = make([]byte, 0, max(need, eventsBufSize))
	}
	b = ev.AppendStored(b)
	b, err := json.Append(b, payload, jsonFlags)
	if err != nil {
		t.err = invalid("%s payload: %v", typ, err)
		return
	}
	raw := b[:len(b):len(b)]
	t.buf = b[len(b):]
	t.seq, t.first, t.prev = seq, first, id
	t.batch.Append(t.ex.streamKey(), t.seq, raw)
	t.events = append(t.events, tailEntry{seq: t.seq, raw: raw})
	t.facts = append(t.facts, fact{typ: typ, stepID: stepID, at: t.now, seq: t.seq, payload: payload})
}

// remember stores the answer to an idempotent request in the same batch as
// its effects, so a retry can never see the effects without the answer.
func (t *tx) remember(key string, rec idemRecord) {
	if key == "" || t.err != nil {
		return
	}
	if err := t.batch.PutLazy(kindExec, idemKey(t.ex.ID, key), rec); err != nil {
		t.err = err
		return
	}
	ex := t.ex
	t.onCommit(func() {
		if ex.idem == nil {
			ex.idem = map[string]idemRecord{}
		}
		ex.idem[key] = rec
	})
}

// commit makes the transaction durable and then applies it to memory. On
// error nothing was applied and, as far as the store can tell, nothing written.
func (t *tx) commit(ctx context.Context) error {
	return t.commitWith(ctx, nil)
}

// commitWith commits t and, when other is not nil, other (a change to
// another execution, whose lock the caller also holds) in one store write:
// both are durable, and applied, or neither is.
func (t *tx) commitWith(ctx context.Context, other *tx) error {
	txs := []*tx{t}
	if other != nil {
		txs = append(txs, other)
	}
	var batch *store.Batch
	for _, x := range txs {
		empty, err := x.prepare()
		if err != nil {
			for _, y := range txs {
				y.abort()
			}
			return err
		}
		switch {
		case empty:
		case batch == nil:
			batch = &x.batch
		default:
			batch.Merge(&x.batch)
		}
	}
	if batch == nil {
		return nil
	}
	filed := t.k.stageSessions(batch, txs)
	err := t.k.store.Write(ctx, batch)
	if err == nil {
		// Into the tails before the sessions show the items that refer to
		// these events: a reader of a session resolves them there.
		for _, x := range txs {
			t.k.keepTail(x.ex.ID, x.events)
		}
	}
	filed(err == nil)
	if err != nil {
		for _, x := range txs {
			x.abort()
		}
		if errors.Is(err, ErrStorageFull) {
			return err // the store logs its changes of state once
		}
		t.k.logCommitFailure("commit failed", t.ex.ID, err)
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return newErr(ErrUnavailable, "service unavailable: %v", err)
		}
		return newErr(ErrUnavailable, "service unavailable: store write failed")
	}
	for _, x := range txs {
		x.finish()
	}
	return nil
}

// prepare adds the execution's list records to the batch. It reports a
// transaction with nothing to write as empty.
func (t *tx) prepare() (empty bool, err error) {
	if t.err != nil {
		return false, t.err
	}
	if len(t.facts) == 0 && t.batch.Len() == 0 {
		return true, nil
	}
	ex := t.ex
	// Fold into a scratch copy of the header first to learn the new summary.
	status := ex.Status
	for _, f := range t.facts {
		status = nextStatus(status, f.typ)
	}
	sum := Summary{
		ID: ex.ID, Status: status, AgentID: ex.AgentID, Labels: ex.Labels,
		CreatedAt: ex.CreatedAt, UpdatedAt: t.now, SessionID: ex.SessionID, Seq: t.seq,
		Owner: ex.Owner, Tenant: ex.Tenant,
	}
	if ex.Seq == 0 {
		sum.CreatedAt = t.now
		if p, ok := t.facts[0].payload.(*createdPayload); ok {
			sum.AgentID, sum.Labels, sum.Owner, sum.Tenant = p.AgentID, p.Labels, p.Owner, p.Tenant
		}
		key := summaryKey(sum.CreatedAt, ex.ID)
		if err := t.batch.CreateLazy(kindExec, indexKey(ex.ID), key); err != nil {
			return false, err
		}
		// Created, not put: the id is new, so an execution that ends before
		// Badger gets its marker leaves Badger nothing, not even a delete.
		if err := t.batch.CreateLazy(kindLive, ex.ID, true); err != nil {
			return false, err
		}
	}
	// The stored entry changes only with the status: between changes List
	// reads a live execution's entry from memory, and a restart rebuilds it
	// from the log. Rewriting it on every change cost five versions per
	// execution in Badger instead of two.
	if ex.Seq == 0 || status != ex.Status {
		if sum.Labels == nil {
			sum.Labels = t.k.noLabels
		}
		put := t.batch.PutLazy
		if ex.Seq == 0 {
			put = t.batch.CreateLazy
		}
		if err := put(kindExec, summaryKey(sum.CreatedAt, ex.ID), &sum); err != nil {
			return false, err
		}
	}
	if status.Terminal() && !ex.Status.Terminal() {
		t.batch.DeleteLazy(kindLive, ex.ID)
	}
	return false, nil
}

// finish applies a committed transaction to memory.
func (t *tx) finish() {
	for _, f := range t.facts {
		t.ex.apply(f)
	}
	for _, apply := range t.applied {
		apply()
	}
	if len(t.facts) > 0 {
		t.ex.row.Store(t.ex.summary(t.k.noLabels))
		t.k.notify(t.ex.ID, t.ex.Status.Terminal())
		t.k.counters.events.Add(uint64(len(t.facts)))
	}
}

// nextStatus is the status a fact moves an execution to.
func nextStatus(s Status, typ string) Status {
	switch typ {
	case event.ExecutionCreated, event.ExecutionReset:
		return StatusPending
	case event.ExecutionStarted, event.ExecutionResumed:
		return StatusRunning
	case event.ExecutionBlocked:
		return StatusBlocked
	case event.ExecutionCompleted:
		return StatusCompleted
	case event.ExecutionFailed:
		return StatusFailed
	case event.ExecutionCancelled:
		return StatusCancelled
	}
	return s
}

// idemRecord is the stored answer to a request that carried an idempotency key.
type idemRecord struct {
	Hash   string          `msgpack:"h"`
	Result json.RawMessage `msgpack:"r"`
	// At is when it was written, for the records that expire (creates').
	At time.Time `msgpack:"t,omitempty"`
}
