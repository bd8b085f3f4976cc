package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/channel/channeltest"
	"github.com/gatehouse-dev/gatehouse/channel/slack"
	"github.com/gatehouse-dev/gatehouse/channel/slack/slacktesting"
	"github.com/gatehouse-dev/gatehouse/channel/telegram"
	"github.com/gatehouse-dev/gatehouse/channel/telegram/telegramtest"
	"github.com/gatehouse-dev/gatehouse/channel/webpush"
	"github.com/gatehouse-dev/gatehouse/channel/webpush/webpushtest"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

const (
	raceTelegramToken = "42:race-token"
	raceSlackSecret   = "race-signing-secret"
	// The AAP client of an open gateway is the admin "local"; its
	// Telegram and Slack users are mapped to it.
	raceTelegramUser = 111
	raceSlackUser    = "U111"
	raceSlackDM      = "D0LOCAL"
)

var raceLoopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// doors are the four ways one prompt is answered in the race.
type doors struct {
	t   *testing.T
	s   *nodetest.Server
	c   *aapClient
	tg  *telegramtest.Server
	sl  *slacktesting.Server
	svc *webpushtest.Service
	sub webpushtest.Subscription
}

// TestChannelsRaceForOneAnswer: one prompt, an AAP session's untrusted
// tool call, is answered at the same instant from Telegram, Slack, Web Push
// and the AAP client. Exactly one answer is recorded, once; every other
// door is given the recorded outcome (Telegram's callback answer, Slack's
// message to the presser, Web Push's 409, the AAP turn going on as the
// winner decided); and every card is edited to it. Three rounds.
func TestChannelsRaceForOneAnswer(t *testing.T) {
	d := &doors{t: t, tg: telegramtest.Start(t, raceTelegramToken), sl: slacktesting.Start(t), svc: webpushtest.Start(t)}
	d.s, d.c = aapWorldWith(t, node.Options{
		Telegram: &telegram.Options{Token: raceTelegramToken, APIURL: d.tg.URL, Users: map[int64]string{raceTelegramUser: "local"}, PollTimeout: time.Second},
		Slack: &slack.Options{Token: "xoxb-race", SigningSecret: raceSlackSecret, APIURL: d.sl.URL, HTTPClient: d.sl.Client(),
			Users: map[string]string{raceSlackUser: "local"}},
		WebPush:      &webpush.Options{},
		WebhookAllow: raceLoopback,
		Channels:     channel.Options{RetryBase: time.Millisecond, RetryMax: 20 * time.Millisecond},
	})
	v0 := &aapClient{t: t, base: d.s.URL + "/v0"}
	d.sub = d.svc.Subscribe(t, v0.json("GET", "/channels/webpush", nil, 200)["public_key"].(string))
	v0.json("PUT", "/channels/webpush/subscription", d.sub.JSON(), 200)

	_, session := d.c.askEcho()
	wins := map[string]int{}
	for round := range 3 {
		if round > 0 {
			evs := d.c.stream("POST", "/session/"+session, map[string]any{"stream": "delta", "messages": []any{userMsg(fmt.Sprintf("echo round %d", round))}})
			wantOneStop(t, evs, "tool_use")
		}
		wins[d.round(session, round)]++
	}
	total := 0
	st := d.s.Node.Channels.Stats()
	for _, ch := range []string{"telegram", "slack", "webpush"} {
		won, recorded := st.Counted(ch, channel.StatAnswers, "won"), st.Counted(ch, channel.StatAnswers, "recorded")
		if int(won) != wins[ch] || won+recorded > 3 {
			t.Fatalf("%s: won %d (the records say %d), recorded %d", ch, won, wins[ch], recorded)
		}
		total += int(won)
	}
	if total+wins["aap"] != 3 {
		t.Fatalf("winners %v; the adapters counted %d wins", wins, total)
	}
	t.Logf("winners over three rounds: %v", wins)
}

