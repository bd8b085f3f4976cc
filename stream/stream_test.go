package stream_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/gateway/wsaccept"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/stream"
	"github.com/gatehouse-dev/gatehouse/stream/ssetest"
)

// memLog is an append-only log read from a cursor: the shape of every
// source the gateway streams (an execution's events, a session's log).
type memLog struct {
	mu     sync.Mutex
	items  []stream.Item
	closed bool
	wakes  map[*logReader]func()
}

func (l *memLog) append(typ, data string) {
	l.mu.Lock()
	l.items = append(l.items, stream.Item{Seq: uint64(len(l.items) + 1), Type: typ, Data: []byte(data)})
	for _, f := range l.wakes {
		f()
	}
	l.mu.Unlock()
}

func (l *memLog) end() {
	l.mu.Lock()
	l.closed = true
	for _, f := range l.wakes {
		f()
	}
	l.mu.Unlock()
}

func (l *memLog) reader(after uint64) *logReader {
	return &logReader{l: l, last: after}
}

// readerFor reads the log from a request's "after" query parameter, at
// most "most" items a Next.
func (l *memLog) readerFor(ctx *fasthttp.RequestCtx) *logReader {
	after, _ := strconv.ParseUint(string(ctx.QueryArgs().Peek("after")), 10, 64)
	r := l.reader(after)
	r.most, _ = strconv.Atoi(string(ctx.QueryArgs().Peek("most")))
	return r
}

type logReader struct {
	l      *memLog
	last   uint64
	closed bool
	notice *stream.Item // given first
	// most bounds the items of one Next below the buffer's length, as a
	// source that bounds a batch by bytes does; zero fills the buffer.
	most int
}

func (r *logReader) Next(buf []stream.Item) (int, error) {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	n := 0
	if r.notice != nil {
		buf[0] = *r.notice
		r.notice = nil
		n++
	}
	limit := len(buf)
	if r.most > 0 {
		limit = min(limit, r.most)
	}
	for n < limit && r.last < uint64(len(r.l.items)) {
		buf[n] = r.l.items[r.last]
		r.last++
		n++
	}
	if r.l.closed && r.last == uint64(len(r.l.items)) {
		return n, stream.ErrEnd
	}
	return n, nil
}

func (r *logReader) OnWake(f func()) {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	if r.l.wakes == nil {
		r.l.wakes = map[*logReader]func(){}
	}
	r.l.wakes[r] = f
}

func (r *logReader) Close() {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	delete(r.l.wakes, r)
	r.closed = true
}

// render shows every item as its type and data, resumable at its sequence.
var render = stream.RenderFunc(func(f *stream.Frame, it stream.Item) (bool, error) {
	if it.Type == "hidden" {
		return false, nil
	}
	f.ID = strconv.AppendUint(f.ID, it.Seq, 10)
	f.Event = it.Type
	f.Data = append(f.Data, it.Data...)
	return true, nil
})

// serve runs a fasthttp server on loopback for the test.
func serve(t *testing.T, h fasthttp.RequestHandler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: h, CloseOnShutdown: true}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

type ended struct {
	reason stream.Reason
	err    error
}

// sseServer streams log from the after query parameter and reports how
// each stream ended on the returned channel.
func sseServer(t *testing.T, log *memLog, o stream.Options, so stream.SSEOptions) (string, <-chan ended) {
	ends := make(chan ended, 16)
	url := serve(t, func(ctx *fasthttp.RequestCtx) {
		src := log.readerFor(ctx)
		ctx.SetContentType("text/event-stream")
		conn := ctx.Conn()
		opts := o
		opts.Gone = stream.ClientGone(conn)
		ctx.SetConnectionClose()
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			tr := stream.NewSSE(w, conn, so)
			tr.Open()
			reason, err := stream.New(src, render, tr, opts).Run(context.Background())
			ends <- ended{reason, err}
		})
	})
	return url, ends
}

