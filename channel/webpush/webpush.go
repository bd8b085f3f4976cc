// Package webpush is the Web Push channel: the approvals page, installed
// as a web app, subscribes a person's browser or phone to push messages
// (RFC 8030), and each permission prompt is pushed to every subscription
// of its owner, encrypted (RFC 8291, aes128gcm) and signed with the
// gateway's VAPID key (RFC 8292), so that a notification with Allow once
// and Deny actions shows on the device. Its TTL is the prompt's expiry and
// its Topic the prompt's, so that the message that withdraws it once it is
// answered elsewhere replaces one the push service still holds.
//
// A notification answers with a token (channel.Card.Token) bound to its
// prompt, its person and its subscription, good once: the page's service
// worker presents it with the subscription's endpoint, so a phone answers
// in one tap without signing in again.
//
// The VAPID key pair is a record of the store, made in a commit by the
// first start that needs it, so that a cluster's journal carries it to
// every node and whichever node leads next signs with the same key: a
// subscription outlives a failover. A key pair an earlier release kept in
// the data folder (webpush-vapid.json) is imported once. Push endpoints are reached under the
// webhooks' address rules (channel.ErrDeniedAddress): an endpoint on a
// private address is refused when subscribed and when dialled. A
// subscription the push service answers 404 or 410 is removed.
package webpush

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	webpushgo "github.com/SherClockHolmes/webpush-go"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/store"
)

// KeyFile is the name of the file in the data folder where earlier
// releases kept the VAPID key pair; New imports it into the store once.
const KeyFile = "webpush-vapid.json"

// The store record of the VAPID key pair.
const (
	kindKey = "wpkey"
	idVAPID = "vapid"
)

// Limits of a subscription.
const (
	// MaxEndpoint bounds a push endpoint URL, in bytes.
	MaxEndpoint = 2048
	// resolvedTTL is how long a push service keeps the message that
	// withdraws a notification for a device that is offline.
	resolvedTTL = 12 * time.Hour
	// promptTTL is the TTL of a prompt without expiry.
	promptTTL = 24 * time.Hour
)

// ErrSubscription means a push subscription is malformed; it matches
// channel.ErrInvalid too.
var ErrSubscription = fmt.Errorf("%w: webpush: invalid subscription", channel.ErrInvalid)

// Options configure the Web Push channel.
type Options struct {
	// Store keeps the VAPID key pair; required.
	Store *store.Store
	// Dir is the data folder, where an earlier release may have kept the
	// key pair (KeyFile): when Store holds none, that one is imported
	// rather than a new one made, so that existing subscriptions still
	// receive. "": nothing to import.
	Dir string
	// Subject is the VAPID subject push services may contact: a mailto:
	// address or an https URL; empty means "mailto:webpush@localhost".
	Subject string
	// Allow lists the internal networks push endpoints may be on (the
	// webhooks' allow-list); nil: public addresses only.
	Allow []netip.Prefix
	// HTTPClient sends the pushes; nil means a client that dials only
	// addresses the rules allow and follows no redirects. A client given
	// here applies its own address rules.
	HTTPClient *http.Client
	// Logger receives warnings, and the import of a key file; nil discards.
	Logger *slog.Logger
}

// Push is the Web Push adapter (channel.Adapter).
type Push struct {
	public, private string // VAPID key pair, base64url
	subject         string
	egress          channel.Egress
	client          *http.Client
	log             *slog.Logger
	reg             *channel.Registry
}

// keyPair is the key pair as the store and the key file hold it.
type keyPair struct {
	Public  string `json:"public_key" msgpack:"pub"`
	Private string `json:"private_key" msgpack:"priv"`
}

