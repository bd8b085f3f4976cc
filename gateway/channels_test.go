package gateway_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
	"github.com/gatehouse-dev/gatehouse/node"
)

func (a *api) channel(channelID, peerID string) *sseStream {
	a.t.Helper()
	return a.openSSE("/v0/channels/stream?channel_id=" + channelID + "&peer_id=" + peerID)
}

// returned waits until the caller's channel log holds want
// channel.permission_returned events for action (which the settlement
// logs once its answer has gone out), checks that it holds no more, and
// returns the last one's payload.
func (a *api) returned(action string, want int) obj {
	a.t.Helper()
	var got []obj
	eventually.True(a.t, "channel.permission_returned logged", func() bool {
		got = nil
		for _, e := range a.json("GET", "/v0/channels/events?limit=1000", nil, 200)["events"].([]any) {
			if ev := e.(obj); ev["type"] == channel.TypePermissionReturned && ev["action_id"] == action {
				got = append(got, ev["payload"].(obj))
			}
		}
		return len(got) >= want
	})
	if len(got) != want {
		a.t.Fatalf("%d channel.permission_returned for %s, want %d: %v", len(got), action, want, got)
	}
	return got[len(got)-1]
}

// TestEveryAnswerPathLogsPermissionReturnedOnce: whichever door a
// person's answer comes through, the owner's channel log records one
// channel.permission_returned naming it (and the device, or the person:
// "local" is open mode's), and nothing is logged as failed.
func TestEveryAnswerPathLogsPermissionReturnedOnce(t *testing.T) {
	for _, tc := range []struct {
		name          string
		answer        func(a *api, execID, step, action string)
		channel, peer string
	}{
		{"respond naming a registered channel", func(a *api, _, _, action string) {
			a.json("POST", "/v0/actions/"+action+"/respond", obj{"decision": "deny", "channel_id": "phone", "native_peer_id": "u1"}, 200)
		}, "phone", "u1"},
		{"respond naming no channel", func(a *api, _, _, action string) {
			a.json("POST", "/v0/actions/"+action+"/respond", obj{"decision": "allow_once"}, 200)
		}, channel.DoorAPI, "local"},
		{"respond naming an unregistered channel", func(a *api, _, _, action string) {
			a.json("POST", "/v0/actions/"+action+"/respond", obj{"decision": "allow_once", "channel_id": "slack"}, 200)
		}, "slack", "local"},
		{"step.approve signal", func(a *api, execID, step, _ string) {
			a.json("POST", "/v0/executions/"+execID+"/signal", obj{"signal_type": "step.approve", "payload": obj{"step_id": step, "approved": true}}, 200)
		}, "signal", "local"},
		{"/agent-runtime respond_action", func(a *api, _, _, action string) {
			a.json("POST", "/agent-runtime/commands/respond_action", obj{"action_id": action, "decision": "allow_once"}, 200)
		}, "agent-runtime", "local"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &syncbuf.Buffer{}
			a := bridgeServer(t, node.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
			phone := a.channel("phone", "u1")
			ag := a.agent("door-agent", "c1")
			execID, _, step, action := pendingAction(t, a, ag, "deploy.door")
			phone.expect("permission.requested")
			tc.answer(a, execID, step, action)
			ag.expect("approval.resolved")
			if r := a.returned(action, 1); r["channel_id"] != tc.channel || r["native_peer_id"] != tc.peer || r["action_id"] != action {
				t.Fatalf("permission_returned: %v, want channel %s, peer %s", r, tc.channel, tc.peer)
			}
			if l := logs.String(); strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
				t.Fatalf("the answer logged a failure:\n%s", l)
			}
		})
	}
}

// TestChannelsRaceOnOnePrompt: the prompt reaches two devices; both answer;
// exactly one wins, the other gets the recorded outcome, and both devices
// get the retraction.
func TestChannelsRaceOnOnePrompt(t *testing.T) {
	a := bridgeServer(t, node.Options{})
	phone := a.channel("phone", "u1")
	chat := a.channel("chat", "u1")
	ag := a.agent("ch-agent", "c1")
	_, _, step, action := pendingAction(t, a, ag, "deploy.api")
	for _, dev := range []*sseStream{phone, chat} {
		p := dev.expect("permission.requested")
		if p["action_id"] != action || p["step_id"] != step || p["state"] != "pending" {
			t.Fatalf("prompt on a device: %v", p)
		}
	}
	var wg sync.WaitGroup
	results := map[string]int{}
	var mu sync.Mutex
	for _, dev := range []string{"phone", "chat"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, _, _ := a.do("POST", "/v0/actions/"+action+"/respond", obj{"decision": "allow_once", "channel_id": dev, "native_peer_id": "u1"})
			mu.Lock()
			results[dev] = status
			mu.Unlock()
		}()
	}
	wg.Wait()
	if !(results["phone"] == 200 && results["chat"] == 409) && !(results["phone"] == 409 && results["chat"] == 200) {
		t.Fatalf("race results %v, want one 200 and one 409", results)
	}
	for _, dev := range []*sseStream{phone, chat} {
		r := dev.expect("permission.resolved")
		if r["action_id"] != action || r["state"] != "approved" {
			t.Fatalf("retraction: %v", r)
		}
	}
	ag.expect("approval.resolved")
	evs := a.json("GET", "/v0/channels/events?limit=100", nil, 200)["events"].([]any)
	seen := map[string]int{}
	for _, e := range evs {
		seen[e.(obj)["type"].(string)]++
	}
	if seen[channel.TypeConnected] != 2 || seen[channel.TypePermissionForwarded] != 2 {
		t.Fatalf("channel log: %v", seen)
	}
	a.returned(action, 1)
	phone.close()
	eventually.True(t, "the phone's disconnect logged", func() bool {
		evs := a.json("GET", "/v0/channels/events?limit=100", nil, 200)["events"].([]any)
		return evs[len(evs)-1].(obj)["type"] == channel.TypeDisconnected
	})
	if got := a.json("GET", "/v0/channels", nil, 200)["channels"].([]any); len(got) != 2 {
		t.Fatalf("channels: %v", got)
	}
}

