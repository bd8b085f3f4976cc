package slack_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/channel/channeltest"
	"github.com/gatehouse-dev/gatehouse/channel/slack"
	"github.com/gatehouse-dev/gatehouse/channel/slack/slacktesting"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

const (
	botToken = "xoxb-TEST-never-logged"
	secret   = "8f742231b10e8888abcd99yyyzzz85a5"
	// The ops channel is mapped to alice; bob gets direct messages.
	ops = "C0OPS"
)

func start(t *testing.T, api *slacktesting.Server, o node.Options) *nodetest.Server {
	t.Helper()
	o.Slack = &slack.Options{Token: botToken, SigningSecret: secret, APIURL: api.URL, HTTPClient: api.Client(),
		Users:         map[string]string{"U111": "alice", "U222": "bob", "U333": "carol"},
		Conversations: map[string][]string{"alice": {ops}}}
	o.Policy = policytest.Parse(t, channeltest.Policy)
	o.Channels.RetryBase, o.Channels.RetryMax = time.Millisecond, 20*time.Millisecond
	return nodetest.Start(t, o)
}

// press posts a signed interaction for user pressing action on msg.
func press(t *testing.T, s *nodetest.Server, user, conv, ts string, b slacktesting.Button, at time.Time) int {
	t.Helper()
	body := slacktesting.Press(user, conv, ts, b)
	status, _, _ := nodetest.Do(t, nil, "POST", s.URL+slack.HookPath, body, slacktesting.Headers(secret, at, body)...)
	return status
}

// TestSlackPromptIsAnsweredFromItsButtons: a prompt is posted to its
// owner's mapped channel as Block Kit with the three buttons; a signed
// press from a mapped user answers it, the audit names Slack and the user,
// and the message is edited to say who decided, how and when, without
// buttons.
func TestSlackPromptIsAnsweredFromItsButtons(t *testing.T) {
	api := slacktesting.Start(t)
	s := start(t, api, node.Options{})
	rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", map[string]any{"target": "<prod>"})
	m := api.WaitPosted(t, ops, rec.ExecutionID)
	raw, _ := json.Marshal(m.Blocks)
	if !strings.Contains(string(raw), "*Allow deploy.app?*\\ndeploys need a human") || !strings.Contains(string(raw), `\u0026lt;prod\u0026gt;`) {
		t.Fatalf("blocks: %s", raw)
	}
	buttons := slacktesting.Buttons(m.Blocks)
	if len(buttons) != 3 || buttons["allow_once"].BlockID != ops || buttons["deny"].Value == "" {
		t.Fatalf("buttons: %+v", buttons)
	}
	if status := press(t, s, "U111", ops, m.Timestamp, buttons["allow_always"], time.Now()); status != 200 {
		t.Fatalf("interaction: %d", status)
	}
	got := channeltest.Settled(t, s.Node, rec.ActionID)
	if got.Decision != bridge.DecisionAllowAlways || got.DecidedBy.ChannelID != "slack" || got.DecidedBy.NativePeerID != "U111" || got.DecidedBy.Principal != "alice" {
		t.Fatalf("record: %+v by %+v", got, got.DecidedBy)
	}
	u := api.WaitUpdate(t, ops, "Allowed for the rest of the session by alice via slack (U111) at ")
	if u.TS != m.Timestamp || len(slacktesting.Buttons(u.Blocks)) != 0 {
		t.Fatalf("update of %s (posted %s) with buttons %v", u.TS, m.Timestamp, slacktesting.Buttons(u.Blocks))
	}
}

// TestSlackMessageIsEditedWhenResolvedElsewhere: a prompt answered through
// the API, or one that expires, edits its Slack messages, in the mapped
// channel and in a person's direct message alike; a press after that is
// told the recorded outcome, in a message only its presser sees.
func TestSlackMessageIsEditedWhenResolvedElsewhere(t *testing.T) {
	api := slacktesting.Start(t)
	s := start(t, api, node.Options{})
	rec := channeltest.Ask(t, s.Node, "bob", "deploy.app", nil)
	m := api.WaitPosted(t, "U222", rec.ExecutionID) // a direct message: posted to the user id
	status, body, _ := nodetest.Do(t, nil, "POST", s.URL+"/v0/actions/"+rec.ActionID+"/respond",
		map[string]string{"decision": "deny", "channel_id": "cli", "native_peer_id": "ops@box"})
	if status != 200 {
		t.Fatalf("respond: %d %s", status, body)
	}
	api.WaitUpdate(t, "U222", "Denied by local via cli (ops@box) at ")
	if status := press(t, s, "U222", "D0BOB", m.Timestamp, slacktesting.Buttons(m.Blocks)["allow_once"], time.Now()); status != 200 {
		t.Fatalf("late press: %d", status)
	}
	api.WaitPosted(t, "D0BOB", "Already answered: Denied by local via cli")

	exp := channeltest.Ask(t, s.Node, "alice", "expire.soon", nil)
	api.WaitPosted(t, ops, exp.ExecutionID)
	api.WaitUpdate(t, ops, "Expired with no answer: denied")
}

