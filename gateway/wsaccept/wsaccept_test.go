package wsaccept_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/gateway/wsaccept"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
)

// serverConfig is a fasthttp setup that changes what the hijack handler
// receives: KeepHijackedConns decides who closes the socket, MaxConnsPerIP
// wraps it in a pooled conn, TLS puts a *tls.Conn in between.
type serverConfig struct {
	name      string
	configure func(*fasthttp.Server)
	tls       bool
	// earlyEOF: the client sees the socket end as soon as the server closes
	// the websocket, before the handler returns. A plain MaxConnsPerIP
	// wrapper hides the socket, so there fasthttp's close after the handler
	// is what the client sees.
	earlyEOF bool
}

func serverConfigs() []serverConfig {
	keep := func(s *fasthttp.Server) { s.KeepHijackedConns = true }
	perIP := func(s *fasthttp.Server) { s.MaxConnsPerIP = 1000 }
	both := func(s *fasthttp.Server) { keep(s); perIP(s) }
	return []serverConfig{
		{name: "default", earlyEOF: true},
		{name: "KeepHijackedConns", configure: keep, earlyEOF: true},
		{name: "MaxConnsPerIP", configure: perIP},
		{name: "KeepHijackedConns+MaxConnsPerIP", configure: both, earlyEOF: true},
		{name: "TLS", tls: true, earlyEOF: true},
		{name: "TLS+MaxConnsPerIP", configure: perIP, tls: true, earlyEOF: true},
		{name: "TLS+KeepHijackedConns", configure: keep, tls: true, earlyEOF: true},
	}
}

type testServer struct {
	addr      string
	tr        *wsaccept.Tracker
	client    *http.Client
	clientTLS *tls.Config // nil without TLS
	stop      func()
}

// startServer serves handler on a fresh loopback port; the server, the
// tracker and the client's idle connections are shut down at cleanup, or
// earlier through stop.
func startServer(t *testing.T, cfg serverConfig, handler func(tr *wsaccept.Tracker, ctx *fasthttp.RequestCtx)) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := &wsaccept.Tracker{}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { handler(tr, ctx) }}
	if cfg.configure != nil {
		cfg.configure(srv)
	}
	tr.KeepHijackedConns = srv.KeepHijackedConns
	transport := &http.Transport{}
	ts := &testServer{addr: ln.Addr().String(), tr: tr, client: &http.Client{Transport: transport}}
	if cfg.tls {
		serverTLS, clientTLS := tlsConfigs(t)
		ln = tls.NewListener(ln, serverTLS)
		ts.clientTLS = clientTLS
		transport.TLSClientConfig = clientTLS
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	var once sync.Once
	ts.stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tr.Shutdown(ctx, "test over"); err != nil {
				t.Errorf("Tracker.Shutdown: %v", err)
			}
			if err := srv.ShutdownWithContext(ctx); err != nil {
				t.Errorf("Server.Shutdown: %v", err)
			}
			if err := <-served; err != nil {
				t.Errorf("Server.Serve: %v", err)
			}
			transport.CloseIdleConnections()
		})
	}
	t.Cleanup(ts.stop)
	return ts
}

// tlsConfigs returns a server config with a fresh self-signed certificate
// for 127.0.0.1 and a client config that trusts it.
func tlsConfigs(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	server = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}}}
	return server, &tls.Config{RootCAs: roots}
}

func (ts *testServer) url(scheme, path string) string {
	if ts.clientTLS != nil {
		scheme += "s"
	}
	return scheme + "://" + ts.addr + path
}

