package relay_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/client"
	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
	"github.com/gatehouse-dev/gatehouse/relay"
)

// leaderNode starts a real node, the leader a relay passes connections to.
func leaderNode(t *testing.T) *nodetest.Server {
	t.Helper()
	return nodetest.Start(t, node.Options{InMemory: true, Server: gateway.Options{Heartbeat: 200 * time.Millisecond}})
}

// hostOf is the host:port of a base URL.
func hostOf(url string) string {
	return strings.TrimPrefix(strings.TrimPrefix(url, "http://"), "https://")
}

// fixedLeader is a Leader function that always names addr.
func fixedLeader(addr string) func(context.Context) (string, error) {
	return func(context.Context) (string, error) { return addr, nil }
}

// startRelay serves a relay with o on a fresh 127.0.0.1 port and returns
// it with its base URL; the cleanup shuts it down.
func startRelay(t *testing.T, o relay.Options) (*relay.Relay, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := relay.New(o)
	served := make(chan error, 1)
	go func() { served <- r.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.Shutdown(ctx); err != nil {
			t.Errorf("relay shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("relay serve: %v", err)
		}
	})
	return r, "http://" + ln.Addr().String()
}

// rawConn is a client connection on which a test writes requests by hand
// and reads the answers in order.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, base string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", hostOf(base), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (rc *rawConn) write(s string) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, s); err != nil {
		rc.t.Fatal(err)
	}
}

// read reads one answer and its whole body.
func (rc *rawConn) read() (*http.Response, string) {
	rc.t.Helper()
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		rc.t.Fatalf("read answer: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		rc.t.Fatalf("read body: %v", err)
	}
	return resp, string(b)
}

func get(path, host string) string {
	return "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n"
}

func post(path, host, body string) string {
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, host, len(body), body)
}

// TestRelayPassesRequestsOnOneConnectionToTheLeader writes requests by hand
// on one client connection: one at a time (the second on the kept-alive
// connection, after the relay took it over), and two in one write, where
// the second is already in the relay's read buffer when it hands the
// connection over and must still reach the leader.
func TestRelayPassesRequestsOnOneConnectionToTheLeader(t *testing.T) {
	leader := leaderNode(t)
	r, base := startRelay(t, relay.Options{Leader: fixedLeader(hostOf(leader.URL))})
	host := hostOf(base)
	create := post("/v0/executions", host, `{"agent_id":"a1","input":{"n":1}}`)
	list := get("/v0/executions?agent_id=a1", host)

	for _, tc := range []struct {
		name   string
		writes []string // each written at once, after the answers to the previous one are read
	}{
		{"one at a time", []string{create, list}},
		{"pipelined", []string{create + list}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := dialRaw(t, base)
			var answers []string
			for _, w := range tc.writes {
				rc.write(w)
				for range strings.Count(w, " HTTP/1.1\r\n") {
					resp, body := rc.read()
					answers = append(answers, fmt.Sprintf("%d %s", resp.StatusCode, body))
				}
			}
			if len(answers) != 2 || !strings.HasPrefix(answers[0], "201 ") || !strings.HasPrefix(answers[1], "200 ") {
				t.Fatalf("answers %q, want 201 then 200", answers)
			}
			var ex struct{ ID string }
			if err := json.Unmarshal([]byte(strings.TrimPrefix(answers[0], "201 ")), &ex); err != nil || ex.ID == "" {
				t.Fatalf("create answer %q: %v", answers[0], err)
			}
			if !strings.Contains(answers[1], ex.ID) {
				t.Fatalf("list answer %q does not hold the execution created before it, %s", answers[1], ex.ID)
			}
		})
	}
	if st := r.Stats(); st.Relayed != 2 || st.ToLeader == 0 || st.ToClient == 0 {
		t.Fatalf("stats %+v: want 2 relayed connections and bytes both ways", st)
	}
}

