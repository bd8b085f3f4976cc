// Package protocol is the contract between the gateway and the protocol
// surfaces it serves beside its own /v0 API: the Agent Runtime surface
// (seed 001, /agent-runtime), the Agent Application Protocol (seed 002,
// /aap/v1) and the Runtime API (seeds 000 and 003, /runtime/v1).
//
// A surface is a projection of the same durable facts (executions,
// sessions, prompts, memory notes) onto one protocol's wire. It declares
// its routes; the gateway mounts them under the surface's prefix and does
// for them what it does for every route: request bounds, browser checks,
// authentication, metrics. A route's handler then speaks the protocol: it
// checks access with the one rule (auth.Principal.Authorize), calls the
// kernel, sessions, bridge or memory, and writes the protocol's answer,
// carrying streams on the gateway's stream engine through Gateway.
package protocol

import (
	"context"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/kernel"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/stream"
)

// Surface is one protocol served under its own prefix.
type Surface interface {
	// Mount is the prefix the routes are served under, such as "/aap/v1".
	Mount() string
	// Routes lists the surface's routes; the gateway reads it once.
	Routes() []Route
	// WriteError answers a request that the gateway refused before the
	// route ran (no or a bad credential, a body over the limit, a refused
	// origin), in the protocol's own error shape. status is the HTTP
	// status, code the gateway's machine code (UNAUTHORIZED, ...).
	WriteError(ctx *fasthttp.RequestCtx, status int, code, msg string)
	// Fail answers err, which a route's handler returned having written
	// nothing, with the status, code and wording the protocol gives it.
	// The gateway logs the answers that are 500.
	Fail(ctx *fasthttp.RequestCtx, err error)
}

// Route is one method and path below a surface's mount. A "{}" segment of
// Pattern captures a path parameter.
type Route struct {
	Method  string
	Pattern string
	// Stream marks a route that may hold the connection as a stream: new
	// ones are admitted under the gateway's connection rate.
	Stream bool
	// Handle answers the request. An error it returns means it has
	// written nothing: the gateway answers it with the surface's Fail.
	Handle func(*Request) error
}

// Request is one routed request.
type Request struct {
	Ctx *fasthttp.RequestCtx
	// Principal is the authenticated caller.
	Principal *auth.Principal
	// Params are the path parameters, in the order of the pattern's "{}".
	Params []string
	// Gateway offers what surfaces share with the /v0 API.
	Gateway Gateway
}

// Response answers a permission prompt.
type Response struct {
	// Decision is allow_once, allow_always or deny.
	Decision string
	Reason   string
	// ChannelID and NativePeerID name where the answer came from, for the
	// audit (the surface's own name when not a human channel's).
	ChannelID    string
	NativePeerID string
}

// Gateway is what a surface does through the gateway so that every door
// behaves the same: streams on the gateway's stream engine (its
// heartbeats, write timeout, shutdown and bookkeeping), and permission
// decisions through the one path every channel takes.
type Gateway interface {
	// Respond answers permission prompt actionID for p as every channel
	// does: the same access rule (another's prompt is not found), the
	// first answer wins (a late one fails with the recorded outcome), the
	// audit names r.ChannelID. after runs once the answer has been given.
	Respond(ctx context.Context, p *auth.Principal, actionID string, r Response) (rec bridge.Record, after kernel.After, err error)
	// SSE answers the request with a Server-Sent Events stream. open runs
	// on the stream's goroutine once the response has begun: it returns
	// the source, may set options (Final, Flushed), and returns what to
	// run once the stream has ended. presence closes the connection with
	// the stream, watching it for a client that leaves; without it the
	// connection stays for the client's next request.
	SSE(req *Request, kind string, r stream.Renderer, so stream.SSEOptions, presence bool, open func(*stream.Options) (stream.Source, func()))
	// WebSocket upgrades the request and carries a source on the socket:
	// each frame's Data as one text message. The socket closes with 1000
	// when the source ends, and with the gateway's codes otherwise (1001 at
	// shutdown, 4001 for a slow consumer, 4003 when the token expires).
	// Messages the client sends are read and dropped. A refused handshake
	// is answered before WebSocket returns.
	WebSocket(req *Request, kind string, r stream.Renderer, src stream.Source)
}
