package protocol

import (
	"errors"
	"fmt"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/session"
)

// StorageRetryAfter is the Retry-After of a 507 STORAGE_FULL answer on
// every wire that sends one: the store reads its free space a few times a
// second and resumes within one once there is room.
const StorageRetryAfter = "2"

// ErrInvalid marks a request a surface refuses as malformed: 400
// VALIDATION_ERROR on every wire. Invalid makes one with its message.
var ErrInvalid = errors.New("invalid request")

// Invalid returns an error that matches ErrInvalid and says msg.
func Invalid(msg string) error { return fmt.Errorf("%w: %s", ErrInvalid, msg) }

// Sentence is an error's message as every error answer carries it: one
// line. errors.Join puts a newline between the errors it joins, and
// libraries' messages (a validator's, a decoder's) may span lines; their
// lines are kept, each trimmed, separated by "; ". The gateway's and the
// surfaces' error mappings all word an error through it.
func Sentence(msg string) string {
	if !strings.ContainsAny(msg, "\r\n") {
		return msg
	}
	lines := strings.FieldsFunc(msg, func(r rune) bool { return r == '\n' || r == '\r' })
	kept := lines[:0]
	for _, l := range lines {
		if l = strings.TrimSpace(l); l != "" {
			kept = append(kept, l)
		}
	}
	return strings.Join(kept, "; ")
}

// CodeQuotaExceeded is the machine code of a refusal past a principal's
// quota (sessions, session.ErrQuota): 403 on every wire.
const CodeQuotaExceeded = "QUOTA_EXCEEDED"

// ErrorBody is the error answer of the kernel API, which seed 001's and
// AAP's surfaces share: a sentence and a machine code, and details where
// the error has some.
type ErrorBody struct {
	Error   string `json:"error"`
	Code    string `json:"code"`
	Details any    `json:"details,omitempty"`
}

// Failure is the answer to err in the ErrorBody envelope: its status
// (Status) and body, with a kernel.Error's details. An error Status does
// not know is "internal error", saying nothing of it.
func Failure(err error) (int, ErrorBody) {
	status, code, known := Status(err)
	if !known {
		return status, ErrorBody{Error: "internal error", Code: code}
	}
	body := ErrorBody{Error: Sentence(err.Error()), Code: code}
	var kerr *kernel.Error
	if errors.As(err, &kerr) {
		body.Details = kerr.Details
	}
	var qerr *session.QuotaError
	if errors.As(err, &qerr) {
		body.Details = qerr.Details()
	}
	return status, body
}

// WriteFailure answers a failure: status and body in j's JSON, with the
// Retry-After every wire sends with a 507.
func (j JSON) WriteFailure(ctx *fasthttp.RequestCtx, status int, body ErrorBody) {
	if status == fasthttp.StatusInsufficientStorage {
		ctx.Response.Header.Set("Retry-After", StorageRetryAfter)
	}
	j.Write(ctx, status, body)
}

// Status maps an error of the kernel, the sessions or the access rule to
// the HTTP status and machine code every surface answers it with, in its
// own envelope. known is false for any other error: a surface answers
// those 500 "internal error", saying nothing of them.
func Status(err error) (status int, code string, known bool) {
	switch {
	case errors.Is(err, ErrInvalid), errors.Is(err, session.ErrInvalid), errors.Is(err, kernel.ErrValidation):
		return fasthttp.StatusBadRequest, "VALIDATION_ERROR", true
	case errors.Is(err, session.ErrNotFound), errors.Is(err, kernel.ErrNotFound), errors.Is(err, auth.ErrHidden):
		return fasthttp.StatusNotFound, "NOT_FOUND", true
	case errors.Is(err, session.ErrCursorExpired):
		return fasthttp.StatusGone, "CURSOR_EXPIRED", true
	case errors.Is(err, session.ErrConflict), errors.Is(err, session.ErrArchived), errors.Is(err, kernel.ErrConflict):
		return fasthttp.StatusConflict, "CONFLICT", true
	case errors.Is(err, session.ErrQuota):
		return fasthttp.StatusForbidden, CodeQuotaExceeded, true
	case errors.Is(err, auth.ErrForbidden):
		return fasthttp.StatusForbidden, "FORBIDDEN", true
	case errors.Is(err, kernel.ErrStorageFull):
		return fasthttp.StatusInsufficientStorage, "STORAGE_FULL", true
	case errors.Is(err, kernel.ErrUnavailable), errors.Is(err, session.ErrClosed):
		return fasthttp.StatusServiceUnavailable, "SERVICE_UNAVAILABLE", true
	}
	return fasthttp.StatusInternalServerError, "INTERNAL_ERROR", false
}
