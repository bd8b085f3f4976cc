package client

import (
	"container/list"
	"encoding/json"
	"log/slog"
	"sync"
	"time"
)

// mailbox routes an agent's pushes to the tasks waiting for them, by
// execution id and step id (signals: by execution id and signal type).
//
// A step's id is only known from the answer to the intent that created it,
// and the push about the step may overtake that answer (it travels on the
// agent's stream, the answer on another connection). So a step push nobody
// waits for yet is kept, within bounds, and handed to the waiter when it
// registers.
//
// Signals are harder: the kernel pushes signal.received when a signal
// arrives and, if the signal was still unclaimed then, once more after the
// wait that consumes it, and the two pushes carry nothing to tell them
// apart. A signal waiter registers before its wait intent is sent and
// collects what arrives until the intent is answered; it then takes the
// first of those, or else the next push. A push identical to the one that
// just satisfied a wait, arriving right after it, is the kernel's second
// push of that signal and is dropped, so it cannot satisfy a later wait.
// Signals nobody waits for are dropped too: the kernel keeps them, and
// pushes them again when a wait consumes them.
type mailbox struct {
	max int
	ttl time.Duration

	mu    sync.Mutex
	execs map[string]*execBox
	early *list.List // of *earlyPush, oldest first, across executions
}

type execBox struct {
	owner   *Task
	early   map[stepKey]*earlyPush
	waiters map[stepKey]chan json.RawMessage
	signals map[string][]*signalWaiter // by signal type, oldest first
	last    map[string]lastSignal      // by signal type
}

// signalWaiter is one Task.Wait. Until its intent is answered it collects
// pushes in early instead of taking the first one.
type signalWaiter struct {
	ch       chan json.RawMessage
	answered bool
	early    []json.RawMessage
}

// lastSignal is the push that satisfied the latest wait of a type.
type lastSignal struct {
	payload string
	at      time.Time
}

// duplicateWindow is how long after a wait is satisfied an identical push
// counts as the kernel's repeat of the same signal; the repeat is sent
// right after the wait is answered.
const duplicateWindow = time.Second

type stepKey struct{ typ, step string }

type earlyPush struct {
	exec string
	key  stepKey
	data json.RawMessage
	at   time.Time
	el   *list.Element
}

func newMailbox(max int, ttl time.Duration) *mailbox {
	return &mailbox{max: max, ttl: ttl, execs: map[string]*execBox{}, early: list.New()}
}

// open starts routing pushes of execution id to owner, replacing an
// earlier owner of the same execution.
func (m *mailbox) open(id string, owner *Task) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if old := m.execs[id]; old != nil {
		m.dropLocked(old)
	}
	m.execs[id] = &execBox{owner: owner, early: map[stepKey]*earlyPush{},
		waiters: map[stepKey]chan json.RawMessage{}, signals: map[string][]*signalWaiter{}, last: map[string]lastSignal{}}
}

// close stops routing pushes of execution id, if owner still holds it;
// later pushes for it are dropped.
func (m *mailbox) close(id string, owner *Task) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if b := m.execs[id]; b != nil && b.owner == owner {
		m.dropLocked(b)
		delete(m.execs, id)
	}
}

// dropLocked releases a box's buffered pushes and ends its waiters.
func (m *mailbox) dropLocked(b *execBox) {
	for _, e := range b.early {
		m.early.Remove(e.el)
	}
	for _, ch := range b.waiters {
		close(ch)
	}
	for _, ws := range b.signals {
		for _, w := range ws {
			close(w.ch)
		}
	}
}

