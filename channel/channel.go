package channel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/ident"
	"github.com/gatehouse-dev/gatehouse/internal/option"
	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/store"
)

// Sentinel errors. Callers branch on them with errors.Is.
var (
	// ErrInvalid means an argument is malformed: an id, a webhook URL or
	// secret, a message body.
	ErrInvalid = errors.New("channel: invalid argument")
	// ErrOwned means the channel id and native peer id are registered by
	// another principal; pick another native peer id.
	ErrOwned = errors.New("channel: registered by another principal")
	// ErrTooMany means the owner already has the maximum number of channels.
	ErrTooMany = errors.New("channel: too many channels")
	// ErrNotFound means the owner has no such channel (or no webhook).
	ErrNotFound = errors.New("channel: not found")
	// ErrTooLarge means a message body is over MaxMessage.
	ErrTooLarge = errors.New("channel: message too large")
	// ErrClosed means the registry was closed.
	ErrClosed = errors.New("channel: registry closed")
)

// Channel event types: the Channel family of the Agent Runtime spec (seed
// 001), written to the owner's channel log.
const (
	TypeConnected           = "channel.connected"
	TypeDisconnected        = "channel.disconnected"
	TypeResumed             = "channel.resumed"
	TypeMessage             = "channel.message"
	TypePermissionForwarded = "channel.permission_forwarded"
	TypePermissionReturned  = "channel.permission_returned"
)

// Channel kinds.
const (
	// KindNative is a channel that connects to the gateway (WebSocket or SSE).
	KindNative = "native"
	// KindWebhook is an outbound webhook the gateway POSTs to.
	KindWebhook = "webhook"
)

// WebhookChannel is the channel id of every webhook channel; native channels
// cannot use it, so a connection can never take over a webhook's outbox.
const WebhookChannel = "webhook"

// RoleChannel is the peer role of channel outboxes.
const RoleChannel = "channel"

// Limits.
const (
	// MaxMessage bounds the body of a channel.message.
	MaxMessage = 64 << 10
	// MaxChannelID bounds a channel id, in bytes.
	MaxChannelID = 128
	// MaxPeerID bounds a native peer id and an owner, in bytes.
	MaxPeerID = 256
	// MaxURL bounds a webhook URL, in bytes.
	MaxURL = 2048
	// MinSecret is the shortest webhook secret accepted, in bytes.
	MinSecret = 16
	// MaxSecret is the longest webhook secret accepted, in bytes.
	MaxSecret = 1024
)

// writeTimeout bounds the wait to queue a write for calls that have no
// context of their own (the bridge.Notifier methods, Disconnected).
const writeTimeout = 10 * time.Second

const kindChannel = "channel"

// Key returns the peer hub key of a channel's outbox.
func Key(channelID, peerID string) peer.Key {
	return peer.Key{Role: RoleChannel, ID: channelID, Consumer: peerID}
}

// Options configure a Registry.
type Options struct {
	// Store keeps the registrations and the channel logs; required.
	Store *store.Store
	// Hub holds the channels' outboxes; required. It must keep its outboxes
	// in Store, because a prompt's deliveries are written in the same batch
	// as the channel.permission_forwarded events that record them.
	Hub *peer.Hub
	// Logger receives warnings; nil discards.
	Logger *slog.Logger
	// HTTPClient sends webhooks; nil means a client with a 10s timeout
	// that follows no redirects, ignores proxy settings and, at dial time,
	// refuses every address ErrDeniedAddress describes that WebhookAllow
	// does not list. A client given here is used as is: its transport must
	// apply its own address policy.
	HTTPClient *http.Client
	// WebhookAllow lists the networks webhooks may reach although they are
	// loopback, private, link-local or otherwise internal (see
	// ErrDeniedAddress); nil lets webhooks reach public addresses only.
	WebhookAllow []netip.Prefix
	// Retention is how long a native channel stays registered once it is
	// neither connected nor seen (connected, disconnected, sent a message
	// or an answer); then it is removed with its outbox, and registers
	// afresh, with the pending prompts, when it comes back. Webhook
	// channels stay until removed. Zero means 1h.
	Retention time.Duration
	// RetryBase is the first webhook retry delay, doubled per failure;
	// zero means 500ms.
	RetryBase time.Duration
	// RetryMax caps the webhook retry delay; zero means 1m.
	RetryMax time.Duration
	// MaxChannels bounds the channels of one owner; zero means 64.
	MaxChannels int
	// LogLimit is how many events of each owner's channel log are kept;
	// older ones are deleted. Zero means 10000.
	LogLimit int

	// Adapters are the chat and push channels the gateway drives itself
	// (see Adapter); Start starts them.
	Adapters []Adapter
	// Responders lists, by policy rule id, the people who may answer that
	// rule's prompts through an adapter; a rule not listed is answered by
	// the prompt's owner only.
	Responders map[string][]string
	// MaxSends bounds the adapter calls in flight in all; zero means 16.
	MaxSends int
	// SendTimeout bounds one adapter call; zero means 10s.
	SendTimeout time.Duration
	// MaxAttempts bounds the attempts to edit a card; zero means 10. A
	// card is sent as long as its prompt is pending.
	MaxAttempts int
}

