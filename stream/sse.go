package stream

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"os"
	"strconv"
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
type SSE struct {
	w     *bufio.Writer
	conn  net.Conn
	o     SSEOptions
	begun bool
}

// NewSSE returns a transport writing to w, whose flushes reach conn (the
// deadline is set on conn; nil sets none).
func NewSSE(w *bufio.Writer, conn net.Conn, o SSEOptions) *SSE {
	return &SSE{w: w, conn: conn, o: o}
}

func (s *SSE) begin() {
	if s.begun {
		return
	}
	s.begun = true
	if s.o.Retry > 0 {
		s.w.WriteString("retry: ")
		s.w.WriteString(strconv.FormatInt(s.o.Retry.Milliseconds(), 10))
		s.w.WriteString("\n\n")
	}
}

// Open writes what precedes the first frame (the retry advice, else an
// empty comment) and leaves it buffered: the response's headers only leave
// with its first bytes, and Run flushes after its first drain, so that
// they leave with the frames ready at once in one write, or alone when
// none is; either way the client sees the stream open before it waits.
func (s *SSE) Open() {
	if s.o.Retry <= 0 && !s.begun {
		s.w.WriteString(":\n\n")
	}
	s.begin()
}

// Write buffers one frame. A frame larger than what the buffer holds is
// written through, within the write timeout like a flush.
func (s *SSE) Write(f *Frame) error {
	deadline := s.arm()
	s.begin()
	if len(f.ID) > 0 {
		s.w.WriteString("id: ")
		writeLine(s.w, f.ID)
		s.w.WriteByte('\n')
	}
	if f.Event != "" {
		s.w.WriteString("event: ")
		writeLine(s.w, []byte(f.Event))
		s.w.WriteByte('\n')
	}
	data := f.Data
	for {
		i := bytes.IndexAny(data, "\r\n")
		s.w.WriteString("data: ")
		if i < 0 {
			s.w.Write(data)
			s.w.WriteByte('\n')
			break
		}
		s.w.Write(data[:i])
		s.w.WriteByte('\n')
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	_, err := s.w.WriteString("\n")
	return s.classify(err, deadline)
}

// writeLine writes b with any line break replaced by a space: an id or an
// event name must stay on its line.
func writeLine(w *bufio.Writer, b []byte) {
	for len(b) > 0 {
		i := bytes.IndexAny(b, "\r\n")
		if i < 0 {
			w.Write(b)
			return
		}
		w.Write(b[:i])
		w.WriteByte(' ')
		b = b[i+1:]
	}
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
	return s.classify(s.w.Flush(), deadline)
}

// FlushLast is Flush for the last frames of the stream, which Last may
// hold back to leave with the end of the response.
func (s *SSE) FlushLast() error {
	deadline := s.arm()
	if s.o.Last != nil {
		s.o.Last()
	}
	return s.classify(s.w.Flush(), deadline)
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
	_, err := s.w.WriteString(":heartbeat\n\n")
	return err
}

// Close sends the options' notice for reason, if any. The response ends
// when the body writer returns.
func (s *SSE) Close(reason Reason, err error) {
	if reason == Gone || reason == SlowConsumer || s.o.Notice == nil {
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
