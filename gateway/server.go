// Package gateway is Gatehouse's network face: a fasthttp server that
// terminates agent, runner and client connections over HTTP, SSE and
// WebSocket, authenticates them, and serves the kernel API under /v0.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"

	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/gateway/wsaccept"
	"github.com/gatehouse-dev/gatehouse/internal/option"
	"github.com/gatehouse-dev/gatehouse/protocol"
)

// Options configure a Server. Kernel, Hub and Auth are required; zero
// durations and sizes take the values of Defaults.
type Options struct {
	Kernel   Kernel
	Hub      Hub
	Auth     *auth.Authenticator
	Bridge   Bridge   // nil: no /v0/actions (approvals only through signals)
	Channels Channels // nil (or no Bridge): no human channels
	// Hooks are the endpoints through which chat platforms call the
	// gateway (channel.Hooker), served without a bearer token.
	Hooks []channel.Hook
	// Push is the Web Push channel; nil: none.
	Push Push
	// Surfaces are the protocol surfaces mounted beside /v0.
	Surfaces []protocol.Surface
	// Edges, on a hub, passes requests under EdgePrefix on to the edge
	// boxes linked to it; nil: those paths are this node's own (none).
	Edges Edges
	// EdgeName is this node's name as an edge box: the connections
	// ServeEdge accepts are for EdgePrefix + EdgeName.
	EdgeName string
	// Sessions are the durable sessions executions may be filed under;
	// nil: none (a session_id only labels the execution).
	Sessions Sessions
	Logger   *slog.Logger
	// Registry receives the gateway's metrics; nil makes a private one.
	Registry *prometheus.Registry

	Heartbeat    time.Duration // SSE heartbeat comment interval
	WriteTimeout time.Duration // a stream write that takes longer ends the stream
	MaxBodyBytes int           // request bodies past it are refused (413)
	// HeaderTimeout bounds reading a request's headers, ReadTimeout its
	// body; IdleTimeout a keep-alive connection between requests.
	HeaderTimeout time.Duration
	ReadTimeout   time.Duration
	IdleTimeout   time.Duration
	MaxConns      int      // concurrent connections; past it new ones get 503
	MaxConnsPerIP int      // concurrent connections from one address; past it 429; negative: no bound
	CORSOrigins   []string // none: no CORS headers; "*" allows any origin
	// AllowedHosts are the host names a gateway with no token answers to
	// besides loopback names and addresses (see docs/security.md §3).
	AllowedHosts []string
	// PeerAddr reports whether an address is one of the cluster's nodes:
	// a follower relays all its clients from its own address (bounding
	// them per address itself), so the connections from a peer's address
	// are not counted against MaxConnsPerIP; MaxConns still bounds them.
	// It is asked on accept, before a byte is read, so only the address,
	// which a client cannot forge, decides. nil: no address is a peer's.
	PeerAddr func(netip.Addr) bool
	// Load is told how long each request took to serve (a stream's
	// request ends once the stream is set up: streams are not counted);
	// nil: no one is.
	Load Load

	// WebSocket and admission control; docs/websocket.md describes them.
	PingInterval  time.Duration // WebSocket pings; a ping unanswered this long closes the socket
	CloseTimeout  time.Duration // a closing WebSocket lets the frame it is writing finish this long, then cuts it
	MaxFrameBytes int64         // zero: MaxBodyBytes + 4 KiB; a larger WebSocket frame closes the socket with 1009
	ConnectRate   float64       // new SSE and WebSocket connections admitted per second; negative: no limit
	ConnectBurst  int           // zero: 2 s worth of ConnectRate; connections admitted at once
}

// Load is told of the requests served: *procs.Governor is one.
type Load interface {
	// Served counts a request that took d to serve.
	Served(d time.Duration)
}

// Defaults returns the value each zero duration and size of Options takes.
// MaxFrameBytes and ConnectBurst stay zero: their defaults follow
// MaxBodyBytes and ConnectRate.
func Defaults() Options {
	return Options{
		Heartbeat:     5 * time.Second,
		WriteTimeout:  10 * time.Second,
		MaxBodyBytes:  1 << 20,
		HeaderTimeout: 10 * time.Second,
		ReadTimeout:   30 * time.Second,
		IdleTimeout:   120 * time.Second,
		MaxConns:      10000,
		MaxConnsPerIP: 1024,
		PingInterval:  15 * time.Second,
		CloseTimeout:  5 * time.Second,
		ConnectRate:   2000,
	}
}

