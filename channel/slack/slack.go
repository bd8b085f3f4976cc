// Package slack is the Slack channel: an app that posts each permission
// prompt as a Block Kit message with Allow once, Allow always and Deny
// buttons to the conversations the deployment maps to people (a channel,
// or the app's direct message with a person), takes the answers at its
// interaction endpoint, and edits the message when the prompt is settled
// anywhere, to say who decided, how and when.
//
// The interaction endpoint, /v0/channels/slack/interactions, accepts only
// requests signed with the app's signing secret (Slack's v0 HMAC-SHA256
// over the timestamp and body) whose timestamp is within 5 minutes of the
// gateway's clock, and each signed request once: a forged, stale or
// replayed request is refused and counted (gatehouse_channel_refused_total),
// as is an answer from a Slack user mapped to no person.
package slack

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	slackapi "github.com/slack-go/slack"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/channel"
)

// DefaultAPIURL is Slack's Web API.
const DefaultAPIURL = slackapi.APIURL

// HookPath is the interaction endpoint's path on the gateway (the app's
// Interactivity Request URL).
const HookPath = "/v0/channels/slack/interactions"

// Window is how far a request's timestamp may be from the gateway's clock.
const Window = 5 * time.Minute

// maxSeen bounds the signatures remembered to refuse replays.
const maxSeen = 10000

// Options configure the Slack channel.
type Options struct {
	// Token is the app's bot token (xoxb-...), with the chat:write scope;
	// required. A secret: it never reaches a log, an event or an export.
	Token string
	// SigningSecret is the app's signing secret; required. A secret.
	SigningSecret string
	// APIURL is the Web API's base URL, ending in a slash; empty means
	// DefaultAPIURL.
	APIURL string
	// Users maps Slack user ids (U...) to the people they are; only they
	// may answer.
	Users map[string]string
	// Conversations maps people to the conversations their prompts are
	// posted to (a channel's id, C...). A mapped user with none gets their
	// prompts in a direct message from the app.
	Conversations map[string][]string
	// HTTPClient calls the Web API; nil means a client with a 15s timeout.
	HTTPClient *http.Client
	// Logger receives warnings; nil discards.
	Logger *slog.Logger
}

// App is the Slack adapter (channel.Adapter).
type App struct {
	o   Options
	api *slackapi.Client
	log *slog.Logger
	reg *channel.Registry

	mu   sync.Mutex
	seen map[string]time.Time // signatures of requests taken, until they leave the window
}

// New checks o and returns the adapter; it makes no call to Slack.
func New(o Options) (*App, error) {
	if o.Token == "" {
		return nil, errors.New("slack: a bot token is required")
	}
	if o.SigningSecret == "" {
		return nil, errors.New("slack: the app's signing secret is required")
	}
	if o.APIURL == "" {
		o.APIURL = DefaultAPIURL
	}
	if !strings.HasSuffix(o.APIURL, "/") {
		o.APIURL += "/"
	}
	for person, convs := range o.Conversations {
		if person == "" || len(convs) == 0 {
			return nil, fmt.Errorf("slack: conversations of %q: want person=conversation id", person)
		}
		for _, c := range convs {
			if c == "" || strings.ContainsAny(c, "@ ") {
				return nil, fmt.Errorf("slack: conversation id %q of %s", c, person)
			}
		}
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: 15 * time.Second}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &App{
		o: o, log: o.Logger, seen: map[string]time.Time{},
		api: slackapi.New(o.Token, slackapi.OptionAPIURL(o.APIURL), slackapi.OptionHTTPClient(o.HTTPClient)),
	}, nil
}

// Name implements channel.Adapter.
func (a *App) Name() string { return channel.AdapterSlack }

// Bind implements channel.Binder.
func (a *App) Bind(r *channel.Registry) { a.reg = r }

// Routes implements channel.Router: each person's conversations, or a
// direct message to each mapped user whose person has none.
func (a *App) Routes() []channel.Route {
	var out []channel.Route
	for person, convs := range a.o.Conversations {
		for _, c := range convs {
			out = append(out, channel.Route{Owner: person, ID: c})
		}
	}
	for user, person := range a.o.Users {
		if len(a.o.Conversations[person]) == 0 {
			out = append(out, channel.Route{Owner: person, ID: user})
		}
	}
	return out
}