// New loads the VAPID key pair from o.Store, or imports or makes it, and
// returns the adapter.
func New(ctx context.Context, o Options) (*Push, error) {
	if o.Store == nil {
		return nil, fmt.Errorf("%w: webpush: Options.Store is required", channel.ErrInvalid)
	}
	if o.Subject == "" {
		o.Subject = "mailto:webpush@localhost"
	}
	if !strings.HasPrefix(o.Subject, "mailto:") && !strings.HasPrefix(o.Subject, "https://") {
		return nil, fmt.Errorf("webpush: subject %q: want a mailto: address or an https URL", o.Subject)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	kp, err := loadKeys(ctx, o.Store, o.Dir, o.Logger)
	if err != nil {
		return nil, err
	}
	g := channel.NewEgress(o.Allow)
	if o.HTTPClient == nil {
		o.HTTPClient = g.Client()
	}
	return &Push{public: kp.Public, private: kp.Private, subject: o.Subject, egress: g, client: o.HTTPClient, log: o.Logger}, nil
}

// loadKeys returns the key pair st holds, or else keeps in st the one of
// dir's KeyFile, or else a new one. Only the node that leads writes the
// store (a cluster's followers run no channels), so a read and a write
// cannot race with another node's: a former leader's write that lands after
// a new leader took over is refused by the journal's fencing.
func loadKeys(ctx context.Context, st *store.Store, dir string, log *slog.Logger) (keyPair, error) {
	var kp keyPair
	err := st.Get(kindKey, idVAPID, &kp)
	if err == nil {
		if err := kp.check(); err != nil {
			return keyPair{}, fmt.Errorf("webpush: the store's VAPID key pair: %w", err)
		}
		return kp, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return keyPair{}, fmt.Errorf("webpush: read the VAPID key pair: %w", err)
	}
	kp, imported, err := fileKeys(dir)
	if err != nil {
		return keyPair{}, err
	}
	if !imported {
		if kp, err = newKeys(); err != nil {
			return keyPair{}, err
		}
	}
	var b store.Batch
	if err := b.Put(kindKey, idVAPID, &kp); err != nil {
		return keyPair{}, fmt.Errorf("webpush: %w", err)
	}
	if err := st.Write(ctx, &b); err != nil {
		return keyPair{}, fmt.Errorf("webpush: keep the VAPID key pair: %w", err)
	}
	if imported {
		log.Info("webpush: VAPID key pair imported into the store; the file is no longer read and may be deleted",
			"file", filepath.Join(dir, KeyFile))
	}
	return kp, nil
}

// fileKeys reads dir's KeyFile, if there is one. A key file others may
// read is refused, as earlier releases refused it: the private key signs
// for this gateway, and one that others could read is not its alone.
func fileKeys(dir string) (keyPair, bool, error) {
	if dir == "" {
		return keyPair{}, false, nil
	}
	path := filepath.Join(dir, KeyFile)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return keyPair{}, false, nil
	}
	if err != nil {
		return keyPair{}, false, fmt.Errorf("webpush: %w", err)
	}
	defer f.Close()
	kp, err := readKeys(path, f)
	if err != nil {
		return keyPair{}, false, err
	}
	return kp, true, nil
}

func newKeys() (keyPair, error) {
	private, public, err := webpushgo.GenerateVAPIDKeys()
	if err != nil {
		return keyPair{}, fmt.Errorf("webpush: make VAPID keys: %w", err)
	}
	return keyPair{Public: public, Private: private}, nil
}

func readKeys(path string, f *os.File) (keyPair, error) {
	fi, err := f.Stat()
	if err != nil {
		return keyPair{}, fmt.Errorf("webpush: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return keyPair{}, fmt.Errorf("webpush: %s is open to others (mode %v): the VAPID private key must be the gateway's alone; chmod 600 it", path, fi.Mode().Perm())
	}
	var kp keyPair
	if err := json.NewDecoder(io.LimitReader(f, 4096)).Decode(&kp); err != nil {
		return keyPair{}, fmt.Errorf("webpush: %s: %w", path, err)
	}
	if err := kp.check(); err != nil {
		return keyPair{}, fmt.Errorf("webpush: %s: %w", path, err)
	}
	return kp, nil
}

// errKeyPair means a kept key pair is not one.
var errKeyPair = errors.New("not a P-256 key pair (public and private key, base64url)")

// check reports whether kp holds keys of P-256's sizes.
func (kp keyPair) check() error {
	pub, err1 := base64.RawURLEncoding.DecodeString(kp.Public)
	priv, err2 := base64.RawURLEncoding.DecodeString(kp.Private)
	if err1 != nil || err2 != nil || len(pub) != 65 || len(priv) != 32 {
		return errKeyPair
	}
	return nil
}

// Name implements channel.Adapter.
func (p *Push) Name() string { return channel.AdapterWebPush }

// Bind implements channel.Binder.
func (p *Push) Bind(r *channel.Registry) { p.reg = r }

// PublicKey is the VAPID public key, base64url: a subscription's
// applicationServerKey.
func (p *Push) PublicKey() string { return p.public }

// Subscription is a browser's PushSubscription, as its toJSON gives it.
type Subscription struct {
	Endpoint string `json:"endpoint"`
	Keys     struct {
		P256dh string `json:"p256dh"`
		Auth   string `json:"auth"`
	} `json:"keys"`
}

// ID is a subscription's destination id: a hash of its endpoint, which is
// a secret of the subscription (whoever holds it can push to it).
func ID(endpoint string) string {
	sum := sha256.Sum256([]byte(endpoint))
	return hex.EncodeToString(sum[:16])
}

// check validates a subscription: an http(s) endpoint the address rules
// allow, and keys of the right sizes.
func (p *Push) check(s *Subscription) error {
	if len(s.Endpoint) > MaxEndpoint {
		return fmt.Errorf("%w: endpoint longer than %d bytes", ErrSubscription, MaxEndpoint)
	}
	u, err := url.Parse(s.Endpoint)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
		return fmt.Errorf("%w: endpoint must be an http or https URL", ErrSubscription)
	}
	if err := p.egress.CheckURL(u); err != nil {
		return p.reg.Refuse(p.Name(), channel.RefusedEndpoint, "endpoint: "+err.Error())
	}
	if k, err := decodeKey(s.Keys.P256dh); err != nil || len(k) != 65 || k[0] != 4 {
		return fmt.Errorf("%w: keys.p256dh must be an uncompressed P-256 point, base64url", ErrSubscription)
	}
	if k, err := decodeKey(s.Keys.Auth); err != nil || len(k) != 16 {
		return fmt.Errorf("%w: keys.auth must be 16 bytes, base64url", ErrSubscription)
	}
	return nil
}

