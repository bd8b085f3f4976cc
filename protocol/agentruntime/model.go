package agentruntime

import (
	"encoding/json"
	"fmt"
	"slices"
)

// The read models are a fold of the session's events in their Agent
// Runtime form: the same events a client reads, so that anyone holding an
// export can fold them again and get the same models, byte for byte.

// Snapshot is the session snapshot (agentruntime-snapshot.schema.json).
type Snapshot struct {
	SchemaVersion string        `json:"schemaVersion"`
	SessionID     string        `json:"sessionId"`
	UpdatedAt     string        `json:"updatedAt,omitempty"`
	Threads       []*ThreadRead `json:"threads"`
	Tasks         []*Task       `json:"tasks"`
	// Sequence is the last event folded: a reader resumes the stream after
	// it (extension).
	Sequence        uint64          `json:"sequence"`
	TaskSummary     TaskSummary     `json:"taskSummary"`
	PermissionState PermissionState `json:"permissionState"`
	HistorySummary  HistorySummary  `json:"historySummary"`
	// The summaries below are facts Gatehouse does not have: reported as
	// unavailable, never invented.
	RoutingLimitSummary Unavailable `json:"routingLimitSummary"`
	TelemetrySummary    Unavailable `json:"telemetrySummary"`
	OutputSummary       Unavailable `json:"outputSummary"`
	SubagentJobSummary  JobSummary  `json:"subagentJobSummary"`
}

// ThreadRead is a thread's read model (the snapshot's thread).
type ThreadRead struct {
	ThreadID     string       `json:"threadId"`
	Status       string       `json:"status"`
	ActiveTurnID string       `json:"activeTurnId,omitempty"`
	Turns        []*Turn      `json:"turns"`
	QueuedTurns  []QueuedTurn `json:"queuedTurns"`
	Actions      []*Action    `json:"actions"`
	ToolCalls    []*ToolCall  `json:"toolCalls"`
	Jobs         []*Job       `json:"jobs"`
	LastOutcome  *Outcome     `json:"lastOutcome,omitempty"`
	// WaitingFor is the finer state of a blocked thread: "permission" or
	// "input" (extension; status stays within the standard's enum).
	WaitingFor string `json:"waitingFor,omitempty"`
}

// Turn is a turn of a thread.
type Turn struct {
	TurnID      string `json:"turnId"`
	Status      string `json:"status"`
	TaskID      string `json:"taskId,omitempty"`
	RunID       string `json:"runId,omitempty"`
	StartedAt   string `json:"startedAt,omitempty"`
	CompletedAt string `json:"completedAt,omitempty"`
}

// QueuedTurn is a turn waiting in a thread's queue.
type QueuedTurn struct {
	TurnID string `json:"turnId"`
}

// Action is a pending or resolved human decision.
type Action struct {
	ActionID   string   `json:"actionId"`
	ActionType string   `json:"actionType"`
	Status     string   `json:"status"`
	TaskID     string   `json:"taskId"`
	StepID     string   `json:"stepId,omitempty"`
	ToolName   string   `json:"toolName,omitempty"`
	Prompt     string   `json:"prompt,omitempty"`
	Decisions  []string `json:"decisions"`
	Decision   string   `json:"decision,omitempty"`
}

// ToolCall is one tool invocation.
type ToolCall struct {
	ToolCallID string `json:"toolCallId"`
	ToolName   string `json:"toolName"`
	Status     string `json:"status"`
	TaskID     string `json:"taskId"`
	Error      string `json:"error,omitempty"`
}

// Job is a tool call handed to a runner.
type Job struct {
	JobID      string `json:"jobId"`
	Status     string `json:"status"`
	ToolCallID string `json:"toolCallId"`
	TaskID     string `json:"taskId"`
}

// Outcome is how a thread's last turn ended.
type Outcome struct {
	TurnID string `json:"turnId"`
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
}