// TestRelayWritesTheRequestAsReadWithTheClientAdded checks what reaches
// the leader, on a plain HTTP server standing in for it: the request line
// as the client wrote it, the body, the client's address appended to
// X-Forwarded-For, the relay's mark, and no Expect (the relay answered it).
func TestRelayWritesTheRequestAsReadWithTheClientAdded(t *testing.T) {
	type seen struct {
		uri, fwd, relayed, expect, body string
	}
	got := make(chan seen, 1)
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		got <- seen{req.RequestURI, strings.Join(req.Header.Values("X-Forwarded-For"), "|"), req.Header.Get(relay.RelayedHeader), req.Header.Get("Expect"), string(b)}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(echo.Close)
	_, base := startRelay(t, relay.Options{Leader: fixedLeader(hostOf(echo.URL))})
	host := hostOf(base)

	for _, tc := range []struct {
		name, extra, wantFwd string
	}{
		{"no forwarded header", "", "127.0.0.1"},
		{"one forwarded header", "X-Forwarded-For: 10.0.0.1\r\n", "10.0.0.1, 127.0.0.1"},
		{"two forwarded headers", "X-Forwarded-For: 10.0.0.1\r\nX-Forwarded-For: 10.0.0.2, 10.0.0.3\r\n", "10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1"},
		{"expect continue", "Expect: 100-continue\r\n", "127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := dialRaw(t, base)
			rc.write("POST /x/a%2Fb/../c?q=%20 HTTP/1.1\r\nHost: " + host + "\r\n" + tc.extra + "Content-Length: 5\r\n\r\nhello")
			resp, _ := rc.read()
			for resp.StatusCode == http.StatusContinue {
				resp, _ = rc.read()
			}
			if resp.StatusCode != http.StatusNoContent {
				t.Fatalf("status %d, want 204", resp.StatusCode)
			}
			s := <-got
			want := seen{"/x/a%2Fb/../c?q=%20", tc.wantFwd, "1", "", "hello"}
			if s != want {
				t.Fatalf("the leader saw %+v, want %+v", s, want)
			}
		})
	}
}

