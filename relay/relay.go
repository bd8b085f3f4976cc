// Package relay is what a follower node of a cluster serves its listener
// with: it passes each client connection on to the leading node, which runs
// the kernel and serves every protocol.
//
// The relay reads a connection's first request itself, so that its headers
// are bounded, the few paths a follower answers on its own are answered
// here, and a client gets a clear error when there is no leader to reach.
// Any other first request makes the relay take the whole connection over:
// it dials the leader, writes the request there, and splices the two
// connections both ways until either side closes. Keep-alive requests, SSE
// streams and WebSocket upgrades all pass through unchanged, with no
// per-request or per-frame work; every later request of that connection
// goes to the same leader, and when the leader goes, the splice ends and
// the client reconnects.
package relay

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/internal/option"
)

// The codes of the relay's own refusals, in the /v0 error envelope.
const (
	// CodeNoLeader: no node of the cluster was leading within Options.Wait
	// (503, Retry-After: 1).
	CodeNoLeader = "CLUSTER_NO_LEADER"
	// CodeLeaderUnreachable: a leader is known but could not be dialed,
	// the request could not be written to it, or the connection to it
	// ended before it answered a request (502, Retry-After: 1).
	CodeLeaderUnreachable = "CLUSTER_LEADER_UNREACHABLE"
)

// RelayedHeader marks a request a relay wrote to the node it took for the
// leader. A relay refuses a first request that carries it (503
// CodeNoLeader) instead of relaying it again: two nodes that each take the
// other for the leader, while an election settles, must not pass a
// connection back and forth.
const RelayedHeader = "Gatehouse-Relayed"

// Bounds of the way to the leader.
const (
	// dialTimeout bounds dialing the leader (TLS handshake included).
	dialTimeout = 3 * time.Second
	// writeTimeout bounds writing the first request to the leader.
	writeTimeout = 5 * time.Second
)

// Options configure a Relay. Zero durations and sizes take the gateway's
// defaults (gateway.Defaults), so that a client meets the same bounds on a
// follower as on the leader.
type Options struct {
	// Leader returns the current leader's HTTP address (host:port), waiting
	// for one within ctx; an error means none is known (answered 503).
	Leader func(ctx context.Context) (string, error)
	// Local answers the requests whose path is in LocalPaths on this node
	// itself; nil answers nothing locally.
	Local      fasthttp.RequestHandler
	LocalPaths []string
	// DialTLS, when set, dials the leader over TLS with it.
	DialTLS *tls.Config
	// Wait bounds how long a request waits for a leader; zero: 5s.
	Wait time.Duration
	// HeaderTimeout bounds reading the first request's headers once its
	// first byte has arrived, ReadTimeout its body; IdleTimeout bounds the
	// wait for that first byte, and for the next request after one
	// answered locally.
	HeaderTimeout time.Duration
	ReadTimeout   time.Duration
	IdleTimeout   time.Duration
	// WriteTimeout bounds a write to either side that makes no progress:
	// a client that stops reading is cut off as the leader would cut it
	// off itself, instead of the relay's buffers hiding it from the
	// leader's slow-consumer bound.
	WriteTimeout time.Duration
	// MaxHeaderBytes bounds the request line and headers; zero: 4 KiB, as
	// the gateway's.
	MaxHeaderBytes int
	// MaxBodyBytes bounds the first request's body, which the relay reads
	// before it relays; give it the gateway's MaxBodyBytes, so that the
	// relay does not refuse what the leader would take.
	MaxBodyBytes int
	// MaxConns bounds the connections relayed at once; past it a new one
	// gets 503 SERVICE_UNAVAILABLE (zero: the gateway's). As many again may
	// be read at once before they are relayed or refused.
	MaxConns int
	// MaxConnsPerIP bounds the connections open at once from one address,
	// relayed ones included (past it: 429, then closed); negative: no bound.
	MaxConnsPerIP int
	Logger        *slog.Logger
}

// lingerBytes bounds what a refused connection may still send and have
// read and dropped before it is closed, past the body limit when its body
// was over it (see gateway.Linger).
const lingerBytes = 256 << 10

// defaultWait is the zero Options.Wait.
const defaultWait = 5 * time.Second

// defaultMaxHeaderBytes is fasthttp's default read buffer, which is the
// gateway's bound on request line and headers.
const defaultMaxHeaderBytes = 4 << 10