// Task is an execution, as the standard's task.
type Task struct {
	TaskID       string     `json:"taskId"`
	Status       string     `json:"status"`
	SessionID    string     `json:"sessionId"`
	ThreadID     string     `json:"threadId,omitempty"`
	TurnID       string     `json:"turnId,omitempty"`
	CurrentRunID string     `json:"currentRunId"`
	StatusReason string     `json:"statusReason,omitempty"`
	Attempts     []*Attempt `json:"attempts"`
	CreatedAt    string     `json:"createdAt,omitempty"`
	UpdatedAt    string     `json:"updatedAt,omitempty"`
	EndedAt      string     `json:"endedAt,omitempty"`
}

// Attempt is a run of a task.
type Attempt struct {
	RunID        string `json:"runId"`
	Status       string `json:"status"`
	AttemptCount int    `json:"attemptCount"`
}

// TaskSummary counts tasks by state.
type TaskSummary struct {
	Active   int `json:"active"`
	Terminal int `json:"terminal"`
	Failed   int `json:"failed"`
	Lost     int `json:"lost"`
	Waiting  int `json:"waiting"`
}

// PermissionState counts the session's permission prompts.
type PermissionState struct {
	Pending  int `json:"pending"`
	Resolved int `json:"resolved"`
}

// HistorySummary says what part of the session's log the model covers.
type HistorySummary struct {
	FirstSequence uint64 `json:"firstSequence"`
	LastSequence  uint64 `json:"lastSequence"`
	// Truncated says that retention removed the log's beginning: the
	// model covers what is left.
	Truncated bool `json:"truncated"`
}

// Unavailable is a summary the standard names but Gatehouse has no facts
// for.
type Unavailable struct {
	Status string `json:"status"`
	Reason string `json:"reason"`
}

// JobSummary counts the jobs handed to runners.
type JobSummary struct {
	Jobs    int `json:"jobs"`
	Running int `json:"running"`
}

// model folds events into the read models. The zero value is a model of
// an empty log.
type model struct {
	snap    Snapshot
	threads map[string]*ThreadRead
	tasks   map[string]*Task
	turns   map[string]*Turn
	actions map[string]*Action
	calls   map[string]*ToolCall
	jobs    map[string]*Job
}

func newModel(sessionID string) *model {
	return &model{
		snap:    Snapshot{SchemaVersion: SchemaVersion, SessionID: sessionID, Threads: []*ThreadRead{}, Tasks: []*Task{}},
		threads: map[string]*ThreadRead{}, tasks: map[string]*Task{}, turns: map[string]*Turn{},
		actions: map[string]*Action{}, calls: map[string]*ToolCall{}, jobs: map[string]*Job{},
	}
}

// folded is the part of an event a fold reads.
type folded struct {
	Type         string          `json:"type"`
	Timestamp    string          `json:"timestamp"`
	Sequence     uint64          `json:"sequence"`
	ThreadID     string          `json:"threadId"`
	TurnID       string          `json:"turnId"`
	TaskID       string          `json:"taskId"`
	RunID        string          `json:"runId"`
	StepID       string          `json:"stepId"`
	ToolCallID   string          `json:"toolCallId"`
	ActionID     string          `json:"actionId"`
	JobID        string          `json:"jobId"`
	QueueID      string          `json:"queueId"`
	Status       string          `json:"status"`
	StatusReason string          `json:"statusReason"`
	Payload      json.RawMessage `json:"payload"`
}

type foldPayload struct {
	ActionType    string   `json:"actionType"`
	ToolName      string   `json:"toolName"`
	Prompt        string   `json:"prompt"`
	QueuedTurnIDs []string `json:"queuedTurnIds"`
	WaitingFor    string   `json:"waitingFor"`
	Decision      string   `json:"decision"`
}

// fold applies one encoded event: what a reader of an export does.
func (m *model) fold(data []byte) error {
	var e folded
	if err := json.Unmarshal(data, &e); err != nil {
		return fmt.Errorf("agentruntime: fold: %w", err)
	}
	var p foldPayload
	if len(e.Payload) > 0 && e.Payload[0] == '{' {
		_ = json.Unmarshal(e.Payload, &p)
	}
	m.apply(&e, &p)
	return nil
}

