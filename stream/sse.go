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
// What is written between two flushes leaves in one Write, however much it
// is (up to maxFlushBytes): the frames a stream takes from its source at
// once, the pushes of one commit say, are one chunk of the response and
// one system call. The buffer is taken from a pool when a frame is written
// and given back by the flush, so an idle stream holds none.
type SSE struct {
	w     io.Writer
	buf   []byte // written since the last flush; nil when nothing is
	conn  net.Conn
	o     SSEOptions
	begun bool
}

// maxFlushBytes bounds what one flush holds: past it, what is buffered
// leaves at once and the flush goes on from there. A drain is bounded
// already (Options.Batch items, and the sources' own byte bounds); this
// bounds the buffer whatever the items weigh.
const maxFlushBytes = 256 << 10

// keepBufferBytes is the largest buffer given back to the pool; a larger
// one, from a burst, is let go.
const keepBufferBytes = 64 << 10

var sseBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// NewSSE returns a transport writing to w, whose flushes reach conn (the
// deadline is set on conn; nil sets none). Each flush is one w.Write; if w
// has a Flush method (a bufio.Writer), the flush calls it after.
func NewSSE(w io.Writer, conn net.Conn, o SSEOptions) *SSE {
	return &SSE{w: w, conn: conn, o: o}
}

// add adds p to what the next flush writes.
func (s *SSE) add(p ...string) {
	if s.buf == nil {
		s.buf = (*sseBuffers.Get().(*[]byte))[:0]
	}
	for _, x := range p {
		s.buf = append(s.buf, x...)
	}
}

func (s *SSE) begin() {
	if s.begun {
		return
	}
	s.begun = true
	if s.o.Retry > 0 {
		s.add("retry: ", strconv.FormatInt(s.o.Retry.Milliseconds(), 10), "\n\n")
	}
}

// Open writes what precedes the first frame (the retry advice, else an
// empty comment) and leaves it buffered: the response's headers only leave
// with its first bytes, and Run flushes after its first drain, so that
// they leave with the frames ready at once in one write, or alone when
// none is; either way the client sees the stream open before it waits.
func (s *SSE) Open() {
	if s.o.Retry <= 0 && !s.begun {
		s.add(":\n\n")
	}
	s.begin()
}

// Write buffers one frame. Past maxFlushBytes, what is buffered is
// written at once, within the write timeout like a flush.
func (s *SSE) Write(f *Frame) error {
	s.begin()
	if s.buf == nil {
		s.buf = (*sseBuffers.Get().(*[]byte))[:0]
	}
	if len(f.ID) > 0 {
		s.buf = append(s.buf, "id: "...)
		s.buf = appendLine(s.buf, f.ID)
		s.buf = append(s.buf, '\n')
	}
	if f.Event != "" {
		s.buf = append(s.buf, "event: "...)
		s.buf = appendLine(s.buf, []byte(f.Event))
		s.buf = append(s.buf, '\n')
	}
	data := f.Data
	for {
		i := bytes.IndexAny(data, "\r\n")
		s.buf = append(s.buf, "data: "...)
		if i < 0 {
			s.buf = append(s.buf, data...)
			s.buf = append(s.buf, '\n')
			break
		}
		s.buf = append(s.buf, data[:i]...)
		s.buf = append(s.buf, '\n')
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	s.buf = append(s.buf, '\n')
	if len(s.buf) < maxFlushBytes {
		return nil
	}
	deadline := s.arm()
	return s.classify(s.writeOut(), deadline)
}

// appendLine appends b with any line break replaced by a space: an id or
// an event name must stay on its line.
func appendLine(dst, b []byte) []byte {
	for len(b) > 0 {
		i := bytes.IndexAny(b, "\r\n")
		if i < 0 {
			return append(dst, b...)
		}
		dst = append(dst, b[:i]...)
		dst = append(dst, ' ')
		b = b[i+1:]
	}
	return dst
}

// writeOut writes what is buffered in one Write and gives the buffer back.
func (s *SSE) writeOut() error {
	if s.buf == nil {
		return nil
	}
	buf := s.buf
	s.buf = nil
	var err error
	if len(buf) > 0 {
		_, err = s.w.Write(buf)
	}
	if cap(buf) <= keepBufferBytes {
		buf = buf[:0]
		sseBuffers.Put(&buf)
	}
	return err
}

// drop lets what is buffered go: the stream ends without it.
func (s *SSE) drop() {
	if s.buf != nil && cap(s.buf) <= keepBufferBytes {
		buf := s.buf[:0]
		sseBuffers.Put(&buf)
	}
	s.buf = nil
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
	deadline := s.arm()
	return s.classify(s.flush(), deadline)
}

// flush writes what is buffered and flushes w, if it buffers too.
func (s *SSE) flush() error {
	err := s.writeOut()
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
	return s.classify(s.flush(), deadline)
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
	s.begin()
	s.add(":heartbeat\n\n")
	return nil
}

// Close sends the options' notice for reason, if any. The response ends
// when the body writer returns.
func (s *SSE) Close(reason Reason, err error) {
	if reason == Gone || reason == SlowConsumer || s.o.Notice == nil {
		s.drop()
		return
	}
	var f Frame
	if s.o.Notice(&f, reason, err) && s.Write(&f) == nil {
		_ = s.FlushLast()
	}
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