// get opens a response whose reading fails after 20 s rather than hang the
// test when a stream stalls.
func get(t *testing.T, url string) *http.Response {
	t.Helper()
	hc := &http.Client{Timeout: 20 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// waitEnd waits for the stream's Run to return, and fails the test unless
// it ended for reason want.
func waitEnd(t *testing.T, ends <-chan ended, want stream.Reason) {
	t.Helper()
	select {
	case e := <-ends:
		if e.reason != want {
			t.Fatalf("ended with %v %v, want %v", e.reason, e.err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end")
	}
}

func TestSSEReplaysThenTailsThenEnds(t *testing.T) {
	log := &memLog{}
	for i := 1; i <= 300; i++ { // more than one batch
		typ := "e"
		if i == 2 {
			typ = "hidden"
		}
		log.append(typ, fmt.Sprintf(`{"n":%d}`, i))
	}
	url, ends := sseServer(t, log, stream.Options{}, stream.SSEOptions{Retry: time.Second})
	resp := get(t, url+"/?after=1")
	r := bufio.NewReader(resp.Body)
	sr := ssetest.NewReader(r)
	evs, err := sr.Frames(298)
	if err != nil {
		t.Fatal(err)
	}
	if evs[0].ID != "3" || evs[0].Data != `{"n":3}` || evs[297].ID != "300" || sr.Retry() != "1000" {
		t.Fatalf("replay: first %+v last %+v, retry %q", evs[0], evs[297], sr.Retry())
	}
	log.append("live", `{"live":true}`)
	live, err := sr.Frames(1)
	if err != nil || live[0].ID != "301" || live[0].Event != "live" {
		t.Fatalf("live tail: %+v %v", live, err)
	}
	log.end()
	waitEnd(t, ends, stream.Finished)
	if rest, err := io.ReadAll(r); err != nil || len(strings.TrimSpace(string(rest))) != 0 {
		t.Fatalf("after the end: %q %v", rest, err)
	}
}

func TestSSEFinalItemEndsTheStream(t *testing.T) {
	log := &memLog{}
	log.append("a", "1")
	log.append("done", "2")
	log.append("after", "3")
	final := func(it stream.Item) bool { return it.Type == "done" }
	url, ends := sseServer(t, log, stream.Options{Final: final}, stream.SSEOptions{})
	evs, err := ssetest.NewReader(get(t, url).Body).Frames(-1)
	if !errors.Is(err, io.EOF) || len(evs) != 2 || evs[1].Event != "done" {
		t.Fatalf("events %+v, %v", evs, err)
	}
	waitEnd(t, ends, stream.Finished)
}

func TestSSEHeartbeatsWhileIdleAndNoticeOnExpiry(t *testing.T) {
	log := &memLog{}
	o := stream.Options{Heartbeat: 20 * time.Millisecond, Expires: time.Now().Add(300 * time.Millisecond)}
	so := stream.SSEOptions{Notice: func(f *stream.Frame, reason stream.Reason, _ error) bool {
		f.Event = "stream." + reason.String()
		f.Data = append(f.Data, `{}`...)
		return true
	}}
	url, ends := sseServer(t, log, o, so)
	body, err := io.ReadAll(get(t, url).Body)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(body), ":heartbeat\n\n") {
		t.Fatalf("no heartbeat in %q", body)
	}
	if !strings.HasSuffix(string(body), "event: stream.expired\ndata: {}\n\n") {
		t.Fatalf("no expiry notice at the end of %q", body)
	}
	waitEnd(t, ends, stream.Expired)
}

func TestSSEMultilineDataKeepsEveryLine(t *testing.T) {
	log := &memLog{}
	log.append("m", "a\nb\r\nc\rd")
	log.end()
	url, _ := sseServer(t, log, stream.Options{}, stream.SSEOptions{})
	evs, _ := ssetest.NewReader(get(t, url).Body).Frames(-1)
	if len(evs) != 1 || evs[0].Data != "a\nb\nc\nd" {
		t.Fatalf("events %+v", evs)
	}
}

func TestSSEClientGoneEndsAnIdleStream(t *testing.T) {
	log := &memLog{}
	url, ends := sseServer(t, log, stream.Options{}, stream.SSEOptions{})
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	waitEnd(t, ends, stream.Gone)
}

func TestSSESlowConsumerIsDropped(t *testing.T) {
	log := &memLog{}
	big := `"` + strings.Repeat("x", 64<<10) + `"`
	url, ends := sseServer(t, log, stream.Options{}, stream.SSEOptions{WriteTimeout: 100 * time.Millisecond})
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4096)
	}
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	// The client reads nothing: the socket buffers fill, and a flush waits
	// out the write timeout.
	for range 200 {
		log.append("big", big)
	}
	waitEnd(t, ends, stream.SlowConsumer)
}

func TestFlushedReportsTheLastFlushedSequence(t *testing.T) {
	log := &memLog{}
	log.append("a", "1")
	log.append("hidden", "2")
	var mu sync.Mutex
	var flushed []uint64
	o := stream.Options{Flushed: func(seq uint64) { mu.Lock(); flushed = append(flushed, seq); mu.Unlock() }}
	url, _ := sseServer(t, log, o, stream.SSEOptions{})
	r := ssetest.NewReader(get(t, url).Body)
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	log.append("b", "3")
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	// Flushed runs once the flush has returned, which may be after the
	// client read the frame: wait for it, within a bound.
	var got []uint64
	eventually.True(t, "the last frame flushed", func() bool {
		mu.Lock()
		got = append(got[:0], flushed...)
		mu.Unlock()
		return len(got) >= 2 && got[len(got)-1] == 3
	})
	// A hidden item still counts as flushed: the client had all there was
	// to see of it.
	if len(got) < 2 || got[0] != 2 || got[len(got)-1] != 3 {
		t.Fatalf("flushed %v", got)
	}
}

// wsServer streams log on a WebSocket carried by Start.
func wsServer(t *testing.T, log *memLog, onStream func(*stream.Stream, *stream.WS)) string {
	return wsServerWith(t, log, stream.WSOptions{WriteTimeout: 200 * time.Millisecond}, onStream)
}

// wsServerWith is wsServer with the socket's options o; frames are encoded
// as encodeText does.
func wsServerWith(t *testing.T, log *memLog, o stream.WSOptions, onStream func(*stream.Stream, *stream.WS)) string {
	o.Encode = encodeText
	var tr wsaccept.Tracker
	t.Cleanup(func() { _ = tr.Shutdown(context.Background(), "bye") })
	return serve(t, func(ctx *fasthttp.RequestCtx) {
		src := log.readerFor(ctx)
		err := tr.Accept(ctx, &websocket.AcceptOptions{}, func(ctx context.Context, c *websocket.Conn) {
			ws := stream.NewWS(c, o)
			s := stream.New(src, render, ws, stream.Options{})
			ws.OnEnd(s.Stop)
			s.Start()
			if onStream != nil {
				onStream(s, ws)
			}
			for {
				if _, _, err := ws.Read(); err != nil {
					break
				}
			}
			ws.Finish(ctx)
		})
		if err != nil {
			t.Log(err)
		}
	})
}

func encodeText(dst []byte, f *stream.Frame) ([]byte, error) {
	dst = append(dst, f.ID...)
	dst = append(dst, ' ')
	dst = append(dst, f.Event...)
	dst = append(dst, ' ')
	return append(dst, f.Data...), nil
}

func dialWS(t *testing.T, url string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, strings.Replace(url, "http", "ws", 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseNow() })
	c.SetReadLimit(1 << 20)
	return c
}

