// Package peer tracks who is connected and holds each consumer's outbox: the
// ordered, sequenced deliveries for one agent or runner connection identity
// that it has not acknowledged yet.
//
// Outboxes are durable. A delivery is staged into the same store batch as
// the fact that caused it, so the two are written atomically, and becomes
// visible to the consumer's connection only once that batch is committed
// (Publish). An outbox outlives connections: a consumer that reconnects under
// the same key takes it over and receives, in order, everything it has not
// acknowledged, also after a server restart.
//
// Acknowledgements are persisted asynchronously: losing one in a crash only
// means the delivery is sent again, which consumers absorb by sequence.
package peer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gatehouse-dev/gatehouse/store"
)

// Sentinel errors.
var (
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

// String renders the key; it is also the store id of the consumer.
func (k Key) String() string { return k.Role + "/" + k.ID + "/" + k.Consumer }

func (k Key) stream() string { return "o/" + k.String() }

// Delivery is one sequenced message for a consumer.
type Delivery struct {
	Seq  uint64
	Type string
	Data []byte
}

// Options configure a Hub.
type Options struct {
	// Store keeps outboxes durable; nil keeps them in memory only.
	Store *store.Store
	// OutboxLimit bounds the unacknowledged deliveries of one consumer; past
	// it the oldest are dropped and the consumer is told to re-hydrate.
	// Zero means 1024.
	OutboxLimit int
	// Retention drops unacknowledged deliveries older than this, with the
	// same notice; zero means 24h.
	Retention time.Duration
	// Rewind is how long deliveries written to a connection that cannot
	// acknowledge (Conn.Delivered) stay replayable for a consumer that
	// resumes from an earlier cursor: a written frame may still have been
	// lost with the socket. Zero means 1m.
	Rewind time.Duration
	// Logger receives warnings; nil discards.
	Logger *slog.Logger
}

// Hub holds every consumer's outbox. It is safe for concurrent use.
type Hub struct {
	o     Options
	log   *slog.Logger
	mu    sync.Mutex
	boxes map[Key]*outbox
	dirty map[Key]bool // acks or presence not yet persisted

	flushNow chan struct{}
	stop     chan struct{}
	stopped  chan struct{}
	stopOnce sync.Once
}

// entry states: a staged entry waits for its batch; only published ones are
// handed to connections.
const (
	staged = iota
	published
)

type entry struct {
	Delivery
	settle      string
	state       int
	at          time.Time
	deliveredAt time.Time // when a connection that cannot acknowledge wrote it
}

type outbox struct {
	key        Key
	next       uint64  // sequence of the next delivery
	pending    []entry // unacknowledged, in sequence order
	acked      uint64  // highest cumulative ack
	delivered  uint64  // highest delivery written to a connection that cannot acknowledge
	persisted  uint64  // highest ack already deleted from the store
	settled    []uint64
	lostBefore uint64 // deliveries below this were dropped unacknowledged
	conn       *Conn
	lastSeen   time.Time
	lost       bool
}

// record is an outbox's persistent metadata.
type record struct {
	Next       uint64    `msgpack:"n"`
	Acked      uint64    `msgpack:"a"`
	Delivered  uint64    `msgpack:"d"`
	LostBefore uint64    `msgpack:"l"`
	LastSeen   time.Time `msgpack:"s"`
	Lost       bool      `msgpack:"x"`
}

// stored is an outbox entry in the store.
type stored struct {
	Type   string    `msgpack:"t"`
	Data   []byte    `msgpack:"d"`
	Settle string    `msgpack:"k,omitempty"`
	At     time.Time `msgpack:"a"`
}

// kindPeer holds each outbox's record. Outboxes and their records are
// written with the store's lazy writes: the hub keeps them in memory while
// it runs and reads them back only when it starts, so Badger need not get
// every delivery that is acknowledged a moment later.
const kindPeer = "peer"

// NewHub loads the durable outboxes from o.Store and returns the hub.
func NewHub(ctx context.Context, o Options) (*Hub, error) {
	if o.OutboxLimit <= 0 {
		o.OutboxLimit = 1024
	}
	if o.Retention <= 0 {
		o.Retention = 24 * time.Hour
	}
	if o.Rewind <= 0 {
		o.Rewind = time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Hub{
		o: o, log: o.Logger, boxes: map[Key]*outbox{}, dirty: map[Key]bool{},
		flushNow: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{}),
	}
	if o.Store != nil {
		if err := h.load(ctx); err != nil {
			return nil, err
		}
	}
	go h.flushLoop()
	return h, nil
}

func parseKey(s string) (Key, bool) {
	parts := strings.SplitN(s, "/", 3)
	if len(parts) != 3 {
		return Key{}, false
	}
	return Key{Role: parts[0], ID: parts[1], Consumer: parts[2]}, true
}

func (h *Hub) load(ctx context.Context) error {
	recs := map[Key]record{}
	err := h.o.Store.Records(kindPeer, func(id string, decode func(any) error) bool {
		var r record
		if k, ok := parseKey(id); ok && decode(&r) == nil {
			recs[k] = r
		}
		return ctx.Err() == nil
	})
	if err != nil {
		return fmt.Errorf("peer: load outboxes: %w", err)
	}
	for k, r := range recs {
		b := &outbox{key: k, next: r.Next, acked: r.Acked, delivered: r.Delivered, persisted: r.Acked, lostBefore: r.LostBefore, lastSeen: r.LastSeen, lost: r.Lost}
		if b.next == 0 {
			b.next = 1
		}
		err := h.o.Store.Scan(k.stream(), r.Acked, func(seq uint64, data []byte) bool {
			var s stored
			if store.Decode(data, &s) == nil {
				b.pending = append(b.pending, entry{Delivery: Delivery{Seq: seq, Type: s.Type, Data: s.Data}, settle: s.Settle, state: published, at: s.At})
				if seq >= b.next {
					b.next = seq + 1
				}
			}
			return true
		})
		if err != nil {
			return fmt.Errorf("peer: load outbox %s: %w", k, err)
		}
		h.boxes[k] = b
	}
	return nil
}

func (h *Hub) box(k Key) *outbox {
	b := h.boxes[k]
	if b == nil {
		b = &outbox{key: k, next: 1, lastSeen: time.Now()}
		h.boxes[k] = b
	}
	return b
}

// Staged is a delivery written into a batch that is not committed yet.
type Staged struct {
	h   *Hub
	key Key
	seq uint64
}

// Stage reserves the next sequence of k's outbox for a delivery and adds its
// write to b. The caller commits b, then calls Publish (or Abort if the
// commit failed). settle, if not empty, names the delivery for Settle.
func (h *Hub) Stage(b *store.Batch, k Key, typ string, data []byte, settle string) *Staged {
	h.mu.Lock()
	defer h.mu.Unlock()
	box := h.box(k)
	box.lost = false
	e := entry{Delivery: Delivery{Seq: box.next, Type: typ, Data: data}, settle: settle, state: staged, at: time.Now()}
	box.next++
	box.pending = append(box.pending, e)
	if b != nil && h.o.Store != nil {
		b.AppendLazy(k.stream(), e.Seq, store.Encode(stored{Type: typ, Data: data, Settle: settle, At: e.at}))
		_ = b.PutLazy(kindPeer, k.String(), box.record())
	}
	h.trimLocked(box, b)
	return &Staged{h: h, key: k, seq: e.Seq}
}

func (b *outbox) record() record {
	return record{Next: b.next, Acked: b.acked, Delivered: b.delivered, LostBefore: b.lostBefore, LastSeen: b.lastSeen, Lost: b.lost}
}

// trimLocked enforces the count and age bounds. Dropped deliveries are
// remembered as lostBefore, so the consumer is told rather than left with a
// silent gap.
func (h *Hub) trimLocked(box *outbox, b *store.Batch) {
	cut := 0
	cutoff := time.Now().Add(-h.o.Retention)
	for cut < len(box.pending) && (len(box.pending)-cut > h.o.OutboxLimit || box.pending[cut].at.Before(cutoff)) && box.pending[cut].state == published {
		cut++
	}
	if cut == 0 {
		return
	}
	last := box.pending[cut-1].Seq
	h.log.Warn("outbox over its bound; dropping unacknowledged deliveries", "peer", box.key.String(), "dropped", cut, "through", last)
	for _, e := range box.pending[:cut] {
		if b != nil && h.o.Store != nil {
			b.DeleteEntryLazy(box.key.stream(), e.Seq)
		}
	}
	box.pending = append(box.pending[:0:0], box.pending[cut:]...)
	box.lostBefore = last + 1
	if box.acked < last {
		box.acked, box.persisted = last, last
	}
	if b != nil && h.o.Store != nil {
		_ = b.PutLazy(kindPeer, box.key.String(), box.record())
	}
}

// Publish makes a committed delivery visible to the consumer's connection.
func (s *Staged) Publish() { s.h.finish(s, true) }

// Abort withdraws a delivery whose batch failed. Its sequence stays unused:
// sequences increase but may skip, and a skip never hides a delivery.
func (s *Staged) Abort() { s.h.finish(s, false) }

func (h *Hub) finish(s *Staged, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	box := h.boxes[s.key]
	if box == nil {
		return
	}
	for i := range box.pending {
		if box.pending[i].Seq != s.seq {
			continue
		}
		if ok {
			box.pending[i].state = published
		} else {
			box.pending = append(box.pending[:i:i], box.pending[i+1:]...)
		}
		break
	}
	if box.conn != nil {
		box.conn.wake()
	}
}

// Settle acknowledges, on the consumer's behalf, the delivery named settle:
// the consumer acted on it (a runner reported a job started or finished).
// The delete is added to b; the returned function applies it in memory once
// b is committed.
func (h *Hub) Settle(b *store.Batch, k Key, settle string) func() {
	h.mu.Lock()
	defer h.mu.Unlock()
	box := h.boxes[k]
	if box == nil || settle == "" {
		return func() {}
	}
	for _, e := range box.pending {
		if e.settle == settle {
			if b != nil && h.o.Store != nil {
				b.DeleteEntryLazy(k.stream(), e.Seq)
			}
			seq := e.Seq
			return func() { h.dropSeq(k, seq) }
		}
	}
	return func() {}
}

func (h *Hub) dropSeq(k Key, seq uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	box := h.boxes[k]
	if box == nil {
		return
	}
	for i, e := range box.pending {
		if e.Seq == seq {
			box.pending = append(box.pending[:i:i], box.pending[i+1:]...)
			return
		}
	}
}

// Deliver stages and publishes a delivery in its own write: for deliveries
// that are not tied to another fact.
func (h *Hub) Deliver(ctx context.Context, k Key, typ string, data []byte) (uint64, error) {
	var b store.Batch
	s := h.Stage(&b, k, typ, data, "")
	if h.o.Store != nil {
		if err := h.o.Store.Write(ctx, &b); err != nil {
			s.Abort()
			return 0, fmt.Errorf("peer: deliver to %s: %w", k, err)
		}
	}
	s.Publish()
	return s.seq, nil
}

// Forget drops k's outbox and ends its connection with ErrForgotten; the
// consumer is remembered as lost.
func (h *Hub) Forget(k Key) {
	h.mu.Lock()
	box := h.boxes[k]
	if box == nil {
		h.mu.Unlock()
		return
	}
	if box.conn != nil {
		box.conn.end(ErrForgotten)
		box.conn = nil
	}
	var b store.Batch
	for _, e := range box.pending {
		b.DeleteEntryLazy(k.stream(), e.Seq)
	}
	box.pending = nil
	if last := box.next - 1; box.acked < last {
		box.acked, box.persisted = last, last
	}
	box.lost = true
	box.lastSeen = time.Now()
	_ = b.PutLazy(kindPeer, k.String(), box.record())
	h.mu.Unlock()
	h.write(&b)
}

func (h *Hub) write(b *store.Batch) {
	if h.o.Store == nil || b.Len() == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.o.Store.Write(ctx, b); err != nil {
		h.log.Warn("persist outbox state", "err", err)
	}
}

// flushLoop persists acknowledgements and presence in the background.
func (h *Hub) flushLoop() {
	defer close(h.stopped)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	sweep := time.NewTicker(max(10*time.Millisecond, min(time.Minute, h.o.Rewind/2)))
	defer sweep.Stop()
	for {
		select {
		case <-t.C:
			h.flush()
		case <-h.flushNow:
			h.flush()
		case <-sweep.C:
			h.sweep()
		case <-h.stop:
			h.flush()
			return
		}
	}
}

// sweep applies the age bound to idle outboxes and turns deliveries
// written past their rewind window into acknowledgements.
func (h *Hub) sweep() {
	var b store.Batch
	cutoff := time.Now().Add(-h.o.Rewind)
	h.mu.Lock()
	for k, box := range h.boxes {
		h.trimLocked(box, &b)
		var upTo uint64
		for _, e := range box.pending {
			if e.deliveredAt.IsZero() || e.deliveredAt.After(cutoff) {
				break
			}
			upTo = e.Seq
		}
		if upTo > 0 {
			box.ackLocked(upTo)
			h.dirty[k] = true
		}
	}
	h.mu.Unlock()
	h.write(&b)
}

func (h *Hub) flush() {
	var b store.Batch
	h.mu.Lock()
	for k := range h.dirty {
		box := h.boxes[k]
		if box == nil {
			continue
		}
		if h.o.Store != nil {
			for seq := box.persisted + 1; seq <= box.acked && seq < box.next; seq++ {
				b.DeleteEntryLazy(k.stream(), seq)
			}
			for _, seq := range box.settled {
				b.DeleteEntryLazy(k.stream(), seq)
			}
			_ = b.PutLazy(kindPeer, k.String(), box.record())
		}
		box.persisted = box.acked
		box.settled = nil
	}
	clear(h.dirty)
	h.mu.Unlock()
	h.write(&b)
}

// Close persists pending acknowledgements and stops the background work.
func (h *Hub) Close() {
	h.stopOnce.Do(func() {
		close(h.stop)
		<-h.stopped
	})
}

// Epoch-independent view of one consumer, for the peers listing.

// Info describes one consumer.
type Info struct {
	Role       string    `json:"role"`
	ID         string    `json:"id"`
	ConsumerID string    `json:"consumer_id"`
	State      string    `json:"state"` // online, offline or lost
	LastSeen   time.Time `json:"last_seen"`
	Acked      uint64    `json:"acked_sequence"`
	Latest     uint64    `json:"latest_sequence"`
	Pending    int       `json:"pending"`
}

// Peers lists consumers, filtered by role when role is not empty, in key order.
func (h *Hub) Peers(role string) []Info {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := []Info{}
	for k, b := range h.boxes {
		if role != "" && k.Role != role {
			continue
		}
		state := "offline"
		switch {
		case b.conn != nil:
			state = "online"
		case b.lost:
			state = "lost"
		}
		out = append(out, Info{Role: k.Role, ID: k.ID, ConsumerID: k.Consumer, State: state, LastSeen: b.lastSeen,
			Acked: b.acked, Latest: b.next - 1, Pending: len(b.pending)})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return a.Role+"/"+a.ID+"/"+a.ConsumerID < b.Role+"/"+b.ID+"/"+b.ConsumerID
	})
	return out
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

// Ack acknowledges k's deliveries up to seq without a connection in hand:
// for consumers that read over SSE and acknowledge over HTTP.
func (h *Hub) Ack(k Key, seq uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := h.boxes[k]
	if b == nil {
		return false
	}
	b.ackLocked(min(seq, b.next-1))
	b.lastSeen = time.Now()
	h.dirty[k] = true
	return true
}
