package agentruntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/protocol"
	"github.com/gatehouse-dev/gatehouse/session"
)

// commandInput is every command's body, in the standard's snake_case
// names; each command reads the fields it takes.
type commandInput struct {
	SessionID    string          `json:"session_id"`
	ThreadID     string          `json:"thread_id"`
	TurnID       string          `json:"turn_id"`
	QueuedTurnID string          `json:"queued_turn_id"`
	Input        json.RawMessage `json:"input"`
	AgentID      string          `json:"agent_id"`
	Title        string          `json:"title"`
	ActionID     string          `json:"action_id"`
	Decision     string          `json:"decision"`
	Reason       string          `json:"reason"`
	TaskID       string          `json:"task_id"`
	JobID        string          `json:"job_id"`
	Sequence     *uint64         `json:"sequence"`
	Reader       string          `json:"reader"`
}

// commands are the standard's commands Gatehouse offers.
var commands = map[string]func(*Surface, *protocol.Request, *commandInput) (any, error){
	"submit_turn":         (*Surface).submitTurn,
	"interrupt_turn":      (*Surface).interruptTurn,
	"resume_thread":       (*Surface).resumeThread,
	"respond_action":      (*Surface).respondAction,
	"resolve_permission":  (*Surface).resolvePermission,
	"remove_queued_turn":  (*Surface).removeQueuedTurn,
	"promote_queued_turn": (*Surface).promoteQueuedTurn,
	"get_session":         (*Surface).getSessionCommand,
	"get_thread_read":     (*Surface).getThreadRead,
	"get_tool_inventory":  (*Surface).getToolInventory,
	"list_tasks":          (*Surface).listTasks,
	"get_task":            (*Surface).getTask,
	"cancel_task":         (*Surface).cancelTask,
	"list_jobs":           (*Surface).listJobs,
	"get_job":             (*Surface).getJob,
	"ack_events":          (*Surface).ackEvents,
	"export_evidence":     (*Surface).exportEvidence,
	"export_replay":       (*Surface).exportReplay,
}

// unoffered are the standard's other commands, with why Gatehouse does not
// offer them: they answer 501.
var unoffered = map[string]string{
	"create_task": "tasks are executions: submit a turn", "update_task": "tasks are executions: submit a turn",
	"start_task": "tasks start with their turn", "append_task_progress": "progress is the agent's output intents",
	"pause_task": "executions cannot be paused", "resume_task": "executions cannot be paused",
	"retry_task": "a failed execution is not retried; submit a new turn", "complete_task": "an execution ends by its agent",
	"fail_task": "an execution ends by its agent", "link_tasks": "there is no task graph", "unlink_tasks": "there is no task graph",
	"cancel_job":          "a job is one attempt of a tool call; cancel its task",
	"create_job":          "jobs are made by tool calls",
	"spawn_subagent":      "there are no subagents",
	"send_subagent_input": "there are no subagents", "wait_subagents": "there are no subagents",
	"resume_subagent": "there are no subagents", "close_subagent": "there are no subagents",
	"list_subagents":            "there are no subagents",
	"evaluate_permission":       "policy is evaluated by the kernel on every tool call",
	"get_execution_environment": "agents and runners own their environment",
	"write_process_stdin":       "there are no processes", "terminate_process": "there are no processes",
	"reconnect_channel": "channels reconnect on /v0/channels; readers resume the event stream from their cursor",
	"export_review":     "there are no review templates",
}

// command answers POST /commands/{name}.
func (s *Surface) command(r *protocol.Request) error {
	name := r.Params[0]
	run, ok := commands[name]
	if !ok {
		if why, standard := unoffered[name]; standard {
			writeJSON(r.Ctx, fasthttp.StatusNotImplemented, protocol.ErrorBody{Error: name + " is not offered: " + why, Code: codeNotImplemented, Details: map[string]string{"command": name}})
			return nil
		}
		writeJSON(r.Ctx, fasthttp.StatusNotFound, protocol.ErrorBody{Error: "unknown command " + strconv.Quote(name), Code: codeUnknownCommand})
		return nil
	}
	var in commandInput
	if err := decode(r.Ctx.PostBody(), &in); err != nil {
		return err
	}
	out, err := run(s, r, &in)
	if err != nil {
		return err
	}
	if x, ok := out.(*exportWriter); ok {
		x.send(r.Ctx)
		return nil
	}
	writeJSON(r.Ctx, fasthttp.StatusOK, out)
	return nil
}

