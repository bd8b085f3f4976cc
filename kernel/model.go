package kernel

import (
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"
)

// Status is an execution's state.
type Status string

// Execution states, per the kernel API.
const (
	StatusPending   Status = "pending"
	StatusRunning   Status = "running"
	StatusBlocked   Status = "blocked"
	StatusCompleted Status = "completed"
	StatusFailed    Status = "failed"
	StatusCancelled Status = "cancelled"
)

// Terminal reports whether s is final.
func (s Status) Terminal() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusCancelled
}

// ParseStatus validates a status filter.
func ParseStatus(s string) (Status, bool) {
	switch st := Status(s); st {
	case StatusPending, StatusRunning, StatusBlocked, StatusCompleted, StatusFailed, StatusCancelled:
		return st, true
	}
	return "", false
}

// StepStatus is a step's state.
type StepStatus string

// Step states, per the kernel API.
const (
	StepPending    StepStatus = "pending"
	StepDispatched StepStatus = "dispatched"
	StepRunning    StepStatus = "running"
	StepSucceeded  StepStatus = "succeeded"
	StepFailed     StepStatus = "failed"
	StepTimedOut   StepStatus = "timed_out"
	StepCancelled  StepStatus = "cancelled"
)

// Terminal reports whether s is final.
func (s StepStatus) Terminal() bool {
	return s == StepSucceeded || s == StepFailed || s == StepTimedOut || s == StepCancelled
}

// Execution is the state of one execution, folded from its events. Live
// (non-terminal) executions stay in memory; mu serializes every change so
// that an execution's events are written in order and applied only once
// durable.
type Execution struct {
	mu sync.Mutex

	ID        string
	AgentID   string
	Owner     string // principal that created it, whose channels answer its prompts
	Tenant    string // the owner's tenant
	SessionID string // the durable session (work container), not the agent lease
	// Tool is set for a direct execution: one tool call run without an
	// agent, which ends when its step does.
	Tool *ToolCall
	// Filed says the execution's events are filed in its durable
	// session's log, as the turn TurnID of thread ThreadID.
	Filed    bool
	ThreadID string
	TurnID   string
	// Ask lists tools a person must allow before each call.
	Ask       []string
	TraceID   string
	Labels    map[string]string
	Input     json.RawMessage
	Output    json.RawMessage
	HasOutput bool
	Error     string
	Status    Status
	CreatedAt time.Time
	UpdatedAt time.Time
	Seq       uint64

	// Lease is the agent's hold on the execution (the wire's session_id).
	Lease *Lease

	BlockReason string // "signal" or "approval" while blocked
	BlockRef    string // signal type, or the step awaiting approval

	Signals []Signal // received and not yet consumed, oldest first

	Steps     map[string]*Step
	StepOrder []string
	History   []HistoryEntry

	// idem holds the answers to keyed requests written by this process;
	// replayed executions may have older ones only in the store.
	idem     map[string]idemRecord
	replayed bool

	timer *time.Timer // execution timeout

	// row is the execution's list entry as of its last change, for List to
	// read without mu: the store keeps a live execution's entry only as of
	// its last change of status.
	row atomic.Pointer[Summary]

	// stream is the key of the execution's log, made once: every event
	// appended names it.
	stream string
}

// streamKey returns the key of the execution's log; the caller holds mu.
func (ex *Execution) streamKey() string {
	if ex.stream == "" {
		ex.stream = streamOf(ex.ID)
	}
	return ex.stream
}

// Lease binds an execution to one agent consumer. The kernel API calls it a
// session; the durable session is Execution.SessionID.
type Lease struct {
	ID         string
	ConsumerID string
}

// Signal is a received signal waiting to be consumed by a wait.
type Signal struct {
	Type    string
	Payload json.RawMessage
	Seq     uint64 // of its signal.received event
}

