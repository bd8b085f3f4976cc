package stream

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"
	"testing"
)

// writes records each Write it is given.
type writes struct{ sizes []int }

func (w *writes) Write(p []byte) (int, error) {
	w.sizes = append(w.sizes, len(p))
	return len(p), nil
}

// TestSSECatchUpLeavesInLargeWrites: frames ready at once (a resuming
// client's catch-up) reach the connection in writes of up to sseSpill
// bytes, not one per small buffer, and between flushes the stream holds
// no buffer.
func TestSSECatchUpLeavesInLargeWrites(t *testing.T) {
	var w writes
	s := NewSSE(&w, nil, SSEOptions{})
	s.Open()
	data := []byte(`{"id":"` + strings.Repeat("x", 600) + `"}`)
	const frames = 1000
	for i := range frames {
		if err := s.Write(&Frame{ID: strconv.AppendInt(nil, int64(i+1), 10), Event: "signal.received", Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, n := range w.sizes {
		total += n
	}
	if want := total/sseSpill + 1; len(w.sizes) > want {
		t.Fatalf("%d bytes left in %d writes, want at most %d", total, len(w.sizes), want)
	}
	if s.buf != nil {
		t.Fatal("the stream holds a buffer after its flush")
	}
	if err := s.Flush(); err != nil || len(w.sizes) > total/sseSpill+1 {
		t.Fatalf("a flush with nothing buffered wrote: %v, %d writes", err, len(w.sizes))
	}
}

// TestSSEFramesRenderAsBefore: the wire form of frames, line breaks in
// the data split into data lines and broken ids kept on their line, is
// what a bufio-based writer wrote, whatever the buffer does.
func TestSSEFramesRenderAsBefore(t *testing.T) {
	var out bytes.Buffer
	bw := bufio.NewWriter(&out)
	s := NewSSE(bw, nil, SSEOptions{})
	for _, f := range []Frame{
		{ID: []byte("1"), Event: "a", Data: []byte("one")},
		{ID: []byte("2\n3"), Event: "b\rc", Data: []byte("x\r\ny\nz\rw")},
		{Data: []byte("")},
	} {
		if err := s.Write(&f); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Heartbeat(); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	const want = "id: 1\nevent: a\ndata: one\n\n" +
		"id: 2 3\nevent: b c\ndata: x\ndata: y\ndata: z\ndata: w\n\n" +
		"data: \n\n" +
		":heartbeat\n\n"
	if out.String() != want {
		t.Fatalf("got %q\nwant %q", out.String(), want)
	}
}
