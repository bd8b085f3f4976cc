package channel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/store"
)

// KindAdapter is the kind of a channel the gateway drives through an
// Adapter: a chat room, a direct message or a push subscription.
const KindAdapter = "adapter"

// The adapters' names: the channel ids of their channels, which native
// channels may not take (a native connection would take over the outbox),
// nor may they take the name of an adapter an embedder adds.
const (
	AdapterTelegram = "telegram"
	AdapterSlack    = "slack"
	AdapterWebPush  = "webpush"
)

// reserved reports whether a native channel may not use channelID.
func reserved(channelID string) bool {
	switch channelID {
	case WebhookChannel, AdapterTelegram, AdapterSlack, AdapterWebPush:
		return true
	}
	return false
}

// Errors an Adapter returns, and the ones of the adapter layer.
var (
	// ErrPermanent means a platform refused a send for good (a malformed
	// request, a message too long): it is not retried, and counted.
	ErrPermanent = errors.New("channel: refused by the platform")
	// ErrGone means the destination no longer exists (a push subscription
	// answered 404 or 410): its registration is removed.
	ErrGone = errors.New("channel: destination gone")
	// ErrDecided means the prompt was settled before this answer: the
	// record returned with it is the recorded outcome.
	ErrDecided = errors.New("channel: prompt already decided")
	// ErrNotStarted means the registry has no Decider yet (see Start).
	ErrNotStarted = errors.New("channel: adapters not started")
)

// RetryAfterError is a transient failure for which the platform named the
// wait (HTTP 429 Retry-After, Telegram's retry_after).
type RetryAfterError struct {
	After time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("%v (retry after %v)", e.Err, e.After)
}

func (e *RetryAfterError) Unwrap() error { return e.Err }

// Dest is one destination of an adapter: where an owner's cards go.
type Dest struct {
	// Owner is the person whose prompts the destination shows.
	Owner string
	// ID is the destination's native peer id: a chat id, a conversation
	// id, a push subscription's id.
	ID string
	// Data is the adapter's own registration data (a push subscription's
	// endpoint and keys). It is kept with the registration and never
	// listed, logged or written to an event.
	Data []byte
}

// Card is what an adapter shows for a prompt.
type Card struct {
	// Record is the prompt: pending on Send, pending or settled on Edit.
	Record bridge.Record
	// Values are the signed values of the answer buttons, by decision
	// (bridge.DecisionAllowOnce, ...), for a pending Record: an adapter puts
	// them in its buttons' callback data and hands them back in
	// Answer.Value. Each is at most 64 bytes.
	Values map[string]string
	// Token answers a pending Record as the destination's owner, on this
	// destination only, once (see Registry.AnswerToken): for a push
	// notification's actions and deep link.
	Token string
	// Note, on a pending Record, says why the card changed: an answer that
	// came in was not recorded (the gateway stopped first).
	Note string
}

// NoteNotRecorded is the Note of a card whose answer was received but not
// recorded before the gateway stopped.
const NoteNotRecorded = "An answer was received but not recorded before the gateway restarted: answer again."

// Adapter shows prompts on a platform and edits them once they are settled.
// The registry calls it from one goroutine per destination, with a bounded
// number of calls in flight in all, and retries what fails with back-off.
// An error it returns must not carry a secret (a token in a URL): the
// registry logs it.
type Adapter interface {
	// Name is the adapter's name, the channel id of its channels.
	Name() string
	// Send shows a pending prompt at dest and returns the platform's
	// reference to the card (a message id), for Edit. An error wrapping
	// ErrPermanent is not retried; ErrGone removes dest.
	Send(ctx context.Context, dest Dest, c Card) (ref string, err error)
	// Edit changes the card ref at dest to show c: a settled prompt's
	// outcome without buttons (or the card withdrawn), or a pending one
	// with its Note.
	Edit(ctx context.Context, dest Dest, ref string, c Card) error
}

// Route is a destination the deployment configures (see Router).
type Route struct {
	Owner string
	ID    string
}

