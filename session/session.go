// Package session keeps durable sessions: the containers of related work
// that the Agent Runtime (seed 001), the Agent Application Protocol (seed
// 002) and the Runtime API (seeds 000 and 003) each show in their own
// shape.
//
// A session has an owner, the agent it talks to, and threads. A thread is
// an ordered context; a turn is one input submitted on a thread. Input that
// starts new work runs as a kernel execution of the session's agent, one
// execution per thread at a time: a turn submitted while its thread is
// busy waits in the thread's durable queue, and starts when the running one
// ends. Input that answers a waiting execution (a tool result, a
// permission answer) is not a new turn: the surfaces give it to the kernel
// or the bridge.
//
// Every session has its own append-only log with its own sequence: the
// session's facts (created, turn submitted, queue changed, ...), what its
// agent said (text, reasoning, status, checkpoints; deltas coalesced before
// they reach the disk), and a reference to every event of every execution
// filed in it, written in the same store batch as the event itself (the
// Registry implements kernel.Sessions). Surfaces render the log; this
// package knows no protocol's wire shape.
package session

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Callers branch on them with errors.Is.
var (
	// ErrNotFound reports an unknown session, thread or turn.
	ErrNotFound = errors.New("session: not found")
	// ErrArchived reports new work for an archived session.
	ErrArchived = errors.New("session: archived")
	// ErrConflict reports a request that contradicts the session's state:
	// a turn id reused for other input, a turn that is not queued, a
	// session id taken.
	ErrConflict = errors.New("session: conflict")
	// ErrExists reports a session id that is taken; it matches ErrConflict
	// as well. Whose it is, the error does not say: a surface answers a
	// taken id of someone else as it answers a session the caller may not
	// see.
	ErrExists = fmt.Errorf("%w: session id taken", ErrConflict)
	// ErrQuota reports a session that would take its owner past
	// Options.MaxPerOwner; see QuotaError.
	ErrQuota = errors.New("session: quota exceeded")
	// ErrInvalid reports a malformed request.
	ErrInvalid = errors.New("session: invalid argument")
	// ErrCursorExpired reports a read from before the oldest retained
	// entry: the history asked for is gone, and a reader must re-hydrate
	// from a snapshot rather than skip it silently.
	ErrCursorExpired = errors.New("session: cursor older than retained history")
	// ErrClosed reports use after Close.
	ErrClosed = errors.New("session: closed")
)

// NotFound is the error of an unknown session id: a surface gives it, word
// for word, for a session the caller may not see as well.
func NotFound(id string) error { return fmt.Errorf("%w: session %s", ErrNotFound, id) }

// Status is a session's lifecycle state.
type Status string

// Session states.
const (
	StatusActive   Status = "active"
	StatusArchived Status = "archived"
)

// ThreadStatus is what a thread is doing.
type ThreadStatus string

// Thread states; the names follow the Agent Runtime snapshot's enum.
const (
	ThreadIdle    ThreadStatus = "idle"
	ThreadRunning ThreadStatus = "running"
)

// TurnStatus is a turn's state.
type TurnStatus string

// Turn states.
const (
	TurnQueued    TurnStatus = "queued"
	TurnRunning   TurnStatus = "running"
	TurnCompleted TurnStatus = "completed"
	TurnFailed    TurnStatus = "failed"
	TurnCancelled TurnStatus = "cancelled"
)

// Ended reports whether s is final.
func (s TurnStatus) Ended() bool {
	return s == TurnCompleted || s == TurnFailed || s == TurnCancelled
}

// Session is a durable work container.
type Session struct {
	ID    string `msgpack:"id" json:"id"`
	Title string `msgpack:"ti" json:"title"`
	// Source says where the session was made: "api" for a token's caller,
	// "user" for a person in the web page.
	Source  string    `msgpack:"so" json:"source"`
	Status  Status    `msgpack:"st" json:"status"`
	Owner   string    `msgpack:"ow" json:"owner"`
	Tenant  string    `msgpack:"tn,omitempty" json:"tenant,omitempty"`
	AgentID string    `msgpack:"ag,omitempty" json:"agent_id,omitempty"`
	Created time.Time `msgpack:"c" json:"created_at"`
	Updated time.Time `msgpack:"u" json:"updated_at"`
	// Attrs holds what a surface keeps about the session in its own terms
	// (an AAP session's agent options and client tools, say), by surface.
	Attrs   map[string]json.RawMessage `msgpack:"at,omitempty" json:"attrs,omitempty"`
	Threads []Thread                   `msgpack:"th" json:"threads"`
}

// Thread is an ordered context of a session.
type Thread struct {
	ID      string       `msgpack:"id" json:"id"`
	Status  ThreadStatus `msgpack:"st" json:"status"`
	Active  string       `msgpack:"ac,omitempty" json:"active_turn,omitempty"`
	Queue   []string     `msgpack:"q,omitempty" json:"queue,omitempty"`
	Created time.Time    `msgpack:"c" json:"created_at"`
}

// Turn is one input submitted on a thread.
type Turn struct {
	ID        string          `msgpack:"id" json:"id"`
	SessionID string          `msgpack:"s" json:"session_id"`
	ThreadID  string          `msgpack:"th" json:"thread_id"`
	Status    TurnStatus      `msgpack:"st" json:"status"`
	Input     json.RawMessage `msgpack:"in,omitempty" json:"input,omitempty"`
	// Ask lists tools a person must allow before each call in the turn's
	// execution (kernel.CreateRequest.Ask).
	Ask         []string  `msgpack:"ask,omitempty" json:"ask,omitempty"`
	ExecutionID string    `msgpack:"x,omitempty" json:"execution_id,omitempty"`
	Error       string    `msgpack:"e,omitempty" json:"error,omitempty"`
	Submitted   time.Time `msgpack:"su" json:"submitted_at"`
	// FirstSeq is the sequence of the turn's first fact in the session's
	// log: retention keeps everything from there while the turn runs.
	FirstSeq uint64    `msgpack:"fs,omitempty" json:"-"`
	Started  time.Time `msgpack:"sa,omitempty" json:"started_at,omitzero"`
	Ended    time.Time `msgpack:"en,omitempty" json:"ended_at,omitzero"`
}

// thread returns the session's thread id, or nil.
func (s *Session) thread(id string) *Thread {
	for i := range s.Threads {
		if s.Threads[i].ID == id {
			return &s.Threads[i]
		}
	}
	return nil
}

func (s *Session) clone() Session {
	c := *s
	c.Threads = make([]Thread, len(s.Threads))
	for i, t := range s.Threads {
		t.Queue = append([]string(nil), t.Queue...)
		c.Threads[i] = t
	}
	if s.Attrs != nil {
		c.Attrs = make(map[string]json.RawMessage, len(s.Attrs))
		for k, v := range s.Attrs {
			c.Attrs[k] = v
		}
	}
	return c
}
