// Package telegramtest serves the part of Telegram's Bot API the Telegram
// channel uses (getUpdates with long polling, sendMessage,
// editMessageText, answerCallbackQuery, setWebhook) from a test, on
// 127.0.0.1, as https://core.telegram.org/bots/api describes it: form
// parameters in, {"ok": ..., "result": ...} out.
package telegramtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
)

// Call is one request the server took.
type Call struct {
	Method string
	Params url.Values
	At     time.Time
}

// Message is a message the bot sent, as it stands.
type Message struct {
	Chat   int64
	ID     int
	Text   string
	Markup string // the reply_markup JSON; "" when it has no buttons
}

// failure is an answer the next call of a method gets instead.
type failure struct {
	status     int
	desc       string
	retryAfter int
}

// Server is a Bot API for one bot token.
type Server struct {
	// URL is the API's base URL, for the channel's APIURL.
	URL string
	// Token is the bot token the server answers to.
	Token string

	srv *httptest.Server

	mu       sync.Mutex
	calls    []Call
	updates  []json.RawMessage // queued, by update_id - firstID
	firstID  int
	messages map[[2]int64]*Message
	nextMsg  int
	queries  int
	fails    map[string][]failure
	wake     chan struct{}
}

// Start serves a Bot API for token until the test ends.
func Start(tb testing.TB, token string) *Server {
	s := &Server{Token: token, firstID: 1, messages: map[[2]int64]*Message{}, fails: map[string][]failure{}, wake: make(chan struct{})}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	tb.Cleanup(s.srv.Close)
	return s
}

// Close stops the server: calls then fail to connect.
func (s *Server) Close() { s.srv.Close() }

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/bot"+s.Token+"/")
	if !ok || r.Method != http.MethodPost {
		reply(w, http.StatusNotFound, map[string]any{"ok": false, "error_code": 404, "description": "Not Found"})
		return
	}
	if err := r.ParseForm(); err != nil {
		reply(w, http.StatusBadRequest, map[string]any{"ok": false, "error_code": 400, "description": "Bad Request: " + err.Error()})
		return
	}
	s.mu.Lock()
	s.calls = append(s.calls, Call{Method: rest, Params: r.PostForm, At: time.Now()})
	if f := s.fails[rest]; len(f) > 0 {
		s.fails[rest] = f[1:]
		s.mu.Unlock()
		body := map[string]any{"ok": false, "error_code": f[0].status, "description": f[0].desc}
		if f[0].retryAfter > 0 {
			body["parameters"] = map[string]any{"retry_after": f[0].retryAfter}
		}
		reply(w, f[0].status, body)
		return
	}
	s.mu.Unlock()
	switch rest {
	case "getUpdates":
		s.getUpdates(w, r)
	case "sendMessage":
		s.sendMessage(w, r)
	case "editMessageText":
		s.editMessageText(w, r)
	case "answerCallbackQuery", "setWebhook", "deleteWebhook":
		reply(w, http.StatusOK, map[string]any{"ok": true, "result": true})
	default:
		reply(w, http.StatusNotFound, map[string]any{"ok": false, "error_code": 404, "description": "Not Found: method " + rest})
	}
}

func reply(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// getUpdates confirms the updates before offset and answers those from
// it on, waiting up to timeout seconds for one to come.
func (s *Server) getUpdates(w http.ResponseWriter, r *http.Request) {
	offset, _ := strconv.Atoi(r.PostForm.Get("offset"))
	timeout, _ := strconv.Atoi(r.PostForm.Get("timeout"))
	deadline := time.NewTimer(time.Duration(timeout) * time.Second)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		if drop := offset - s.firstID; drop > 0 {
			s.updates = s.updates[min(drop, len(s.updates)):]
			s.firstID = offset
		}
		out := append([]json.RawMessage(nil), s.updates...)
		wake := s.wake
		s.mu.Unlock()
		if len(out) > 0 {
			reply(w, http.StatusOK, map[string]any{"ok": true, "result": out})
			return
		}
		select {
		case <-wake:
		case <-deadline.C:
			reply(w, http.StatusOK, map[string]any{"ok": true, "result": []any{}})
			return
		case <-r.Context().Done():
			return
		}
	}
}

func (s *Server) sendMessage(w http.ResponseWriter, r *http.Request) {
	chat, err := strconv.ParseInt(r.PostForm.Get("chat_id"), 10, 64)
	if err != nil || r.PostForm.Get("text") == "" {
		reply(w, http.StatusBadRequest, map[string]any{"ok": false, "error_code": 400, "description": "Bad Request: chat_id and text are required"})
		return
	}
	s.mu.Lock()
	s.nextMsg++
	m := &Message{Chat: chat, ID: s.nextMsg, Text: r.PostForm.Get("text"), Markup: r.PostForm.Get("reply_markup")}
	s.messages[[2]int64{chat, int64(m.ID)}] = m
	s.mu.Unlock()
	reply(w, http.StatusOK, map[string]any{"ok": true, "result": map[string]any{
		"message_id": m.ID, "date": time.Now().Unix(), "chat": map[string]any{"id": chat, "type": "private"}, "text": m.Text,
	}})
}

