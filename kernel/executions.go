package kernel

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/ident"
	"github.com/gatehouse-dev/gatehouse/store"
)

// Field limits, in bytes, as the kernel API enforces them.
const (
	maxIDLen          = 256
	maxErrorLen       = 4096
	maxLabels         = 64
	maxLabelLen       = 256
	maxIdempotencyKey = 256
)

func checkLen(field, v string, max int) error {
	if len(v) > max {
		return invalid("%s exceeds maximum length of %d characters", field, max)
	}
	return nil
}

// checkID checks an id a client chose against package ident's rule, within
// max bytes; an empty id is an optional field left out (required ones are
// checked first). Ids are echoed into logs, event streams, store keys and
// the approvals page (docs/protocol.md "Ids").
func checkID(field, v string, max int) error {
	if v == "" {
		return nil
	}
	if err := ident.CheckLen(field, v, max); err != nil {
		return invalid("%s", err)
	}
	return nil
}

// CreateRequest is the body of POST /v0/executions.
type CreateRequest struct {
	AgentID   string            `json:"agent_id"`
	Input     json.RawMessage   `json:"input"`
	Labels    map[string]string `json:"labels"`
	SessionID string            `json:"session_id"` // extension: the durable session to file it under
	// Tool (extension) makes a direct execution: one tool call run without
	// an agent; AgentID must then be empty.
	Tool *ToolCall `json:"tool,omitempty"`
	// ThreadID and TurnID name the session turn the execution runs; the
	// session package sets them when it starts a turn.
	ThreadID string `json:"-"`
	TurnID   string `json:"-"`
	// Ask (extension) lists tools a person must allow before each call in
	// this execution, even where policy would allow it (policy's denials
	// stand): an AAP session's untrusted server tools.
	Ask []string `json:"ask_tools,omitempty"`
}

