package client

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// maxSSELine bounds one SSE line, so a broken or hostile server cannot make
// the client buffer without limit.
const maxSSELine = 4 << 20

// errLineTooLong ends a stream whose line passed maxSSELine.
var errLineTooLong = fmt.Errorf("client: SSE line longer than %d bytes", maxSSELine)

// sseEvent is one dispatched Server-Sent Event.
type sseEvent struct {
	Type string // "message" when the frame named none
	Data []byte
	ID   string // the last event id seen on the stream, per the SSE rules
}

// sseReader parses a text/event-stream body following the HTML Living
// Standard's rules, restricted to \n line ends with an optional \r before
// them (what every server of this API writes).
type sseReader struct {
	r    *bufio.Reader
	line []byte
	id   string
}

func newSSEReader(r io.Reader) *sseReader {
	return &sseReader{r: bufio.NewReaderSize(r, 32<<10)}
}

// Next returns the next event. At the end of the body it returns io.EOF; an
// event cut off by the end is dropped, since its data may be incomplete.
func (s *sseReader) Next() (sseEvent, error) {
	var (
		typ     string
		data    []byte
		hasData bool
	)
	for {
		line, err := s.readLine()
		if err != nil {
			return sseEvent{}, err
		}
		if len(line) == 0 {
			if !hasData {
				typ = ""
				continue
			}
			if typ == "" {
				typ = "message"
			}
			return sseEvent{Type: typ, Data: data, ID: s.id}, nil
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
			typ = string(value)
		case "data":
			if hasData {
				data = append(data, '\n')
			}
			data = append(data, value...)
			hasData = true
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				s.id = string(value)
			}
		}
		// "retry:" is deliberately not honoured: reconnect timing is the
		// client's jittered backoff, and the servers' fixed 5 s hint would
		// only slow resumption. Unknown fields are ignored, as the standard
		// requires.
	}
}

// readLine returns the next line without its end; the slice is valid until
// the next call.
func (s *sseReader) readLine() ([]byte, error) {
	s.line = s.line[:0]
	for {
		chunk, err := s.r.ReadSlice('\n')
		if len(s.line)+len(chunk) > maxSSELine+2 {
			return nil, errLineTooLong
		}
		s.line = append(s.line, chunk...)
		if err == nil {
			break
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(err, io.EOF) && len(s.line) > 0 {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line := s.line[:len(s.line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	if len(line) > maxSSELine {
		return nil, errLineTooLong
	}
	return line, nil
}
