package relay

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/internal/option"
)

// The codes of a hub's refusals of requests for an edge box, in the /v0
// error envelope.
const (
	// CodeEdgeNotLinked: no edge box of that name is linked to the hub now
	// (503, Retry-After: 1); the link may be down, or the name unknown.
	CodeEdgeNotLinked = "EDGE_NOT_LINKED"
	// CodeEdgeUnreachable: the edge box is linked but did not take the
	// connection in time, refused it, or the request could not be written
	// to it (502, Retry-After: 1).
	CodeEdgeUnreachable = "EDGE_UNREACHABLE"
)

// ErrEdgeNotLinked is what EdgeOptions.Dial wraps when no edge box of the
// name listens: the answer is then 503 CodeEdgeNotLinked rather than 502.
var ErrEdgeNotLinked = errors.New("edge not linked")

// EdgeOptions configure an Edges. Dial is required.
type EdgeOptions struct {
	// Dial connects to the gateway of the edge box named name.
	Dial func(ctx context.Context, name string) (net.Conn, error)
	// DialTimeout bounds Dial; zero: 3s.
	DialTimeout time.Duration
	// WriteTimeout bounds a write to either side that makes no progress;
	// zero: the gateway's.
	WriteTimeout time.Duration
	// MaxConns bounds the connections passed on at once; past it a request
	// for an edge box gets 503 SERVICE_UNAVAILABLE (zero: the gateway's
	// MaxConns). A connection passed on no longer counts against the
	// gateway's own bound, which counts the requests being read.
	MaxConns int
	Logger   *slog.Logger
}

// EdgeStats are an Edges' counters since NewEdges, for metrics.
type EdgeStats struct {
	// Open is the number of connections passed on now; Passed counts them
	// all.
	Open   int64
	Passed uint64
	// ToEdge and ToClient count the bytes passed each way.
	ToEdge, ToClient uint64
	// NotLinked and Unreachable count the refusals (503 and 502), Full
	// those past MaxConns (503).
	NotLinked, Unreachable, Full uint64
}

// Edges passes a hub's client connections on to the edge boxes linked to
// it. The hub's gateway reads a request for an edge box itself, with its
// own bounds, and hands it to Pass, which dials the edge box, writes the
// request there and splices the two connections: every later request of
// that connection, and a stream or WebSocket it opens, goes to the same
// edge box. The edge box authenticates and serves them as its own
// clients.
type Edges struct {
	o       EdgeOptions
	log     *slog.Logger
	splices splices
	// base is cancelled when shutdown begins: dials in flight give up.
	base   context.Context
	cancel context.CancelFunc

	passed, toEdge, toClient atomic.Uint64
	notLinked, unreachable   atomic.Uint64
	full                     atomic.Uint64

	// dropped is the answer to a request whose edge box connection ended
	// before any byte of its answer (502 CodeEdgeUnreachable).
	dropped []byte
}

// unclaimedAfter bounds how long a dialed edge connection waits for
// fasthttp to hand the client's over; fasthttp skips the hand-over only
// when the client's connection has already failed.
const unclaimedAfter = 10 * time.Second

// NewEdges builds an Edges; EdgeOptions.Dial is required.
func NewEdges(o EdgeOptions) *Edges {
	option.Default(&o.DialTimeout, dialTimeout)
	option.Default(&o.WriteTimeout, gateway.Defaults().WriteTimeout)
	option.Default(&o.MaxConns, gateway.Defaults().MaxConns)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	e := &Edges{o: o, log: o.Logger, dropped: droppedAnswer(CodeEdgeUnreachable, errEdgeDropped)}
	e.base, e.cancel = context.WithCancel(context.Background())
	return e
}

// Stats returns the counters.
func (e *Edges) Stats() EdgeStats {
	return EdgeStats{
		Open: e.splices.open.Load(), Passed: e.passed.Load(),
		ToEdge: e.toEdge.Load(), ToClient: e.toClient.Load(),
		NotLinked: e.notLinked.Load(), Unreachable: e.unreachable.Load(), Full: e.full.Load(),
	}
}

