package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
)

// Output kinds an agent says (Task.Say).
const (
	OutputText           = "text"
	OutputTextDelta      = "text_delta"
	OutputReasoning      = "reasoning"
	OutputReasoningDelta = "reasoning_delta"
	OutputStatus         = "status"
	OutputCheckpoint     = "checkpoint"
)

// Say records what the agent says in the execution: text, a delta of it,
// reasoning, a status line or a checkpoint (a Gatehouse extension of the
// kernel API's intents). It returns once the gateway holds it durably; in
// a durable session deltas are coalesced on the gateway's disk, so a delta
// may take up to the coalescing window (50 ms) to be answered.
func (t *Task) Say(ctx context.Context, kind, text string) error {
	out, err := json.Marshal(struct {
		Kind string `json:"kind"`
		Text string `json:"text"`
	}{kind, text})
	if err != nil {
		return err
	}
	body := struct {
		ExecutionID string  `json:"execution_id"`
		SessionID   string  `json:"session_id"`
		Intent      *intent `json:"intent"`
	}{t.id, t.session, &intent{Type: "output", Output: out}}
	// Not retried: an output intent is not idempotent, and a repeat would
	// say it twice.
	if err := t.ar.c.do(ctx, call{method: http.MethodPost, path: "/v0/agents/intent", body: &body}, nil); err != nil {
		return fmt.Errorf("client: say %s: %w", kind, err)
	}
	return nil
}

// Call asks for a tool that someone else runs, outside the agent and
// outside any runner (an AAP client's own tool), and returns the call's
// step id: the tool's outcome arrives when they answer it (Result). Call a
// client's tools, then Wait for SignalClientTools: the client answers them
// all and then resumes the execution.
func (t *Task) Call(ctx context.Context, toolID string, args any) (string, error) {
	rawArgs, err := encodeJSON(args)
	if err != nil {
		return "", fmt.Errorf("client: call %s: %w", toolID, err)
	}
	res, err := t.intent(ctx, &intent{Type: "invoke_tool", ToolID: toolID, Arguments: rawArgs}, toolID)
	if err != nil {
		return "", fmt.Errorf("client: call %s: %w", toolID, err)
	}
	if !res.Accepted {
		return "", newPolicyError(toolID, res.Error)
	}
	return res.StepID, nil
}

// SignalClientTools is the signal an AAP client's answers resume an
// execution with, once it answered every call of its tools.
const SignalClientTools = "aap.tools"

// Result waits for the outcome of a call made with Call.
func (t *Task) Result(ctx context.Context, toolID, stepID string) (json.RawMessage, error) {
	return t.remoteResult(ctx, toolID, stepID)
}

// DeclareAgent declares an AAP agent's AgentInfo (a JSON object whose name
// is the agent id), so that /aap/v1/meta lists it; the caller must be
// allowed to act as that agent.
func (c *Client) DeclareAgent(ctx context.Context, info any) error {
	raw, err := encodeJSON(info)
	if err != nil {
		return fmt.Errorf("client: declare agent: %w", err)
	}
	var named struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(raw, &named); err != nil || named.Name == "" {
		return fmt.Errorf("client: declare agent: AgentInfo needs a name")
	}
	return c.do(ctx, call{method: http.MethodPut, path: "/aap/v1/agents/" + url.PathEscape(named.Name), body: raw, retry: true}, nil)
}

// SessionContext is what an AAP agent needs for a turn: the session's
// history, the client's tools, the server tools enabled with their trust,
// and its options, secrets included (they reach the agent only).
type SessionContext struct {
	SessionID  string            `json:"sessionId"`
	Messages   []json.RawMessage `json:"messages"`
	Tools      json.RawMessage   `json:"tools"`
	AgentTools json.RawMessage   `json:"agentTools"`
	Options    map[string]string `json:"options"`
}

// AAPContext reads the context of an AAP session for agent.
func (c *Client) AAPContext(ctx context.Context, agent, sessionID string) (*SessionContext, error) {
	var sc SessionContext
	err := c.do(ctx, call{method: http.MethodGet, path: "/aap/v1/agents/" + url.PathEscape(agent) + "/sessions/" + url.PathEscape(sessionID), retry: true}, &sc)
	if err != nil {
		return nil, err
	}
	return &sc, nil
}
