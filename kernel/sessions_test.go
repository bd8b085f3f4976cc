package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/store"
)

// errArchived is what sessionBook answers for the session named archived.
var errArchived = errors.New("session is archived")

// sessionBook is a Sessions that keeps what is filed in memory: the
// committed filings by session, and what agents said.
type sessionBook struct {
	mu      sync.Mutex
	opened  []Opening
	filed   map[string][]Filing
	dropped int // filings of writes that failed
	said    []Output
}

func newSessionBook() *sessionBook { return &sessionBook{filed: map[string][]Filing{}} }

func (b *sessionBook) Open(_ context.Context, o Opening) (string, string, error) {
	if o.SessionID == "archived" {
		return "", "", errArchived
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.opened = append(b.opened, o)
	thread, turn := o.ThreadID, o.TurnID
	if thread == "" {
		thread = "thread-1"
	}
	if turn == "" {
		turn = "turn-" + o.ExecutionID
	}
	return thread, turn, nil
}

func (b *sessionBook) Stage(_ *store.Batch, sessionID string, fs []Filing) func(bool) {
	return func(committed bool) {
		b.mu.Lock()
		defer b.mu.Unlock()
		if !committed {
			b.dropped += len(fs)
			return
		}
		b.filed[sessionID] = append(b.filed[sessionID], fs...)
	}
}

func (b *sessionBook) Output(_ string, o Output) (<-chan error, error) {
	b.mu.Lock()
	b.said = append(b.said, o)
	b.mu.Unlock()
	done := make(chan error, 1)
	done <- nil
	return done, nil
}

func TestExecutionsFiledInSessions(t *testing.T) {
	book := newSessionBook()
	r := newRig(t, func(o *Options) { o.Sessions = book })
	ctx := context.Background()
	defer r.k.AgentConnected("ag", "c1")()

	_, _, err := r.k.Create(ctx, CreateRequest{AgentID: "ag", SessionID: "archived"}, Meta{})
	if !errors.Is(err, errArchived) {
		t.Fatalf("create in an archived session: %v", err)
	}
	x := r.start("ag", "c1", CreateRequest{SessionID: "s1", ThreadID: "th", Input: json.RawMessage(`"hi"`)}, Meta{Principal: "alice", Tenant: "acme"})
	x.intent(t, r.k, Intent{Type: IntentOutput, Output: json.RawMessage(`{"kind":"text_delta","text":"he"}`)})
	x.intent(t, r.k, Intent{Type: IntentComplete})
	// Without a session id an execution is filed nowhere.
	y := r.start("ag", "c1", CreateRequest{}, Meta{})
	y.intent(t, r.k, Intent{Type: IntentOutput, Output: json.RawMessage(`{"kind":"status","text":"thinking"}`)})

	book.mu.Lock()
	defer book.mu.Unlock()
	if len(book.opened) != 1 {
		t.Fatalf("opened %+v", book.opened)
	}
	if o := book.opened[0]; o.SessionID != "s1" || o.ExecutionID != x.id || o.AgentID != "ag" || o.Owner != "alice" || o.Tenant != "acme" ||
		o.ThreadID != "th" || string(o.Input) != `"hi"` {
		t.Fatalf("opening: %+v", o)
	}
	fs := book.filed["s1"]
	if len(book.filed) != 1 || len(fs) != 2 || book.dropped != 0 {
		t.Fatalf("filed %+v, dropped %d", book.filed, book.dropped)
	}
	// The creation and the assignment are one transaction; the completion
	// another, which ends the turn.
	if f := fs[0]; f.ExecutionID != x.id || f.ThreadID != "th" || f.TurnID != "turn-"+x.id || f.First != 1 || f.Last != 2 || f.Ended != "" {
		t.Fatalf("first filing: %+v", f)
	}
	if f := fs[1]; f.First != 3 || f.Last != 4 || f.Ended != StatusCompleted {
		t.Fatalf("last filing: %+v", f)
	}
	// What the filed execution's agent says goes to its session, not to
	// its own log.
	if len(book.said) != 1 || book.said[0].ExecutionID != x.id || book.said[0].TurnID != "turn-"+x.id || book.said[0].Text != "he" {
		t.Fatalf("said %+v", book.said)
	}
	for _, typ := range eventTypes(t, r.k, x.id) {
		if typ == event.AgentOutput {
			t.Fatal("a filed execution's output is in its own log")
		}
	}
	if types := eventTypes(t, r.k, y.id); types[len(types)-1] != event.AgentOutput {
		t.Fatalf("an unfiled execution's output is not in its log: %v", types)
	}
}