// Router is an Adapter whose destinations the deployment configures (chat
// rooms mapped to people) rather than people registering them: Start
// registers its routes and removes its registrations that are not.
type Router interface {
	Routes() []Route
}

// Binder is an Adapter that answers through the registry (Answer,
// Refuse): New binds it to the registry it was given to.
type Binder interface {
	Bind(r *Registry)
}

// Runner is an Adapter with work of its own (Telegram's long polling):
// Start runs it on its own goroutine until the registry closes.
type Runner interface {
	Run(ctx context.Context)
}

// Decider settles prompts for the adapters: the node wires the bridge and
// the kernel.
type Decider interface {
	// Get returns the prompt actionID (bridge.ErrNotFound when unknown).
	Get(actionID string) (bridge.Record, error)
	// Pending returns owner's pending prompts.
	Pending(owner string) []bridge.Record
	// Decide settles rec with d. When another answer won first it returns
	// the recorded outcome and an error wrapping ErrDecided.
	Decide(ctx context.Context, rec bridge.Record, d kernel.Decision) (bridge.Record, error)
}

// Record kinds of the adapter layer.
const (
	// kindCard: a card shown, by destination key and action id.
	kindCard = "chcard"
	// kindPress: an answer received and not yet recorded.
	kindPress = "chpress"
)

// Outbox deliveries of the adapter layer itself.
const (
	// typeCardNote: edit the card of a still-pending prompt to say
	// NoteNotRecorded.
	typeCardNote = "card.note"
	// typeCardAdopt: record a card a press named (an adoption), and edit
	// it if its prompt is settled.
	typeCardAdopt = "card.adopt"
)

// card is a shown card's durable record.
type card struct {
	Ref     string    `msgpack:"r"`
	ShownAt time.Time `msgpack:"t"`
}

func cardID(k peer.Key, actionID string) string { return k.String() + "|" + actionID }

// destKey is the outbox key of owner's destination id of adapter. A
// destination is registered per owner: several people may share a chat,
// each with their own outbox, so its native peer id is "<id>@<owner>".
func destKey(adapter, owner, id string) peer.Key { return Key(adapter, id+"@"+owner) }

// destID is the destination id in an adapter registration's peer id.
func destID(peerID string) string {
	id, _, _ := strings.Cut(peerID, "@")
	return id
}

// driver shows one destination's outbox through its adapter.
type driver struct {
	key    peer.Key
	dest   Dest
	a      Adapter
	cancel context.CancelFunc
	done   chan struct{}
}

// adapterOf returns the adapter called name, or nil.
func (r *Registry) adapterOf(name string) Adapter {
	for _, a := range r.adapters {
		if a.Name() == name {
			return a
		}
	}
	return nil
}