// Server serves the gateway's HTTP API. Create it with New.
type Server struct {
	opts    Options
	k       Kernel
	hub     Hub
	auth    *auth.Authenticator
	log     *slog.Logger
	srv     *fasthttp.Server
	routes  *router
	metrics *metrics
	bufs    bufPool
	arenas  *arenas // execution streams' render buffers

	ws        wsaccept.Tracker // WebSocket connections, closed with 1001 at shutdown
	admission *rate.Limiter    // new stream connections

	// closing is closed when shutdown starts; long-lived streams end on it.
	closing   chan struct{}
	closeOnce sync.Once

	// fresh holds connections that have not sent a request yet: fasthttp's
	// shutdown waits for them (clients open spare connections), so
	// Shutdown closes them itself.
	freshMu sync.Mutex
	fresh   map[net.Conn]struct{}
	streams sync.WaitGroup

	// lns are the listeners Serve was given. Shutdown closes them after
	// fasthttp's shutdown, which misses a listener whose Serve has not
	// reached fasthttp yet: that Serve would accept forever.
	lnMu sync.Mutex
	lns  []net.Listener
}

// New builds a Server.
func New(o Options) (*Server, error) {
	if o.Kernel == nil || o.Hub == nil || o.Auth == nil {
		return nil, errors.New("gateway: Options.Kernel, Hub and Auth are required")
	}
	d := Defaults()
	option.Default(&o.Heartbeat, d.Heartbeat)
	option.Default(&o.WriteTimeout, d.WriteTimeout)
	option.Default(&o.MaxBodyBytes, d.MaxBodyBytes)
	option.Default(&o.HeaderTimeout, d.HeaderTimeout)
	option.Default(&o.ReadTimeout, d.ReadTimeout)
	option.Default(&o.IdleTimeout, d.IdleTimeout)
	option.Default(&o.MaxConns, d.MaxConns)
	if o.MaxConnsPerIP == 0 {
		o.MaxConnsPerIP = d.MaxConnsPerIP
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	o.streamDefaults()
	s := &Server{opts: o, k: o.Kernel, hub: o.Hub, auth: o.Auth, log: o.Logger, closing: make(chan struct{}), arenas: newArenas(), fresh: map[net.Conn]struct{}{}}
	s.admission = newAdmission(o.ConnectRate, o.ConnectBurst)
	s.metrics = newMetrics(o.Registry, o.Kernel, o.Hub)
	s.routes = s.buildRoutes()
	s.peerRoutes(s.routes)
	s.actionRoutes(s.routes)
	s.channelRoutes(s.routes)
	s.hookRoutes(s.routes)
	s.pushRoutes(s.routes)
	for _, sf := range o.Surfaces {
		s.mount(s.routes, sf)
	}
	s.srv = &fasthttp.Server{
		Handler: s.serve,
		Name:    "gatehouse",
		// The server's read timeout covers the headers; headerReceived
		// gives the body its own. No write timeout for authenticated
		// requests: SSE streams are long-lived, and a dead peer is found by
		// the failing heartbeat write instead.
		ReadTimeout:    o.HeaderTimeout,
		HeaderReceived: s.headerReceived,
		IdleTimeout:    o.IdleTimeout,
		// Bodies stream: fasthttp pre-reads at most 8 KiB, and readBody
		// takes the rest against the route's limit once the credential is
		// checked, so an announced length costs nothing until it arrives.
		StreamRequestBody:             true,
		DisablePreParseMultipartForm:  true,
		MaxRequestBodySize:            o.MaxBodyBytes,
		Concurrency:                   o.MaxConns,
		ErrorHandler:                  s.serveError,
		NoDefaultDate:                 false,
		DisableHeaderNamesNormalizing: false,
		CloseOnShutdown:               true,
		Logger:                        fasthttpLogger{o.Logger},
		// The worker pool's cleaner notices Shutdown only when it wakes,
		// every MaxIdleWorkerDuration (10s by default): keep that short so
		// no goroutine outlives a stopped server for long.
		MaxIdleWorkerDuration: time.Second,
		ConnState:             s.trackConn,
		// WebSocket connections are left to the tracker, so that fasthttp
		// frees their request state at the upgrade rather than holding it
		// for the life of the socket.
		KeepHijackedConns: true,
		// fasthttp's errors otherwise carry the bytes of the request that
		// failed to parse, its Authorization header included, into the
		// debug log (ours and fasthttp's own connection errors).
		SecureErrorLogMessage: true,
	}
	s.ws.KeepHijackedConns = true
	return s, nil
}

// Serve accepts connections on ln until Shutdown, and returns at once,
// closing ln, when Shutdown has begun.
func (s *Server) Serve(ln net.Listener) error {
	s.lnMu.Lock()
	select {
	case <-s.closing:
		s.lnMu.Unlock()
		_ = ln.Close()
		return nil
	default:
	}
	s.lns = append(s.lns, ln)
	s.lnMu.Unlock()
	perIP := s.metrics.refused.WithLabelValues("per_ip")
	err := s.srv.Serve(limitPerIP(ln, s.opts.MaxConnsPerIP, s.opts.PeerAddr, s.opts.IdleTimeout, perIP.Inc))
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("gateway: serve: %w", err)
	}
	return nil
}

