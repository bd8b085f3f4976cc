package relay_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
	"github.com/gatehouse-dev/gatehouse/relay"
)

const edgeToken = "edge-token-0123456789"

// edgeBox starts a real node as the edge box named name (with a token
// unless open) and serves its hub's side on a fresh loopback listener, as
// a tunnel's listener would be: the returned address is where a hub
// dials it.
func edgeBox(t *testing.T, name string, open bool) (*nodetest.Server, string) {
	t.Helper()
	o := node.Options{InMemory: true, Server: gateway.Options{Heartbeat: 200 * time.Millisecond, EdgeName: name}}
	if !open {
		o.Auth = auth.Options{StaticToken: edgeToken}
	}
	s := nodetest.Start(t, o)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Node.Server.ServeEdge(ln) }()
	return s, ln.Addr().String()
}

// hubOf starts a real node as a hub whose Edges dial with dial.
func hubOf(t *testing.T, dial func(ctx context.Context, name string) (net.Conn, error)) (*relay.Edges, *nodetest.Server) {
	t.Helper()
	return hubWith(t, relay.EdgeOptions{Dial: dial, WriteTimeout: 2 * time.Second})
}

// hubWith starts a real node as a hub with Edges built from o.
func hubWith(t *testing.T, o relay.EdgeOptions) (*relay.Edges, *nodetest.Server) {
	t.Helper()
	e := relay.NewEdges(o)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := e.Shutdown(ctx); err != nil {
			t.Errorf("edges shutdown: %v", err)
		}
	})
	return e, nodetest.Start(t, node.Options{InMemory: true, Server: gateway.Options{Edges: e}})
}

