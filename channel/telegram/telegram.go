// Package telegram is the Telegram channel: a bot that shows each
// permission prompt as a message with an inline keyboard (Allow once,
// Allow always, Deny) in the chats the deployment maps to people, takes
// the answer from the button's callback query, and edits the message to
// the outcome once the prompt is settled, wherever it was answered.
//
// The bot reads its updates by long polling (getUpdates) by default, so a
// gateway behind NAT needs no inbound port. With a webhook URL and secret
// it asks Telegram to POST them to /v0/channels/telegram/webhook instead,
// and refuses a request without the secret token header.
//
// Only the chats of the routes are shown prompts, and only mapped users'
// answers count: a chat id that no route names, a user mapped to no
// person, or callback data this gateway did not sign for that chat is
// refused and counted (gatehouse_channel_refused_total).
package telegram

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	tgbotapi "github.com/go-telegram-bot-api/telegram-bot-api/v5"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/internal/option"
)

// DefaultAPIURL is Telegram's Bot API.
const DefaultAPIURL = "https://api.telegram.org"

// HookPath is the webhook's path on the gateway.
const HookPath = "/v0/channels/telegram/webhook"

// SecretHeader carries the webhook's secret token (setWebhook's
// secret_token) on Telegram's requests.
const SecretHeader = "X-Telegram-Bot-Api-Secret-Token"

// maxText bounds a message's text, below Telegram's 4096 characters.
const maxText = 3500

// maxResponse bounds what is read of one Bot API response.
const maxResponse = 8 << 20

// Options configure the Telegram channel.
type Options struct {
	// Token is the bot's token from @BotFather; required. It is a secret:
	// it never reaches a log, an event or an export.
	Token string
	// APIURL is the Bot API's base URL; empty means DefaultAPIURL (a local
	// Bot API server, or a test's, may stand in).
	APIURL string
	// Users maps Telegram user ids to the people they are; only they may
	// answer.
	Users map[int64]string
	// Chats maps people to the chats their prompts go to (a group's id is
	// negative). A mapped user with no chat here gets their prompts in
	// their private chat with the bot.
	Chats map[string][]int64
	// WebhookURL, when set, is the public URL of HookPath on this gateway:
	// the bot asks Telegram to POST updates there instead of polling.
	WebhookURL string
	// WebhookSecret is the secret token Telegram sends with each webhook
	// request; required with WebhookURL (1 to 256 of A-Z, a-z, 0-9, _ and -).
	WebhookSecret string
	// PollTimeout is how long one getUpdates waits for an update; zero
	// means 30s.
	PollTimeout time.Duration
	// HTTPClient calls the Bot API; nil means a client with no proxy
	// surprises: the default transport, bounded per call by the context.
	HTTPClient *http.Client
	// Logger receives warnings; nil discards. The token never appears in
	// what is logged.
	Logger *slog.Logger
}

// Bot is the Telegram adapter (channel.Adapter).
type Bot struct {
	o      Options
	api    string
	client *http.Client
	log    *slog.Logger
	reg    *channel.Registry

	mu        sync.Mutex
	conflicts int // polls refused because a webhook is set
	// seen remembers the webhook's recent update ids (seenRing holds them
	// in arrival order, for eviction).
	seen     map[int]struct{}
	seenRing []int
	seenNext int
}

// New checks o and returns the adapter; it makes no call to Telegram.
func New(o Options) (*Bot, error) {
	if o.Token == "" || strings.ContainsAny(o.Token, "/?#% \n") {
		return nil, errors.New("telegram: a bot token is required (from @BotFather)")
	}
	if o.APIURL == "" {
		o.APIURL = DefaultAPIURL
	}
	if (o.WebhookURL == "") != (o.WebhookSecret == "") {
		return nil, errors.New("telegram: the webhook URL and secret go together")
	}
	if o.WebhookSecret != "" && !validSecret(o.WebhookSecret) {
		return nil, errors.New("telegram: the webhook secret must be 1 to 256 of A-Z, a-z, 0-9, _ and -")
	}
	for person, chats := range o.Chats {
		if person == "" || len(chats) == 0 {
			return nil, fmt.Errorf("telegram: chats of %q: want person=chat id", person)
		}
	}
	option.Default(&o.PollTimeout, 30*time.Second)
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Bot{o: o, api: strings.TrimSuffix(o.APIURL, "/") + "/bot%s/%s", client: o.HTTPClient, log: o.Logger,
		seen: map[int]struct{}{}, seenRing: make([]int, seenUpdates)}, nil
}

func validSecret(s string) bool {
	if len(s) > 256 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Name implements channel.Adapter.
func (b *Bot) Name() string { return channel.AdapterTelegram }

// Bind implements channel.Binder.
func (b *Bot) Bind(r *channel.Registry) { b.reg = r }

// Routes implements channel.Router: each person's chats, or the private
// chat of each mapped user whose person has none.
func (b *Bot) Routes() []channel.Route {
	var out []channel.Route
	for person, chats := range b.o.Chats {
		for _, c := range chats {
			out = append(out, channel.Route{Owner: person, ID: strconv.FormatInt(c, 10)})
		}
	}
	for user, person := range b.o.Users {
		if len(b.o.Chats[person]) == 0 {
			out = append(out, channel.Route{Owner: person, ID: strconv.FormatInt(user, 10)})
		}
	}
	return out
}

// bot returns a Bot API client whose calls ctx bounds (the library's own
// requests take no context).
func (b *Bot) bot(ctx context.Context) *tgbotapi.BotAPI {
	api := &tgbotapi.BotAPI{Token: b.o.Token, Client: doer{ctx: ctx, c: b.client}, Buffer: 1}
	api.SetAPIEndpoint(b.api)
	return api
}

// doer binds the library's requests to a context and bounds what is read
// of each answer.
type doer struct {
	ctx context.Context
	c   *http.Client
}

func (d doer) Do(req *http.Request) (*http.Response, error) {
	resp, err := d.c.Do(req.WithContext(d.ctx))
	if err != nil {
		return nil, err
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.LimitReader(resp.Body, maxResponse), resp.Body}
	return resp, nil
}

// fail turns a Bot API error into the adapter layer's, without the token
// (an HTTP client's error names the URL, which holds it).
func (b *Bot) fail(what string, err error) error {
	var te *tgbotapi.Error
	if errors.As(err, &te) {
		msg := what + ": " + strconv.Itoa(te.Code) + " " + te.Message
		switch {
		case te.Code == http.StatusTooManyRequests:
			return &channel.RetryAfterError{After: time.Duration(te.RetryAfter) * time.Second, Err: errors.New(msg)}
		case te.Code == http.StatusBadRequest || te.Code == http.StatusForbidden:
			// A chat the bot cannot write to (blocked, removed, unknown)
			// or a request it refuses: retrying changes nothing.
			return fmt.Errorf("%w: %s", channel.ErrPermanent, msg)
		}
		return errors.New(msg)
	}
	return errors.New(what + ": " + strings.ReplaceAll(err.Error(), b.o.Token, "<token>"))
}

// Send implements channel.Adapter: the prompt as a message with its
// buttons.
func (b *Bot) Send(ctx context.Context, d channel.Dest, c channel.Card) (string, error) {
	chat, err := strconv.ParseInt(d.ID, 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: chat id %q", channel.ErrPermanent, d.ID)
	}
	m := tgbotapi.NewMessage(chat, text(c))
	m.ParseMode = tgbotapi.ModeHTML
	m.DisableWebPagePreview = true
	m.ReplyMarkup = keyboard(c)
	sent, err := b.bot(ctx).Send(m)
	if err != nil {
		return "", b.fail("sendMessage", err)
	}
	return strconv.Itoa(sent.MessageID), nil
}

// Edit implements channel.Adapter: the message shows the outcome and
// loses its buttons, or shows the note and keeps them.
func (b *Bot) Edit(ctx context.Context, d channel.Dest, ref string, c channel.Card) error {
	chat, err := strconv.ParseInt(d.ID, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: chat id %q", channel.ErrPermanent, d.ID)
	}
	msg, err := strconv.Atoi(ref)
	if err != nil {
		return fmt.Errorf("%w: message id %q", channel.ErrPermanent, ref)
	}
	e := tgbotapi.NewEditMessageText(chat, msg, text(c))
	if c.Record.State == bridge.StatePending {
		e = tgbotapi.NewEditMessageTextAndMarkup(chat, msg, text(c), keyboard(c))
	}
	e.ParseMode = tgbotapi.ModeHTML
	e.DisableWebPagePreview = true
	if _, err := b.bot(ctx).Request(e); err != nil {
		var te *tgbotapi.Error
		if errors.As(err, &te) && strings.Contains(te.Message, "message is not modified") {
			return nil // edited already: a retry after a lost answer
		}
		return b.fail("editMessageText", err)
	}
	return nil
}

// text is a card's message, in Telegram's HTML.
func text(c channel.Card) string {
	rec := c.Record
	var s strings.Builder
	s.WriteString("<b>" + html.EscapeString(channel.Title(rec)) + "</b>\n")
	s.WriteString(html.EscapeString(channel.Reason(rec)) + "\n")
	if rec.AgentID != "" {
		s.WriteString("Agent: " + html.EscapeString(rec.AgentID) + "\n")
	}
	s.WriteString("Execution: <code>" + html.EscapeString(rec.ExecutionID) + "</code>\n")
	s.WriteString("<pre>" + html.EscapeString(channel.Arguments(rec, 2500)) + "</pre>\n")
	if rec.State == bridge.StatePending {
		if e := channel.Expiry(rec); e != "" {
			s.WriteString(html.EscapeString(e) + "\n")
		}
		if c.Note != "" {
			s.WriteString("\n⚠️ " + html.EscapeString(c.Note) + "\n")
		}
	} else {
		s.WriteString("\n<b>" + html.EscapeString(channel.Outcome(rec)) + "</b>\n")
	}
	return channel.Clip(s.String(), maxText)
}

// keyboard is a pending card's buttons; their callback data is the
// card's signed values.
func keyboard(c channel.Card) tgbotapi.InlineKeyboardMarkup {
	return tgbotapi.NewInlineKeyboardMarkup(tgbotapi.NewInlineKeyboardRow(
		tgbotapi.NewInlineKeyboardButtonData("Allow once", c.Values[bridge.DecisionAllowOnce]),
		tgbotapi.NewInlineKeyboardButtonData("Allow always", c.Values[bridge.DecisionAllowAlways]),
		tgbotapi.NewInlineKeyboardButtonData("Deny", c.Values[bridge.DecisionDeny]),
	))
}

// Run implements channel.Runner: it polls for updates, or registers the
// webhook, until ctx ends.
func (b *Bot) Run(ctx context.Context) {
	if b.o.WebhookURL != "" {
		b.setWebhook(ctx)
		return
	}
	b.poll(ctx)
}

// setWebhook asks Telegram to POST updates to the webhook, retrying
// until it agrees or ctx ends.
func (b *Bot) setWebhook(ctx context.Context) {
	allowed, _ := json.Marshal([]string{"callback_query"})
	for attempt := 0; ; attempt++ {
		_, err := b.bot(ctx).MakeRequest("setWebhook", tgbotapi.Params{
			"url": b.o.WebhookURL, "secret_token": b.o.WebhookSecret, "allowed_updates": string(allowed),
		})
		if err == nil {
			b.log.Info("telegram webhook set", "url", b.o.WebhookURL)
			return
		}
		if !b.wait(ctx, attempt, b.fail("setWebhook", err)) {
			return
		}
	}
}

// poll reads updates by long polling. An update is confirmed (the next
// offset) only once handled: one a stop interrupts comes again.
func (b *Bot) poll(ctx context.Context) {
	offset, failures := 0, 0
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, b.o.PollTimeout+15*time.Second)
		updates, err := b.bot(pctx).GetUpdates(tgbotapi.UpdateConfig{
			Offset: offset, Timeout: int(b.o.PollTimeout / time.Second), AllowedUpdates: []string{"callback_query"},
		})
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			var te *tgbotapi.Error
			if errors.As(err, &te) && te.Code == http.StatusConflict && b.conflict() {
				b.log.Error("telegram refuses polling: a webhook is set for this bot; remove it (deleteWebhook) or set --telegram-webhook-url")
			}
			if !b.wait(ctx, failures, b.fail("getUpdates", err)) {
				return
			}
			failures++
			continue
		}
		failures = 0
		for _, u := range updates {
			b.handle(ctx, u)
			offset = u.UpdateID + 1
		}
	}
}