// Step is one intent of an execution: a tool invocation, local or remote.
type Step struct {
	ID          string
	ToolID      string
	Arguments   json.RawMessage
	Remote      bool
	Status      StepStatus
	Attempt     int
	MaxAttempts int
	Timeout     time.Duration // policy override of the step timeout
	CreatedAt   time.Time
	Deadline    time.Time
	NotBefore   time.Time
	JobID       string            // the job in flight, if any
	Jobs        map[string]string // job id -> runner id, for every dispatch of this step
	RunnerID    string
	ConsumerID  string
	Started     bool
	Approval    bool   // waiting for a human decision
	ActionID    string // the approval action, when one was required
	ExpiresAt   time.Time
	OnExpiry    string
	Account     string // the connected account the step runs with, if any
	Result      json.RawMessage
	Error       string
	CompletedAt time.Time

	timer  *time.Timer // step deadline
	expiry *time.Timer // approval expiry
}

// HistoryEntry is one terminal step transition, as sent to an agent that
// takes over an execution.
type HistoryEntry struct {
	StepID      string          `json:"step_id" msgpack:"s"`
	ToolID      string          `json:"tool_id" msgpack:"t"`
	Status      StepStatus      `json:"status" msgpack:"st"`
	Arguments   json.RawMessage `json:"arguments,omitempty" msgpack:"a"`
	Result      json.RawMessage `json:"result,omitempty" msgpack:"r"`
	Error       string          `json:"error,omitempty" msgpack:"e"`
	CompletedAt *time.Time      `json:"completed_at,omitempty" msgpack:"c"`
}

// activeSteps counts steps that are not terminal.
func (ex *Execution) activeSteps() int {
	n := 0
	for _, id := range ex.StepOrder {
		if !ex.Steps[id].Status.Terminal() {
			n++
		}
	}
	return n
}

// View is a read-only copy of an execution's public state.
type View struct {
	ID        string            `json:"id"`
	Status    Status            `json:"status"`
	AgentID   string            `json:"agent_id"`
	Labels    map[string]string `json:"labels"`
	Input     json.RawMessage   `json:"input"`
	Output    json.RawMessage   `json:"output,omitempty"`
	HasOutput bool              `json:"-"`
	SessionID string            `json:"-"`
	Owner     string            `json:"-"` // the principal that created it
	Tenant    string            `json:"-"` // the owner's tenant
	// Tool is the one step of a direct execution (extension).
	Tool *ToolCall `json:"tool,omitempty"`
	// BlockReason and BlockRef say what a blocked execution waits for:
	// "approval" and the step, or "signal" and its type.
	BlockReason string    `json:"-"`
	BlockRef    string    `json:"-"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
}

func (ex *Execution) view() View {
	return View{
		ID: ex.ID, Status: ex.Status, AgentID: ex.AgentID, Labels: ex.Labels,
		Input: ex.Input, Output: ex.Output, HasOutput: ex.HasOutput, SessionID: ex.SessionID,
		Owner: ex.Owner, Tenant: ex.Tenant, Tool: ex.Tool, CreatedAt: ex.CreatedAt, UpdatedAt: ex.UpdatedAt,
		BlockReason: ex.BlockReason, BlockRef: ex.BlockRef,
	}
}

// summary returns the execution's list entry; the caller holds mu. An
// execution without labels is given none, the kernel's noLabels.
func (ex *Execution) summary(none map[string]string) *Summary {
	labels := ex.Labels
	if labels == nil {
		labels = none
	}
	return &Summary{ID: ex.ID, Status: ex.Status, AgentID: ex.AgentID, Labels: labels,
		CreatedAt: ex.CreatedAt, UpdatedAt: ex.UpdatedAt, SessionID: ex.SessionID, Seq: ex.Seq,
		Owner: ex.Owner, Tenant: ex.Tenant}
}

// Summary is an execution's list entry.
type Summary struct {
	ID        string            `json:"id" msgpack:"id"`
	Status    Status            `json:"status" msgpack:"st"`
	AgentID   string            `json:"agent_id" msgpack:"ag"`
	Labels    map[string]string `json:"labels" msgpack:"lb"`
	CreatedAt time.Time         `json:"created_at" msgpack:"c"`
	UpdatedAt time.Time         `json:"updated_at" msgpack:"u"`
	// The fields below are kept for reads of finished executions.
	SessionID string `json:"-" msgpack:"ss"`
	Seq       uint64 `json:"-" msgpack:"sq"`
	// Owner and Tenant say whose it is, so that lists show each caller its
	// own. Entries written before they existed have them empty.
	Owner  string `json:"-" msgpack:"ow,omitempty"`
	Tenant string `json:"-" msgpack:"tn,omitempty"`
}