// dialTo dials addr for the edge box named want, and says an edge of any
// other name is not linked.
func dialTo(want, addr string) func(ctx context.Context, name string) (net.Conn, error) {
	return func(ctx context.Context, name string) (net.Conn, error) {
		if name != want {
			return nil, fmt.Errorf("%w: %s", relay.ErrEdgeNotLinked, name)
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
}

func authed(req string) string {
	return strings.Replace(req, "\r\n\r\n", "\r\nAuthorization: Bearer "+edgeToken+"\r\n\r\n", 1)
}

// TestEdgesPassAConnectionToTheEdgeBoxItNames sends requests for an edge
// box to a hub on one connection: the first is passed on with its
// connection, the next on that connection reach the edge box too and are
// served as its own paths, with its token; an execution created there is
// the edge box's, not the hub's; an SSE stream of it opened through the
// hub gets an event published after it opened. A request on that
// connection for the hub's own paths is refused by the edge box (421),
// which closes the connection.
func TestEdgesPassAConnectionToTheEdgeBoxItNames(t *testing.T) {
	edge, addr := edgeBox(t, "e1", false)
	edges, hub := hubOf(t, dialTo("e1", addr))
	host := hostOf(hub.URL)

	rc := dialRaw(t, hub.URL)
	rc.write(authed(post("/edge/e1/v0/executions", host, `{"agent_id":"a"}`)))
	resp, body := rc.read()
	if resp.StatusCode != http.StatusCreated || !strings.Contains(body, `"id"`) {
		t.Fatalf("create through the hub: %d %s", resp.StatusCode, body)
	}
	id := strings.Split(strings.Split(body, `"id":"`)[1], `"`)[0]
	rc.write(authed(get("/edge/e1/v0/executions/"+id, host)))
	if resp, body := rc.read(); resp.StatusCode != http.StatusOK || !strings.Contains(body, id) {
		t.Fatalf("get on the passed connection: %d %s", resp.StatusCode, body)
	}
	st, _, _ := nodetest.Do(t, nil, "GET", edge.URL+"/v0/executions/"+id, nil, "Authorization", "Bearer "+edgeToken)
	if st != http.StatusOK {
		t.Fatalf("the execution on the edge box itself: %d", st)
	}
	if st, _, _ := nodetest.Do(t, nil, "GET", hub.URL+"/v0/executions/"+id, nil); st != http.StatusNotFound {
		t.Fatalf("the execution on the hub: %d, want 404 (it is the edge box's)", st)
	}
	rc.write(authed(get("/v0/executions/"+id, host)))
	resp, body = rc.read()
	if resp.StatusCode != http.StatusMisdirectedRequest || !strings.Contains(body, gateway.CodeEdgeMisdirected) || !resp.Close {
		t.Fatalf("a hub path on a connection passed on: %d %s close=%v", resp.StatusCode, body, resp.Close)
	}

	sse := dialRaw(t, hub.URL)
	sse.write(authed(get("/edge/e1/v0/executions/"+id+"/stream", host)))
	sresp, err := http.ReadResponse(sse.br, nil)
	if err != nil || sresp.StatusCode != http.StatusOK {
		t.Fatalf("stream through the hub: %v %v", sresp, err)
	}
	st, _, _ = nodetest.Do(t, nil, "POST", edge.URL+"/v0/executions/"+id+"/signal", map[string]any{"signal_type": "ping"}, "Authorization", "Bearer "+edgeToken)
	if st != http.StatusOK && st != http.StatusAccepted {
		t.Fatalf("signal on the edge box: %d", st)
	}
	br := bufio.NewReader(sresp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream through the hub ended before the signal: %v", err)
		}
		if strings.Contains(line, "signal.received") || strings.Contains(line, `"ping"`) {
			break
		}
	}
	if s := edges.Stats(); s.Passed != 2 || s.Open < 1 || s.ToEdge == 0 || s.ToClient == 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestEdgesRefuseWhatCannotReachAnEdgeBox: a name with no edge box linked
// is 503 EDGE_NOT_LINKED, a dial that fails otherwise 502
// EDGE_UNREACHABLE, both with Retry-After and the connection closed; a
// name that cannot name an edge box is 400 before any dial.
func TestEdgesRefuseWhatCannotReachAnEdgeBox(t *testing.T) {
	var dials atomic.Int32
	_, hub := hubOf(t, func(ctx context.Context, name string) (net.Conn, error) {
		dials.Add(1)
		if name == "gone" {
			return nil, relay.ErrEdgeNotLinked
		}
		return nil, errors.New("refused")
	})
	for _, tc := range []struct {
		path   string
		status int
		code   string
		dial   bool
	}{
		{"/edge/gone/v0/executions", http.StatusServiceUnavailable, relay.CodeEdgeNotLinked, true},
		{"/edge/busy/v0/executions", http.StatusBadGateway, relay.CodeEdgeUnreachable, true},
		{"/edge/a.b/v0/executions", http.StatusBadRequest, gateway.CodeValidation, false},
		{"/edge/a%20b/v0/executions", http.StatusBadRequest, gateway.CodeValidation, false},
		{"/edge/" + strings.Repeat("n", 65) + "/v0/executions", http.StatusBadRequest, gateway.CodeValidation, false},
	} {
		t.Run(tc.path, func(t *testing.T) {
			before := dials.Load()
			rc := dialRaw(t, hub.URL)
			rc.write(get(tc.path, hostOf(hub.URL)))
			resp, body := rc.read()
			if resp.StatusCode != tc.status || !strings.Contains(body, `"code":"`+tc.code+`"`) {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			if tc.status != http.StatusBadRequest && (resp.Header.Get("Retry-After") != "1" || !resp.Close) {
				t.Fatalf("headers %v close=%v", resp.Header, resp.Close)
			}
			if dialed := dials.Load() != before; dialed != tc.dial {
				t.Fatalf("dialed %v, want %v", dialed, tc.dial)
			}
		})
	}
}

// TestEdgeBoxServesItsHubOnlyUnderItsNameAndWithAToken: on the edge box's
// side, a connection from its hub is served only for paths under
// /edge/<its name>/ (the prefix ends at a path segment), and not at all
// by an edge box with no token, which trusts whoever reaches it.
func TestEdgeBoxServesItsHubOnlyUnderItsNameAndWithAToken(t *testing.T) {
	_, addr := edgeBox(t, "e1", false)
	_, openAddr := edgeBox(t, "e1", true)
	for _, tc := range []struct {
		name, addr, path string
		status           int
		code             string
	}{
		{"its name", addr, "/edge/e1/v0/executions", http.StatusOK, ""},
		{"its ui", addr, "/edge/e1/ui/", http.StatusOK, ""},
		{"its name alone", addr, "/edge/e1", http.StatusNotFound, ""},
		{"another box", addr, "/edge/e2/v0/executions", http.StatusMisdirectedRequest, gateway.CodeEdgeMisdirected},
		{"a longer name", addr, "/edge/e1x/v0/executions", http.StatusMisdirectedRequest, gateway.CodeEdgeMisdirected},
		{"no prefix", addr, "/v0/executions", http.StatusMisdirectedRequest, gateway.CodeEdgeMisdirected},
		{"a way out of the prefix", addr, "/edge/e1/../../v0/executions", http.StatusMisdirectedRequest, gateway.CodeEdgeMisdirected},
		{"no token", openAddr, "/edge/e1/v0/executions", http.StatusForbidden, gateway.CodeEdgeTokenRequired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := dialRaw(t, "http://"+tc.addr)
			rc.write(authed(get(tc.path, "127.0.0.1")))
			resp, body := rc.read()
			if resp.StatusCode != tc.status || (tc.code != "" && !strings.Contains(body, `"code":"`+tc.code+`"`)) {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
		})
	}
}

// TestEdgesShutdownClosesWhatWasPassedOn: the hub's Shutdown ends the
// connections it passed on, so their clients reconnect.
func TestEdgesShutdownClosesWhatWasPassedOn(t *testing.T) {
	_, addr := edgeBox(t, "e1", false)
	edges, hub := hubOf(t, dialTo("e1", addr))
	rc := dialRaw(t, hub.URL)
	rc.write(authed(get("/edge/e1/v0/executions", hostOf(hub.URL))))
	if resp, body := rc.read(); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := edges.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "the passed connection closed", func() bool {
		_ = rc.c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, err := rc.br.ReadByte()
		var ne net.Error
		return err != nil && !(errors.As(err, &ne) && ne.Timeout())
	})
	if s := edges.Stats(); s.Open != 0 {
		t.Fatalf("open after shutdown: %+v", s)
	}
}

// TestEdgesRefuseAConnectionPastMaxConns: a hub passes on at most
// MaxConns connections at once; the next request for an edge box is
// refused with 503 until one ends.
func TestEdgesRefuseAConnectionPastMaxConns(t *testing.T) {
	_, addr := edgeBox(t, "e1", false)
	edges, hub := hubWith(t, relay.EdgeOptions{Dial: dialTo("e1", addr), MaxConns: 1})
	host := hostOf(hub.URL)
	first := dialRaw(t, hub.URL)
	first.write(authed(get("/edge/e1/v0/executions", host)))
	if resp, body := first.read(); resp.StatusCode != http.StatusOK {
		t.Fatalf("first: %d %s", resp.StatusCode, body)
	}
	second := dialRaw(t, hub.URL)
	second.write(authed(get("/edge/e1/v0/executions", host)))
	if resp, body := second.read(); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, gateway.CodeUnavailable) {
		t.Fatalf("past MaxConns: %d %s", resp.StatusCode, body)
	}
	_ = first.c.Close()
	eventually.True(t, "the first connection's splice ended", func() bool { return edges.Stats().Open == 0 })
	third := dialRaw(t, hub.URL)
	third.write(authed(get("/edge/e1/v0/executions", host)))
	if resp, body := third.read(); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the first ended: %d %s", resp.StatusCode, body)
	}
	if s := edges.Stats(); s.Full != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// TestEdgesReadTheBodyUnderTheHubsBounds: the hub reads a request's body
// itself, under its own limit, before it dials the edge box: a body over
// it is refused there (413) and nothing is dialed.
func TestEdgesReadTheBodyUnderTheHubsBounds(t *testing.T) {
	var dials atomic.Int32
	_, hub := hubOf(t, func(ctx context.Context, name string) (net.Conn, error) {
		dials.Add(1)
		return nil, relay.ErrEdgeNotLinked
	})
	rc := dialRaw(t, hub.URL)
	rc.write(post("/edge/e1/v0/executions", hostOf(hub.URL), `{"input":"`+strings.Repeat("x", 1<<20)+`"}`))
	resp, body := rc.read()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(body, gateway.CodeTooLarge) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if n := dials.Load(); n != 0 {
		t.Fatalf("%d dials for a body over the hub's limit", n)
	}
}

// scriptedEdge listens on loopback as an edge box that plays play on each
// connection a hub dials to it, and returns the hub's Dial for the edge
// box named e1.
func scriptedEdge(t *testing.T, play func(c *net.TCPConn, br *bufio.Reader)) func(ctx context.Context, name string) (net.Conn, error) {
	t.Helper()
	return dialTo("e1", scriptedServer(t, play))
}

// scriptedServer listens on loopback, plays play on each connection it
// accepts, and returns its address.
func scriptedServer(t *testing.T, play func(c *net.TCPConn, br *bufio.Reader)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				play(c.(*net.TCPConn), bufio.NewReader(c))
			}()
		}
	}()
	return ln.Addr().String()
}

