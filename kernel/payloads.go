package kernel

import (
	"encoding/json"
	"time"
)

// Event payloads, with the wire's keys. Fields marked "extension" are not in
// the kernel API's payloads; they are additions that let the log alone
// rebuild the state after a restart, and clients ignore unknown keys.

type createdPayload struct {
	AgentID string            `json:"agent_id"`
	Input   json.RawMessage   `json:"input"`
	Labels  map[string]string `json:"labels"`
	Owner   string            `json:"owner,omitempty"`  // extension: the principal whose channels answer its prompts
	Tenant  string            `json:"tenant,omitempty"` // extension: the owner's tenant
	Tool    *ToolCall         `json:"tool,omitempty"`   // extension: the one step of a direct execution
	// Filed (extension) says the execution is filed in its durable
	// session, in the thread and turn named.
	Filed    bool   `json:"filed,omitempty"`
	ThreadID string `json:"thread_id,omitempty"`
	TurnID   string `json:"turn_id,omitempty"`
	// Ask (extension) lists tools a person must allow in this execution.
	Ask []string `json:"ask_tools,omitempty"`
}

type startedPayload struct {
	SessionID  string `json:"session_id"`
	ConsumerID string `json:"consumer_id"`
}

type blockedPayload struct {
	Reason    string          `json:"reason"`
	Ref       string          `json:"ref"`
	ToolID    string          `json:"tool_id,omitempty"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	Remote    bool            `json:"remote,omitempty"`
}

type reasonPayload struct {
	Reason string `json:"reason"`
}

type completedPayload struct {
	Output json.RawMessage `json:"output"`
}

type errorPayload struct {
	Error string `json:"error"`
}

type resetPayload struct {
	Reason     string `json:"reason"`
	FromStatus Status `json:"from_status"`
}

type intentAcceptedPayload struct {
	IntentType string `json:"intent_type"`
	Details    any    `json:"details,omitempty"`
}

type toolDetails struct {
	ToolID         string          `json:"tool_id"`
	Arguments      json.RawMessage `json:"arguments,omitempty"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	AllowedAlways  bool            `json:"allowed_always,omitempty"` // extension: allowed by an earlier allow_always
}

type intentDeniedPayload struct {
	IntentType     string          `json:"intent_type"`
	ToolID         string          `json:"tool_id,omitempty"`
	Arguments      json.RawMessage `json:"arguments,omitempty"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	Reason         string          `json:"reason"`
	RuleID         string          `json:"rule_id"`
}

type stepCreatedPayload struct {
	ToolID      string          `json:"tool_id"`
	ToolVersion int             `json:"tool_version"`
	Arguments   json.RawMessage `json:"arguments"`
	MaxAttempts int             `json:"max_attempts"`
	Attempt     int             `json:"attempt"`
	Deadline    time.Time       `json:"deadline"`
	Remote      bool            `json:"remote"`               // extension
	TimeoutMS   int64           `json:"timeout_ms,omitempty"` // extension: policy step timeout, reused by retries
	Account     string          `json:"account,omitempty"`    // extension: the connected account a runner must serve
}

type dispatchedPayload struct {
	RunnerID   string    `json:"runner_id"`
	JobID      string    `json:"job_id"`
	Deadline   time.Time `json:"deadline"`
	ConsumerID string    `json:"consumer_id,omitempty"` // extension: the runner connection that holds the job
}

type stepStartedPayload struct {
	RunnerID string `json:"runner_id"`
}

type stepCompletedPayload struct {
	Result json.RawMessage `json:"result"`
}

type stepFailedPayload struct {
	Error     string `json:"error"`
	Retryable bool   `json:"retryable"`
}

type stepRetriedPayload struct {
	NextAttempt int       `json:"next_attempt"`
	NotBefore   time.Time `json:"not_before"` // extension
}

type approvalRequiredPayload struct {
	ToolID    string          `json:"tool_id"`
	Arguments json.RawMessage `json:"arguments"`
	Remote    bool            `json:"remote"`
	Reason    string          `json:"reason"`
	RuleID    string          `json:"rule_id,omitempty"`    // extension
	ActionID  string          `json:"action_id,omitempty"`  // extension
	ExpiresAt *time.Time      `json:"expires_at,omitempty"` // extension
	OnExpiry  string          `json:"on_expiry,omitempty"`  // extension: deny or allow
}

// permissionRequestedPayload and permissionResolvedPayload are the seed 001
// permission family, written beside the kernel API's own events.
type permissionRequestedPayload struct {
	ActionID  string     `json:"action_id"`
	ToolID    string     `json:"tool_id"`
	ArgsHash  string     `json:"arguments_sha256"`
	Reason    string     `json:"reason"`
	RuleID    string     `json:"rule_id"`
	Owner     string     `json:"owner,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

type permissionResolvedPayload struct {
	ActionID  string     `json:"action_id"`
	Outcome   string     `json:"outcome"`
	Scope     string     `json:"scope,omitempty"`
	Reason    string     `json:"reason,omitempty"`
	DecidedBy *DecidedBy `json:"decided_by,omitempty"`
}

type signalPayload struct {
	SignalType string          `json:"signal_type"`
	Payload    json.RawMessage `json:"payload"`
}

type agentTimeoutPayload struct {
	SessionID string `json:"session_id"`
}

// Pushes to agents and runners.

type assignedPush struct {
	ExecutionID string            `json:"execution_id"`
	SessionID   string            `json:"session_id"`
	AgentID     string            `json:"agent_id"`
	Input       json.RawMessage   `json:"input"`
	Labels      map[string]string `json:"labels,omitempty"`
	History     []HistoryEntry    `json:"history,omitempty"`
}

type toolResultPush struct {
	ExecutionID string          `json:"execution_id"`
	StepID      string          `json:"step_id"`
	Status      string          `json:"status"`
	Result      json.RawMessage `json:"result,omitempty"`
	Error       string          `json:"error,omitempty"`
}

type approvalResolvedPush struct {
	Approved    bool   `json:"approved"`
	ExecutionID string `json:"execution_id"`
	SessionID   string `json:"session_id"`
	StepID      string `json:"step_id"`
	Outcome     string `json:"outcome,omitempty"` // extension: approved, denied or expired
	Reason      string `json:"reason,omitempty"`  // extension
}

type signalPush struct {
	ExecutionID string          `json:"execution_id"`
	SignalType  string          `json:"signal_type"`
	Payload     json.RawMessage `json:"payload"`
	Sequence    uint64          `json:"sequence,omitempty"` // extension: the signal.received event, to dedupe the push after a wait
}

type jobPush struct {
	ID          string          `json:"id"`
	ExecutionID string          `json:"execution_id"`
	StepID      string          `json:"step_id"`
	Attempt     int             `json:"attempt"`
	ToolID      string          `json:"tool_id"`
	ToolVersion int             `json:"tool_version"`
	Arguments   json.RawMessage `json:"arguments"`
	Deadline    time.Time       `json:"deadline"`
	NotBefore   time.Time       `json:"not_before"`
	Account     string          `json:"account,omitempty"` // extension: the connected account to run it with
}

// orNull keeps an absent user value as JSON null on the wire.
func orNull(v json.RawMessage) json.RawMessage {
	if len(v) == 0 {
		return json.RawMessage("null")
	}
	return v
}

// isNull reports whether v is absent or JSON null.
func isNull(v json.RawMessage) bool {
	return len(v) == 0 || string(v) == "null"
}