// TestRelayStreamsSSEEventsPublishedAfterItOpened follows an execution with
// the Go client through the relay: the signal sent after the stream opened
// arrives on it, and the cancel's terminal event ends it.
func TestRelayStreamsSSEEventsPublishedAfterItOpened(t *testing.T) {
	leader := leaderNode(t)
	_, base := startRelay(t, relay.Options{Leader: fixedLeader(hostOf(leader.URL))})
	c, err := client.New(client.Options{BaseURL: base, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ex, err := c.CreateExecution(ctx, client.CreateRequest{AgentID: "a1"})
	if err != nil {
		t.Fatal(err)
	}
	opened := make(chan struct{})
	var types []string
	streamed := make(chan error, 1)
	go func() {
		streamed <- c.StreamExecution(ctx, ex.ID, 0, func(e client.Event) error {
			if len(types) == 0 {
				close(opened)
			}
			types = append(types, e.Type)
			return nil
		})
	}()
	<-opened
	if err := c.Signal(ctx, ex.ID, "go", map[string]int{"n": 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CancelExecution(ctx, ex.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-streamed; err != nil {
		t.Fatalf("stream: %v", err)
	}
	got := strings.Join(types, ",")
	if !strings.Contains(got, "signal.received") || !strings.HasSuffix(got, "execution.cancelled") {
		t.Fatalf("events %s: want the signal, then the cancel at the end", got)
	}
}

// TestRelayCarriesAWebSocketSessionBothWays opens an agent socket through
// the relay: the hello comes, a push caused by a request on another
// connection comes, and a command sent on the socket gets its reply.
func TestRelayCarriesAWebSocketSessionBothWays(t *testing.T) {
	leader := leaderNode(t)
	_, base := startRelay(t, relay.Options{Leader: fixedLeader(hostOf(leader.URL))})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/v0/agents/ws?agent_id=a1&consumer_id=a1-c",
		&websocket.DialOptions{Subprotocols: []string{gateway.SubprotocolJSON}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	next := func(want string) map[string]any {
		t.Helper()
		for {
			_, b, err := ws.Read(ctx)
			if err != nil {
				t.Fatalf("waiting for a %s frame: %v", want, err)
			}
			var f map[string]any
			if err := json.Unmarshal(b, &f); err != nil {
				t.Fatalf("frame %s: %v", b, err)
			}
			if f["type"] == want {
				return f
			}
		}
	}
	next("hello")
	status, body, _ := nodetest.Do(t, nil, http.MethodPost, base+"/v0/executions", map[string]string{"agent_id": "a1"}, "Content-Type", "application/json")
	if status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, body)
	}
	d := next("delivery")
	if d["event"] != "execution.assigned" {
		t.Fatalf("delivery %v, want execution.assigned", d)
	}
	ack, _ := json.Marshal(map[string]any{"type": "ack", "seq": d["seq"], "id": "a-1"})
	if err := ws.Write(ctx, websocket.MessageText, ack); err != nil {
		t.Fatal(err)
	}
	if rep := next("reply"); rep["id"] != "a-1" || rep["status"] != float64(200) {
		t.Fatalf("reply %v, want a-1 with status 200", rep)
	}
	if err := ws.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// TestRelayAnswersLocalPathsItself: a path in LocalPaths is answered by
// Local, query or not, and keeps the connection for a next request, which
// is relayed.
func TestRelayAnswersLocalPathsItself(t *testing.T) {
	leader := leaderNode(t)
	_, base := startRelay(t, relay.Options{
		Leader:     fixedLeader(hostOf(leader.URL)),
		Local:      func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("local " + string(ctx.Path())) },
		LocalPaths: []string{"/v0/cluster", "/v0/health"},
	})
	rc := dialRaw(t, base)
	host := hostOf(base)
	for _, tc := range []struct{ path, want string }{
		{"/v0/cluster", "200 local /v0/cluster"},
		{"/v0/health?verbose=1", "200 local /v0/health"},
		{"/v0/cluster/x", "404 "},
	} {
		rc.write(get(tc.path, host))
		resp, body := rc.read()
		if got := fmt.Sprintf("%d %s", resp.StatusCode, body); !strings.HasPrefix(got, tc.want) {
			t.Fatalf("GET %s: %q, want %q", tc.path, got, tc.want)
		}
	}
}

// TestRelayAnswersCarryTheRequestID: what the relay answers itself, a
// local path or a refusal, echoes X-Request-ID as the gateway does (a
// fresh one when the request had none), so that a client sees the same
// convention whichever node it reached.
func TestRelayAnswersCarryTheRequestID(t *testing.T) {
	_, base := startRelay(t, relay.Options{
		Leader:     func(context.Context) (string, error) { return "", errors.New("none") },
		Local:      func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("local") },
		LocalPaths: []string{"/v0/health"},
	})
	for _, tc := range []struct{ path, id string }{
		{"/v0/health", "req-local"},
		{"/v0/health", ""},
		{"/v0/executions", "req-refused"},
	} {
		req, _ := http.NewRequest(http.MethodGet, base+tc.path, nil)
		if tc.id != "" {
			req.Header.Set("X-Request-ID", tc.id)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		got := resp.Header.Get("X-Request-ID")
		if (tc.id != "" && got != tc.id) || got == "" {
			t.Errorf("GET %s with X-Request-ID %q: %d, echoed %q", tc.path, tc.id, resp.StatusCode, got)
		}
	}
}

// TestRelayRefusesWhenTheLeaderCannotBeReached covers the relay's own
// answers: no leader within Wait, a leader that refuses the dial, and a
// request that another relay already passed on.
func TestRelayRefusesWhenTheLeaderCannotBeReached(t *testing.T) {
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := gone.Addr().String()
	gone.Close()
	none := func(ctx context.Context) (string, error) {
		<-ctx.Done()
		return "", fmt.Errorf("no leader elected: %w", ctx.Err())
	}
	const wait = 200 * time.Millisecond
	const plain = "GET /v0/executions HTTP/1.1\r\nHost: x\r\n\r\n"
	for _, tc := range []struct {
		name   string
		leader func(context.Context) (string, error)
		req    string
		status int
		code   string
		retry  string
	}{
		{"no leader within wait", none, plain, http.StatusServiceUnavailable, relay.CodeNoLeader, "1"},
		{"leader refuses the dial", fixedLeader(closedAddr), plain, http.StatusBadGateway, relay.CodeLeaderUnreachable, "1"},
		{"request relayed already", fixedLeader(closedAddr), "GET /v0/executions HTTP/1.1\r\nHost: x\r\n" + relay.RelayedHeader + ": 1\r\n\r\n", http.StatusServiceUnavailable, relay.CodeNoLeader, "1"},
		{"no host", fixedLeader(closedAddr), "GET /v0/executions HTTP/1.0\r\n\r\n", http.StatusBadRequest, gateway.CodeValidation, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, base := startRelay(t, relay.Options{Leader: tc.leader, Wait: wait})
			rc := dialRaw(t, base)
			start := time.Now()
			rc.write(tc.req)
			resp, body := rc.read()
			took := time.Since(start)
			var env struct{ Error, Code string }
			if err := json.Unmarshal([]byte(body), &env); err != nil {
				t.Fatalf("body %q: %v", body, err)
			}
			if resp.StatusCode != tc.status || env.Code != tc.code || env.Error == "" || resp.Header.Get("Retry-After") != tc.retry {
				t.Fatalf("answer %d %q Retry-After %q, want %d %s with Retry-After %q", resp.StatusCode, body, resp.Header.Get("Retry-After"), tc.status, tc.code, tc.retry)
			}
			if !resp.Close {
				t.Fatal("the refusal keeps the connection open; want it closed")
			}
			if took > wait+2*time.Second {
				t.Fatalf("answered after %v; Wait is %v", took, wait)
			}
			st := r.Stats()
			if refused := st.NoLeader + st.Unreachable; st.Relayed != 0 || st.Open != 0 || (refused == 1) != (tc.retry != "") {
				t.Fatalf("stats %+v: want nothing relayed, and a refusal counted for the %s", st, tc.code)
			}
		})
	}
}

// openSSE opens an execution's SSE stream through base, on a connection of
// its own, and returns its reader once the first event's id line has
// arrived.
func openSSE(t *testing.T, base, id string) (*http.Response, *bufio.Reader) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{}}
	resp, err := hc.Get(base + "/v0/executions/" + id + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream: %v before the first event", err)
		}
		if strings.HasPrefix(line, "id:") {
			return resp, br
		}
	}
}

