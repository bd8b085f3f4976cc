package peer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/store/storetest"
)

func newHub(t *testing.T, st *store.Store, o Options) *Hub {
	t.Helper()
	o.Store = st
	h, err := NewHub(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func next(t *testing.T, c *Conn) Delivery {
	t.Helper()
	d, ok := c.Next()
	if !ok {
		t.Fatal("no delivery")
	}
	return d
}

func none(t *testing.T, c *Conn) {
	t.Helper()
	if d, ok := c.Next(); ok {
		t.Fatalf("unexpected delivery %+v", d)
	}
}

// resume attaches consumer k to read on after cursor, failing the test if
// the hub resets it instead.
func resume(t *testing.T, h *Hub, k Key, cursor uint64) *Conn {
	t.Helper()
	c, reset := h.Attach(k, &cursor)
	if reset != nil {
		t.Fatalf("reset resuming after %d: %+v", cursor, reset)
	}
	return c
}

func deliver(t *testing.T, h *Hub, k Key, typ string) uint64 {
	t.Helper()
	seq, err := h.Deliver(context.Background(), k, typ, []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

func TestOutboxSurvivesReconnect(t *testing.T) {
	h := newHub(t, nil, Options{})
	k := Key{Role: "runner", ID: "r", Consumer: "c"}
	deliver(t, h, k, "a") // before any connection
	c1, reset := h.Attach(k, nil)
	if reset != nil {
		t.Fatalf("reset on first attach: %+v", reset)
	}
	select {
	case <-c1.Ready():
	default:
		t.Fatal("a connection with waiting deliveries is not ready")
	}
	if d := next(t, c1); d.Seq != 1 || d.Type != "a" {
		t.Fatalf("first delivery %+v", d)
	}
	deliver(t, h, k, "b")
	deliver(t, h, k, "c")
	if d := next(t, c1); d.Seq != 2 {
		t.Fatalf("second %+v", d)
	}
	c1.Ack(1)
	// A new connection supersedes the old one and restarts from the oldest
	// unacknowledged delivery: 2 was handed out but never acknowledged.
	c2, _ := h.Attach(k, nil)
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
	none(t, c2)
	c2.Ack(3)
	if h.Pending(k) != 0 {
		t.Fatalf("pending %d after ack", h.Pending(k))
	}
	c1.Detach() // a stale detach must not unhook the new connection
	deliver(t, h, k, "d")
	if d := next(t, c2); d.Seq != 4 {
		t.Fatalf("after stale detach %+v", d)
	}
}

func TestStagedDeliveriesLeaveInOrder(t *testing.T) {
	h := newHub(t, nil, Options{})
	k := Key{Role: "agent", ID: "a", Consumer: "c"}
	c, _ := h.Attach(k, nil)
	first := h.Stage(nil, k, "first", nil, "")
	second := h.Stage(nil, k, "second", nil, "")
	second.Publish()
	none(t, c) // the first is not committed yet: the second must wait
	first.Publish()
	if d := next(t, c); d.Type != "first" {
		t.Fatalf("got %s first", d.Type)
	}
	if d := next(t, c); d.Type != "second" {
		t.Fatalf("got %s second", d.Type)
	}
	aborted := h.Stage(nil, k, "aborted", nil, "")
	h.Stage(nil, k, "after", nil, "").Publish()
	aborted.Abort()
	if d := next(t, c); d.Type != "after" || d.Seq != 4 {
		t.Fatalf("after an abort: %+v", d)
	}
}

func TestCursorAcksAndResets(t *testing.T) {
	h := newHub(t, nil, Options{OutboxLimit: 3})
	k := Key{Role: "agent", ID: "a", Consumer: "c"}
	for range 3 {
		deliver(t, h, k, "x")
	}
	c := resume(t, h, k, 2)
	if d := next(t, c); d.Seq != 3 {
		t.Fatalf("resume after cursor 2: %+v", d)
	}
	ahead := uint64(99)
	if _, reset := h.Attach(k, &ahead); reset == nil || reset.Reason != ResetCursorAhead {
		t.Fatalf("cursor ahead: %+v", reset)
	}
	// Overflowing the bound drops the oldest unacknowledged deliveries; a
	// consumer resuming from before them is told so.
	for range 5 {
		deliver(t, h, k, "y")
	}
	one := uint64(1)
	c, reset := h.Attach(k, &one)
	if reset == nil || reset.Reason != ResetHistoryGone || reset.ResumeFrom != 6 {
		t.Fatalf("history gone: %+v", reset)
	}
	if d := next(t, c); d.Seq != 6 {
		t.Fatalf("first retained: %+v", d)
	}
}

func TestSettleAndForget(t *testing.T) {
	h := newHub(t, nil, Options{})
	k := Key{Role: "runner", ID: "r", Consumer: "c"}
	h.Stage(nil, k, "job.assigned", nil, "job-1").Publish()
	h.Stage(nil, k, "job.assigned", nil, "job-2").Publish()
	h.Settle(nil, k, "job-1")()
	c, _ := h.Attach(k, nil)
	if d := next(t, c); d.Seq != 2 {
		t.Fatalf("settled job delivered: %+v", d)
	}
	h.Forget(k)
	<-c.Done()
	if !errors.Is(c.Err(), ErrForgotten) {
		t.Fatalf("forgotten conn: %v", c.Err())
	}
	if h.Pending(k) != 0 {
		t.Fatal("forgotten outbox still pending")
	}
	if p, _ := h.Peers(Query{Role: "runner"}); len(p) != 1 || p[0].State != "lost" {
		t.Fatalf("peers after forget: %+v", p)
	}
}

// TestOutboxSurvivesRestart: unacknowledged deliveries come back after the
// hub is reopened on the same Badger folder; acknowledged ones do not.
func TestOutboxSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	st := storetest.Open(t, store.Options{Dir: dir})
	h, err := NewHub(context.Background(), Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	k := Key{Role: "agent", ID: "a", Consumer: "c"}
	for range 4 {
		deliver(t, h, k, "x")
	}
	c, _ := h.Attach(k, nil)
	next(t, c)
	next(t, c)
	c.Ack(2)
	var b store.Batch
	h.Stage(&b, k, "job", nil, "settle-me").Publish()
	if err := st.Write(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	var sb store.Batch
	apply := h.Settle(&sb, k, "settle-me")
	if err := st.Write(context.Background(), &sb); err != nil {
		t.Fatal(err)
	}
	apply()
	c.Detach()
	h.Close()

	st = storetest.Reopen(t, st, store.Options{Dir: dir})
	h = newHub(t, st, Options{})
	c, _ = h.Attach(k, nil)
	var got []uint64
	for {
		d, ok := c.Next()
		if !ok {
			break
		}
		got = append(got, d.Seq)
	}
	if len(got) != 2 || got[0] != 3 || got[1] != 4 {
		t.Fatalf("after restart: %v, want [3 4]", got)
	}
	if seq := deliver(t, h, k, "new"); seq != 6 {
		t.Fatalf("sequence after restart: %d, want 6", seq)
	}
	peers, _ := h.Peers(Query{})
	if len(peers) != 1 || peers[0].State != "online" || peers[0].Acked != 2 || peers[0].Latest != 6 || peers[0].LastSeen.Before(time.Now().Add(-time.Minute)) {
		t.Fatalf("peers: %+v", peers)
	}
}

// TestDeliveredCanBeRewound: a delivery written to a connection that cannot
// acknowledge is not sent again to a reconnect without a cursor, but a
// consumer that resumes from an earlier cursor gets it: the written frame
// may have died with the socket.
func TestDeliveredCanBeRewound(t *testing.T) {
	h := newHub(t, nil, Options{Rewind: time.Hour})
	k := Key{Role: "agent", ID: "a", Consumer: "c"}
	for range 3 {
		deliver(t, h, k, "x")
	}
	c, _ := h.Attach(k, nil)
	for range 3 {
		next(t, c)
	}
	c.Delivered(3)
	c, _ = h.Attach(k, nil)
	none(t, c)
	c = resume(t, h, k, 1)
	if d := next(t, c); d.Seq != 2 {
		t.Fatalf("rewind from cursor 1: %+v", d)
	}
}

func TestDeliveredBecomesAcknowledgedAfterRewind(t *testing.T) {
	h := newHub(t, nil, Options{Rewind: 20 * time.Millisecond})
	k := Key{Role: "agent", ID: "a", Consumer: "c"}
	deliver(t, h, k, "x")
	c, _ := h.Attach(k, nil)
	next(t, c)
	c.Delivered(1)
	eventually.True(t, "the delivered entry acknowledged", func() bool { return h.Pending(k) == 0 })
	zero := uint64(0)
	c, _ = h.Attach(k, &zero)
	none(t, c)
}

// presenceLog records what a hub tells its Presence.
type presenceLog struct {
	mu  sync.Mutex
	log []string
}

func (p *presenceLog) Connected(k Key, caps []string) func() {
	p.add(fmt.Sprintf("on %s %v", k, caps))
	return func() { p.add("off " + k.String()) }
}

func (p *presenceLog) add(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.log = append(p.log, s)
}

// TestPresenceFollowsAttachAndDetach: the hub tells its Presence of every
// connection that attaches, with what it serves, and of its end once, also
// when a newer connection superseded it first.
func TestPresenceFollowsAttachAndDetach(t *testing.T) {
	p := &presenceLog{}
	h := newHub(t, nil, Options{Presence: p})
	k := Key{Role: "runner", ID: "r", Consumer: "c"}
	first, _ := h.Attach(k, nil, "echo", "sum")
	second, _ := h.Attach(k, nil, "echo")
	first.Detach()
	first.Detach()
	second.Detach()
	want := []string{"on runner/r/c [echo sum]", "on runner/r/c [echo]", "off runner/r/c", "off runner/r/c"}
	if fmt.Sprint(p.log) != fmt.Sprint(want) {
		t.Fatalf("presence heard %q, want %q", p.log, want)
	}
}
