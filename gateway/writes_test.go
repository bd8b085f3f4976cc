package gateway_test

import (
	"bytes"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// recorder is a second listener of a test's server whose connections
// record every write the server makes on them: one write is one system
// call on the socket. A write can be slowed down, to see what waits for
// it.
type recorder struct {
	net.Listener
	// delay, when set, is how long a write of data, answering the request
	// whose line is req, waits before it is made.
	delay func(req string, data []byte) time.Duration

	mu     sync.Mutex
	conns  int
	writes []write
}

// write is one write the server made.
type write struct {
	conn int
	// req is the request line the connection read last: the request the
	// write answers.
	req        string
	data       []byte
	start, end time.Time
}

// record serves s on a recording listener as well as on its own, until
// the test ends, and returns it with a client of it.
func record(t *testing.T, s *nodetest.Server) (*recorder, *api) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{Listener: ln}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = s.Node.Server.Serve(r)
	}()
	t.Cleanup(func() {
		s.Close() // closes r too
		<-served
	})
	return r, &api{t: t, base: "http://" + ln.Addr().String(), hc: &http.Client{Transport: &http.Transport{}}}
}

func (r *recorder) Accept() (net.Conn, error) {
	c, err := r.Listener.Accept()
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.conns++
	id := r.conns
	r.mu.Unlock()
	return &recordedConn{Conn: c, r: r, id: id}, nil
}

// to returns the writes answering requests whose line contains part, in
// the order they were made.
func (r *recorder) to(part string) []write {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []write
	for _, w := range r.writes {
		if strings.Contains(w.req, part) {
			out = append(out, w)
		}
	}
	return out
}

// holding returns the first write whose bytes contain part.
func (r *recorder) holding(t *testing.T, part string) write {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.writes {
		if bytes.Contains(w.data, []byte(part)) {
			return w
		}
	}
	t.Fatalf("no write holds %q", part)
	return write{}
}

// connOf is the connection of the first of writes, 0 when there is none.
func connOf(writes []write) int {
	if len(writes) == 0 {
		return 0
	}
	return writes[0].conn
}

type recordedConn struct {
	net.Conn
	r   *recorder
	id  int
	mu  sync.Mutex
	req string
}

func (c *recordedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	// A request arrives whole in one read: they are small, and the
	// clients of these tests send one at a time on a connection.
	if line, _, ok := bytes.Cut(p[:n], []byte("\r\n")); ok && bytes.Contains(line, []byte(" HTTP/1.1")) {
		c.mu.Lock()
		c.req = string(line)
		c.mu.Unlock()
	}
	return n, err
}

func (c *recordedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	req := c.req
	c.mu.Unlock()
	// Recorded before it is made: a client may act on what it reads
	// before this returns.
	c.r.mu.Lock()
	i := len(c.r.writes)
	c.r.writes = append(c.r.writes, write{conn: c.id, req: req, data: bytes.Clone(p), start: time.Now()})
	c.r.mu.Unlock()
	if c.r.delay != nil {
		time.Sleep(c.r.delay(req, p))
	}
	n, err := c.Conn.Write(p)
	c.r.mu.Lock()
	c.r.writes[i].end = time.Now()
	c.r.mu.Unlock()
	return n, err
}

// TestSSEStreamEndsInOneWrite checks that an execution stream that ends
// puts its last frames, the end of its chunked body and, when nothing came
// before, its headers on the wire in one write, and that the connection
// then carries the client's next request.
func TestSSEStreamEndsInOneWrite(t *testing.T) {
	for _, tc := range []struct {
		name string
		// live opens the stream before the execution completes.
		live bool
		// after is the stream's cursor: "all" is past the last event.
		after string
		// last is what the stream's last write must hold.
		last string
	}{
		{name: "live", live: true, after: "0", last: "event: execution.completed\n"},
		{name: "replayed", after: "0", last: "event: execution.completed\n"},
		{name: "past the end", after: "all", last: "HTTP/1.1 200 OK\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := start(t, node.Options{})
			rec, a := record(t, s)
			ag := a.agent("one-write", "c1")
			id, lease := a.assigned(ag, nil)
			// The stream has a client of its own with one connection, which
			// its next request must wait for.
			sa := &api{t: t, base: a.base, hc: &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}}
			after := tc.after
			var st *sseStream
			if tc.live {
				st = sa.openSSE("/v0/executions/" + id + "/stream?after_sequence=" + after)
			}
			a.intent(id, lease, obj{"type": "complete"}, 200)
			if after == "all" {
				after = "4" // created, started, intent.accepted, completed
			}
			if !tc.live {
				st = sa.openSSE("/v0/executions/" + id + "/stream?after_sequence=" + after)
			}
			for tc.after != "all" && st.next().Event != "execution.completed" {
			}
			st.ended()
			writes := rec.to("/v0/executions/" + id + "/stream")
			if len(writes) == 0 {
				t.Fatal("no write of the stream")
			}
			last := writes[len(writes)-1]
			if !bytes.HasSuffix(last.data, []byte("\r\n0\r\n\r\n")) || !bytes.Contains(last.data, []byte(tc.last)) {
				t.Fatalf("the stream's last write (%d of %d) is %q: want its last frame %q and the end of the body together", len(writes), len(writes), last.data, tc.last)
			}
			if tc.after == "all" && len(writes) != 1 {
				t.Fatalf("a stream with nothing to send took %d writes, want 1", len(writes))
			}
			// The connection is reused for the next request, and answers it.
			sa.json("GET", "/v0/executions/"+id, nil, 200)
			if next := rec.to("GET /v0/executions/" + id + " "); len(next) != 1 || next[0].conn != last.conn {
				t.Fatalf("the next request took %d writes, the first on connection %d; want one on the stream's, %d", len(next), connOf(next), last.conn)
			}
		})
	}
}

// TestPushWaitsForTheWriteOfItsAnswer checks that the job an intent
// dispatches reaches the runner only once the intent's answer is written,
// even when that write is slow: the agent learns the step's id from the
// answer, and must have it before the runner can act on the job.
func TestPushWaitsForTheWriteOfItsAnswer(t *testing.T) {
	s := start(t, node.Options{})
	rec, a := record(t, s)
	const slow = 150 * time.Millisecond
	rec.delay = func(req string, data []byte) time.Duration {
		if strings.HasPrefix(req, "POST /v0/agents/intent ") && bytes.Contains(data, []byte(`"step_id"`)) {
			return slow
		}
		return 0
	}
	ag := a.agent("slow-answer", "c1")
	run := a.runner("slow-answer-runner", "c1", "echo")
	id, lease := a.assigned(ag, nil)
	step := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "echo", "remote": true}, 200)["step_id"]
	if job := run.expect("job.assigned"); job["step_id"] != step {
		t.Fatalf("job %v for step %v", job, step)
	}
	answers := rec.to("POST /v0/agents/intent ")
	if len(answers) != 1 || !bytes.Contains(answers[0].data, []byte(step.(string))) {
		t.Fatalf("the intent's answer: %+v", answers)
	}
	answer := answers[0]
	job := rec.holding(t, "event: job.assigned")
	if job.start.Before(answer.end) {
		t.Fatalf("the job left %v before the intent's answer was written", answer.end.Sub(job.start))
	}
}