// drained reads the rest of a stream in the background and reports its end.
func drained(br *bufio.Reader) <-chan error {
	end := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, br)
		end <- err
	}()
	return end
}

func createExecution(t *testing.T, base string) string {
	t.Helper()
	status, body, _ := nodetest.Do(t, nil, http.MethodPost, base+"/v0/executions", map[string]string{"agent_id": "a1"}, "Content-Type", "application/json")
	ex := nodetest.Object(t, http.MethodPost, base+"/v0/executions", status, body, http.StatusCreated)
	return ex["id"].(string)
}

// TestRelayEndsTheClientStreamWhenTheLeaderGoes stops the leader under an
// open SSE stream: the client's stream ends, it does not hang, and the
// relay holds no splice after.
func TestRelayEndsTheClientStreamWhenTheLeaderGoes(t *testing.T) {
	leader := leaderNode(t)
	r, base := startRelay(t, relay.Options{Leader: fixedLeader(hostOf(leader.URL))})
	_, br := openSSE(t, base, createExecution(t, base))
	end := drained(br)
	leader.Stop()
	select {
	case <-end:
	case <-time.After(10 * time.Second):
		t.Fatal("the client's stream still open 10s after the leader stopped")
	}
	eventually.True(t, "no splice left open", func() bool { return r.Stats().Open == 0 })
}

