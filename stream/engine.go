package stream

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/option"
)

// DefaultBatch is how many items a Stream asks its source for at a time
// when Options.Batch is zero.
const DefaultBatch = 256

// Options configure a Stream. The zero value carries a source with no
// heartbeat, no expiry and no end but the source's own.
type Options struct {
	// Heartbeat is how often Run calls Transport.Heartbeat while idle; zero
	// never does (a WebSocket pings on its own timer).
	Heartbeat time.Duration
	// Expires ends Run with Expired at that time; zero never.
	Expires time.Time
	// Closing ends Run with Shutdown when it is closed.
	Closing <-chan struct{}
	// Gone ends Run with Gone when it is closed: the client went away.
	Gone <-chan struct{}
	// Final reports whether the stream ends right after an item (a
	// terminal event), without waiting for the source to say so.
	Final func(Item) bool
	// Flushed is called with the sequence of the last item of every flush
	// that carried one. Sources whose clients cannot acknowledge count such
	// a write as delivered.
	Flushed func(seq uint64)
	// Batch bounds the items taken from the source at a time; zero means
	// DefaultBatch.
	Batch int
}

// Stream carries one source to one transport. Use Run to carry it on the
// calling goroutine until it ends (an SSE response), or Start to carry it
// with a goroutine only while there is something to send (an idle
// WebSocket then costs no goroutine for its deliveries).
type Stream struct {
	o     Options
	r     Renderer
	t     Transport
	mu    sync.Mutex // held while draining: one writer, items in order
	src   Source
	ended bool // with mu
	last  uint64

	// stopped is set by Stop, which must not wait for mu: it is called
	// from the transport's end, which may run while a write holds mu.
	stopped atomic.Bool

	// pump is pumpIdle, pumpRunning or pumpAgain in Start's mode.
	pump atomic.Int32
}

const (
	pumpIdle    int32 = iota
	pumpRunning       // a pump goroutine runs
	pumpAgain         // woken while running: the pump looks once more before it stops
)

// New joins a source, a renderer and a transport. Nothing is read or
// written until Run or Start.
func New(src Source, r Renderer, t Transport, o Options) *Stream {
	option.Default(&o.Batch, DefaultBatch)
	return &Stream{o: o, r: r, t: t, src: src}
}

