package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/channel/channeltest"
	"github.com/gatehouse-dev/gatehouse/channel/telegram"
	"github.com/gatehouse-dev/gatehouse/channel/telegram/telegramtest"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// TestTelegramAnswerSurvivesAKill kills the gateway process (SIGKILL) at
// moments between a Telegram button press reaching its webhook and the
// answer to it, restarts it on the same folder, and checks each time:
// the decision is recorded once, and the message then shows it; or it is
// not recorded at all, the prompt is still pending, the message says so
// when the press had been taken, and a press after the restart is
// recorded, once.
func TestTelegramAnswerSurvivesAKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	const token, secret, user = "7:crash-token", "crash-secret", 111
	api := telegramtest.Start(t, token)
	dir := t.TempDir()
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(channeltest.Policy), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := loopback.FreeAddr(t)
	flags := []string{"--policy", policy, "--telegram-token", token, "--telegram-users", "111=local", "--telegram-api-url", api.URL,
		"--telegram-webhook-url", "https://gatehouse.example" + telegram.HookPath, "--telegram-webhook-secret", secret}
	c := newChild(addr, dir, flags...)
	c.start(t)
	client := &http.Client{Timeout: 10 * time.Second}
	update := 0
	press := func(base string, m telegramtest.Message, data string) (int, error) {
		update++
		body := fmt.Sprintf(`{"update_id":%d,"callback_query":{"id":"k%d","from":{"id":%d,"is_bot":false,"first_name":"L"},`+
			`"message":{"message_id":%d,"date":1,"chat":{"id":%d,"type":"private"}},"chat_instance":"c","data":%q}}`,
			update, update, user, m.ID, user, data)
		req, _ := http.NewRequest("POST", base+telegram.HookPath, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(telegram.SecretHeader, secret)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	resolved := func(base, execID, actionID string) int {
		t.Helper()
		status, data, _ := nodetest.Do(t, client, "GET", base+"/v0/executions/"+execID+"/events?limit=1000", nil)
		var page struct {
			Events []struct {
				Type     string `json:"type"`
				ActionID string `json:"action_id"`
			} `json:"events"`
		}
		if status != 200 || json.Unmarshal(data, &page) != nil {
			t.Fatalf("events of %s: %d %s", execID, status, data)
		}
		n := 0
		for _, e := range page.Events {
			if e.Type == "permission.resolved" && e.ActionID == actionID {
				n++
			}
		}
		return n
	}
	seen := map[string]int{}
	for i, delay := range []time.Duration{0, 300 * time.Microsecond, time.Millisecond, 3 * time.Millisecond, 10 * time.Millisecond, 50 * time.Millisecond, 250 * time.Millisecond} {
		st, data, _ := nodetest.Do(t, client, "POST", c.base+"/v0/executions", map[string]any{"tool": map[string]any{"tool_id": "deploy.app", "arguments": map[string]any{"round": i}}})
		ex := nodetest.Object(t, "POST", "/v0/executions", st, data, 201)
		execID := ex["id"].(string)
		actionID := eventually.Value(t, "the prompt", func() (string, bool) {
			_, data, _ := nodetest.Do(t, client, "GET", c.base+"/v0/actions?status=pending", nil)
			var page struct {
				Actions []struct {
					ActionID    string `json:"action_id"`
					ExecutionID string `json:"execution_id"`
				} `json:"actions"`
			}
			_ = json.Unmarshal(data, &page)
			for _, a := range page.Actions {
				if a.ExecutionID == execID {
					return a.ActionID, true
				}
			}
			return "", false
		})
		m := api.WaitMessage(t, user, execID, nil)
		allow := m.Buttons()["Allow once"]

		// The press, and the kill delay after it set off. The press goes
		// to this child only: c names the next one once it has started.
		base := c.base
		go func() { _, _ = press(base, m, allow) }()
		time.Sleep(delay)
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
		c = newChild(addr, dir, flags...)
		c.start(t)

		status, rec, err := send(t.Context(), client, "GET", c.base+"/v0/actions/"+actionID, nil)
		if err != nil || status != 200 {
			t.Fatalf("round %d: action after the restart: %d %v", i, status, err)
		}
		n := resolved(c.base, execID, actionID)
		if rec["state"] == "pending" {
			if n != 0 {
				t.Fatalf("round %d: pending with %d permission.resolved events", i, n)
			}
			// The message says so if the press was taken; either way a
			// new press is recorded, once.
			// Once the channels' queue is empty, what was queued at the
			// start (the note, if the press was taken) has been carried.
			eventually.True(t, "the channels' queue carried", func() bool {
				_, data, _ := nodetest.Do(t, client, "GET", c.base+"/metrics", nil)
				return strings.Contains(string(data), "\ngatehouse_channel_queued 0\n")
			})
			if now := api.Messages(user, execID); len(now) == 1 && strings.Contains(now[0].Text, channel.NoteNotRecorded) {
				seen["not recorded, told"]++
			} else {
				seen["not recorded, press never taken"]++
			}
			if status, err := press(c.base, m, allow); err != nil || status != 200 {
				t.Fatalf("round %d: press after the restart: %d %v", i, status, err)
			}
		} else {
			seen["recorded"]++
		}
		api.WaitMessage(t, user, execID, func(m telegramtest.Message) bool {
			return m.Markup == "" && strings.Contains(m.Text, "Allowed once by local via telegram (111)")
		})
		if n := resolved(c.base, execID, actionID); n != 1 {
			t.Fatalf("round %d: %d permission.resolved events, want 1", i, n)
		}
	}
	t.Logf("outcomes of the kills: %v", seen)
}