// TestOfflineChannelGetsPromptOnConnect: a new device receives the prompts
// raised before it existed; a known device that was offline receives them
// from its outbox on reconnect, also after a restart.
func TestOfflineChannelGetsPromptOnConnect(t *testing.T) {
	s := bridgeNode(t, node.Options{})
	a := newAPI(t, s)
	tablet := a.channel("tablet", "u1")
	tablet.close()
	ag := a.agent("off-agent", "c1")
	_, _, _, action := pendingAction(t, a, ag, "deploy.late")

	fresh := a.channel("laptop", "u1")
	if p := fresh.expect("permission.requested"); p["action_id"] != action {
		t.Fatalf("backfill: %v", p)
	}
	s.Restart()
	a = newAPI(t, s)
	tablet = a.channel("tablet", "u1")
	if p := tablet.expect("permission.requested"); p["action_id"] != action {
		t.Fatalf("outbox after restart: %v", p)
	}
	a.json("POST", "/v0/actions/"+action+"/respond", obj{"decision": "deny", "channel_id": "tablet", "native_peer_id": "u1"}, 200)
	if r := tablet.expect("permission.resolved"); r["state"] != "denied" {
		t.Fatalf("retraction: %v", r)
	}
}

// TestWebhookChannelEndToEnd: a chat bot gets the signed prompt, answers
// through the respond endpoint, and gets the retraction; a failing bot is
// retried until it answers 2xx.
func TestWebhookChannelEndToEnd(t *testing.T) {
	const secret = "bot-secret-0123456789"
	var mu sync.Mutex
	var got []channel.Payload
	failures := 1
	bot := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := channel.Verify([]byte(secret), r.Header.Get(channel.HeaderTimestamp), r.Header.Get(channel.HeaderSignature), body, time.Now(), time.Minute); err != nil {
			t.Errorf("signature: %v", err)
			w.WriteHeader(400)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if failures > 0 {
			failures--
			w.WriteHeader(503)
			return
		}
		var p channel.Payload
		if err := json.Unmarshal(body, &p); err != nil {
			t.Errorf("payload: %v", err)
		}
		got = append(got, p)
	}))
	defer bot.Close()
	// The bot listens on loopback, which webhooks reach only when allowed.
	a := bridgeServer(t, node.Options{WebhookAllow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	a.json("PUT", "/v0/channels/webhook", obj{"url": bot.URL, "secret": secret}, 200)
	a.fail("PUT", "/v0/channels/webhook", obj{"url": "ftp://x", "secret": secret}, 400, "VALIDATION_ERROR")
	a.fail("PUT", "/v0/channels/webhook", obj{"url": "http://169.254.169.254/latest/meta-data/", "secret": secret}, 400, "VALIDATION_ERROR")
	ag := a.agent("bot-agent", "c1")
	_, _, _, action := pendingAction(t, a, ag, "deploy.bot")
	eventually.True(t, "the prompt delivered to the bot", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 1 })
	mu.Lock()
	first := got[0]
	mu.Unlock()
	if first.Type != "permission.requested" || first.Owner != "local" {
		t.Fatalf("bot payload: %+v", first)
	}
	a.json("POST", "/v0/actions/"+action+"/respond", obj{"decision": "allow_once", "channel_id": "webhook", "native_peer_id": "bot"}, 200)
	eventually.True(t, "the resolution delivered to the bot", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 2 })
	mu.Lock()
	if got[1].Type != "permission.resolved" {
		t.Fatalf("bot retraction: %+v", got[1])
	}
	mu.Unlock()
	a.json("DELETE", "/v0/channels/webhook", nil, 200)
	a.fail("DELETE", "/v0/channels/webhook", nil, 404, "NOT_FOUND")
}