// answerThenDrop is a far side's script: it answers answered requests
// with 200 and drops its connection with drop on the next.
func answerThenDrop(answered int, drop func(*net.TCPConn)) func(c *net.TCPConn, br *bufio.Reader) {
	return func(c *net.TCPConn, br *bufio.Reader) {
		for range answered {
			if !readRequest(br) {
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
		if readRequest(br) {
			drop(c)
		}
	}
}

// closeConn and resetConn drop a connection, with a FIN and a reset.
func closeConn(c *net.TCPConn) { _ = c.Close() }
func resetConn(c *net.TCPConn) { _ = c.SetLinger(0); _ = c.Close() }

// expectDropped writes path's request on rc after answered requests
// answered 200, and reads the answer a dropped request gets: 502 with
// code, Retry-After: 1 and Connection: close.
func expectDropped(t *testing.T, rc *rawConn, host, path string, answered int, code string) {
	t.Helper()
	for range answered {
		rc.write(post(path, host, `{}`))
		if resp, body := rc.read(); resp.StatusCode != http.StatusOK || body != "ok" {
			t.Fatalf("an answered request: %d %s", resp.StatusCode, body)
		}
	}
	rc.write(post(path, host, `{}`))
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		t.Fatalf("the dropped request got no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), `"code":"`+code+`"`) {
		t.Fatalf("the dropped request: %d %s", resp.StatusCode, body)
	}
	if resp.Header.Get("Retry-After") != "1" || !resp.Close {
		t.Fatalf("headers %v close=%v", resp.Header, resp.Close)
	}
}

// readRequest reads one request, body included, as an edge box would.
func readRequest(br *bufio.Reader) bool {
	req, err := http.ReadRequest(br)
	if err != nil {
		return false
	}
	_, err = io.Copy(io.Discard, req.Body)
	return err == nil
}

// TestEdgesAnswerARequestTheEdgeBoxDroppedBeforeAnsweringIt: when the
// connection to the edge box ends (closed or reset) while a request of the
// client's has had no byte of its answer, on the first request of a
// connection or a later one on the connection passed on, the hub answers
// it with 502 EDGE_UNREACHABLE, Retry-After and Connection: close, rather
// than closing the client's connection with no answer. An answer already
// begun, or a connection switched to another protocol, is only closed: the
// hub adds nothing to the edge box's bytes.
func TestEdgesAnswerARequestTheEdgeBoxDroppedBeforeAnsweringIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		// answered is how many requests the edge box answers before it
		// drops the connection on the next.
		answered int
		drop     func(*net.TCPConn)
	}{
		{"the first request, closed", 0, closeConn},
		{"the first request, reset", 0, resetConn},
		{"a later request on the passed connection, closed", 1, closeConn},
		{"a later request on the passed connection, reset", 2, resetConn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			edges, hub := hubOf(t, scriptedEdge(t, answerThenDrop(tc.answered, tc.drop)))
			rc := dialRaw(t, hub.URL)
			expectDropped(t, rc, hostOf(hub.URL), "/edge/e1/v0/actions/a1/respond", tc.answered, relay.CodeEdgeUnreachable)
			if rest, err := io.ReadAll(rc.br); err != nil || len(rest) != 0 {
				t.Fatalf("after the answer: %q %v, want the connection closed", rest, err)
			}
			// Told to close, the client does; the splice would otherwise
			// end after its linger.
			_ = rc.c.Close()
			eventually.True(t, "the splice ended", func() bool { return edges.Stats().Open == 0 })
			if s := edges.Stats(); s.Unreachable != 1 {
				t.Fatalf("stats %+v, want the dropped request counted unreachable", s)
			}
		})
	}
	for _, tc := range []struct {
		name     string
		request  string // with %s for the hub's host
		edgeSent string
	}{
		{"an answer begun", get("/edge/e1/v0/executions", "%s"), "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\npart"},
		{"a switched protocol", "GET /edge/e1/v0/ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
			"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, hub := hubOf(t, scriptedEdge(t, func(c *net.TCPConn, br *bufio.Reader) {
				if !readRequest(br) {
					return
				}
				_, _ = io.WriteString(c, tc.edgeSent)
				// The client's next bytes reach the edge box, which drops
				// the connection without a word.
				if _, err := br.ReadByte(); err == nil {
					_ = c.Close()
				}
			}))
			rc := dialRaw(t, hub.URL)
			rc.write(fmt.Sprintf(tc.request, hostOf(hub.URL)))
			got := make([]byte, len(tc.edgeSent))
			if _, err := io.ReadFull(rc.br, got); err != nil || string(got) != tc.edgeSent {
				t.Fatalf("the edge box's bytes: %q %v", got, err)
			}
			rc.write("more bytes of the client's")
			if rest, err := io.ReadAll(rc.br); len(rest) != 0 {
				t.Fatalf("the hub added %q (%v) to what the edge box sent", rest, err)
			}
		})
	}
}

// TestEdgesDialAgainWhenTheEdgeConnectionFailsBeforeTheRequest: a
// connection to the edge box that fails before it takes any byte of the
// request (a tunnel reset as it opened) cannot have passed the request
// on, so the hub dials once more and the request is served.
func TestEdgesDialAgainWhenTheEdgeConnectionFailsBeforeTheRequest(t *testing.T) {
	_, addr := edgeBox(t, "e1", false)
	var dials atomic.Int32
	dial := dialTo("e1", addr)
	_, hub := hubOf(t, func(ctx context.Context, name string) (net.Conn, error) {
		c, err := dial(ctx, name)
		if err == nil && dials.Add(1) == 1 {
			_ = c.Close()
		}
		return c, err
	})
	rc := dialRaw(t, hub.URL)
	rc.write(authed(get("/edge/e1/v0/executions", hostOf(hub.URL))))
	if resp, body := rc.read(); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d dials, want 2", n)
	}
}
