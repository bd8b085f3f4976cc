package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Sentinel errors matched by an *APIError through errors.Is, one per error
// code of the kernel API, so callers can branch without parsing messages.
var (
	// ErrValidation matches 400 VALIDATION_ERROR answers.
	ErrValidation = errors.New("validation error")
	// ErrUnauthorized matches 401 UNAUTHORIZED answers: a missing or wrong
	// token, or an agent session that is unknown or expired.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrForbidden matches 403 FORBIDDEN answers.
	ErrForbidden = errors.New("forbidden")
	// ErrNotFound matches 404 NOT_FOUND answers.
	ErrNotFound = errors.New("not found")
	// ErrConflict matches 409 CONFLICT answers, such as a change to a
	// finished execution or a result for a step already resolved.
	ErrConflict = errors.New("conflict")
	// ErrRateLimited matches 429 RATE_LIMITED answers.
	ErrRateLimited = errors.New("rate limited")
	// ErrInternal matches 500 INTERNAL_ERROR answers.
	ErrInternal = errors.New("internal error")
	// ErrUnavailable matches 503 SERVICE_UNAVAILABLE answers.
	ErrUnavailable = errors.New("service unavailable")
	// ErrStorageFull matches 507 STORAGE_FULL answers: the gateway is
	// short of disk space, and new work waits until it has room again.
	ErrStorageFull = errors.New("storage full")

	// ErrGap is returned by StreamExecution when the server skipped part of
	// an execution's history (for example because it was deleted): the
	// caller must re-read the execution rather than trust the stream.
	ErrGap = errors.New("client: gap in the event stream")
)

// codeSentinels maps the kernel API's error codes to the sentinels.
var codeSentinels = map[string]error{
	"VALIDATION_ERROR":    ErrValidation,
	"UNAUTHORIZED":        ErrUnauthorized,
	"FORBIDDEN":           ErrForbidden,
	"NOT_FOUND":           ErrNotFound,
	"CONFLICT":            ErrConflict,
	"RATE_LIMITED":        ErrRateLimited,
	"INTERNAL_ERROR":      ErrInternal,
	"SERVICE_UNAVAILABLE": ErrUnavailable,
	"STORAGE_FULL":        ErrStorageFull,
}

// statusSentinels is the fallback for answers without a known code, such as
// the router's plain-text 404 and 405.
var statusSentinels = map[int]error{
	http.StatusBadRequest:          ErrValidation,
	http.StatusUnauthorized:        ErrUnauthorized,
	http.StatusForbidden:           ErrForbidden,
	http.StatusNotFound:            ErrNotFound,
	http.StatusConflict:            ErrConflict,
	http.StatusTooManyRequests:     ErrRateLimited,
	http.StatusInternalServerError: ErrInternal,
	http.StatusServiceUnavailable:  ErrUnavailable,
	http.StatusInsufficientStorage: ErrStorageFull,
}

// APIError is a non-2xx answer of the kernel API. It matches the sentinel of
// its code with errors.Is, e.g. errors.Is(err, client.ErrNotFound).
type APIError struct {
	// Status is the HTTP status code.
	Status int
	// Code is the machine-readable code, e.g. "NOT_FOUND"; empty when the
	// body was not a JSON error.
	Code string
	// Message is the server's human-readable message.
	Message string
	// Details holds the optional structured details, or nil.
	Details json.RawMessage
}

// Error formats the status, code and message, under the package's name
// as its other errors are: a program that prefixes its own name to what it
// prints would otherwise print "gatehouse: gatehouse: ".
func (e *APIError) Error() string {
	code := e.Code
	if code == "" {
		code = http.StatusText(e.Status)
	}
	return fmt.Sprintf("client: %d %s: %s", e.Status, code, e.Message)
}

// Is reports whether target is the sentinel for e's code (or, without a
// known code, for its status).
func (e *APIError) Is(target error) bool {
	if s, ok := codeSentinels[e.Code]; ok {
		return s == target
	}
	return statusSentinels[e.Status] == target
}

// PolicyError reports a tool invocation the kernel refused: denied or rate
// limited by policy, or denied by a human approver.
type PolicyError struct {
	// ToolID is the tool that was refused.
	ToolID string
	// RuleID is the policy rule that decided, when the kernel named one.
	RuleID string
	// Reason is the kernel's or the approver's explanation.
	Reason string
	// Approval is true when a human approver denied the call.
	Approval bool
}

// Error describes the refusal.
func (e *PolicyError) Error() string {
	if e.Approval {
		return fmt.Sprintf("tool %s: approval denied: %s", e.ToolID, e.Reason)
	}
	return fmt.Sprintf("tool %s: %s", e.ToolID, e.Reason)
}

// newPolicyError builds a PolicyError from the kernel's accepted:false text,
// which ends in "(rule: <id>)".
func newPolicyError(toolID, msg string) *PolicyError {
	e := &PolicyError{ToolID: toolID, Reason: msg}
	if i := strings.LastIndex(msg, "(rule: "); i >= 0 && strings.HasSuffix(msg, ")") {
		e.RuleID = msg[i+len("(rule: ") : len(msg)-1]
	}
	return e
}

// ToolError reports a tool that ran and failed, as the kernel's tool.result
// told the agent.
type ToolError struct {
	// ToolID is the tool that failed.
	ToolID string
	// StepID is the kernel's step for the call.
	StepID string
	// Message is the failure reported by the tool.
	Message string
	// Result is data the tool sent along with its failure, or nil.
	Result json.RawMessage
}

// Error describes the failure.
func (e *ToolError) Error() string {
	return fmt.Sprintf("tool %s failed: %s", e.ToolID, e.Message)
}

// Retryable marks a tool error as transient: a runner reports it with
// retryable:true so the kernel tries the job again (within the step's
// attempts). It returns nil for a nil err.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return &retryableError{err}
}

// IsRetryable reports whether err, or an error it wraps, was marked with
// Retryable.
func IsRetryable(err error) bool {
	var r *retryableError
	return errors.As(err, &r)
}

type retryableError struct{ err error }

func (r *retryableError) Error() string { return r.err.Error() }
func (r *retryableError) Unwrap() error { return r.err }