// TestRelayAnswersARequestTheLeaderDroppedBeforeAnsweringIt: when the
// connection to the leader ends (a leader killed or stepping down, closed
// or reset) while a request of the client's has had no byte of its answer,
// on the first request or a later one on the relayed connection, the
// follower answers 502 CLUSTER_LEADER_UNREACHABLE and closes, where it
// used to close the client's connection without a word.
func TestRelayAnswersARequestTheLeaderDroppedBeforeAnsweringIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		answered int // requests the leader answers before it drops the next
		drop     func(*net.TCPConn)
	}{
		{"the first request, closed", 0, closeConn},
		{"the first request, reset", 0, resetConn},
		{"a later request, closed", 1, closeConn},
		{"a later request, reset", 2, resetConn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			leader := scriptedServer(t, answerThenDrop(tc.answered, tc.drop))
			r, base := startRelay(t, relay.Options{Leader: fixedLeader(leader)})
			rc := dialRaw(t, base)
			expectDropped(t, rc, hostOf(base), "/v0/executions", tc.answered, relay.CodeLeaderUnreachable)
			_ = rc.c.Close()
			eventually.True(t, "the splice ended", func() bool { return r.Stats().Open == 0 })
			if s := r.Stats(); s.Unreachable != 1 {
				t.Fatalf("stats %+v, want the dropped request counted unreachable", s)
			}
		})
	}
}

// relayGoroutines counts the goroutines running the relay's code.
func relayGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "gatehouse/relay.") {
			count++
		}
	}
	return count
}