// Stats are a relay's counters since New, for metrics.
type Stats struct {
	// Open is the number of connections being relayed now.
	Open int64
	// Relayed counts the connections handed over to a leader.
	Relayed uint64
	// ToLeader and ToClient count the bytes relayed each way, the first
	// request included.
	ToLeader, ToClient uint64
	// NoLeader, Unreachable and PerIP count refusals: no leader within
	// Wait (503), a leader that could not be reached or whose connection
	// ended before it answered (502), a connection
	// past MaxConnsPerIP (429); Full counts first requests refused (503)
	// while MaxConns connections were relayed.
	NoLeader, Unreachable, PerIP, Full uint64
}

// Add returns the sum of s's counters and o's: a node that relays in
// several periods, with a Relay for each, adds them up.
func (s Stats) Add(o Stats) Stats {
	return Stats{
		Open: s.Open + o.Open, Relayed: s.Relayed + o.Relayed,
		ToLeader: s.ToLeader + o.ToLeader, ToClient: s.ToClient + o.ToClient,
		NoLeader: s.NoLeader + o.NoLeader, Unreachable: s.Unreachable + o.Unreachable,
		PerIP: s.PerIP + o.PerIP, Full: s.Full + o.Full,
	}
}

// Relay relays a follower's client connections to the leading node.
// Create it with New.
type Relay struct {
	o     Options
	log   *slog.Logger
	srv   *fasthttp.Server
	local map[string]struct{}

	// base is cancelled when shutdown begins: requests waiting for a
	// leader give up at once.
	base   context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	closing bool
	lns     []net.Listener
	// fresh are the connections that have not sent a request yet:
	// fasthttp's shutdown would wait for them (it closes only those idle
	// between requests), so Shutdown closes them.
	fresh map[net.Conn]struct{}
	// pending maps a client connection to its splice until fasthttp hands
	// the connection over.
	pending map[net.Conn]*splice
	splices splices

	relayed, toLeader, toClient              atomic.Uint64
	refusedNoLeader, refusedUnreachable, ipN atomic.Uint64
	refusedFull                              atomic.Uint64

	// dropped is the answer to a request whose connection to the leader
	// ended before it answered (see answerDropped).
	dropped []byte
}

// New builds a Relay; Options.Leader is required.
func New(o Options) *Relay {
	d := gateway.Defaults()
	option.Default(&o.Wait, defaultWait)
	option.Default(&o.HeaderTimeout, d.HeaderTimeout)
	option.Default(&o.ReadTimeout, d.ReadTimeout)
	option.Default(&o.IdleTimeout, d.IdleTimeout)
	option.Default(&o.WriteTimeout, d.WriteTimeout)
	option.Default(&o.MaxHeaderBytes, defaultMaxHeaderBytes)
	option.Default(&o.MaxBodyBytes, d.MaxBodyBytes)
	option.Default(&o.MaxConns, d.MaxConns)
	if o.MaxConnsPerIP == 0 {
		o.MaxConnsPerIP = d.MaxConnsPerIP
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.DialTLS != nil {
		// The relay writes HTTP/1.1 and then copies bytes: the leader must
		// not pick HTTP/2 (the gateway never offers it; this keeps it so).
		o.DialTLS = o.DialTLS.Clone()
		o.DialTLS.NextProtos = []string{"http/1.1"}
	}
	r := &Relay{
		o:       o,
		log:     o.Logger,
		local:   make(map[string]struct{}, len(o.LocalPaths)),
		fresh:   map[net.Conn]struct{}{},
		pending: map[net.Conn]*splice{},
		dropped: droppedAnswer(CodeLeaderUnreachable, errLeaderDropped),
	}
	for _, p := range o.LocalPaths {
		r.local[p] = struct{}{}
	}
	r.base, r.cancel = context.WithCancel(context.Background())
	r.srv = &fasthttp.Server{
		Handler: r.serve,
		Name:    "gatehouse",
		// The read timeout covers the headers (after the first byte: see
		// conn); headerReceived gives the body its own.
		ReadTimeout:    o.HeaderTimeout,
		HeaderReceived: r.headerReceived,
		IdleTimeout:    o.IdleTimeout,
		ReadBufferSize: o.MaxHeaderBytes,
		// The body is relayed as it was read: a multipart form parsed here
		// would be written back re-encoded.
		DisablePreParseMultipartForm: true,
		MaxRequestBodySize:           o.MaxBodyBytes,
		// Counts the connections before they are relayed; begin counts
		// the relayed ones, which fasthttp no longer does once the handler
		// has hijacked them. Twice MaxConns: fasthttp's own refusal past
		// it is plain text, and a connection just relayed still counts
		// here for a moment, which at MaxConns alone had fasthttp refuse
		// the next one before serve could answer SERVICE_UNAVAILABLE.
		Concurrency:           2 * o.MaxConns,
		ErrorHandler:          r.serveError,
		CloseOnShutdown:       true,
		MaxIdleWorkerDuration: time.Second,
		ConnState:             r.connState,
		SecureErrorLogMessage: true,
		Logger:                fasthttpLogger{o.Logger},
	}
	return r
}

// Stats returns the relay's counters.
func (r *Relay) Stats() Stats {
	return Stats{
		Open:        r.splices.open.Load(),
		Relayed:     r.relayed.Load(),
		ToLeader:    r.toLeader.Load(),
		ToClient:    r.toClient.Load(),
		NoLeader:    r.refusedNoLeader.Load(),
		Unreachable: r.refusedUnreachable.Load(),
		PerIP:       r.ipN.Load(),
		Full:        r.refusedFull.Load(),
	}
}

// Serve accepts connections on ln until Shutdown, and returns at once,
// closing ln, when Shutdown has begun.
func (r *Relay) Serve(ln net.Listener) error {
	r.mu.Lock()
	if r.closing {
		r.mu.Unlock()
		_ = ln.Close()
		return nil
	}
	r.lns = append(r.lns, ln)
	r.mu.Unlock()
	err := r.srv.Serve(limitPerIP(ln, r.o.MaxConnsPerIP, r.o.IdleTimeout, func() { r.ipN.Add(1) }))
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("relay: serve: %w", err)
	}
	return nil
}

