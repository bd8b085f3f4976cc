package session_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/session"
)

// TestReadResolvedGivesEachReferenceItsEvent: a session log's references
// come back with the execution events they name, byte for byte as the
// kernel reads them, from any cursor and in pages of any size; the other
// items come back alone.
func TestReadResolvedGivesEachReferenceItsEvent(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	ag := w.agent("ag")
	s, err := w.reg.Create(ctx, session.CreateRequest{AgentID: "ag"})
	if err != nil {
		t.Fatal(err)
	}
	ag.completeTurns(s.ID, "t", 2)
	items := w.items(s.ID)
	for _, limit := range []int{1, 3, len(items)} {
		for after := range uint64(len(items)) {
			t.Run(fmt.Sprintf("after %d, %d at a time", after, limit), func(t *testing.T) {
				got, err := w.reg.ReadResolved(ctx, w.k, s.ID, after, limit, nil)
				if err != nil {
					t.Fatal(err)
				}
				want := items[after:min(len(items), int(after)+limit)]
				if len(got) != len(want) {
					t.Fatalf("%d items, want %d", len(got), len(want))
				}
				for i, r := range got {
					if r.Item.Seq != want[i].Seq {
						t.Fatalf("item %d has sequence %d, want %d", i, r.Item.Seq, want[i].Seq)
					}
					if r.Item.Kind != session.KindEvent {
						if r.Event != nil {
							t.Fatalf("item %d (%s) came with an event", i, r.Item.Type)
						}
						continue
					}
					// The kernel's wire form of the event the item names.
					var ev struct {
						ID       string          `json:"id"`
						Sequence uint64          `json:"sequence"`
						Payload  json.RawMessage `json:"payload"`
					}
					_, err := w.k.AppendEvents(nil, r.Item.ExecutionID, r.Item.ExecutionSeq-1, 1, func(_ uint64, _ string, data []byte) bool {
						if err := json.Unmarshal(data, &ev); err != nil {
							t.Fatal(err)
						}
						return false
					})
					if err != nil || ev.ID == "" {
						t.Fatalf("kernel read of %s#%d: %+v %v", r.Item.ExecutionID, r.Item.ExecutionSeq, ev, err)
					}
					if r.Event == nil {
						t.Fatalf("item %d refers to %s#%d, left unresolved", i, r.Item.ExecutionID, r.Item.ExecutionSeq)
					}
					if r.Event.ID != ev.ID || r.Event.Sequence != ev.Sequence || string(r.Event.Payload) != string(ev.Payload) {
						t.Fatalf("item %d refers to %s#%d: resolved to event %s #%d %s, the kernel has %s #%d %s", i, r.Item.ExecutionID, r.Item.ExecutionSeq,
							r.Event.ID, r.Event.Sequence, r.Event.Payload, ev.ID, ev.Sequence, ev.Payload)
					}
				}
			})
		}
	}
}

// TestWalkResolvedStartsAtWhatRetentionKept: a walk from the start of a
// log whose beginning retention removed folds what is left, page by page,
// to its end; a walk from a cursor retention passed is told so.
func TestWalkResolvedStartsAtWhatRetentionKept(t *testing.T) {
	w, _, s := pastRetention(t)
	defer w.close()
	ctx := context.Background()
	if removed, err := w.reg.Prune(ctx, time.Now()); err != nil || removed == 0 {
		t.Fatalf("prune removed %d: %v", removed, err)
	}
	first, _ := w.reg.First(ctx, s.ID)
	last, _ := w.reg.Last(ctx, s.ID)
	var seqs []uint64
	err := w.reg.WalkResolved(ctx, w.k, s.ID, 0, func(page []session.Resolved) (bool, error) {
		for _, r := range page {
			if r.Item.Kind == session.KindEvent && r.Event == nil {
				t.Errorf("reference %d unresolved", r.Item.Seq)
			}
			seqs = append(seqs, r.Item.Seq)
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seqs) == 0 || seqs[0] != first || seqs[len(seqs)-1] != last || uint64(len(seqs)) != last-first+1 {
		t.Fatalf("walked %v, want %d to %d", seqs, first, last)
	}
	if first > 1 {
		err := w.reg.WalkResolved(ctx, w.k, s.ID, first-2, func([]session.Resolved) (bool, error) { return true, nil })
		if !errors.Is(err, session.ErrCursorExpired) {
			t.Fatalf("walk from a pruned cursor: %v, want ErrCursorExpired", err)
		}
	}
}