// Defaults returns the value each zero bound of the adapter layer's
// Options takes; the other fields are zero.
func Defaults() Options {
	return Options{MaxSends: 16, SendTimeout: 10 * time.Second, MaxAttempts: 10}
}

// Channel is one registered human channel.
type Channel struct {
	// Owner is the principal whose prompts the channel receives.
	Owner string `json:"owner"`
	// ChannelID names the channel (an app, a bot, the web page).
	ChannelID string `json:"channel_id"`
	// PeerID is the native peer id: who or what on that channel.
	PeerID string `json:"native_peer_id"`
	// Kind is KindNative, KindWebhook or KindAdapter.
	Kind string `json:"kind"`
	// URL is a webhook's origin: the scheme and host of its URL, nothing
	// else (see origin).
	URL string `json:"url,omitempty"`
	// CreatedAt is when the channel was first registered.
	CreatedAt time.Time `json:"created_at"`
	// LastSeen is the channel's last connect, disconnect, message, answer
	// or (for a webhook) acknowledged delivery.
	LastSeen time.Time `json:"last_seen"`
}

// record is a channel's durable registration. It holds the webhook secret,
// which never leaves the package: Channel has no field for it.
type record struct {
	Owner     string    `msgpack:"o"`
	ChannelID string    `msgpack:"c"`
	PeerID    string    `msgpack:"p"`
	Kind      string    `msgpack:"k"`
	URL       string    `msgpack:"u,omitempty"`
	Secret    []byte    `msgpack:"s,omitempty"`
	Data      []byte    `msgpack:"d,omitempty"` // an adapter's: never in Channel
	CreatedAt time.Time `msgpack:"ca"`
	LastSeen  time.Time `msgpack:"ls"`
}

func (rc *record) key() peer.Key { return Key(rc.ChannelID, rc.PeerID) }

func (rc *record) channel() Channel {
	return Channel{Owner: rc.Owner, ChannelID: rc.ChannelID, PeerID: rc.PeerID, Kind: rc.Kind,
		URL: origin(rc.URL), CreatedAt: rc.CreatedAt, LastSeen: rc.LastSeen}
}

// origin is all that is ever shown of a webhook's URL, in logs, events,
// exports and answers: its scheme and host (with the port). Slack,
// Discord and Telegram put the webhook's secret in its path or query, and
// a password may sit in its user info; only the sender uses the rest.
func origin(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return ""
	}
	return u.Scheme + "://" + u.Host
}

// ownerLog serialises the writes of one owner's channel log, so sequences
// are assigned, and become readable, strictly in order. It also serialises
// the owner's registrations, so a fresh/resumed verdict and its event agree.
type ownerLog struct {
	mu     sync.Mutex
	owner  string
	seq    uint64
	loaded bool
}

// settledMemory bounds how many settled action ids are remembered.
const settledMemory = 4096

// Registry holds the channels of every owner. It is safe for concurrent use.
type Registry struct {
	st        *store.Store
	hub       *peer.Hub
	log       *slog.Logger
	client    *http.Client
	egress    egress
	retention time.Duration
	retryBase time.Duration
	retryMax  time.Duration
	maxChans  int
	logLimit  uint64

	ctx    context.Context // senders' parent; cancelled by Close
	cancel context.CancelFunc

	mu      sync.Mutex
	closed  bool
	chans   map[peer.Key]*record
	owners  map[string]map[peer.Key]*record
	claims  map[peer.Key]string // fresh registrations being written -> owner
	logs    map[string]*ownerLog
	senders map[peer.Key]*sender
	// settled remembers recently retracted prompts, so a Prompt that loses
	// the race with its own Retract does not resurrect a settled card.
	settled     map[string]struct{}
	settledRing []string
	settledNext int

	ops       sync.WaitGroup // calls in flight; Close waits for them
	closeOnce sync.Once
	expiring  chan struct{} // closed when expireLoop has returned

	// The adapter layer (adapter.go, answer.go).
	adapters    []Adapter
	responders  map[string][]string
	keys        *keys
	sends       chan struct{} // a slot per adapter call in flight
	sendTimeout time.Duration
	maxAttempts int
	decider     Decider // set by Start
	drivers     map[peer.Key]*driver
	runners     sync.WaitGroup
	spendMu     sync.Mutex
	stats       counters
}