// SetDest registers destination id of adapter for owner, or replaces its
// data, and starts showing owner's prompts there. fresh reports a new
// registration: the caller then forwards owner's pending prompts with
// Backfill. The adapter must be one of Options.Adapters.
func (r *Registry) SetDest(ctx context.Context, owner, adapter, id string, data []byte) (ch Channel, fresh bool, err error) {
	if err := checkIDs(owner, adapter, id); err != nil {
		return Channel{}, false, err
	}
	if strings.Contains(id, "@") {
		return Channel{}, false, fmt.Errorf("%w: destination id %q contains '@'", ErrInvalid, id)
	}
	a := r.adapterOf(adapter)
	if a == nil {
		return Channel{}, false, fmt.Errorf("%w: no %s adapter", ErrInvalid, adapter)
	}
	ol, release, err := r.enterOwner(owner)
	if err != nil {
		return Channel{}, false, err
	}
	defer release()
	k := destKey(adapter, owner, id)
	now := time.Now().UTC()
	rc := record{Owner: owner, ChannelID: adapter, PeerID: k.Consumer, Kind: KindAdapter, Data: data, CreatedAt: now, LastSeen: now}
	r.mu.Lock()
	cur := r.chans[k]
	switch {
	case cur != nil && cur.Owner != owner:
		r.mu.Unlock()
		return Channel{}, false, fmt.Errorf("%w: %s/%s", ErrOwned, adapter, id)
	case cur == nil && len(r.owners[owner]) >= r.maxChans:
		r.mu.Unlock()
		return Channel{}, false, fmt.Errorf("%w: %s has %d", ErrTooMany, owner, r.maxChans)
	case cur != nil:
		rc.CreatedAt = cur.CreatedAt
	}
	same := cur != nil && slices.Equal(cur.Data, data)
	r.mu.Unlock()
	fresh = cur == nil
	if same {
		return rc.channel(), false, nil
	}
	if fresh {
		if err := r.st.Admit(); err != nil {
			return Channel{}, false, err
		}
	}
	typ := TypeResumed
	if fresh {
		typ = TypeConnected
	}
	var b store.Batch
	err = b.Put(kindChannel, k.String(), &rc)
	if err == nil {
		err = r.commit(ctx, ol, &b, fact{typ: typ, p: payload{ChannelID: adapter, NativePeerID: k.Consumer, Kind: KindAdapter}})
	}
	if err != nil {
		return Channel{}, false, fmt.Errorf("channel: set %s destination of %s: %w", adapter, owner, err)
	}
	reg := rc
	r.mu.Lock()
	if cur != nil {
		r.removeLocked(cur)
	}
	r.addLocked(&reg)
	r.mu.Unlock()
	r.stopDriver(k)
	r.startDriver(&rc)
	return rc.channel(), fresh, nil
}

// RemoveDest removes owner's destination id of adapter, with its outbox
// and cards; reason goes into its channel.disconnected.
func (r *Registry) RemoveDest(ctx context.Context, owner, adapter, id, reason string) error {
	if err := checkIDs(owner, adapter, id); err != nil {
		return err
	}
	ol, release, err := r.enterOwner(owner)
	if err != nil {
		return err
	}
	defer release()
	rc, ok := r.recordOf(destKey(adapter, owner, id))
	if !ok || rc.Owner != owner || rc.Kind != KindAdapter {
		return fmt.Errorf("%w: %s has no %s destination %s", ErrNotFound, owner, adapter, id)
	}
	if err := r.drop(ctx, ol, &rc, reason); err != nil {
		return fmt.Errorf("channel: remove %s destination of %s: %w", adapter, owner, err)
	}
	return nil
}