// TestChannelWebSocketAnswersAndMessages: a phone on the channel socket
// receives the prompt, answers it with a respond command (in both
// encodings), another device on SSE gets the retraction, and a message is
// recorded in the channel log.
func TestChannelWebSocketAnswersAndMessages(t *testing.T) {
	for _, proto := range wsProtos() {
		t.Run(proto, func(t *testing.T) {
			a := bridgeServer(t, node.Options{})
			phone := a.dialWS("/v0/channels/ws?channel_id=phone&peer_id=u1", proto)
			if hello := phone.expect("hello"); hello["role"] != "channel" || hello["id"] != "phone" || hello["consumer_id"] != "u1" {
				t.Fatalf("hello: %v", hello)
			}
			tablet := a.channel("tablet", "u1")
			ag := a.agent("chws-agent", "c1")
			_, _, step, action := pendingAction(t, a, ag, "deploy.ws")
			seq, prompt := phone.delivery("permission.requested")
			if prompt["action_id"] != action || prompt["step_id"] != step {
				t.Fatalf("prompt: %v", prompt)
			}
			phone.ack(seq)
			tablet.expect("permission.requested")
			rec := phone.ok(phone.command("respond", obj{"action_id": action, "decision": "allow_once", "reason": "looks fine"}))
			if rec["state"] != "approved" || rec["decided_by"].(obj)["channel_id"] != "phone" || rec["decided_by"].(obj)["native_peer_id"] != "u1" {
				t.Fatalf("respond reply: %v", rec)
			}
			if r := tablet.expect("permission.resolved"); r["state"] != "approved" {
				t.Fatalf("retraction on the other device: %v", r)
			}
			ag.expect("approval.resolved")
			late := phone.command("respond", obj{"action_id": action, "decision": "deny"})
			if late.obj["status"] != 409.0 || late.obj["body"].(obj)["code"] != "CONFLICT" {
				t.Fatalf("late answer: %v", late.obj)
			}
			bad := phone.command("intent", obj{})
			if bad.obj["status"] != 400.0 {
				t.Fatalf("agent command on a channel socket: %v", bad.obj)
			}
			phone.ok(phone.command("message", obj{"text": "on my way"}))
			evs := a.json("GET", "/v0/channels/events?limit=100", nil, 200)["events"].([]any)
			types := map[string]int{}
			for _, e := range evs {
				types[e.(obj)["type"].(string)]++
			}
			if types[channel.TypeMessage] != 1 {
				t.Fatalf("channel log: %v", types)
			}
			if r := a.returned(action, 1); r["channel_id"] != "phone" || r["native_peer_id"] != "u1" {
				t.Fatalf("permission_returned: %v", r)
			}
		})
	}
}

// TestWebhookURLSecretsReachNoLogEventOrExport: a chat webhook whose URL
// holds its secret in the path, the query and the user info, set through
// the API, with prompts it fails to deliver: neither the server's log nor
// any answer, channel event, execution event or session export shows more
// of the URL than its scheme and host.
func TestWebhookURLSecretsReachNoLogEventOrExport(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close() // every delivery fails to connect, and is logged
	var logs syncbuf.Buffer
	a := bridgeServer(t, node.Options{WebhookAllow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	hook := "http://bot:PWSECRET@" + closed + "/services/T0SECRET/B0SECRET/XOXSECRET?token=QSECRET"
	set := a.json("PUT", "/v0/channels/webhook", obj{"url": hook, "secret": "0123456789abcdef-secret"}, 200)
	origin, _ := set["url"].(string)
	shown := []string{origin}
	ag := a.agent("hook-agent", "c1")
	ex := a.json("POST", "/v0/executions", obj{"agent_id": "hook-agent", "session_id": "hook-s"}, 201)
	id := ex["id"].(string)
	lease := ag.expect("execution.assigned")["session_id"].(string)
	a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "deploy.hook"}, 200)
	eventually.True(t, "a failed delivery logged", func() bool { return strings.Contains(logs.String(), "webhook delivery failed") })
	for _, path := range []string{"/v0/channels", "/v0/channels/events", "/v0/executions/" + id + "/events", "/v0/actions", "/agent-runtime/exports/hook-s"} {
		_, body, _ := a.do("GET", path, nil)
		shown = append(shown, path+": "+string(body))
	}
	a.json("DELETE", "/v0/channels/webhook", nil, 200)
	_, body, _ := a.do("GET", "/v0/channels/events", nil)
	shown = append(shown, string(body), logs.String())
	for _, text := range shown {
		for _, s := range []string{"T0SECRET", "B0SECRET", "XOXSECRET", "QSECRET", "PWSECRET"} {
			if strings.Contains(text, s) {
				t.Fatalf("the webhook URL's %s shows in:\n%s", s, text)
			}
		}
	}
	if shown[0] != "http://"+closed || !strings.Contains(logs.String(), "http://"+closed) {
		t.Fatalf("the webhook's origin http://%s is neither the answer's url (%s) nor in the log", closed, shown[0])
	}
}
