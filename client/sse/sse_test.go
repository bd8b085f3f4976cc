package sse

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// readAll renders every event of body as "type|data|id".
func readAll(body io.Reader, maxLine int) ([]string, error) {
	r := NewReader(body, maxLine)
	var got []string
	for {
		ev, err := r.Next()
		if err != nil {
			return got, err
		}
		got = append(got, ev.Type+"|"+string(ev.Data)+"|"+ev.ID)
	}
}

func TestReader(t *testing.T) {
	long := strings.Repeat("x", 100<<10) // past the reader's buffer
	for _, tc := range []struct {
		name, body string
		want       []string
		err        error
	}{{
		name: "gateway frames",
		body: "retry: 5000\n\n" +
			"id: 7.1\nevent: execution.assigned\ndata: {\"a\":1}\n\n" +
			":heartbeat\n\n" +
			"event: tool.result\ndata: {\"b\":2}\n\n",
		want: []string{`execution.assigned|{"a":1}|7.1`, `tool.result|{"b":2}|7.1`},
		err:  io.EOF,
	}, {
		name: "CRLF, two data lines, no space after the colon",
		body: "data:one\r\ndata: two\r\n\r\n",
		want: []string{"message|one\ntwo|"},
		err:  io.EOF,
	}, {
		name: "one leading space removed, a field without a colon is empty",
		body: "data:  two spaces\ndata\n\n",
		want: []string{"message| two spaces\n|"},
		err:  io.EOF,
	}, {
		name: "a frame without data dispatches nothing and its type is forgotten",
		body: "event: lonely\n\nevent: real\ndata: 1\n\ndata: 2\n\n",
		want: []string{"real|1|", "message|2|"},
		err:  io.EOF,
	}, {
		name: "an empty data line still dispatches",
		body: "event: e\ndata:\n\n",
		want: []string{"e||"},
		err:  io.EOF,
	}, {
		name: "unknown fields and comments are skipped; an id with NUL is ignored",
		body: ": hello\nfoo: bar\nid: 1\ndata: a\n\nid: bad\x00id\nevent: x\ndata: 3\n\n",
		want: []string{"message|a|1", "x|3|1"},
		err:  io.EOF,
	}, {
		name: "a long line",
		body: "event: big\ndata: " + long + "\n\n",
		want: []string{"big|" + long + "|"},
		err:  io.EOF,
	}, {
		name: "cut inside an event",
		body: "event: x\ndata: 1\n\nevent: y\ndata: 2\n",
		want: []string{"x|1|"},
		err:  io.ErrUnexpectedEOF,
	}, {
		name: "cut inside a line",
		body: "event: x\ndata: 1\n\ndata: {\"trunc",
		want: []string{"x|1|"},
		err:  io.ErrUnexpectedEOF,
	}, {
		name: "a line past the limit",
		body: "data: " + strings.Repeat("x", 1<<20) + "\n\n",
		err:  ErrLineTooLong,
	}, {
		name: "a line at the limit",
		body: "data: " + strings.Repeat("y", 1<<20-len("data: ")) + "\r\n\n",
		want: []string{"message|" + strings.Repeat("y", 1<<20-len("data: ")) + "|"},
		err:  io.EOF,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			// One byte per read exercises every split of lines across reads.
			for _, body := range []io.Reader{strings.NewReader(tc.body), iotest.OneByteReader(strings.NewReader(tc.body))} {
				got, err := readAll(body, 1<<20)
				if !errors.Is(err, tc.err) {
					t.Errorf("ended with %v, want %v", err, tc.err)
				}
				if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", tc.want) {
					t.Errorf("events\n got %.200q\nwant %.200q", got, tc.want)
				}
			}
		})
	}
}

func TestResetOnRead(t *testing.T) {
	fired := make(chan struct{})
	timer := time.AfterFunc(time.Hour, func() { close(fired) })
	defer timer.Stop()
	r := ResetOnRead(strings.NewReader("x"), timer, 20*time.Millisecond)
	if _, err := r.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-fired: // re-armed to 20ms by the read
	case <-time.After(5 * time.Second):
		t.Fatal("a read did not reset the timer")
	}
}
