package peer

import (
	"errors"
	"testing"
)

func next(t *testing.T, c *Conn) Delivery {
	t.Helper()
	d, ok := c.Next()
	if !ok {
		t.Fatal("no delivery")
	}
	return d
}

func TestOutboxSurvivesReconnect(t *testing.T) {
	h := NewHub(Options{})
	k := Key{Role: "runner", ID: "r", Consumer: "c"}
	if _, err := h.Deliver(k, "a", []byte("1")); err != nil { // before any connection
		t.Fatal(err)
	}
	c1 := h.Attach(k)
	select {
	case <-c1.Ready():
	default:
		t.Fatal("a connection with waiting deliveries is not ready")
	}
	if d := next(t, c1); d.Seq != 1 || d.Type != "a" {
		t.Fatalf("first delivery %+v", d)
	}
	h.Deliver(k, "b", nil)
	h.Deliver(k, "c", nil)
	if d := next(t, c1); d.Seq != 2 {
		t.Fatalf("second %+v", d)
	}
	c1.Ack(1)
	// A new connection supersedes the old one and restarts from the oldest
	// unacknowledged delivery: 2 was handed out but never acknowledged.
	c2 := h.Attach(k)
	select {
	case <-c1.Done():
		if !errors.Is(c1.Err(), ErrSuperseded) {
			t.Fatalf("old conn ended with %v", c1.Err())
		}
	default:
		t.Fatal("old connection not superseded")
	}
	if d := next(t, c2); d.Seq != 2 {
		t.Fatalf("after reconnect %+v", d)
	}
	if d := next(t, c2); d.Seq != 3 {
		t.Fatalf("after reconnect %+v", d)
	}
	if _, ok := c2.Next(); ok {
		t.Fatal("extra delivery")
	}
	c2.Ack(3)
	if h.Pending(k) != 0 {
		t.Fatalf("pending %d after ack", h.Pending(k))
	}
	c1.Detach() // a stale detach must not unhook the new connection
	h.Deliver(k, "d", nil)
	if d := next(t, c2); d.Seq != 4 {
		t.Fatalf("after stale detach %+v", d)
	}
}

func TestOutboxBoundAndForget(t *testing.T) {
	h := NewHub(Options{OutboxLimit: 2})
	k := Key{Role: "agent", ID: "a", Consumer: "c"}
	h.Deliver(k, "x", nil)
	h.Deliver(k, "x", nil)
	if _, err := h.Deliver(k, "x", nil); !errors.Is(err, ErrOutboxFull) {
		t.Fatalf("third delivery: %v", err)
	}
	c := h.Attach(k)
	h.Forget(k)
	<-c.Done()
	if !errors.Is(c.Err(), ErrForgotten) {
		t.Fatalf("forgotten conn: %v", c.Err())
	}
	if h.Pending(k) != 0 {
		t.Fatal("forgotten outbox still pending")
	}
}
