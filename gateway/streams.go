package gateway

import (
	"encoding/json"
	"errors"
	"strconv"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/stream"
)

// The /v0 API's stream sources and renderers: an execution's events and a
// consumer's outbox, each shown on SSE and WebSocket alike by the stream
// engine.

// replayBatchBytes bounds the event bytes copied out of the store for one
// batch, so no store iterator stays open while a frame waits for a slow
// client, and a batch of large events stays small.
const replayBatchBytes = 1 << 20

// errKernelClosed ends an execution stream when the kernel shuts down.
var errKernelClosed = errors.New("gateway: kernel shutting down")

// eventSource reads an execution's events from the store after a
// sequence; its watch only says that there is more, so a slow reader costs
// no memory and cannot miss anything.
type eventSource struct {
	k      Kernel
	id     string
	last   uint64
	watch  *kernel.Watch
	arenas *arenas
	arena  []byte // the data of the items Next returned last, while they are out
	done   bool

	// The batch that read fills, and what it holds so far: fields rather
	// than variables captured by a closure, which would allocate them and
	// the closure at each read.
	batch []stream.Item
	n     int
	size  int
	emit  func(seq uint64, typ string, data []byte) bool // s.add, bound once
}

// releaseArena hands the arena back once no item holds a part of it, so
// that a stream that caught up and waits holds no buffer.
func (s *eventSource) releaseArena() {
	s.arenas.put(s.arena)
	s.arena = nil
}

// newEventSource starts watching execution id before anything is read, so
// that nothing appended in between is missed. Its arenas come from a, and
// go back to it.
func newEventSource(k Kernel, a *arenas, id string, after uint64) *eventSource {
	s := &eventSource{k: k, id: id, last: after, watch: k.Watch(id), arenas: a}
	s.emit = s.add
	return s
}

// arenas keeps the arenas of execution streams that caught up, for the
// next stream that reads: a catch-up renders its batches into an arena
// grown to a batch's size, which one stream after another would otherwise
// allocate afresh. It keeps a few, each of bounded size: a sync.Pool would
// not keep them, since the collector empties pools at every cycle.
type arenas struct{ free chan []byte }

// Bounds of arenas: how many it keeps, and the largest it keeps (a batch
// of 256 events of the common size grown by doubling; a larger one,
// of large events, is left to the collector).
const (
	keptArenas   = 8
	maxKeptArena = 512 << 10
)

func newArenas() *arenas { return &arenas{free: make(chan []byte, keptArenas)} }

// get returns a kept arena, or nil.
func (a *arenas) get() []byte {
	select {
	case b := <-a.free:
		return b
	default:
		return nil
	}
}

// put keeps b if it is worth keeping and there is room.
func (a *arenas) put(b []byte) {
	if cap(b) == 0 || cap(b) > maxKeptArena {
		return
	}
	select {
	case a.free <- b[:0]:
	default:
	}
}

func (s *eventSource) Next(buf []stream.Item) (int, error) {
	if s.done {
		return 0, stream.ErrEnd
	}
	select {
	case <-s.watch.Done():
		return 0, errKernelClosed
	default:
	}
	// The items of the last batch are written: the arena is free.
	n, err := s.read(buf)
	if err != nil || n > 0 {
		return n, err
	}
	if !s.k.Live(s.id) {
		// Finished before or while we read: everything is committed now,
		// so a read that still finds nothing has reached the end.
		if n, err = s.read(buf); err != nil || n > 0 {
			return n, err
		}
		s.done = true
		s.releaseArena()
		return 0, stream.ErrEnd
	}
	s.releaseArena()
	return 0, nil
}

// read renders events after s.last into the arena and hands them out in
// buf, within replayBatchBytes.
func (s *eventSource) read(buf []stream.Item) (int, error) {
	if len(buf) == 0 {
		return 0, nil
	}
	if s.arena == nil {
		s.arena = s.arenas.get()
	}
	s.batch, s.n, s.size = buf, 0, 0
	var err error
	s.arena, err = s.k.AppendEvents(s.arena[:0], s.id, s.last, len(buf), s.emit)
	n := s.n
	// The stream owns buf: it is not kept past the read.
	s.batch = nil
	return n, err
}

