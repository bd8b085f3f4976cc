package session

import (
	"bytes"
	"context"
	"errors"

	"github.com/gatehouse-dev/gatehouse/event"
)

// EventReader reads an execution's event log, as the kernel's
// ReadEventValues does: fn gets the events after sequence after, in order,
// each valid only during the call, until it returns false.
type EventReader interface {
	ReadEventValues(id string, after uint64, fn func(*event.Event) bool) error
}

// Resolved is an item of a session's log and, when the item is a
// reference (KindEvent), the execution event it refers to: what a surface
// renders.
type Resolved struct {
	Item Item
	// Event is the referred event, a copy the reader owns; nil for the
	// other kinds.
	Event *event.Event
}

// walkPage is how many items WalkResolved reads at a time.
const walkPage = 1000

// ReadResolved appends to into up to limit items of session id's log after
// sequence after, as Read gives them, each reference resolved through
// events to its execution event.
func (r *Registry) ReadResolved(ctx context.Context, events EventReader, id string, after uint64, limit int, into []Resolved) ([]Resolved, error) {
	start := len(into)
	err := r.Read(ctx, id, after, func(it Item) bool {
		into = append(into, Resolved{Item: it})
		return len(into)-start < limit
	})
	if err != nil {
		return into, err
	}
	// References to consecutive events of one execution are read in one
	// scan of its log.
	batch := into[start:]
	for i := 0; i < len(batch); {
		if batch[i].Item.Kind != KindEvent {
			i++
			continue
		}
		exec, from := batch[i].Item.ExecutionID, batch[i].Item.ExecutionSeq
		j := i
		for j < len(batch) && batch[j].Item.Kind == KindEvent && batch[j].Item.ExecutionID == exec &&
			batch[j].Item.ExecutionSeq == from+uint64(j-i) {
			j++
		}
		k := i
		err := events.ReadEventValues(exec, from-1, func(ev *event.Event) bool {
			cp := *ev
			cp.Payload = bytes.Clone(ev.Payload)
			batch[k].Event = &cp
			k++
			return k < j
		})
		if err != nil {
			return into, err
		}
		i = j
	}
	return into, nil
}

// WalkResolved reads session id's log after sequence after as
// ReadResolved does, a page at a time, and hands each page to page until
// it returns false or the log ends. A walk from the start (after 0) of a
// log whose beginning retention removed starts at its oldest retained
// item: a reader folding the whole log folds what is left of it.
func (r *Registry) WalkResolved(ctx context.Context, events EventReader, id string, after uint64, page func([]Resolved) (bool, error)) error {
	for {
		items, err := r.ReadResolved(ctx, events, id, after, walkPage, nil)
		if errors.Is(err, ErrCursorExpired) && after == 0 {
			first, ferr := r.First(ctx, id)
			if ferr != nil {
				return ferr
			}
			after = first - 1
			continue
		}
		if err != nil {
			return err
		}
		if len(items) > 0 {
			after = items[len(items)-1].Item.Seq
		}
		more, err := page(items)
		if err != nil || !more || len(items) < walkPage {
			return err
		}
	}
}