// TestRelayShutdownClosesOpenSplices shuts a relay down under an open SSE
// stream, an open WebSocket, a connection that sent nothing yet and a
// request waiting for a leader: Shutdown returns, every client sees its
// connection end, and no goroutine of the relay is left.
func TestRelayShutdownClosesOpenSplices(t *testing.T) {
	leader := leaderNode(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	// Once lost is set, no leader is known: a request waits for one, here
	// for a minute, unless shutdown ends the wait.
	var lost atomic.Bool
	waits := make(chan struct{}, 1)
	r := relay.New(relay.Options{Wait: time.Minute, Leader: func(ctx context.Context) (string, error) {
		if lost.Load() {
			waits <- struct{}{}
			<-ctx.Done()
			return "", ctx.Err()
		}
		return hostOf(leader.URL), nil
	}})
	served := make(chan error, 1)
	go func() { served <- r.Serve(ln) }()

	_, sse := openSSE(t, base, createExecution(t, base))
	sseEnd := drained(sse)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/v0/agents/ws?agent_id=a1&consumer_id=a1-c", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	wsEnd := make(chan error, 1)
	go func() {
		for {
			if _, _, err := ws.Read(ctx); err != nil {
				wsEnd <- err
				return
			}
		}
	}()
	fresh := dialRaw(t, base)
	// The create's connection stays open too, idle in the default client.
	eventually.True(t, "three splices open", func() bool { return r.Stats().Open == 3 })
	lost.Store(true)
	waiting := dialRaw(t, base)
	waiting.write(get("/v0/executions", hostOf(base)))
	<-waits

	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if err := r.Shutdown(sctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	for name, end := range map[string]<-chan error{"SSE stream": sseEnd, "WebSocket": wsEnd} {
		select {
		case <-end:
		case <-time.After(5 * time.Second):
			t.Fatalf("the %s is still open after Shutdown returned", name)
		}
	}
	if _, err := fresh.br.ReadByte(); err == nil {
		t.Fatal("the fresh connection is still open after Shutdown returned")
	}
	if resp, body := waiting.read(); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, relay.CodeNoLeader) {
		t.Fatalf("the request waiting for a leader got %d %s, want 503 %s", resp.StatusCode, body, relay.CodeNoLeader)
	}
	if st := r.Stats(); st.Open != 0 || st.Relayed != 3 {
		t.Fatalf("stats %+v: want 3 relayed (create, SSE, WebSocket), none open", st)
	}
	eventually.True(t, "no goroutine of the relay left", func() bool { return relayGoroutines() == 0 })
}

// TestRelayRefusesAConnectionPastMaxConns: while MaxConns connections are
// relayed, a new one's request is answered 503 by the relay itself.
func TestRelayRefusesAConnectionPastMaxConns(t *testing.T) {
	leader := leaderNode(t)
	r, base := startRelay(t, relay.Options{Leader: fixedLeader(hostOf(leader.URL)), MaxConns: 1})
	host := hostOf(base)
	first := dialRaw(t, base)
	first.write(get("/v0/executions", host))
	if resp, body := first.read(); resp.StatusCode != http.StatusOK {
		t.Fatalf("first connection: %d %s", resp.StatusCode, body)
	}
	second := dialRaw(t, base)
	second.write(get("/v0/executions", host))
	resp, body := second.read()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"code":"SERVICE_UNAVAILABLE"`) || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("second connection: %d %s, want 503 SERVICE_UNAVAILABLE with Retry-After 1", resp.StatusCode, body)
	}
	if st := r.Stats(); st.Full != 1 || st.Open != 1 {
		t.Fatalf("stats %+v: want one refused as full, one open", st)
	}
}

// TestRelayRefusesABodyOverTheLimitWithItsAnswerNotAReset sends a body
// just over the relay's limit (as the conformance suite's api/body-limit
// does) without waiting: the relay refuses it with 413 before reading it,
// and the client, still writing, reads that answer instead of a connection
// reset (which closing a socket with unread bytes would send), as it does
// from the leader's gateway, which every other round goes to.
func TestRelayRefusesABodyOverTheLimitWithItsAnswerNotAReset(t *testing.T) {
	leader := leaderNode(t)
	_, base := startRelay(t, relay.Options{Leader: fixedLeader(hostOf(leader.URL)), MaxBodyBytes: 1 << 20})
	for i := range 10 {
		target := base
		if i%2 == 1 {
			target = leader.URL
		}
		resp, err := http.Post(target+"/v0/executions", "application/json", strings.NewReader(`{"input":"`+strings.Repeat("x", 1<<20+16<<10)+`"}`))
		if err != nil {
			t.Errorf("round %d (%s): %v", i, target, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(body), gateway.CodeTooLarge) {
			t.Fatalf("round %d: %d %s", i, resp.StatusCode, body)
		}
	}
}

// TestStatsAddSumsEveryCounter sets every field of two Stats to distinct
// values and checks each field of the sum, so that a counter added to
// Stats and not to Add is caught.
func TestStatsAddSumsEveryCounter(t *testing.T) {
	var a, b relay.Stats
	va, vb := reflect.ValueOf(&a).Elem(), reflect.ValueOf(&b).Elem()
	for i := range va.NumField() {
		switch va.Field(i).Kind() {
		case reflect.Int64:
			va.Field(i).SetInt(int64(i + 1))
			vb.Field(i).SetInt(int64(100 * (i + 1)))
		default:
			va.Field(i).SetUint(uint64(i + 1))
			vb.Field(i).SetUint(uint64(100 * (i + 1)))
		}
	}
	sum := reflect.ValueOf(a.Add(b))
	for i := range sum.NumField() {
		got := sum.Field(i)
		want := uint64(101 * (i + 1))
		if got.Kind() == reflect.Int64 && got.Int() != int64(want) || got.Kind() != reflect.Int64 && got.Uint() != want {
			t.Errorf("%s: %v, want %d", sum.Type().Field(i).Name, got, want)
		}
	}
}
