package client

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"time"
)

// ActionState is the state of an action, a permission prompt.
type ActionState string

// Action states: a prompt is pending until its first valid answer, its
// expiry or the end of its execution settles it, once.
const (
	ActionPending   ActionState = "pending"
	ActionApproved  ActionState = "approved"
	ActionDenied    ActionState = "denied"
	ActionExpired   ActionState = "expired"
	ActionCancelled ActionState = "cancelled"
)

// Decision is a person's answer to a permission prompt.
type Decision string

// Decisions a person can give.
const (
	// DecisionAllowOnce lets this one tool call run.
	DecisionAllowOnce Decision = "allow_once"
	// DecisionAllowAlways lets this call run and every later call of the
	// same tool in the same session.
	DecisionAllowAlways Decision = "allow_always"
	// DecisionDeny refuses the call.
	DecisionDeny Decision = "deny"
)

// DecidedBy says who answered a prompt, and through which channel.
type DecidedBy struct {
	Principal    string `json:"principal"`
	ChannelID    string `json:"channel_id,omitempty"`
	NativePeerID string `json:"native_peer_id,omitempty"`
}

// Action is a permission prompt as the gateway records it (the action
// record): what an agent asked to run and, once settled, who decided what,
// where and when.
type Action struct {
	ActionID    string `json:"action_id"`
	SessionID   string `json:"session_id"`
	Owner       string `json:"owner"`
	Tenant      string `json:"tenant,omitempty"`
	ExecutionID string `json:"execution_id"`
	StepID      string `json:"step_id"`
	AgentID     string `json:"agent_id"`
	ToolID      string `json:"tool_id"`
	// Arguments are the tool call's arguments, as the agent sent them.
	Arguments json.RawMessage `json:"arguments,omitempty"`
	// ArgumentsSHA256 binds the prompt to those exact arguments.
	ArgumentsSHA256 string `json:"arguments_sha256"`
	// Reason and RuleID are the policy's: why the call needs approval.
	Reason      string     `json:"reason"`
	RuleID      string     `json:"rule_id"`
	RequestedAt time.Time  `json:"requested_at"`
	ExpiresAt   *time.Time `json:"expires_at,omitempty"`
	// OnExpiry says whether the call runs (allow) or not (deny) when the
	// prompt expires unanswered.
	OnExpiry string      `json:"on_expiry,omitempty"`
	State    ActionState `json:"state"`
	Decision Decision    `json:"decision,omitempty"`
	// Scope is once or session (for allow_always) once settled.
	Scope          string     `json:"scope,omitempty"`
	DecisionReason string     `json:"decision_reason,omitempty"`
	DecidedAt      *time.Time `json:"decided_at,omitempty"`
	DecidedBy      *DecidedBy `json:"decided_by,omitempty"`
}

// ActionListOptions filter and page ListActions. Zero fields do not filter.
type ActionListOptions struct {
	// State keeps the actions in that state only.
	State ActionState
	// Cursor continues after the previous page (its NextCursor).
	Cursor string
	// Limit is the page size; zero means the server's 50, at most 200.
	Limit int
}

// ActionPage is one page of actions.
type ActionPage struct {
	Actions []Action `json:"actions"`
	// NextCursor continues with the next page; empty on the last one.
	NextCursor string `json:"next_cursor"`
}

// ListActions returns one page of the permission prompts the caller may
// see: an admin sees every owner's, a channel or client principal its own.
func (c *Client) ListActions(ctx context.Context, o ActionListOptions) (*ActionPage, error) {
	q := url.Values{}
	if o.State != "" {
		q.Set("status", string(o.State))
	}
	var page ActionPage
	if err := c.list(ctx, "/v0/actions", q, o.Cursor, o.Limit, &page); err != nil {
		return nil, err
	}
	return &page, nil
}

// GetAction returns one action; another owner's answers ErrNotFound.
func (c *Client) GetAction(ctx context.Context, id string) (*Action, error) {
	var a Action
	if err := c.do(ctx, call{method: http.MethodGet, path: "/v0/actions/" + url.PathEscape(id), retry: true}, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// Answer is a response to a permission prompt.
type Answer struct {
	// Decision is required.
	Decision Decision `json:"decision"`
	// Reason is recorded with the answer.
	Reason string `json:"reason,omitempty"`
	// ChannelID and NativePeerID name the channel and device that
	// answered, for the audit (decided_by).
	ChannelID    string `json:"channel_id,omitempty"`
	NativePeerID string `json:"native_peer_id,omitempty"`
}

// SettledError is the answer to Respond for a prompt that was no longer
// pending: answered first by someone else, expired or cancelled. It
// matches ErrConflict and carries the outcome that was recorded.
type SettledError struct {
	// Recorded is the action as it was settled.
	Recorded Action
	err      *APIError
}

// Error is the gateway's 409 answer.
func (e *SettledError) Error() string { return e.err.Error() }

// Unwrap returns the *APIError, which matches ErrConflict.
func (e *SettledError) Unwrap() error { return e.err }

// Respond answers the permission prompt id and returns the settled action.
// The first valid answer wins; a prompt already settled returns a
// *SettledError with the recorded outcome. It is not retried: a repeat of
// an answer that won would come back as a conflict, hiding that it won.
func (c *Client) Respond(ctx context.Context, id string, a Answer) (*Action, error) {
	var act Action
	err := c.do(ctx, call{method: http.MethodPost, path: "/v0/actions/" + url.PathEscape(id) + "/respond", body: &a}, &act)
	var aerr *APIError
	if errors.As(err, &aerr) && aerr.Status == http.StatusConflict && len(aerr.Details) > 0 {
		var d struct {
			Recorded *Action `json:"recorded"`
		}
		if json.Unmarshal(aerr.Details, &d) == nil && d.Recorded != nil {
			return nil, &SettledError{Recorded: *d.Recorded, err: aerr}
		}
	}
	if err != nil {
		return nil, err
	}
	return &act, nil
}
