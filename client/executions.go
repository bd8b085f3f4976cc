package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/gatehouse-dev/gatehouse/event"
)

// Status is an execution's state.
type Status string

// Execution states.
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

// Execution is an execution's state. List results carry no Input or Output.
type Execution struct {
	ID      string            `json:"id"`
	Status  Status            `json:"status"`
	AgentID string            `json:"agent_id"`
	Labels  map[string]string `json:"labels"`
	Input   json.RawMessage   `json:"input,omitempty"`
	// Output is set once the execution completed (JSON null when it
	// completed without output).
	Output    json.RawMessage `json:"output,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// CreateRequest describes a new execution.
type CreateRequest struct {
	// AgentID is the agent that runs the execution; required.
	AgentID string `json:"agent_id"`
	// Input is any JSON-encodable value handed to the agent.
	Input any `json:"input,omitempty"`
	// Labels are metadata usable in policy rules and list filters.
	Labels map[string]string `json:"labels,omitempty"`
}

// CreateExecution starts an execution. It is not retried: the kernel
// cannot tell a repeated create from a new one.
func (c *Client) CreateExecution(ctx context.Context, req CreateRequest) (*Execution, error) {
	var ex Execution
	err := c.do(ctx, call{method: http.MethodPost, path: "/v0/executions", body: &req}, &ex)
	if err != nil {
		return nil, err
	}
	return &ex, nil
}

// GetExecution returns an execution's state.
func (c *Client) GetExecution(ctx context.Context, id string) (*Execution, error) {
	var ex Execution
	err := c.do(ctx, call{method: http.MethodGet, path: "/v0/executions/" + url.PathEscape(id), retry: true}, &ex)
	if err != nil {
		return nil, err
	}
	return &ex, nil
}

// ListOptions filter and page ListExecutions. Zero fields do not filter.
type ListOptions struct {
	Status  Status
	AgentID string
	// Labels must all match (key and value).
	Labels map[string]string
	// Cursor continues after the previous page (its NextCursor).
	Cursor string
	// Limit is the page size; zero means the server's 50, at most 200.
	Limit int
}

// ListPage is one page of executions, newest first.
type ListPage struct {
	Executions []Execution `json:"executions"`
	// NextCursor continues with the next page; empty on the last one.
	NextCursor string `json:"next_cursor"`
}

// ListExecutions returns one page of executions matching o.
func (c *Client) ListExecutions(ctx context.Context, o ListOptions) (*ListPage, error) {
	q := url.Values{}
	if o.Status != "" {
		q.Set("status", string(o.Status))
	}
	if o.AgentID != "" {
		q.Set("agent_id", o.AgentID)
	}
	for k, v := range o.Labels {
		q.Add("label", k+":"+v)
	}
	var page ListPage
	if err := c.list(ctx, "/v0/executions", q, o.Cursor, o.Limit, &page); err != nil {
		return nil, err
	}
	return &page, nil
}

// CancelExecution cancels an execution and returns its final state. A
// finished execution answers ErrConflict.
func (c *Client) CancelExecution(ctx context.Context, id string) (*Execution, error) {
	var ex Execution
	err := c.do(ctx, call{method: http.MethodPost, path: "/v0/executions/" + url.PathEscape(id) + "/cancel", retry: true}, &ex)
	if err != nil {
		return nil, err
	}
	return &ex, nil
}

// Signal sends a signal to an execution; payload is any JSON-encodable
// value (nil for none). An execution waiting for signalType resumes.
func (c *Client) Signal(ctx context.Context, id, signalType string, payload any) error {
	body := struct {
		SignalType string `json:"signal_type"`
		Payload    any    `json:"payload,omitempty"`
	}{signalType, payload}
	return c.do(ctx, call{method: http.MethodPost, path: "/v0/executions/" + url.PathEscape(id) + "/signal", body: &body}, nil)
}

// Event is one fact of an execution's log: the gateway's own envelope
// (package event), so that the client reads every field the gateway writes,
// the kernel API's and the Agent Runtime's.
type Event = event.Event

// EventPage is one page of an execution's events.
type EventPage struct {
	Events []Event `json:"events"`
	// LatestSequence is the sequence of the page's last event (0 when the
	// page is empty): pass it as after to read on.
	LatestSequence uint64 `json:"latest_sequence"`
}

// Events returns up to limit events with a sequence greater than after;
// limit zero means the server's 100, at most 1000.
func (c *Client) Events(ctx context.Context, id string, after uint64, limit int) (*EventPage, error) {
	q := url.Values{}
	if after > 0 {
		q.Set("after_sequence", strconv.FormatUint(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var page EventPage
	err := c.do(ctx, call{method: http.MethodGet, path: "/v0/executions/" + url.PathEscape(id) + "/events", query: q, retry: true}, &page)
	if err != nil {
		return nil, err
	}
	return &page, nil
}
