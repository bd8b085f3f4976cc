package kernel

import (
	"encoding/json"

	"github.com/gatehouse-dev/gatehouse/event"
)

// ToolCall is the one step of a direct execution: a capability invoked
// without an agent (an invocation of the Runtime API). The execution runs
// it as a remote step, through policy, the bridge and a runner like any
// agent's remote step, and ends with it: completed with the step's result,
// or failed with its error.
type ToolCall struct {
	ToolID    string          `json:"tool_id"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	// Account is the connected account to run the tool with; only a runner
	// that serves it gets the job (see Intent.Account).
	Account string `json:"account,omitempty"`
}

// checkToolCall validates the tool of a direct execution.
func checkToolCall(c *ToolCall) error {
	if c.ToolID == "" {
		return invalid("tool.tool_id is required")
	}
	if err := checkID("tool.tool_id", c.ToolID, maxIDLen); err != nil {
		return err
	}
	return checkID("tool.account", c.Account, maxIDLen)
}

// startDirect adds, to the transaction creating a direct execution, its
// start and its step. The execution is not applied yet: the fields policy
// and the bridge read are set on it first. A call that policy denies fails
// the execution at once.
func (k *Kernel) startDirect(t *tx, fx *effects, req *CreateRequest, meta Meta) {
	ex := t.ex
	ex.Labels, ex.Owner, ex.Tenant, ex.CreatedAt, ex.Tool = req.Labels, meta.Principal, meta.Tenant, t.now, req.Tool
	t.add(event.ExecutionStarted, "", &startedPayload{})
	call := req.Tool
	res := k.invokeTool(t, fx, &Intent{Type: IntentInvokeTool, ToolID: call.ToolID, Arguments: call.Arguments, Remote: true, Account: call.Account})
	if !res.Accepted {
		t.add(event.ExecutionFailed, "", &errorPayload{Error: res.Error})
	}
}

// toolResult tells whoever waits for a step's outcome: the agent, by a
// tool.result push; a direct execution, by ending with it. The caller
// holds ex.mu, commits t, and finishes the execution if it ended.
func (k *Kernel) toolResult(t *tx, st *Step, status StepStatus, data json.RawMessage, errText string) {
	ex := t.ex
	switch {
	case ex.Lease != nil:
		t.push(k.agentPeer(ex), event.PushToolResult, &toolResultPush{
			ExecutionID: ex.ID, StepID: st.ID, Status: string(status), Result: data, Error: errText,
		}, "")
	case ex.Tool != nil && status == StepSucceeded:
		t.add(event.ExecutionCompleted, "", &completedPayload{Output: orNull(data)})
	case ex.Tool != nil:
		t.add(event.ExecutionFailed, "", &errorPayload{Error: errText})
	}
}

// startedDirect makes a committed direct execution live, or finishes it
// when policy failed it, and sets its step on its way. The caller holds
// ex.mu.
func (k *Kernel) startedDirect(ex *Execution, t *tx, fx effects) View {
	if ex.Status.Terminal() {
		k.finish(ex)
	} else {
		k.mu.Lock()
		k.live[ex.ID] = ex
		k.mu.Unlock()
		k.armExecutionTimer(ex)
		k.armStepTimers(ex)
		k.armApprovalExpiry(ex)
	}
	fx.add(t.publish())
	// Effects take execution locks themselves, and ex.mu is held here.
	k.spawn(func() { k.runNow(fx) })
	return ex.view()
}
