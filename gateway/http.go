package gateway

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/protocol"
	"github.com/gatehouse-dev/gatehouse/session"
)

// Error codes of the kernel API.
const (
	CodeNotFound      = "NOT_FOUND"
	CodeConflict      = "CONFLICT"
	CodeValidation    = "VALIDATION_ERROR"
	CodeForbidden     = "FORBIDDEN"
	CodeUnauthorized  = "UNAUTHORIZED"
	CodeRateLimited   = "RATE_LIMITED"
	CodeInternal      = "INTERNAL_ERROR"
	CodeUnavailable   = "SERVICE_UNAVAILABLE"
	CodeStorageFull   = "STORAGE_FULL"
	CodeTooLarge      = "PAYLOAD_TOO_LARGE"
	CodeMethodMissing = "METHOD_NOT_ALLOWED"
	// CodeToolNotAllowed refuses a runner's declaration of a tool it is
	// not trusted with, or that a built-in runner serves (403).
	CodeToolNotAllowed = "TOOL_NOT_ALLOWED"
)

// statusOf maps an error to its HTTP status, code and client message,
// one sentence on one line (protocol.Sentence).
func statusOf(err error) (int, protocol.ErrorBody) {
	status, body := classify(err)
	body.Error = protocol.Sentence(body.Error)
	return status, body
}

// classify maps an error to its HTTP status, code and client message.
func classify(err error) (int, protocol.ErrorBody) {
	var kerr *kernel.Error
	details := any(nil)
	if errors.As(err, &kerr) {
		details = kerr.Details
	}
	var gerr *guardError
	if errors.As(err, &gerr) {
		return gerr.status, protocol.ErrorBody{Error: gerr.Error(), Code: gerr.code}
	}
	var derr interface{ Details() any }
	if errors.As(err, &derr) {
		details = derr.Details()
	}
	var serr *kernel.SpaceError
	if errors.As(err, &serr) {
		details = spaceDetails(serr.Space)
	}
	switch {
	case errors.Is(err, kernel.ErrStorageFull):
		return fasthttp.StatusInsufficientStorage, protocol.ErrorBody{Error: err.Error(), Code: CodeStorageFull, Details: details}
	case errors.Is(err, kernel.ErrValidation), errors.Is(err, session.ErrInvalid):
		return fasthttp.StatusBadRequest, protocol.ErrorBody{Error: err.Error(), Code: CodeValidation, Details: details}
	case errors.Is(err, kernel.ErrNotFound), errors.Is(err, session.ErrNotFound):
		return fasthttp.StatusNotFound, protocol.ErrorBody{Error: err.Error(), Code: CodeNotFound, Details: details}
	case errors.Is(err, kernel.ErrConflict), errors.Is(err, session.ErrConflict), errors.Is(err, session.ErrArchived):
		return fasthttp.StatusConflict, protocol.ErrorBody{Error: err.Error(), Code: CodeConflict, Details: details}
	case errors.Is(err, kernel.ErrUnauthorized):
		return fasthttp.StatusUnauthorized, protocol.ErrorBody{Error: err.Error(), Code: CodeUnauthorized, Details: details}
	case errors.Is(err, kernel.ErrUnavailable):
		return fasthttp.StatusServiceUnavailable, protocol.ErrorBody{Error: err.Error(), Code: CodeUnavailable, Details: details}
	case errors.Is(err, session.ErrQuota):
		return fasthttp.StatusForbidden, protocol.ErrorBody{Error: err.Error(), Code: protocol.CodeQuotaExceeded, Details: details}
	case errors.Is(err, auth.ErrToolNotAllowed):
		return fasthttp.StatusForbidden, protocol.ErrorBody{Error: err.Error(), Code: CodeToolNotAllowed}
	case errors.Is(err, auth.ErrForbidden):
		// The error says "forbidden: …" itself.
		return fasthttp.StatusForbidden, protocol.ErrorBody{Error: err.Error(), Code: CodeForbidden, Details: details}
	case errors.Is(err, auth.ErrMissingToken), errors.Is(err, auth.ErrMalformed),
		errors.Is(err, auth.ErrInvalidToken), errors.Is(err, auth.ErrExpiredToken):
		return fasthttp.StatusUnauthorized, protocol.ErrorBody{Error: "unauthorized: " + err.Error(), Code: CodeUnauthorized}
	}
	return fasthttp.StatusInternalServerError, protocol.ErrorBody{Error: "internal error", Code: CodeInternal}
}

// spaceDetails is the details of a STORAGE_FULL answer.
func spaceDetails(sp kernel.Space) map[string]any {
	return map[string]any{
		"state": sp.State.String(), "room_bytes": sp.Room(), "free_bytes": sp.Free, "used_bytes": sp.Used,
		"budget_bytes": sp.Budget, "low_water_bytes": sp.LowWater, "reserve_bytes": sp.Reserve,
	}
}

// bufPool recycles response encoding buffers.
type bufPool struct{ p sync.Pool }

func (b *bufPool) get() *bytes.Buffer {
	if v := b.p.Get(); v != nil {
		buf := v.(*bytes.Buffer)
		buf.Reset()
		return buf
	}
	return new(bytes.Buffer)
}

func (b *bufPool) put(buf *bytes.Buffer) {
	if buf.Cap() <= 64<<10 {
		b.p.Put(buf)
	}
}

// writeJSON answers with v as compact JSON and a trailing newline, the
// kernel API's format.
func (s *Server) writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	s.writeJSONThen(ctx, status, v, nil)
}