// TestSlackRefusesForgedStaleAndReplayedRequests: an interaction that is
// unsigned, signed with another secret, signed over other bytes, older or
// newer than 5 minutes, or seen before is refused with 401 and counted by
// reason, and decides nothing; so is a press by an unmapped user or by a
// mapped one the prompt is not for, and tampered button data.
func TestSlackRefusesForgedStaleAndReplayedRequests(t *testing.T) {
	api := slacktesting.Start(t)
	s := start(t, api, node.Options{})
	rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", nil)
	m := api.WaitPosted(t, ops, rec.ExecutionID)
	allow := slacktesting.Buttons(m.Blocks)["allow_once"]
	body := slacktesting.Press("U111", ops, m.Timestamp, allow)
	now := time.Now()
	post := func(b []byte, hdr []string) int {
		status, _, _ := nodetest.Do(t, nil, "POST", s.URL+slack.HookPath, b, hdr...)
		return status
	}
	forged := []struct {
		name   string
		hdr    []string
		reason string
	}{
		{"unsigned", []string{"Content-Type", "application/x-www-form-urlencoded"}, channel.RefusedSignature},
		{"another secret", slacktesting.Headers("not-the-secret", now, body), channel.RefusedSignature},
		{"other bytes", slacktesting.Headers(secret, now, append([]byte("x"), body...)), channel.RefusedSignature},
		{"stale", slacktesting.Headers(secret, now.Add(-6*time.Minute), body), channel.RefusedStale},
		{"from the future", slacktesting.Headers(secret, now.Add(6*time.Minute), body), channel.RefusedStale},
	}
	for _, f := range forged {
		if status := post(body, f.hdr); status != http.StatusUnauthorized {
			t.Fatalf("%s: %d, want 401", f.name, status)
		}
	}
	tampered := allow
	tampered.Value = "d" + allow.Value[1:]
	for _, p := range []struct {
		user   string
		b      slacktesting.Button
		reason string
	}{
		{"U999", allow, channel.RefusedUnmapped},
		{"U333", allow, channel.RefusedResponder},
		{"U111", tampered, channel.RefusedTampered},
	} {
		if status := press(t, s, p.user, ops, m.Timestamp, p.b, time.Now()); status != 200 {
			t.Fatalf("press by %s: %d", p.user, status)
		}
		api.WaitPosted(t, ops, "You may not answer this prompt here ("+strings.ReplaceAll(p.reason, "_", " ")+")")
	}
	if r, _ := s.Node.Bridge.Get(rec.ActionID); r.State != bridge.StatePending {
		t.Fatalf("a refused request settled the prompt: %+v", r)
	}
	// The genuine request, then the same bytes again: a replay.
	hdr := slacktesting.Headers(secret, now, body)
	if status := post(body, hdr); status != 200 {
		t.Fatalf("genuine request: %d", status)
	}
	if status := post(body, hdr); status != http.StatusUnauthorized {
		t.Fatalf("replay: %d, want 401", status)
	}
	if got := channeltest.Settled(t, s.Node, rec.ActionID); got.DecidedBy.NativePeerID != "U111" {
		t.Fatalf("decided by %+v", got.DecidedBy)
	}
	// A signed body that is no interaction; one too large to be read.
	junk := []byte("payload=%7Bnot-json")
	if status := post(junk, slacktesting.Headers(secret, time.Now(), junk)); status != http.StatusBadRequest {
		t.Fatalf("malformed payload: %d", status)
	}
	huge := append([]byte("payload="), make([]byte, 70<<10)...)
	if status := post(huge, slacktesting.Headers(secret, time.Now(), huge)); status != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized body: %d", status)
	}
	st := s.Node.Channels.Stats()
	for reason, want := range map[string]uint64{
		channel.RefusedSignature: 3, channel.RefusedStale: 2, channel.RefusedReplayed: 1,
		channel.RefusedUnmapped: 1, channel.RefusedResponder: 1, channel.RefusedTampered: 1, channel.RefusedMalformed: 1,
	} {
		if n := st.Counted("slack", channel.StatRefused, reason); n != want {
			t.Fatalf("refused %s: %d, want %d", reason, n, want)
		}
	}
	_, metrics, _ := nodetest.Do(t, nil, "GET", s.URL+"/metrics", nil)
	for _, line := range []string{
		`gatehouse_channel_refused_total{channel="slack",reason="signature"} 3`,
		`gatehouse_channel_refused_total{channel="slack",reason="stale"} 2`,
		`gatehouse_channel_refused_total{channel="slack",reason="replayed"} 1`,
		`gatehouse_channel_refused_total{channel="slack",reason="tampered"} 1`,
		`gatehouse_channel_answers_total{channel="slack",result="won"} 1`,
	} {
		if !strings.Contains(string(metrics), line) {
			t.Fatalf("metrics lack %s:\n%s", line, metrics)
		}
	}
}

// TestSlackSecretsNeverLogged: the bot token and the signing secret reach
// no log line, channel listing or event, also when Slack fails.
func TestSlackSecretsNeverLogged(t *testing.T) {
	api := slacktesting.Start(t)
	var logs syncbuf.Buffer
	s := start(t, api, node.Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", nil)
	m := api.WaitPosted(t, ops, rec.ExecutionID)
	body := slacktesting.Press("U111", ops, m.Timestamp, slacktesting.Buttons(m.Blocks)["deny"])
	if status, _, _ := nodetest.Do(t, nil, "POST", s.URL+slack.HookPath, body, slacktesting.Headers("wrong", time.Now(), body)...); status != 401 {
		t.Fatalf("forged: %d", status)
	}
	api.Stop()
	channeltest.Ask(t, s.Node, "alice", "deploy.other", nil)
	eventually.True(t, "a failed post logged", func() bool { return strings.Contains(logs.String(), "chat.postMessage") })
	_, list, _ := nodetest.Do(t, nil, "GET", s.URL+"/v0/channels?owner=alice", nil)
	evs, _, _ := s.Node.Channels.Events("alice", 0, 1000)
	for what, text := range map[string]string{"logs": logs.String(), "channels": string(list), "events": string(mustJSON(t, evs))} {
		if strings.Contains(text, botToken) || strings.Contains(text, secret) {
			t.Fatalf("a secret reached the %s:\n%s", what, text)
		}
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