// New loads the registered channels from o.Store and starts a sender for
// every webhook channel. ctx bounds the loading only.
func New(ctx context.Context, o Options) (*Registry, error) {
	if o.Store == nil {
		return nil, fmt.Errorf("%w: Options.Store is required", ErrInvalid)
	}
	if o.Hub == nil {
		return nil, fmt.Errorf("%w: Options.Hub is required", ErrInvalid)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	g := egress{allow: slices.Clone(o.WebhookAllow)}
	if o.HTTPClient == nil {
		o.HTTPClient = g.client()
	}
	option.Default(&o.Retention, time.Hour)
	option.Default(&o.RetryBase, 500*time.Millisecond)
	option.Default(&o.RetryMax, time.Minute)
	o.RetryMax = max(o.RetryMax, o.RetryBase)
	option.Default(&o.MaxChannels, 64)
	option.Default(&o.LogLimit, 10000)
	d := Defaults()
	option.Default(&o.MaxSends, d.MaxSends)
	option.Default(&o.SendTimeout, d.SendTimeout)
	option.Default(&o.MaxAttempts, d.MaxAttempts)
	names := map[string]bool{}
	for _, a := range o.Adapters {
		if err := checkID("adapter name", a.Name(), MaxChannelID, false); err != nil {
			return nil, err
		}
		if a.Name() == WebhookChannel || names[a.Name()] {
			return nil, fmt.Errorf("%w: adapter name %q is taken", ErrInvalid, a.Name())
		}
		names[a.Name()] = true
	}
	k, err := loadKeys(ctx, o.Store)
	if err != nil {
		return nil, err
	}
	r := &Registry{
		st: o.Store, hub: o.Hub, log: o.Logger, client: o.HTTPClient, egress: g, retention: o.Retention,
		retryBase: o.RetryBase, retryMax: o.RetryMax, maxChans: o.MaxChannels, logLimit: uint64(o.LogLimit),
		chans: map[peer.Key]*record{}, owners: map[string]map[peer.Key]*record{}, claims: map[peer.Key]string{},
		logs: map[string]*ownerLog{}, senders: map[peer.Key]*sender{}, settled: map[string]struct{}{},
		settledRing: make([]string, settledMemory),
		adapters:    slices.Clone(o.Adapters), responders: o.Responders, keys: k,
		sends: make(chan struct{}, o.MaxSends), sendTimeout: o.SendTimeout, maxAttempts: o.MaxAttempts,
		drivers: map[peer.Key]*driver{},
	}
	for _, a := range r.adapters {
		if b, ok := a.(Binder); ok {
			b.Bind(r)
		}
	}
	err = store.EachRecord(ctx, r.st, kindChannel, "", func(_ string, rc *record) bool {
		r.addLocked(rc)
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("channel: load channels: %w", err)
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	for _, rc := range r.chans {
		if rc.Kind == KindWebhook {
			r.startSender(rc)
		}
	}
	r.expiring = make(chan struct{})
	go r.expireLoop()
	return r, nil
}

// Close stops the webhook senders and waits for them and for calls in
// flight. Unacknowledged deliveries stay in the outboxes for the next start.
func (r *Registry) Close() {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		r.mu.Unlock()
		r.ops.Wait()
		r.cancel()
		r.mu.Lock()
		senders := make([]*sender, 0, len(r.senders))
		for k, s := range r.senders {
			senders = append(senders, s)
			delete(r.senders, k)
		}
		r.mu.Unlock()
		for _, s := range senders {
			<-s.done
		}
		r.mu.Lock()
		drivers := make([]*driver, 0, len(r.drivers))
		for k, d := range r.drivers {
			drivers = append(drivers, d)
			delete(r.drivers, k)
		}
		r.mu.Unlock()
		for _, d := range drivers {
			<-d.done
		}
		r.runners.Wait()
		<-r.expiring
	})
}

// expireLoop removes native channels gone for longer than the retention,
// until the registry is closed.
func (r *Registry) expireLoop() {
	defer close(r.expiring)
	t := time.NewTicker(max(10*time.Millisecond, min(time.Minute, r.retention/2)))
	defer t.Stop()
	for {
		select {
		case <-t.C:
			r.expire(time.Now().Add(-r.retention))
			r.forgetSpent(time.Now())
		case <-r.ctx.Done():
			return
		}
	}
}

// expire removes every native channel that is not connected and was last
// seen before cutoff: its registration, with a channel.disconnected event
// whose reason is "expired", and its outbox. A page that opened a channel
// per load, or a device that never came back, does not hold a slot of its
// owner's MaxChannels, nor memory, for ever.
func (r *Registry) expire(cutoff time.Time) {
	r.mu.Lock()
	var stale []peer.Key
	for k, rc := range r.chans {
		if rc.Kind == KindNative && rc.LastSeen.Before(cutoff) {
			stale = append(stale, k)
		}
	}
	r.mu.Unlock()
	for _, k := range stale {
		if err := r.expireOne(k, cutoff); err != nil {
			r.log.Warn("expired channel not removed", "channel", k.ID, "peer", k.Consumer, "err", err)
		}
	}
}

func (r *Registry) expireOne(k peer.Key, cutoff time.Time) error {
	seen, ok := r.recordOf(k)
	if !ok {
		return nil
	}
	// The owner's lock orders this against Connect: a channel that
	// connects now either registered before (and is seen, so it stays)
	// or registers afresh after.
	ol, release, err := r.enterOwner(seen.Owner)
	if err != nil {
		return nil
	}
	defer release()
	rc, ok := r.recordOf(k)
	if !ok || rc.Owner != seen.Owner || rc.Kind != KindNative || !rc.LastSeen.Before(cutoff) || r.hub.Connected(k) {
		return nil
	}
	ctx, cancel := context.WithTimeout(r.ctx, writeTimeout)
	defer cancel()
	return r.drop(ctx, ol, &rc, "expired")
}

// drop removes registration rc for good: its deletion and its
// channel.disconnected, for reason, in one commit to its owner's log ol
// (held by the caller); then its sender stops and its outbox goes.
func (r *Registry) drop(ctx context.Context, ol *ownerLog, rc *record, reason string) error {
	k := rc.key()
	var b store.Batch
	b.Delete(kindChannel, k.String())
	if err := r.commit(ctx, ol, &b, disconnectedFact(rc, reason)); err != nil {
		return err
	}
	r.mu.Lock()
	if cur := r.chans[k]; cur != nil {
		r.removeLocked(cur)
	}
	r.mu.Unlock()
	r.stopSender(k)
	if rc.Kind == KindAdapter {
		r.stopDriver(k)
		r.forgetCards(ctx, k)
	}
	r.hub.Forget(k)
	return nil
}

// disconnectedFact is channel.disconnected for a registration that goes,
// for reason.
func disconnectedFact(rc *record, reason string) fact {
	return fact{typ: TypeDisconnected, p: payload{ChannelID: rc.ChannelID, NativePeerID: rc.PeerID, Kind: rc.Kind,
		URL: origin(rc.URL), Reason: reason}}
}

// recordOf returns a copy of channel k's registration; ok is false
// without one.
func (r *Registry) recordOf(k peer.Key) (rc record, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur := r.chans[k]; cur != nil {
		return *cur, true
	}
	return record{}, false
}

// enter registers a call in flight, or fails once the registry is closed.
func (r *Registry) enter() (func(), error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	r.ops.Add(1)
	return r.ops.Done, nil
}

// enterOwner is how every write to owner's channels starts: it registers
// the call in flight, as enter does, and locks owner's log. release undoes
// both.
func (r *Registry) enterOwner(owner string) (ol *ownerLog, release func(), err error) {
	done, err := r.enter()
	if err != nil {
		return nil, nil, err
	}
	ol = r.lockOwner(owner)
	return ol, func() {
		ol.mu.Unlock()
		done()
	}, nil
}

// addLocked indexes a registration. The caller holds r.mu.
func (r *Registry) addLocked(rc *record) {
	k := rc.key()
	r.chans[k] = rc
	m := r.owners[rc.Owner]
	if m == nil {
		m = map[peer.Key]*record{}
		r.owners[rc.Owner] = m
	}
	m[k] = rc
}

// removeLocked drops a registration from the index. The caller holds r.mu.
func (r *Registry) removeLocked(rc *record) {
	k := rc.key()
	delete(r.chans, k)
	if m := r.owners[rc.Owner]; m != nil {
		delete(m, k)
		if len(m) == 0 {
			delete(r.owners, rc.Owner)
		}
	}
}

// lockOwner returns owner's log, locked. Lock order: an owner's log, then r.mu.
func (r *Registry) lockOwner(owner string) *ownerLog {
	r.mu.Lock()
	ol := r.logs[owner]
	if ol == nil {
		ol = &ownerLog{owner: owner}
		r.logs[owner] = ol
	}
	r.mu.Unlock()
	ol.mu.Lock()
	return ol
}

// channelsOf returns copies of owner's registrations in key order.
func (r *Registry) channelsOf(owner string) []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]record, 0, len(r.owners[owner]))
	for _, rc := range r.owners[owner] {
		out = append(out, *rc)
	}
	sort.Slice(out, func(i, j int) bool { return less(&out[i], &out[j]) })
	return out
}

// reachable drops from chans the adapter registrations whose adapter is
// not configured: nothing would carry their deliveries.
func (r *Registry) reachable(chans []record) []record {
	return slices.DeleteFunc(chans, func(rc record) bool { return rc.Kind == KindAdapter && r.adapterOf(rc.ChannelID) == nil })
}

func less(a, b *record) bool {
	if a.Owner != b.Owner {
		return a.Owner < b.Owner
	}
	if a.ChannelID != b.ChannelID {
		return a.ChannelID < b.ChannelID
	}
	return a.PeerID < b.PeerID
}

// touch moves a registration's LastSeen forward in memory.
func (r *Registry) touch(k peer.Key, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rc := r.chans[k]; rc != nil && at.After(rc.LastSeen) {
		rc.LastSeen = at
	}
}

// checkID applies package ident's rule within maxLen bytes; a channel id
// also holds no '/', which would make a peer key ("channel/<channel
// id>/<peer id>") ambiguous.
func checkID(what, s string, maxLen int, slash bool) error {
	if err := ident.CheckLen(what, s, maxLen); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if !slash && strings.Contains(s, "/") {
		return fmt.Errorf("%w: %s %q contains '/'", ErrInvalid, what, s)
	}
	return nil
}

func checkIDs(owner, channelID, peerID string) error {
	return errors.Join(
		checkID("owner", owner, MaxPeerID, true),
		checkID("channel id", channelID, MaxChannelID, false),
		checkID("native peer id", peerID, MaxPeerID, true),
	)
}