func (s *Server) editMessageText(w http.ResponseWriter, r *http.Request) {
	chat, _ := strconv.ParseInt(r.PostForm.Get("chat_id"), 10, 64)
	id, _ := strconv.Atoi(r.PostForm.Get("message_id"))
	s.mu.Lock()
	m := s.messages[[2]int64{chat, int64(id)}]
	switch {
	case m == nil:
		s.mu.Unlock()
		reply(w, http.StatusBadRequest, map[string]any{"ok": false, "error_code": 400, "description": "Bad Request: message to edit not found"})
		return
	case m.Text == r.PostForm.Get("text") && m.Markup == r.PostForm.Get("reply_markup"):
		s.mu.Unlock()
		reply(w, http.StatusBadRequest, map[string]any{"ok": false, "error_code": 400, "description": "Bad Request: message is not modified"})
		return
	}
	m.Text, m.Markup = r.PostForm.Get("text"), r.PostForm.Get("reply_markup")
	s.mu.Unlock()
	reply(w, http.StatusOK, map[string]any{"ok": true, "result": map[string]any{
		"message_id": id, "date": time.Now().Unix(), "chat": map[string]any{"id": chat, "type": "private"}, "text": m.Text,
	}})
}

// Push queues an update (its fields but update_id, which it assigns) for
// getUpdates, and returns its update_id.
func (s *Server) Push(update map[string]any) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.firstID + len(s.updates)
	update["update_id"] = id
	raw, _ := json.Marshal(update)
	s.updates = append(s.updates, raw)
	close(s.wake)
	s.wake = make(chan struct{})
	return id
}

// PressButton queues user's press of message id's button with data in
// chat, as a callback_query update, and returns the query's id.
func (s *Server) PressButton(chat, user int64, id int, data string) string {
	s.mu.Lock()
	s.queries++
	q := fmt.Sprintf("q%d", s.queries)
	s.mu.Unlock()
	s.Push(map[string]any{"callback_query": map[string]any{
		"id":      q,
		"from":    map[string]any{"id": user, "is_bot": false, "first_name": "U" + strconv.FormatInt(user, 10)},
		"message": map[string]any{"message_id": id, "date": time.Now().Unix(), "chat": map[string]any{"id": chat, "type": "private"}},
		"data":    data, "chat_instance": "c1",
	}})
	return q
}

// FailNext makes the next call of method answer status with desc (and
// retry_after seconds, when positive).
func (s *Server) FailNext(method string, status int, desc string, retryAfter int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fails[method] = append(s.fails[method], failure{status, desc, retryAfter})
}

// Calls returns the calls of method so far.
func (s *Server) Calls(method string) []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Call
	for _, c := range s.calls {
		if c.Method == method {
			out = append(out, c)
		}
	}
	return out
}

// WaitCall waits for a call of method that match accepts.
func (s *Server) WaitCall(tb testing.TB, method string, match func(Call) bool) Call {
	tb.Helper()
	return eventually.Value(tb, "a "+method+" call", func() (Call, bool) {
		for _, c := range s.Calls(method) {
			if match == nil || match(c) {
				return c, true
			}
		}
		return Call{}, false
	})
}

// Messages returns the messages sent to chat whose text holds contains.
func (s *Server) Messages(chat int64, contains string) []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Message
	for _, m := range s.messages {
		if m.Chat == chat && strings.Contains(m.Text, contains) {
			out = append(out, *m)
		}
	}
	return out
}

// WaitMessage waits for the one message of chat holding contains for
// which match holds.
func (s *Server) WaitMessage(tb testing.TB, chat int64, contains string, match func(Message) bool) Message {
	tb.Helper()
	return eventually.Value(tb, "a message in chat "+strconv.FormatInt(chat, 10)+" with "+contains, func() (Message, bool) {
		for _, m := range s.Messages(chat, contains) {
			if match == nil || match(m) {
				return m, true
			}
		}
		return Message{}, false
	})
}

// Buttons returns the callback data of a message's buttons, by their
// text.
func (m Message) Buttons() map[string]string {
	var mk struct {
		Rows [][]struct {
			Text string `json:"text"`
			Data string `json:"callback_data"`
		} `json:"inline_keyboard"`
	}
	out := map[string]string{}
	if json.Unmarshal([]byte(m.Markup), &mk) != nil {
		return out
	}
	for _, row := range mk.Rows {
		for _, b := range row {
			out[b.Text] = b.Data
		}
	}
	return out
}
