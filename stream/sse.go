package stream

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"
)

// SSEOptions configure an SSE transport.
type SSEOptions struct {
	// WriteTimeout bounds every flush; past it the flush fails with
	// ErrSlowConsumer. Zero leaves flushes unbounded.
	WriteTimeout time.Duration
	// Retry, when positive, is sent first as the reconnection delay an
	// EventSource client should use.
	Retry time.Duration
	// Notice renders the last frame of a stream that ends for reason (a
	// "token expired" event, say); nil or false sends none.
	Notice func(f *Frame, reason Reason, err error) bool
	// Last, when set, is called before the flush of a stream's last
	// frames (FlushLast, and the notice's), within the write deadline
	// that flush armed: the gateway holds them back there, to leave in
	// one write with the end of the response.
	Last func()
}

// SSE is a Transport that writes Server-Sent Events to a response body: an
// "id:" line when the frame has an ID, an "event:" line, a "data:" line per
// line of data, and a blank line.
//
// Frames are rendered into a buffer taken from a pool when the first one
// is written and given back when it is flushed, so an idle stream holds
// none, and what a stream has ready at once (a resuming client's catch-up)
// leaves in writes of up to sseSpill bytes rather than one per small
// buffer.
type SSE struct {
	w     io.Writer
	conn  net.Conn
	o     SSEOptions
	buf   *[]byte // nil while nothing is buffered
	begun bool
}

// sseSpill is how much a stream buffers before it writes without waiting
// for the flush: one write of this size carries a catch-up's events.
const sseSpill = 64 << 10

// sseBufferKeep is the largest buffer given back to the pool: one grown by
// a larger frame is left to the collector.
const sseBufferKeep = 4 * sseSpill

var sseBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 8<<10); return &b }}

// NewSSE returns a transport writing to w, whose writes reach conn (the
// deadline is set on conn; nil sets none). Each flush is one Write to w,
// followed by w's own Flush when it has one (a *bufio.Writer).
func NewSSE(w io.Writer, conn net.Conn, o SSEOptions) *SSE {
	return &SSE{w: w, conn: conn, o: o}
}

// buffer returns the buffer frames are appended to, taking one from the
// pool when the stream holds none.
func (s *SSE) buffer() []byte {
	if s.buf == nil {
		s.buf = sseBuffers.Get().(*[]byte)
	}
	return *s.buf
}

func (s *SSE) begin(b []byte) []byte {
	if s.begun {
		return b
	}
	s.begun = true
	if s.o.Retry > 0 {
		b = append(b, "retry: "...)
		b = strconv.AppendInt(b, s.o.Retry.Milliseconds(), 10)
		b = append(b, "\n\n"...)
	}
	return b
}

// Open writes what precedes the first frame (the retry advice, else an
// empty comment) and leaves it buffered: the response's headers only leave
// with its first bytes, and Run flushes after its first drain, so that
// they leave with the frames ready at once in one write, or alone when
// none is; either way the client sees the stream open before it waits.
func (s *SSE) Open() {
	b := s.buffer()
	if s.o.Retry <= 0 && !s.begun {
		b = append(b, ":\n\n"...)
	}
	*s.buf = s.begin(b)
}

// Write buffers one frame. Once sseSpill bytes are buffered they are
// written at once, within the write timeout like a flush.
func (s *SSE) Write(f *Frame) error {
	b := s.begin(s.buffer())
	if len(f.ID) > 0 {
		b = append(b, "id: "...)
		b = appendLine(b, f.ID)
		b = append(b, '\n')
	}
	if f.Event != "" {
		b = append(b, "event: "...)
		b = appendLine(b, []byte(f.Event))
		b = append(b, '\n')
	}
	data := f.Data
	for {
		b = append(b, "data: "...)
		i := lineBreak(data)
		if i < 0 {
			b = append(b, data...)
			b = append(b, '\n')
			break
		}
		b = append(b, data[:i]...)
		b = append(b, '\n')
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	b = append(b, '\n')
	*s.buf = b
	if len(b) < sseSpill {
		return nil
	}
	return s.Flush()
}

// lineBreak is the index of the first CR or LF in b, or -1. Two scans for
// one byte each beat one scan for a set: event data is JSON, which seldom
// holds either, so both run to the end at the speed of IndexByte.
func lineBreak(b []byte) int {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return bytes.IndexByte(b, '\r')
	}
	if j := bytes.IndexByte(b[:i], '\r'); j >= 0 {
		return j
	}
	return i
}

