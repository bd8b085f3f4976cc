package protocol

import (
	"errors"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/session"
)

// StorageRetryAfter is the Retry-After of a 507 STORAGE_FULL answer on
// every wire that sends one: the store reads its free space a few times a
// second and resumes within one once there is room.
const StorageRetryAfter = "2"

// Status maps an error of the kernel, the sessions or the access rule to
// the HTTP status and machine code every surface answers it with, in its
// own envelope. known is false for any other error: a surface answers
// those 500 "internal error", saying nothing of them.
func Status(err error) (status int, code string, known bool) {
	switch {
	case errors.Is(err, session.ErrInvalid), errors.Is(err, kernel.ErrValidation):
		return fasthttp.StatusBadRequest, "VALIDATION_ERROR", true
	case errors.Is(err, session.ErrNotFound), errors.Is(err, kernel.ErrNotFound), errors.Is(err, auth.ErrHidden):
		return fasthttp.StatusNotFound, "NOT_FOUND", true
	case errors.Is(err, session.ErrCursorExpired):
		return fasthttp.StatusGone, "CURSOR_EXPIRED", true
	case errors.Is(err, session.ErrConflict), errors.Is(err, session.ErrArchived), errors.Is(err, kernel.ErrConflict):
		return fasthttp.StatusConflict, "CONFLICT", true
	case errors.Is(err, auth.ErrForbidden):
		return fasthttp.StatusForbidden, "FORBIDDEN", true
	case errors.Is(err, kernel.ErrStorageFull):
		return fasthttp.StatusInsufficientStorage, "STORAGE_FULL", true
	case errors.Is(err, kernel.ErrUnavailable), errors.Is(err, session.ErrClosed):
		return fasthttp.StatusServiceUnavailable, "SERVICE_UNAVAILABLE", true
	}
	return fasthttp.StatusInternalServerError, "INTERNAL_ERROR", false
}
