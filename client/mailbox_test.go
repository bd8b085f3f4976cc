package client

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"
)

func push(exec, step string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"execution_id":%q,"step_id":%q,"status":"succeeded"}`, exec, step))
}

func received(t *testing.T, ch <-chan json.RawMessage) (json.RawMessage, bool) {
	t.Helper()
	select {
	case data, ok := <-ch:
		return data, ok
	case <-time.After(time.Second):
		t.Fatal("nothing received")
		return nil, false
	}
}

// TestMailboxEarlyPush covers a step push that overtakes the answer naming
// its step: it is kept and handed to the waiter that registers later.
func TestMailboxEarlyPush(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	m := newMailbox(10, time.Minute)
	task := &Task{}
	m.open("e1", task)
	m.deliver(pushToolResult, push("e1", "s1"), log)
	m.deliver(pushToolResult, push("other", "s1"), log) // not handled here: dropped
	ch, stop := m.waitStep("e1", pushToolResult, "s1")
	defer stop()
	if data, _ := received(t, ch); string(data) != string(push("e1", "s1")) {
		t.Errorf("got %s", data)
	}
	if m.early.Len() != 0 {
		t.Errorf("%d pushes still buffered", m.early.Len())
	}

	late, stop2 := m.waitStep("e1", pushToolResult, "s2")
	defer stop2()
	m.deliver(pushToolResult, push("e1", "s2"), log)
	if data, _ := received(t, late); string(data) != string(push("e1", "s2")) {
		t.Errorf("got %s", data)
	}

	pending, stop3 := m.waitStep("e1", pushApproval, "s3")
	defer stop3()
	m.close("e1", task)
	if _, ok := received(t, pending); ok {
		t.Error("a waiter of a closed execution must see its channel closed")
	}
}

func TestMailboxBounds(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	m := newMailbox(3, time.Hour)
	m.open("e", &Task{})
	for i := range 5 {
		m.deliver(pushToolResult, push("e", fmt.Sprint(i)), log)
	}
	if m.early.Len() != 3 {
		t.Fatalf("%d buffered, want the cap of 3", m.early.Len())
	}
	if _, ok := m.execs["e"].early[stepKey{pushToolResult, "0"}]; ok {
		t.Error("the oldest push should have been evicted")
	}

	m = newMailbox(100, time.Millisecond)
	m.open("e", &Task{})
	m.deliver(pushToolResult, push("e", "old"), log)
	time.Sleep(5 * time.Millisecond)
	m.deliver(pushToolResult, push("e", "new"), log)
	if m.early.Len() != 1 {
		t.Errorf("%d buffered, want only the fresh push", m.early.Len())
	}
}

// TestMailboxSignals covers the signal pushes the kernel sends: one when a
// signal arrives and a repeat after the wait that consumes a signal that
// was unclaimed until then.
func TestMailboxSignals(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	sig := func(n int) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"execution_id":"e","signal_type":"go","payload":{"n":%d}}`, n))
	}
	m := newMailbox(10, time.Minute)
	m.open("e", &Task{})

	// A signal nobody waits for is dropped; the kernel repeats it for the
	// wait that consumes it.
	m.deliver(pushSignal, sig(1), log)
	first, answered, stop := m.waitSignal("e", "go")
	defer stop()
	// The repeat overtakes the wait's answer: it is held until the answer.
	m.deliver(pushSignal, sig(1), log)
	select {
	case <-first:
		t.Fatal("satisfied before the wait was answered")
	default:
	}
	answered()
	if data, _ := received(t, first); string(data) != string(sig(1)) {
		t.Errorf("first wait got %s", data)
	}

	// The signal's first push arrives after the wait took its repeat... or
	// the other way round: either way the second copy must not satisfy the
	// next wait.
	second, answered2, stop2 := m.waitSignal("e", "go")
	defer stop2()
	m.deliver(pushSignal, sig(1), log)
	answered2()
	m.deliver(pushSignal, sig(2), log)
	if data, _ := received(t, second); string(data) != string(sig(2)) {
		t.Errorf("second wait got %s, want the new signal", data)
	}

	// An identical signal long after is a new signal.
	m.execs["e"].last["go"] = lastSignal{payload: `{"n":2}`, at: time.Now().Add(-time.Minute)}
	third, answered3, stop3 := m.waitSignal("e", "go")
	defer stop3()
	answered3()
	m.deliver(pushSignal, sig(2), log)
	if data, _ := received(t, third); string(data) != string(sig(2)) {
		t.Errorf("third wait got %s", data)
	}
}