// appendLine appends b with any line break replaced by a space: an id or
// an event name must stay on its line.
func appendLine(dst, b []byte) []byte {
	for len(b) > 0 {
		i := lineBreak(b)
		if i < 0 {
			return append(dst, b...)
		}
		dst = append(dst, b[:i]...)
		dst = append(dst, ' ')
		b = b[i+1:]
	}
	return dst
}

// Flush writes what is buffered within the write timeout: a client that
// stops reading fills its socket buffer, and the stream must then end (the
// client resumes from its cursor) rather than hold a goroutine forever.
//
// The deadline is the connection's: fasthttp copies the body writer's
// bytes to the socket on its own goroutine, so a flush that outlives the
// deadline fails with whatever error the copy left, and is classified by
// the clock.
func (s *SSE) Flush() error {
	if s.buf == nil {
		return nil
	}
	deadline := s.arm()
	return s.classify(s.writeOut(), deadline)
}

// writeOut writes the buffer to w and gives it back to the pool.
func (s *SSE) writeOut() error {
	defer s.release()
	var err error
	if b := *s.buf; len(b) > 0 {
		_, err = s.w.Write(b)
	}
	if f, ok := s.w.(interface{ Flush() error }); ok && err == nil {
		err = f.Flush()
	}
	return err
}

// FlushLast is Flush for the last frames of the stream, which Last may
// hold back to leave with the end of the response.
func (s *SSE) FlushLast() error {
	deadline := s.arm()
	if s.o.Last != nil {
		s.o.Last()
	}
	if s.buf == nil {
		return nil
	}
	return s.classify(s.writeOut(), deadline)
}

// arm sets the connection's write deadline for what is written next.
func (s *SSE) arm() time.Time {
	if s.conn == nil || s.o.WriteTimeout <= 0 {
		return time.Time{}
	}
	deadline := time.Now().Add(s.o.WriteTimeout)
	_ = s.conn.SetWriteDeadline(deadline)
	return deadline
}

// classify turns a write error past the deadline into ErrSlowConsumer.
func (s *SSE) classify(err error, deadline time.Time) error {
	if err != nil && (errors.Is(err, os.ErrDeadlineExceeded) || !deadline.IsZero() && !time.Now().Before(deadline)) {
		return ErrSlowConsumer
	}
	return err
}

// Heartbeat writes a comment line, which every SSE client ignores.
func (s *SSE) Heartbeat() error {
	*s.buf = append(s.begin(s.buffer()), ":heartbeat\n\n"...)
	return nil
}

// Close sends the options' notice for reason, if any. The response ends
// when the body writer returns.
func (s *SSE) Close(reason Reason, err error) {
	defer s.release()
	if reason == Gone || reason == SlowConsumer || s.o.Notice == nil {
		return
	}
	var f Frame
	if s.o.Notice(&f, reason, err) && s.Write(&f) == nil {
		_ = s.FlushLast()
	}
}

// release gives back a buffer that a stream cut short never wrote.
func (s *SSE) release() {
	if s.buf != nil && cap(*s.buf) <= sseBufferKeep {
		*s.buf = (*s.buf)[:0]
		sseBuffers.Put(s.buf)
	}
	s.buf = nil
}

// ClientGone reads conn until it fails, and closes the returned channel
// then. A Server-Sent Events client sends nothing after its request, so
// any read error means it is gone; use it where a disconnect must be known
// at once rather than at the next failed write. The connection cannot be
// reused for another request afterwards.
func ClientGone(conn net.Conn) <-chan struct{} {
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		_ = conn.SetReadDeadline(time.Time{})
		var b [512]byte
		for {
			if _, err := conn.Read(b[:]); err != nil {
				return
			}
		}
	}()
	return gone
}
