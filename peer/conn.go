package peer

import (
	"context"
	"sync"
	"time"
)

// Conn is one connection's view of an outbox.
type Conn struct {
	h      *Hub
	key    Key
	box    *outbox
	sent   uint64 // highest sequence handed out on this connection
	signal chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	err    error
	// onWake is set under both locks and read under either.
	onWake func()
	// gone tells Options.Presence that the connection ended; Detach runs
	// it once.
	gone     func()
	goneOnce sync.Once
}

// Reset tells a consumer that it cannot resume where it asked to: its cursor
// points past what this store holds (the store was wiped or it belongs to
// another server), or deliveries it had not acknowledged were dropped. It
// should re-hydrate its state, then continue from ResumeFrom.
type Reset struct {
	Reason     string `json:"reason"` // "cursor_ahead" or "history_gone"
	ResumeFrom uint64 `json:"resume_from"`
	Latest     uint64 `json:"latest_sequence"`
}

// Reset reasons.
const (
	// ResetCursorAhead: the cursor is past anything this store sent.
	ResetCursorAhead = "cursor_ahead"
	// ResetHistoryGone: unacknowledged deliveries before ResumeFrom were dropped.
	ResetHistoryGone = "history_gone"
	// ResetEpochChanged: the cursor belongs to another store (wiped or restored).
	ResetEpochChanged = "epoch_changed"
)

// Attach makes a new connection the receiver of k's outbox and ends any
// previous connection of k with ErrSuperseded. If cursor is not nil the
// consumer says it processed everything up to *cursor: that much is
// acknowledged. Delivery starts with the oldest unacknowledged entry. A non-nil
// Reset means the consumer must be told it cannot resume without a gap. caps
// is what the consumer serves (a runner's capabilities), for
// Options.Presence, which hears of the connection before Attach returns;
// Detach ends it.
func (h *Hub) Attach(k Key, cursor *uint64, caps ...string) (*Conn, *Reset) {
	c, reset := h.attach(k, cursor)
	if h.o.Presence != nil {
		c.gone = h.o.Presence.Connected(k, caps)
	}
	return c, reset
}

func (h *Hub) attach(k Key, cursor *uint64) (*Conn, *Reset) {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := h.box(k)
	if b.conn != nil {
		b.conn.end(ErrSuperseded)
	}
	b.lost = false
	b.lastSeen = time.Now()
	h.dirty[k] = true
	c := &Conn{h: h, key: k, box: b, signal: make(chan struct{}, 1), done: make(chan struct{})}
	b.conn = c
	var reset *Reset
	latest := b.next - 1
	if cursor != nil {
		switch {
		case *cursor > latest:
			reset = &Reset{Reason: ResetCursorAhead, ResumeFrom: b.acked + 1, Latest: latest}
		case b.lostBefore > 0 && *cursor+1 < b.lostBefore:
			reset = &Reset{Reason: ResetHistoryGone, ResumeFrom: b.lostBefore, Latest: latest}
		default:
			b.ackLocked(*cursor)
		}
	}
	// Without a cursor the consumer starts after what was already written
	// to it; with one, from its cursor, replaying what it may have missed.
	c.sent = b.acked
	if cursor == nil {
		c.sent = max(b.acked, b.delivered)
		if b.lostBefore > 0 && b.lostBefore-1 > c.sent {
			// Deliveries it never saw were dropped by the outbox bounds.
			reset = &Reset{Reason: ResetHistoryGone, ResumeFrom: b.lostBefore, Latest: latest}
			b.delivered = b.lostBefore - 1
		}
	}
	if b.pending.search(c.sent+1) < b.pending.len() {
		c.wake()
	}
	return c, reset
}

func (c *Conn) wake() {
	select {
	case c.signal <- struct{}{}:
	default:
	}
	if c.onWake != nil {
		c.onWake()
	}
}