// Dests returns the destinations of adapter registered for owner, or for
// every owner when owner is "", with their data.
func (r *Registry) Dests(adapter, owner string) []Dest {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Dest
	for _, rc := range r.chans {
		if rc.Kind == KindAdapter && rc.ChannelID == adapter && (owner == "" || rc.Owner == owner) {
			out = append(out, Dest{Owner: rc.Owner, ID: destID(rc.PeerID), Data: slices.Clone(rc.Data)})
		}
	}
	slices.SortFunc(out, func(a, b Dest) int {
		if a.Owner != b.Owner {
			return cmpString(a.Owner, b.Owner)
		}
		return cmpString(a.ID, b.ID)
	})
	return out
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Start gives the registry its Decider and starts the adapters: it
// registers the routers' routes, edits the cards whose answer a stop
// interrupted, drives every adapter destination's
// outbox and runs the runners. Until Start, adapter deliveries wait in
// their outboxes. ctx bounds the registrations only.
func (r *Registry) Start(ctx context.Context, d Decider) error {
	done, err := r.enter()
	if err != nil {
		return err
	}
	defer done()
	r.mu.Lock()
	if r.decider != nil {
		r.mu.Unlock()
		return errors.New("channel: Start called twice")
	}
	r.decider = d
	r.mu.Unlock()
	for _, a := range r.adapters {
		if rt, ok := a.(Router); ok {
			if err := r.syncRoutes(ctx, a.Name(), rt.Routes()); err != nil {
				return err
			}
		}
	}
	r.recover(ctx)
	r.mu.Lock()
	var recs []record
	for _, rc := range r.chans {
		if rc.Kind == KindAdapter {
			recs = append(recs, *rc)
		}
	}
	r.mu.Unlock()
	for i := range recs {
		r.startDriver(&recs[i])
	}
	for _, a := range r.adapters {
		if run, ok := a.(Runner); ok {
			r.runners.Add(1)
			go func() {
				defer r.runners.Done()
				run.Run(r.ctx)
			}()
		}
	}
	return nil
}

// deciderOf returns the Decider Start was given, or nil.
func (r *Registry) deciderOf() Decider {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.decider
}

// syncRoutes registers adapter's configured routes and removes its
// registrations that are not configured any more; a fresh route gets its
// owner's pending prompts.
func (r *Registry) syncRoutes(ctx context.Context, adapter string, routes []Route) error {
	want := map[peer.Key]string{}
	for _, rt := range routes {
		want[destKey(adapter, rt.Owner, rt.ID)] = rt.Owner
		ch, fresh, err := r.SetDest(ctx, rt.Owner, adapter, rt.ID, nil)
		if err != nil {
			return fmt.Errorf("channel: %s route %s=%s: %w", adapter, rt.Owner, rt.ID, err)
		}
		if fresh {
			if err := r.Backfill(ctx, ch, r.decider.Pending(rt.Owner)); err != nil {
				return err
			}
		}
	}
	for _, d := range r.Dests(adapter, "") {
		if want[destKey(adapter, d.Owner, d.ID)] != d.Owner {
			if err := r.RemoveDest(ctx, d.Owner, adapter, d.ID, "unconfigured"); err != nil {
				return err
			}
		}
	}
	return nil
}

// recover edits the cards of answers that a stop cut: the card of an
// answer received but not recorded says so (NoteNotRecorded). A prompt
// settled meanwhile needs nothing here: its retraction is in the outboxes
// already, or the bridge retracts it again at its start.
func (r *Registry) recover(ctx context.Context) {
	d := r.decider
	type pressed struct{ id, actionID, adapter, dest string }
	var presses []pressed
	_ = store.EachRecord(ctx, r.st, kindPress, "", func(id string, p *press) bool {
		presses = append(presses, pressed{id, p.ActionID, p.Adapter, p.Dest})
		return true
	})
	for _, p := range presses {
		if rec, err := d.Get(p.actionID); err == nil && rec.State == bridge.StatePending {
			if data, err := json.Marshal(&rec); err == nil {
				if _, err := r.hub.Deliver(ctx, destKey(p.adapter, rec.Owner, p.dest), typeCardNote, data); err != nil {
					r.log.Warn("card note not queued", "channel", p.adapter, "action", p.actionID, "err", err)
				}
			}
		}
		var b store.Batch
		b.Delete(kindPress, p.id)
		if err := r.st.Write(ctx, &b); err != nil {
			r.log.Warn("answer record not removed", "action", p.actionID, "err", err)
		}
	}
}

// startDriver starts the driver of adapter registration rc, once the
// registry has started and unless it is closing or rc's adapter is not
// configured.
func (r *Registry) startDriver(rc *record) {
	a := r.adapterOf(rc.ChannelID)
	r.mu.Lock()
	defer r.mu.Unlock()
	if a == nil || r.decider == nil || r.closed || r.drivers[rc.key()] != nil {
		return
	}
	ctx, cancel := context.WithCancel(r.ctx)
	dr := &driver{key: rc.key(), dest: Dest{Owner: rc.Owner, ID: destID(rc.PeerID), Data: slices.Clone(rc.Data)}, a: a,
		cancel: cancel, done: make(chan struct{})}
	r.drivers[dr.key] = dr
	go r.drive(ctx, dr)
}

// stopDriver stops k's driver and waits for it to let go of the outbox.
func (r *Registry) stopDriver(k peer.Key) {
	r.mu.Lock()
	dr := r.drivers[k]
	delete(r.drivers, k)
	r.mu.Unlock()
	if dr != nil {
		dr.cancel()
		<-dr.done
	}
}

// drive attaches to the destination's outbox like any consumer and shows
// each delivery through the adapter, in order, acknowledging it once
// shown, given up on, or found pointless (a prompt settled meanwhile).
func (r *Registry) drive(ctx context.Context, dr *driver) {
	defer close(dr.done)
	defer dr.cancel()
	conn, reset := r.hub.Attach(dr.key, nil)
	defer conn.Detach()
	if reset != nil {
		// Deliveries were dropped by the outbox bounds: show what is
		// pending now instead.
		r.log.Warn("channel outbox lost deliveries; showing the pending prompts again", "channel", dr.a.Name(), "owner", dr.dest.Owner)
		if err := r.Backfill(ctx, r.recordChannel(dr.key), r.deciderOf().Pending(dr.dest.Owner)); err != nil && ctx.Err() == nil {
			r.log.Warn("pending prompts not queued", "channel", dr.a.Name(), "owner", dr.dest.Owner, "err", err)
		}
	}
	for {
		d, ok := conn.Wait(ctx)
		if !ok {
			if ctx.Err() == nil {
				r.log.Warn("channel driver lost its outbox", "channel", dr.a.Name(), "owner", dr.dest.Owner, "err", conn.Err())
			}
			return
		}
		gone := r.carry(ctx, dr, d)
		if ctx.Err() != nil {
			return // not acknowledged: carried again after a restart
		}
		conn.Ack(d.Seq)
		r.touch(dr.key, time.Now().UTC())
		if gone {
			conn.Detach()
			r.dropGone(dr)
			return
		}
	}
}

// recordChannel returns the Channel of registration k.
func (r *Registry) recordChannel(k peer.Key) Channel {
	rc, _ := r.recordOf(k)
	return rc.channel()
}

// dropGone removes a destination its adapter found gone, from its own
// driver (which drop's stopDriver would wait for).
func (r *Registry) dropGone(dr *driver) {
	ol, release, err := r.enterOwner(dr.dest.Owner)
	if err != nil {
		return
	}
	defer release()
	rc, ok := r.recordOf(dr.key)
	if !ok || rc.Kind != KindAdapter {
		return
	}
	r.mu.Lock()
	if r.drivers[dr.key] == dr {
		delete(r.drivers, dr.key)
	}
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(r.ctx, writeTimeout)
	defer cancel()
	r.count(dr.a.Name(), StatDropped, "gone")
	if err := r.drop(ctx, ol, &rc, "gone"); err != nil {
		r.log.Warn("gone destination not removed", "channel", dr.a.Name(), "owner", dr.dest.Owner, "err", err)
		return
	}
	r.log.Info("channel destination gone; removed", "channel", dr.a.Name(), "owner", dr.dest.Owner)
}

// forgetCards deletes the cards of registration k: it was removed.
func (r *Registry) forgetCards(ctx context.Context, k peer.Key) {
	var b store.Batch
	_ = r.st.RecordsWithPrefix(kindCard, k.String()+"|", func(id string, _ func(any) error) bool {
		b.Delete(kindCard, id)
		return true
	})
	if b.Len() > 0 {
		if err := r.st.Write(ctx, &b); err != nil {
			r.log.Warn("cards of a removed channel not deleted", "channel", k.ID, "err", err)
		}
	}
}

// carry shows one delivery; gone reports that the adapter found the
// destination gone.
func (r *Registry) carry(ctx context.Context, dr *driver, d peer.Delivery) (gone bool) {
	var rec bridge.Record
	if err := json.Unmarshal(d.Data, &rec); err != nil || rec.ActionID == "" {
		r.count(dr.a.Name(), StatDropped, "invalid")
		r.log.Warn("channel delivery is not a prompt; skipped", "channel", dr.a.Name(), "type", d.Type, "delivery", d.Seq)
		return false
	}
	switch d.Type {
	case event.PermissionRequested:
		return r.show(ctx, dr, rec)
	case event.PermissionResolved:
		return r.edit(ctx, dr, rec, "")
	case typeCardNote:
		return r.edit(ctx, dr, rec, NoteNotRecorded)
	case typeCardAdopt:
		return r.adopt(ctx, dr, d.Data)
	}
	r.count(dr.a.Name(), StatDropped, "invalid")
	return false
}

// show sends a pending prompt's card unless one was shown already (a
// delivery carried again) or the prompt is no longer pending. A failure
// is retried while the prompt stays pending.
func (r *Registry) show(ctx context.Context, dr *driver, rec bridge.Record) (gone bool) {
	id := cardID(dr.key, rec.ActionID)
	var c card
	if err := r.st.Get(kindCard, id, &c); err == nil {
		return false
	}
	name := dr.a.Name()
	for attempt := 0; ; attempt++ {
		if !r.stillPending(rec) {
			return false
		}
		var ref string
		err := r.attempt(ctx, func(ctx context.Context) (err error) {
			ref, err = dr.a.Send(ctx, dr.dest, r.cardFor(dr, rec, ""))
			return err
		})
		if err == nil {
			r.count(name, StatSent, "")
			var b store.Batch
			_ = b.Put(kindCard, id, &card{Ref: ref, ShownAt: time.Now().UTC()})
			if err := r.st.Write(ctx, &b); err != nil && ctx.Err() == nil {
				r.log.Warn("card shown but not recorded: it will not be edited", "channel", name, "action", rec.ActionID, "err", err)
			}
			return false
		}
		if stop, gone := r.failed(ctx, name, "send", rec.ActionID, attempt, err); stop {
			return gone
		}
	}
}

// adopt records the card of an adoption unless the destination has a
// record of one already, and edits it if its prompt was settled when
// pressed: the retraction that came before found no card to edit.
func (r *Registry) adopt(ctx context.Context, dr *driver, data []byte) (gone bool) {
	var a adoption
	if err := json.Unmarshal(data, &a); err != nil || a.Ref == "" {
		r.count(dr.a.Name(), StatDropped, "invalid")
		return false
	}
	id := cardID(dr.key, a.ActionID)
	var c card
	if err := r.st.Get(kindCard, id, &c); !errors.Is(err, store.ErrNotFound) {
		return false
	}
	var b store.Batch
	_ = b.Put(kindCard, id, &card{Ref: a.Ref, ShownAt: time.Now().UTC()})
	if err := r.st.Write(ctx, &b); err != nil {
		if ctx.Err() == nil {
			r.log.Warn("pressed card not recorded: it will not be edited", "channel", dr.a.Name(), "action", a.ActionID, "err", err)
		}
		return false
	}
	if a.State == bridge.StatePending {
		return false
	}
	return r.edit(ctx, dr, a.Record, "")
}

// edit edits the card of rec, if one was shown: to its outcome when rec
// is settled (the card is then forgotten), or with note when pending.
// Failures are retried MaxAttempts times.
func (r *Registry) edit(ctx context.Context, dr *driver, rec bridge.Record, note string) (gone bool) {
	id := cardID(dr.key, rec.ActionID)
	var c card
	if err := r.st.Get(kindCard, id, &c); err != nil {
		return false
	}
	settled := rec.State != bridge.StatePending
	if !settled && note == "" {
		return false
	}
	name := dr.a.Name()
	for attempt := 0; attempt < r.maxAttempts; attempt++ {
		err := r.attempt(ctx, func(ctx context.Context) error {
			return dr.a.Edit(ctx, dr.dest, c.Ref, r.cardFor(dr, rec, note))
		})
		if err == nil {
			r.count(name, StatEdited, "")
			break
		}
		if stop, gone := r.failed(ctx, name, "edit", rec.ActionID, attempt, err); stop {
			if gone || ctx.Err() != nil {
				return gone
			}
			break
		}
		if attempt == r.maxAttempts-1 {
			r.count(name, StatDropped, "attempts")
			r.log.Warn("card not edited: giving up", "channel", name, "action", rec.ActionID, "attempts", r.maxAttempts)
		}
	}
	if settled {
		var b store.Batch
		b.Delete(kindCard, id)
		if err := r.st.Write(ctx, &b); err != nil && ctx.Err() == nil {
			r.log.Warn("settled card not forgotten", "channel", name, "action", rec.ActionID, "err", err)
		}
	}
	return false
}

// attempt runs one call of an adapter, holding one of the MaxSends slots
// shared by every destination, within SendTimeout.
func (r *Registry) attempt(ctx context.Context, call func(context.Context) error) error {
	select {
	case r.sends <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-r.sends }()
	actx, cancel := context.WithTimeout(ctx, r.sendTimeout)
	defer cancel()
	return call(actx)
}

// failed handles a failed call: stop reports that it must not be retried
// (permanent, gone, or the registry stopping); otherwise it has waited the
// back-off.
func (r *Registry) failed(ctx context.Context, name, what, actionID string, attempt int, err error) (stop, gone bool) {
	if ctx.Err() != nil {
		return true, false
	}
	switch {
	case errors.Is(err, ErrGone):
		return true, true
	case errors.Is(err, ErrPermanent):
		r.count(name, StatDropped, "refused")
		r.log.Warn("channel "+what+" refused by the platform; not retried", "channel", name, "action", actionID, "err", err)
		return true, false
	}
	r.count(name, StatFailed, "")
	wait := r.backoff(attempt)
	var ra *RetryAfterError
	if errors.As(err, &ra) {
		wait = min(max(wait, ra.After), maxRetryAfter)
	}
	r.log.Warn("channel "+what+" failed; retrying", "channel", name, "action", actionID, "attempt", attempt+1,
		"retry_in", wait, "err", err)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return false, false
	case <-ctx.Done():
		return true, false
	}
}

