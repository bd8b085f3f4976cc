package session

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/watch"
	"github.com/gatehouse-dev/gatehouse/store"
)

// Fact types of a session's log. They name what happened in this
// package's terms; each surface renders them in its own.
const (
	FactSessionCreated = "session.created"
	FactSessionUpdated = "session.updated"
	FactThreadStarted  = "thread.started"
	FactTurnSubmitted  = "turn.submitted"
	FactTurnStarted    = "turn.started"
	FactTurnCompleted  = "turn.completed"
	FactTurnFailed     = "turn.failed"
	FactTurnCancelled  = "turn.cancelled"
	FactQueueChanged   = "queue.changed"
	// FactOutput is what an agent said: its payload is an OutputFact.
	// Deltas are items of their own kind (KindDelta).
	FactOutput = "output"
)

// ItemKind says what an item of a session's log is.
type ItemKind uint8

// The kinds of items.
const (
	// KindFact is a session fact: its Type and Data say which.
	KindFact ItemKind = iota
	// KindEvent refers to an event of an execution filed in the session:
	// ExecutionID and ExecutionSeq name it in that execution's log.
	KindEvent
	// KindDelta is one delta of text or reasoning an agent streamed: Type
	// is the output kind (text_delta or reasoning_delta), Text the delta.
	KindDelta
)

// Item is one sequence of a session's log.
type Item struct {
	Seq          uint64
	Kind         ItemKind
	Type         string
	At           time.Time
	ThreadID     string
	TurnID       string
	ExecutionID  string
	ExecutionSeq uint64
	Data         json.RawMessage
	Text         string
}

// Payloads of facts, as their Data holds them.
type (
	// SessionFact is the payload of session.created and session.updated.
	SessionFact struct {
		Title   string `json:"title"`
		Source  string `json:"source"`
		Status  Status `json:"status"`
		AgentID string `json:"agent_id,omitempty"`
		// Changed names what an update changed ("status", "title", or the
		// surface whose attributes changed); attribute values never enter
		// the log, they may hold secrets.
		Changed []string `json:"changed,omitempty"`
	}
	// ThreadFact is the payload of thread.started.
	ThreadFact struct {
		ThreadID string `json:"thread_id"`
	}
	// TurnFact is the payload of the turn.* facts.
	TurnFact struct {
		TurnID      string          `json:"turn_id"`
		ThreadID    string          `json:"thread_id"`
		Input       json.RawMessage `json:"input,omitempty"`
		ExecutionID string          `json:"execution_id,omitempty"`
		Error       string          `json:"error,omitempty"`
		Reason      string          `json:"reason,omitempty"`
	}
	// QueueFact is the payload of queue.changed: the thread's queue after
	// the change.
	QueueFact struct {
		ThreadID string   `json:"thread_id"`
		Queued   []string `json:"queued"`
		Reason   string   `json:"reason"`
		TurnID   string   `json:"turn_id,omitempty"`
	}
	// OutputFact is the payload of output: a whole text, reasoning,
	// status line or checkpoint.
	OutputFact struct {
		Kind        string          `json:"kind"`
		Text        string          `json:"text"`
		Data        json.RawMessage `json:"data,omitempty"`
		ExecutionID string          `json:"execution_id,omitempty"`
	}
)

// entry is the stored form of one entry of a session's log. An entry may
// cover several sequences (a pointer to a transaction's events, a run of
// deltas); it is keyed by the last and holds the first, so that a scan from
// any sequence finds the entry holding it.
type entry struct {
	First  uint64          `msgpack:"f,omitempty"`
	Type   string          `msgpack:"t,omitempty"`
	At     time.Time       `msgpack:"a"`
	Thread string          `msgpack:"th,omitempty"`
	Turn   string          `msgpack:"tu,omitempty"`
	Exec   string          `msgpack:"x,omitempty"`
	XFirst uint64          `msgpack:"xf,omitempty"`
	Data   json.RawMessage `msgpack:"d,omitempty"`
	// Deltas and Offsets are a run of deltas and each one's arrival, in
	// milliseconds after At.
	Deltas  []string `msgpack:"ds,omitempty"`
	Offsets []uint32 `msgpack:"do,omitempty"`
}

func (e *entry) kind() ItemKind {
	switch {
	case e.Deltas != nil:
		return KindDelta
	case e.Exec != "" && e.XFirst > 0:
		return KindEvent
	}
	return KindFact
}

// expand calls fn for the items of e with sequences after after; last is
// the entry's key.
func (e *entry) expand(last, after uint64, fn func(Item) bool) bool {
	first := e.First
	if first == 0 {
		first = last
	}
	if after >= last {
		return true // and after+1 below cannot wrap
	}
	for seq := max(first, after+1); seq <= last; seq++ {
		it := Item{Seq: seq, Kind: e.kind(), Type: e.Type, At: e.At, ThreadID: e.Thread, TurnID: e.Turn, ExecutionID: e.Exec}
		i := seq - first
		switch it.Kind {
		case KindEvent:
			it.ExecutionSeq = e.XFirst + i
		case KindDelta:
			it.Text = e.Deltas[i]
			if int(i) < len(e.Offsets) {
				it.At = e.At.Add(time.Duration(e.Offsets[i]) * time.Millisecond)
			}
		default:
			it.Data = e.Data
		}
		if !fn(it) {
			return false
		}
	}
	return true
}