func readWS(t *testing.T, c *websocket.Conn) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, data, err := c.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestWSStartCarriesReplayTailAndEnd(t *testing.T) {
	log := &memLog{}
	log.append("a", "1")
	log.append("b", "2")
	url := wsServer(t, log, nil)
	c := dialWS(t, url+"/?after=1")
	if got := readWS(t, c); got != "2 b 2" {
		t.Fatalf("replay: %q", got)
	}
	log.append("c", "3")
	if got := readWS(t, c); got != "3 c 3" {
		t.Fatalf("tail: %q", got)
	}
	log.end()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _, err := c.Read(ctx)
	if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Fatalf("end: %v", err)
	}
}

func TestWSSwitchWritesNoticesThenTheNewSource(t *testing.T) {
	log := &memLog{}
	for i := range 3 {
		log.append("e", strconv.Itoa(i+1))
	}
	switched := make(chan struct{})
	url := wsServer(t, log, func(s *stream.Stream, _ *stream.WS) {
		go func() {
			<-switched
			s.Switch(func() stream.Source {
				r := log.reader(1)
				r.notice = &stream.Item{Type: "reset", Data: []byte(`{}`)}
				return r
			})
		}()
	})
	c := dialWS(t, url+"/?after=3")
	close(switched)
	if got := readWS(t, c); got != "0 reset {}" {
		t.Fatalf("notice: %q", got)
	}
	for _, want := range []string{"2 e 2", "3 e 3"} {
		if got := readWS(t, c); got != want {
			t.Fatalf("after the switch: %q, want %q", got, want)
		}
	}
}