// fail turns a Web API error into the adapter layer's.
func (a *App) fail(what string, err error) error {
	var rl *slackapi.RateLimitedError
	var se slackapi.SlackErrorResponse
	var sc slackapi.StatusCodeError
	switch {
	case errors.As(err, &rl):
		return &channel.RetryAfterError{After: rl.RetryAfter, Err: errors.New(what + ": rate limited")}
	case errors.As(err, &se):
		switch se.Err {
		case "ratelimited", "internal_error", "fatal_error", "request_timeout", "service_unavailable",
			"invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired", "team_access_not_granted":
			// Slack's trouble, or the app's token: worth retrying once
			// mended.
			return errors.New(what + ": " + se.Err)
		}
		return fmt.Errorf("%w: %s: %s", channel.ErrPermanent, what, se.Err)
	case errors.As(err, &sc) && sc.Code >= 400 && sc.Code < 500 && sc.Code != http.StatusTooManyRequests:
		return fmt.Errorf("%w: %s: %s", channel.ErrPermanent, what, sc.Status)
	}
	return errors.New(what + ": " + strings.ReplaceAll(err.Error(), a.o.Token, "<token>"))
}

// Send implements channel.Adapter: the prompt as a message whose ref is
// "<conversation>|<ts>" (a direct message's conversation is the one Slack
// opened, not the user id it was posted to).
func (a *App) Send(ctx context.Context, d channel.Dest, c channel.Card) (string, error) {
	conv, ts, err := a.api.PostMessageContext(ctx, d.ID, slackapi.MsgOptionText(fallback(c), false), slackapi.MsgOptionBlocks(blocks(d, c)...))
	if err != nil {
		return "", a.fail("chat.postMessage", err)
	}
	if conv == "" {
		conv = d.ID
	}
	return conv + "|" + ts, nil
}

// Edit implements channel.Adapter: the message shows the outcome without
// buttons, or the note with them.
func (a *App) Edit(ctx context.Context, d channel.Dest, ref string, c channel.Card) error {
	conv, ts, ok := strings.Cut(ref, "|")
	if !ok {
		return fmt.Errorf("%w: message ref %q", channel.ErrPermanent, ref)
	}
	_, _, _, err := a.api.UpdateMessageContext(ctx, conv, ts, slackapi.MsgOptionText(fallback(c), false), slackapi.MsgOptionBlocks(blocks(d, c)...))
	if err != nil {
		return a.fail("chat.update", err)
	}
	return nil
}

// fallback is the message's plain text, for notifications and clients
// that show no blocks.
func fallback(c channel.Card) string {
	if c.Record.State != bridge.StatePending {
		return channel.Title(c.Record) + " " + channel.Outcome(c.Record)
	}
	return channel.Title(c.Record) + " " + channel.Reason(c.Record)
}

// escape escapes the three characters Slack's mrkdwn treats as markup.
var escape = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace

// blocks is a card's Block Kit. The buttons' block id is the destination,
// so that an answer names the destination its values were signed for (a
// direct message's conversation is not the user id it was posted to).
func blocks(d channel.Dest, c channel.Card) []slackapi.Block {
	rec := c.Record
	md := func(s string) *slackapi.TextBlockObject {
		return slackapi.NewTextBlockObject(slackapi.MarkdownType, s, false, false)
	}
	fields := []*slackapi.TextBlockObject{md("*Execution*\n`" + escape(rec.ExecutionID) + "`")}
	if rec.AgentID != "" {
		fields = append(fields, md("*Agent*\n"+escape(rec.AgentID)))
	}
	out := []slackapi.Block{
		slackapi.NewSectionBlock(md("*"+escape(channel.Title(rec))+"*\n"+escape(channel.Reason(rec))), fields, nil),
		slackapi.NewSectionBlock(md("```"+escape(strings.ReplaceAll(channel.Arguments(rec, 2500), "```", "'''"))+"```"), nil, nil),
	}
	if rec.State != bridge.StatePending {
		return append(out, slackapi.NewSectionBlock(md("*"+escape(channel.Outcome(rec))+"*"), nil, nil))
	}
	if e := channel.Expiry(rec); e != "" {
		out = append(out, slackapi.NewContextBlock("", md(escape(e))))
	}
	if c.Note != "" {
		out = append(out, slackapi.NewContextBlock("", md(":warning: "+escape(c.Note))))
	}
	button := func(decision, text, style string) *slackapi.ButtonBlockElement {
		b := slackapi.NewButtonBlockElement(decision, c.Values[decision], slackapi.NewTextBlockObject(slackapi.PlainTextType, text, false, false))
		if style != "" {
			b = b.WithStyle(slackapi.Style(style))
		}
		return b
	}
	return append(out, slackapi.NewActionBlock(d.ID,
		button(bridge.DecisionAllowOnce, "Allow once", "primary"),
		button(bridge.DecisionAllowAlways, "Allow always", ""),
		button(bridge.DecisionDeny, "Deny", "danger"),
	))
}

// Hooks implements channel.Hooker: the interaction endpoint.
func (a *App) Hooks() []channel.Hook {
	return []channel.Hook{{Path: HookPath, Form: true, Serve: a.serveHook}}
}

var (
	ok        = channel.HookReply{Status: http.StatusOK}
	forbidden = channel.HookReply{Status: http.StatusUnauthorized, ContentType: "text/plain; charset=utf-8", Body: []byte("signature required\n")}
)