// Connect registers the channel (channelID, peerID) of owner, durably, or
// resumes it when it is already registered. fresh reports a first
// registration: the caller then forwards the owner's pending prompts with
// Backfill, since prompts raised before it existed are not in its outbox.
// It logs channel.connected when fresh and channel.resumed otherwise.
func (r *Registry) Connect(ctx context.Context, owner, channelID, peerID string) (ch Channel, fresh bool, err error) {
	if err := checkIDs(owner, channelID, peerID); err != nil {
		return Channel{}, false, err
	}
	if reserved(channelID) || r.adapterOf(channelID) != nil {
		return Channel{}, false, fmt.Errorf("%w: channel id %q is reserved for the gateway's own channels", ErrInvalid, channelID)
	}
	ol, release, err := r.enterOwner(owner)
	if err != nil {
		return Channel{}, false, err
	}
	defer release()

	k := Key(channelID, peerID)
	now := time.Now().UTC()
	// Asked before r.mu: near the low-water mark it may read the disk.
	admit := r.st.Admit()
	r.mu.Lock()
	var rc record
	switch cur := r.chans[k]; {
	case cur != nil && cur.Owner != owner, cur == nil && r.claims[k] != "":
		r.mu.Unlock()
		return Channel{}, false, fmt.Errorf("%w: %s/%s", ErrOwned, channelID, peerID)
	case cur != nil:
		rc = *cur
	case len(r.owners[owner]) >= r.maxChans:
		r.mu.Unlock()
		return Channel{}, false, fmt.Errorf("%w: %s has %d", ErrTooMany, owner, r.maxChans)
	default:
		if admit != nil {
			r.mu.Unlock()
			return Channel{}, false, admit // short of room: a new channel waits
		}
		fresh = true
		r.claims[k] = owner
		rc = record{Owner: owner, ChannelID: channelID, PeerID: peerID, Kind: KindNative, CreatedAt: now}
	}
	r.mu.Unlock()
	rc.LastSeen = now

	typ := TypeResumed
	if fresh {
		typ = TypeConnected
	}
	var b store.Batch
	err = b.Put(kindChannel, k.String(), &rc)
	if err == nil {
		err = r.commit(ctx, ol, &b, fact{typ: typ, p: payload{ChannelID: channelID, NativePeerID: peerID, Kind: rc.Kind}})
	}
	r.mu.Lock()
	delete(r.claims, k)
	if err == nil {
		if fresh {
			reg := rc // the index's own copy: rc is read below without r.mu
			r.addLocked(&reg)
		} else if cur := r.chans[k]; cur != nil {
			cur.LastSeen = now
		}
	}
	r.mu.Unlock()
	if err != nil {
		return Channel{}, false, fmt.Errorf("channel: connect %s/%s: %w", channelID, peerID, err)
	}
	return rc.channel(), fresh, nil
}

