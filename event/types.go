package event

// Event types written to an execution's log. The names and payloads follow the
// kernel API (seed 004); permission and channel events follow the Agent
// Runtime families (seed 001).
const (
	ExecutionCreated   = "execution.created"
	ExecutionStarted   = "execution.started"
	ExecutionBlocked   = "execution.blocked"
	ExecutionResumed   = "execution.resumed"
	ExecutionCompleted = "execution.completed"
	ExecutionFailed    = "execution.failed"
	ExecutionCancelled = "execution.cancelled"
	ExecutionReset     = "execution.reset"

	IntentAccepted = "intent.accepted"
	IntentDenied   = "intent.denied"

	StepCreated          = "step.created"
	StepDispatched       = "step.dispatched"
	StepStarted          = "step.started"
	StepCompleted        = "step.completed"
	StepFailed           = "step.failed"
	StepRetried          = "step.retried"
	StepTimedOut         = "step.timed_out"
	StepCancelled        = "step.cancelled"
	StepApprovalRequired = "step.approval_required"

	SignalReceived = "signal.received"
	AgentTimeout   = "agent.timeout"

	PermissionRequested = "permission.requested"
	PermissionResolved  = "permission.resolved"

	// AgentOutput is an agent's text, reasoning, status or checkpoint in an
	// execution filed in no durable session (an extension; in a session it
	// is a fact of the session's log).
	AgentOutput = "agent.output"
)

// Push types: transient deliveries to agents and runners, not logged.
const (
	PushExecutionAssigned = "execution.assigned"
	PushToolResult        = "tool.result"
	PushApprovalResolved  = "approval.resolved"
	PushSignalReceived    = "signal.received"
	PushJobAssigned       = "job.assigned"
)
