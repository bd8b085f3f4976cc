package channel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
)

const testSecret = "0123456789abcdef-test-secret"

// hit is one request the test bot received.
type hit struct {
	status   int
	typ      string
	delivery uint64
	action   string
	verify   error
}

// bot is a webhook receiver on loopback that answers with scripted statuses
// (then with fallback) and checks every signature.
type bot struct {
	t        *testing.T
	srv      *httptest.Server
	mu       sync.Mutex
	script   []int
	fallback int
	hits     []hit
	notify   chan struct{}
}

func newBot(t *testing.T, fallback int, script ...int) *bot {
	b := &bot{t: t, script: script, fallback: fallback, notify: make(chan struct{}, 1)}
	b.srv = httptest.NewServer(http.HandlerFunc(b.serve))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *bot) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	var p Payload
	var rec struct {
		ActionID string `json:"action_id"`
	}
	if err := json.Unmarshal(body, &p); err == nil {
		_ = json.Unmarshal(p.Action, &rec)
	}
	h := hit{typ: p.Type, delivery: p.Delivery, action: rec.ActionID,
		verify: Verify([]byte(testSecret), r.Header.Get(HeaderTimestamp), r.Header.Get(HeaderSignature), body, time.Now(), time.Minute)}
	if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" ||
		r.Header.Get(HeaderEvent) != p.Type || r.Header.Get(HeaderDelivery) != strconv.FormatUint(p.Delivery, 10) || p.Owner != "alice" {
		h.verify = errors.New("headers or body do not match")
	}
	b.mu.Lock()
	h.status = b.fallback
	if len(b.script) > 0 {
		h.status, b.script = b.script[0], b.script[1:]
	}
	b.hits = append(b.hits, h)
	b.mu.Unlock()
	select {
	case b.notify <- struct{}{}:
	default:
	}
	w.WriteHeader(h.status)
}

func (b *bot) answer(status int) {
	b.mu.Lock()
	b.fallback = status
	b.mu.Unlock()
}

func (b *bot) snapshot() []hit {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]hit(nil), b.hits...)
}

// waitFor waits until cond holds for the hits so far.
func (b *bot) waitFor(what string, cond func([]hit) bool) []hit {
	b.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if h := b.snapshot(); cond(h) {
			return h
		}
		select {
		case <-b.notify:
		case <-deadline:
			b.t.Fatalf("timed out waiting for %s; hits: %+v", what, b.snapshot())
		}
	}
}

func okCount(hs []hit) int {
	n := 0
	for _, h := range hs {
		if h.status/100 == 2 {
			n++
		}
	}
	return n
}

func checkSigned(t *testing.T, hs []hit) {
	t.Helper()
	for i, h := range hs {
		if h.verify != nil {
			t.Fatalf("hit %d: %v", i, h.verify)
		}
	}
}

// fastRetry retries quickly. The test bots listen on loopback, which
// webhooks reach only when it is allowed.
var fastRetry = Options{RetryBase: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond,
	WebhookAllow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}

// waitAcked waits until the webhook outbox holds nothing unacknowledged.
func waitAcked(t *testing.T, n *node, ch Channel) {
	t.Helper()
	eventually.Check(t, func() error {
		if p := n.hub.Pending(Key(ch.ChannelID, ch.PeerID)); p != 0 {
			return fmt.Errorf("webhook outbox still holds %d deliveries", p)
		}
		return nil
	})
}

func TestWebhookRetriesInOrder(t *testing.T) {
	b := newBot(t, http.StatusOK, http.StatusInternalServerError, http.StatusInternalServerError)
	n := open(t, t.TempDir(), fastRetry)
	ch, fresh, err := n.reg.SetWebhook(context.Background(), "alice", b.srv.URL+"/hook", testSecret)
	if err != nil || !fresh || ch.Kind != KindWebhook || ch.ChannelID != WebhookChannel || ch.PeerID == "" {
		t.Fatalf("SetWebhook = %+v, %v, %v", ch, fresh, err)
	}
	if js, _ := json.Marshal(n.reg.List("alice")); strings.Contains(string(js), testSecret) {
		t.Fatalf("the secret leaks into JSON: %s", js)
	}

	a1 := pending("alice", "a1")
	n.reg.Prompt(a1)
	n.reg.Prompt(pending("alice", "a2"))
	n.reg.Retract(settled(a1))
	hs := b.waitFor("three acknowledged deliveries", func(hs []hit) bool { return okCount(hs) == 3 })
	checkSigned(t, hs)
	var got []string
	for _, h := range hs {
		got = append(got, strconv.Itoa(h.status)+":"+strconv.FormatUint(h.delivery, 10)+":"+h.typ+":"+h.action)
	}
	want := "500:1:permission.requested:a1 500:1:permission.requested:a1 200:1:permission.requested:a1 " +
		"200:2:permission.requested:a2 200:3:permission.resolved:a1"
	if strings.Join(got, " ") != want {
		t.Fatalf("attempts:\n got %s\nwant %s", strings.Join(got, " "), want)
	}
	waitAcked(t, n, ch)
	if len(b.snapshot()) != 5 {
		t.Fatalf("acknowledged deliveries were sent again: %+v", b.snapshot())
	}
	evs := events(t, n.reg, "alice")
	if types(evs) != "channel.connected channel.permission_forwarded channel.permission_forwarded" {
		t.Fatalf("log: %s", types(evs))
	}
}

