// Package sse reads Server-Sent Events bodies (text/event-stream) by the
// HTML Living Standard's rules, restricted to \n line ends with an optional
// \r before them, which is what every server of the Gatehouse API writes.
// It is the SDK's reader (and so that of `gatehouse bench`, which drives the SDK).
package sse

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"
)

// ErrLineTooLong ends a body with a line longer than the reader's limit, so
// that a broken or hostile server cannot make a client buffer without end.
var ErrLineTooLong = errors.New("sse: line too long")

// Event is one dispatched event. Data aliases the reader's buffer: it is
// valid until the next call to Next.
type Event struct {
	Type string // "message" when the frame named none
	Data []byte
	ID   string // the last event id seen on the stream, per the SSE rules
}

// Reader parses one body. Comments (the servers' heartbeats) and unknown
// fields are skipped. "retry:" is not honoured: reconnect timing belongs to
// the caller's backoff, and the servers' fixed hint would only slow a
// resumption.
type Reader struct {
	r       *bufio.Reader
	maxLine int
	long    []byte // a line longer than r's buffer, assembled
	data    []byte
	typ     string
	id      string
}

// NewReader reads r, refusing lines longer than maxLine bytes.
func NewReader(r io.Reader, maxLine int) *Reader {
	return &Reader{r: bufio.NewReaderSize(r, 32<<10), maxLine: maxLine}
}

// Next returns the next event. At the end of the body it returns io.EOF; an
// event cut off by the end is dropped with io.ErrUnexpectedEOF, since its
// data may be incomplete.
func (s *Reader) Next() (Event, error) {
	typ, hasData := "", false
	s.data = s.data[:0]
	for {
		line, err := s.readLine()
		if err != nil {
			if errors.Is(err, io.EOF) && (hasData || typ != "") {
				err = io.ErrUnexpectedEOF
			}
			return Event{}, err
		}
		if len(line) == 0 {
			if !hasData {
				typ = "" // a frame without data dispatches nothing
				continue
			}
			if typ == "" {
				typ = "message"
			}
			return Event{Type: typ, Data: s.data, ID: s.id}, nil
		}
		if line[0] == ':' {
			continue
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch string(field) {
		case "event":
			// Streams repeat a few types: reuse the last one's string.
			if string(value) != s.typ {
				s.typ = string(value)
			}
			typ = s.typ
		case "data":
			if hasData {
				s.data = append(s.data, '\n')
			}
			s.data = append(s.data, value...)
			hasData = true
		case "id":
			if bytes.IndexByte(value, 0) < 0 && string(value) != s.id {
				s.id = string(value)
			}
		}
	}
}

// readLine returns the next line without its end; the slice is valid until
// the next call. A body that ends inside a line gives io.ErrUnexpectedEOF.
func (s *Reader) readLine() ([]byte, error) {
	line, err := s.r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		s.long = append(s.long[:0], line...)
		for errors.Is(err, bufio.ErrBufferFull) {
			if line, err = s.r.ReadSlice('\n'); len(s.long)+len(line) > s.maxLine+2 {
				return nil, fmt.Errorf("%w: more than %d bytes", ErrLineTooLong, s.maxLine)
			}
			s.long = append(s.long, line...)
		}
		line = s.long
	}
	if err != nil {
		if errors.Is(err, io.EOF) && len(line) > 0 {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	if len(line) > s.maxLine {
		return nil, fmt.Errorf("%w: more than %d bytes", ErrLineTooLong, s.maxLine)
	}
	return line, nil
}

// ResetOnRead returns r wrapped so that every read that brings bytes resets
// t to d: the watchdog of a stream that must never fall silent (the servers
// send heartbeats), so that a dead connection is noticed.
func ResetOnRead(r io.Reader, t *time.Timer, d time.Duration) io.Reader {
	return &resetReader{r: r, t: t, d: d}
}

type resetReader struct {
	r io.Reader
	t *time.Timer
	d time.Duration
}

func (r *resetReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.t.Reset(r.d)
	}
	return n, err
}
