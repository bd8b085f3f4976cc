package channel

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/store"
)

// ErrRefused means an answer through an adapter was refused: a forged or
// stale request, tampered data, a token misused, a person who may not
// answer. It is a *RefusedError, whose Reason says which; each refusal is
// counted (Stats) by channel and reason.
var ErrRefused = errors.New("channel: answer refused")

// Refusal reasons, the reason label of gatehouse_channel_refused_total.
const (
	// RefusedSignature: a request's signature does not verify (Slack's
	// signing secret, Telegram's webhook secret token).
	RefusedSignature = "signature"
	// RefusedStale: a signed request's timestamp is outside the window.
	RefusedStale = "stale"
	// RefusedReplayed: a signed request was presented before.
	RefusedReplayed = "replayed"
	// RefusedTampered: button data that this gateway did not sign for
	// that destination.
	RefusedTampered = "tampered"
	// RefusedChat: a chat or conversation no route names.
	RefusedChat = "chat_not_allowed"
	// RefusedUnmapped: a platform user mapped to no person.
	RefusedUnmapped = "unmapped_user"
	// RefusedResponder: a person who may not answer this prompt.
	RefusedResponder = "not_responder"
	// RefusedUnknown: a prompt this gateway does not know.
	RefusedUnknown = "unknown_prompt"
	// RefusedToken: an answer token that does not verify, or expired.
	RefusedToken = "token_invalid"
	// RefusedTokenReused: an answer token presented a second time.
	RefusedTokenReused = "token_reused"
	// RefusedTokenPrompt: an answer token presented for another prompt.
	RefusedTokenPrompt = "token_wrong_prompt"
	// RefusedTokenPerson: an answer token presented by another person or
	// from another subscription.
	RefusedTokenPerson = "token_wrong_person"
	// RefusedEndpoint: a push endpoint on an address that may not be
	// reached (the webhook rules, see ErrDeniedAddress).
	RefusedEndpoint = "endpoint_denied"
	// RefusedMalformed: a request that does not parse.
	RefusedMalformed = "malformed"
)

// RefusedError is an answer refused, for Reason.
type RefusedError struct {
	Reason string
	Msg    string
}

func (e *RefusedError) Error() string { return "channel: answer refused (" + e.Reason + "): " + e.Msg }

// Is makes errors.Is(err, ErrRefused) hold.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// Refuse counts a refusal of adapter's for reason and returns it as an
// error matching ErrRefused: the adapters' inbound endpoints call it for
// what they refuse before an answer reaches the registry (a forged
// signature).
func (r *Registry) Refuse(adapter, reason, msg string) error {
	r.count(adapter, StatRefused, reason)
	return &RefusedError{Reason: reason, Msg: msg}
}

// Answer is a person's answer to a card, as an adapter received it.
type Answer struct {
	// Adapter is the adapter's name.
	Adapter string
	// Dest is the destination the card was shown at (the chat or
	// conversation the button was pressed in).
	Dest string
	// User is the platform's id of who answered, for the audit.
	User string
	// Principal is the person User maps to; "" when unmapped.
	Principal string
	// Value is the pressed button's value (Card.Values).
	Value string
	// Ref is the platform's reference of the card the button is on, as
	// its adapter's Send returned it, when the platform says (Telegram's
	// callback and Slack's interaction name their message). A card whose
	// record a stop lost, between its send and the record's commit, is
	// edited through it.
	Ref string
}

// Answer settles a prompt with a pressed button: the value must be one
// this gateway signed for that destination, the destination must be a
// registration of the prompt's owner, and the person must be one who may
// answer it (Options.Responders). It returns the prompt's record as it
// stands and whether this answer decided it; a prompt already settled is
// not an error: the record carries the recorded outcome. A refusal is a
// *RefusedError.
func (r *Registry) Answer(ctx context.Context, a Answer) (rec bridge.Record, won bool, err error) {
	actionID, decision, ok := r.keys.open(a.Adapter, a.Dest, a.Value)
	if !ok {
		return bridge.Record{}, false, r.Refuse(a.Adapter, RefusedTampered, "the button's data is not signed for this destination")
	}
	return r.decide(ctx, a.Adapter, a.Dest, a.Ref, a.User, a.Principal, actionID, decision)
}

