package telegram_test

import (
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/channel/channeltest"
	"github.com/gatehouse-dev/gatehouse/channel/telegram"
	"github.com/gatehouse-dev/gatehouse/channel/telegram/telegramtest"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

const token = "123456:TEST-token-never-logged"

// Telegram ids of the tests: alice's private chat is her user id; the
// team group is a chat of its own.
const (
	alice = 111
	bob   = 222
	team  = -100777
)

func start(t *testing.T, api *telegramtest.Server, tweak func(*telegram.Options), o node.Options) *nodetest.Server {
	t.Helper()
	to := &telegram.Options{Token: token, APIURL: api.URL, Users: map[int64]string{alice: "alice", bob: "bob"},
		Chats: map[string][]int64{"bob": {team}}, PollTimeout: time.Second}
	if tweak != nil {
		tweak(to)
	}
	o.Telegram = to
	o.Policy = policytest.Parse(t, channeltest.Policy)
	o.Channels.RetryBase, o.Channels.RetryMax = time.Millisecond, 20*time.Millisecond
	return nodetest.Start(t, o)
}

// callbackAnswered waits for the answer to callback query id.
func callbackAnswered(t *testing.T, api *telegramtest.Server, id string) string {
	t.Helper()
	return api.WaitCall(t, "answerCallbackQuery", func(c telegramtest.Call) bool {
		return c.Params.Get("callback_query_id") == id
	}).Params.Get("text")
}

// TestTelegramPromptIsAnsweredFromItsButtons: a prompt reaches its
// owner's private chat as a message with three buttons; a press answers it
// (long polling, no inbound port), the callback query is answered, the
// audit names Telegram and the user, and the message loses its buttons
// and shows who decided.
func TestTelegramPromptIsAnsweredFromItsButtons(t *testing.T) {
	api := telegramtest.Start(t, token)
	s := start(t, api, nil, node.Options{})
	rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", map[string]any{"target": "<prod>"})
	m := api.WaitMessage(t, alice, rec.ExecutionID, nil)
	if !strings.Contains(m.Text, "<b>Allow deploy.app?</b>") || !strings.Contains(m.Text, "&#34;target&#34;: &#34;&lt;prod&gt;&#34;") {
		t.Fatalf("message text:\n%s", m.Text)
	}
	buttons := m.Buttons()
	if len(buttons) != 3 || buttons["Allow once"] == "" || buttons["Allow always"] == "" || buttons["Deny"] == "" {
		t.Fatalf("buttons: %v", buttons)
	}
	if len(api.Messages(team, rec.ExecutionID)) != 0 {
		t.Fatal("alice's prompt reached bob's team chat")
	}
	q := api.PressButton(alice, alice, m.ID, buttons["Allow once"])
	if got := callbackAnswered(t, api, q); !strings.HasPrefix(got, "Recorded: Allowed once by alice via telegram (111)") {
		t.Fatalf("callback answer %q", got)
	}
	got := channeltest.Settled(t, s.Node, rec.ActionID)
	if got.State != bridge.StateApproved || got.DecidedBy.ChannelID != "telegram" || got.DecidedBy.NativePeerID != "111" || got.DecidedBy.Principal != "alice" {
		t.Fatalf("record: %+v by %+v", got, got.DecidedBy)
	}
	edited := api.WaitMessage(t, alice, rec.ExecutionID, func(m telegramtest.Message) bool { return m.Markup == "" })
	if !strings.Contains(edited.Text, "<b>Allowed once by alice via telegram (111) at ") {
		t.Fatalf("edited text:\n%s", edited.Text)
	}
	// A second press, or a press in the meantime elsewhere, is told the outcome.
	q = api.PressButton(alice, alice, m.ID, buttons["Deny"])
	if got := callbackAnswered(t, api, q); !strings.HasPrefix(got, "Already answered: Allowed once by alice") {
		t.Fatalf("late press answered %q", got)
	}
}

// TestTelegramMessageIsEditedWhenAnsweredElsewhere: a prompt answered
// through the API edits its Telegram messages, in every chat it reached.
func TestTelegramMessageIsEditedWhenAnsweredElsewhere(t *testing.T) {
	api := telegramtest.Start(t, token)
	s := start(t, api, func(o *telegram.Options) { o.Chats["alice"] = []int64{alice, team} }, node.Options{})
	rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", nil)
	api.WaitMessage(t, alice, rec.ExecutionID, nil)
	api.WaitMessage(t, team, rec.ExecutionID, nil)
	status, body, _ := nodetest.Do(t, nil, "POST", s.URL+"/v0/actions/"+rec.ActionID+"/respond",
		map[string]string{"decision": "deny", "channel_id": "cli", "native_peer_id": "ops@box"})
	if status != 200 {
		t.Fatalf("respond: %d %s", status, body)
	}
	for _, chat := range []int64{alice, team} {
		m := api.WaitMessage(t, chat, rec.ExecutionID, func(m telegramtest.Message) bool { return m.Markup == "" })
		if !strings.Contains(m.Text, "Denied by local via cli (ops@box) at ") {
			t.Fatalf("chat %d:\n%s", chat, m.Text)
		}
	}
}

// TestTelegramRefusesStrangersAndTamperedData: a user mapped to no person,
// a mapped user answering a prompt that is not theirs, data altered, or
// data moved to another chat are refused, told so, counted, and change
// nothing.
func TestTelegramRefusesStrangersAndTamperedData(t *testing.T) {
	api := telegramtest.Start(t, token)
	s := start(t, api, nil, node.Options{})
	rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", nil)
	m := api.WaitMessage(t, alice, rec.ExecutionID, nil)
	allow := m.Buttons()["Allow once"]
	for _, tc := range []struct {
		chat, user int64
		data       string
		reason     string
	}{
		{alice, 999, allow, channel.RefusedUnmapped},
		{alice, bob, allow, channel.RefusedResponder},
		{alice, alice, "d" + allow[1:], channel.RefusedTampered},
		{alice, alice, allow[:len(allow)-2] + "AA", channel.RefusedTampered},
		{team, bob, allow, channel.RefusedTampered},
	} {
		q := api.PressButton(tc.chat, tc.user, m.ID, tc.data)
		if got := callbackAnswered(t, api, q); !strings.Contains(got, "You may not answer this prompt here ("+strings.ReplaceAll(tc.reason, "_", " ")+")") {
			t.Fatalf("%+v answered %q", tc, got)
		}
	}
	if r, _ := s.Node.Bridge.Get(rec.ActionID); r.State != bridge.StatePending {
		t.Fatalf("a refused answer settled the prompt: %+v", r)
	}
	st := s.Node.Channels.Stats()
	for reason, want := range map[string]uint64{channel.RefusedUnmapped: 1, channel.RefusedResponder: 1, channel.RefusedTampered: 3} {
		if n := st.Counted("telegram", channel.StatRefused, reason); n != want {
			t.Fatalf("refused %s: %d, want %d", reason, n, want)
		}
	}
	status, body, _ := nodetest.Do(t, nil, "GET", s.URL+"/metrics", nil)
	if status != 200 || !strings.Contains(string(body), `gatehouse_channel_refused_total{channel="telegram",reason="tampered"} 3`) {
		t.Fatalf("metrics: %d\n%s", status, body)
	}
}

// TestTelegramWebhookNeedsItsSecretToken: with a webhook URL the bot asks
// Telegram to POST there with the secret token, and the gateway refuses a
// request without it (counted) and answers one with it.
func TestTelegramWebhookNeedsItsSecretToken(t *testing.T) {
	api := telegramtest.Start(t, token)
	const secret = "hook-secret_1"
	s := start(t, api, func(o *telegram.Options) {
		o.WebhookURL, o.WebhookSecret = "https://gatehouse.example/v0/channels/telegram/webhook", secret
	}, node.Options{})
	set := api.WaitCall(t, "setWebhook", nil)
	if set.Params.Get("url") != "https://gatehouse.example/v0/channels/telegram/webhook" || set.Params.Get("secret_token") != secret {
		t.Fatalf("setWebhook: %v", set.Params)
	}
	rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", nil)
	m := api.WaitMessage(t, alice, rec.ExecutionID, nil)
	update := `{"update_id":1,"callback_query":{"id":"w1","from":{"id":111,"is_bot":false,"first_name":"A"},` +
		`"message":{"message_id":` + strconv.Itoa(m.ID) + `,"date":1,"chat":{"id":111,"type":"private"}},"chat_instance":"c","data":"` + m.Buttons()["Deny"] + `"}}`
	for _, hdr := range [][]string{nil, {telegram.SecretHeader, "wrong"}} {
		status, _, _ := nodetest.Do(t, nil, "POST", s.URL+telegram.HookPath, update, append([]string{"Content-Type", "application/json"}, hdr...)...)
		if status != http.StatusUnauthorized {
			t.Fatalf("webhook with %v: %d, want 401", hdr, status)
		}
	}
	if n := s.Node.Channels.Stats().Counted("telegram", channel.StatRefused, channel.RefusedSignature); n != 2 {
		t.Fatalf("refused signature: %d", n)
	}
	status, _, _ := nodetest.Do(t, nil, "POST", s.URL+telegram.HookPath, update, "Content-Type", "application/json", telegram.SecretHeader, secret)
	if status != 200 {
		t.Fatalf("webhook with the secret: %d", status)
	}
	if got := callbackAnswered(t, api, "w1"); !strings.HasPrefix(got, "Recorded: Denied by alice via telegram (111)") {
		t.Fatalf("callback answer %q", got)
	}
	// The same update again is a replay: taken (200) but not handled again.
	status, _, _ = nodetest.Do(t, nil, "POST", s.URL+telegram.HookPath, update, "Content-Type", "application/json", telegram.SecretHeader, secret)
	if status != 200 || len(api.Calls("answerCallbackQuery")) != 1 {
		t.Fatalf("replayed update: %d, %d callback answers", status, len(api.Calls("answerCallbackQuery")))
	}
	if status, _, _ := nodetest.Do(t, nil, "POST", s.URL+telegram.HookPath, `{"update_id":"x"`, "Content-Type", "application/json", telegram.SecretHeader, secret); status != 400 {
		t.Fatalf("malformed update: %d", status)
	}
	st := s.Node.Channels.Stats()
	if st.Counted("telegram", channel.StatRefused, channel.RefusedReplayed) != 1 || st.Counted("telegram", channel.StatRefused, channel.RefusedMalformed) != 1 {
		t.Fatalf("stats: %+v", st)
	}
	if len(api.Calls("getUpdates")) != 0 {
		t.Fatal("polled while a webhook is set")
	}
}

// TestTelegramTokenNeverLogged: with the Bot API failing every way (down,
// 5xx, flood control), the bot token appears in no log line.
func TestTelegramTokenNeverLogged(t *testing.T) {
	api := telegramtest.Start(t, token)
	var logs syncbuf.Buffer
	api.FailNext("sendMessage", 502, "Bad Gateway", 0)
	api.FailNext("sendMessage", 429, "Too Many Requests: retry after 1", 1)
	s := start(t, api, nil, node.Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", nil)
	api.WaitMessage(t, alice, rec.ExecutionID, nil)
	calls := api.Calls("sendMessage")
	if len(calls) != 3 || calls[2].At.Sub(calls[1].At) < time.Second {
		t.Fatalf("%d sendMessage calls; the third %v after the 429 asking for 1s", len(calls), calls[len(calls)-1].At.Sub(calls[1].At))
	}
	api.Close()
	eventually.True(t, "a failed poll logged", func() bool { return strings.Contains(logs.String(), "getUpdates") })
	if strings.Contains(logs.String(), token) || strings.Contains(logs.String(), "TEST-token") {
		t.Fatalf("the token reached the log:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "bot<token>/getUpdates") {
		t.Fatalf("the failed poll is not logged with the token hidden:\n%s", logs.String())
	}
}