// Connected is told by the peer hub (see peer.Presence, wired by the node)
// that a connection of the channel k attached; when it detaches, a native
// channel's channel.disconnected is logged for its owner. The registration
// and its outbox stay; prompts keep arriving there.
func (r *Registry) Connected(k peer.Key) (disconnected func()) {
	r.mu.Lock()
	rc := r.chans[k]
	r.mu.Unlock()
	if rc == nil || rc.Kind != KindNative {
		return func() {}
	}
	owner := rc.Owner
	return func() { r.logChannelEvent(owner, k.ID, k.Consumer, fact{typ: TypeDisconnected}) }
}

// logChannelEvent logs an event of a registered channel for the calls that
// have nobody to return an error to.
func (r *Registry) logChannelEvent(owner, channelID, peerID string, f fact) {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	if err := r.channelEvent(ctx, owner, channelID, peerID, f); err != nil {
		r.log.Warn("channel event not logged", "type", f.typ, "owner", owner, "channel", channelID, "peer", peerID, "err", err)
	}
}

// channelEvent logs f for owner's registered channel (channelID, peerID) and
// moves its LastSeen forward.
func (r *Registry) channelEvent(ctx context.Context, owner, channelID, peerID string, f fact) error {
	if err := checkIDs(owner, channelID, peerID); err != nil {
		return err
	}
	ol, release, err := r.enterOwner(owner)
	if err != nil {
		return err
	}
	defer release()
	k := Key(channelID, peerID)
	rc, ok := r.recordOf(k)
	if !ok || rc.Owner != owner {
		return fmt.Errorf("%w: %s has no channel %s/%s", ErrNotFound, owner, channelID, peerID)
	}
	rc.LastSeen = time.Now().UTC()
	f.p.ChannelID, f.p.NativePeerID = channelID, peerID
	var b store.Batch
	err = b.Put(kindChannel, k.String(), &rc)
	if err == nil {
		err = r.commit(ctx, ol, &b, f)
	}
	if err != nil {
		return fmt.Errorf("channel: log %s of %s/%s: %w", f.typ, channelID, peerID, err)
	}
	r.touch(k, rc.LastSeen)
	return nil
}

