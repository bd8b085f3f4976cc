package channel

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/store"
)

// Verification errors.
var (
	// ErrSignature means the signature does not match the body, timestamp
	// and secret, or a header is malformed.
	ErrSignature = errors.New("channel: webhook signature mismatch")
	// ErrStale means the timestamp is outside the tolerance: a replay, or a
	// clock far off.
	ErrStale = errors.New("channel: webhook timestamp outside tolerance")
)

// DefaultTolerance is the timestamp tolerance Verify applies when given none.
const DefaultTolerance = 5 * time.Minute

// Webhook request headers.
const (
	HeaderEvent     = "X-Gatehouse-Event"
	HeaderDelivery  = "X-Gatehouse-Delivery"
	HeaderTimestamp = "X-Gatehouse-Timestamp"
	HeaderSignature = "X-Gatehouse-Signature"
)

// Payload is the JSON body of a webhook request.
type Payload struct {
	// Type is the delivery type: "permission.requested" or "permission.resolved".
	Type string `json:"type"`
	// Delivery is the delivery's sequence in the webhook's outbox.
	Delivery uint64 `json:"delivery"`
	// Owner is the principal the action belongs to.
	Owner string `json:"owner"`
	// Action is the action record (bridge.Record as JSON).
	Action json.RawMessage `json:"action"`
}

// Sign returns the X-Gatehouse-Signature value of body sent at timestamp
// (unix seconds, as in X-Gatehouse-Timestamp).
func Sign(secret []byte, timestamp string, body []byte) string {
	return "v1=" + hex.EncodeToString(mac(secret, timestamp, body))
}

func mac(secret []byte, timestamp string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(timestamp))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Verify checks a webhook request: signature is the X-Gatehouse-Signature
// header, timestamp the X-Gatehouse-Timestamp header and body the raw request
// body. It fails with ErrStale when the timestamp is more than tolerance away
// from now (tolerance <= 0 means DefaultTolerance), so a captured request
// cannot be replayed later, and with ErrSignature when no "v1=" entry of the
// comma-separated header matches. The comparison takes constant time.
func Verify(secret []byte, timestamp, signature string, body []byte, now time.Time, tolerance time.Duration) error {
	if len(secret) == 0 {
		return fmt.Errorf("%w: empty secret", ErrSignature)
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	sec, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: timestamp %q is not unix seconds", ErrSignature, timestamp)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: timestamp is %s away", ErrStale, d.Round(time.Second))
	}
	want := mac(secret, timestamp, body)
	for part := range strings.SplitSeq(signature, ",") {
		v, ok := strings.CutPrefix(strings.TrimSpace(part), "v1=")
		if !ok {
			continue
		}
		if got, err := hex.DecodeString(v); err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return ErrSignature
}

// checkWebhook validates a webhook's URL and secret.
func (r *Registry) checkWebhook(raw, secret string) error {
	if len(raw) > MaxURL {
		return fmt.Errorf("%w: webhook URL is longer than %d bytes", ErrInvalid, MaxURL)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%w: webhook URL: %w", ErrInvalid, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%w: webhook URL must be http or https, not %q", ErrInvalid, u.Scheme)
	}
	if u.Host == "" {
		return fmt.Errorf("%w: webhook URL has no host", ErrInvalid)
	}
	if err := r.egress.checkURL(u); err != nil {
		return fmt.Errorf("%w: webhook URL: %w", ErrInvalid, err)
	}
	if len(secret) < MinSecret || len(secret) > MaxSecret {
		return fmt.Errorf("%w: webhook secret must be %d to %d bytes", ErrInvalid, MinSecret, MaxSecret)
	}
	return nil
}

// webhookPeerID names a webhook channel. It hashes the owner with the URL so
// that one bot serving many people gets one outbox per person.
func webhookPeerID(owner, u string) string {
	sum := sha256.Sum256([]byte(owner + "\x00" + u))
	return hex.EncodeToString(sum[:16])
}

// webhookOfLocked returns owner's webhook registration. The caller holds r.mu.
func (r *Registry) webhookOfLocked(owner string) *record {
	for _, rc := range r.owners[owner] {
		if rc.Kind == KindWebhook {
			return rc
		}
	}
	return nil
}

