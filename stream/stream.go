// Package stream carries one sequenced source to one client.
//
// Every stream Gatehouse serves, whatever its protocol, is the same three
// parts: a [Source] (an execution's events, a consumer's outbox, a
// session's log) read from the client's cursor; a [Renderer], a pure
// function from one stored item to the protocol's [Frame]; and a
// [Transport] (a Server-Sent Events response or a WebSocket) that puts
// frames on the wire. A [Stream] joins them: it replays what the source
// holds after the cursor, then follows the live tail, writes heartbeats
// while idle, bounds every flush by a write deadline (a client that stops
// reading is dropped and resumes from its cursor, so a slow client costs no
// memory), reports what was flushed for sources that count a write as an
// acknowledgement, and ends once, with a reason the transport can tell the
// client: the source finished, the credential expired, the server is
// shutting down, the client left or could not keep up.
//
// Nothing is queued between source and transport: items stay in the
// durable source until the transport takes them, a bounded batch at a time.
package stream

import (
	"errors"
)

// Item is one entry of a source. Data is only valid until the source's next
// call to Next.
type Item struct {
	// Seq is the item's position in its source; 0 for a notice (such as a
	// reset) that has none.
	Seq uint64
	// Type names what the item is (an event type, a delivery type).
	Type string
	// Data is the stored fact, usually one JSON value.
	Data []byte
	// Value is the fact decoded, for sources that decode what they read
	// (a session's log resolves its references to execution events);
	// renderers read it instead of Data. Like Data it is only valid until
	// the source's next call to Next.
	Value any
}

// Source is a sequence read from a position. Implementations are safe for
// use by one Stream at a time, plus OnWake and Close from any goroutine.
type Source interface {
	// Next fills buf with items available now that follow the last one it
	// returned, and reports how many. It may return fewer than len(buf)
	// while it holds more (a batch bounded by bytes): the stream calls it
	// again. Only zero items and a nil error mean nothing is available yet:
	// the source calls the OnWake function when that may have changed.
	// ErrEnd means the source is finished after the items returned with it;
	// any other error ends the stream with it.
	Next(buf []Item) (int, error)
	// OnWake makes f run whenever Next may have more to return, and when the
	// source fails. f runs with the source's locks held: it must return
	// quickly and must not call back into the source.
	OnWake(f func())
	// Close releases the source. Next is not called after it.
	Close()
}

// ErrEnd is returned by Source.Next when the source has nothing more to
// give, ever: a finished execution's stream ends after its terminal event.
var ErrEnd = errors.New("stream: source finished")

// Frame is what one protocol shows of one item. A Renderer fills it; its
// slices are reused from one item to the next.
type Frame struct {
	// Seq is the item's sequence (0 for a notice), set before rendering,
	// for transports whose frames carry it as a number.
	Seq uint64
	// ID is the resume position a client gives back to continue after this
	// frame (an SSE id line); empty for frames that cannot be resumed from.
	ID []byte
	// Event names the frame (an SSE event line, a WebSocket frame's event).
	Event string
	// Data is the frame's payload, one JSON value.
	Data []byte

	own      []byte // the frame's buffer for Data while Data is borrowed
	borrowed bool
}

// Borrow makes b the frame's payload without copying it, for a renderer
// whose item already holds the payload's bytes: b must stay unchanged until
// the frame is written. An append to Data afterwards copies it, and Reset
// gives the frame its own buffer back.
func (f *Frame) Borrow(b []byte) {
	if !f.borrowed {
		f.own, f.borrowed = f.Data[:0], true
	}
	f.Data = b[:len(b):len(b)]
}

// Reset clears f for the next item, keeping its buffers and dropping what
// it borrowed.
func (f *Frame) Reset() {
	f.Seq = 0
	f.ID = f.ID[:0]
	f.Event = ""
	if f.borrowed {
		f.Data, f.own, f.borrowed = f.own, nil, false
	}
	f.Data = f.Data[:0]
}

// Renderer turns a stored item into a protocol's frame. It must be a pure
// function of the item: rendering the same item again gives the same
// bytes, which is what lets a client resume on any connection. It reports
// false for an item the protocol does not show.
type Renderer interface {
	Render(f *Frame, it Item) (bool, error)
}

// RenderFunc adapts a function to a Renderer.
type RenderFunc func(f *Frame, it Item) (bool, error)

// Render calls r.
func (r RenderFunc) Render(f *Frame, it Item) (bool, error) { return r(f, it) }

// Reason says why a stream ended.
type Reason int

// The reasons a stream ends.
const (
	// Finished: the source ended (ErrEnd) or a final item was sent.
	Finished Reason = iota
	// Gone: the client went away, or a write to it failed.
	Gone
	// SlowConsumer: a flush did not complete within the write deadline.
	SlowConsumer
	// Expired: the credential that opened the stream expired.
	Expired
	// Shutdown: the server is shutting down.
	Shutdown
	// Failed: the source failed; the error says how.
	Failed
)

// String returns the reason's name, as logs and metrics show it.
func (r Reason) String() string {
	switch r {
	case Finished:
		return "finished"
	case Gone:
		return "gone"
	case SlowConsumer:
		return "slow_consumer"
	case Expired:
		return "expired"
	case Shutdown:
		return "shutdown"
	case Failed:
		return "failed"
	}
	return "unknown"
}

// Transport writes frames to one client.
type Transport interface {
	// Write sends one frame, or buffers it until Flush.
	Write(f *Frame) error
	// Flush puts what Write buffered on the wire. It fails with
	// ErrSlowConsumer when that takes longer than the transport's write
	// deadline.
	Flush() error
	// FlushLast is Flush for the last frames of a stream that ends right
	// after them: a transport may put them on the wire together with the
	// stream's end.
	FlushLast() error
	// Heartbeat shows an idle client that the stream is alive.
	Heartbeat() error
	// Close ends the stream for reason (err is the source's error when
	// reason is Failed), telling the client where the transport can.
	Close(reason Reason, err error)
}

// ErrSlowConsumer is returned by Transport.Flush when the client did not
// take a flush within the write deadline.
var ErrSlowConsumer = errors.New("stream: client too slow to keep up")