// writeJSONThen answers with v and runs after once the answer has been
// written to the connection: pushes caused by a request must not overtake
// its response.
func (s *Server) writeJSONThen(ctx *fasthttp.RequestCtx, status int, v any, after kernel.After) {
	if err := (protocol.JSON{Newline: true, Fallback: `{"error":"internal error","code":"INTERNAL_ERROR"}`}).Write(ctx, status, v); err != nil {
		s.log.Error("encode response", "err", err)
		after.Run()
		return
	}
	if after == nil {
		return
	}
	body := append([]byte(nil), ctx.Response.Body()...)
	t := &thenReader{then: after, conn: ctx.Conn()}
	t.r.Reset(body)
	ctx.Response.SetBodyStream(t, len(body))
}

// thenReader hands then to its connection when fasthttp closes the body
// stream, which it does once the answer is in the connection's buffer (or
// dropped): the connection runs it right after the write that flushes
// that buffer, on its own goroutine (see answerConn).
type thenReader struct {
	r    bytes.Reader // in the struct: one allocation for both
	then kernel.After
	conn net.Conn
	once sync.Once
}

func (t *thenReader) Read(p []byte) (int, error) { return t.r.Read(p) }

func (t *thenReader) Close() error {
	t.once.Do(func() {
		if c, ok := t.conn.(answerConn); ok {
			c.afterWrite(t.then.Run)
			return
		}
		// A connection Serve did not accept: the answer's flush follows
		// this call on the same goroutine.
		go t.then.Run()
	})
	return nil
}

var _ io.ReadCloser = (*thenReader)(nil)

// writeError answers with the JSON error for err.
func (s *Server) writeError(ctx *fasthttp.RequestCtx, err error) {
	status, body := statusOf(err)
	if status == fasthttp.StatusInternalServerError {
		s.logFailed(ctx, err)
	}
	switch status {
	case fasthttp.StatusServiceUnavailable:
		ctx.Response.Header.Set("Retry-After", "1")
	case fasthttp.StatusInsufficientStorage:
		ctx.Response.Header.Set("Retry-After", protocol.StorageRetryAfter)
	}
	s.writeJSON(ctx, status, body)
}

// logFailed logs a request answered 500, whose error the client is not
// told.
func (s *Server) logFailed(ctx *fasthttp.RequestCtx, err error) {
	s.log.Error("request failed", "method", string(ctx.Method()), "path", string(ctx.Path()), "err", err)
}

// decode reads the request body as one JSON value into v.
func decode(ctx *fasthttp.RequestCtx, v any, max int) error {
	return decodeBody(ctx.PostBody(), v, max)
}

// kernelValidation makes a validation error that maps like the kernel's.
func kernelValidation(msg string) error {
	return &gatewayError{kind: kernel.ErrValidation, msg: "validation error: " + msg}
}

// notFound makes a not-found error that maps like the kernel's.
func notFound(what, id string) error {
	return &gatewayError{kind: kernel.ErrNotFound, msg: "not found: " + what + " " + id}
}

// gatewayError is an error the gateway itself raises, matching one of the
// kernel's sentinels so that it maps to the same status and code.
type gatewayError struct {
	kind error
	msg  string
}

func (e *gatewayError) Error() string { return e.msg }
func (e *gatewayError) Unwrap() error { return e.kind }

// principalKey is the request's user-value key for the caller.
type principalKey struct{}

// meta reads the caller, who owns what the request creates, and the tracing
// and idempotency headers of a request.
func meta(ctx *fasthttp.RequestCtx) kernel.Meta {
	m := kernel.Meta{IdempotencyKey: string(ctx.Request.Header.Peek("Idempotency-Key"))}
	if p, _ := ctx.UserValue(principalKey{}).(*auth.Principal); p != nil {
		m.Principal, m.Tenant = p.Subject, p.Tenant
	}
	m.TraceID = traceID(ctx.Request.Header.Peek("traceparent"))
	return m
}

// traceID extracts the trace id of a W3C traceparent header
// ("00-<32 hex>-<16 hex>-<2 hex>"); an invalid header is ignored, as the
// Trace Context specification requires.
func traceID(h []byte) string {
	// Cut rather than split: most requests carry no header, and a split
	// allocates its parts even then.
	version, rest, ok1 := bytes.Cut(h, []byte("-"))
	id, rest, ok2 := bytes.Cut(rest, []byte("-"))
	parent, _, ok3 := bytes.Cut(rest, []byte("-"))
	if !ok1 || !ok2 || !ok3 || len(version) != 2 || string(version) == "ff" || len(id) != 32 || len(parent) != 16 {
		return ""
	}
	zero := true
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			// Not hex, or upper-case hex.
			return ""
		}
		zero = zero && c == '0'
	}
	if zero {
		return ""
	}
	return string(id)
}

// EchoRequestID sets the response's X-Request-ID as every gateway answer
// has it: the request's when it is sane, a fresh one otherwise. A
// follower's relay sets it so on the answers it gives itself.
func EchoRequestID(ctx *fasthttp.RequestCtx) {
	id := ctx.Request.Header.Peek("X-Request-ID")
	if len(id) == 0 || len(id) > 128 || bytes.ContainsAny(id, "\r\n") {
		ctx.Response.Header.Set("X-Request-ID", event.NewID())
		return
	}
	ctx.Response.Header.SetBytesV("X-Request-ID", id)
}