// SetWebhook configures owner's outbound webhook channel (channel id
// WebhookChannel, native peer id a stable hash of owner and URL), replacing
// any previous one, and starts POSTing its deliveries. fresh reports a new
// channel (a new URL): the caller then forwards the owner's pending prompts
// with Backfill. Keeping the URL and changing only the secret keeps the
// outbox, and what it still holds is signed with the new secret. A replaced
// URL's unsent deliveries are discarded with its outbox.
func (r *Registry) SetWebhook(ctx context.Context, owner, rawURL, secret string) (ch Channel, fresh bool, err error) {
	if err := checkID("owner", owner, MaxPeerID, true); err != nil {
		return Channel{}, false, err
	}
	if err := r.checkWebhook(rawURL, secret); err != nil {
		return Channel{}, false, err
	}
	ol, release, err := r.enterOwner(owner)
	if err != nil {
		return Channel{}, false, err
	}
	defer release()

	now := time.Now().UTC()
	rc := record{Owner: owner, ChannelID: WebhookChannel, PeerID: webhookPeerID(owner, rawURL), Kind: KindWebhook,
		URL: rawURL, Secret: []byte(secret), CreatedAt: now, LastSeen: now}
	r.mu.Lock()
	var old *record
	if cur := r.webhookOfLocked(owner); cur != nil {
		c := *cur
		old = &c
	}
	if old == nil && len(r.owners[owner]) >= r.maxChans {
		r.mu.Unlock()
		return Channel{}, false, fmt.Errorf("%w: %s has %d", ErrTooMany, owner, r.maxChans)
	}
	r.mu.Unlock()

	fresh = old == nil || old.key() != rc.key()
	if fresh {
		if err := r.st.Admit(); err != nil {
			return Channel{}, false, err // short of room: a new channel waits
		}
	}
	var b store.Batch
	var facts []fact
	if old != nil && fresh {
		b.Delete(kindChannel, old.key().String())
		facts = append(facts, disconnectedFact(old, "replaced"))
	}
	typ := TypeConnected
	if !fresh {
		typ, rc.CreatedAt = TypeResumed, old.CreatedAt
	}
	facts = append(facts, fact{typ: typ, p: payload{ChannelID: rc.ChannelID, NativePeerID: rc.PeerID, Kind: KindWebhook, URL: origin(rc.URL)}})
	err = b.Put(kindChannel, rc.key().String(), &rc)
	if err == nil {
		err = r.commit(ctx, ol, &b, facts...)
	}
	if err != nil {
		return Channel{}, false, fmt.Errorf("channel: set webhook of %s: %w", owner, err)
	}

	reg := rc // the index's own copy: senders move its LastSeen under r.mu
	r.mu.Lock()
	if old != nil {
		r.removeLocked(old)
	}
	r.addLocked(&reg)
	r.mu.Unlock()
	if old != nil {
		r.stopSender(old.key())
		if fresh {
			r.hub.Forget(old.key())
		}
	}
	r.startSender(&rc)
	return rc.channel(), fresh, nil
}

// RemoveWebhook removes owner's webhook channel: its sender stops and its
// outbox, with any unsent deliveries, is discarded.
func (r *Registry) RemoveWebhook(ctx context.Context, owner string) error {
	if err := checkID("owner", owner, MaxPeerID, true); err != nil {
		return err
	}
	ol, release, err := r.enterOwner(owner)
	if err != nil {
		return err
	}
	defer release()
	r.mu.Lock()
	var old record
	cur := r.webhookOfLocked(owner)
	if cur != nil {
		old = *cur
	}
	r.mu.Unlock()
	if cur == nil {
		return fmt.Errorf("%w: %s has no webhook", ErrNotFound, owner)
	}
	if err := r.drop(ctx, ol, &old, "removed"); err != nil {
		return fmt.Errorf("channel: remove webhook of %s: %w", owner, err)
	}
	return nil
}

// sender POSTs one webhook channel's outbox.
type sender struct {
	key    peer.Key
	owner  string
	url    string
	secret []byte
	cancel context.CancelFunc
	done   chan struct{}
}