// dialRaw opens a plain connection to the server, under TLS if it uses it.
func (ts *testServer) dialRaw(t *testing.T) net.Conn {
	t.Helper()
	var nc net.Conn
	var err error
	if ts.clientTLS != nil {
		nc, err = tls.Dial("tcp", ts.addr, ts.clientTLS)
	} else {
		nc, err = net.Dial("tcp", ts.addr)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return nc
}

func (ts *testServer) dial(t *testing.T, path string, opts *websocket.DialOptions) *websocket.Conn {
	t.Helper()
	c, _, err := ts.tryDial(t, path, opts)
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

func (ts *testServer) tryDial(t *testing.T, path string, opts *websocket.DialOptions) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	if opts == nil {
		opts = &websocket.DialOptions{}
	}
	opts.HTTPClient = ts.client
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	return websocket.Dial(ctx, ts.url("ws", path), opts)
}

func echo(ctx context.Context, c *websocket.Conn) {
	for {
		typ, b, err := c.Read(ctx)
		if err != nil {
			return
		}
		if err := c.Write(ctx, typ, b); err != nil {
			return
		}
	}
}

// acceptOn serves handler on path and sends every Accept error to errs.
func acceptOn(path string, opts *websocket.AcceptOptions, handler func(context.Context, *websocket.Conn), errs chan<- error) func(*wsaccept.Tracker, *fasthttp.RequestCtx) {
	return func(tr *wsaccept.Tracker, ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case path:
			if err := tr.Accept(ctx, opts, handler); err != nil && errs != nil {
				errs <- err
			}
		case "/plain":
			ctx.SetBodyString("ok")
		case "/probe":
			fmt.Fprint(ctx, wsaccept.IsUpgrade(ctx))
		default:
			ctx.NotFound()
		}
	}
}

func timeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// readErr reads from c until a read fails and sends that error to errs: run
// in a goroutine, it shows how the server's close reached the client.
func readErr(c *websocket.Conn, errs chan<- error) {
	_, _, err := c.Read(context.Background())
	errs <- err
}