// foldEvent applies a rendered event without encoding it: what the
// gateway does. Its payload holds the fields a fold reads with the types
// the JSON form decodes to, so both give the same models.
func (m *model) foldEvent(ev *Event) {
	e := folded{
		Type: ev.Type, Timestamp: ev.Timestamp, Sequence: ev.Sequence, ThreadID: ev.ThreadID, TurnID: ev.TurnID,
		TaskID: ev.TaskID, RunID: ev.RunID, StepID: ev.StepID, ToolCallID: ev.ToolCallID, ActionID: ev.ActionID,
		JobID: ev.JobID, QueueID: ev.QueueID, Status: ev.Status, StatusReason: ev.StatusReason,
	}
	var p foldPayload
	if pm, ok := ev.Payload.(map[string]any); ok {
		p.ActionType, _ = pm["actionType"].(string)
		p.ToolName, _ = pm["toolName"].(string)
		p.Prompt, _ = pm["prompt"].(string)
		p.Decision, _ = pm["decision"].(string)
		p.QueuedTurnIDs, _ = pm["queuedTurnIds"].([]string)
	}
	m.apply(&e, &p)
}

// maxListed bounds what a thread lists of its turns, tool calls, jobs and
// resolved actions: the most recent. Pending actions are always listed; the
// summaries count everything.
const maxListed = 100

// apply folds one event.
func (m *model) apply(e *folded, p *foldPayload) {
	s := &m.snap
	if s.HistorySummary.FirstSequence == 0 {
		s.HistorySummary.FirstSequence = e.Sequence
		s.HistorySummary.Truncated = e.Sequence > 1
	}
	s.Sequence, s.HistorySummary.LastSequence, s.UpdatedAt = e.Sequence, e.Sequence, e.Timestamp
	th := m.thread(e.ThreadID)
	switch e.Type {
	case "turn.submitted":
		m.turn(th, e.TurnID)
	case "turn.started":
		t := m.turn(th, e.TurnID)
		t.Status, t.TaskID, t.RunID, t.StartedAt = "running", e.TaskID, e.RunID, e.Timestamp
		th.Status, th.ActiveTurnID = "running", e.TurnID
		th.QueuedTurns = slices.DeleteFunc(th.QueuedTurns, func(q QueuedTurn) bool { return q.TurnID == e.TurnID })
	case "turn.completed", "turn.failed":
		t := m.turn(th, e.TurnID)
		t.Status, t.CompletedAt = e.Status, e.Timestamp
		if th != nil && th.ActiveTurnID == e.TurnID {
			th.ActiveTurnID, th.Status, th.WaitingFor = "", "idle", ""
		}
		if th != nil {
			th.LastOutcome = &Outcome{TurnID: e.TurnID, Status: e.Status, Reason: e.StatusReason}
		}
	case "queue.changed":
		if th != nil {
			th.QueuedTurns = th.QueuedTurns[:0]
			for _, id := range p.QueuedTurnIDs {
				th.QueuedTurns = append(th.QueuedTurns, QueuedTurn{TurnID: id})
			}
		}
	case "task.created":
		t := m.task(*e)
		t.CreatedAt = e.Timestamp
	case "task.started", "task.resumed", "task.blocked", "task.completed", "task.failed", "task.cancelled", "task.retrying", "action.resolved":
		if a := m.actions[e.ActionID]; e.Type == "action.resolved" && a != nil && a.ActionType == "user_input" {
			a.Status = "resolved"
		}
		m.taskStatus(th, *e)
	case "tool.started":
		c := &ToolCall{ToolCallID: e.ToolCallID, ToolName: p.ToolName, Status: "running", TaskID: e.TaskID}
		if m.calls[e.ToolCallID] == nil && th != nil {
			th.ToolCalls = append(th.ToolCalls, c)
			m.calls[e.ToolCallID] = c
		}
	case "tool.result", "tool.failed", "tool.progress":
		if c := m.calls[e.ToolCallID]; c != nil {
			c.Status = e.Status
			if e.Type == "tool.failed" {
				c.Error = e.StatusReason
			}
		}
		if j := m.jobOf(e.ToolCallID); j != nil && e.Type != "tool.progress" && j.Status == "running" {
			j.Status = e.Status
			s.SubagentJobSummary.Running--
		}
	case "job.started":
		j := &Job{JobID: e.JobID, Status: "running", ToolCallID: e.ToolCallID, TaskID: e.TaskID}
		if m.jobs[e.JobID] == nil && th != nil {
			if old := m.jobOf(e.ToolCallID); old != nil && old.Status == "running" {
				old.Status = "failed" // a retry's new job: the earlier one is over
				s.SubagentJobSummary.Running--
			}
			th.Jobs = append(th.Jobs, j)
			m.jobs[e.JobID] = j
			s.SubagentJobSummary.Jobs++
			s.SubagentJobSummary.Running++
		}
	case "action.required":
		if p.ActionType == "user_input" {
			// A request for input; the same signal may be asked for again.
			if a := m.actions[e.ActionID]; a != nil {
				a.Status = "pending"
			} else if th != nil {
				a := &Action{ActionID: e.ActionID, ActionType: p.ActionType, Status: "pending", TaskID: e.TaskID, Prompt: p.Prompt}
				th.Actions = append(th.Actions, a)
				m.actions[e.ActionID] = a
			}
			break
		}
		a := &Action{ActionID: e.ActionID, ActionType: "tool_permission", Status: "pending", TaskID: e.TaskID, StepID: e.StepID,
			ToolName: p.ToolName, Prompt: p.Prompt, Decisions: decisions}
		if m.actions[e.ActionID] == nil && th != nil {
			th.Actions = append(th.Actions, a)
			m.actions[e.ActionID] = a
			s.PermissionState.Pending++
		}
	case "permission.resolved":
		if a := m.actions[e.ActionID]; a != nil && a.Status == "pending" {
			a.Status, a.Decision = "resolved", p.Decision
			s.PermissionState.Pending--
			s.PermissionState.Resolved++
		}
	}
	if th != nil {
		m.trim(th)
	}
}