// maxRetryAfter caps the wait a platform may ask for.
const maxRetryAfter = 10 * time.Minute

// stillPending reports whether a prompt is worth showing: pending in the
// bridge and not past its expiry.
func (r *Registry) stillPending(rec bridge.Record) bool {
	if rec.ExpiresAt != nil && !time.Now().Before(*rec.ExpiresAt) {
		return false
	}
	r.mu.Lock()
	_, settled := r.settled[rec.ActionID]
	d := r.decider
	r.mu.Unlock()
	if settled {
		return false
	}
	cur, err := d.Get(rec.ActionID)
	return err == nil && cur.State == bridge.StatePending
}

// cardFor is the card of rec at dr's destination, with its signed values
// and token while rec is pending.
func (r *Registry) cardFor(dr *driver, rec bridge.Record, note string) Card {
	c := Card{Record: rec, Note: note}
	if rec.State != bridge.StatePending {
		return c
	}
	c.Values = make(map[string]string, 3)
	for _, d := range []string{bridge.DecisionAllowOnce, bridge.DecisionAllowAlways, bridge.DecisionDeny} {
		c.Values[d] = r.keys.value(dr.a.Name(), dr.dest.ID, rec.ActionID, d)
	}
	c.Token = r.keys.token(tokenClaims{Action: rec.ActionID, Owner: dr.dest.Owner, Adapter: dr.a.Name(), Dest: dr.dest.ID,
		Expires: tokenExpiry(rec, time.Now()).Unix()})
	return c
}

// Hook is an endpoint through which a platform calls the gateway (Slack's
// interactions, Telegram's webhook). The gateway serves it without a
// bearer token: Serve authenticates the request itself, by the platform's
// signature or secret.
type Hook struct {
	// Path is the request path, under /v0/channels/.
	Path string
	// Form says the platform posts application/x-www-form-urlencoded
	// bodies rather than JSON.
	Form bool
	// Serve answers a POST, given its header and raw body (at most 64 KiB).
	Serve func(ctx context.Context, h http.Header, body []byte) HookReply
}

// HookReply is a Hook's answer.
type HookReply struct {
	Status      int
	ContentType string
	Body        []byte
}

// Hooker is an Adapter with inbound endpoints.
type Hooker interface {
	Hooks() []Hook
}