// Message logs channel.message: something the person sent through the
// channel that is not an answer. body must be JSON of at most MaxMessage
// bytes.
func (r *Registry) Message(owner, channelID, peerID string, body json.RawMessage) error {
	if len(body) > MaxMessage {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, len(body), MaxMessage)
	}
	if !json.Valid(body) {
		return fmt.Errorf("%w: message body is not JSON", ErrInvalid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	return r.channelEvent(ctx, owner, channelID, peerID, fact{typ: TypeMessage, p: payload{Body: body}})
}

// List returns the channels of owner, or of every owner when owner is "",
// ordered by owner, channel id and native peer id.
func (r *Registry) List(owner string) []Channel {
	r.mu.Lock()
	recs := make([]*record, 0, len(r.chans))
	for _, rc := range r.chans {
		if owner == "" || rc.Owner == owner {
			recs = append(recs, rc)
		}
	}
	sort.Slice(recs, func(i, j int) bool { return less(recs[i], recs[j]) })
	out := make([]Channel, len(recs))
	for i, rc := range recs {
		out[i] = rc.channel()
	}
	r.mu.Unlock()
	return out
}

// Prompt implements bridge.Notifier: it appends a "permission.requested"
// delivery carrying the record's JSON to the outbox of every channel of
// rec.Owner, online or not, and logs channel.permission_forwarded for each,
// all in one durable write.
func (r *Registry) Prompt(rec bridge.Record) {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	if err := r.forward(ctx, rec, nil); err != nil {
		r.log.Error("prompt not forwarded to channels", "action", rec.ActionID, "owner", rec.Owner, "err", err)
	}
}

// Backfill forwards the still-pending prompts among prompts that belong to
// ch's owner to ch alone, as Prompt does. Call it after a fresh Connect (or
// SetWebhook) with the bridge's pending prompts of the owner. A prompt raised
// meanwhile may reach the channel twice; consumers dedupe by action_id.
func (r *Registry) Backfill(ctx context.Context, ch Channel, prompts []bridge.Record) error {
	for _, rec := range prompts {
		if rec.Owner != ch.Owner || rec.State != bridge.StatePending {
			continue
		}
		if err := r.forward(ctx, rec, &ch); err != nil {
			return fmt.Errorf("channel: backfill %s/%s: %w", ch.ChannelID, ch.PeerID, err)
		}
	}
	return nil
}

// forward delivers a pending prompt to every channel of its owner, or only
// to the channel only when it is not nil. A prompt already retracted is not forwarded.
func (r *Registry) forward(ctx context.Context, rec bridge.Record, only *Channel) error {
	if rec.Owner == "" {
		return nil
	}
	ol, release, err := r.enterOwner(rec.Owner)
	if err != nil {
		return err
	}
	defer release()
	r.mu.Lock()
	_, settled := r.settled[rec.ActionID]
	r.mu.Unlock()
	if settled {
		return nil
	}
	chans := r.reachable(r.channelsOf(rec.Owner))
	if only != nil {
		k := Key(only.ChannelID, only.PeerID)
		chans = slices.DeleteFunc(chans, func(rc record) bool { return rc.key() != k })
		if len(chans) == 0 {
			return fmt.Errorf("%w: %s has no channel %s/%s", ErrNotFound, rec.Owner, only.ChannelID, only.PeerID)
		}
	}
	var b store.Batch
	return r.fanout(ctx, ol, &b, chans, event.PermissionRequested, rec, TypePermissionForwarded)
}

// Retract implements bridge.Notifier: it appends a "permission.resolved"
// delivery carrying the settled record to every channel of rec.Owner, so
// each device removes the prompt, and, when a person's answer settled it,
// logs channel.permission_returned for where that answer came back from
// (see returnedFact), all in one durable write. Every answer, through
// whichever door, settles its record exactly once, so each is logged once.
func (r *Registry) Retract(rec bridge.Record) {
	if rec.Owner == "" {
		return
	}
	ol, release, err := r.enterOwner(rec.Owner)
	if err != nil {
		r.log.Error("retraction not forwarded to channels", "action", rec.ActionID, "err", err)
		return
	}
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	r.mu.Lock()
	if _, ok := r.settled[rec.ActionID]; !ok {
		if old := r.settledRing[r.settledNext]; old != "" {
			delete(r.settled, old)
		}
		r.settledRing[r.settledNext] = rec.ActionID
		r.settledNext = (r.settledNext + 1) % len(r.settledRing)
		r.settled[rec.ActionID] = struct{}{}
	}
	r.mu.Unlock()
	var b store.Batch
	var returned []fact
	var seen *record
	if f, ok := returnedFact(&rec); ok {
		returned = append(returned, f)
		// An answer through a registered channel of the owner counts as
		// the channel being seen.
		if rc, ok := r.recordOf(Key(f.p.ChannelID, f.p.NativePeerID)); ok && rc.Owner == rec.Owner {
			rc.LastSeen = time.Now().UTC()
			if err := b.Put(kindChannel, rc.key().String(), &rc); err == nil {
				seen = &rc
			}
		}
	}
	if err := r.fanout(ctx, ol, &b, r.reachable(r.channelsOf(rec.Owner)), event.PermissionResolved, rec, "", returned...); err != nil {
		r.log.Error("retraction not forwarded to channels", "action", rec.ActionID, "owner", rec.Owner, "err", err)
		return
	}
	if seen != nil {
		r.touch(seen.key(), seen.LastSeen)
	}
}

// Door names of answers that named no channel.
const (
	// DoorAPI is the channel id logged for an answer that named none
	// (POST /v0/actions/{id}/respond without channel_id).
	DoorAPI = "api"
)

// returnedFact is the channel.permission_returned of a record a person's
// answer settled: the channel id it named (a registered channel's, or the
// door it came through: "aap", "agent-runtime", "cli", "signal"; DoorAPI
// for none) and its native peer id, or, for an answer that named none, the
// principal who gave it. ok is false for a record settled otherwise
// (expired, cancelled).
func returnedFact(rec *bridge.Record) (fact, bool) {
	by := rec.DecidedBy
	if by == nil || (rec.State != bridge.StateApproved && rec.State != bridge.StateDenied) {
		return fact{}, false
	}
	channelID, peerID := by.ChannelID, by.NativePeerID
	if channelID == "" {
		channelID = DoorAPI
	}
	if peerID == "" {
		peerID = by.Principal
	}
	return fact{typ: TypePermissionReturned, actionID: rec.ActionID, execID: rec.ExecutionID, sessionID: rec.SessionID, stepID: rec.StepID,
		p: payload{ChannelID: channelID, NativePeerID: peerID, ActionID: rec.ActionID, ToolID: rec.ToolID, Decision: rec.Decision}}, true
}

// fanout stages in b one delivery of typ per channel and, when logType is
// set, one event per channel, and commits them together with the events
// extra: a forwarded event is logged exactly when its delivery is durable.
// The caller holds ol.mu.
func (r *Registry) fanout(ctx context.Context, ol *ownerLog, b *store.Batch, chans []record, typ string, rec bridge.Record, logType string, extra ...fact) error {
	if len(chans) == 0 && len(extra) == 0 {
		return nil
	}
	data, err := json.Marshal(&rec)
	if err != nil {
		return fmt.Errorf("channel: encode action %s: %w", rec.ActionID, err)
	}
	staged := make([]*peer.Staged, 0, len(chans))
	facts := make([]fact, 0, len(chans)+len(extra))
	for i := range chans {
		c := &chans[i]
		staged = append(staged, r.hub.Stage(b, c.key(), typ, data, ""))
		if logType != "" {
			facts = append(facts, fact{typ: logType, actionID: rec.ActionID, execID: rec.ExecutionID,
				sessionID: rec.SessionID, stepID: rec.StepID,
				p: payload{ChannelID: c.ChannelID, NativePeerID: c.PeerID, Kind: c.Kind, ActionID: rec.ActionID, ToolID: rec.ToolID}})
		}
	}
	facts = append(facts, extra...)
	err = r.commit(ctx, ol, b, facts...)
	for _, s := range staged {
		if err != nil {
			s.Abort()
		} else {
			s.Publish()
		}
	}
	return err
}

// payload is the body of every channel event; each type fills its fields.
type payload struct {
	ChannelID    string          `json:"channel_id"`
	NativePeerID string          `json:"native_peer_id"`
	Kind         string          `json:"kind,omitempty"`
	URL          string          `json:"url,omitempty"`
	Reason       string          `json:"reason,omitempty"`
	ActionID     string          `json:"action_id,omitempty"`
	ToolID       string          `json:"tool_id,omitempty"`
	Decision     string          `json:"decision,omitempty"`
	Body         json.RawMessage `json:"body,omitempty"`
}

// fact is a channel event waiting for its sequence.
type fact struct {
	typ                                 string
	p                                   payload
	actionID, execID, sessionID, stepID string
}

func stream(owner string) string { return "chlog/" + owner }

// commit appends facts to ol's log in b and writes b. Entries are stored as
// their JSON envelope, so Events serves them without re-encoding. Only the
// newest LogLimit entries are kept. The caller holds ol.mu, which keeps the
// owner's sequences gapless and committed in order.
func (r *Registry) commit(ctx context.Context, ol *ownerLog, b *store.Batch, facts ...fact) error {
	s := stream(ol.owner)
	if !ol.loaded {
		last, err := r.st.Last(s)
		if err != nil {
			return fmt.Errorf("channel: read %s log: %w", ol.owner, err)
		}
		ol.seq, ol.loaded = last, true
	}
	seq := ol.seq
	now := time.Now().UTC()
	var first, prev string
	for _, f := range facts {
		body, err := json.Marshal(&f.p)
		if err != nil {
			return fmt.Errorf("channel: encode %s payload: %w", f.typ, err)
		}
		id := event.NewID()
		if first == "" {
			first, prev = id, id
		}
		seq++
		ev := event.Event{
			ID: id, ExecutionID: f.execID, StepID: f.stepID, Type: f.typ, SchemaVersion: event.SchemaVersion,
			Timestamp: now, Payload: body, CausationID: prev, CorrelationID: first, Sequence: seq,
			EventID: id, SessionID: f.sessionID, RunID: f.execID, ActionID: f.actionID,
		}
		prev = id
		raw, err := json.Marshal(&ev)
		if err != nil {
			return fmt.Errorf("channel: encode %s event: %w", f.typ, err)
		}
		b.Append(s, seq, raw)
		if seq > r.logLimit {
			b.DeleteEntry(s, seq-r.logLimit)
		}
	}
	if err := r.st.Write(ctx, b); err != nil {
		return fmt.Errorf("channel: write: %w", err)
	}
	ol.seq = seq
	return nil
}

// Events returns up to limit events of owner's channel log after sequence
// after, oldest first, as event.Event JSON envelopes, and the log's latest
// sequence. Sequences start at 1 per owner; only the newest LogLimit events
// are kept, so a first sequence above after+1 shows that older ones are
// gone. limit <= 0 means 100; it is capped at 1000.
func (r *Registry) Events(owner string, after uint64, limit int) ([]json.RawMessage, uint64, error) {
	if err := checkID("owner", owner, MaxPeerID, true); err != nil {
		return nil, 0, err
	}
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	entries, err := r.st.Read(stream(owner), after, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("channel: read %s log: %w", owner, err)
	}
	latest, err := r.st.Last(stream(owner))
	if err != nil {
		return nil, 0, fmt.Errorf("channel: read %s log: %w", owner, err)
	}
	out := make([]json.RawMessage, len(entries))
	for i, e := range entries {
		out[i] = e.Data
	}
	return out, latest, nil
}