// Shutdown stops accepting connections and closes every relayed one (the
// clients reconnect, to this node or another), then waits, bounded by ctx,
// for the requests in hand and for every splice to end.
func (r *Relay) Shutdown(ctx context.Context) error {
	r.mu.Lock()
	r.closing = true
	lns := r.lns
	r.mu.Unlock()
	r.splices.closeAll()
	r.cancel()

	// One accepted while fasthttp closes the listener may show up after a
	// first sweep: they are swept until its shutdown returns.
	stop := make(chan struct{})
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			r.closeFresh()
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	err := r.srv.ShutdownWithContext(ctx)
	close(stop)
	<-swept
	for _, ln := range lns {
		// Already closed by fasthttp, unless its Serve had not begun.
		_ = ln.Close()
	}
	select {
	case <-r.splices.wait():
	case <-ctx.Done():
		if err == nil {
			err = ctx.Err()
		}
	}
	if err != nil {
		return fmt.Errorf("relay: shutdown: %w", err)
	}
	return nil
}

func (r *Relay) closeFresh() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.fresh {
		_ = c.Close()
	}
}

// connState tracks the connections that have sent nothing yet (a
// request's arrival ends that in serve: fasthttp calls a connection active
// before its first byte), and abandons
// the splice of a connection that fasthttp closed instead of handing it
// over (it failed between the handler and the hijack).
func (r *Relay) connState(c net.Conn, st fasthttp.ConnState) {
	r.mu.Lock()
	switch st {
	case fasthttp.StateNew:
		r.fresh[c] = struct{}{}
	case fasthttp.StateIdle, fasthttp.StateHijacked, fasthttp.StateClosed:
		delete(r.fresh, c)
	}
	var abandoned *splice
	if st == fasthttp.StateClosed {
		abandoned = r.pending[c]
		delete(r.pending, c)
	}
	r.mu.Unlock()
	if abandoned != nil {
		r.splices.finish(abandoned)
	}
}

func (r *Relay) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	return fasthttp.RequestConfig{ReadTimeout: r.o.ReadTimeout}
}

// redialEvery spaces the dials of a leader that refused one, within
// Options.Wait.
const redialEvery = 100 * time.Millisecond

// reach finds the leader and dials it. A leader that cannot be dialed is
// asked for again until Options.Wait has passed: while a lost leader's
// lease runs out and another node takes over, a request waits for the new
// one rather than failing, so that clients are not sent into backoff by a
// failover. errNoLeader when none was known in time; the last dial's
// error when one was known but could not be dialed.
func (r *Relay) reach() (string, net.Conn, error) {
	wait, cancel := context.WithTimeout(r.base, r.o.Wait)
	defer cancel()
	var (
		addr    string
		dialErr error
	)
	for {
		a, err := r.o.Leader(wait)
		if err != nil {
			if dialErr != nil {
				return addr, nil, dialErr
			}
			return "", nil, fmt.Errorf("%w: %w", errNoLeader, err)
		}
		addr = a
		c, err := r.dial(addr)
		if err == nil {
			return addr, c, nil
		}
		dialErr = err
		select {
		case <-wait.Done():
			return addr, nil, dialErr
		case <-time.After(redialEvery):
		}
	}
}

