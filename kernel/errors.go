package kernel

import (
	"errors"
	"fmt"

	"github.com/gatehouse-dev/gatehouse/store"
)

// Sentinel errors. Every error the kernel returns to a caller matches exactly
// one of them with errors.Is; the gateway maps them to status codes.
var (
	// ErrNotFound: the execution, step or runner does not exist.
	ErrNotFound = errors.New("not found")
	// ErrValidation: the request is malformed or breaks a limit.
	ErrValidation = errors.New("validation error")
	// ErrConflict: the request does not fit the current state.
	ErrConflict = errors.New("conflict")
	// ErrUnauthorized: the agent's lease (the wire's session_id) is unknown or expired.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrUnavailable: the store cannot take writes; retry later.
	ErrUnavailable = errors.New("service unavailable")
	// ErrStorageFull: the data folder is short of room; new work waits
	// until there is room again (see store.Space). It is
	// store.ErrStorageFull: such errors are *store.SpaceError.
	ErrStorageFull = store.ErrStorageFull
)

// SpaceError is the error of work refused for want of room: it matches
// ErrStorageFull and carries the data folder's Space. It is the store's
// own error, named here so that the kernel's callers (the gateway, the
// protocol surfaces) read the figures without reaching into the store.
type SpaceError = store.SpaceError

// Space is the room of the data folder that a SpaceError reports.
type Space = store.Space

// Error is a kernel error with the wire message and optional details.
type Error struct {
	kind    error
	msg     string
	Details any
}

// Error returns the message clients see.
func (e *Error) Error() string { return e.msg }

// Unwrap returns the sentinel the error matches.
func (e *Error) Unwrap() error { return e.kind }

func newErr(kind error, format string, args ...any) *Error {
	return &Error{kind: kind, msg: fmt.Sprintf(format, args...)}
}

func notFound(what, id string) *Error {
	return newErr(ErrNotFound, "not found: %s %s", what, id)
}

func invalid(format string, args ...any) *Error {
	return newErr(ErrValidation, "validation error: "+format, args...)
}

func conflict(format string, args ...any) *Error {
	return newErr(ErrConflict, format, args...)
}

func terminalConflict(ex *Execution) *Error {
	e := newErr(ErrConflict, "execution is in terminal state: execution %s is already %s", ex.ID, ex.Status)
	e.Details = map[string]any{"status": ex.Status}
	return e
}