func need(v, name string) error {
	if v == "" {
		return protocol.Invalid(name + " is required")
	}
	return nil
}

// submitTurn submits a turn, idempotent on a caller's turn_id. Without a
// session_id (or with one that does not exist) and with an agent_id, the
// session is created for the caller.
func (s *Surface) submitTurn(r *protocol.Request, in *commandInput) (any, error) {
	id := in.SessionID
	if _, err := s.session(r.Ctx, r.Principal, auth.ActWrite, id); errors.Is(err, session.ErrNotFound) && in.AgentID != "" {
		sess, err := protocol.CreateSession(r.Ctx, s.o.Sessions, r.Principal, session.CreateRequest{ID: id, Title: in.Title, AgentID: in.AgentID})
		if errors.Is(err, auth.ErrHidden) {
			return nil, session.NotFound(id) // someone else's: as a read of it answers
		}
		if err != nil {
			return nil, err
		}
		id = sess.ID
	} else if err != nil {
		return nil, err
	}
	t, err := s.o.Sessions.Submit(r.Ctx, session.SubmitRequest{SessionID: id, ThreadID: in.ThreadID, TurnID: in.TurnID, Input: in.Input})
	if err != nil {
		return nil, err
	}
	return map[string]any{"accepted": true, "sessionId": id, "threadId": t.ThreadID, "turnId": t.ID, "status": t.Status}, nil
}

func (s *Surface) interruptTurn(r *protocol.Request, in *commandInput) (any, error) {
	if _, err := s.session(r.Ctx, r.Principal, auth.ActWrite, in.SessionID); err != nil {
		return nil, err
	}
	t, err := s.o.Sessions.Interrupt(r.Ctx, in.SessionID, in.ThreadID)
	if errors.Is(err, session.ErrConflict) {
		return map[string]any{"accepted": false, "reason": err.Error()}, nil // the standard's no-op
	}
	if err != nil {
		return nil, err
	}
	return map[string]any{"accepted": true, "turnId": t.ID, "taskId": t.ExecutionID}, nil
}

func (s *Surface) resumeThread(r *protocol.Request, in *commandInput) (any, error) {
	if _, err := s.session(r.Ctx, r.Principal, auth.ActWrite, in.SessionID); err != nil {
		return nil, err
	}
	th, err := s.o.Sessions.Resume(r.Ctx, in.SessionID, in.ThreadID)
	if err != nil {
		return nil, err
	}
	return map[string]any{"threadId": th.ID, "status": th.Status, "activeTurnId": th.Active, "queuedTurnIds": th.Queue}, nil
}

// respondAction answers a permission prompt through the bridge, like every
// channel: the first answer wins, a late one is a conflict with the
// recorded outcome.
func (s *Surface) respondAction(r *protocol.Request, in *commandInput) (any, error) {
	if err := need(in.ActionID, "action_id"); err != nil {
		return nil, err
	}
	if rest, ok := strings.CutPrefix(in.ActionID, "input:"); ok {
		return s.answerInput(r, in, rest)
	}
	rec, after, err := r.Gateway.Respond(r.Ctx, r.Principal, in.ActionID, protocol.Response{Decision: in.Decision, Reason: in.Reason, ChannelID: "agent-runtime"})
	if err != nil {
		return nil, err
	}
	defer after.Run()
	return map[string]any{"actionId": rec.ActionID, "status": rec.State, "decision": rec.Decision}, nil
}

