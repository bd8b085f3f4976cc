package channel_test

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/channel/channeltest"
	"github.com/gatehouse-dev/gatehouse/channel/slack"
	"github.com/gatehouse-dev/gatehouse/channel/slack/slacktesting"
	"github.com/gatehouse-dev/gatehouse/channel/telegram"
	"github.com/gatehouse-dev/gatehouse/channel/telegram/telegramtest"
	"github.com/gatehouse-dev/gatehouse/channel/webpush"
	"github.com/gatehouse-dev/gatehouse/channel/webpush/webpushtest"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// BenchmarkChannelsDelivery measures, one prompt at a time, on one node
// with all three chat and push channels against their local platforms
// (the Bot API of telegramtest, slack-go's slacktest, web-push-testing):
// the time from a prompt's creation to each channel's platform receiving
// its card, and, once the prompt is answered through Web Push, the time
// from the decision to each channel's platform receiving the edit (the
// withdrawal, for Web Push). It reports the p50 and p99 of each; run it
// with -benchtime=1000x for 1,000 prompts. It asserts no time.
func BenchmarkChannelsDelivery(b *testing.B) {
	const token, user = "9:bench", 111
	tg := telegramtest.Start(b, token)
	sl := slacktesting.Start(b)
	svc := webpushtest.Start(b)
	s := nodetest.Start(b, node.Options{
		Policy:       policytest.Parse(b, channeltest.Policy),
		Telegram:     &telegram.Options{Token: token, APIURL: tg.URL, Users: map[int64]string{user: "local"}, PollTimeout: time.Second},
		Slack:        &slack.Options{Token: "xoxb-bench", SigningSecret: "s", APIURL: sl.URL, HTTPClient: sl.Client(), Users: map[string]string{"U111": "local"}},
		WebPush:      &webpush.Options{},
		WebhookAllow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")},
	})
	_, data, _ := nodetest.Do(b, nil, "GET", s.URL+"/v0/channels/webpush", nil)
	var info struct {
		Key string `json:"public_key"`
	}
	_ = json.Unmarshal(data, &info)
	sub := svc.Subscribe(b, info.Key)
	nodetest.Do(b, nil, "PUT", s.URL+"/v0/channels/webpush/subscription", sub.JSON())

	deliver := map[string][]time.Duration{}
	retract := map[string][]time.Duration{}
	pushAt := func(topic, urgency string) (time.Time, bool) {
		for _, r := range svc.Requests(sub) {
			if r.Header.Get("Topic") == topic && r.Header.Get("Urgency") == urgency && r.Status == 201 {
				return r.At, true
			}
		}
		return time.Time{}, false
	}
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		rec := channeltest.Ask(b, s.Node, "local", "deploy.bench", map[string]any{"i": i})
		topic := webpush.Topic(rec.ActionID)
		tgAt := eventually.Value(b, "the Telegram card", func() (time.Time, bool) {
			for _, c := range tg.Calls("sendMessage") {
				if strings.Contains(c.Params.Get("text"), rec.ExecutionID) {
					return c.At, true
				}
			}
			return time.Time{}, false
		})
		slAt := eventually.Value(b, "the Slack card", func() (time.Time, bool) { return sl.PostedAt("U111", rec.ActionID) })
		wpAt := eventually.Value(b, "the push", func() (time.Time, bool) { return pushAt(topic, "high") })
		deliver["telegram"] = append(deliver["telegram"], tgAt.Sub(start))
		deliver["slack"] = append(deliver["slack"], slAt.Sub(start))
		deliver["webpush"] = append(deliver["webpush"], wpAt.Sub(start))

		var token string
		eventually.True(b, "the push's token", func() bool {
			msgs := svc.Messages(b, sub)
			var m webpush.Message
			for j := len(msgs) - 1; j >= 0; j-- {
				if json.Unmarshal([]byte(msgs[j]), &m) == nil && m.ActionID == rec.ActionID && m.Type == "prompt" {
					token = m.Token
					return true
				}
			}
			return false
		})
		status, body, _ := nodetest.Do(b, nil, "POST", s.URL+"/v0/channels/webpush/answer",
			map[string]string{"token": token, "action_id": rec.ActionID, "decision": "deny", "endpoint": sub.Endpoint})
		if status != 200 {
			b.Fatalf("answer: %d %s", status, body)
		}
		got, err := s.Node.Bridge.Get(rec.ActionID)
		if err != nil || got.DecidedAt == nil {
			b.Fatalf("record: %v %+v", err, got)
		}
		decided := *got.DecidedAt
		tgEdit := eventually.Value(b, "the Telegram edit", func() (time.Time, bool) {
			for _, c := range tg.Calls("editMessageText") {
				if strings.Contains(c.Params.Get("text"), rec.ExecutionID) {
					return c.At, true
				}
			}
			return time.Time{}, false
		})
		slEdit := eventually.Value(b, "the Slack edit", func() (time.Time, bool) {
			u := sl.Updates("U111", rec.ExecutionID)
			if len(u) == 0 {
				return time.Time{}, false
			}
			return u[0].At, true
		})
		wpEdit := eventually.Value(b, "the withdrawal", func() (time.Time, bool) { return pushAt(topic, "normal") })
		retract["telegram"] = append(retract["telegram"], tgEdit.Sub(decided))
		retract["slack"] = append(retract["slack"], slEdit.Sub(decided))
		retract["webpush"] = append(retract["webpush"], wpEdit.Sub(decided))
	}
	b.StopTimer()
	for _, ch := range []string{"telegram", "slack", "webpush"} {
		for what, d := range map[string][]time.Duration{"deliver": deliver[ch], "retract": retract[ch]} {
			p50, p99 := percentile(d, 50), percentile(d, 99)
			b.ReportMetric(float64(p50.Microseconds())/1000, ch+"-"+what+"-p50-ms")
			b.ReportMetric(float64(p99.Microseconds())/1000, ch+"-"+what+"-p99-ms")
			b.Logf("%-8s %-7s over %d prompts: p50 %v, p99 %v", ch, what, len(d), p50, p99)
		}
	}
}

// percentile returns the p-th percentile of d (nearest rank).
func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(0, min(len(s)-1, i-1))]
}