func decodeKey(s string) ([]byte, error) {
	return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
}

// Subscribe registers a subscription of owner's: prompts are pushed to it
// from now on. fresh reports a new one: the caller then forwards owner's
// pending prompts (channel.Registry.Backfill).
func (p *Push) Subscribe(ctx context.Context, owner string, raw json.RawMessage) (channel.Channel, bool, error) {
	var s Subscription
	if err := json.Unmarshal(raw, &s); err != nil {
		return channel.Channel{}, false, fmt.Errorf("%w: %w", ErrSubscription, err)
	}
	if err := p.check(&s); err != nil {
		return channel.Channel{}, false, err
	}
	data, _ := json.Marshal(&s)
	return p.reg.SetDest(ctx, owner, p.Name(), ID(s.Endpoint), data)
}

// Unsubscribe removes owner's subscription of endpoint.
func (p *Push) Unsubscribe(ctx context.Context, owner, endpoint string) error {
	return p.reg.RemoveDest(ctx, owner, p.Name(), ID(endpoint), "unsubscribed")
}

// Peek returns the prompt a notification's token answers, presented from
// the subscription of endpoint, without spending the token.
func (p *Push) Peek(token, endpoint string) (bridge.Record, error) {
	return p.reg.PeekToken(p.Name(), token, ID(endpoint))
}

// Answer answers a prompt with a notification's token, presented from the
// subscription of endpoint, by principal when someone is signed in ("":
// nobody is).
func (p *Push) Answer(ctx context.Context, token, actionID, decision, endpoint, principal string) (bridge.Record, bool, error) {
	return p.reg.AnswerToken(ctx, p.Name(), channel.TokenAnswer{
		Token: token, ActionID: actionID, Decision: decision, Dest: ID(endpoint), Principal: principal,
	})
}

