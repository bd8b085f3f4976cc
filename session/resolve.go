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

// pageBytes bounds the bytes (fact data and resolved event payloads) of
// one ReadResolved: a page holds at least one item, and no item past the
// one that reached the bound. A session of large results is read in many
// small pages rather than one that holds them all.
const pageBytes = 1 << 20

// ReadResolved appends to into up to limit items of session id's log after
// sequence after, as Read gives them, each reference resolved through
// events to its execution event, and stops early once the page holds
// pageBytes: fewer items than limit do not mean that the log ends there.
func (r *Registry) ReadResolved(ctx context.Context, events EventReader, id string, after uint64, limit int, into []Resolved) ([]Resolved, error) {
	start := len(into)
	size := 0
	err := r.Read(ctx, id, after, func(it Item) bool {
		into = append(into, Resolved{Item: it})
		size += len(it.Data) + len(it.Text)
		return len(into)-start < limit && size < pageBytes
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
			size += len(cp.Payload)
			k++
			return k < j && size < pageBytes
		})
		if err != nil {
			return into, err
		}
		if k < j {
			// The page is full: the rest is read by the next one.
			return into[:start+k], nil
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
		if len(items) == 0 {
			return nil
		}
		more, err := page(items)
		if err != nil || !more {
			return err
		}
	}
}
