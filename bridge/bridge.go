// Package bridge is the permission bridge: one durable record per permission
// prompt, carried to every human channel of the session's owner, settled by
// the first valid answer, and kept as an audit of who decided what, where
// and when.
//
// The kernel decides; the bridge records and relays. Every record change is
// staged by the kernel into the same store batch as its own events (the
// bridge implements kernel.Approvals), and the execution's lock is the
// compare-and-swap that lets exactly one answer win. An execution waits on
// the record, not on a socket: a channel disconnecting is not an answer,
// and a restart keeps every pending prompt.
package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/store"
)

// Sentinel errors.
var (
	// ErrNotFound: no prompt has that action id.
	ErrNotFound = errors.New("bridge: action not found")
	// ErrDecision: the decision is not allow_once, allow_always or deny.
	ErrDecision = errors.New("bridge: invalid decision")
)

// States of a record.
const (
	StatePending   = "pending"
	StateApproved  = "approved"
	StateDenied    = "denied"
	StateExpired   = "expired"
	StateCancelled = "cancelled"
)

// Decisions a person can give.
const (
	DecisionAllowOnce   = "allow_once"
	DecisionAllowAlways = "allow_always"
	DecisionDeny        = "deny"
)

// Record is one prompt: what is asked and, once settled, the audit of the
// answer.
type Record struct {
	kernel.Approval
	State     string            `json:"state" msgpack:"state"`
	Decision  string            `json:"decision,omitempty" msgpack:"decision"`
	Scope     string            `json:"scope,omitempty" msgpack:"scope"`
	Reason    string            `json:"decision_reason,omitempty" msgpack:"dreason"`
	DecidedAt *time.Time        `json:"decided_at,omitempty" msgpack:"dat"`
	DecidedBy *kernel.DecidedBy `json:"decided_by,omitempty" msgpack:"dby"`
}

// Notifier carries prompts to people: every channel of the owner. The
// channel registry implements it.
type Notifier interface {
	// Prompt forwards a new pending prompt.
	Prompt(r Record)
	// Retract tells the channels that a prompt was settled (they remove
	// it) and, for a settlement by a person's answer, where the answer came
	// back from (r.DecidedBy): it is called once per settled record,
	// whichever door the answer came through.
	Retract(r Record)
}

// Options configure a Bridge.
type Options struct {
	Store    *store.Store // required
	Notifier Notifier     // nil: records only
	Logger   *slog.Logger
}

// Bridge holds the prompts. It is safe for concurrent use.
type Bridge struct {
	st  *store.Store
	n   Notifier
	log *slog.Logger

	mu      sync.Mutex
	pending map[string]*Record // action id -> record
	allow   map[string]bool    // session "/" tool -> allowed always
}

// Record kinds in the store.
const (
	kindAction    = "action"
	kindPending   = "action_pending"
	kindForwarded = "action_forwarded" // the prompt reached the channels' outboxes
	kindRetract   = "action_retract"   // settled; the retraction may not have reached the channels
	kindAllow     = "allow_always"
)