// add hands out one event of read's batch, and says whether there is room
// for another.
func (s *eventSource) add(seq uint64, typ string, data []byte) bool {
	if typ == "" {
		typ = "message"
	}
	s.batch[s.n] = stream.Item{Seq: seq, Type: typ, Data: data}
	s.n++
	s.last = seq
	s.size += len(data)
	return s.n < len(s.batch) && s.size < replayBatchBytes
}

func (s *eventSource) OnWake(f func()) { s.watch.OnWake(f) }

// Close hands the arena back too: the stream closes its source under the
// lock it calls Next under, once no frame holds an item's bytes (a stream
// that ends at its terminal event calls Next no more).
func (s *eventSource) Close() {
	s.watch.Stop()
	s.releaseArena()
}

// isTerminal reports an execution's last event: its stream ends after it.
func isTerminal(it stream.Item) bool { return event.IsTerminal(it.Type) }

// renderEvent shows an execution event as the kernel API does: resumable
// at its sequence, named by its type, the stored envelope as data.
var renderEvent = stream.RenderFunc(func(f *stream.Frame, it stream.Item) (bool, error) {
	f.ID = strconv.AppendUint(f.ID, it.Seq, 10)
	f.Event = it.Type
	f.Borrow(it.Data)
	return true, nil
})

// typeReset names the notice that a consumer cannot resume where it asked.
const typeReset = "stream.reset"

// outboxSource hands out a consumer's outbox deliveries, after the reset
// notice its attach produced, if any.
type outboxSource struct {
	conn  *peer.Conn
	reset []byte // the pending stream.reset payload
}

func newOutboxSource(conn *peer.Conn, epoch, from string, r *peer.Reset) *outboxSource {
	s := &outboxSource{conn: conn}
	if r != nil {
		s.reset = resetBody(epoch, from, r)
	}
	return s
}

func (s *outboxSource) Next(buf []stream.Item) (int, error) {
	select {
	case <-s.conn.Done():
		// A nil error is our own detach: the stream is ending already.
		if err := s.conn.Err(); err != nil {
			return 0, err
		}
		return 0, stream.ErrEnd
	default:
	}
	n := 0
	if s.reset != nil && len(buf) > 0 {
		buf[0] = stream.Item{Type: typeReset, Data: s.reset}
		s.reset = nil
		n++
	}
	for n < len(buf) {
		d, ok := s.conn.Next()
		if !ok {
			break
		}
		buf[n] = stream.Item{Seq: d.Seq, Type: d.Type, Data: d.Data}
		n++
	}
	return n, nil
}

func (s *outboxSource) OnWake(f func()) { s.conn.OnWake(f) }

func (s *outboxSource) Close() { s.conn.Detach() }

// outboxRenderer shows deliveries resumable at "<epoch>.<seq>", so an
// EventSource client resumes with Last-Event-ID even across a wiped store.
func outboxRenderer(epoch string) stream.Renderer {
	return stream.RenderFunc(func(f *stream.Frame, it stream.Item) (bool, error) {
		if it.Seq > 0 {
			f.ID = append(f.ID, epoch...)
			f.ID = append(f.ID, '.')
			f.ID = strconv.AppendUint(f.ID, it.Seq, 10)
		}
		f.Event = it.Type
		f.Data = append(f.Data, it.Data...)
		return true, nil
	})
}

// resetBody is the payload of a stream.reset frame: the consumer cannot
// resume where it asked and should re-hydrate (list its executions) first.
func resetBody(epoch, from string, r *peer.Reset) []byte {
	body := map[string]any{
		"reason": r.Reason, "epoch": epoch, "resume_from": r.ResumeFrom, "latest_sequence": r.Latest,
		"snapshot": "/v0/executions",
	}
	if r.Reason == peer.ResetEpochChanged {
		// The epoch the client's cursor named, beside the new one.
		body["previous_epoch"] = from
	}
	data, _ := json.Marshal(body)
	return data
}

// expiredNotice is the last event of an SSE stream whose token expired:
// reconnect with a fresh one.
func expiredNotice(f *stream.Frame, reason stream.Reason, _ error) bool {
	if reason != stream.Expired {
		return false
	}
	f.Event = "stream.expired"
	f.Data = append(f.Data, `{"reason":"token expired","code":"UNAUTHORIZED"}`...)
	return true
}