// Message is the JSON a push carries to the page's service worker.
type Message struct {
	// Type is "prompt" (show a notification) or "resolved" (withdraw it).
	Type        string `json:"type"`
	ActionID    string `json:"action_id"`
	Title       string `json:"title"`
	Body        string `json:"body"`
	ToolID      string `json:"tool_id,omitempty"`
	ExecutionID string `json:"execution_id,omitempty"`
	// Token answers the prompt (Type "prompt").
	Token string `json:"token,omitempty"`
	// ExpiresAt is the prompt's expiry, if any.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// maxPayload keeps a message within a push service's 4 KiB record.
const maxPayload = 3000

// Topic is the Topic header of actionID's pushes: 32 characters of
// base64url, the most RFC 8030 allows, the same for a prompt and the
// message that withdraws it.
func Topic(actionID string) string {
	sum := sha256.Sum256([]byte("gatehouse/" + actionID))
	return base64.RawURLEncoding.EncodeToString(sum[:24])
}

// message is what the service worker is told of card c.
func message(c channel.Card) Message {
	rec := c.Record
	m := Message{ActionID: rec.ActionID, Title: channel.Title(rec), ToolID: rec.ToolID, ExecutionID: rec.ExecutionID}
	if rec.State != bridge.StatePending {
		m.Type, m.Body = "resolved", channel.Outcome(rec)
		return m
	}
	m.Type, m.Token, m.ExpiresAt = "prompt", c.Token, rec.ExpiresAt
	body := channel.Reason(rec)
	if c.Note != "" {
		body = c.Note
	}
	m.Body = channel.Clip(body+"\n"+channel.Arguments(rec, 600), 1200)
	return m
}

// Send implements channel.Adapter: the prompt pushed with a TTL of its
// expiry and its Topic, urgent.
func (p *Push) Send(ctx context.Context, d channel.Dest, c channel.Card) (string, error) {
	ttl := promptTTL
	if e := c.Record.ExpiresAt; e != nil {
		ttl = time.Until(*e)
		if ttl <= 0 {
			return "", fmt.Errorf("%w: the prompt expired", channel.ErrPermanent)
		}
	}
	return "topic", p.push(ctx, d, message(c), ttl, webpushgo.UrgencyHigh)
}

// Edit implements channel.Adapter: a settled prompt's withdrawal, or a
// pending one's note, pushed under the same Topic.
func (p *Push) Edit(ctx context.Context, d channel.Dest, _ string, c channel.Card) error {
	if c.Record.State == bridge.StatePending {
		_, err := p.Send(ctx, d, c)
		return err
	}
	return p.push(ctx, d, message(c), resolvedTTL, webpushgo.UrgencyNormal)
}

// push sends one message to d's subscription.
func (p *Push) push(ctx context.Context, d channel.Dest, m Message, ttl time.Duration, urgency webpushgo.Urgency) error {
	var s Subscription
	if err := json.Unmarshal(d.Data, &s); err != nil {
		return fmt.Errorf("%w: subscription data: %v", channel.ErrGone, err)
	}
	payload, err := json.Marshal(&m)
	if err != nil {
		return fmt.Errorf("%w: %v", channel.ErrPermanent, err)
	}
	if len(payload) > maxPayload {
		m.Body = channel.Clip(m.Body, max(0, len(m.Body)-(len(payload)-maxPayload)))
		payload, _ = json.Marshal(&m)
	}
	sub := &webpushgo.Subscription{Endpoint: s.Endpoint, Keys: webpushgo.Keys{P256dh: s.Keys.P256dh, Auth: s.Keys.Auth}}
	resp, err := webpushgo.SendNotificationWithContext(ctx, payload, sub, &webpushgo.Options{
		HTTPClient: p.client, Subscriber: subscriber(p.subject), Topic: Topic(m.ActionID),
		TTL: max(1, int(ttl/time.Second)), Urgency: urgency, VAPIDPublicKey: p.public, VAPIDPrivateKey: p.private,
	})
	if err != nil {
		if errors.Is(err, channel.ErrDeniedAddress) {
			// The endpoint's name now resolves to an address it may not
			// reach: nothing will be sent to it.
			return fmt.Errorf("%w: %v", channel.ErrGone, err)
		}
		// The client's error names the endpoint, the subscription's secret.
		return fmt.Errorf("push to %s: %s", host(s.Endpoint), strings.ReplaceAll(err.Error(), s.Endpoint, "<endpoint>"))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		return nil
	case code == http.StatusNotFound || code == http.StatusGone:
		return fmt.Errorf("%w: the push service answered %s", channel.ErrGone, resp.Status)
	case code == http.StatusTooManyRequests:
		secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return &channel.RetryAfterError{After: time.Duration(secs) * time.Second, Err: fmt.Errorf("push to %s: %s", host(s.Endpoint), resp.Status)}
	case code >= 500:
		return fmt.Errorf("push to %s: %s", host(s.Endpoint), resp.Status)
	default:
		return fmt.Errorf("%w: push to %s: %s", channel.ErrPermanent, host(s.Endpoint), resp.Status)
	}
}

// subscriber is the VAPID subject as webpush-go takes it: it prefixes
// "mailto:" to anything that is not an https URL.
func subscriber(subject string) string { return strings.TrimPrefix(subject, "mailto:") }

// host names a push service in logs without its endpoint's path, which is
// the subscription's secret.
func host(endpoint string) string {
	if u, err := url.Parse(endpoint); err == nil {
		return u.Host
	}
	return "?"
}
