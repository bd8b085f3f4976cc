// Package slacktesting stands up Slack for the Slack channel's tests:
// slack-go's own slacktest server, for the Web API calls it serves
// (chat.postMessage, chat.postEphemeral), with chat.update added, which
// it lacks, and a client that records what was posted (slacktest keeps no
// record of chat.postMessage); and interaction requests signed as Slack
// signs them.
package slacktesting

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	slackapi "github.com/slack-go/slack"
	"github.com/slack-go/slack/slacktest"

	"github.com/gatehouse-dev/gatehouse/channel/slack"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
)

// Server is a slacktest server with chat.update.
type Server struct {
	*slacktest.Server
	// URL is the Web API's base URL, for the channel's APIURL.
	URL string

	mu      sync.Mutex
	updates []Update
	posted  []slackapi.Message
	at      []time.Time // when each of posted was sent
}

// Update is one chat.update call.
type Update struct {
	Channel, TS, Text string
	Blocks            slackapi.Blocks
	At                time.Time
}

// Start serves a Slack Web API until the test ends.
func Start(tb testing.TB) *Server {
	s := &Server{}
	s.Server = slacktest.NewTestServer(func(c slacktest.Customize) {
		c.Handle("/chat.update", s.update)
	})
	s.Server.Start()
	s.URL = s.Server.GetAPIURL()
	tb.Cleanup(s.Server.Stop)
	return s
}

// update answers chat.update as Slack does and records it.
func (s *Server) update(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	u := Update{Channel: r.PostForm.Get("channel"), TS: r.PostForm.Get("ts"), Text: r.PostForm.Get("text"), At: time.Now()}
	w.Header().Set("Content-Type", "application/json")
	if err := json.Unmarshal([]byte(r.PostForm.Get("blocks")), &u.Blocks); err != nil || u.Channel == "" || u.TS == "" {
		_, _ = w.Write([]byte(`{"ok":false,"error":"invalid_arguments"}`))
		return
	}
	s.mu.Lock()
	s.updates = append(s.updates, u)
	s.mu.Unlock()
	_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "channel": u.Channel, "ts": u.TS, "text": u.Text})
}

// Client returns the HTTP client the channel must call the server with:
// it records each message posted (chat.postMessage, chat.postEphemeral)
// as the server answered it.
func (s *Server) Client() *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: recorder{s}}
}

type recorder struct{ s *Server }

func (r recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	method := req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:]
	sent := time.Now()
	var form url.Values
	if req.Body != nil && (method == "chat.postMessage" || method == "chat.postEphemeral") {
		raw, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		form, _ = url.ParseQuery(string(raw))
		req.Body = io.NopCloser(bytes.NewReader(raw))
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || form == nil {
		return resp, err
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	var answer struct {
		OK bool   `json:"ok"`
		TS string `json:"ts"`
	}
	if json.Unmarshal(raw, &answer) == nil && answer.OK {
		m := slackapi.Message{}
		m.Channel, m.Timestamp, m.Text, m.User = form.Get("channel"), answer.TS, form.Get("text"), form.Get("user")
		_ = json.Unmarshal([]byte(form.Get("blocks")), &m.Blocks)
		r.s.mu.Lock()
		r.s.posted = append(r.s.posted, m)
		r.s.at = append(r.s.at, sent)
		r.s.mu.Unlock()
	}
	return resp, nil
}

// Posted returns the messages posted (chat.postMessage and
// chat.postEphemeral) to channel whose text or blocks hold contains.
func (s *Server) Posted(channel, contains string) []slackapi.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []slackapi.Message
	for _, m := range s.posted {
		raw, _ := json.Marshal(m.Blocks)
		if m.Channel == channel && (strings.Contains(m.Text, contains) || strings.Contains(string(raw), contains)) {
			out = append(out, m)
		}
	}
	return out
}

// PostedAt returns when the first message posted to channel holding
// contains was sent, and whether there is one.
func (s *Server) PostedAt(channel, contains string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, m := range s.posted {
		raw, _ := json.Marshal(m.Blocks)
		if m.Channel == channel && (strings.Contains(m.Text, contains) || strings.Contains(string(raw), contains)) {
			return s.at[i], true
		}
	}
	return time.Time{}, false
}

// WaitPosted waits for a message posted to channel holding contains.
func (s *Server) WaitPosted(tb testing.TB, channel, contains string) slackapi.Message {
	tb.Helper()
	return eventually.Value(tb, "a Slack message in "+channel+" with "+contains, func() (slackapi.Message, bool) {
		ms := s.Posted(channel, contains)
		if len(ms) == 0 {
			return slackapi.Message{}, false
		}
		return ms[0], true
	})
}

// Updates returns the chat.update calls of channel whose blocks hold
// contains.
func (s *Server) Updates(channel, contains string) []Update {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Update
	for _, u := range s.updates {
		raw, _ := json.Marshal(u.Blocks)
		if u.Channel == channel && strings.Contains(string(raw), contains) {
			out = append(out, u)
		}
	}
	return out
}

// WaitUpdate waits for a chat.update of channel holding contains.
func (s *Server) WaitUpdate(tb testing.TB, channel, contains string) Update {
	tb.Helper()
	return eventually.Value(tb, "a Slack update in "+channel+" with "+contains, func() (Update, bool) {
		us := s.Updates(channel, contains)
		if len(us) == 0 {
			return Update{}, false
		}
		return us[len(us)-1], true
	})
}

// Button is an answer button of a posted message.
type Button struct {
	ActionID, BlockID, Value string
}

// Buttons returns a message's answer buttons by action id.
func Buttons(blocks slackapi.Blocks) map[string]Button {
	out := map[string]Button{}
	for _, b := range blocks.BlockSet {
		ab, ok := b.(*slackapi.ActionBlock)
		if !ok || ab.Elements == nil {
			continue
		}
		for _, e := range ab.Elements.ElementSet {
			if bt, ok := e.(*slackapi.ButtonBlockElement); ok {
				out[bt.ActionID] = Button{ActionID: bt.ActionID, BlockID: ab.BlockID, Value: bt.Value}
			}
		}
	}
	return out
}

// Press is the body of Slack's interaction request for user pressing b in
// the message ts of conversation channel.
func Press(user, channel, ts string, b Button) []byte {
	payload, _ := json.Marshal(map[string]any{
		"type": "block_actions", "api_app_id": "A1", "team": map[string]any{"id": "T1"},
		"user": map[string]any{"id": user}, "channel": map[string]any{"id": channel},
		"container": map[string]any{"type": "message", "message_ts": ts, "channel_id": channel},
		"message":   map[string]any{"ts": ts, "type": "message"},
		"actions": []any{map[string]any{
			"type": "button", "action_id": b.ActionID, "block_id": b.BlockID, "value": b.Value, "action_ts": ts,
		}},
	})
	return []byte("payload=" + url.QueryEscape(string(payload)))
}

// Headers are the headers Slack sends with body at t, signed with secret,
// as header name and value pairs.
func Headers(secret string, t time.Time, body []byte) []string {
	ts := slack.Timestamp(t)
	return []string{"Content-Type", "application/x-www-form-urlencoded",
		"X-Slack-Request-Timestamp", ts, "X-Slack-Signature", slack.Sign(secret, ts, body)}
}