// trim keeps a thread's lists within maxListed, dropping the oldest (and
// never a pending action).
func (m *model) trim(th *ThreadRead) {
	if len(th.Turns) > 2*maxListed {
		for _, t := range th.Turns[:len(th.Turns)-maxListed] {
			delete(m.turns, t.TurnID)
		}
		th.Turns = slices.Clone(th.Turns[len(th.Turns)-maxListed:])
	}
	if len(th.ToolCalls) > 2*maxListed {
		for _, c := range th.ToolCalls[:len(th.ToolCalls)-maxListed] {
			delete(m.calls, c.ToolCallID)
		}
		th.ToolCalls = slices.Clone(th.ToolCalls[len(th.ToolCalls)-maxListed:])
	}
	if len(th.Jobs) > 2*maxListed {
		for _, j := range th.Jobs[:len(th.Jobs)-maxListed] {
			delete(m.jobs, j.JobID)
		}
		th.Jobs = slices.Clone(th.Jobs[len(th.Jobs)-maxListed:])
	}
	if len(th.Actions) > 2*maxListed {
		keep := th.Actions[:0:0]
		for i, a := range th.Actions {
			if a.Status == "pending" || i >= len(th.Actions)-maxListed {
				keep = append(keep, a)
			} else {
				delete(m.actions, a.ActionID)
			}
		}
		th.Actions = keep
	}
}

// jobOf returns the latest job of a tool call.
func (m *model) jobOf(callID string) *Job {
	var last *Job
	for _, th := range m.snap.Threads {
		for _, j := range th.Jobs {
			if j.ToolCallID == callID {
				last = j
			}
		}
	}
	return last
}

