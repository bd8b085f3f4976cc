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
// carrying streams on the gateway's stream engine through Streams.
package protocol

import (
	"github.com/valyala/fasthttp"

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
}

// Route is one method and path below a surface's mount. A "{}" segment of
// Pattern captures a path parameter.
type Route struct {
	Method  string
	Pattern string
	// Stream marks a route that may hold the connection as a stream: new
	// ones are admitted under the gateway's connection rate.
	Stream bool
	Handle func(*Request)
}

// Request is one routed request.
type Request struct {
	Ctx *fasthttp.RequestCtx
	// Principal is the authenticated caller.
	Principal *auth.Principal
	// Params are the path parameters, in the order of the pattern's "{}".
	Params []string
	// Streams carries streams on this request's connection.
	Streams Streams
}

// Streams is how a surface carries a stream on the gateway's stream
// engine, with the gateway's heartbeats, write timeout, shutdown and
// bookkeeping.
type Streams interface {
	// SSE answers the request with a Server-Sent Events stream. open runs
	// on the stream's goroutine once the response has begun: it returns
	// the source, may set options (Final, Flushed), and returns what to
	// run once the stream has ended. presence closes the connection with
	// the stream, watching it for a client that leaves; without it the
	// connection stays for the client's next request.
	SSE(req *Request, kind string, r stream.Renderer, so stream.SSEOptions, presence bool, open func(*stream.Options) (stream.Source, func()))
}