// startSender starts rc's sender unless the registry is closing.
func (r *Registry) startSender(rc *record) {
	ctx, cancel := context.WithCancel(r.ctx)
	s := &sender{key: rc.key(), owner: rc.Owner, url: rc.URL, secret: rc.Secret, cancel: cancel, done: make(chan struct{})}
	r.mu.Lock()
	r.senders[s.key] = s
	r.mu.Unlock()
	go r.send(ctx, s)
}

// stopSender stops k's sender and waits for it to let go of the outbox.
func (r *Registry) stopSender(k peer.Key) {
	r.mu.Lock()
	s := r.senders[k]
	delete(r.senders, k)
	r.mu.Unlock()
	if s != nil {
		s.cancel()
		<-s.done
	}
}

// send attaches to the outbox like any consumer and POSTs each delivery in
// order, acknowledging it only once the bot answered 2xx.
func (r *Registry) send(ctx context.Context, s *sender) {
	defer close(s.done)
	defer s.cancel()
	conn, _ := r.hub.Attach(s.key, nil)
	defer conn.Detach()
	for {
		d, ok := conn.Wait(ctx)
		if !ok {
			if ctx.Err() == nil {
				r.log.Warn("webhook sender lost its outbox", "owner", s.owner, "err", conn.Err())
			}
			return
		}
		if !r.deliver(ctx, s, d) {
			return
		}
		conn.Ack(d.Seq)
		r.touch(s.key, time.Now().UTC())
	}
}

// deliver POSTs d until the bot answers 2xx (true) or ctx ends (false).
func (r *Registry) deliver(ctx context.Context, s *sender, d peer.Delivery) bool {
	action := json.RawMessage(d.Data)
	if !json.Valid(action) {
		// Not ours to judge: pass foreign bytes along as a JSON string
		// rather than block the outbox behind an unsendable delivery.
		action, _ = json.Marshal(string(d.Data))
	}
	body, err := json.Marshal(&Payload{Type: d.Type, Delivery: d.Seq, Owner: s.owner, Action: action})
	if err != nil {
		r.log.Error("webhook payload", "owner", s.owner, "delivery", d.Seq, "err", err)
		return false
	}
	for attempt := 0; ; attempt++ {
		err := r.post(ctx, s, d, body)
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		wait := r.backoff(attempt)
		r.log.Warn("webhook delivery failed; retrying", "owner", s.owner, "delivery", d.Seq,
			"attempt", attempt+1, "retry_in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		}
	}
}

// post makes one attempt, signed with the attempt's own timestamp so a
// late retry is not rejected as stale.
func (r *Registry) post(ctx context.Context, s *sender, d peer.Delivery, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("build the request to %s: %w", origin(s.url), withoutURL(err))
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Gatehouse-Webhook/1")
	req.Header.Set(HeaderEvent, d.Type)
	req.Header.Set(HeaderDelivery, strconv.FormatUint(d.Seq, 10))
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, Sign(s.secret, ts, body))
	resp, err := r.client.Do(req)
	if err != nil {
		return fmt.Errorf("post to %s: %w", origin(s.url), withoutURL(err))
	}
	// Drain a bounded amount so the connection can be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("webhook answered %s", resp.Status)
	}
	return nil
}

// withoutURL strips the URL the HTTP client puts into its errors
// (*url.Error: `Post "https://hooks.slack.com/services/…": …`), which
// holds the webhook's secret; what failed stays, unwrappable as before.
// An error of a URL's parsing quotes the URL too, and is replaced whole.
func withoutURL(err error) error {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err
	}
	if ue.Op == "parse" {
		return errors.New("the webhook URL does not parse")
	}
	return ue.Err
}

// backoff returns the jittered delay before retry attempt+1: RetryBase
// doubled per failure, capped at RetryMax, then drawn from its upper half so
// many senders failing together do not retry in step.
func (r *Registry) backoff(attempt int) time.Duration {
	d := r.retryMax
	if attempt < 32 {
		if b := r.retryBase << attempt; b > 0 && b < d {
			d = b
		}
	}
	return d/2 + rand.N(d/2+1)
}