func recv[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func TestEchoRoundTrip(t *testing.T) {
	for _, cfg := range serverConfigs() {
		t.Run(cfg.name, func(t *testing.T) {
			ts := startServer(t, cfg, acceptOn("/echo", nil, echo, nil))
			c := ts.dial(t, "/echo", nil)
			ctx := timeout(t)
			for i := range 200 {
				typ := websocket.MessageText
				msg := []byte(fmt.Sprintf("message %d", i))
				if i%2 == 1 {
					typ = websocket.MessageBinary
					msg = bytes.Repeat([]byte{byte(i)}, 1+(i*331)%32000)
				}
				if err := c.Write(ctx, typ, msg); err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
				gotTyp, got, err := c.Read(ctx)
				if err != nil {
					t.Fatalf("read %d: %v", i, err)
				}
				if gotTyp != typ || !bytes.Equal(got, msg) {
					t.Fatalf("message %d: got %v %d bytes, want %v %d bytes", i, gotTyp, len(got), typ, len(msg))
				}
			}
			if err := c.Close(websocket.StatusNormalClosure, ""); err != nil {
				t.Fatalf("close: %v", err)
			}
			eventually.True(t, "handler to return", func() bool { return ts.tr.Len() == 0 })
		})
	}
}

func TestConcurrentClients(t *testing.T) {
	const clients, messages = 50, 20
	ts := startServer(t, serverConfig{}, acceptOn("/echo", nil, echo, nil))
	ctx := timeout(t)

	conns := make([]*websocket.Conn, clients)
	for i := range conns {
		conns[i] = ts.dial(t, "/echo", nil)
	}
	// The 101 is written after the connection is registered.
	if n := ts.tr.Len(); n != clients {
		t.Fatalf("Len() = %d with %d clients connected", n, clients)
	}

	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i, c := range conns {
		wg.Go(func() {
			for j := range messages {
				msg := fmt.Sprintf("client %d message %d", i, j)
				if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
					errs <- err
					return
				}
				_, got, err := c.Read(ctx)
				if err != nil {
					errs <- err
					return
				}
				if string(got) != msg {
					errs <- fmt.Errorf("client %d got %q, want %q", i, got, msg)
					return
				}
			}
			errs <- c.Close(websocket.StatusNormalClosure, "")
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	eventually.True(t, "all handlers to return", func() bool { return ts.tr.Len() == 0 })
}

func TestSubprotocol(t *testing.T) {
	opts := &websocket.AcceptOptions{Subprotocols: []string{"v2.gatehouse", "v1.gatehouse"}}
	sayProto := func(ctx context.Context, c *websocket.Conn) {
		_ = c.Write(ctx, websocket.MessageText, []byte(c.Subprotocol()))
		_ = c.Close(websocket.StatusNormalClosure, "")
	}
	ts := startServer(t, serverConfig{}, acceptOn("/proto", opts, sayProto, nil))

	for _, tc := range []struct {
		offer []string
		want  string
	}{
		{offer: []string{"v1.gatehouse", "v2.gatehouse"}, want: "v2.gatehouse"},
		{offer: []string{"other", "v1.gatehouse"}, want: "v1.gatehouse"},
		{offer: []string{"other"}, want: ""},
		{offer: nil, want: ""},
	} {
		t.Run(strings.Join(tc.offer, ","), func(t *testing.T) {
			c := ts.dial(t, "/proto", &websocket.DialOptions{Subprotocols: tc.offer})
			if got := c.Subprotocol(); got != tc.want {
				t.Errorf("client Subprotocol() = %q, want %q", got, tc.want)
			}
			_, got, err := c.Read(timeout(t))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("server Subprotocol() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestNotUpgrade(t *testing.T) {
	errs := make(chan error, 1)
	ts := startServer(t, serverConfig{}, acceptOn("/ws", nil, echo, errs))
	upgrade := map[string]string{
		"Connection":            "keep-alive, Upgrade",
		"Upgrade":               "websocket",
		"Sec-WebSocket-Version": "13",
		"Sec-WebSocket-Key":     "dGhlIHNhbXBsZSBub25jZQ==",
	}
	with := func(changes map[string]string) map[string]string {
		h := make(map[string]string)
		for k, v := range upgrade {
			h[k] = v
		}
		for k, v := range changes {
			if v == "" {
				delete(h, k)
			} else {
				h[k] = v
			}
		}
		return h
	}
	do := func(t *testing.T, method, path string, hdr map[string]string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(timeout(t), method, "http://"+ts.addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := ts.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp
	}

	for _, tc := range []struct {
		name       string
		method     string
		hdr        map[string]string
		status     int
		wantHeader [2]string
	}{
		{"plain GET", http.MethodGet, nil, http.StatusUpgradeRequired, [2]string{"Upgrade", "websocket"}},
		{"no Upgrade header", http.MethodGet, with(map[string]string{"Upgrade": ""}), http.StatusUpgradeRequired, [2]string{"Upgrade", "websocket"}},
		{"POST", http.MethodPost, upgrade, http.StatusMethodNotAllowed, [2]string{"Allow", "GET"}},
		{"version 8", http.MethodGet, with(map[string]string{"Sec-WebSocket-Version": "8"}), http.StatusUpgradeRequired, [2]string{"Sec-WebSocket-Version", "13"}},
		{"no key", http.MethodGet, with(map[string]string{"Sec-WebSocket-Key": ""}), http.StatusBadRequest, [2]string{}},
		{"short key", http.MethodGet, with(map[string]string{"Sec-WebSocket-Key": "c2hvcnQ="}), http.StatusBadRequest, [2]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := do(t, tc.method, "/ws", tc.hdr)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if k := tc.wantHeader[0]; k != "" && resp.Header.Get(k) != tc.wantHeader[1] {
				t.Errorf("%s: %q, want %q", k, resp.Header.Get(k), tc.wantHeader[1])
			}
			if err := recv(t, "Accept error", errs); !errors.Is(err, wsaccept.ErrNotUpgrade) {
				t.Errorf("Accept error %v, want ErrNotUpgrade", err)
			}
			if resp := do(t, http.MethodGet, "/plain", nil); resp.StatusCode != http.StatusOK {
				t.Errorf("plain route after refusal: status %d", resp.StatusCode)
			}
		})
	}

	for _, tc := range []struct {
		hdr  map[string]string
		want string
	}{{upgrade, "true"}, {nil, "false"}, {with(map[string]string{"Sec-WebSocket-Key": ""}), "false"}} {
		req, err := http.NewRequestWithContext(timeout(t), http.MethodGet, "http://"+ts.addr+"/probe", nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range tc.hdr {
			req.Header.Set(k, v)
		}
		resp, err := ts.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if string(body) != tc.want {
			t.Errorf("IsUpgrade with %v = %s, want %s", tc.hdr, body, tc.want)
		}
	}
}

func TestOrigin(t *testing.T) {
	errs := make(chan error, 1)
	opts := &websocket.AcceptOptions{OriginPatterns: []string{"allowed.example"}}
	ts := startServer(t, serverConfig{}, acceptOn("/ws", opts, echo, errs))

	for _, origin := range []string{"http://allowed.example", "http://" + ts.addr, ""} {
		hdr := http.Header{}
		if origin != "" {
			hdr.Set("Origin", origin)
		}
		c := ts.dial(t, "/ws", &websocket.DialOptions{HTTPHeader: hdr})
		_ = c.Close(websocket.StatusNormalClosure, "")
	}

	hdr := http.Header{"Origin": {"http://evil.example"}}
	_, resp, err := ts.tryDial(t, "/ws", &websocket.DialOptions{HTTPHeader: hdr})
	if err == nil {
		t.Fatal("dial from a foreign origin succeeded")
	}
	if resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("dial from a foreign origin: %v, response %v", err, resp)
	}
	if err := recv(t, "Accept error", errs); !errors.Is(err, wsaccept.ErrRejected) {
		t.Errorf("Accept error %v, want ErrRejected", err)
	}
	eventually.True(t, "handlers to return", func() bool { return ts.tr.Len() == 0 })
}

// maskedFrame encodes a final client frame with a payload under 126 bytes.
func maskedFrame(opcode byte, payload string) []byte {
	key := [4]byte{0x37, 0xfa, 0x21, 0x3d}
	f := []byte{0x80 | opcode, 0x80 | byte(len(payload))}
	f = append(f, key[:]...)
	for i := range len(payload) {
		f = append(f, payload[i]^key[i%4])
	}
	return f
}

func TestPipelinedFirstFrame(t *testing.T) {
	const key = "dGhlIHNhbXBsZSBub25jZQ=="
	sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	wantAccept := base64.StdEncoding.EncodeToString(sum[:])

	for _, cfg := range serverConfigs() {
		t.Run(cfg.name, func(t *testing.T) {
			ts := startServer(t, cfg, acceptOn("/echo", nil, echo, nil))
			nc := ts.dialRaw(t)
			if err := nc.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
				t.Fatal(err)
			}

			var out bytes.Buffer
			fmt.Fprintf(&out, "GET /echo HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
				"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", ts.addr, key)
			out.Write(maskedFrame(0x1, "first"))
			out.Write(maskedFrame(0x2, "second"))
			if _, err := nc.Write(out.Bytes()); err != nil {
				t.Fatal(err)
			}

			br := bufio.NewReader(nc)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Accept") != wantAccept {
				t.Fatalf("handshake answer %s, Sec-WebSocket-Accept %q", resp.Status, resp.Header.Get("Sec-WebSocket-Accept"))
			}
			for _, want := range []struct {
				first   byte
				payload string
			}{{0x81, "first"}, {0x82, "second"}} {
				var h [2]byte
				if _, err := io.ReadFull(br, h[:]); err != nil {
					t.Fatalf("reading echo of %q: %v", want.payload, err)
				}
				payload := make([]byte, h[1])
				if _, err := io.ReadFull(br, payload); err != nil {
					t.Fatal(err)
				}
				if h[0] != want.first || string(payload) != want.payload {
					t.Fatalf("echo: header %#x payload %q, want %#x %q", h[0], payload, want.first, want.payload)
				}
			}
		})
	}
}

func TestServerCloseUnblocksRead(t *testing.T) {
	type handlerState struct {
		conn    *websocket.Conn
		readErr chan error
		hold    chan struct{}
	}
	for _, cfg := range serverConfigs() {
		for _, how := range []string{"CloseNow", "Close"} {
			t.Run(cfg.name+"/"+how, func(t *testing.T) {
				states := make(chan *handlerState, 1)
				handler := func(ctx context.Context, c *websocket.Conn) {
					st := &handlerState{conn: c, readErr: make(chan error, 1), hold: make(chan struct{})}
					states <- st
					_, _, err := c.Read(ctx)
					st.readErr <- err
					<-st.hold
				}
				ts := startServer(t, cfg, acceptOn("/block", nil, handler, nil))
				c := ts.dial(t, "/block", nil)
				st := recv(t, "handler", states)

				clientErr := make(chan error, 1)
				go readErr(c, clientErr)
				// Give the handler time to block in Read.
				time.Sleep(50 * time.Millisecond)
				// In a goroutine: if Close fails to interrupt the socket, it
				// blocks for good on the lock the pending Read holds.
				closed := make(chan struct{})
				go func() {
					defer close(closed)
					if how == "CloseNow" {
						_ = st.conn.CloseNow()
					} else {
						_ = st.conn.Close(websocket.StatusNormalClosure, "bye")
					}
				}()

				recv(t, "server "+how+" to return", closed)
				if err := recv(t, "server Read to return", st.readErr); err == nil {
					t.Fatal("server Read returned no error after close")
				}
				if cfg.earlyEOF || how == "Close" {
					err := recv(t, "client to see the close while the handler runs", clientErr)
					if how == "Close" && websocket.CloseStatus(err) != websocket.StatusNormalClosure {
						t.Errorf("client error %v, want close status 1000", err)
					}
					close(st.hold)
				} else {
					close(st.hold)
					if err := recv(t, "client to see the close", clientErr); err == nil {
						t.Fatal("client Read returned no error")
					}
				}
				eventually.True(t, "handler to return", func() bool { return ts.tr.Len() == 0 })
			})
		}
	}
}

func TestShutdown(t *testing.T) {
	const clients = 10
	var returned atomic.Int32
	handler := func(ctx context.Context, c *websocket.Conn) {
		defer returned.Add(1)
		echo(ctx, c)
	}
	errs := make(chan error, 1)
	ts := startServer(t, serverConfig{}, acceptOn("/echo", nil, handler, errs))

	clientErrs := make(chan error, clients)
	for range clients {
		c := ts.dial(t, "/echo", nil)
		go readErr(c, clientErrs)
	}

	ctx := timeout(t)
	if err := ts.tr.Shutdown(ctx, "server restart"); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if n := returned.Load(); n != clients {
		t.Errorf("%d handlers returned before Shutdown did, want %d", n, clients)
	}
	if n := ts.tr.Len(); n != 0 {
		t.Errorf("Len() = %d after Shutdown", n)
	}
	for range clients {
		err := recv(t, "client close", clientErrs)
		var ce websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.StatusGoingAway || ce.Reason != "server restart" {
			t.Errorf("client error %v, want close 1001 %q", err, "server restart")
		}
	}

	_, resp, err := ts.tryDial(t, "/echo", nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("dial after Shutdown: %v, response %v", err, resp)
	}
	if err := recv(t, "Accept error", errs); !errors.Is(err, wsaccept.ErrShutdown) {
		t.Errorf("Accept error %v, want ErrShutdown", err)
	}
	if err := ts.tr.Shutdown(ctx, "again"); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
}

func TestShutdownBeforeHijack(t *testing.T) {
	var ran atomic.Bool
	errs := make(chan error, 2)
	ts := startServer(t, serverConfig{}, func(tr *wsaccept.Tracker, ctx *fasthttp.RequestCtx) {
		errs <- tr.Accept(ctx, nil, func(context.Context, *websocket.Conn) { ran.Store(true) })
		// fasthttp hands the connection over only after this returns.
		errs <- tr.Shutdown(context.Background(), "")
	})
	_, resp, err := ts.tryDial(t, "/", nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("dial: %v, response %v", err, resp)
	}
	for _, what := range []string{"Accept", "Shutdown"} {
		if err := recv(t, what, errs); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	if ran.Load() {
		t.Error("handler ran after Shutdown")
	}
	if n := ts.tr.Len(); n != 0 {
		t.Errorf("Len() = %d", n)
	}
}

func TestShutdownCancelsHandlerContext(t *testing.T) {
	handler := func(ctx context.Context, c *websocket.Conn) {
		// A push-only handler: it leaves reading to CloseRead and waits
		// for its context.
		ctx = c.CloseRead(ctx)
		<-ctx.Done()
	}
	ts := startServer(t, serverConfig{}, acceptOn("/push", nil, handler, nil))
	c := ts.dial(t, "/push", nil)
	clientErr := make(chan error, 1)
	go readErr(c, clientErr)

	if err := ts.tr.Shutdown(timeout(t), "bye"); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := recv(t, "client close", clientErr); websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Errorf("client error %v, want close 1001", err)
	}
}

func TestShutdownHonoursDeadline(t *testing.T) {
	release := make(chan struct{})
	handler := func(context.Context, *websocket.Conn) { <-release }
	ts := startServer(t, serverConfig{}, acceptOn("/stuck", nil, handler, nil))
	c := ts.dial(t, "/stuck", nil)
	clientErr := make(chan error, 1)
	go readErr(c, clientErr)

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := ts.tr.Shutdown(ctx, "bye")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v, want DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Shutdown took %v with a 200ms deadline", took)
	}
	if n := ts.tr.Len(); n != 1 {
		t.Errorf("Len() = %d while the handler is stuck, want 1", n)
	}
	if err := recv(t, "client close", clientErr); websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Errorf("client error %v, want close 1001", err)
	}
	close(release)
	eventually.True(t, "stuck handler to be forgotten", func() bool { return ts.tr.Len() == 0 })
}

func TestReadLimit(t *testing.T) {
	handler := func(ctx context.Context, c *websocket.Conn) {
		c.SetReadLimit(16)
		echo(ctx, c)
	}
	ts := startServer(t, serverConfig{}, acceptOn("/limited", nil, handler, nil))
	c := ts.dial(t, "/limited", nil)
	ctx := timeout(t)
	if err := c.Write(ctx, websocket.MessageText, []byte("small")); err != nil {
		t.Fatal(err)
	}
	if _, got, err := c.Read(ctx); err != nil || string(got) != "small" {
		t.Fatalf("echo under the limit: %q, %v", got, err)
	}
	if err := c.Write(ctx, websocket.MessageBinary, bytes.Repeat([]byte("x"), 64)); err != nil {
		t.Fatal(err)
	}
	_, _, err := c.Read(ctx)
	if websocket.CloseStatus(err) != websocket.StatusMessageTooBig {
		t.Fatalf("client error %v, want close 1009", err)
	}
	eventually.True(t, "handler to return", func() bool { return ts.tr.Len() == 0 })
}

func TestNoGoroutineLeak(t *testing.T) {
	baseline := runtime.NumGoroutine()

	// fasthttp's worker pool cleaner only notices Shutdown when it wakes up,
	// every MaxIdleWorkerDuration (10s by default).
	configure := func(s *fasthttp.Server) { s.MaxIdleWorkerDuration = 20 * time.Millisecond }
	ts := startServer(t, serverConfig{configure: configure}, acceptOn("/echo", nil, echo, nil))
	ctx := timeout(t)
	for i := range 20 {
		c := ts.dial(t, "/echo", nil)
		if err := c.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.Read(ctx); err != nil {
			t.Fatal(err)
		}
		switch i % 3 {
		case 0:
			_ = c.Close(websocket.StatusNormalClosure, "")
		case 1:
			_ = c.CloseNow()
		default:
			// Left open for Tracker.Shutdown; a reader answers its close.
			go func() { _, _, _ = c.Read(context.Background()) }()
		}
	}
	ts.stop()

	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > baseline {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("%d goroutines, baseline %d:\n%s", runtime.NumGoroutine(), baseline, buf)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