// answerInput answers an agent's request for input (action id
// "input:<execution>:<signal>") by sending the signal with the answer's
// input as its payload. Only the execution's owner may; a request that is
// no longer open is a conflict.
func (s *Surface) answerInput(r *protocol.Request, in *commandInput, ref string) (any, error) {
	exec, signal, ok := strings.Cut(ref, ":")
	if !ok || exec == "" || signal == "" {
		return nil, protocol.Invalid("action_id: unknown action " + in.ActionID)
	}
	v, err := s.o.Kernel.Get(r.Ctx, exec)
	if err != nil {
		return nil, fmt.Errorf("%w: unknown action %s", kernel.ErrNotFound, in.ActionID)
	}
	res := auth.Resource{Kind: auth.KindExecution, ID: v.ID, Owner: auth.Owner{Principal: v.Owner, Tenant: v.Tenant}, AgentID: v.AgentID}
	if r.Principal.Authorize(auth.ActWrite, res) != nil {
		return nil, fmt.Errorf("%w: unknown action %s", kernel.ErrNotFound, in.ActionID)
	}
	if v.Status != kernel.StatusBlocked || v.BlockReason != "signal" || v.BlockRef != signal {
		return nil, fmt.Errorf("%w: action %s is not waiting for an answer", kernel.ErrConflict, in.ActionID)
	}
	payload := in.Input
	if len(payload) == 0 {
		payload = json.RawMessage("null")
	}
	after, err := s.o.Kernel.Signal(r.Ctx, exec, kernel.SignalRequest{SignalType: signal, Payload: payload}, kernel.Meta{Principal: r.Principal.Subject, Tenant: r.Principal.Tenant})
	if err != nil {
		return nil, err
	}
	defer after.Run()
	return map[string]any{"actionId": in.ActionID, "status": "resolved"}, nil
}

// resolvePermission is respond_action with the standard's permission
// decisions: allowed (once), allowed_always, denied.
func (s *Surface) resolvePermission(r *protocol.Request, in *commandInput) (any, error) {
	decision, ok := map[string]string{"allowed": "allow_once", "allow": "allow_once", "allowed_always": "allow_always", "denied": "deny", "deny": "deny"}[in.Decision]
	if !ok {
		return nil, protocol.Invalid("decision must be allowed, allowed_always or denied")
	}
	in.Decision = decision
	return s.respondAction(r, in)
}

func (s *Surface) removeQueuedTurn(r *protocol.Request, in *commandInput) (any, error) {
	return s.requeue(r, in, s.o.Sessions.RemoveQueued)
}

func (s *Surface) promoteQueuedTurn(r *protocol.Request, in *commandInput) (any, error) {
	return s.requeue(r, in, s.o.Sessions.Promote)
}

func (s *Surface) requeue(r *protocol.Request, in *commandInput, op func(context.Context, string, string) error) (any, error) {
	if _, err := s.session(r.Ctx, r.Principal, auth.ActWrite, in.SessionID); err != nil {
		return nil, err
	}
	if err := need(in.QueuedTurnID, "queued_turn_id"); err != nil {
		return nil, err
	}
	if err := op(r.Ctx, in.SessionID, in.QueuedTurnID); err != nil {
		return nil, err
	}
	sess, err := s.o.Sessions.Get(r.Ctx, in.SessionID)
	if err != nil {
		return nil, err
	}
	queues := map[string][]string{}
	for _, th := range sess.Threads {
		queues[th.ID] = append([]string{}, th.Queue...)
	}
	return map[string]any{"accepted": true, "queues": queues}, nil
}

func (s *Surface) readable(r *protocol.Request, id string) (Snapshot, error) {
	if _, err := s.session(r.Ctx, r.Principal, auth.ActRead, id); err != nil {
		return Snapshot{}, err
	}
	return s.snapshotOf(r.Ctx, id)
}

func (s *Surface) getSessionCommand(r *protocol.Request, in *commandInput) (any, error) {
	return s.readable(r, in.SessionID)
}

func (s *Surface) getThreadRead(r *protocol.Request, in *commandInput) (any, error) {
	th, err := s.thread(r, in.SessionID, in.ThreadID)
	if err != nil {
		return nil, err
	}
	return th, nil
}

// thread returns the read model of thread threadID of session id.
func (s *Surface) thread(r *protocol.Request, id, threadID string) (*ThreadRead, error) {
	snap, err := s.readable(r, id)
	if err != nil {
		return nil, err
	}
	for _, th := range snap.Threads {
		if th.ThreadID == threadID {
			return th, nil
		}
	}
	return nil, session.ErrNotFound
}