// slowConsumer opens a socket with options o to a client that reads
// nothing while 64 frames of 256 KiB are written to it, and waits until the
// server gives up on the client. It returns the client and the server's
// socket.
func slowConsumer(t *testing.T, o stream.WSOptions) (*websocket.Conn, *stream.WS) {
	t.Helper()
	log := &memLog{}
	sockets := make(chan *stream.WS, 1)
	c := dialWS(t, wsServerWith(t, log, o, func(_ *stream.Stream, ws *stream.WS) { sockets <- ws }))
	ws := <-sockets
	big := strings.Repeat("x", 256<<10)
	for range 64 {
		log.append("big", big)
	}
	select {
	case <-ws.Ending():
	case <-time.After(eventually.Deadline):
		t.Fatalf("the server did not give up on a client that reads nothing within %v", eventually.Deadline)
	}
	return c, ws
}

// readAll reads c until it fails, checking that the frames it gets are the
// log's, whole and in order; it returns how many it got and the error.
func readAll(t *testing.T, c *websocket.Conn) (int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), eventually.Deadline)
	defer cancel()
	for got := 0; ; got++ {
		_, data, err := c.Read(ctx)
		if err != nil {
			return got, err
		}
		if want := strconv.Itoa(got+1) + " big "; !strings.HasPrefix(string(data), want) || len(data) != len(want)+256<<10 {
			t.Fatalf("frame %d: %.20q... (%d bytes)", got+1, data, len(data))
		}
	}
}

// TestWSSlowConsumerClosesWith4001: once a write has been stuck past the
// write timeout the server gives up on the client; a client that then
// reads, within the close timeout, gets the frame that was stuck whole and
// then 4001. The client starts reading only once the server has given up,
// however long that took, rather than after a fixed sleep.
func TestWSSlowConsumerClosesWith4001(t *testing.T) {
	c, _ := slowConsumer(t, stream.WSOptions{WriteTimeout: 200 * time.Millisecond, CloseTimeout: time.Minute})
	got, err := readAll(t, c)
	if websocket.CloseStatus(err) != stream.CloseSlowConsumer {
		t.Fatalf("closed with %v after %d frames, want 4001", err, got)
	}
	if got == 64 {
		t.Fatal("all 64 frames arrived: the client was never slow")
	}
}

