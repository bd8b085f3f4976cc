// Package peer tracks who is connected and holds each peer's outbox: the
// ordered, sequenced deliveries waiting to be sent to one consumer (an agent
// or runner connection identity) and not yet acknowledged.
//
// An outbox outlives connections: a consumer that reconnects under the same
// key takes over the outbox and receives, in order, everything it had not
// acknowledged. A newer connection supersedes an older one of the same key.
package peer

import (
	"errors"
	"fmt"
	"sync"
)

// Sentinel errors.
var (
	// ErrOutboxFull means the consumer has too many unacknowledged deliveries.
	ErrOutboxFull = errors.New("peer: outbox full")
	// ErrSuperseded ends a connection that a newer one of the same key replaced.
	ErrSuperseded = errors.New("peer: superseded by a newer connection")
	// ErrForgotten ends a connection whose peer the gateway gave up on.
	ErrForgotten = errors.New("peer: forgotten")
)

// Key identifies a consumer.
type Key struct {
	Role     string
	ID       string
	Consumer string
}

// String renders the key for logs.
func (k Key) String() string { return fmt.Sprintf("%s/%s/%s", k.Role, k.ID, k.Consumer) }

// Delivery is one sequenced message for a consumer.
type Delivery struct {
	Seq  uint64
	Type string
	Data []byte
}

// Options configure a Hub. The zero value is usable.
type Options struct {
	// OutboxLimit bounds the unacknowledged deliveries of one consumer;
	// zero means 1024.
	OutboxLimit int
}

// Hub holds every consumer's outbox. It is safe for concurrent use.
type Hub struct {
	limit int
	mu    sync.Mutex
	boxes map[Key]*outbox
}

type outbox struct {
	next    uint64     // sequence of the next delivery
	pending []Delivery // unacknowledged, in order
	conn    *Conn
}

// NewHub returns an empty hub.
func NewHub(o Options) *Hub {
	if o.OutboxLimit <= 0 {
		o.OutboxLimit = 1024
	}
	return &Hub{limit: o.OutboxLimit, boxes: map[Key]*outbox{}}
}

func (h *Hub) box(k Key) *outbox {
	b := h.boxes[k]
	if b == nil {
		b = &outbox{next: 1}
		h.boxes[k] = b
	}
	return b
}

// Deliver appends a delivery to k's outbox and wakes its connection.
func (h *Hub) Deliver(k Key, typ string, data []byte) (uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := h.box(k)
	if len(b.pending) >= h.limit {
		return 0, fmt.Errorf("%w: %s holds %d unacknowledged deliveries", ErrOutboxFull, k, len(b.pending))
	}
	d := Delivery{Seq: b.next, Type: typ, Data: data}
	b.next++
	b.pending = append(b.pending, d)
	if b.conn != nil {
		b.conn.wake()
	}
	return d.Seq, nil
}

// Attach makes a new connection the receiver of k's outbox. It starts with
// the oldest unacknowledged delivery. A previous connection of k ends with
// ErrSuperseded.
func (h *Hub) Attach(k Key) *Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := h.box(k)
	if b.conn != nil {
		b.conn.end(ErrSuperseded)
	}
	c := &Conn{h: h, key: k, box: b, signal: make(chan struct{}, 1), done: make(chan struct{})}
	if len(b.pending) > 0 {
		c.sent = b.pending[0].Seq - 1
		c.wake()
	} else {
		c.sent = b.next - 1
	}
	b.conn = c
	return c
}

// Forget drops k's outbox and ends its connection with ErrForgotten.
func (h *Hub) Forget(k Key) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if b := h.boxes[k]; b != nil {
		if b.conn != nil {
			b.conn.end(ErrForgotten)
		}
		delete(h.boxes, k)
	}
}

// Pending returns how many deliveries k has not acknowledged.
func (h *Hub) Pending(k Key) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if b := h.boxes[k]; b != nil {
		return len(b.pending)
	}
	return 0
}

// Conn is one connection's view of an outbox.
type Conn struct {
	h      *Hub
	key    Key
	box    *outbox
	sent   uint64 // highest sequence handed out on this connection
	signal chan struct{}
	done   chan struct{}
	err    error
}

func (c *Conn) wake() {
	select {
	case c.signal <- struct{}{}:
	default:
	}
}

// end closes the connection's done channel; the caller holds h.mu.
func (c *Conn) end(err error) {
	select {
	case <-c.done:
	default:
		c.err = err
		close(c.done)
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
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	return c.err
}

// Next returns the next delivery not yet handed out on this connection.
func (c *Conn) Next() (Delivery, bool) {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	for _, d := range c.box.pending {
		if d.Seq > c.sent {
			c.sent = d.Seq
			return d, true
		}
	}
	return Delivery{}, false
}

// Ack acknowledges every delivery up to and including seq: they are never
// sent again.
func (c *Conn) Ack(seq uint64) {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	i := 0
	for i < len(c.box.pending) && c.box.pending[i].Seq <= seq {
		i++
	}
	if i > 0 {
		clear(c.box.pending[:i])
		c.box.pending = c.box.pending[i:]
	}
}

// Detach ends this connection's hold on the outbox; undelivered and
// unacknowledged deliveries wait for the next connection.
func (c *Conn) Detach() {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	if c.box.conn == c {
		c.box.conn = nil
	}
	c.end(nil)
}