// Create starts an execution. If an agent consumer for it is online, the
// execution is assigned before Create returns, so the answer says running.
//
// With meta.IdempotencyKey, a create that repeats an earlier one of the
// same owner (same key, same request) within Options.IdempotencyWindow
// creates nothing and returns that execution as it is now, with replayed
// true; the same key with another request is a conflict.
func (k *Kernel) Create(ctx context.Context, req CreateRequest, meta Meta) (v View, replayed bool, err error) {
	switch {
	case req.Tool != nil && req.AgentID != "":
		return View{}, false, invalid("agent_id and tool exclude each other: a direct execution runs without an agent")
	case req.Tool != nil:
		if err := checkToolCall(req.Tool); err != nil {
			return View{}, false, err
		}
	case req.AgentID == "":
		return View{}, false, invalid("agent_id is required")
	}
	for _, f := range []struct {
		name, v string
		max     int
	}{{"agent_id", req.AgentID, maxIDLen}, {"session_id", req.SessionID, maxIDLen}, {"idempotency key", meta.IdempotencyKey, maxIdempotencyKey}} {
		if err := checkID(f.name, f.v, f.max); err != nil {
			return View{}, false, err
		}
	}
	if len(req.Ask) > maxLabels {
		return View{}, false, invalid("ask_tools: at most %d tools", maxLabels)
	}
	for _, t := range req.Ask {
		if err := checkID("ask_tools", t, maxIDLen); err != nil {
			return View{}, false, err
		}
	}
	if len(req.Labels) > maxLabels {
		return View{}, false, invalid("labels: at most %d labels", maxLabels)
	}
	for key, v := range req.Labels {
		if key == "" || len(key) > maxLabelLen || len(v) > maxLabelLen {
			return View{}, false, invalid("labels: keys must be 1-%d bytes and values at most %d bytes", maxLabelLen, maxLabelLen)
		}
		// A key is an id; a value is text on one line.
		if ident.Check("", key) != nil || strings.IndexFunc(v, unicode.IsControl) >= 0 {
			return View{}, false, invalid("labels: keys are ids (UTF-8 without control or format characters) and values hold no control characters")
		}
	}
	if isNull(req.Input) {
		req.Input = nil
	}
	var claim *createClaim
	if meta.IdempotencyKey != "" {
		claim, v, replayed, err = k.claimCreate(ctx, meta, requestHash(req))
		if claim == nil {
			return v, replayed, err
		}
		defer claim.release()
	}
	k.mu.Lock()
	full := len(k.live) >= k.opts.MaxLive
	k.mu.Unlock()
	if full {
		return View{}, false, newErr(ErrUnavailable, "service unavailable: %d executions are live, the configured maximum", k.opts.MaxLive)
	}
	if err := k.store.Admit(); err != nil {
		return View{}, false, err
	}
	ex := &Execution{ID: event.NewID(), SessionID: req.SessionID, TraceID: meta.TraceID, Steps: map[string]*Step{}}
	if ex.SessionID == "" {
		ex.SessionID = "sess-" + ex.ID
	} else if k.sessions != nil {
		// The filing is set before the first transaction, which files the
		// execution's creation with the rest of its first batch.
		thread, turn, err := k.sessions.Open(ctx, Opening{
			SessionID: req.SessionID, ExecutionID: ex.ID, AgentID: req.AgentID, Owner: meta.Principal, Tenant: meta.Tenant,
			ThreadID: req.ThreadID, TurnID: req.TurnID, Input: req.Input,
		})
		if err != nil {
			return View{}, false, err
		}
		ex.Filed, ex.ThreadID, ex.TurnID = true, thread, turn
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	t := k.begin(ex, meta)
	t.add(event.ExecutionCreated, "", &createdPayload{
		AgentID: req.AgentID, Input: orNull(req.Input), Labels: req.Labels, Owner: meta.Principal, Tenant: meta.Tenant, Tool: req.Tool,
		Filed: ex.Filed, ThreadID: ex.ThreadID, TurnID: ex.TurnID, Ask: req.Ask,
	})
	var (
		consumer string
		lease    *Lease
		fx       effects
	)
	if req.Tool != nil {
		k.startDirect(t, &fx, &req, meta)
	} else {
		consumer = k.pickAgentConsumer(req.AgentID)
	}
	if consumer != "" {
		lease = &Lease{ID: event.NewID(), ConsumerID: consumer}
		t.add(event.ExecutionStarted, "", &startedPayload{SessionID: lease.ID, ConsumerID: consumer})
		labels := req.Labels
		if len(labels) == 0 {
			labels = nil
		}
		t.push(Peer{Role: RoleAgent, ID: req.AgentID, Consumer: consumer}, event.PushExecutionAssigned, &assignedPush{
			ExecutionID: ex.ID, SessionID: lease.ID, AgentID: req.AgentID, Input: orNull(req.Input), Labels: labels,
		}, "")
	}
	if claim != nil {
		claim.stage(t, ex.ID)
	}
	if err := t.commit(ctx); err != nil {
		return View{}, false, err
	}
	if isNull(ex.Input) {
		ex.Input = nil
	}
	k.counters.created.Add(1)
	if req.Tool != nil {
		return k.startedDirect(ex, t, fx), false, nil
	}
	k.mu.Lock()
	k.live[ex.ID] = ex
	as := k.agentSetLocked(ex.AgentID)
	if lease != nil {
		k.bindLeaseLocked(ex.AgentID, lease.ConsumerID, ex.ID, lease.ID)
	} else {
		as.pending = append(as.pending, ex.ID)
	}
	k.mu.Unlock()
	if lease == nil {
		// A consumer may have connected after we looked and before the
		// execution joined the line: give it the chance to take it.
		agentID := ex.AgentID
		defer k.spawn(func() { k.assignPending(agentID) })
	}
	k.armExecutionTimer(ex)
	if publish := t.publish(); publish != nil {
		publish()
	}
	return ex.view(), false, nil
}

// Get returns an execution's state.
func (k *Kernel) Get(ctx context.Context, id string) (View, error) {
	k.mu.Lock()
	ex := k.live[id]
	k.mu.Unlock()
	if ex != nil {
		ex.mu.Lock()
		v := ex.view()
		ex.mu.Unlock()
		return v, nil
	}
	return k.loadView(id)
}

// loadView rebuilds a finished execution's view from its summary and the
// first and last events, without replaying the whole log.
func (k *Kernel) loadView(id string) (View, error) {
	sum, err := k.summary(id)
	if err != nil {
		return View{}, err
	}
	v := View{ID: sum.ID, Status: sum.Status, AgentID: sum.AgentID, Labels: sum.Labels, SessionID: sum.SessionID,
		CreatedAt: sum.CreatedAt, UpdatedAt: sum.UpdatedAt}
	if len(v.Labels) == 0 {
		v.Labels = nil
	}
	var first createdPayload
	if err := k.readPayload(id, 1, &first); err != nil {
		return View{}, err
	}
	if !isNull(first.Input) {
		v.Input = first.Input
	}
	v.Owner, v.Tenant, v.Tool = first.Owner, first.Tenant, first.Tool
	if sum.Status == StatusCompleted {
		var last completedPayload
		if err := k.readPayload(id, sum.Seq, &last); err != nil {
			return View{}, err
		}
		v.Output, v.HasOutput = orNull(last.Output), true
	}
	return v, nil
}

func (k *Kernel) readPayload(id string, seq uint64, into any) error {
	raw, err := k.store.Entry(streamOf(id), seq)
	if err != nil {
		return newErr(ErrUnavailable, "service unavailable: read event %d of %s: %v", seq, id, err)
	}
	ev, err := event.DecodeStored(raw, id)
	if err != nil {
		return fmt.Errorf("decode event %d of %s: %w", seq, id, err)
	}
	return json.Unmarshal(ev.Payload, into)
}

// ListRequest filters and pages GET /v0/executions.
type ListRequest struct {
	Status  Status
	AgentID string
	Labels  map[string]string
	Cursor  string
	Limit   int
	// Visible, when set, keeps only the executions it accepts: the caller's
	// own. Pages fill up with visible rows only.
	Visible func(*Summary) bool
}

// ListPage is one page of executions.
type ListPage struct {
	Executions []Summary `json:"executions"`
	NextCursor string    `json:"next_cursor"`
}

// List returns executions newest first. The cursor is opaque to clients; it
// names the last row returned, and the next page starts strictly after it.
func (k *Kernel) List(ctx context.Context, req ListRequest) (ListPage, error) {
	if req.Limit <= 0 {
		req.Limit = 50
	}
	if req.Limit > 200 {
		req.Limit = 200
	}
	after := ""
	if req.Cursor != "" {
		raw, err := base64.StdEncoding.DecodeString(req.Cursor)
		if err != nil || !strings.Contains(string(raw), "|") {
			return ListPage{}, invalid("invalid cursor")
		}
		ts, id, _ := strings.Cut(string(raw), "|")
		created, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil || id == "" {
			return ListPage{}, invalid("invalid cursor")
		}
		after = summaryKey(created, id)
	}
	page := ListPage{Executions: []Summary{}}
	more := false
	var lastKey string
	err := k.store.RecordsAfter(kindExec, after, func(key string, decode func(any) error) bool {
		if ctx.Err() != nil {
			return false
		}
		if !isSummaryKey(key) {
			return true
		}
		var s Summary
		if decode(&s) != nil {
			return true
		}
		if !s.Status.Terminal() {
			s = k.currentRow(s)
		}
		if req.Visible != nil && s.Owner == "" {
			// An entry written before entries kept their owner: its first
			// event says whose it is.
			var first createdPayload
			if k.readPayload(s.ID, 1, &first) == nil {
				s.Owner, s.Tenant = first.Owner, first.Tenant
			}
		}
		if !matches(&s, req) || (req.Visible != nil && !req.Visible(&s)) {
			return true
		}
		if len(page.Executions) == req.Limit {
			more = true
			return false
		}
		page.Executions = append(page.Executions, s)
		lastKey = key
		return true
	})
	if err != nil {
		return ListPage{}, newErr(ErrUnavailable, "service unavailable: %v", err)
	}
	if err := ctx.Err(); err != nil {
		return ListPage{}, err
	}
	if more && lastKey != "" {
		last := page.Executions[len(page.Executions)-1]
		page.NextCursor = base64.StdEncoding.EncodeToString([]byte(last.CreatedAt.Format(time.RFC3339Nano) + "|" + last.ID))
	}
	return page, nil
}

// currentRow returns the up-to-date list entry of an execution whose stored
// entry, s, is not terminal: the store has it only as of its last change of
// status.
func (k *Kernel) currentRow(s Summary) Summary {
	k.mu.Lock()
	ex := k.live[s.ID]
	k.mu.Unlock()
	if ex != nil {
		if row := ex.row.Load(); row != nil {
			return *row
		}
		return s
	}
	// It finished after the scan read s; its final entry is stored.
	if fresh, err := k.summary(s.ID); err == nil {
		return *fresh
	}
	return s
}

func matches(s *Summary, req ListRequest) bool {
	if req.Status != "" && s.Status != req.Status {
		return false
	}
	if req.AgentID != "" && s.AgentID != req.AgentID {
		return false
	}
	for key, v := range req.Labels {
		if s.Labels[key] != v {
			return false
		}
	}
	return true
}

// Cancel cancels a non-terminal execution and returns its final state.
func (k *Kernel) Cancel(ctx context.Context, id string, meta Meta) (View, error) {
	ex, err := k.lockLive(id)
	if err != nil {
		return View{}, err
	}
	defer ex.mu.Unlock()
	var fx effects
	t := k.begin(ex, meta)
	k.cancelApproval(t, &fx, "execution cancelled")
	k.cancelSteps(t, "execution cancelled")
	t.add(event.ExecutionCancelled, "", &reasonPayload{Reason: "cancelled by request"})
	if err := t.commit(ctx); err != nil {
		return View{}, err
	}
	k.finish(ex)
	k.runNow(fx)
	return ex.view(), nil
}

// cancelApproval withdraws the prompt the execution waits on, if any, so
// that channels retract it.
func (k *Kernel) cancelApproval(t *tx, fx *effects, reason string) {
	if st := t.ex.pendingApproval(); st != nil {
		k.settleApproval(t, fx, st, Decision{Outcome: OutcomeCancelled, Reason: reason, DecidedAt: t.now})
	}
}

// cancelSteps adds step.cancelled for every active step.
func (k *Kernel) cancelSteps(t *tx, reason string) {
	for _, id := range t.ex.StepOrder {
		if !t.ex.Steps[id].Status.Terminal() {
			t.add(event.StepCancelled, id, &reasonPayload{Reason: reason})
		}
	}
}

// SignalRequest is the body of POST /v0/executions/{id}/signal.
type SignalRequest struct {
	SignalType string          `json:"signal_type"`
	Payload    json.RawMessage `json:"payload"`
}

const signalStepApprove = "step.approve"

// approvalPayload is the payload of a step.approve signal.
type approvalPayload struct {
	StepID   string `json:"step_id"`
	Approved *bool  `json:"approved"`
	Reason   string `json:"reason"`
}

// Signal delivers a signal. It resumes an execution blocked on that signal
// type, resolves a pending approval for step.approve, and is otherwise kept
// for a later wait. A malformed approval is refused before anything is
// written.
func (k *Kernel) Signal(ctx context.Context, id string, req SignalRequest, meta Meta) (After, error) {
	if req.SignalType == "" {
		return nil, invalid("signal_type is required")
	}
	if err := checkID("signal_type", req.SignalType, maxIDLen); err != nil {
		return nil, err
	}
	ex, err := k.lockLive(id)
	if err != nil {
		return nil, err
	}
	defer ex.mu.Unlock()
	var approval *approvalPayload
	if req.SignalType == signalStepApprove {
		awaited := ex.pendingApproval()
		// An answer to a prompt that is already settled (the first answer
		// won, or it expired) is a late answer, not a signal to keep.
		var ref approvalPayload
		if json.Unmarshal(req.Payload, &ref) == nil {
			if st := ex.Steps[ref.StepID]; st != nil && st.ActionID != "" && st != awaited {
				e := conflict("conflict: action %s is already settled", st.ActionID)
				e.Details = map[string]any{"action_id": st.ActionID}
				return nil, e
			}
		}
		if awaited != nil {
			approval = &approvalPayload{}
			if isNull(req.Payload) || json.Unmarshal(req.Payload, approval) != nil || approval.Approved == nil {
				return nil, invalid(`step.approve payload must be an object {"step_id": string, "approved": bool, "reason"?: string}`)
			}
			if approval.StepID != ex.BlockRef {
				return nil, invalid("step.approve for step %s, but the execution awaits approval of step %s", approval.StepID, ex.BlockRef)
			}
		}
	}
	if len(ex.Signals) >= k.opts.MaxSignals {
		return nil, conflict("conflict: execution %s holds %d unconsumed signals, the maximum", ex.ID, k.opts.MaxSignals)
	}
	var fx effects
	t := k.begin(ex, meta)
	t.add(event.SignalReceived, "", &signalPayload{SignalType: req.SignalType, Payload: orNull(req.Payload)})
	signalSeq := t.seq
	switch {
	case approval != nil:
		d := Decision{Outcome: outcomeDenied, Scope: ScopeOnce, Reason: approval.Reason, DecidedAt: t.now,
			DecidedBy: &DecidedBy{Principal: meta.Principal, ChannelID: "signal"}}
		if *approval.Approved {
			d.Outcome = outcomeApproved
		}
		k.settleApproval(t, &fx, ex.Steps[ex.BlockRef], d)
	case ex.Status == StatusBlocked && ex.BlockReason == "signal" && ex.BlockRef == req.SignalType:
		t.add(event.ExecutionResumed, "", &reasonPayload{Reason: "signal received: " + req.SignalType})
	}
	if ex.Lease != nil {
		t.push(k.agentPeer(ex), event.PushSignalReceived, &signalPush{ExecutionID: ex.ID, SignalType: req.SignalType, Payload: orNull(req.Payload), Sequence: signalSeq}, "")
	}
	if err := t.commit(ctx); err != nil {
		return nil, err
	}
	if approval != nil {
		ex.Steps[approval.StepID].stopExpiry()
	}
	fx.add(t.publish())
	k.afterResume(ex, &fx)
	return k.after(fx), nil
}

// EventPage is one page of an execution's events.
type EventPage struct {
	Events         []json.RawMessage `json:"events"`
	LatestSequence uint64            `json:"latest_sequence"`
}

// Events returns up to limit events after a sequence. LatestSequence is the
// sequence of the page's last event, as the kernel API defines it.
func (k *Kernel) Events(ctx context.Context, id string, after uint64, limit int) (EventPage, error) {
	if err := k.exists(id); err != nil {
		return EventPage{}, err
	}
	if limit <= 0 {
		limit = 100
	}
	if limit > 1000 {
		limit = 1000
	}
	page := EventPage{Events: []json.RawMessage{}}
	size := 0
	err := k.eachEvent(id, after, limit, func(seq uint64, raw []byte) (bool, error) {
		data, _, err := event.AppendStoredJSON(nil, raw, id)
		if err != nil {
			return false, err
		}
		page.Events = append(page.Events, data)
		page.LatestSequence = seq
		size += len(data)
		return len(page.Events) < limit && size < PageBytes, nil
	})
	if err != nil {
		return EventPage{}, err
	}
	return page, nil
}

// PageBytes bounds the event bytes of one page of Events: a page holds at
// least one event and stops after the one that reaches the bound, so a
// client pages on from LatestSequence rather than take a page of a
// thousand large results at once.
const PageBytes = 1 << 20

// exists reports ErrNotFound for an unknown execution.
func (k *Kernel) exists(id string) error {
	k.mu.Lock()
	_, ok := k.live[id]
	k.mu.Unlock()
	if ok {
		return nil
	}
	_, err := k.summary(id)
	return err
}

// AppendEvents appends the JSON form of id's events after a sequence to
// dst, in order, and calls fn with each: its sequence, its type and its
// bytes, a part of the buffer it returns. fn returns false to stop. At
// most limit are read (limit <= 0: no bound), so that a reader that takes a
// batch reads no more than the batch from disk. A part fn was given stays
// valid when a later append moves the buffer: it only no longer shares it.
func (k *Kernel) AppendEvents(dst []byte, id string, after uint64, limit int, fn func(seq uint64, typ string, data []byte) bool) ([]byte, error) {
	// A stream's reader calls this on every wake-up, and the tail mostly
	// has what it reads: that path takes the tail's entries into room on
	// the stack and its callback stays there too. The store's path keeps
	// its own copy of dst, which its callback moves to the heap.
	var room [tailRoom]tailEntry
	if entries, ok := k.tailFrom(room[:0], id, after); ok {
		err := eachTail(id, entries, limit, func(seq uint64, raw []byte) (more bool, err error) {
			dst, more, err = appendEventJSON(dst, id, seq, raw, fn)
			return more, err
		})
		return dst, err
	}
	out := dst
	err := k.eachStored(id, after, limit, func(seq uint64, raw []byte) (more bool, err error) {
		out, more, err = appendEventJSON(out, id, seq, raw, fn)
		return more, err
	})
	return out, err
}

// appendEventJSON appends the JSON form of raw, the stored event seq of
// execution id, to dst, and returns what fn, given it, returns.
func appendEventJSON(dst []byte, id string, seq uint64, raw []byte, fn func(seq uint64, typ string, data []byte) bool) ([]byte, bool, error) {
	// An event's JSON is a few times its stored form. Room is made by
	// doubling: append grows a large buffer by a quarter at a time, and
	// a catch-up's batch was copied over and over (five times its size
	// allocated, for a batch of 256 events).
	if need := 4*len(raw) + len(id); cap(dst)-len(dst) < need {
		dst = slices.Grow(dst, max(need, cap(dst)))
	}
	at := len(dst)
	dst, typ, err := event.AppendStoredJSON(dst, raw, id)
	if err != nil {
		return dst, false, err
	}
	return dst, fn(seq, typ, dst[at:len(dst):len(dst)]), nil
}

// ReadEventValues is AppendEvents for readers that render the events in
// another shape: fn gets each event decoded, valid only during the call.
func (k *Kernel) ReadEventValues(id string, after uint64, fn func(*event.Event) bool) error {
	return k.eachEvent(id, after, 0, func(_ uint64, raw []byte) (bool, error) {
		var ev event.Event
		var err error
		if len(raw) > 0 && raw[0] == '{' {
			err = json.Unmarshal(raw, &ev)
		} else {
			ev, err = event.DecodeStored(raw, id)
		}
		if err != nil {
			return false, err
		}
		return fn(&ev), nil
	})
}

// eachEvent calls fn with the stored form of each of id's events after a
// sequence, in order, from the execution's tail when it holds the next one
// and from the store otherwise, at most limit of them (limit <= 0: no
// bound). fn returns false to stop, or the error of an event it cannot
// decode.
func (k *Kernel) eachEvent(id string, after uint64, limit int, fn func(seq uint64, raw []byte) (bool, error)) error {
	entries, ok := k.tailFrom(nil, id, after)
	if !ok {
		return k.eachStored(id, after, limit, fn)
	}
	return eachTail(id, entries, limit, fn)
}

// eachTail is eachEvent from entries, taken from id's tail.
func eachTail(id string, entries []tailEntry, limit int, fn func(seq uint64, raw []byte) (bool, error)) error {
	if limit > 0 && len(entries) > limit {
		entries = entries[:limit]
	}
	for _, e := range entries {
		more, err := fn(e.seq, e.raw)
		if err != nil {
			return newErr(ErrUnavailable, "service unavailable: decode event %d of %s: %v", e.seq, id, err)
		}
		if !more {
			break
		}
	}
	return nil
}

// eachStored is eachEvent from the store.
func (k *Kernel) eachStored(id string, after uint64, limit int, fn func(seq uint64, raw []byte) (bool, error)) error {
	var ferr error
	err := k.store.ScanAtMost(streamOf(id), after, limit, func(seq uint64, raw []byte) bool {
		var more bool
		if more, ferr = fn(seq, raw); ferr != nil {
			ferr = fmt.Errorf("decode event %d of %s: %w", seq, id, ferr)
			return false
		}
		return more
	})
	if err == nil {
		err = ferr
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrClosed):
		return newErr(ErrUnavailable, "service unavailable: shutting down")
	}
	return newErr(ErrUnavailable, "service unavailable: %v", err)
}