func (m *model) thread(id string) *ThreadRead {
	if id == "" {
		return nil
	}
	th := m.threads[id]
	if th == nil {
		th = &ThreadRead{ThreadID: id, Status: "idle", Turns: []*Turn{}, QueuedTurns: []QueuedTurn{}, Actions: []*Action{}, ToolCalls: []*ToolCall{}, Jobs: []*Job{}}
		m.threads[id] = th
		m.snap.Threads = append(m.snap.Threads, th)
	}
	return th
}

func (m *model) turn(th *ThreadRead, id string) *Turn {
	t := m.turns[id]
	if t == nil {
		t = &Turn{TurnID: id, Status: "queued"}
		m.turns[id] = t
		if th != nil {
			th.Turns = append(th.Turns, t)
		}
	}
	return t
}

func (m *model) task(e folded) *Task {
	t := m.tasks[e.TaskID]
	if t == nil {
		t = &Task{TaskID: e.TaskID, Status: "queued", SessionID: m.snap.SessionID, ThreadID: e.ThreadID, TurnID: e.TurnID,
			CurrentRunID: e.RunID, Attempts: []*Attempt{{RunID: e.RunID, Status: "queued", AttemptCount: 1}}}
		m.tasks[e.TaskID] = t
		m.snap.Tasks = append(m.snap.Tasks, t)
		m.count("", t.Status)
	}
	return t
}

// taskStatus follows a task's state: the standard's task statuses (20)
// and attempt statuses (14), with waiting_permission and waiting_input for
// a blocked execution.
func (m *model) taskStatus(th *ThreadRead, e folded) {
	t := m.task(e)
	was := t.Status
	t.UpdatedAt = e.Timestamp
	attempt := t.Attempts[len(t.Attempts)-1]
	switch e.Type {
	case "task.started", "task.resumed", "action.resolved":
		t.Status, attempt.Status = "running", "running"
		if th != nil {
			th.WaitingFor = ""
			if th.ActiveTurnID != "" {
				th.Status = "running"
			}
		}
	case "task.blocked":
		t.Status, attempt.Status = firstOf(e.StatusReason, "blocked"), "blocked"
		if th != nil {
			th.Status = "blocked"
			th.WaitingFor = map[string]string{"waiting_permission": "permission", "waiting_input": "input"}[e.StatusReason]
		}
	case "task.retrying":
		t.Status, attempt.Status = "retrying", "retrying"
		t.Attempts = append(t.Attempts, &Attempt{RunID: e.RunID, Status: "queued", AttemptCount: len(t.Attempts) + 1})
	case "task.completed", "task.failed", "task.cancelled":
		t.Status, attempt.Status, t.EndedAt, t.StatusReason = e.Status, e.Status, e.Timestamp, e.StatusReason
	}
	m.count(was, t.Status)
}

// count moves a task between the summary's counts.
func (m *model) count(was, now string) {
	sum := &m.snap.TaskSummary
	for i, st := range []string{was, now} {
		d := 1
		if i == 0 {
			d = -1
			if st == "" {
				continue
			}
		}
		switch st {
		case "completed", "cancelled":
			sum.Terminal += d
		case "failed":
			sum.Terminal += d
			sum.Failed += d
		case "waiting_permission", "waiting_input", "blocked":
			sum.Waiting += d
			sum.Active += d
		default:
			sum.Active += d
		}
	}
}

// snapshot returns the model's snapshot, filled in for the wire.
func (m *model) snapshot() Snapshot {
	s := m.snap
	s.RoutingLimitSummary = Unavailable{Status: "unavailable", Reason: "Gatehouse does not route models; agents choose their own"}
	s.TelemetrySummary = Unavailable{Status: "unavailable", Reason: "no telemetry correlation beyond the traceId of each event"}
	s.OutputSummary = Unavailable{Status: "not_applicable", Reason: "outputs are kept whole in the events; there are no output refs"}
	return s
}
