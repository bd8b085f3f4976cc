// Package ssetest reads Server-Sent Events bodies for tests, frame by frame
// as the server wrote them. Unlike the SDK's reader (client/sse), which
// follows the HTML standard's client rules, it carries nothing over from
// one frame to the next and invents nothing: a frame without an id line
// has no id, one without an event line has no event name. Tests that check
// exact frames need that; the bytes themselves they check on the raw body.
package ssetest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
)

// ErrField ends a body with a line naming a field the SSE format does not
// have: Gatehouse never writes one, so a test should hear of it.
var ErrField = errors.New("ssetest: unknown field")

// Frame is one frame: the fields of its own lines.
type Frame struct {
	// ID is "" in a frame without an id line, whatever came before.
	ID string
	// Event is "" in a frame without an event line, not "message".
	Event string
	// Data is the frame's data lines joined with "\n", as the SSE format
	// joins them.
	Data string
}

// Reader reads the frames of one body. Lines end with "\n", with an
// optional "\r" before it, which is what every Gatehouse server writes.
type Reader struct {
	br    *bufio.Reader
	retry string
}

// NewReader reads r through a bufio.Reader: pass one to read on past the
// frames (the bytes after a stream's end, say).
func NewReader(r io.Reader) *Reader {
	return &Reader{br: bufio.NewReader(r)}
}

// Retry returns the value of the last "retry:" line read, "" before one.
// The reconnection advice belongs to the stream, not to a frame.
func (r *Reader) Retry() string { return r.retry }

// Next returns the next frame with an id, event or data line. Blocks of
// comments (heartbeats, which come when a timer says) and retry advice
// alone are no frames. A body that ends, even in the middle of a frame,
// returns its read error (io.EOF) and no frame: a frame counts once its
// blank line arrived.
func (r *Reader) Next() (Frame, error) {
	var (
		f    Frame
		data []string
		seen bool
	)
	for {
		line, err := r.br.ReadString('\n')
		if err != nil {
			return Frame{}, err
		}
		line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
		if line == "" {
			if seen {
				f.Data = strings.Join(data, "\n")
				return f, nil
			}
			continue
		}
		if line[0] == ':' {
			continue
		}
		name, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch name {
		case "id":
			f.ID = value
		case "event":
			f.Event = value
		case "data":
			data = append(data, value)
		case "retry":
			r.retry = value
			continue
		default:
			return Frame{}, fmt.Errorf("%w: %q", ErrField, line)
		}
		seen = true
	}
}

// Frames reads n frames, or all of them until the body ends when n is
// negative, and returns those read with the error that stopped it: io.EOF
// at the end of a body read to its end.
func (r *Reader) Frames(n int) ([]Frame, error) {
	var out []Frame
	for n < 0 || len(out) < n {
		f, err := r.Next()
		if err != nil {
			return out, err
		}
		out = append(out, f)
	}
	return out, nil
}

// Stream reads the frames of r on a goroutine of its own into a channel
// with room for buffer frames, closed when the body ends or fails.
func Stream(r io.Reader, buffer int) <-chan Frame {
	frames := make(chan Frame, buffer)
	go func() {
		defer close(frames)
		sr := NewReader(r)
		for {
			f, err := sr.Next()
			if err != nil {
				return
			}
			frames <- f
		}
	}()
	return frames
}