// serveHook takes one interaction: a signed, fresh, first-seen request,
// whose button press goes to the registry as the mapped person's answer.
func (a *App) serveHook(ctx context.Context, h http.Header, body []byte) channel.HookReply {
	if reason, msg := a.verify(h, body, time.Now()); reason != "" {
		_ = a.reg.Refuse(a.Name(), reason, msg)
		a.log.Warn("slack interaction refused", "reason", reason, "why", msg)
		return forbidden
	}
	form, err := url.ParseQuery(string(body))
	var cb slackapi.InteractionCallback
	if err == nil {
		err = json.Unmarshal([]byte(form.Get("payload")), &cb)
	}
	if err != nil {
		_ = a.reg.Refuse(a.Name(), channel.RefusedMalformed, "interaction payload does not parse")
		return channel.HookReply{Status: http.StatusBadRequest, ContentType: "text/plain; charset=utf-8", Body: []byte("payload required\n")}
	}
	if cb.Type != slackapi.InteractionTypeBlockActions {
		return ok
	}
	for _, act := range cb.ActionCallback.BlockActions {
		a.press(ctx, cb, act)
	}
	return ok
}

// verify checks a request's signature, freshness and novelty: reason is
// "" when it passes, else the refusal's.
func (a *App) verify(h http.Header, body []byte, now time.Time) (reason, msg string) {
	sv, err := slackapi.NewSecretsVerifier(h, a.o.SigningSecret)
	switch {
	case errors.Is(err, slackapi.ErrExpiredTimestamp):
		return channel.RefusedStale, "timestamp more than " + Window.String() + " from the gateway's clock"
	case err != nil:
		return channel.RefusedSignature, "signature headers missing or malformed"
	}
	_, _ = sv.Write(body)
	if sv.Ensure() != nil {
		return channel.RefusedSignature, "signature does not match"
	}
	sig := h.Get("X-Slack-Signature")
	a.mu.Lock()
	defer a.mu.Unlock()
	for s, at := range a.seen {
		if now.Sub(at) > 2*Window {
			delete(a.seen, s)
		}
	}
	if _, dup := a.seen[sig]; dup {
		return channel.RefusedReplayed, "request seen before"
	}
	if len(a.seen) >= maxSeen {
		// Every request of the window is remembered or none is safe:
		// refuse rather than forget one that could then be replayed.
		return channel.RefusedReplayed, "too many requests in the window to tell replays"
	}
	a.seen[sig] = now
	return "", ""
}

// messageRef is the ref Send returned for the message of cb, when cb
// names it.
func messageRef(cb slackapi.InteractionCallback) string {
	conv, ts := cb.Container.ChannelID, cb.Container.MessageTs
	if conv == "" {
		conv = cb.Channel.ID
	}
	if ts == "" {
		ts = cb.Message.Timestamp
	}
	if conv == "" || ts == "" {
		return ""
	}
	return conv + "|" + ts
}

// press answers one button press and, when it did not decide the prompt,
// tells the person why in a message only they see.
func (a *App) press(ctx context.Context, cb slackapi.InteractionCallback, act *slackapi.BlockAction) {
	user := cb.User.ID
	rec, won, err := a.reg.Answer(ctx, channel.Answer{
		Adapter: a.Name(), Dest: act.BlockID, User: user, Principal: a.o.Users[user], Value: act.Value,
		Ref: messageRef(cb),
	})
	var note string
	var re *channel.RefusedError
	switch {
	case errors.As(err, &re):
		a.log.Warn("slack answer refused", "reason", re.Reason, "user", user, "conversation", cb.Channel.ID)
		note = "You may not answer this prompt here (" + strings.ReplaceAll(re.Reason, "_", " ") + ")."
	case err != nil:
		a.log.Warn("slack answer not recorded", "user", user, "err", err)
		note = "Your answer was not recorded: try again."
	case !won:
		note = "Already answered: " + channel.Outcome(rec)
	}
	if note == "" || cb.Channel.ID == "" {
		return
	}
	if _, err := a.api.PostEphemeralContext(ctx, cb.Channel.ID, user, slackapi.MsgOptionText(note, false)); err != nil {
		a.log.Warn("slack note not posted", "user", user, "err", a.fail("chat.postEphemeral", err))
	}
}

// Sign returns the X-Slack-Signature of body sent at timestamp (unix
// seconds, as in X-Slack-Request-Timestamp) with secret: what Slack sends,
// for tests and tools that speak for it.
func Sign(secret, timestamp string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("v0:" + timestamp + ":"))
	m.Write(body)
	return "v0=" + hex.EncodeToString(m.Sum(nil))
}

// Timestamp is the X-Slack-Request-Timestamp of t.
func Timestamp(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }
