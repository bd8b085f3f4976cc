package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"go.uber.org/goleak"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/stream/ssetest"
)

type obj = map[string]any

// open opens a node on dir at a free loopback port.
func open(t *testing.T, dir string) *node.Node {
	t.Helper()
	n, err := node.Open(t.Context(), node.Options{Addr: "127.0.0.1:0", Data: dir})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	// A test that fails half-way still releases the node; after the
	// test's own Close this one does nothing.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), node.ShutdownTimeout)
		defer cancel()
		_ = n.Close(ctx)
	})
	return n
}

// closeNode closes n, bounded as `gatehouse serve` bounds it.
func closeNode(t *testing.T, n *node.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), node.ShutdownTimeout)
	defer cancel()
	if err := n.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// settle waits until no goroutine is running but those of base: a stopped
// server's last goroutines take a moment to return. It fails the test
// with the stacks of those that remain.
func settle(t *testing.T, base goleak.Option) {
	t.Helper()
	eventually.Check(t, func() error {
		if err := goleak.Find(base); err != nil {
			return fmt.Errorf("goroutines left running after Close:\n%w", err)
		}
		return nil
	})
}

// warmUp opens a node, answers one request and closes it, so that what a
// process starts on first use and keeps for good (fasthttp's clock of the
// Date header) is in the baseline and not held against the node under
// test.
func warmUp(t *testing.T) goleak.Option {
	t.Helper()
	n := open(t, t.TempDir())
	hc := &http.Client{Transport: &http.Transport{}}
	resp, err := hc.Get("http://" + n.Addr().String() + "/v0/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	hc.CloseIdleConnections()
	closeNode(t, n)
	return goleak.IgnoreCurrent()
}

// TestCloseJoinsEveryGoroutine drives an execution through a real SSE
// agent and a real WebSocket runner, tails it, invokes a memory tool
// through the built-in runner, and closes the node with the agent's
// stream and the runner's socket still open: once Close returns and the
// clients have seen their connections end, every goroutine the node
// started has ended.
func TestCloseJoinsEveryGoroutine(t *testing.T) {
	base := warmUp(t)
	n := open(t, t.TempDir())
	hc := &http.Client{Transport: &http.Transport{}}
	url := "http://" + n.Addr().String()

	agent := openSSE(t, hc, url+"/v0/agents/stream?agent_id=leak-agent&consumer_id=a1")
	runner := dialRunner(t, "ws"+strings.TrimPrefix(url, "http")+"/v0/runners/ws?runner_id=leak-runner&consumer_id=r1&capabilities=leak.tool")
	runner.expect(t, "hello")

	id := post(t, hc, url+"/v0/executions", obj{"agent_id": "leak-agent", "input": obj{"task": "t"}}, 201)["id"].(string)
	assigned := agent.expect(t, "execution.assigned")
	lease := assigned["session_id"].(string)
	step := post(t, hc, url+"/v0/agents/intent", obj{"execution_id": id, "session_id": lease,
		"intent": obj{"type": "invoke_tool", "tool_id": "leak.tool", "remote": true}}, 200)["step_id"].(string)
	job := runner.expect(t, "delivery")["data"].(obj)
	if job["step_id"] != step {
		t.Fatalf("job.assigned: %v", job)
	}
	runner.send(t, obj{"type": "command", "id": "c1", "command": "result",
		"body": obj{"job_id": job["id"], "execution_id": id, "step_id": step, "success": true, "data": obj{"ok": true}}})
	if reply := runner.expect(t, "reply"); reply["status"] != 200.0 {
		t.Fatalf("result reply: %v", reply)
	}
	if tr := agent.expect(t, "tool.result"); tr["step_id"] != step {
		t.Fatalf("tool.result: %v", tr)
	}
	tail := openSSE(t, hc, url+"/v0/executions/"+id+"/stream")
	post(t, hc, url+"/v0/agents/intent", obj{"execution_id": id, "session_id": lease,
		"intent": obj{"type": "complete", "output": obj{"done": true}}}, 200)
	tail.expect(t, "execution.completed")
	post(t, hc, url+"/runtime/v1/tools/memory_write", obj{"input": obj{"path": "/leak.md", "content": "x"}, "wait": true}, 200)

	closeNode(t, n)
	// The server ended the streams it held open; the clients' readers
	// return once they see it.
	agent.wait(t)
	tail.wait(t)
	runner.wait(t)
	hc.CloseIdleConnections()
	settle(t, base)
}

// TestFailedOpenReleasesWhatItOpened: an Open that fails at its last
// step (the address is taken) releases everything it opened before, the
// store's folder lock included, and leaves no goroutine behind.
func TestFailedOpenReleasesWhatItOpened(t *testing.T) {
	base := warmUp(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	if _, err := node.Open(t.Context(), node.Options{Addr: taken.Addr().String(), Data: dir}); err == nil {
		t.Fatal("Open on a taken address succeeded")
	}
	settle(t, base)
	closeNode(t, open(t, dir))
}

// sse reads one SSE response on its own goroutine; frames is closed when
// the response ends.
type sse struct {
	frames <-chan ssetest.Frame
	body   io.Closer
}

func openSSE(t *testing.T, hc *http.Client, url string) *sse {
	t.Helper()
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return &sse{frames: ssetest.Stream(resp.Body, 64), body: resp.Body}
}

// expect skips frames up to one of type event and returns its data.
func (s *sse) expect(t *testing.T, event string) obj {
	t.Helper()
	f, ok := skipTo(t, s.frames, func(f ssetest.Frame) bool { return f.Event == event }, event)
	if !ok {
		t.Fatalf("stream ended before %s", event)
	}
	var o obj
	if err := json.Unmarshal([]byte(f.Data), &o); err != nil {
		t.Fatalf("frame %s: %v", f.Event, err)
	}
	return o
}

// wait waits for the server to end the stream, then closes the response.
func (s *sse) wait(t *testing.T) {
	t.Helper()
	skipTo(t, s.frames, nil, "end of the stream after Close")
	s.body.Close()
}

// skipTo reads frames, the SSE events or socket messages a client's reader
// passes on, until match accepts one, which it returns with true; or until
// the reader closes frames, returning false. A nil match accepts none, so
// skipTo drains frames. It fails the test if 10s pass without a frame,
// naming what it waited for.
func skipTo[F any](t *testing.T, frames <-chan F, match func(F) bool, what string) (F, bool) {
	t.Helper()
	for {
		select {
		case f, ok := <-frames:
			if !ok || (match != nil && match(f)) {
				return f, ok
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s within 10s", what)
		}
	}
}

// ws is a runner socket whose frames are read on their own goroutine;
// frames is closed when the socket ends.
type ws struct {
	c      *websocket.Conn
	frames chan obj
	err    error // why the reader returned; read once frames is closed
}

func dialRunner(t *testing.T, url string) *ws {
	t.Helper()
	c, _, err := websocket.Dial(t.Context(), url, &websocket.DialOptions{Subprotocols: []string{"gatehouse.v1.json"}})
	if err != nil {
		t.Fatal(err)
	}
	w := &ws{c: c, frames: make(chan obj, 64)}
	go func() {
		defer close(w.frames)
		for {
			var f obj
			if w.err = wsjson.Read(context.Background(), c, &f); w.err != nil {
				return
			}
			w.frames <- f
		}
	}()
	return w
}

func (w *ws) send(t *testing.T, f obj) {
	t.Helper()
	if err := wsjson.Write(t.Context(), w.c, f); err != nil {
		t.Fatal(err)
	}
}

// expect skips frames up to one of type typ and returns it.
func (w *ws) expect(t *testing.T, typ string) obj {
	t.Helper()
	f, ok := skipTo(t, w.frames, func(f obj) bool { return f["type"] == typ }, typ)
	if !ok {
		t.Fatalf("socket ended before %s: %v", typ, w.err)
	}
	return f
}

// wait waits for the socket's reader to return, and checks the server
// said it was going away.
func (w *ws) wait(t *testing.T) {
	t.Helper()
	skipTo(t, w.frames, nil, "end of the socket after Close")
	_ = w.c.CloseNow()
	if code := websocket.CloseStatus(w.err); code != websocket.StatusGoingAway {
		t.Errorf("socket ended with %v, want going away", w.err)
	}
}

// post sends body as JSON and returns the decoded answer, which must
// have status want.
func post(t *testing.T, hc *http.Client, url string, body any, want int) obj {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if resp.StatusCode != want {
		t.Fatalf("POST %s: %d %s, want %d", url, resp.StatusCode, raw, want)
	}
	var o obj
	if err := json.Unmarshal(raw, &o); err != nil {
		t.Fatalf("POST %s: %v: %s", url, err, raw)
	}
	return o
}

// TestNoCredentialsServeOnlyLoopback: a node with no credential refuses,
// before it opens anything, a listen address that other hosts can reach,
// unless InsecureNoAuth says that is meant; with a token, or on a loopback
// address or name, it serves. Each node that opens answers on a real
// listener: the open ones with the admin's rights to a request whose Host
// it cannot trust, the one with a token with 401 to a request without it.
func TestNoCredentialsServeOnlyLoopback(t *testing.T) {
	for _, tc := range []struct {
		name     string
		addr     string
		token    string
		insecure bool
		refused  bool
		list     int // status of GET /v0/executions without credentials
	}{
		{name: "every IPv4 interface", addr: "0.0.0.0:0", refused: true},
		{name: "every interface", addr: ":0", refused: true},
		{name: "every IPv6 interface", addr: "[::]:0", refused: true},
		{name: "loopback address", addr: "127.0.0.1:0", list: http.StatusOK},
		{name: "loopback name", addr: "localhost:0", list: http.StatusOK},
		{name: "network with a token", addr: "0.0.0.0:0", token: "s3cret", list: http.StatusUnauthorized},
		{name: "network, insecure on purpose", addr: "0.0.0.0:0", insecure: true, list: http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			n, err := node.Open(t.Context(), node.Options{Addr: tc.addr, Data: dir,
				Auth: auth.Options{StaticToken: tc.token}, InsecureNoAuth: tc.insecure})
			if tc.refused {
				if !errors.Is(err, node.ErrNoAuthOnNetwork) || !strings.Contains(err.Error(), tc.addr) {
					t.Fatalf("Open = %v, want ErrNoAuthOnNetwork naming %s", err, tc.addr)
				}
				if _, serr := os.Stat(dir); !errors.Is(serr, fs.ErrNotExist) {
					t.Fatalf("a refused Open touched its data folder: %v", serr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer closeNode(t, n)
			_, port, _ := net.SplitHostPort(n.Addr().String())
			req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+port+"/v0/executions", nil)
			req.Host = "127.0.0.1"
			hc := &http.Client{Transport: &http.Transport{}}
			defer hc.CloseIdleConnections()
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.list {
				t.Fatalf("GET /v0/executions: %d, want %d", resp.StatusCode, tc.list)
			}
		})
	}
}