// serve is the handler of a connection's requests until one is relayed.
func (r *Relay) serve(ctx *fasthttp.RequestCtx) {
	if ctx.ConnRequestNum() == 1 {
		r.mu.Lock()
		delete(r.fresh, ctx.Conn())
		r.mu.Unlock()
	}
	// The answers the relay gives itself carry one as the leader's do; a
	// relayed request's answer is the leader's own.
	gateway.EchoRequestID(ctx)
	if r.isLocal(ctx) {
		r.o.Local(ctx)
		return
	}
	if r.splices.open.Load() >= int64(r.o.MaxConns) {
		r.refuse(ctx, fasthttp.StatusServiceUnavailable, gateway.CodeUnavailable, errFull, &r.refusedFull)
		return
	}
	if len(ctx.Request.Header.Peek(RelayedHeader)) > 0 {
		r.refuse(ctx, fasthttp.StatusServiceUnavailable, CodeNoLeader, errRelayLoop, &r.refusedNoLeader)
		return
	}
	if len(ctx.Request.Header.Host()) == 0 {
		// fasthttp cannot write a request without a host (HTTP/1.0 allows
		// one): it is the client's to fix, not the leader's fault.
		writeError(ctx, fasthttp.StatusBadRequest, gateway.CodeValidation, errNoHost)
		ctx.SetConnectionClose()
		return
	}
	addr, leader, err := r.reach()
	switch {
	case errors.Is(err, errNoLeader):
		r.log.Debug("no leader to relay to", "err", err)
		r.refuse(ctx, fasthttp.StatusServiceUnavailable, CodeNoLeader, errNoLeader, &r.refusedNoLeader)
		return
	case err != nil:
		r.log.Warn("leader unreachable", "leader", addr, "err", err)
		r.refuse(ctx, fasthttp.StatusBadGateway, CodeLeaderUnreachable, errUnreachable, &r.refusedUnreachable)
		return
	}
	client := ctx.Conn()
	sp, ok := r.begin(client, leader)
	if !ok {
		_ = leader.Close()
		r.refuse(ctx, fasthttp.StatusServiceUnavailable, CodeNoLeader, errShuttingDown, &r.refusedNoLeader)
		return
	}
	n, err := writeFirst(ctx, leader, true)
	r.toLeader.Add(uint64(n))
	if err != nil {
		r.log.Warn("leader unreachable", "leader", addr, "err", err)
		r.unpend(client)
		r.splices.drop(sp)
		r.refuse(ctx, fasthttp.StatusBadGateway, CodeLeaderUnreachable, errUnreachable, &r.refusedUnreachable)
		return
	}
	// The request is the leader's to answer now.
	sp.sending(nil)
	r.relayed.Add(1)
	// No answer of fasthttp's: the leader's comes through the splice.
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		if r.unpend(client) {
			r.splices.run(sp, c, &r.toLeader, &r.toClient, r.o.WriteTimeout, r.answerDropped)
		}
	})
}

// answerDropped answers a request whose connection to the leader ended
// before its answer began (a leader killed or stepping down mid-request).
func (r *Relay) answerDropped(c net.Conn) error {
	r.refusedUnreachable.Add(1)
	_, err := c.Write(r.dropped)
	return err
}

// isLocal says whether the request's path is one this node answers.
func (r *Relay) isLocal(ctx *fasthttp.RequestCtx) bool {
	if r.o.Local == nil {
		return false
	}
	_, ok := r.local[string(ctx.Path())]
	return ok
}

func (r *Relay) dial(addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(r.base, dialTimeout)
	defer cancel()
	nd := &net.Dialer{Timeout: dialTimeout}
	if r.o.DialTLS != nil {
		td := &tls.Dialer{NetDialer: nd, Config: r.o.DialTLS}
		return td.DialContext(ctx, "tcp", addr)
	}
	return nd.DialContext(ctx, "tcp", addr)
}