func TestWebhookResumesAfterRestart(t *testing.T) {
	b := newBot(t, http.StatusServiceUnavailable)
	dir := t.TempDir()
	n := open(t, dir, fastRetry)
	ch, _, err := n.reg.SetWebhook(context.Background(), "alice", b.srv.URL, testSecret)
	if err != nil {
		t.Fatal(err)
	}
	n.reg.Prompt(pending("alice", "a1"))
	b.waitFor("a failed attempt", func(hs []hit) bool { return len(hs) >= 1 })
	n.close()

	b.answer(http.StatusNoContent)
	before := len(b.snapshot())
	n = open(t, dir, fastRetry)
	hs := b.waitFor("the delivery after restart", func(hs []hit) bool { return okCount(hs) == 1 })
	checkSigned(t, hs)
	last := hs[len(hs)-1]
	if len(hs) <= before || last.delivery != 1 || last.action != "a1" || last.typ != "permission.requested" {
		t.Fatalf("after restart: %+v", last)
	}
	waitAcked(t, n, ch)
	n.close()

	n = open(t, dir, fastRetry)
	seen := len(b.snapshot())
	n.reg.Prompt(pending("alice", "a2"))
	hs = b.waitFor("the next delivery", func(hs []hit) bool { return okCount(hs) == 2 })
	if len(hs) != seen+1 || hs[seen].action != "a2" || hs[seen].delivery != 2 {
		t.Fatalf("an acknowledged delivery was sent again after restart: %+v", hs[seen:])
	}
}

