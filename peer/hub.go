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
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/option"
	"github.com/gatehouse-dev/gatehouse/store"
)

// Sentinel errors.
var (
	// ErrSuperseded ends a connection that a newer one of the same key replaced.
	ErrSuperseded = errors.New("peer: superseded by a newer connection")
	// ErrForgotten ends a connection whose peer the gateway gave up on.
	ErrForgotten = errors.New("peer: forgotten")
	// ErrUnavailable: the store refused to persist acknowledgements (see
	// Flush); the store's own error is wrapped too.
	ErrUnavailable = errors.New("peer: acknowledgements cannot be persisted")
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

// Options configure a Hub. Zero bounds and intervals take the values of
// Defaults.
type Options struct {
	// Store keeps outboxes durable; nil keeps them in memory only.
	Store *store.Store
	// OutboxLimit bounds the unacknowledged deliveries of one consumer; past
	// it the oldest are dropped and the consumer is told to re-hydrate.
	OutboxLimit int
	// Retention drops unacknowledged deliveries older than this, with the
	// same notice.
	Retention time.Duration
	// Rewind is how long deliveries written to a connection that cannot
	// acknowledge (Conn.Delivered) stay replayable for a consumer that
	// resumes from an earlier cursor: a written frame may still have been
	// lost with the socket.
	Rewind time.Duration
	// ConsumerRetention is how long a consumer that has no connection and
	// nothing left to deliver is remembered after it was last seen; then
	// it is collected with its cursor, and a consumer that comes back
	// under the same key starts a new outbox (a cursor it names is ahead
	// of it: stream.reset cursor_ahead). Lost consumers (Forget) are
	// collected the same way.
	ConsumerRetention time.Duration
	// ReportInterval is how often deliveries dropped by the outbox bounds
	// are reported: one log line per consumer that dropped any, with the
	// count, instead of one per drop.
	ReportInterval time.Duration
	// Logger receives warnings; nil discards.
	Logger *slog.Logger
	// Presence, when set, is told of every connection that attaches and
	// of its end: the hub is the one place that knows who is connected.
	Presence Presence
}

// Presence learns who is connected from the hub. Connected is called, outside
// the hub's locks, for each connection that attaches (caps is what it serves:
// a runner's capabilities), and the function it returns when that connection
// detaches. A newer connection of the same consumer attaches before the one
// it supersedes detaches.
type Presence interface {
	Connected(k Key, caps []string) (disconnected func())
}

// Defaults returns the value each zero bound and interval of Options
// takes; the other fields are zero.
func Defaults() Options {
	return Options{
		OutboxLimit:       1024,
		Retention:         24 * time.Hour,
		Rewind:            time.Minute,
		ConsumerRetention: time.Hour,
		ReportInterval:    time.Minute,
	}
}

// Hub holds every consumer's outbox. It is safe for concurrent use.
type Hub struct {
	o     Options
	log   *slog.Logger
	mu    sync.Mutex
	boxes map[Key]*outbox
	dirty map[Key]bool // acks or presence not yet persisted
	// dropped counts, per consumer, what the bounds dropped since the last
	// report; stats are the totals since start.
	dropped map[Key]*dropCount
	stats   Stats
	flushMu sync.Mutex // one flush or sweep at a time, its write included
	// failing is the streak of failed writes (under flushMu): while the
	// store refuses them, flushes wait longer and longer, and the log
	// says so once a minute rather than at every try.
	failing failStreak
	// started is when the hub was opened: a restart counts as a
	// disconnect, so no consumer is collected before ConsumerRetention has
	// passed since then, as each gets its grace period again.
	started time.Time

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

// newOutbox returns k's outbox, empty, with the store ids made from k.
func newOutbox(k Key) *outbox {
	return &outbox{key: k, id: k.String(), entries: k.stream(), next: 1}
}

type outbox struct {
	key Key
	// id and entries are key.String() and key.stream(), the store ids of
	// the outbox's record and of its entries, made once: every delivery
	// and acknowledgement writes under them.
	id, entries string

	next      uint64 // sequence of the next delivery
	pending   queue  // unacknowledged, in sequence order
	acked     uint64 // highest cumulative ack
	delivered uint64 // highest delivery written to a connection that cannot acknowledge
	// marked is the highest sequence whose entry, if still pending, has
	// its deliveredAt set: Delivered resumes from there.
	marked     uint64
	persisted  uint64 // highest ack already deleted from the store
	lostBefore uint64 // deliveries below this were dropped unacknowledged
	conn       *Conn
	lastSeen   time.Time
	lost       bool
}

// dropCount is what the bounds dropped from one outbox since the last report.
type dropCount struct {
	unacked, rewind uint64
	through         uint64
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
	d := Defaults()
	option.Default(&o.OutboxLimit, d.OutboxLimit)
	option.Default(&o.Retention, d.Retention)
	option.Default(&o.Rewind, d.Rewind)
	option.Default(&o.ConsumerRetention, d.ConsumerRetention)
	option.Default(&o.ReportInterval, d.ReportInterval)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Hub{
		o: o, log: o.Logger, boxes: map[Key]*outbox{}, dirty: map[Key]bool{}, dropped: map[Key]*dropCount{}, started: time.Now(),
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
		b := newOutbox(k)
		b.next = max(r.Next, 1)
		b.acked, b.delivered, b.persisted, b.lostBefore, b.lastSeen, b.lost = r.Acked, r.Delivered, r.Acked, r.LostBefore, r.LastSeen, r.Lost
		err := h.o.Store.Scan(b.entries, r.Acked, func(seq uint64, data []byte) bool {
			var s stored
			if store.Decode(data, &s) == nil {
				b.pending.push(entry{Delivery: Delivery{Seq: seq, Type: s.Type, Data: s.Data}, settle: s.Settle, state: published, at: s.At})
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
		b = newOutbox(k)
		b.lastSeen = time.Now()
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
	box.pending.push(e)
	if b != nil && h.o.Store != nil {
		b.AppendLazy(box.entries, e.Seq, store.Encode(stored{Type: typ, Data: data, Settle: settle, At: e.at}))
		_ = b.PutLazy(kindPeer, box.id, box.record())
	}
	h.trimLocked(box, b)
	return &Staged{h: h, key: k, seq: e.Seq}
}

func (b *outbox) record() record {
	return record{Next: b.next, Acked: b.acked, Delivered: b.delivered, LostBefore: b.lostBefore, LastSeen: b.lastSeen, Lost: b.lost}
}

// trimLocked enforces the count and age bounds. Dropped deliveries are
// remembered as lostBefore, so the consumer is told rather than left with a
// silent gap, and counted for the next report. It costs O(1) per dropped
// delivery: a consumer that never acknowledges pays no more per push than
// one that does.
func (h *Hub) trimLocked(box *outbox, b *store.Batch) {
	cut := 0
	var rewind uint64
	cutoff := time.Now().Add(-h.o.Retention)
	for n := box.pending.len(); cut < n; cut++ {
		e := box.pending.at(cut)
		if e.state != published || (n-cut <= h.o.OutboxLimit && !e.at.Before(cutoff)) {
			break
		}
		if !e.deliveredAt.IsZero() {
			rewind++
		}
	}
	if cut == 0 {
		return
	}
	last := box.pending.at(cut - 1).Seq
	box.pending.popFront(cut)
	box.lostBefore = last + 1
	box.acked = last
	switch {
	case b != nil && h.o.Store != nil:
		// Everything up to last is now acknowledged or dropped: delete it
		// all, acknowledgements not yet persisted included.
		h.deleteAckedLocked(box, b)
		_ = b.PutLazy(kindPeer, box.id, box.record())
		box.persisted = last
	case h.o.Store != nil:
		h.dirty[box.key] = true
	}
	d := h.dropped[box.key]
	if d == nil {
		d = &dropCount{}
		h.dropped[box.key] = d
	}
	d.unacked += uint64(cut) - rewind
	d.rewind += rewind
	d.through = last
	h.stats.DroppedUnacknowledged += uint64(cut) - rewind
	h.stats.DroppedRewind += rewind
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
	if i := box.pending.find(s.seq); i >= 0 {
		if ok {
			box.pending.at(i).state = published
		} else {
			box.pending.removeAt(i)
		}
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
	for i := range box.pending.len() {
		if e := box.pending.at(i); e.settle == settle {
			if b != nil && h.o.Store != nil {
				b.DeleteEntryLazy(box.entries, e.Seq)
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
	if box := h.boxes[k]; box != nil {
		if i := box.pending.find(seq); i >= 0 {
			box.pending.removeAt(i)
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
// consumer is remembered as lost until ConsumerRetention has passed.
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
	box.pending.clearAll()
	box.acked = max(box.acked, box.next-1)
	box.lost = true
	box.lastSeen = time.Now()
	var b store.Batch
	if h.o.Store != nil {
		h.deleteAckedLocked(box, &b)
		_ = b.PutLazy(kindPeer, box.id, box.record())
	}
	box.persisted = box.acked
	h.mu.Unlock()
	h.flushMu.Lock()
	_ = h.write(&b) // write logs a failure
	h.flushMu.Unlock()
}

// write persists outbox state and returns the store's error if it could
// not; failures are logged as a streak (see failStreak). The caller holds
// flushMu.
func (h *Hub) write(b *store.Batch) error {
	if h.o.Store == nil || b.Len() == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := h.o.Store.Write(ctx, b)
	h.failing.record(h.log, err, time.Now())
	return err
}

// failStreak logs a streak of failed writes: the first failure, then the
// count once a minute while they go on, then the recovery.
type failStreak struct {
	count    int // failures since the last line
	total    int // failures in the streak
	since    time.Time
	logged   time.Time
	deferred time.Time // no flush before it
}

// failLogEvery is how often a streak of failures is logged.
const failLogEvery = time.Minute

func (f *failStreak) record(log *slog.Logger, err error, now time.Time) {
	switch {
	case err == nil && f.total > 0:
		log.Info("outbox state persisted again", "failures", f.total, "for", now.Sub(f.since).Round(time.Second))
		*f = failStreak{}
	case err == nil:
	case f.total == 0:
		log.Warn("cannot persist outbox state; retrying with back-off", "err", err)
		f.total, f.since, f.logged = 1, now, now
		f.deferred = now.Add(time.Second)
	default:
		f.total++
		f.count++
		if now.Sub(f.logged) >= failLogEvery {
			log.Warn("still cannot persist outbox state", "failures", f.count, "since", f.since, "err", err)
			f.count, f.logged = 0, now
		}
		f.deferred = now.Add(min(30*time.Second, time.Second<<min(f.total, 5)))
	}
}

// flushLoop persists acknowledgements and presence in the background,
// applies the bounds to idle outboxes, collects forgotten consumers and
// reports drops.
func (h *Hub) flushLoop() {
	defer close(h.stopped)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	sweep := time.NewTicker(max(10*time.Millisecond, min(time.Minute, h.o.Rewind/2, h.o.ConsumerRetention/2)))
	defer sweep.Stop()
	report := time.NewTicker(h.o.ReportInterval)
	defer report.Stop()
	for {
		select {
		case <-t.C:
			_ = h.flush(false) // write logs a failure
		case <-h.flushNow:
			_ = h.flush(false)
		case <-sweep.C:
			h.sweep()
		case <-report.C:
			h.report()
		case <-h.stop:
			_ = h.flush(true)
			h.report()
			return
		}
	}
}

// sweep applies the age bound to idle outboxes, turns deliveries written
// past their rewind window into acknowledgements, and collects consumers
// that have been gone, with nothing to deliver, for ConsumerRetention.
func (h *Hub) sweep() {
	// Serialized with flush, writes included: a flush in flight must not
	// put back the record of a consumer this sweep collects.
	h.flushMu.Lock()
	defer h.flushMu.Unlock()
	var b store.Batch
	now := time.Now()
	cutoff := now.Add(-h.o.Rewind)
	gone := now.Add(-h.o.ConsumerRetention)
	h.mu.Lock()
	for k, box := range h.boxes {
		h.trimLocked(box, &b)
		var upTo uint64
		for i := range box.pending.len() {
			e := box.pending.at(i)
			if e.deliveredAt.IsZero() || e.deliveredAt.After(cutoff) {
				break
			}
			upTo = e.Seq
		}
		if upTo > 0 {
			box.ackLocked(upTo)
			h.dirty[k] = true
		}
		if box.conn == nil && box.pending.len() == 0 && box.lastSeen.Before(gone) && h.started.Before(gone) {
			h.collectLocked(box, &b)
		}
	}
	h.mu.Unlock()
	_ = h.write(&b) // write logs a failure
}

// collectLocked forgets box for good: its record and the entries that are
// still stored go with b.
func (h *Hub) collectLocked(box *outbox, b *store.Batch) {
	k := box.key
	if h.o.Store != nil {
		h.deleteAckedLocked(box, b)
		b.DeleteLazy(kindPeer, box.id)
	}
	delete(h.boxes, k)
	delete(h.dirty, k)
	h.stats.Collected++
}

// deleteAckedLocked adds to b the deletes of the entries acknowledged since
// the last persisted acknowledgement. Every entry up to box.acked is
// acknowledged, settled or dropped; each delete is written once, as
// box.persisted then moves up.
func (h *Hub) deleteAckedLocked(box *outbox, b *store.Batch) {
	for seq := box.persisted + 1; seq <= box.acked && seq < box.next; seq++ {
		b.DeleteEntryLazy(box.entries, seq)
	}
}

// Flush persists the acknowledgements and presence not written yet, and
// returns once they and any background write of them in flight are
// durable: after it, the hub has nothing waiting to be written until
// consumers act again. If the store refused the write, Flush returns its
// error (matching ErrUnavailable) and the changes wait for the next flush.
//
// Acknowledgements are otherwise persisted in the background, within about
// 50 ms; a consumer told that its acknowledgement is durable (an HTTP ack
// answered, an ack frame replied to) is told so after a Flush. Concurrent
// calls share writes: a call whose changes another call is writing waits
// for that write and then finds nothing left to write.
func (h *Hub) Flush() error { return h.flush(true) }

// flush persists what is dirty. Unless forced, it waits out the back-off
// after a failed write (see failStreak).
func (h *Hub) flush(force bool) error {
	// One flush at a time, its write included, so that Flush returns only
	// after a background flush that was writing has finished.
	h.flushMu.Lock()
	defer h.flushMu.Unlock()
	if !force && time.Now().Before(h.failing.deferred) {
		return nil
	}
	var b store.Batch
	h.mu.Lock()
	type was struct {
		k         Key
		persisted uint64
	}
	written := make([]was, 0, len(h.dirty))
	for k := range h.dirty {
		box := h.boxes[k]
		if box == nil {
			continue
		}
		written = append(written, was{k, box.persisted})
		if h.o.Store != nil {
			h.deleteAckedLocked(box, &b)
			_ = b.PutLazy(kindPeer, box.id, box.record())
		}
		box.persisted = box.acked
	}
	clear(h.dirty)
	h.mu.Unlock()
	err := h.write(&b)
	if err != nil {
		// Written again with the next flush that goes through.
		h.mu.Lock()
		for _, w := range written {
			if box := h.boxes[w.k]; box != nil {
				box.persisted = min(box.persisted, w.persisted)
				h.dirty[w.k] = true
			}
		}
		h.mu.Unlock()
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return nil
}

// report logs, for each consumer whose outbox dropped deliveries since the
// last report, one line with the counts. Deliveries that were never
// acknowledged are a warning (the consumer gets stream.reset history_gone);
// deliveries already written to a connection that cannot acknowledge only
// leave its rewind window, which is routine for a busy consumer that never
// acknowledges, so they are logged at debug level.
func (h *Hub) report() {
	h.mu.Lock()
	if len(h.dropped) == 0 {
		h.mu.Unlock()
		return
	}
	type line struct {
		k Key
		d dropCount
	}
	lines := make([]line, 0, len(h.dropped))
	for k, d := range h.dropped {
		lines = append(lines, line{k, *d})
	}
	clear(h.dropped)
	h.mu.Unlock()
	slices.SortFunc(lines, func(a, b line) int { return cmp.Compare(a.k.String(), b.k.String()) })
	for _, l := range lines {
		if l.d.unacked > 0 {
			h.log.Warn("outbox over its bound; dropped unacknowledged deliveries", "peer", l.k.String(),
				"dropped", l.d.unacked, "rewind_dropped", l.d.rewind, "through", l.d.through, "interval", h.o.ReportInterval)
		} else {
			h.log.Debug("outbox over its bound; rewind window shortened", "peer", l.k.String(),
				"rewind_dropped", l.d.rewind, "through", l.d.through, "interval", h.o.ReportInterval)
		}
	}
}

// Close persists pending acknowledgements and stops the background work.
func (h *Hub) Close() {
	h.stopOnce.Do(func() {
		close(h.stop)
		<-h.stopped
	})
}

// Stats are the hub's figures, for metrics.
type Stats struct {
	// Consumers is how many consumers the hub remembers; Online how many
	// of them have a connection.
	Consumers, Online int
	// DroppedUnacknowledged counts deliveries the outbox bounds dropped
	// before their consumer acknowledged them.
	DroppedUnacknowledged uint64
	// DroppedRewind counts deliveries already written to a connection that
	// cannot acknowledge, dropped from the rewind window by the bounds.
	DroppedRewind uint64
	// Collected counts consumers forgotten after ConsumerRetention.
	Collected uint64
}

// Stats returns the hub's current figures.
func (h *Hub) Stats() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.stats
	s.Consumers = len(h.boxes)
	for _, b := range h.boxes {
		if b.conn != nil {
			s.Online++
		}
	}
	return s
}

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

// Query selects a page of consumers for Peers.
type Query struct {
	// Role keeps only consumers of this role; "" keeps every role.
	Role string
	// After starts the page after this consumer: the Key.String() of the
	// last consumer of the previous page. "" starts at the beginning.
	After string
	// Limit bounds the page; zero or less means no bound.
	Limit int
}

// Peers lists the consumers q selects in key order (Key.String()), and
// reports whether more follow the page.
func (h *Hub) Peers(q Query) (page []Info, more bool) {
	type row struct {
		key string
		Info
	}
	h.mu.Lock()
	rows := make([]row, 0, min(len(h.boxes), max(q.Limit, 0)+1))
	for k, b := range h.boxes {
		if q.Role != "" && k.Role != q.Role {
			continue
		}
		ks := k.String()
		if q.After != "" && ks <= q.After {
			continue
		}
		state := "offline"
		switch {
		case b.conn != nil:
			state = "online"
		case b.lost:
			state = "lost"
		}
		rows = append(rows, row{ks, Info{Role: k.Role, ID: k.ID, ConsumerID: k.Consumer, State: state, LastSeen: b.lastSeen,
			Acked: b.acked, Latest: b.next - 1, Pending: b.pending.len()}})
	}
	h.mu.Unlock()
	slices.SortFunc(rows, func(a, b row) int { return cmp.Compare(a.key, b.key) })
	if q.Limit > 0 && len(rows) > q.Limit {
		rows, more = rows[:q.Limit], true
	}
	page = make([]Info, len(rows))
	for i, r := range rows {
		page[i] = r.Info
	}
	return page, more
}

// Pending returns how many deliveries k has not acknowledged.
func (h *Hub) Pending(k Key) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if b := h.boxes[k]; b != nil {
		return b.pending.len()
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

// Connected reports whether k has a connection now.
func (h *Hub) Connected(k Key) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := h.boxes[k]
	return b != nil && b.conn != nil
}