// TokenAnswer is an answer carried by a token (Card.Token): a push
// notification's action, or its deep link.
type TokenAnswer struct {
	// Token is Card.Token as it was sent.
	Token string
	// ActionID is the prompt the answer is for.
	ActionID string
	// Decision is bridge.DecisionAllowOnce, DecisionAllowAlways or
	// DecisionDeny.
	Decision string
	// Dest is the destination presenting the token (the push
	// subscription's id, from the endpoint the browser holds).
	Dest string
	// Principal, when not "", is the person signed in where the token is
	// presented: it must be the token's.
	Principal string
}

// AnswerToken settles a prompt with an answer token: a token this gateway
// signed, not expired, for that prompt, presented from the destination
// it was sent to (and, when someone is signed in, by its person), and
// never presented before. The token's owner answers, as for Answer.
func (r *Registry) AnswerToken(ctx context.Context, adapter string, t TokenAnswer) (bridge.Record, bool, error) {
	c, err := r.checkToken(adapter, t.Token, t.ActionID, t.Dest, t.Principal)
	if err != nil {
		return bridge.Record{}, false, err
	}
	if _, _, err := bridge.ParseDecision(t.Decision); err != nil {
		return bridge.Record{}, false, r.Refuse(adapter, RefusedMalformed, err.Error())
	}
	if err := r.spend(ctx, adapter, c); err != nil {
		return bridge.Record{}, false, err
	}
	return r.decide(ctx, adapter, c.Dest, "", c.Dest, c.Owner, c.Action, t.Decision)
}

// PeekToken returns the prompt a token answers, without spending it, so a
// deep link can show the prompt before the person answers.
func (r *Registry) PeekToken(adapter, token, dest string) (bridge.Record, error) {
	d := r.deciderOf()
	if d == nil {
		return bridge.Record{}, ErrNotStarted
	}
	c, err := r.checkToken(adapter, token, "", dest, "")
	if err != nil {
		return bridge.Record{}, err
	}
	rec, err := d.Get(c.Action)
	if err != nil {
		return bridge.Record{}, r.Refuse(adapter, RefusedUnknown, err.Error())
	}
	return rec, nil
}

// checkToken verifies a token for actionID (any when "") presented from
// dest by principal (anyone when "").
func (r *Registry) checkToken(adapter, token, actionID, dest, principal string) (tokenClaims, error) {
	c, ok := r.keys.openToken(token)
	switch {
	case !ok || c.Adapter != adapter:
		return c, r.Refuse(adapter, RefusedToken, "the token does not verify")
	case time.Now().Unix() > c.Expires:
		return c, r.Refuse(adapter, RefusedToken, "the token expired")
	case actionID != "" && c.Action != actionID:
		return c, r.Refuse(adapter, RefusedTokenPrompt, "the token is for another prompt")
	case c.Dest != dest || (principal != "" && principal != c.Owner):
		return c, r.Refuse(adapter, RefusedTokenPerson, "the token is another person's")
	}
	return c, nil
}

// spend records a token as used, once: a second presentation is refused.
func (r *Registry) spend(ctx context.Context, adapter string, c tokenClaims) error {
	r.spendMu.Lock()
	defer r.spendMu.Unlock()
	var at int64
	if err := r.st.Get(kindSpent, c.Nonce, &at); err == nil {
		return r.Refuse(adapter, RefusedTokenReused, "the token was used already")
	} else if !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("channel: read token: %w", err)
	}
	var b store.Batch
	_ = b.Put(kindSpent, c.Nonce, c.Expires)
	if err := r.st.Write(ctx, &b); err != nil {
		return fmt.Errorf("channel: spend token: %w", err)
	}
	return nil
}

// forgetSpent deletes the records of spent tokens that have expired: they
// are refused as expired now.
func (r *Registry) forgetSpent(now time.Time) {
	var b store.Batch
	_ = store.EachRecord(r.ctx, r.st, kindSpent, "", func(id string, exp *int64) bool {
		if *exp < now.Unix() {
			b.Delete(kindSpent, id)
		}
		return b.Len() < 1000
	})
	if b.Len() == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(r.ctx, writeTimeout)
	defer cancel()
	if err := r.st.Write(ctx, &b); err != nil && ctx.Err() == nil {
		r.log.Warn("expired answer tokens not forgotten", "err", err)
	}
}

// press is an answer received and not yet recorded: if the gateway stops
// before it is, Start finds it and edits the card to say so.
type press struct {
	ActionID string    `msgpack:"a"`
	Adapter  string    `msgpack:"c"`
	Dest     string    `msgpack:"d"`
	At       time.Time `msgpack:"t"`
}