func streamOf(sessionID string) string { return "s/" + sessionID }

// appender builds the entries of one write of a session's log: it hands
// out sequences after last, in order.
type appender struct {
	id    string
	batch *store.Batch
	next  uint64 // the next sequence to hand out
	at    time.Time
	n     int
}

func (a *appender) fact(typ, thread, turn string, payload any) error {
	data, err := json.Marshal(payload)
	if err != nil {
		return fmt.Errorf("session: encode %s: %w", typ, err)
	}
	a.put(a.next, &entry{Type: typ, At: a.at, Thread: thread, Turn: turn, Data: data})
	return nil
}

func (a *appender) pointer(thread, turn, exec string, xfirst, xlast uint64) {
	n := xlast - xfirst + 1
	a.put(a.next+n-1, &entry{First: a.next, At: a.at, Thread: thread, Turn: turn, Exec: exec, XFirst: xfirst})
}

// put stores e, which covers sequences a.next through last.
func (a *appender) put(last uint64, e *entry) {
	if e.First == last {
		e.First = 0
	}
	a.batch.Append(streamOf(a.id), last, store.Encode(e))
	a.next = last + 1
	a.n++
}

// run is the open run of deltas of a session: each delta has its sequence
// (handed out as it arrives) and is shown to live readers at once, but the
// run reaches the disk as one entry, when it is sealed: by any other append
// to the session, after the coalescing window, or past its size bound.
type run struct {
	first   uint64
	kind    string
	exec    string
	thread  string
	turn    string
	at      time.Time
	deltas  []string
	offsets []uint32
	bytes   int
	waiters []chan error
	timer   *time.Timer
}

func (r *run) last() uint64 { return r.first + uint64(len(r.deltas)) - 1 }

func (r *run) entry() *entry {
	e := &entry{Type: r.kind, At: r.at, Thread: r.thread, Turn: r.turn, Exec: r.exec, Deltas: r.deltas, Offsets: r.offsets}
	if len(r.deltas) > 1 {
		e.First = r.first
	}
	return e
}

// items calls fn for the run's deltas after after.
func (r *run) items(after uint64, fn func(Item) bool) bool {
	e := r.entry()
	e.First = r.first
	return e.expand(r.last(), after, fn)
}

// settle tells the run's writers whether it is durable.
func (r *run) settle(err error) {
	for _, w := range r.waiters {
		w <- err
	}
	r.waiters = nil
}

// Read calls fn for the items of session id's log after sequence after, in
// order, until fn returns false: those on disk, then the deltas of an open
// run, which are shown before they are durable (see Output). A cursor
// older than the retained history is ErrCursorExpired.
func (r *Registry) Read(ctx context.Context, id string, after uint64, fn func(Item) bool) error {
	b, err := r.book(ctx, id)
	if err != nil {
		return err
	}
	b.mu.Lock()
	durable, first := b.last, b.first
	var open *run
	if b.run != nil {
		cp := *b.run
		cp.deltas = append([]string(nil), b.run.deltas...)
		cp.offsets = append([]uint32(nil), b.run.offsets...)
		open = &cp
	}
	b.mu.Unlock()
	if first > 1 && after < first-1 {
		return fmt.Errorf("%w: session %s keeps sequences from %d, the cursor asks for %d", ErrCursorExpired, id, first, after+1)
	}
	cont := true
	var derr error
	if after < durable {
		err = r.st.Scan(streamOf(id), after, func(seq uint64, data []byte) bool {
			if seq > durable {
				return false
			}
			var e entry
			if derr = store.Decode(data, &e); derr != nil {
				return false
			}
			cont = e.expand(seq, after, fn)
			return cont
		})
		if err == nil {
			err = derr
		}
		if err != nil {
			return fmt.Errorf("session: read %s: %w", id, err)
		}
	}
	if cont && open != nil {
		open.items(max(after, durable), fn)
	}
	return nil
}

// First returns the first sequence session id's log keeps: 1 until
// retention removes the log's beginning, 0 for an empty log.
func (r *Registry) First(ctx context.Context, id string) (uint64, error) {
	b, err := r.book(ctx, id)
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.first, nil
}

// Last returns the last sequence of session id's log, durable or open.
func (r *Registry) Last(ctx context.Context, id string) (uint64, error) {
	b, err := r.book(ctx, id)
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.run != nil {
		return b.run.last(), nil
	}
	return b.last, nil
}

// Watch tells a reader that a session's log grew. Like kernel.Watch it
// carries nothing: the reader reads after the last sequence it has. Its
// Done closes when the registry closes.
type Watch = watch.Watch

// Watch starts watching session id. Call it before reading what is there,
// so that nothing appended in between is missed.
func (r *Registry) Watch(id string) *Watch { return r.watches.Watch(id) }

func (r *Registry) notify(id string) { r.watches.Notify(id) }