// TestWSCloseTimeoutCutsAClientThatNeverReads: the server does not wait for
// a slow client past the close timeout. A client that still reads nothing
// is cut off without a close frame, the frame that was stuck cut short,
// and the socket is done on the server's side, holding nothing more.
func TestWSCloseTimeoutCutsAClientThatNeverReads(t *testing.T) {
	c, ws := slowConsumer(t, stream.WSOptions{WriteTimeout: 200 * time.Millisecond, CloseTimeout: 100 * time.Millisecond})
	done := make(chan struct{})
	go func() {
		ws.Finish(context.Background())
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(eventually.Deadline):
		t.Fatalf("the server still holds the socket of a client that read nothing, %v after giving up on it", eventually.Deadline)
	}
	got, err := readAll(t, c)
	if websocket.CloseStatus(err) != -1 || !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		t.Fatalf("ended with %v after %d frames, want the connection cut without a close frame", err, got)
	}
}

func TestCloseReasonFitsAFrame(t *testing.T) {
	tests := []struct{ in, want string }{
		{"short", "short"},
		{strings.Repeat("a", 123), strings.Repeat("a", 123)},
		{strings.Repeat("a", 130), strings.Repeat("a", 123)},
		{strings.Repeat("a", 122) + "é", strings.Repeat("a", 122)},
	}
	for _, tt := range tests {
		if got := stream.CloseReason(tt.in); got != tt.want {
			t.Errorf("CloseReason(%d bytes) = %d bytes", len(tt.in), len(got))
		}
	}
}

// TestShortBatchesAreNotTheEnd: a source may give fewer items than asked
// while it holds more (a batch bounded by bytes); the stream asks again
// until it gets none, on SSE and WebSocket, whether the source has ended
// or is still live.
func TestShortBatchesAreNotTheEnd(t *testing.T) {
	const total = 1000
	fill := func(log *memLog) {
		for i := range total {
			log.append("e", strconv.Itoa(i+1))
		}
	}
	t.Run("sse", func(t *testing.T) {
		for _, ended := range []bool{true, false} {
			log := &memLog{}
			fill(log)
			if ended {
				log.end()
			}
			url, ends := sseServer(t, log, stream.Options{}, stream.SSEOptions{})
			sr := ssetest.NewReader(bufio.NewReader(get(t, url+"/?most=3").Body))
			evs, err := sr.Frames(total)
			if err != nil {
				t.Fatalf("ended %v: %v after %d frames", ended, err, len(evs))
			}
			if evs[total-1].ID != strconv.Itoa(total) {
				t.Fatalf("ended %v: last frame %+v", ended, evs[total-1])
			}
			log.end()
			waitEnd(t, ends, stream.Finished)
		}
	})
	t.Run("ws", func(t *testing.T) {
		log := &memLog{}
		fill(log)
		c := dialWS(t, wsServer(t, log, nil)+"/?most=3")
		for i := range total {
			if got, want := readWS(t, c), fmt.Sprintf("%d e %d", i+1, i+1); got != want {
				t.Fatalf("frame %d: %q, want %q", i, got, want)
			}
		}
		log.end()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
			t.Fatalf("end: %v", err)
		}
	})
}

// TestFrameBorrowLeavesTheItemsBytesAlone: a frame that borrowed an item's
// payload neither writes into it when appended to nor keeps it after a
// Reset, and gets its own buffer back.
func TestFrameBorrowLeavesTheItemsBytesAlone(t *testing.T) {
	var f stream.Frame
	f.Data = append(f.Data, "own"...)
	own := &f.Data[:1][0]
	arena := []byte(`{"a":1}{"b":2}`)
	f.Reset()
	f.Borrow(arena[:7])
	if string(f.Data) != `{"a":1}` {
		t.Fatalf("borrowed data %q", f.Data)
	}
	f.Data = append(f.Data, 'x')
	if string(arena) != `{"a":1}{"b":2}` {
		t.Fatalf("an append after Borrow wrote into the item's bytes: %q", arena)
	}
	f.Borrow(arena[7:])
	f.Reset()
	if len(f.Data) != 0 || cap(f.Data) == 0 || &f.Data[:1][0] != own {
		t.Fatalf("after Reset the frame holds %q (cap %d), not its own buffer", f.Data, cap(f.Data))
	}
}