// decide is the answer path shared by buttons and tokens.
func (r *Registry) decide(ctx context.Context, adapter, dest, ref, user, principal, actionID, decision string) (bridge.Record, bool, error) {
	d := r.deciderOf()
	if d == nil {
		return bridge.Record{}, false, ErrNotStarted
	}
	done, err := r.enter()
	if err != nil {
		return bridge.Record{}, false, err
	}
	defer done()
	rec, err := d.Get(actionID)
	if err != nil {
		if errors.Is(err, bridge.ErrNotFound) {
			return bridge.Record{}, false, r.Refuse(adapter, RefusedUnknown, "no prompt "+actionID)
		}
		return bridge.Record{}, false, err
	}
	if _, ok := r.recordOf(destKey(adapter, rec.Owner, dest)); !ok {
		return bridge.Record{}, false, r.Refuse(adapter, RefusedChat, "the prompt was not shown there")
	}
	if principal == "" {
		return bridge.Record{}, false, r.Refuse(adapter, RefusedUnmapped, "user "+user+" is mapped to no person")
	}
	if !r.mayAnswer(rec, principal) {
		return bridge.Record{}, false, r.Refuse(adapter, RefusedResponder, principal+" may not answer this prompt")
	}
	var b store.Batch
	adopt := r.adoptCard(&b, destKey(adapter, rec.Owner, dest), rec, ref)
	if rec.State != bridge.StatePending {
		r.count(adapter, StatAnswers, "recorded")
		if adopt != nil {
			if err := r.st.Write(ctx, &b); err != nil {
				adopt.Abort()
				r.log.Warn("card of a settled prompt not edited", "action", actionID, "err", err)
			} else {
				adopt.Publish()
			}
		}
		return rec, false, nil
	}
	outcome, scope, err := bridge.ParseDecision(decision)
	if err != nil {
		if adopt != nil {
			adopt.Abort()
		}
		return bridge.Record{}, false, r.Refuse(adapter, RefusedMalformed, err.Error())
	}
	pid := actionID + "|" + adapter + "|" + dest
	_ = b.Put(kindPress, pid, &press{ActionID: actionID, Adapter: adapter, Dest: dest, At: time.Now().UTC()})
	if err := r.st.Write(ctx, &b); err != nil {
		if adopt != nil {
			adopt.Abort()
		}
		return bridge.Record{}, false, fmt.Errorf("channel: record answer: %w", err)
	}
	if adopt != nil {
		adopt.Publish()
	}
	cur, err := d.Decide(ctx, rec, kernel.Decision{Outcome: outcome, Scope: scope, DecidedBy: &kernel.DecidedBy{
		Principal: principal, ChannelID: adapter, NativePeerID: user,
	}})
	b = store.Batch{}
	b.Delete(kindPress, pid)
	if werr := r.st.Write(ctx, &b); werr != nil {
		r.log.Warn("answer record not removed", "action", actionID, "err", werr)
	}
	if errors.Is(err, ErrDecided) {
		r.count(adapter, StatAnswers, "recorded")
		return cur, false, nil
	}
	if err != nil {
		return bridge.Record{}, false, err
	}
	// Its channel.permission_returned is logged with the retraction.
	r.count(adapter, StatAnswers, "won")
	return cur, true, nil
}

// adoptCard stages in b, for the destination k's driver, the card that a
// press on it names (ref) when the registry has no record of it: its send
// was cut by a stop before the record was committed. The driver, the one
// writer of its destination's card records, records it unless it has one
// by then, and edits it at once if rec is settled. nil when there is
// nothing to adopt; otherwise the caller publishes or aborts it.
func (r *Registry) adoptCard(b *store.Batch, k peer.Key, rec bridge.Record, ref string) *peer.Staged {
	if ref == "" {
		return nil
	}
	var c card
	if err := r.st.Get(kindCard, cardID(k, rec.ActionID), &c); !errors.Is(err, store.ErrNotFound) {
		return nil
	}
	data, err := json.Marshal(&adoption{Record: rec, Ref: ref})
	if err != nil {
		return nil
	}
	return r.hub.Stage(b, k, typeCardAdopt, data, "")
}

// adoption is a typeCardAdopt delivery: the prompt as the press found it
// and the card it was pressed on.
type adoption struct {
	bridge.Record
	Ref string `json:"card_ref"`
}