// getToolInventory lists the tools connected runners serve now.
func (s *Surface) getToolInventory(r *protocol.Request, _ *commandInput) (any, error) {
	if err := r.Principal.Can(auth.ActRead, auth.KindSession); err != nil {
		return nil, err
	}
	tools := []map[string]any{}
	for _, t := range s.o.Kernel.Tools() {
		tools = append(tools, map[string]any{"name": t.ID, "availability": "available", "runners": len(t.Runners)})
	}
	return map[string]any{"tools": tools}, nil
}

func (s *Surface) listTasks(r *protocol.Request, in *commandInput) (any, error) {
	snap, err := s.readable(r, in.SessionID)
	if err != nil {
		return nil, err
	}
	return map[string]any{"tasks": snap.Tasks, "taskSummary": snap.TaskSummary}, nil
}

// taskSession finds the session of task (execution) id, checking access.
func (s *Surface) taskSession(r *protocol.Request, id string, act auth.Action) (string, error) {
	if err := need(id, "task_id"); err != nil {
		return "", err
	}
	v, err := s.o.Kernel.Get(r.Ctx, id)
	if err != nil {
		return "", err
	}
	if _, err := s.session(r.Ctx, r.Principal, act, v.SessionID); err != nil {
		return "", kernel.ErrNotFound // a task filed in no session, or in another's, is not one of these
	}
	return v.SessionID, nil
}

func (s *Surface) getTask(r *protocol.Request, in *commandInput) (any, error) {
	id, err := s.taskSession(r, in.TaskID, auth.ActRead)
	if err != nil {
		return nil, err
	}
	snap, err := s.snapshotOf(r.Ctx, id)
	if err != nil {
		return nil, err
	}
	for _, t := range snap.Tasks {
		if t.TaskID == in.TaskID {
			return t, nil
		}
	}
	return nil, kernel.ErrNotFound
}

// cancelTask cancels an execution; its turn ends cancelled and the thread
// goes on with its queue.
func (s *Surface) cancelTask(r *protocol.Request, in *commandInput) (any, error) {
	if _, err := s.taskSession(r, in.TaskID, auth.ActWrite); err != nil {
		return nil, err
	}
	v, err := s.o.Kernel.Cancel(r.Ctx, in.TaskID, kernel.Meta{Principal: r.Principal.Subject, Tenant: r.Principal.Tenant})
	if err != nil {
		return nil, err
	}
	return map[string]any{"taskId": v.ID, "status": v.Status}, nil
}

func (s *Surface) listJobs(r *protocol.Request, in *commandInput) (any, error) {
	snap, err := s.readable(r, in.SessionID)
	if err != nil {
		return nil, err
	}
	jobs := []*Job{}
	for _, th := range snap.Threads {
		jobs = append(jobs, th.Jobs...)
	}
	return map[string]any{"jobs": jobs, "summary": snap.SubagentJobSummary}, nil
}

func (s *Surface) getJob(r *protocol.Request, in *commandInput) (any, error) {
	snap, err := s.readable(r, in.SessionID)
	if err != nil {
		return nil, err
	}
	for _, th := range snap.Threads {
		for _, j := range th.Jobs {
			if j.JobID == in.JobID {
				return j, nil
			}
		}
	}
	return nil, kernel.ErrNotFound
}

// ackEvents records how far a reader processed a session's events.
func (s *Surface) ackEvents(r *protocol.Request, in *commandInput) (any, error) {
	if _, err := s.session(r.Ctx, r.Principal, auth.ActRead, in.SessionID); err != nil {
		return nil, err
	}
	if in.Sequence == nil {
		return nil, protocol.Invalid("sequence is required")
	}
	reader := in.Reader
	if reader == "" {
		reader = r.Principal.Subject
	}
	seq, err := s.o.Sessions.Acknowledge(r.Ctx, in.SessionID, reader, *in.Sequence)
	if err != nil {
		return nil, err
	}
	return map[string]any{"reader": reader, "acknowledged": seq}, nil
}

func (s *Surface) exportEvidence(r *protocol.Request, in *commandInput) (any, error) {
	return s.exportFor(r, in.SessionID, "evidence")
}

func (s *Surface) exportReplay(r *protocol.Request, in *commandInput) (any, error) {
	return s.exportFor(r, in.SessionID, "replay")
}
