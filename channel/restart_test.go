package channel_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/channel/channeltest"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/store/storetest"
)

// TestAdapterAnswerCutByAStopIsToldOnItsCard: a gateway stopped after an
// answer came in and before it was decided leaves the prompt pending; at
// the next start the card of the channel it came through says it was not
// recorded, keeps its buttons, and a new answer is recorded, once.
func TestAdapterAnswerCutByAStopIsToldOnItsCard(t *testing.T) {
	p := newPlatform(channel.Route{Owner: "alice", ID: "room1"}, channel.Route{Owner: "alice", ID: "room2"})
	dir := t.TempDir()
	s := startWith(t, p, fastRetry, node.Options{Data: dir})
	rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", nil)
	c := p.waitCard(t, "room1", rec.ActionID)
	p.waitCard(t, "room2", rec.ActionID)
	s.Stop()
	st := storetest.Open(t, store.Options{Dir: dir})
	if err := channel.WritePress(st, rec.ActionID, "fake", "room1"); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	note := eventually.Value(t, "room1's card told", func() (channel.Card, bool) {
		sh, _ := p.card("room1", rec.ActionID)
		if len(sh.edits) == 0 {
			return channel.Card{}, false
		}
		return sh.edits[0], true
	})
	if note.Note != channel.NoteNotRecorded || note.Record.State != bridge.StatePending || len(note.Values) != 3 {
		t.Fatalf("room1's card: %+v", note)
	}
	if sh, _ := p.card("room2", rec.ActionID); len(sh.edits) != 0 {
		t.Fatalf("room2's card edited: %+v", sh.edits)
	}
	got, won, err := s.Node.Channels.Answer(context.Background(), channel.Answer{Adapter: "fake", Dest: "room1", User: "U1", Principal: "alice", Value: c.card.Values[bridge.DecisionDeny]})
	if err != nil || !won || got.State != bridge.StateDenied {
		t.Fatalf("answer after the restart: %v %v %+v", err, won, got)
	}
	p.waitEdit(t, "room2", rec.ActionID, bridge.StateDenied)
}

// TestAdapterEditCutByAStopIsDoneAfterTheRestart: a gateway stopped while
// a card's edit to the outcome hangs edits it at the next start, and the
// answer stays recorded once.
func TestAdapterEditCutByAStopIsDoneAfterTheRestart(t *testing.T) {
	p := newPlatform(channel.Route{Owner: "alice", ID: "room1"})
	s := startWith(t, p, fastRetry, node.Options{})
	rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", nil)
	c := p.waitCard(t, "room1", rec.ActionID)
	p.set(func(p *platform) { p.hold = true })
	if _, won, err := s.Node.Channels.Answer(context.Background(), channel.Answer{Adapter: "fake", Dest: "room1", User: "U1", Principal: "alice", Value: c.card.Values[bridge.DecisionAllowOnce]}); err != nil || !won {
		t.Fatalf("answer: %v %v", err, won)
	}
	eventually.True(t, "the edit hangs", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.inFlight == 1
	})
	s.Stop()
	p.set(func(p *platform) { p.hold = false })
	s.Restart()
	p.waitEdit(t, "room1", rec.ActionID, bridge.StateApproved)
	if got, _ := s.Node.Bridge.Get(rec.ActionID); got.DecidedBy.NativePeerID != "U1" {
		t.Fatalf("record after the restart: %+v", got.DecidedBy)
	}
	// The answer came back once, and is logged once.
	evs, _, err := s.Node.Channels.Events("alice", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	returned := 0
	for _, e := range evs {
		if strings.Contains(string(e), `"type":"`+channel.TypePermissionReturned+`"`) {
			returned++
		}
	}
	if returned != 1 {
		t.Fatalf("%d %s events, want 1", returned, channel.TypePermissionReturned)
	}
}

// TestAdapterCardWhoseRecordAStopLostIsEditedThroughItsPress: a gateway
// stopped between a card's send and its record's commit does not know
// the card; a press on it names it, so it is edited to the outcome,
// whether that press decides the prompt or finds it settled elsewhere.
func TestAdapterCardWhoseRecordAStopLostIsEditedThroughItsPress(t *testing.T) {
	for _, settledFirst := range []bool{false, true} {
		p := newPlatform(channel.Route{Owner: "alice", ID: "room1"}, channel.Route{Owner: "alice", ID: "room2"})
		dir := t.TempDir()
		s := startWith(t, p, fastRetry, node.Options{Data: dir})
		rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", nil)
		c := p.waitCard(t, "room1", rec.ActionID)
		other := p.waitCard(t, "room2", rec.ActionID)
		// Both cards recorded and their deliveries acknowledged: the
		// restart carries nothing again, so only the lost records differ.
		eventually.True(t, "the cards recorded", func() bool { return s.Node.Channels.Stats().Queued == 0 })
		s.Stop()
		st := storetest.Open(t, store.Options{Dir: dir})
		if err := channel.ForgetCards(st, rec.ActionID); err != nil {
			t.Fatal(err)
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		s.Restart()
		want := bridge.StateApproved
		if settledFirst {
			if _, won, err := s.Node.Channels.Answer(context.Background(), channel.Answer{Adapter: "fake", Dest: "room2", User: "U1", Principal: "alice",
				Value: other.card.Values[bridge.DecisionDeny]}); err != nil || !won {
				t.Fatalf("answer in room2: %v %v", err, won)
			}
			want = bridge.StateDenied
		}
		ref := p.refOf("room1", rec.ActionID)
		got, won, err := s.Node.Channels.Answer(context.Background(), channel.Answer{Adapter: "fake", Dest: "room1", User: "U1", Principal: "alice",
			Value: c.card.Values[bridge.DecisionAllowOnce], Ref: ref})
		if err != nil || won == settledFirst || got.State != want {
			t.Fatalf("settled first %v: answer: %v %v %+v", settledFirst, err, won, got)
		}
		p.waitEdit(t, "room1", rec.ActionID, want)
		if n := p.sends("room1"); n != 1 {
			t.Fatalf("settled first %v: %d cards sent, want 1", settledFirst, n)
		}
	}
}