// mayAnswer reports whether principal may answer rec through an adapter:
// the people its policy rule named when it was requested (its
// Responders), or else those Options.Responders lists for the rule, or
// else the prompt's owner.
func (r *Registry) mayAnswer(rec bridge.Record, principal string) bool {
	if len(rec.Responders) > 0 {
		return slices.Contains(rec.Responders, principal)
	}
	if who, ok := r.responders[rec.RuleID]; ok {
		return slices.Contains(who, principal)
	}
	return principal == rec.Owner
}

// Record kinds of the answer keys.
const (
	// kindKey holds the registry's signing key.
	kindKey = "chkey"
	// kindSpent: answer tokens presented, by nonce, until they expire.
	kindSpent = "chspent"
)

// keys signs button values and answer tokens with the registry's own key,
// made on first start and kept in the store (never logged or exported).
type keys struct {
	key []byte
}

func loadKeys(ctx context.Context, st *store.Store) (*keys, error) {
	var k []byte
	err := st.Get(kindKey, "answers", &k)
	if err == nil && len(k) == 32 {
		return &keys{key: k}, nil
	}
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("channel: read signing key: %w", err)
	}
	k = make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("channel: make signing key: %w", err)
	}
	var b store.Batch
	_ = b.Put(kindKey, "answers", k)
	if err := st.Write(ctx, &b); err != nil {
		return nil, fmt.Errorf("channel: keep signing key: %w", err)
	}
	return &keys{key: k}, nil
}

func (k *keys) mac(parts ...string) []byte {
	m := hmac.New(sha256.New, k.key)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

// Button values are "<decision letter>.<action id>.<tag>": 61 bytes for a
// UUID action id, within Telegram's 64-byte callback data.
var decisionLetters = map[string]string{
	bridge.DecisionAllowOnce:   "o",
	bridge.DecisionAllowAlways: "a",
	bridge.DecisionDeny:        "d",
}

var b64 = base64.RawURLEncoding.Strict()

// value signs a button of actionID's card at adapter's dest.
func (k *keys) value(adapter, dest, actionID, decision string) string {
	letter := decisionLetters[decision]
	tag := k.mac("button/v1", adapter, dest, actionID, letter)[:16]
	return letter + "." + actionID + "." + b64.EncodeToString(tag)
}

// open verifies a button value for adapter's dest.
func (k *keys) open(adapter, dest, v string) (actionID, decision string, ok bool) {
	letter, rest, ok1 := strings.Cut(v, ".")
	actionID, tag, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 {
		return "", "", false
	}
	got, err := b64.DecodeString(tag)
	if err != nil || !hmac.Equal(got, k.mac("button/v1", adapter, dest, actionID, letter)[:16]) {
		return "", "", false
	}
	for d, l := range decisionLetters {
		if l == letter {
			return actionID, d, true
		}
	}
	return "", "", false
}

// tokenClaims are what an answer token says.
type tokenClaims struct {
	Action  string `json:"a"`
	Owner   string `json:"o"`
	Adapter string `json:"c"`
	Dest    string `json:"d"`
	Expires int64  `json:"e"`
	Nonce   string `json:"n"`
}

// tokenLife is how long a token of a prompt without expiry is good for.
const tokenLife = 24 * time.Hour

func tokenExpiry(rec bridge.Record, now time.Time) time.Time {
	if rec.ExpiresAt != nil {
		return *rec.ExpiresAt
	}
	return now.Add(tokenLife)
}

// token signs c with a fresh nonce: "<claims>.<tag>", base64url.
func (k *keys) token(c tokenClaims) string {
	n := make([]byte, 16)
	_, _ = rand.Read(n)
	c.Nonce = b64.EncodeToString(n)
	body, _ := json.Marshal(&c)
	p := b64.EncodeToString(body)
	return p + "." + b64.EncodeToString(k.mac("token/v1", p))
}

// openToken verifies a token and returns its claims.
func (k *keys) openToken(t string) (tokenClaims, bool) {
	var c tokenClaims
	p, tag, ok := strings.Cut(t, ".")
	if !ok || len(t) > 2048 {
		return c, false
	}
	got, err := b64.DecodeString(tag)
	if err != nil || !hmac.Equal(got, k.mac("token/v1", p)) {
		return c, false
	}
	body, err := b64.DecodeString(p)
	if err != nil || json.Unmarshal(body, &c) != nil || c.Nonce == "" {
		return tokenClaims{}, false
	}
	return c, true
}
