package protocol_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/protocol"
	"github.com/gatehouse-dev/gatehouse/session"
)

func TestStatus(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		code   string
		known  bool
	}{
		{kernel.ErrValidation, 400, "VALIDATION_ERROR", true},
		{protocol.Invalid("limit must be a number"), 400, "VALIDATION_ERROR", true},
		{fmt.Errorf("turn: %w", session.ErrInvalid), 400, "VALIDATION_ERROR", true},
		{kernel.ErrNotFound, 404, "NOT_FOUND", true},
		{auth.ErrHidden, 404, "NOT_FOUND", true},
		{session.ErrCursorExpired, 410, "CURSOR_EXPIRED", true},
		{session.ErrArchived, 409, "CONFLICT", true},
		{kernel.ErrConflict, 409, "CONFLICT", true},
		{auth.ErrForbidden, 403, "FORBIDDEN", true},
		{kernel.ErrStorageFull, 507, "STORAGE_FULL", true},
		{errors.Join(kernel.ErrStorageFull, kernel.ErrUnavailable), 507, "STORAGE_FULL", true},
		{session.ErrClosed, 503, "SERVICE_UNAVAILABLE", true},
		{errors.New("disk on fire"), 500, "INTERNAL_ERROR", false},
	} {
		status, code, known := protocol.Status(tc.err)
		if status != tc.status || code != tc.code || known != tc.known {
			t.Errorf("Status(%v) = %d %s %v, want %d %s %v", tc.err, status, code, known, tc.status, tc.code, tc.known)
		}
	}
}

// TestFailure checks the envelope every surface but the Runtime API
// answers with: a known error says itself, any other says nothing of
// itself.
func TestFailure(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		body   protocol.ErrorBody
	}{
		{protocol.Invalid("cursor: not a number"), 400, protocol.ErrorBody{Error: "invalid request: cursor: not a number", Code: "VALIDATION_ERROR"}},
		{errors.Join(kernel.ErrNotFound, errors.New("unknown action a1")), 404, protocol.ErrorBody{Error: "not found; unknown action a1", Code: "NOT_FOUND"}},
		{fmt.Errorf("thread t1: %w", session.ErrNotFound), 404, protocol.ErrorBody{Error: "thread t1: session: not found", Code: "NOT_FOUND"}},
		{errors.New("open /secret/path: permission denied"), 500, protocol.ErrorBody{Error: "internal error", Code: "INTERNAL_ERROR"}},
	} {
		status, body := protocol.Failure(tc.err)
		if status != tc.status || body != tc.body {
			t.Errorf("Failure(%q) = %d %+v, want %d %+v", tc.err, status, body, tc.status, tc.body)
		}
	}
}

// TestSentenceIsOneLine: what errors.Join and multi-line library messages
// make of an error's text is answered on one line.
func TestSentenceIsOneLine(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"not found: session s1", "not found: session s1"},
		{errors.Join(errors.New("invalid request"), errors.New("the last message must be a user message")).Error(), "invalid request; the last message must be a user message"},
		{"jsonschema validation failed\n  - at '/a': want string\r\n\n  - at '/b': missing", "jsonschema validation failed; - at '/a': want string; - at '/b': missing"},
		{"\n", ""},
	} {
		if got := protocol.Sentence(tc.in); got != tc.want {
			t.Errorf("Sentence(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
