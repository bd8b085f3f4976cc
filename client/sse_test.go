package client

import (
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestSSEReader(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []sseEvent
		err  error
	}{
		{
			name: "gateway frames",
			in:   "retry: 5000\n\nid: 1\nevent: execution.created\ndata: {\"a\":1}\n\n:heartbeat\n\nevent: x\ndata: 2\n\n",
			want: []sseEvent{{Type: "execution.created", Data: []byte(`{"a":1}`), ID: "1"}, {Type: "x", Data: []byte("2"), ID: "1"}},
			err:  io.EOF,
		},
		{
			name: "CRLF line ends",
			in:   "event: a\r\ndata: b\r\n\r\n",
			want: []sseEvent{{Type: "a", Data: []byte("b")}},
			err:  io.EOF,
		},
		{
			name: "data lines joined, one leading space removed",
			in:   "data:  two spaces\ndata:none\ndata\n\n",
			want: []sseEvent{{Type: "message", Data: []byte(" two spaces\nnone\n")}},
			err:  io.EOF,
		},
		{
			name: "empty data line still dispatches",
			in:   "event: e\ndata:\n\n",
			want: []sseEvent{{Type: "e"}},
			err:  io.EOF,
		},
		{
			name: "frame without data is not dispatched",
			in:   "event: lonely\n\nevent: real\ndata: 1\n\n",
			want: []sseEvent{{Type: "real", Data: []byte("1")}},
			err:  io.EOF,
		},
		{
			name: "unknown fields, comments and retry are ignored",
			in:   ": hello\nfoo: bar\nretry: 10\ndata: x\n\n",
			want: []sseEvent{{Type: "message", Data: []byte("x")}},
			err:  io.EOF,
		},
		{
			name: "id with NUL is ignored",
			in:   "id: 7\ndata: a\n\nid: 8\x00\ndata: b\n\n",
			want: []sseEvent{{Type: "message", Data: []byte("a"), ID: "7"}, {Type: "message", Data: []byte("b"), ID: "7"}},
			err:  io.EOF,
		},
		{
			name: "event cut off at the end is dropped",
			in:   "event: a\ndata: 1\n\nevent: b\ndata: 2\n",
			want: []sseEvent{{Type: "a", Data: []byte("1")}},
			err:  io.EOF,
		},
		{
			name: "unterminated last line",
			in:   "data: 1\n\ndata: 2",
			want: []sseEvent{{Type: "message", Data: []byte("1")}},
			err:  io.ErrUnexpectedEOF,
		},
		{
			name: "line too long",
			in:   "data: " + strings.Repeat("x", maxSSELine) + "\n\n",
			err:  errLineTooLong,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newSSEReader(strings.NewReader(tc.in))
			var got []sseEvent
			for {
				ev, err := r.Next()
				if err != nil {
					if !errors.Is(err, tc.err) {
						t.Fatalf("err = %v, want %v", err, tc.err)
					}
					break
				}
				got = append(got, ev)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestSSEReaderLongLineWithinLimit(t *testing.T) {
	data := strings.Repeat("y", maxSSELine-len("data: "))
	r := newSSEReader(strings.NewReader("data: " + data + "\r\n\n"))
	ev, err := r.Next()
	if err != nil || string(ev.Data) != data {
		t.Fatalf("got %d bytes, err %v", len(ev.Data), err)
	}
}