// conflict counts a poll refused for a webhook, and says whether to log.
func (b *Bot) conflict() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.conflicts++
	return b.conflicts == 1
}

// wait logs a failed call and waits a jittered back-off, of at least what
// Telegram asked for; it is false once ctx ended.
func (b *Bot) wait(ctx context.Context, attempt int, err error) bool {
	d := min(time.Second<<min(attempt, 6), time.Minute)
	d = d/2 + rand.N(d/2+1)
	var ra *channel.RetryAfterError
	if errors.As(err, &ra) {
		d = max(d, ra.After)
	}
	b.log.Warn("telegram call failed; retrying", "retry_in", d, "err", err)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Hooks implements channel.Hooker: the webhook, when one is configured.
func (b *Bot) Hooks() []channel.Hook {
	if b.o.WebhookURL == "" {
		return nil
	}
	return []channel.Hook{{Path: HookPath, Serve: b.serveHook}}
}

// serveHook takes one webhook update. Anything without the secret token
// is refused; an update is answered 200 whatever became of it, so that
// Telegram does not send it again.
func (b *Bot) serveHook(ctx context.Context, h http.Header, body []byte) channel.HookReply {
	got := h.Get(SecretHeader)
	if subtle.ConstantTimeCompare([]byte(got), []byte(b.o.WebhookSecret)) != 1 {
		_ = b.reg.Refuse(b.Name(), channel.RefusedSignature, "webhook request without the secret token")
		return channel.HookReply{Status: http.StatusUnauthorized, ContentType: "text/plain; charset=utf-8", Body: []byte("secret token required\n")}
	}
	var u tgbotapi.Update
	if err := json.Unmarshal(body, &u); err != nil {
		_ = b.reg.Refuse(b.Name(), channel.RefusedMalformed, err.Error())
		return channel.HookReply{Status: http.StatusBadRequest, ContentType: "text/plain; charset=utf-8", Body: []byte("not an update\n")}
	}
	if !b.firstSeen(u.UpdateID) {
		// Telegram sends an update again only when it did not get our
		// 200; any other copy is a replay. Either way it was handled.
		_ = b.reg.Refuse(b.Name(), channel.RefusedReplayed, "update "+strconv.Itoa(u.UpdateID)+" seen before")
		return channel.HookReply{Status: http.StatusOK}
	}
	b.handle(ctx, u)
	return channel.HookReply{Status: http.StatusOK}
}

// seenUpdates bounds the webhook update ids remembered to refuse replays.
const seenUpdates = 4096

// firstSeen records update id and reports whether it is new.
func (b *Bot) firstSeen(id int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.seen[id]; ok {
		return false
	}
	if old := b.seenRing[b.seenNext]; old != 0 {
		delete(b.seen, old)
	}
	b.seenRing[b.seenNext] = id
	b.seenNext = (b.seenNext + 1) % len(b.seenRing)
	b.seen[id] = struct{}{}
	return true
}

// handle answers a callback query: it goes to the registry as the mapped
// person's answer, and the person is told how it went.
func (b *Bot) handle(ctx context.Context, u tgbotapi.Update) {
	q := u.CallbackQuery
	if q == nil {
		return
	}
	reply := b.answer(ctx, q)
	if _, err := b.bot(ctx).Request(tgbotapi.NewCallback(q.ID, reply)); err != nil && ctx.Err() == nil {
		b.log.Warn("telegram callback not answered", "err", b.fail("answerCallbackQuery", err))
	}
}

func (b *Bot) answer(ctx context.Context, q *tgbotapi.CallbackQuery) string {
	if q.Message == nil || q.Message.Chat == nil || q.From == nil {
		_ = b.reg.Refuse(b.Name(), channel.RefusedMalformed, "callback query without its message or user")
		return "This button cannot be answered here."
	}
	user := q.From.ID
	rec, won, err := b.reg.Answer(ctx, channel.Answer{
		Adapter: b.Name(), Dest: strconv.FormatInt(q.Message.Chat.ID, 10), User: strconv.FormatInt(user, 10),
		Principal: b.o.Users[user], Value: q.Data, Ref: strconv.Itoa(q.Message.MessageID),
	})
	var re *channel.RefusedError
	switch {
	case errors.As(err, &re):
		b.log.Warn("telegram answer refused", "reason", re.Reason, "user", user, "chat", q.Message.Chat.ID)
		return "You may not answer this prompt here (" + strings.ReplaceAll(re.Reason, "_", " ") + ")."
	case err != nil:
		b.log.Warn("telegram answer not recorded", "user", user, "err", err)
		return "Not recorded: try again."
	case won:
		return "Recorded: " + channel.Outcome(rec)
	}
	return "Already answered: " + channel.Outcome(rec)
}