// writeFirst writes the request read from the client to the far side,
// with the client's address added to X-Forwarded-For, and, when mark,
// marked as relayed (RelayedHeader).
func writeFirst(ctx *fasthttp.RequestCtx, far net.Conn, mark bool) (int64, error) {
	h := &ctx.Request.Header
	ip := clientIP(ctx.RemoteAddr())
	if ip != "" {
		fwd := ""
		for _, v := range h.PeekAll(fasthttp.HeaderXForwardedFor) {
			fwd += string(v) + ", "
		}
		h.Del(fasthttp.HeaderXForwardedFor)
		h.Set(fasthttp.HeaderXForwardedFor, fwd+ip)
	}
	if mark {
		h.Set(RelayedHeader, "1")
	}
	// fasthttp already answered 100 Continue and read the body.
	h.Del(fasthttp.HeaderExpect)
	if err := far.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
		return 0, fmt.Errorf("relay: write request: %w", err)
	}
	// fasthttp writes a request whose URI it parsed (a server always does)
	// with the URI rebuilt: this keeps its path as the client sent it, so
	// that the far side routes it as it would have unrelayed.
	ctx.Request.URI().DisablePathNormalizing = true
	n, err := ctx.Request.WriteTo(far)
	if err != nil {
		return n, fmt.Errorf("relay: write request: %w", err)
	}
	if err := far.SetWriteDeadline(time.Time{}); err != nil {
		return n, fmt.Errorf("relay: write request: %w", err)
	}
	return n, nil
}

func clientIP(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return ""
	}
	return host
}

// Errors answered to clients.
var (
	errNoLeader      = errors.New("no leader: no node of the cluster is leading; retry shortly")
	errUnreachable   = errors.New("leader unreachable: the leading node cannot be reached from this node; retry shortly")
	errLeaderDropped = errors.New("leader unreachable: the connection to the leading node ended before it answered; the request may or may not have reached it")
	errRelayLoop     = errors.New("no leader: this request was relayed to a node that is not leading; retry shortly")
	errShuttingDown  = errors.New("no leader: this node is shutting down; retry shortly")
	errNoHost        = errors.New("validation error: the request has no Host header, which a relayed request needs")
	errFull          = errors.New("service unavailable: this node relays as many connections as it may; retry shortly")
)

// refuse answers a request the relay could not pass on, and closes the
// connection after the answer: its client retries afresh, perhaps on
// another node.
func (r *Relay) refuse(ctx *fasthttp.RequestCtx, status int, code string, err error, n *atomic.Uint64) {
	n.Add(1)
	ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, "1")
	ctx.SetConnectionClose()
	writeError(ctx, status, code, err)
}

// serveError answers a request fasthttp could not read, as the gateway does.
func (r *Relay) serveError(ctx *fasthttp.RequestCtx, err error) {
	// A client still sending its request must get to read the refusal; one
	// that timed out is not sending. fasthttp refuses a body over the limit
	// by its announced length, before reading it: the client may still
	// have all of it to send.
	linger := int64(lingerBytes)
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		linger += int64(r.o.MaxBodyBytes)
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, gateway.CodeTooLarge, errors.New("payload too large: the request body is over the limit"))
	case errors.Is(err, fasthttp.ErrTimeout) || isTimeout(err):
		writeError(ctx, fasthttp.StatusRequestTimeout, gateway.CodeTimeout, errors.New("request timeout: the request was not read in time"))
		linger = 0
	case errors.As(err, new(*fasthttp.ErrSmallBuffer)):
		writeError(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, gateway.CodeHeadersTooLarge, fmt.Errorf("request header fields too large: at most %d bytes of request line and headers", r.o.MaxHeaderBytes))
	default:
		r.log.Debug("malformed request", "err", err)
		writeError(ctx, fasthttp.StatusBadRequest, gateway.CodeValidation, errors.New("validation error: malformed request"))
	}
	ctx.SetConnectionClose()
	if c, ok := ctx.Conn().(interface{ lingerOnClose(int64) }); ok && linger > 0 {
		c.lingerOnClose(linger)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// writeError answers in the /v0 error envelope.
func writeError(ctx *fasthttp.RequestCtx, status int, code string, err error) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBodyString(envelope(code, err.Error()))
}

// fasthttpLogger sends fasthttp's own messages to the relay's log.
type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Debug(fmt.Sprintf(format, args...), "component", "fasthttp")
}

// begin registers the splice of client and leader, so that Shutdown
// closes them; false once shutdown has begun. The splice is pending until
// fasthttp hands the connection over (unpend).
func (r *Relay) begin(client, leader net.Conn) (*splice, bool) {
	sp, ok := r.splices.add(client, leader)
	if !ok {
		return nil, false
	}
	r.mu.Lock()
	r.pending[client] = sp
	r.mu.Unlock()
	return sp, true
}

// unpend ends c's pending state and says whether it was pending: the one
// of the hijack handler and connState that finds it runs or ends the
// splice.
func (r *Relay) unpend(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.pending[c]
	delete(r.pending, c)
	return ok
}