// deliver routes one push.
func (m *mailbox) deliver(typ string, data json.RawMessage, log *slog.Logger) {
	var p struct {
		ExecutionID string          `json:"execution_id"`
		StepID      string          `json:"step_id"`
		SignalType  string          `json:"signal_type"`
		Payload     json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(data, &p); err != nil || p.ExecutionID == "" {
		log.Warn("malformed push dropped", "type", typ, "err", err)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.execs[p.ExecutionID]
	if b == nil {
		log.Debug("push for an execution not handled here dropped", "type", typ, "execution", p.ExecutionID)
		return
	}
	if typ == pushSignal {
		b.signal(p.SignalType, string(p.Payload), data)
		return
	}
	key := stepKey{typ, p.StepID}
	if ch, ok := b.waiters[key]; ok {
		ch <- data
		delete(b.waiters, key)
		return
	}
	if _, dup := b.early[key]; dup {
		return
	}
	now := time.Now()
	e := &earlyPush{exec: p.ExecutionID, key: key, data: data, at: now}
	e.el = m.early.PushBack(e)
	b.early[key] = e
	for m.early.Len() > 0 {
		oldest := m.early.Front().Value.(*earlyPush)
		if m.early.Len() <= m.max && now.Sub(oldest.at) < m.ttl {
			break
		}
		m.early.Remove(oldest.el)
		delete(m.execs[oldest.exec].early, oldest.key)
		log.Warn("unclaimed push dropped", "type", oldest.key.typ, "execution", oldest.exec, "step", oldest.key.step)
	}
}

// waitStep returns a channel that receives the push of type typ about a
// step (at once if it already arrived), and a function that withdraws the
// wait. The channel is closed if the execution stops being handled here.
func (m *mailbox) waitStep(id, typ, step string) (<-chan json.RawMessage, func()) {
	ch := make(chan json.RawMessage, 1)
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.execs[id]
	if b == nil {
		close(ch)
		return ch, func() {}
	}
	key := stepKey{typ, step}
	if e := b.early[key]; e != nil {
		m.early.Remove(e.el)
		delete(b.early, key)
		ch <- e.data
		return ch, func() {}
	}
	b.waiters[key] = ch
	return ch, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.execs[id] == b && b.waiters[key] == ch {
			delete(b.waiters, key)
		}
	}
}

// discard claims a step push that is not needed, so it is neither buffered
// nor left waiting for a claim.
func (m *mailbox) discard(id, typ, step string) {
	_, _ = m.waitStep(id, typ, step)
}

// signal routes a signal.received push; the caller holds the mailbox lock.
func (b *execBox) signal(typ, payload string, data json.RawMessage) {
	if last, ok := b.last[typ]; ok && last.payload == payload && time.Since(last.at) < duplicateWindow {
		delete(b.last, typ)
		return
	}
	ws := b.signals[typ]
	if len(ws) == 0 {
		return
	}
	if w := ws[0]; !w.answered {
		w.early = append(w.early, data)
		return
	}
	b.satisfy(typ, data)
}

// satisfy hands a push to the oldest waiter of typ and remembers it as the
// push a repeat would duplicate.
func (b *execBox) satisfy(typ string, data json.RawMessage) {
	ws := b.signals[typ]
	ws[0].ch <- data
	b.signals[typ] = ws[1:]
	var p struct {
		Payload json.RawMessage `json:"payload"`
	}
	_ = json.Unmarshal(data, &p)
	b.last[typ] = lastSignal{payload: string(p.Payload), at: time.Now()}
}

// waitSignal registers a wait for the next signal of a type, before its
// intent is sent. It returns the waiter, a function to call once the
// intent is answered, and one that withdraws the wait. The channel is
// closed if the execution stops being handled here.
func (m *mailbox) waitSignal(id, signalType string) (<-chan json.RawMessage, func(), func()) {
	w := &signalWaiter{ch: make(chan json.RawMessage, 1)}
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.execs[id]
	if b == nil {
		close(w.ch)
		return w.ch, func() {}, func() {}
	}
	b.signals[signalType] = append(b.signals[signalType], w)
	answered := func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.execs[id] != b {
			return
		}
		w.answered = true
		ws := b.signals[signalType]
		if len(w.early) > 0 && len(ws) > 0 && ws[0] == w {
			// What came before the answer is either the repeat-prone first
			// push of a signal the wait consumed or a signal that resumed
			// the wait; both are the wait's signal.
			b.satisfy(signalType, w.early[0])
		}
		w.early = nil
	}
	stop := func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.execs[id] != b {
			return
		}
		ws := b.signals[signalType]
		for i, x := range ws {
			if x == w {
				b.signals[signalType] = append(ws[:i:i], ws[i+1:]...)
				return
			}
		}
	}
	return w.ch, answered, stop
}