// Last returns the sequence of the last item written.
func (s *Stream) Last() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Run carries the stream on the calling goroutine until it ends, then
// closes the transport and the source and reports why. ctx ending counts
// as a shutdown.
func (s *Stream) Run(ctx context.Context) (Reason, error) {
	wake := make(chan struct{}, 1)
	s.src.OnWake(func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	var beat <-chan time.Time
	if s.o.Heartbeat > 0 {
		t := time.NewTicker(s.o.Heartbeat)
		defer t.Stop()
		beat = t.C
	}
	var expired <-chan time.Time
	if !s.o.Expires.IsZero() {
		t := time.NewTimer(time.Until(s.o.Expires))
		defer t.Stop()
		expired = t.C
	}
	reason, err := func() (Reason, error) {
		for first := true; ; first = false {
			if reason, err, done := s.drain(); done {
				return reason, err
			}
			// What the transport buffered before the first frame (an SSE
			// response's headers) leaves now if the first drain had
			// nothing to flush it with.
			if first {
				if err := s.t.Flush(); err != nil {
					return writeFailure(err), nil
				}
			}
			select {
			case <-wake:
			case <-beat:
				if err := s.t.Heartbeat(); err != nil {
					return writeFailure(err), nil
				}
				if err := s.t.Flush(); err != nil {
					return writeFailure(err), nil
				}
			case <-expired:
				return Expired, nil
			case <-s.o.Closing:
				return Shutdown, nil
			case <-ctx.Done():
				return Shutdown, nil
			case <-s.o.Gone:
				return Gone, nil
			}
		}
	}()
	s.finish(reason, err)
	return reason, err
}

// Start carries the stream without a goroutine of its own: one runs only
// while the source has items to send. The stream ends by itself when the
// source ends or fails or a write fails; Stop ends it from outside.
func (s *Stream) Start() {
	s.src.OnWake(s.kick)
	s.kick()
}

// Stop ends a stream carried by Start, from its transport's owner, which
// is closing the transport: no frame is taken from the source after the
// write under way, and the source is closed. It does not wait.
func (s *Stream) Stop() {
	if s.stopped.CompareAndSwap(false, true) {
		s.kick()
	}
}

// Switch replaces the source of a stream carried by Start (a client that
// resumes from another cursor). open runs once the items the old source
// gave are written and no more will be taken from it: a source that
// supersedes the old one may be made there. What the new source gives is
// written before Switch returns.
func (s *Stream) Switch(open func() Source) {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.src.Close()
	src := open()
	s.src = src
	reason, err, done := s.drainLocked()
	if done {
		s.endLocked(reason, err)
	}
	s.mu.Unlock()
	if !done {
		src.OnWake(s.kick)
		s.kick()
	}
}

// kick makes sure that a pump runs after it. Sources call it with their
// locks held, so it only starts a goroutine or tells the running one.
func (s *Stream) kick() {
	for {
		switch s.pump.Load() {
		case pumpIdle:
			if s.pump.CompareAndSwap(pumpIdle, pumpRunning) {
				go s.runPump()
				return
			}
		case pumpRunning:
			if s.pump.CompareAndSwap(pumpRunning, pumpAgain) {
				return
			}
		default:
			return
		}
	}
}

// runPump drains the source until it stays empty. Once the stream ends it
// stops for good: the state stays running, so no kick starts another.
func (s *Stream) runPump() {
	for {
		s.pump.Store(pumpRunning)
		s.mu.Lock()
		reason, err, done := s.drainLocked()
		if done {
			s.endLocked(reason, err)
		}
		s.mu.Unlock()
		if done || s.pump.CompareAndSwap(pumpRunning, pumpIdle) {
			return
		}
	}
}

// drain writes what the source has now, for Run.
func (s *Stream) drain() (Reason, error, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.drainLocked()
}

var (
	itemPool  = sync.Pool{New: func() any { b := make([]Item, DefaultBatch); return &b }}
	framePool = sync.Pool{New: func() any { return new(Frame) }}
)

// drainLocked writes, with mu held, what the source has now. done reports
// that the stream must end, for reason.
func (s *Stream) drainLocked() (reason Reason, err error, done bool) {
	if s.ended || s.stopped.Load() {
		return Gone, nil, true
	}
	bp := itemPool.Get().(*[]Item)
	defer itemPool.Put(bp)
	buf := *bp
	if len(buf) > s.o.Batch {
		buf = buf[:s.o.Batch]
	} else if len(buf) < s.o.Batch {
		buf = make([]Item, s.o.Batch)
	}
	f := framePool.Get().(*Frame)
	defer func() {
		f.Reset() // the pool keeps no item's bytes
		framePool.Put(f)
	}()
	for {
		n, serr := s.src.Next(buf)
		final := false
		var flushed uint64
		for _, it := range buf[:n] {
			f.Reset()
			f.Seq = it.Seq
			show, rerr := s.r.Render(f, it)
			if rerr != nil {
				return Failed, rerr, true
			}
			if show {
				if err := s.t.Write(f); err != nil {
					return writeFailure(err), nil, true
				}
				if s.stopped.Load() {
					return Gone, nil, true
				}
			}
			if it.Seq > 0 {
				s.last, flushed = it.Seq, it.Seq
			}
			if s.o.Final != nil && s.o.Final(it) {
				final = true
				break
			}
		}
		clear(buf[:n]) // no item data stays referenced from the pool
		last := final || errors.Is(serr, ErrEnd)
		if n > 0 || last {
			flush := s.t.Flush
			if last {
				// What the transport holds (the last frames, or only what
				// precedes the first) goes with the end of the stream.
				flush = s.t.FlushLast
			}
			if err := flush(); err != nil {
				return writeFailure(err), nil, true
			}
			if flushed > 0 && s.o.Flushed != nil {
				s.o.Flushed(flushed)
			}
		}
		switch {
		case last:
			return Finished, nil, true
		case serr != nil:
			return Failed, serr, true
		case n == 0:
			// Only an empty batch means the source has nothing now: a
			// short one may be bounded by bytes, not by what it holds.
			return 0, nil, false
		}
	}
}

// writeFailure classifies a failed write or flush.
func writeFailure(err error) Reason {
	if errors.Is(err, ErrSlowConsumer) {
		return SlowConsumer
	}
	return Gone
}

// endLocked ends the stream once, with mu held.
func (s *Stream) endLocked(reason Reason, err error) {
	if s.ended {
		return
	}
	s.ended = true
	s.src.Close()
	s.t.Close(reason, err)
}

func (s *Stream) finish(reason Reason, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endLocked(reason, err)
}