// New loads pending prompts and allow-always rules from the store.
func New(ctx context.Context, o Options) (*Bridge, error) {
	if o.Store == nil {
		return nil, errors.New("bridge: Options.Store is required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	b := &Bridge{st: o.Store, n: o.Notifier, log: o.Logger, pending: map[string]*Record{}, allow: map[string]bool{}}
	var ids []string
	if err := b.st.Records(kindPending, func(id string, _ func(any) error) bool {
		ids = append(ids, id)
		return ctx.Err() == nil
	}); err != nil {
		return nil, fmt.Errorf("bridge: load pending: %w", err)
	}
	for _, id := range ids {
		var r Record
		if err := b.st.Get(kindAction, id, &r); err != nil {
			return nil, fmt.Errorf("bridge: load action %s: %w", id, err)
		}
		if r.State == StatePending {
			b.pending[id] = &r
		}
	}
	if err := b.st.Records(kindAllow, func(id string, _ func(any) error) bool {
		b.allow[id] = true
		return ctx.Err() == nil
	}); err != nil {
		return nil, fmt.Errorf("bridge: load allow rules: %w", err)
	}
	b.forwardUnsent(ctx)
	b.retractUnsent(ctx)
	return b, nil
}

// retractUnsent retracts the settled prompts whose retraction may not
// have reached the channels: the gateway stopped between a settlement's
// commit and its retraction's. Each settlement is retracted once, unless
// a stop falls between the retraction's commit and its marker's removal.
func (b *Bridge) retractUnsent(ctx context.Context) {
	if b.n == nil {
		return
	}
	var ids []string
	_ = b.st.Records(kindRetract, func(id string, _ func(any) error) bool {
		ids = append(ids, id)
		return ctx.Err() == nil
	})
	for _, id := range ids {
		if r, err := b.Get(id); err == nil && r.State != StatePending {
			b.retract(ctx, r)
		}
	}
}

// retract hands a settled record to the channels and removes its marker.
func (b *Bridge) retract(ctx context.Context, r Record) {
	b.n.Retract(r)
	var batch store.Batch
	batch.DeleteLazy(kindRetract, r.ActionID)
	if err := b.st.Write(ctx, &batch); err != nil {
		b.log.Warn("record prompt retraction", "action", r.ActionID, "err", err)
	}
}

// forwardUnsent forwards the pending prompts whose fan-out was not recorded:
// the gateway stopped between a prompt's commit and its fan-out. A prompt
// may reach a channel twice that way; channels dedupe by action_id.
func (b *Bridge) forwardUnsent(ctx context.Context) {
	if b.n == nil {
		return
	}
	for _, r := range b.Pending("") {
		var sent bool
		if err := b.st.Get(kindForwarded, r.ActionID, &sent); err == nil {
			continue
		}
		b.forward(ctx, r)
	}
}

// forward hands a prompt to the channels and records that it did.
func (b *Bridge) forward(ctx context.Context, r Record) {
	b.n.Prompt(r)
	var batch store.Batch
	_ = batch.Put(kindForwarded, r.ActionID, true)
	if err := b.st.Write(ctx, &batch); err != nil {
		b.log.Warn("record prompt fan-out", "action", r.ActionID, "err", err)
	}
}

// Requested implements kernel.Approvals.
func (b *Bridge) Requested(batch *store.Batch, a kernel.Approval) (apply, publish func()) {
	r := Record{Approval: a, State: StatePending}
	_ = batch.Put(kindAction, a.ActionID, &r)
	_ = batch.Put(kindPending, a.ActionID, a.Owner)
	apply = func() {
		b.mu.Lock()
		b.pending[a.ActionID] = &r
		b.mu.Unlock()
	}
	publish = func() {
		// A fast answer may have settled the prompt between the commit
		// and now; only a still-pending prompt is forwarded.
		b.mu.Lock()
		_, still := b.pending[a.ActionID]
		b.mu.Unlock()
		if still && b.n != nil {
			b.forward(context.Background(), r)
		}
	}
	return apply, publish
}

// Resolved implements kernel.Approvals.
func (b *Bridge) Resolved(batch *store.Batch, actionID string, d kernel.Decision) (apply, publish func()) {
	r, err := b.Get(actionID)
	if err != nil {
		b.log.Error("resolve unknown action", "action", actionID, "err", err)
		return nil, nil
	}
	r.settle(d)
	_ = batch.Put(kindAction, actionID, &r)
	batch.Delete(kindPending, actionID)
	batch.Delete(kindForwarded, actionID)
	if b.n != nil {
		// Lazy: the marker lives until the retraction is committed, a
		// moment later, and so mostly never reaches Badger.
		_ = batch.CreateLazy(kindRetract, actionID, true)
	}
	allowKey := ""
	if r.State == StateApproved && d.Scope == kernel.ScopeSession {
		allowKey = r.SessionID + "/" + r.ToolID
		_ = batch.Put(kindAllow, allowKey, true)
	}
	apply = func() {
		b.mu.Lock()
		delete(b.pending, actionID)
		if allowKey != "" {
			b.allow[allowKey] = true
		}
		b.mu.Unlock()
	}
	publish = func() {
		if b.n != nil {
			b.retract(context.Background(), r)
		}
	}
	return apply, publish
}

// settle records a decision on the record.
func (r *Record) settle(d kernel.Decision) {
	switch d.Outcome {
	case kernel.OutcomeApproved:
		r.State, r.Decision = StateApproved, DecisionAllowOnce
		if d.Scope == kernel.ScopeSession {
			r.Decision = DecisionAllowAlways
		}
	case kernel.OutcomeDenied:
		r.State, r.Decision = StateDenied, DecisionDeny
	case kernel.OutcomeExpired:
		r.State = StateExpired
	default:
		r.State = StateCancelled
	}
	at := d.DecidedAt
	r.Scope, r.Reason, r.DecidedBy, r.DecidedAt = d.Scope, d.Reason, d.DecidedBy, &at
}

// AllowedAlways implements kernel.Approvals.
func (b *Bridge) AllowedAlways(sessionID, toolID string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.allow[sessionID+"/"+toolID]
}

// Get returns the record of actionID.
func (b *Bridge) Get(actionID string) (Record, error) {
	b.mu.Lock()
	if r, ok := b.pending[actionID]; ok {
		b.mu.Unlock()
		return *r, nil
	}
	b.mu.Unlock()
	var r Record
	if err := b.st.Get(kindAction, actionID, &r); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return Record{}, fmt.Errorf("%w: %s", ErrNotFound, actionID)
		}
		return Record{}, fmt.Errorf("bridge: read action %s: %w", actionID, err)
	}
	return r, nil
}