// Shutdown stops accepting connections, ends long-lived streams and waits,
// bounded by ctx, for requests in flight. What was acknowledged is already
// durable; nothing is written at shutdown.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closeOnce.Do(func() { close(s.closing) })
	stopSweep := make(chan struct{})
	defer close(stopSweep)
	go s.closeFresh(stopSweep)
	// fasthttp does not track hijacked connections: the WebSocket tracker
	// closes them with 1001 and waits for their handlers.
	wserr := s.ws.Shutdown(ctx, "server shutting down")
	err := s.srv.ShutdownWithContext(ctx)
	if err == nil {
		err = wserr
	}
	s.lnMu.Lock()
	for _, ln := range s.lns {
		// Already closed by fasthttp, unless its Serve had not begun.
		_ = ln.Close()
	}
	s.lnMu.Unlock()
	done := make(chan struct{})
	go func() { s.streams.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		if err == nil {
			err = ctx.Err()
		}
	}
	return err
}

func (s *Server) serveError(ctx *fasthttp.RequestCtx, err error) {
	// A client still sending its request must get to read the refusal; one
	// that timed out is not sending.
	linger := true
	// The request line may not have been read (headers too large, a
	// malformed request): such a refusal has no mount and takes /v0's
	// shape.
	sf := s.surfaceAt(string(ctx.Path()))
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		s.refuse(ctx, sf, errTooLarge)
	case errors.Is(err, fasthttp.ErrTimeout) || isTimeout(err):
		s.refuse(ctx, sf, &guardError{fasthttp.StatusRequestTimeout, CodeTimeout, errReadTimedOut})
		linger = false
	case errors.As(err, new(*fasthttp.ErrSmallBuffer)):
		s.refuse(ctx, sf, &guardError{fasthttp.StatusRequestHeaderFieldsTooLarge, CodeHeadersTooLarge, errHeadersTooLarge})
	default:
		// fasthttp's message may quote the header that did not parse: the
		// answer says what went wrong, the log how (SecureErrorLogMessage
		// keeps the rest of the request, its token, out of it).
		s.log.Debug("malformed request", "err", err)
		s.refuse(ctx, sf, &guardError{fasthttp.StatusBadRequest, CodeValidation, errMalformed})
	}
	ctx.SetConnectionClose()
	if c, ok := ctx.Conn().(interface{ lingerOnClose() }); ok && linger {
		c.lingerOnClose()
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// serve is the entry point of every request.
func (s *Server) serve(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	s.used(ctx)
	EchoRequestID(ctx)
	s.cors(ctx)
	route := "unmatched"
	defer func() {
		if bodyUnread(ctx) {
			// What is left of the body would be read as the next request.
			ctx.SetConnectionClose()
		}
		took := time.Since(start)
		s.metrics.observe(route, methodLabel(ctx.Method()), ctx.Response.StatusCode(), took)
		if s.opts.Load != nil {
			s.opts.Load.Served(took)
		}
	}()
	if ctx.IsOptions() && len(s.opts.CORSOrigins) > 0 {
		ctx.SetStatusCode(fasthttp.StatusNoContent)
		return
	}
	if fromHub(ctx) {
		if err := s.edgeRequest(ctx); err != nil {
			route = "refused"
			s.writeError(ctx, err)
			return
		}
	}
	path := string(ctx.Path())
	if err := s.checkHost(ctx); err != nil {
		route = "refused"
		s.refuse(ctx, s.surfaceAt(path), err)
		return
	}
	if err := s.checkOrigin(ctx); err != nil {
		route = "refused"
		s.refuse(ctx, s.surfaceAt(path), err)
		return
	}
	if s.opts.Edges != nil {
		if name, ok := edgeOf(path); ok {
			route = EdgePrefix
			s.passToEdge(ctx, name)
			return
		}
	}
	if s.serveUI(ctx, path) {
		route = "/ui/"
		return
	}
	c := &call{ctx: ctx}
	r, params, allowed := s.routes.match(string(ctx.Method()), path, c.paramBuf[:])
	if r == nil {
		s.refuse(ctx, s.surfaceAt(path), noRoute(ctx, allowed))
		return
	}
	c.params = params
	route = r.pattern
	if err := checkMediaType(ctx, r.form); err != nil {
		s.refuse(ctx, r.surface, err)
		return
	}
	limit := min(s.opts.MaxBodyBytes, anonymousBodyLimit)
	if !r.public {
		// The credential is in the headers: a request without one is
		// answered before its body is read.
		p, err := s.auth.Authenticate(ctx.Request.Header.Peek("Authorization"), time.Now())
		if err != nil {
			s.refuse(ctx, r.surface, err)
			return
		}
		c.principal = p
		ctx.SetUserValue(principalKey{}, p)
		limit = s.opts.MaxBodyBytes
	}
	if err := readBody(ctx, limit); err != nil {
		s.refuse(ctx, r.surface, err)
		return
	}
	if err := checkRequestIDs(ctx, params); err != nil {
		s.refuse(ctx, r.surface, err)
		return
	}
	if err := r.handle(c); err != nil {
		s.fail(ctx, r, err)
	}
}

// methodLabel is a request's method as a metric label: the constant for a
// common one, since the label values escape and a conversion would
// allocate for every request.
func methodLabel(m []byte) string {
	switch string(m) {
	case fasthttp.MethodGet:
		return fasthttp.MethodGet
	case fasthttp.MethodPost:
		return fasthttp.MethodPost
	case fasthttp.MethodPut:
		return fasthttp.MethodPut
	case fasthttp.MethodDelete:
		return fasthttp.MethodDelete
	}
	return string(m)
}

// fail answers the error a route's handler returned, in the protocol of
// the route (a surface's own words, or the /v0 API's), and logs it when it
// is a 500: the client is told only "internal error". A refusal of the
// gateway's own that a wrapper returned (the stream admission's 429) is
// answered as the guard's are.
func (s *Server) fail(ctx *fasthttp.RequestCtx, r *route, err error) {
	if gerr := (*guardError)(nil); r.surface == nil || errors.As(err, &gerr) {
		s.refuse(ctx, r.surface, err)
		return
	}
	r.surface.Fail(ctx, err)
	if ctx.Response.StatusCode() == fasthttp.StatusInternalServerError {
		s.logFailed(ctx, err)
	}
}

// refuse answers a request the guard, the router or the authenticator
// turned away, in the error shape of sf, the surface it was meant for;
// nil (a /v0 route, a path under no mount) is the /v0 API's.
func (s *Server) refuse(ctx *fasthttp.RequestCtx, sf protocol.Surface, err error) {
	if sf == nil {
		s.writeError(ctx, err)
		return
	}
	status, body := statusOf(err)
	sf.WriteError(ctx, status, body.Code, body.Error)
	if status == fasthttp.StatusInternalServerError {
		s.logFailed(ctx, err)
	}
}

// surfaceAt returns the surface whose mount holds path, or nil: a path
// under no mount is answered in the /v0 API's shape.
func (s *Server) surfaceAt(path string) protocol.Surface {
	for _, sf := range s.opts.Surfaces {
		prefix := strings.TrimSuffix(sf.Mount(), "/")
		if path == prefix || strings.HasPrefix(path, prefix+"/") {
			return sf
		}
	}
	return nil
}

// errNoRoute refuses a path that nothing is served at.
var errNoRoute = errors.New("not found: nothing is served at this path")

// noRoute is the refusal of a request no route matches: 405 with the
// methods the path is served for (allowed, also set as the Allow header),
// or 404 when it is served for none.
func noRoute(ctx *fasthttp.RequestCtx, allowed string) error {
	if allowed == "" {
		return &guardError{fasthttp.StatusNotFound, CodeNotFound, errNoRoute}
	}
	ctx.Response.Header.Set("Allow", allowed)
	return &guardError{fasthttp.StatusMethodNotAllowed, CodeMethodMissing,
		errors.New("method not allowed: this path is served for " + allowed + " only")}
}

// cors adds CORS headers when origins are configured.
func (s *Server) cors(ctx *fasthttp.RequestCtx) {
	if len(s.opts.CORSOrigins) == 0 {
		return
	}
	origin := string(ctx.Request.Header.Peek("Origin"))
	allow := ""
	for _, o := range s.opts.CORSOrigins {
		if o == "*" {
			allow = "*"
			break
		}
		if origin != "" && strings.EqualFold(o, origin) {
			allow = origin
			break
		}
	}
	if allow == "" {
		return
	}
	h := &ctx.Response.Header
	h.Set("Access-Control-Allow-Origin", allow)
	if allow != "*" {
		h.Add("Vary", "Origin")
	}
	h.Set("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, OPTIONS")
	h.Set("Access-Control-Allow-Headers", "Content-Type, Authorization, X-Request-ID, Last-Event-ID, Idempotency-Key, traceparent")
	h.Set("Access-Control-Max-Age", "86400")
}

// call is one routed request.
type call struct {
	ctx       *fasthttp.RequestCtx
	params    []string
	principal *auth.Principal
	// paramBuf backs params, so that matching allocates nothing for
	// routes of up to two parameters (all of them today).
	paramBuf [2]string
}

type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Debug(fmt.Sprintf(format, args...), "component", "fasthttp")
}

