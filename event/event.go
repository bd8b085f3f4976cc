// Package event defines the immutable facts Gatehouse records: the event
// envelope, its type names and its JSON form.
//
// One envelope serves two audiences. Its first fields are exactly those of the
// kernel API's event object (seed 004), so existing clients read it unchanged;
// the rest are the Agent Runtime envelope fields (seed 001), so a portable
// consumer can correlate events by session, run, step, tool call, action and
// trace without knowing the kernel API.
package event

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// SchemaVersion is the version of the envelope and payload shapes written by
// this build.
const SchemaVersion = 1

// Event is one immutable fact of an execution's log.
type Event struct {
	// ID identifies the event (a UUIDv7, so IDs sort by creation time).
	ID string `json:"id"`
	// ExecutionID is the execution whose log holds the event.
	ExecutionID string `json:"execution_id"`
	// StepID is set for step events and left out otherwise.
	StepID string `json:"step_id,omitempty"`
	// Type names the fact, for example "step.completed".
	Type string `json:"type"`
	// SchemaVersion is the envelope version the event was written with.
	SchemaVersion int `json:"schema_version"`
	// Timestamp is when the kernel recorded the fact (UTC).
	Timestamp time.Time `json:"timestamp"`
	// Payload is the type-specific body.
	Payload json.RawMessage `json:"payload"`
	// CausationID is the event that caused this one (itself when standalone).
	CausationID string `json:"causation_id"`
	// CorrelationID groups the events of one request.
	CorrelationID string `json:"correlation_id"`
	// IdempotencyKey is the producer's key for the request that wrote the event.
	IdempotencyKey string `json:"idempotency_key"`
	// Sequence is the event's position in its execution's log, from 1, without gaps.
	Sequence uint64 `json:"sequence"`

	// EventID repeats ID under the Agent Runtime field name.
	EventID string `json:"event_id"`
	// SessionID is the durable session (work container) the execution belongs to.
	SessionID string `json:"session_id,omitempty"`
	// RunID is the execution attempt; Gatehouse runs each execution once, so it is the execution id.
	RunID string `json:"run_id"`
	// ToolCallID is set on events about one tool invocation.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// ActionID is set on events about a pending human or policy decision.
	ActionID string `json:"action_id,omitempty"`
	// TraceID is the W3C trace id of the request that wrote the event, when one was given.
	TraceID string `json:"trace_id,omitempty"`
	// Refs point at large or externally owned facts instead of copying them.
	Refs []Ref `json:"refs,omitempty"`
}

// Ref is a stable reference to a fact kept outside the event.
type Ref struct {
	// Kind says what is referenced, for example "execution.input".
	Kind string `json:"kind"`
	// URI locates the referenced fact.
	URI string `json:"uri"`
	// Bytes is the size of the referenced value when known.
	Bytes int `json:"bytes,omitempty"`
}

// NewID returns a new time-ordered unique id (UUIDv7).
func NewID() string {
	id, err := uuid.NewV7()
	if err != nil {
		// NewV7 fails only when the system's random source fails; a random
		// UUIDv4 keeps ids unique in that case.
		return uuid.NewString()
	}
	return id.String()
}

// Terminal reports whether the event ends its execution.
func (e *Event) Terminal() bool { return IsTerminal(e.Type) }

// IsTerminal reports whether an event type ends its execution.
func IsTerminal(typ string) bool {
	switch typ {
	case ExecutionCompleted, ExecutionFailed, ExecutionCancelled:
		return true
	}
	return false
}
