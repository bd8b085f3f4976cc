package aap

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/session"
	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/store/storetest"
	"github.com/gatehouse-dev/gatehouse/stream"
)

// hubDeliverer hands the kernel's pushes to a real peer hub.
type hubDeliverer struct{ h *peer.Hub }

func key(p kernel.Peer) peer.Key { return peer.Key{Role: p.Role, ID: p.ID, Consumer: p.Consumer} }

func (d hubDeliverer) Stage(b *store.Batch, p kernel.Peer, typ string, data []byte, settle string) kernel.Staged {
	return d.h.Stage(b, key(p), typ, data, settle)
}
func (d hubDeliverer) Settle(b *store.Batch, p kernel.Peer, settle string) func() {
	return d.h.Settle(b, key(p), settle)
}
func (d hubDeliverer) Forget(p kernel.Peer) { d.h.Forget(key(p)) }

// surface is the AAP surface over a real store, hub, kernel and sessions.
func surface(t *testing.T) *Surface {
	t.Helper()
	st := storetest.Open(t, store.Options{Dir: t.TempDir()})
	hub, err := peer.NewHub(context.Background(), peer.Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := session.New(session.Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	k, err := kernel.New(context.Background(), kernel.Options{Store: st, Deliverer: hubDeliverer{hub}, Sessions: reg, AgentGrace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Start(context.Background(), k); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		reg.Close()
		k.Close()
		hub.Close()
		_ = st.Close()
	})
	return New(Options{Kernel: k, Sessions: reg})
}

// drain reads src with a batch of size n until it has nothing now.
func drain(t *testing.T, src *turnSource, n int) []string {
	t.Helper()
	buf := make([]stream.Item, n)
	var out []string
	for {
		got, err := src.Next(buf)
		if err != nil {
			t.Fatal(err)
		}
		if got == 0 {
			return out
		}
		for _, it := range buf[:got] {
			ev := it.Value.(*sseEvent)
			out = append(out, fmt.Sprintf("%s %s %v", ev.id.appendTo(nil), ev.name, ev.data))
		}
	}
}

// TestSourceResumesFromEveryEvent: a stream resumed from any of its
// events, read a little at a time, gives exactly the events after it:
// what the client has is folded without being sent, however much of it
// there is before the rest.
func TestSourceResumesFromEveryEvent(t *testing.T) {
	s := surface(t)
	ctx := context.Background()
	sess, err := s.o.Sessions.Create(ctx, session.CreateRequest{AgentID: "ag"})
	if err != nil {
		t.Fatal(err)
	}
	turn, err := s.o.Sessions.Submit(ctx, session.SubmitRequest{SessionID: sess.ID, Input: []byte(`{"aap":{"messages":[]}}`)})
	if err != nil {
		t.Fatal(err)
	}
	out := kernel.Output{ExecutionID: turn.ExecutionID, ThreadID: turn.ThreadID, TurnID: turn.ID}
	say := func(kind, text string) {
		o := out
		o.Kind, o.Text = kind, text
		if _, err := s.o.Sessions.Output(sess.ID, o); err != nil {
			t.Fatal(err)
		}
	}
	say(kernel.OutputReasoning, "thinking it over")
	for i := range 12 {
		say(kernel.OutputTextDelta, strconv.Itoa(i)+" ")
	}
	say(kernel.OutputReasoningDelta, "again")
	say(kernel.OutputTextDelta, "done")

	start := turn.FirstSeq - 1
	whole := s.turnSourceAt(sess.ID, turn.ID, start, position{start, subSessionStart}, modeDelta,
		[]sseEvent{{position{start, subTurnStart}, "turn_start", map[string]any{}}})
	all := drain(t, whole, 256)
	whole.Close()
	if len(all) < 17 {
		t.Fatalf("the turn's stream: %v", all)
	}
	for i, e := range all {
		id, err := parsePosition(strings.Fields(e)[0])
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		src := s.turnSourceAt(sess.ID, turn.ID, start, id, modeDelta, nil)
		rest := drain(t, src, 2)
		src.Close()
		if fmt.Sprint(rest) != fmt.Sprint(all[i+1:]) {
			t.Fatalf("after %s:\n got %v\nwant %v", strings.Fields(e)[0], rest, all[i+1:])
		}
	}
}