// trackConn records connections until their first request reaches the
// handler. fasthttp marks a connection active before it has read anything,
// and waits for active connections at shutdown. A connection going idle
// also runs the work that waited for its answer's write, should fasthttp
// have left the flush out (a pipelined request follows).
func (s *Server) trackConn(c net.Conn, state fasthttp.ConnState) {
	if ac, ok := c.(answerConn); ok && state == fasthttp.StateIdle {
		ac.wentIdle()
	}
	s.freshMu.Lock()
	defer s.freshMu.Unlock()
	switch state {
	case fasthttp.StateNew:
		s.fresh[c] = struct{}{}
	case fasthttp.StateClosed, fasthttp.StateHijacked, fasthttp.StateIdle:
		delete(s.fresh, c)
	}
}

// used records that a connection's first request reached the handler.
func (s *Server) used(ctx *fasthttp.RequestCtx) {
	if ctx.ConnRequestNum() != 1 {
		return
	}
	s.freshMu.Lock()
	delete(s.fresh, ctx.Conn())
	s.freshMu.Unlock()
}

// closeFresh closes connections that never sent a request, until stop:
// they hold nothing acknowledged, and shutdown would otherwise wait out its
// whole timeout for them.
func (s *Server) closeFresh(stop <-chan struct{}) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		s.freshMu.Lock()
		for c := range s.fresh {
			_ = c.Close()
			delete(s.fresh, c)
		}
		s.freshMu.Unlock()
		select {
		case <-t.C:
		case <-stop:
			return
		}
	}
}
