package gateway_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/node"
)

// rawConn is a TCP connection to the server that writes requests byte by
// byte as a test says, the way slow and hostile clients do.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, base string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (r *rawConn) write(s string) {
	r.t.Helper()
	if _, err := io.WriteString(r.c, s); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

// response reads one response, waiting at most 10s.
func (r *rawConn) response() (*http.Response, string) {
	r.t.Helper()
	_ = r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(r.br, nil)
	if err != nil {
		r.t.Fatalf("no answer: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// closed waits, at most 10s, for the server to close the connection,
// reading and returning whatever it sent first.
func (r *rawConn) closed() string {
	r.t.Helper()
	_ = r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(r.br)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		r.t.Fatalf("connection still open after 10s (read %q)", got)
	}
	return string(got)
}

// TestBodiesAreJudgedBeforeTheyAreRead: a request that announces a body is
// answered from its headers and its first byte when it lacks a credential
// or announces more than the limit; the client never has to send the rest.
func TestBodiesAreJudgedBeforeTheyAreRead(t *testing.T) {
	s := start(t, node.Options{Auth: auth.Options{StaticToken: "s3cret"}})
	for _, tc := range []struct {
		name, auth string
		length     int
		status     int
		code       string
	}{
		{"anonymous", "", 1_100_000, 401, "UNAUTHORIZED"},
		{"bad token", "Bearer nope", 1_100_000, 401, "UNAUTHORIZED"},
		{"over the limit", "Bearer s3cret", 1_100_000, 413, "PAYLOAD_TOO_LARGE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, s.URL)
			hdr := ""
			if tc.auth != "" {
				hdr = "Authorization: " + tc.auth + "\r\n"
			}
			// One byte of the body, and no more, is sent.
			c.write(fmt.Sprintf("POST /v0/executions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n{", hdr, tc.length))
			resp, body := c.response()
			if resp.StatusCode != tc.status || !strings.Contains(body, `"code":"`+tc.code+`"`) {
				t.Fatalf("%d %s, want %d %s", resp.StatusCode, body, tc.status, tc.code)
			}
			if !resp.Close {
				t.Fatal("the connection must close: the announced body was never read")
			}
		})
	}
	// A chunked body is cut at the limit as it arrives.
	c := dialRaw(t, s.URL)
	c.write("POST /v0/executions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer s3cret\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
	chunk := strings.Repeat("x", 64<<10)
	go func() {
		for range 20 {
			if _, err := fmt.Fprintf(c.c, "%x\r\n%s\r\n", len(chunk), chunk); err != nil {
				return
			}
		}
	}()
	if resp, body := c.response(); resp.StatusCode != 413 || !strings.Contains(body, "PAYLOAD_TOO_LARGE") {
		t.Fatalf("chunked over the limit: %d %s", resp.StatusCode, body)
	}
}

// TestSlowClientsAreCut: headers and bodies that trickle in are cut at
// their deadlines.
func TestSlowClientsAreCut(t *testing.T) {
	s := start(t, node.Options{Server: gateway.Options{HeaderTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond}})
	headers := dialRaw(t, s.URL)
	headers.write("POST /v0/executions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
	headers.closed()

	body := dialRaw(t, s.URL)
	body.write("POST /v0/executions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"agent_id\":")
	if resp, got := body.response(); resp.StatusCode != 408 || !strings.Contains(got, "REQUEST_TIMEOUT") {
		t.Fatalf("slow body: %d %s", resp.StatusCode, got)
	}
}

// TestConnectionsPerAddress: one address holds at most MaxConnsPerIP
// connections; the next is answered 429 and closed, and a slot comes back
// when a connection closes.
func TestConnectionsPerAddress(t *testing.T) {
	s := start(t, node.Options{Server: gateway.Options{MaxConnsPerIP: 3}})
	held := make([]*rawConn, 3)
	for i := range held {
		held[i] = dialRaw(t, s.URL)
		held[i].write("GET /v0/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
		if resp, _ := held[i].response(); resp.StatusCode != 200 {
			t.Fatalf("connection %d: %d", i, resp.StatusCode)
		}
	}
	if got := dialRaw(t, s.URL).closed(); !strings.HasPrefix(got, "HTTP/1.1 429") || !strings.Contains(got, "RATE_LIMITED") {
		t.Fatalf("fourth connection: %q", got)
	}
	held[0].c.Close()
	// The server frees a closed connection's slot when it notices the
	// close, and answers a refused connection's 429 as soon as it accepts
	// it, before any request: a plain HTTP client would read that as an
	// unsolicited answer and fail, so these requests go over raw
	// connections that read whatever comes first.
	get := func(path string) (int, []byte) {
		c, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, nil
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, body
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if status, _ := get("/v0/health"); status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no slot came back after a connection closed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	held[1].c.Close()
	held[2].c.Close()
	for {
		status, body := get("/metrics")
		if status == 200 {
			if !regexp.MustCompile(`(?m)^gatehouse_connections_refused_total\{reason="per_ip"\} [1-9]`).Match(body) {
				t.Fatalf("refusals not counted:\n%s", grepLines(body, "gatehouse_connections_refused_total"))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /metrics: %d", status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAClusterPeersConnectionsPassThePerAddressBound: the connections from
// an address Options.PeerAddr names (a follower relaying its clients) are
// not counted against MaxConnsPerIP; another address is still bounded,
// even when its requests carry the relay's mark and a forwarded address,
// since only the connection's own address decides.
func TestAClusterPeersConnectionsPassThePerAddressBound(t *testing.T) {
	peer := netip.MustParseAddr("127.0.0.2")
	s := start(t, node.Options{Server: gateway.Options{MaxConnsPerIP: 2, PeerAddr: func(a netip.Addr) bool { return a == peer }}})
	health := func(from string, hdr string) string {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		r := &rawConn{t: t, c: c, br: bufio.NewReader(c)}
		r.write("GET /v0/health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + hdr + "\r\n")
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, _ := r.br.ReadString('\n')
		return line
	}
	for i := range 5 {
		if got := health("127.0.0.2", "Gatehouse-Relayed: 1\r\n"); !strings.HasPrefix(got, "HTTP/1.1 200") {
			t.Fatalf("the peer's connection %d: %q", i+1, got)
		}
	}
	for i := range 2 {
		if got := health("127.0.0.1", ""); !strings.HasPrefix(got, "HTTP/1.1 200") {
			t.Fatalf("another address's connection %d: %q", i+1, got)
		}
	}
	if got := health("127.0.0.1", "Gatehouse-Relayed: 1\r\nX-Forwarded-For: 127.0.0.2\r\n"); !strings.HasPrefix(got, "HTTP/1.1 429") {
		t.Fatalf("another address's third connection, marked as relayed: %q", got)
	}
}

// TestBrowsersOfOtherOriginsAreRefused: what a page of another origin can
// make a browser send is refused, by Origin, Sec-Fetch-Site or media type.
func TestBrowsersOfOtherOriginsAreRefused(t *testing.T) {
	s := start(t, node.Options{Server: gateway.Options{CORSOrigins: []string{"https://console.example"}}})
	a := newAPI(t, s)
	host := strings.TrimPrefix(s.URL, "http://")
	body := obj{"agent_id": "victim"}
	for _, tc := range []struct {
		name         string
		method, path string
		hdr          []string
		status       int
		code         string
	}{
		{"foreign origin", "POST", "/v0/executions", []string{"Origin", "http://evil.example"}, 403, "FORBIDDEN_ORIGIN"},
		{"null origin", "POST", "/v0/executions", []string{"Origin", "null"}, 403, "FORBIDDEN_ORIGIN"},
		{"cross-site fetch", "GET", "/v0/executions", []string{"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "cors"}, 403, "FORBIDDEN_ORIGIN"},
		{"cross-site image", "GET", "/v0/agents/stream?agent_id=victim", []string{"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "no-cors"}, 403, "FORBIDDEN_ORIGIN"},
		{"same-site sibling", "POST", "/v0/executions", []string{"Sec-Fetch-Site", "same-site", "Origin", "http://localhost:1"}, 403, "FORBIDDEN_ORIGIN"},
		{"text/plain", "POST", "/v0/executions", []string{"Content-Type", "text/plain"}, 415, "UNSUPPORTED_MEDIA_TYPE"},
		{"form", "POST", "/v0/executions", []string{"Content-Type", "application/x-www-form-urlencoded"}, 415, "UNSUPPORTED_MEDIA_TYPE"},
		{"multipart", "POST", "/v0/executions", []string{"Content-Type", "multipart/form-data; boundary=x"}, 415, "UNSUPPORTED_MEDIA_TYPE"},
		{"same origin", "POST", "/v0/executions", []string{"Origin", "http://" + host, "Content-Type", "application/json"}, 201, ""},
		{"same origin by fetch metadata", "POST", "/v0/executions", []string{"Sec-Fetch-Site", "same-origin", "Origin", "http://" + host}, 201, ""},
		{"listed origin", "POST", "/v0/executions", []string{"Origin", "https://console.example", "Sec-Fetch-Site", "cross-site"}, 201, ""},
		{"not a browser", "POST", "/v0/executions", nil, 201, ""},
		{"a link followed to the page", "GET", "/ui/", []string{"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate"}, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b any
			if tc.method == "POST" {
				b = body
			}
			status, got, _ := a.do(tc.method, tc.path, b, tc.hdr...)
			if status != tc.status || (tc.code != "" && !strings.Contains(string(got), `"code":"`+tc.code+`"`)) {
				t.Fatalf("%d %s, want %d %s", status, got, tc.status, tc.code)
			}
		})
	}
}

// TestHostIsCheckedWithoutAToken: a gateway with no token answers only to
// loopback names and listed hosts, which is what defeats DNS rebinding; a
// gateway with a token answers to any Host.
func TestHostIsCheckedWithoutAToken(t *testing.T) {
	open := start(t, node.Options{Server: gateway.Options{AllowedHosts: []string{"gatehouse.lan"}}})
	port := open.URL[strings.LastIndex(open.URL, ":"):]
	a := newAPI(t, open)
	for host, want := range map[string]int{
		"127.0.0.1" + port:      200,
		"localhost" + port:      200,
		"app.localhost" + port:  200,
		"[::1]" + port:          200,
		"gatehouse.lan" + port:  200,
		"rebind.example" + port: 421,
		"127.0.0.1.nip.io":      421,
	} {
		status, body, _ := a.do("GET", "/v0/executions", nil, "Host", host)
		if status != want || (want == 421 && !strings.Contains(string(body), "HOST_NOT_ALLOWED")) {
			t.Errorf("Host %q: %d %s, want %d", host, status, body, want)
		}
	}
	tokened := start(t, node.Options{Auth: auth.Options{StaticToken: "s3cret"}})
	b := newAPI(t, tokened)
	b.token = "s3cret"
	if status, body, _ := b.do("GET", "/v0/executions", nil, "Host", "gatehouse.example.com"); status != 200 {
		t.Fatalf("with a token any Host is served: %d %s", status, body)
	}
}

// TestBrowserPageOnAnotherOriginCannotDrive runs a hostile page in
// Chromium: served from another origin, it fires every request a page may
// send without asking, then, as a DNS-rebinding page would, runs from a
// name that resolves to the gateway. Nothing it sends is acted on.
func TestBrowserPageOnAnotherOriginCannotDrive(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	page := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, "<!doctype html><title>elsewhere</title>")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go page.Serve(ln)
	t.Cleanup(func() { page.Close() })

	br := newBrowser(t, chromedp.Flag("host-resolver-rules", "MAP rebind.test 127.0.0.1"))
	// Every request is fired and awaited; the page's script only learns
	// that the network call finished (or was refused), never the answer.
	attack := func(gw string) string {
		return `(async () => {
			const gw = ` + "`" + gw + "`" + `, body = JSON.stringify({agent_id: "victim", input: "from a page"});
			const tries = [
				fetch(gw + "/v0/executions", {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body}),
				fetch(gw + "/v0/executions", {method: "POST", mode: "no-cors", body: new Blob([body])}),
				fetch(gw + "/v0/executions", {method: "POST", mode: "no-cors", headers: {"Content-Type": "application/x-www-form-urlencoded"}, body}),
				fetch(gw + "/v0/executions", {method: "POST", headers: {"Content-Type": "application/json"}, body}),
				fetch(gw + "/v0/executions"),
			];
			const out = await Promise.allSettled(tries);
			return out.map(r => r.status === "fulfilled" ? String(r.value.status) : "refused").join(",");
		})()`
	}
	br.do("open the other origin's page", 20*time.Second, chromedp.Navigate("http://"+ln.Addr().String()+"/"))
	t.Logf("from another origin: %s", br.evalAsync(attack(s.URL)))

	port := s.URL[strings.LastIndex(s.URL, ":"):]
	rebound := "http://rebind.test" + port
	br.do("open the rebound name", 20*time.Second, chromedp.Navigate(rebound+"/v0/health"))
	if got := br.evalAsync(`fetch("/v0/executions", {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({agent_id: "victim"})}).then(r => String(r.status))`); got != "421" {
		t.Fatalf("a same-origin POST from the rebound name: %s, want 421", got)
	}

	if got := a.json("GET", "/v0/executions", nil, 200)["executions"].([]any); len(got) != 0 {
		t.Fatalf("the pages created %d executions: %v", len(got), got)
	}
	// The requests did reach the gateway, and were refused there (the
	// JSON POST at its preflight).
	refused := a.metric(`gatehouse_http_requests_total{code="403",method="POST",route="refused"}`)
	if refused < 3 {
		t.Fatalf("%v refusals counted, want the page's POSTs", refused)
	}
}

// TestSpareConnectionsWaitTheIdleTimeout: a connection that has sent
// nothing yet (a client's spare) is idle, not slow: it is kept for the idle
// timeout, while one that started a request must finish its headers in
// time.
func TestSpareConnectionsWaitTheIdleTimeout(t *testing.T) {
	s := start(t, node.Options{Server: gateway.Options{HeaderTimeout: 200 * time.Millisecond, IdleTimeout: time.Minute}})
	spare := dialRaw(t, s.URL)
	time.Sleep(600 * time.Millisecond) // three header timeouts
	spare.write("GET /v0/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	if resp, _ := spare.response(); resp.StatusCode != 200 {
		t.Fatalf("the spare connection: %d", resp.StatusCode)
	}
	slow := dialRaw(t, s.URL)
	slow.write("GET /v0/hea")
	slow.closed()
}

// TestFinishedStreamLeavesTheConnectionUsable: an execution stream that
// ends keeps its connection for the client's next request, and that
// request is answered however long after the stream it comes (the
// stream's write deadline does not outlive it).
func TestFinishedStreamLeavesTheConnectionUsable(t *testing.T) {
	s := start(t, node.Options{Server: gateway.Options{WriteTimeout: 200 * time.Millisecond}})
	a := newAPI(t, s)
	id := a.create("ka-agent", nil)["id"].(string)
	a.json("POST", "/v0/executions/"+id+"/cancel", nil, 200)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	resp, err := client.Get(s.URL + "/v0/executions/" + id + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatalf("the finished stream: %v", err)
	}
	resp.Body.Close()
	time.Sleep(600 * time.Millisecond) // three write timeouts
	reused := false
	ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
	req, _ := http.NewRequestWithContext(ctx, "POST", s.URL+"/v0/executions", strings.NewReader(`{"agent_id":"ka-agent"}`))
	resp, err = client.Do(req)
	if err != nil {
		t.Fatalf("a request on the stream's connection: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 || !reused {
		t.Fatalf("status %d, connection reused %v", resp.StatusCode, reused)
	}
}

func TestLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost":           true,
		"LOCALHOST.:8080":     true,
		"app.localhost":       true,
		"127.0.0.1":           true,
		"127.8.9.10:80":       true,
		"[::1]:6060":          true,
		"::1":                 true,
		"[::ffff:127.0.0.1]":  true,
		"":                    false,
		"example.com":         false,
		"localhost.evil.com":  false,
		"10.0.0.1:80":         false,
		"[::ffff:10.0.0.1]:1": false,
	} {
		if got := gateway.LoopbackHost(host); got != want {
			t.Errorf("LoopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}