// OnWake makes f run each time a value is sent on Ready and once when Done
// is closed, so that a connection can be served without a goroutine blocked
// on those channels. f runs with the hub's or the connection's lock held: it
// must return quickly and must not call into the Hub or the Conn.
func (c *Conn) OnWake(f func()) {
	c.h.mu.Lock()
	c.mu.Lock()
	c.onWake = f
	c.mu.Unlock()
	c.h.mu.Unlock()
}

// end closes the connection's done channel once.
func (c *Conn) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.done:
	default:
		c.err = err
		close(c.done)
		if c.onWake != nil {
			c.onWake()
		}
	}
}

// Key returns the connection's consumer key.
func (c *Conn) Key() Key { return c.key }

// Ready receives a value when deliveries may be waiting.
func (c *Conn) Ready() <-chan struct{} { return c.signal }

// Done is closed when the connection was superseded or forgotten.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err says why Done was closed.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Next returns the next published delivery not yet handed out on this
// connection. It never skips past a staged one, so deliveries leave in
// sequence order even when their batches commit out of order.
func (c *Conn) Next() (Delivery, bool) {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	q := &c.box.pending
	if i := q.search(c.sent + 1); i < q.len() {
		if e := q.at(i); e.state == published {
			c.sent = e.Seq
			return e.Delivery, true
		}
	}
	return Delivery{}, false
}

// Wait returns the next delivery as Next does, waiting for one to be
// published: what an in-process consumer serving the outbox on its own
// goroutine calls. ok is false once the connection ends (Err says why) or
// ctx does.
func (c *Conn) Wait(ctx context.Context) (d Delivery, ok bool) {
	for {
		if d, ok = c.Next(); ok {
			return d, true
		}
		select {
		case <-c.signal:
		case <-c.done:
			return Delivery{}, false
		case <-ctx.Done():
			return Delivery{}, false
		}
	}
}

// Ack acknowledges every delivery up to and including seq: they are never
// sent again. Acknowledging beyond what was sent is capped.
func (c *Conn) Ack(seq uint64) {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	c.box.ackLocked(min(seq, c.sent))
	c.box.lastSeen = time.Now()
	c.h.dirty[c.key] = true
}

func (b *outbox) ackLocked(seq uint64) {
	if seq <= b.acked {
		return
	}
	i := 0
	for n := b.pending.len(); i < n; i++ {
		if e := b.pending.at(i); e.Seq > seq || e.state != published {
			break
		}
	}
	b.pending.popFront(i)
	b.acked = seq
}

// Delivered records that the deliveries up to seq were written to this
// connection, which cannot acknowledge them (the kernel API's SSE clients).
// A reconnect without a cursor starts after them; one with an earlier
// cursor still gets them, for Options.Rewind, after which they count as
// acknowledged.
func (c *Conn) Delivered(seq uint64) {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	seq = min(seq, c.sent)
	now := time.Now()
	// Entries up to box.marked carry their time already, so each entry is
	// visited once however often this is called.
	if seq > c.box.marked {
		q := &c.box.pending
		for i := q.search(c.box.marked + 1); i < q.len(); i++ {
			e := q.at(i)
			if e.Seq > seq {
				break
			}
			e.deliveredAt = now
		}
		c.box.marked = seq
	}
	if seq > c.box.delivered {
		c.box.delivered = seq
		c.box.lastSeen = now
		c.h.dirty[c.key] = true
	}
}

// Detach ends this connection's hold on the outbox, and tells
// Options.Presence that it ended; unacknowledged deliveries wait for the
// next connection.
func (c *Conn) Detach() {
	c.h.mu.Lock()
	if c.box.conn == c {
		c.box.conn = nil
		c.box.lastSeen = time.Now()
		c.h.dirty[c.key] = true
	}
	c.h.mu.Unlock()
	c.end(nil)
	if c.gone != nil {
		c.goneOnce.Do(c.gone)
	}
}