// Pending returns the pending prompts of owner ("" for all), oldest first.
func (b *Bridge) Pending(owner string) []Record {
	b.mu.Lock()
	out := make([]Record, 0, len(b.pending))
	for _, r := range b.pending {
		if owner == "" || r.Owner == owner {
			out = append(out, *r)
		}
	}
	b.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ActionID < out[j].ActionID })
	return out
}

// List returns records in action id order (oldest first), after the
// cursor (an action id), filtered by state when not empty and by visible
// when not nil: the records the caller may see.
func (b *Bridge) List(ctx context.Context, state string, visible func(*Record) bool, after string, limit int) ([]Record, string, error) {
	if state == StatePending {
		all := b.Pending("")
		i := sort.Search(len(all), func(i int) bool { return all[i].ActionID > after })
		all = all[i:]
		if visible != nil {
			all = slices.DeleteFunc(all, func(r Record) bool { return !visible(&r) })
		}
		next := ""
		if len(all) > limit {
			all, next = all[:limit], all[limit-1].ActionID
		}
		return all, next, nil
	}
	out := []Record{}
	next := ""
	err := b.st.RecordsWithPrefix(kindAction, "", func(id string, decode func(any) error) bool {
		if id <= after {
			return ctx.Err() == nil
		}
		var r Record
		if decode(&r) != nil || (state != "" && r.State != state) || (visible != nil && !visible(&r)) {
			return ctx.Err() == nil
		}
		if len(out) == limit {
			next = out[len(out)-1].ActionID
			return false
		}
		out = append(out, r)
		return ctx.Err() == nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("bridge: list: %w", err)
	}
	return out, next, ctx.Err()
}

// ParseDecision maps a person's decision to the kernel's outcome and scope.
func ParseDecision(s string) (outcome, scope string, err error) {
	switch s {
	case DecisionAllowOnce:
		return kernel.OutcomeApproved, kernel.ScopeOnce, nil
	case DecisionAllowAlways:
		return kernel.OutcomeApproved, kernel.ScopeSession, nil
	case DecisionDeny:
		return kernel.OutcomeDenied, kernel.ScopeOnce, nil
	}
	return "", "", fmt.Errorf("%w %q: want allow_once, allow_always or deny", ErrDecision, s)
}