func TestWebhookRemoveAndReplace(t *testing.T) {
	down := newBot(t, http.StatusInternalServerError)
	up := newBot(t, http.StatusOK)
	ctx := context.Background()
	n := open(t, t.TempDir(), fastRetry)
	old, _, err := n.reg.SetWebhook(ctx, "alice", down.srv.URL, testSecret)
	if err != nil {
		t.Fatal(err)
	}
	if again, fresh, err := n.reg.SetWebhook(ctx, "alice", down.srv.URL, testSecret+"-rotated"); err != nil || fresh || again.PeerID != old.PeerID {
		t.Fatalf("same URL again: %+v, fresh %v, %v", again, fresh, err)
	}
	n.reg.Prompt(pending("alice", "a1"))
	down.waitFor("retries", func(hs []hit) bool { return len(hs) >= 2 })

	ch, fresh, err := n.reg.SetWebhook(ctx, "alice", up.srv.URL, testSecret)
	if err != nil || !fresh || ch.PeerID == old.PeerID {
		t.Fatalf("new URL: %+v, fresh %v, %v", ch, fresh, err)
	}
	stopped := len(down.snapshot())
	if l := n.reg.List("alice"); len(l) != 1 || l[0].PeerID != ch.PeerID {
		t.Fatalf("List after replacing: %+v", l)
	}
	n.reg.Prompt(pending("alice", "a2"))
	up.waitFor("the new URL", func(hs []hit) bool { return okCount(hs) == 1 && hs[0].action == "a2" })

	if err := n.reg.RemoveWebhook(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	if err := n.reg.RemoveWebhook(ctx, "alice"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second remove: %v", err)
	}
	n.reg.Prompt(pending("alice", "a3"))
	time.Sleep(100 * time.Millisecond) // many retry intervals
	if len(down.snapshot()) != stopped || len(up.snapshot()) != 1 {
		t.Fatalf("a stopped sender kept posting: old URL %d→%d hits, new URL %d hits", stopped, len(down.snapshot()), len(up.snapshot()))
	}
	if l := n.reg.List("alice"); len(l) != 0 {
		t.Fatalf("List after remove: %+v", l)
	}
	evs := events(t, n.reg, "alice")
	want := "channel.connected channel.resumed channel.permission_forwarded channel.disconnected channel.connected " +
		"channel.permission_forwarded channel.disconnected"
	if types(evs) != want {
		t.Fatalf("log:\n got %s\nwant %s", types(evs), want)
	}
	if evs[3].Payload.Reason != "replaced" || evs[6].Payload.Reason != "removed" {
		t.Fatalf("disconnect reasons %q, %q", evs[3].Payload.Reason, evs[6].Payload.Reason)
	}
}

func TestSetWebhookRejects(t *testing.T) {
	n := open(t, t.TempDir(), Options{MaxChannels: 1})
	ctx := context.Background()
	for _, c := range []struct{ url, secret string }{
		{"ftp://example.test/hook", testSecret},
		{"http://", testSecret},
		{"/relative", testSecret},
		{"http://a b", testSecret},
		{"https://example.test/" + strings.Repeat("x", MaxURL), testSecret},
		{"https://example.test/hook", "short"},
		{"https://example.test/hook", strings.Repeat("s", MaxSecret+1)},
	} {
		if _, _, err := n.reg.SetWebhook(ctx, "alice", c.url, c.secret); !errors.Is(err, ErrInvalid) {
			t.Errorf("SetWebhook(%.40q, %.10q) = %v, want ErrInvalid", c.url, c.secret, err)
		}
	}
	connect(t, n.reg, "alice", "phone", "p1")
	if _, _, err := n.reg.SetWebhook(ctx, "alice", "https://example.test/hook", testSecret); !errors.Is(err, ErrTooMany) {
		t.Fatalf("webhook past MaxChannels: %v", err)
	}
	if len(n.reg.List("alice")) != 1 {
		t.Fatalf("List = %+v", n.reg.List("alice"))
	}
}

func TestVerify(t *testing.T) {
	secret := []byte(testSecret)
	body := []byte(`{"type":"permission.requested","delivery":1}`)
	now := time.Unix(1_767_225_600, 0)
	ts := strconv.FormatInt(now.Unix(), 10)
	sig := Sign(secret, ts, body)

	if err := Verify(secret, ts, sig, body, now.Add(30*time.Second), time.Minute); err != nil {
		t.Fatalf("valid signature: %v", err)
	}
	if err := Verify(secret, ts, "v1=00, "+sig, body, now, 0); err != nil {
		t.Fatalf("valid signature among several: %v", err)
	}
	for name, c := range map[string]struct {
		secret    []byte
		ts, sig   string
		body      []byte
		now       time.Time
		tolerance time.Duration
		want      error
	}{
		"wrong secret":    {[]byte("another-secret-of-16"), ts, sig, body, now, time.Minute, ErrSignature},
		"tampered body":   {secret, ts, sig, []byte(`{"type":"permission.requested","delivery":2}`), now, time.Minute, ErrSignature},
		"moved timestamp": {secret, strconv.FormatInt(now.Unix()+1, 10), sig, body, now, time.Minute, ErrSignature},
		"stale":           {secret, ts, sig, body, now.Add(2 * time.Minute), time.Minute, ErrStale},
		"from the future": {secret, ts, sig, body, now.Add(-DefaultTolerance - time.Second), 0, ErrStale},
		"no v1":           {secret, ts, strings.TrimPrefix(sig, "v1="), body, now, time.Minute, ErrSignature},
		"not hex":         {secret, ts, "v1=zz", body, now, time.Minute, ErrSignature},
		"bad timestamp":   {secret, "yesterday", sig, body, now, time.Minute, ErrSignature},
		"empty secret":    {nil, ts, sig, body, now, time.Minute, ErrSignature},
		"empty signature": {secret, ts, "", body, now, time.Minute, ErrSignature},
	} {
		if err := Verify(c.secret, c.ts, c.sig, c.body, c.now, c.tolerance); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}

// TestWebhookSecretsStayOutOfLogsAndEvents: Slack, Discord and Telegram put
// a webhook's secret in its URL's path or query (and a URL may carry a
// password): none of it reaches a log line, a channel event or a channel's
// description, which show the URL's scheme and host only, also when a
// delivery fails with the HTTP client's error (which quotes the whole URL).
func TestWebhookSecretsStayOutOfLogsAndEvents(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close() // nothing listens: every delivery fails to connect
	var logs syncbuf.Buffer
	o := fastRetry
	o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	n := open(t, t.TempDir(), o)
	secrets := []string{"T0SECRET", "B0SECRET", "XOXSECRET", "QSECRET", "PWSECRET"}
	hook := "http://bot:PWSECRET@" + closed + "/services/T0SECRET/B0SECRET/XOXSECRET?token=QSECRET"
	ch, _, err := n.reg.SetWebhook(context.Background(), "alice", hook, testSecret)
	if err != nil {
		t.Fatal(err)
	}
	n.reg.Prompt(pending("alice", "a1"))
	eventually.True(t, "a failed delivery logged", func() bool {
		return strings.Contains(logs.String(), "webhook delivery failed")
	})
	if err := n.reg.RemoveWebhook(context.Background(), "alice"); err != nil {
		t.Fatal(err)
	}
	evs, _, err := n.reg.Events("alice", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	shown, _ := json.Marshal(struct {
		Set    Channel
		Events []json.RawMessage
	}{ch, evs})
	for _, where := range []struct{ name, text string }{{"the log", logs.String()}, {"the channel and its events", string(shown)}} {
		for _, s := range secrets {
			if strings.Contains(where.text, s) {
				t.Fatalf("%s holds the webhook URL's %s:\n%s", where.name, s, where.text)
			}
		}
		if !strings.Contains(where.text, "http://"+closed) {
			t.Fatalf("%s does not name the webhook's origin http://%s:\n%s", where.name, closed, where.text)
		}
	}
}