// Pass answers ctx by passing its connection on to the edge box named
// name, or refuses it in the /v0 error envelope when the edge box cannot
// be reached.
func (e *Edges) Pass(ctx *fasthttp.RequestCtx, name string) {
	if e.splices.open.Load() >= int64(e.o.MaxConns) {
		e.refuse(ctx, fasthttp.StatusServiceUnavailable, gateway.CodeUnavailable, errHubFull, &e.full)
		return
	}
	sp, err := e.reach(ctx, name)
	switch {
	case errors.Is(err, ErrEdgeNotLinked):
		e.refuse(ctx, fasthttp.StatusServiceUnavailable, CodeEdgeNotLinked, errEdgeNotLinked, &e.notLinked)
		return
	case errors.Is(err, errSplicesClosing):
		e.refuse(ctx, fasthttp.StatusServiceUnavailable, gateway.CodeUnavailable, errHubShuttingDown, nil)
		return
	case err != nil:
		// At debug level: clients set the pace of these, and
		// gatehouse_edge_unreachable_total counts them for the operator.
		e.log.Debug("edge unreachable", "edge", name, "err", err)
		e.refuse(ctx, fasthttp.StatusBadGateway, CodeEdgeUnreachable, errEdgeUnreachable, &e.unreachable)
		return
	}
	// The request is the edge box's to answer now. sp is not yet shared.
	sp.waiting = true
	e.passed.Add(1)
	var claimed atomic.Bool
	unclaimed := time.AfterFunc(unclaimedAfter, func() {
		if claimed.CompareAndSwap(false, true) {
			e.splices.finish(sp)
		}
	})
	// No answer of this node's: the edge box's comes through the splice.
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		unclaimed.Stop()
		if claimed.CompareAndSwap(false, true) {
			e.splices.run(sp, c, &e.toEdge, &e.toClient, e.o.WriteTimeout, e.answerDropped)
		} else {
			_ = c.Close()
		}
	})
}

// reach dials the edge box named name and writes ctx's request to it, and
// returns the splice of the client's connection and the edge box's. A
// connection that failed before it took any byte of the request, such as a
// tunnel reset as it opened, is dialed once more: the edge box cannot have
// seen the request, so sending it again cannot repeat it. A connection
// that took some may have passed them on, and is not retried.
func (e *Edges) reach(ctx *fasthttp.RequestCtx, name string) (*splice, error) {
	for attempt := 1; ; attempt++ {
		// Not ctx: fasthttp reuses a RequestCtx, which makes it no parent
		// for a context that may outlive the request.
		dctx, cancel := context.WithTimeout(e.base, e.o.DialTimeout)
		far, err := e.o.Dial(dctx, name)
		cancel()
		if err != nil {
			return nil, err
		}
		sp, ok := e.splices.add(ctx.Conn(), far)
		if !ok {
			_ = far.Close()
			return nil, errSplicesClosing
		}
		n, err := writeFirst(ctx, far, false)
		e.toEdge.Add(uint64(n))
		if err == nil {
			return sp, nil
		}
		e.splices.drop(sp)
		if n > 0 || attempt == 2 {
			return nil, err
		}
		e.log.Debug("edge connection failed before the request; dialing again", "edge", name, "err", err)
	}
}

// answerDropped answers, on the client's connection c, a request whose
// edge box connection ended before any byte of its answer.
func (e *Edges) answerDropped(c net.Conn) error {
	e.unreachable.Add(1)
	_, err := c.Write(e.dropped)
	return err
}

// droppedAnswer is the 502 answer, whole, that closes the connection, for
// a request whose connection to the far side (an edge box, a leader)
// ended before it answered.
func droppedAnswer(code string, err error) []byte {
	var r fasthttp.Response
	r.SetStatusCode(fasthttp.StatusBadGateway)
	r.Header.SetServer("gatehouse")
	r.Header.SetContentType("application/json")
	r.Header.Set(fasthttp.HeaderRetryAfter, "1")
	r.SetConnectionClose()
	r.SetBodyString(envelope(code, err.Error()))
	return []byte(r.String())
}

// Shutdown closes every connection passed on (their clients reconnect)
// and waits, bounded by ctx, for the copies to end.
func (e *Edges) Shutdown(ctx context.Context) error {
	e.splices.closeAll()
	e.cancel()
	select {
	case <-e.splices.wait():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Errors answered to clients of a hub.
var (
	errEdgeNotLinked   = errors.New("edge not linked: no edge box of this name is linked to this hub now; retry shortly")
	errEdgeUnreachable = errors.New("edge unreachable: the edge box did not take the connection; retry shortly")
	errEdgeDropped     = errors.New("edge unreachable: the connection to the edge box ended before it answered; the request may or may not have reached it")
	errHubFull         = errors.New("service unavailable: this hub passes on as many connections to edge boxes as it may; retry shortly")
	errHubShuttingDown = errors.New("service unavailable: this node is shutting down; retry shortly")
	// errSplicesClosing: shutdown has begun and no connection is passed
	// on any more.
	errSplicesClosing = errors.New("relay: shutting down")
)

// refuse answers a request that could not be passed on, counting it into
// n unless nil, and closes the connection after the answer.
func (e *Edges) refuse(ctx *fasthttp.RequestCtx, status int, code string, err error, n *atomic.Uint64) {
	if n != nil {
		n.Add(1)
	}
	ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, "1")
	ctx.SetConnectionClose()
	writeError(ctx, status, code, err)
}
