package session

import (
	"context"
	"fmt"
	"time"

	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/store"
)

// Output records what an agent said in an execution of session id (see
// kernel.Sessions). A whole text, reasoning, status or checkpoint is
// written at once as an output fact. A delta joins the session's open run:
// it gets its sequence and reaches live readers at once, and the channel
// reports when the run is written, which happens when anything else is
// appended to the session, after Options.DeltaWindow, or past
// Options.DeltaBytes. Deltas a reader saw live but that a crash kept from
// the disk are not acknowledged to the agent either.
func (r *Registry) Output(id string, o kernel.Output) (<-chan error, error) {
	b, err := r.book(context.Background(), id)
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if o.Kind != kernel.OutputTextDelta && o.Kind != kernel.OutputReasoningDelta {
		err := r.write(context.Background(), b, func(a *appender, _ *Session) error {
			return a.fact(FactOutput, o.ThreadID, o.TurnID, &OutputFact{Kind: o.Kind, Text: o.Text, Data: o.Data, ExecutionID: o.ExecutionID})
		})
		done <- err
		return done, nil
	}
	now := time.Now().UTC()
	ru := b.run
	if ru != nil && (ru.kind != o.Kind || ru.exec != o.ExecutionID || ru.bytes+len(o.Text) > r.o.DeltaBytes) {
		r.flushLocked(b)
		ru = nil
	}
	if ru == nil {
		ru = &run{first: b.last + 1, kind: o.Kind, exec: o.ExecutionID, thread: o.ThreadID, turn: o.TurnID, at: now}
		b.run = ru
		ru.timer = time.AfterFunc(r.o.DeltaWindow, func() { r.flush(b, ru) })
	}
	ru.deltas = append(ru.deltas, o.Text)
	ru.offsets = append(ru.offsets, uint32(now.Sub(ru.at).Milliseconds()))
	ru.bytes += len(o.Text)
	ru.waiters = append(ru.waiters, done)
	r.notify(id)
	return done, nil
}

// flush writes run ru of b if it is still open.
func (r *Registry) flush(b *book, ru *run) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.run == ru {
		r.flushLocked(b)
	}
}

// flushLocked writes b's open run on its own. The caller holds b.mu. A
// failed write fails the run's writers: its deltas are lost, and the
// sequences they had are handed out again.
func (r *Registry) flushLocked(b *book) {
	var batch store.Batch
	ru := r.sealInto(&batch, b)
	if ru == nil {
		return
	}
	if err := r.st.Write(context.Background(), &batch); err != nil {
		r.log.Warn("session: deltas lost", "session", b.id, "count", len(ru.deltas), "err", err)
		ru.settle(fmt.Errorf("session: write deltas of %s: %w", b.id, err))
		return
	}
	r.committed(b, ru, ru.last())
	r.notify(b.id)
}