// round races the four doors on the session's pending prompt and checks
// the outcome; it returns the winning channel.
func (d *doors) round(session string, round int) string {
	t := d.t
	t.Helper()
	rec := eventually.Value(t, "the round's prompt", func() (bridge.Record, bool) {
		p := d.s.Node.Bridge.Pending("local")
		if len(p) != 1 {
			return bridge.Record{}, false
		}
		return p[0], true
	})
	tgMsg := d.tg.WaitMessage(t, raceTelegramUser, "", func(m telegramtest.Message) bool {
		return strings.Contains(m.Buttons()["Allow once"], rec.ActionID)
	})
	slMsg := d.sl.WaitPosted(t, raceSlackUser, rec.ActionID)
	var push webpush.Message
	eventually.True(t, "the prompt's push", func() bool {
		for _, raw := range d.svc.Messages(t, d.sub) {
			if json.Unmarshal([]byte(raw), &push) == nil && push.ActionID == rec.ActionID && push.Type == "prompt" {
				return true
			}
		}
		return false
	})
	step := rec.StepID
	before := len(d.sl.Posted(raceSlackDM, "Already answered: "))

	var wg sync.WaitGroup
	gate := make(chan struct{})
	var query string
	var pushStatus int
	var pushBody map[string]any
	var aapStatus int
	wg.Go(func() {
		<-gate
		query = d.tg.PressButton(raceTelegramUser, raceTelegramUser, tgMsg.ID, tgMsg.Buttons()["Allow once"])
	})
	wg.Go(func() {
		<-gate
		body := slacktesting.Press(raceSlackUser, raceSlackDM, slMsg.Timestamp, slacktesting.Buttons(slMsg.Blocks)["deny"])
		nodetest.Do(t, nil, "POST", d.s.URL+slack.HookPath, body, slacktesting.Headers(raceSlackSecret, time.Now(), body)...)
	})
	wg.Go(func() {
		<-gate
		var data []byte
		pushStatus, data, _ = nodetest.Do(t, nil, "POST", d.s.URL+"/v0/channels/webpush/answer",
			map[string]string{"token": push.Token, "action_id": rec.ActionID, "decision": "deny", "endpoint": d.sub.Endpoint})
		_ = json.Unmarshal(data, &pushBody)
	})
	wg.Go(func() {
		<-gate
		resp := d.c.req("POST", "/session/"+session, map[string]any{"stream": "delta",
			"messages": []any{map[string]any{"role": "tool_permission", "toolCallId": step, "granted": true}}})
		aapStatus = resp.StatusCode
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	})
	close(gate)
	wg.Wait()

	got := channeltest.Settled(t, d.s.Node, rec.ActionID)
	winner := got.DecidedBy.ChannelID
	outcome := channel.Outcome(got)
	t.Logf("round %d: %s", round, outcome)

	// Recorded once.
	page, err := d.s.Node.Kernel.Events(context.Background(), rec.ExecutionID, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	resolved := 0
	for _, raw := range page.Events {
		var ev struct {
			Type     string `json:"type"`
			ActionID string `json:"action_id"`
		}
		if json.Unmarshal(raw, &ev) == nil && ev.Type == "permission.resolved" && ev.ActionID == rec.ActionID {
			resolved++
		}
	}
	if resolved != 1 {
		t.Fatalf("round %d: %d permission.resolved events, want 1", round, resolved)
	}
	// Telegram's presser is told the record.
	reply := d.tg.WaitCall(t, "answerCallbackQuery", func(c telegramtest.Call) bool { return c.Params.Get("callback_query_id") == query }).Params.Get("text")
	if want := map[bool]string{true: "Recorded: ", false: "Already answered: "}[winner == "telegram"] + outcome; reply != want {
		t.Fatalf("round %d: telegram was told %q, want %q", round, reply, want)
	}
	// Slack's, unless it won, in a message only they see.
	if winner != "slack" {
		eventually.Check(t, func() error {
			told := d.sl.Posted(raceSlackDM, "Already answered: ")
			if len(told) == before+1 && told[before].Text == "Already answered: "+outcome {
				return nil
			}
			return fmt.Errorf("slack's presser not told %q: %v", outcome, d.sl.Posted(raceSlackDM, ""))
		})
	}
	// Web Push's answer is the record, or 409 with it.
	details, _ := pushBody["details"].(map[string]any)
	recorded, _ := details["recorded"].(map[string]any)
	by, _ := recorded["decided_by"].(map[string]any)
	switch {
	case winner == "webpush" && pushStatus == 200:
	case winner != "webpush" && pushStatus == 409 && by["channel_id"] == winner:
	default:
		t.Fatalf("round %d: web push answered %d %v (winner %s)", round, pushStatus, pushBody, winner)
	}
	// The AAP client's turn goes on as the winner decided (or had ended).
	if aapStatus != 200 && aapStatus != 400 {
		t.Fatalf("round %d: the AAP answer got %d", round, aapStatus)
	}
	ar := &aapClient{t: t, base: d.s.URL + "/agent-runtime"}
	eventually.True(t, "the turn over", func() bool {
		return ar.json("GET", "/sessions/"+session+"/threads/main", nil, 200)["status"] == "idle"
	})
	// Every card shows the outcome.
	d.tg.WaitMessage(t, raceTelegramUser, outcome, func(m telegramtest.Message) bool { return m.ID == tgMsg.ID && m.Markup == "" })
	d.sl.WaitUpdate(t, raceSlackUser, outcome)
	eventually.True(t, "the push withdrawn", func() bool {
		for _, raw := range d.svc.Messages(t, d.sub) {
			var m webpush.Message
			if json.Unmarshal([]byte(raw), &m) == nil && m.ActionID == rec.ActionID && m.Type == "resolved" && m.Body == outcome {
				return true
			}
		}
		return false
	})
	return winner
}
