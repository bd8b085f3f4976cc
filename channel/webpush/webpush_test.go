package webpush_test

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	webpushgo "github.com/SherClockHolmes/webpush-go"
	"github.com/golang-jwt/jwt/v5"

	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/channel/channeltest"
	"github.com/gatehouse-dev/gatehouse/channel/webpush"
	"github.com/gatehouse-dev/gatehouse/channel/webpush/webpushtest"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// loopback lets pushes reach the test's push service on this machine.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

const (
	jwtSecret = "a-test-secret-of-at-least-32-bytes!!"
	jwtIss    = "gatehouse-test"
	jwtAud    = "gatehouse"
)

func start(t *testing.T, o node.Options) *nodetest.Server {
	t.Helper()
	if o.WebPush == nil {
		o.WebPush = &webpush.Options{Subject: "mailto:ops@example.com"}
	}
	if o.WebhookAllow == nil {
		o.WebhookAllow = loopback
	}
	o.Policy = policytest.Parse(t, channeltest.Policy)
	o.Auth = auth.Options{HMACSecrets: map[string][]byte{"": []byte(jwtSecret)}, Issuer: jwtIss, Audience: jwtAud}
	o.Channels.RetryBase, o.Channels.RetryMax = time.Millisecond, 20*time.Millisecond
	return nodetest.Start(t, o)
}

// as is a bearer token of person.
func as(t *testing.T, person string) string {
	t.Helper()
	tok, err := auth.MintHS256([]byte(jwtSecret), auth.Claims{Subject: person, Role: auth.RoleChannel, TTL: time.Hour, Issuer: jwtIss, Audience: jwtAud}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return "Bearer " + tok
}

// subscribe makes a subscription of the push service for person's
// browser, with the gateway's key, and gives it to the gateway.
func subscribe(t *testing.T, s *nodetest.Server, svc *webpushtest.Service, person string) webpushtest.Subscription {
	t.Helper()
	info := object(t, s, person, "GET", "/v0/channels/webpush", nil)
	key, _ := info["public_key"].(string)
	sub := svc.Subscribe(t, key)
	ch := object(t, s, person, "PUT", "/v0/channels/webpush/subscription", sub.JSON())
	if ch["channel_id"] != "webpush" || ch["native_peer_id"] != webpush.ID(sub.Endpoint)+"@"+person || ch["url"] != nil {
		t.Fatalf("subscription registered as %v", ch)
	}
	return sub
}

// doAs calls the gateway as person ("" for nobody).
func doAs(t *testing.T, s *nodetest.Server, person, method, path string, body any) (int, []byte) {
	t.Helper()
	var hdr []string
	if person != "" {
		hdr = []string{"Authorization", as(t, person)}
	}
	status, data, _ := nodetest.Do(t, nil, method, s.URL+path, body, hdr...)
	return status, data
}

// object calls the gateway as person and returns its 200 answer's object.
func object(t *testing.T, s *nodetest.Server, person, method, path string, body any) map[string]any {
	t.Helper()
	status, data := doAs(t, s, person, method, path, body)
	return nodetest.Object(t, method, path, status, data, 200)
}

// message decodes a pushed message.
func message(t *testing.T, raw string) webpush.Message {
	t.Helper()
	var m webpush.Message
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		t.Fatalf("pushed %q: %v", raw, err)
	}
	return m
}

// answer posts a notification's answer as person ("" for nobody signed in).
func answer(t *testing.T, s *nodetest.Server, person string, body map[string]string) (int, map[string]any) {
	t.Helper()
	status, data := doAs(t, s, person, "POST", "/v0/channels/webpush/answer", body)
	var out map[string]any
	_ = json.Unmarshal(data, &out)
	return status, out
}

// TestWebPushDeliversEncryptedSignedMessages: a prompt reaches a
// subscription through an independent push service, which verifies the
// VAPID signature and key and decrypts the aes128gcm message; the push
// carries the prompt's expiry as its TTL and the prompt's Topic; its token
// answers without signing in, and the withdrawal that follows carries the
// same Topic and the outcome.
func TestWebPushDeliversEncryptedSignedMessages(t *testing.T) {
	svc := webpushtest.Start(t)
	s := start(t, node.Options{})
	sub := subscribe(t, s, svc, "alice")
	rec := channeltest.Ask(t, s.Node, "alice", "timed.deploy", map[string]any{"target": "prod"})
	m := message(t, svc.WaitMessages(t, sub, 1)[0])
	if m.Type != "prompt" || m.ActionID != rec.ActionID || m.Title != "Allow timed.deploy?" || m.Token == "" ||
		!strings.Contains(m.Body, "answer within 10 minutes") || !strings.Contains(m.Body, `"target": "prod"`) {
		t.Fatalf("message: %+v", m)
	}
	req := svc.WaitRequests(t, sub, 1)[0]
	if req.Status != 201 {
		t.Fatalf("push service answered %d: %s", req.Status, req.Answer)
	}
	ttl, _ := strconv.Atoi(req.Header.Get("TTL"))
	if ttl < 590 || ttl > 600 {
		t.Fatalf("TTL %q, want the prompt's 10 minutes", req.Header.Get("TTL"))
	}
	if got := req.Header.Get("Topic"); got != webpush.Topic(rec.ActionID) || len(got) != 32 {
		t.Fatalf("Topic %q", got)
	}
	if req.Header.Get("Urgency") != "high" || req.Header.Get("Content-Encoding") != "aes128gcm" {
		t.Fatalf("headers: %v", req.Header)
	}
	checkVAPID(t, s, svc, req.Header.Get("Authorization"))

	status, got := answer(t, s, "", map[string]string{"token": m.Token, "action_id": rec.ActionID, "decision": "allow_once", "endpoint": sub.Endpoint})
	if status != 200 || got["state"] != "approved" {
		t.Fatalf("answer: %d %v", status, got)
	}
	by := got["decided_by"].(map[string]any)
	if by["principal"] != "alice" || by["channel_id"] != "webpush" || by["native_peer_id"] != webpush.ID(sub.Endpoint) {
		t.Fatalf("audit: %v", by)
	}
	w := message(t, svc.WaitMessages(t, sub, 2)[1])
	if w.Type != "resolved" || w.ActionID != rec.ActionID || w.Token != "" || !strings.HasPrefix(w.Body, "Allowed once by alice via webpush") {
		t.Fatalf("withdrawal: %+v", w)
	}
	wr := svc.WaitRequests(t, sub, 2)[1]
	if wr.Status != 201 || wr.Header.Get("Topic") != webpush.Topic(rec.ActionID) || wr.Header.Get("Urgency") != "normal" || wr.Header.Get("TTL") != "43200" {
		t.Fatalf("withdrawal headers: %d %v", wr.Status, wr.Header)
	}
}

// checkVAPID checks an Authorization header: "vapid t=<JWT>, k=<key>",
// the key the gateway's, the JWT signed ES256 by it for the push service's
// origin, with the subject and an expiry within a day.
func checkVAPID(t *testing.T, s *nodetest.Server, svc *webpushtest.Service, h string) {
	t.Helper()
	rest, ok := strings.CutPrefix(h, "vapid t=")
	tok, key, ok2 := strings.Cut(rest, ", k=")
	info := object(t, s, "alice", "GET", "/v0/channels/webpush", nil)
	if !ok || !ok2 || key != info["public_key"] {
		t.Fatalf("Authorization %q", h)
	}
	raw, err := base64.RawURLEncoding.DecodeString(key)
	if err != nil || len(raw) != 65 {
		t.Fatalf("k= is not a P-256 point: %v", err)
	}
	var claims jwt.MapClaims
	parsed, _, err := jwt.NewParser().ParseUnverified(tok, &claims)
	if err != nil || parsed.Method.Alg() != "ES256" {
		t.Fatalf("JWT %q: %v", tok, err)
	}
	exp, _ := claims.GetExpirationTime()
	if claims["aud"] != svc.Origin() || claims["sub"] != "mailto:ops@example.com" || exp == nil || time.Until(exp.Time) > 24*time.Hour {
		t.Fatalf("claims: %v", claims)
	}
}

// TestWebPushTokenIsBoundAndSingleUse: a notification's token answers its
// prompt once, from its subscription, as its person: presented for
// another prompt, from another subscription, by another person signed in,
// altered, or a second time, it is refused (403 with the reason) and
// counted; for a prompt settled meanwhile it gets the recorded outcome.
func TestWebPushTokenIsBoundAndSingleUse(t *testing.T) {
	svc := webpushtest.Start(t)
	s := start(t, node.Options{})
	phone := subscribe(t, s, svc, "alice")
	bobs := subscribe(t, s, svc, "bob")
	a := channeltest.Ask(t, s.Node, "alice", "deploy.a", nil)
	b := channeltest.Ask(t, s.Node, "alice", "deploy.b", nil)
	msgs := svc.WaitMessages(t, phone, 2)
	tokens := map[string]string{}
	for _, raw := range msgs {
		m := message(t, raw)
		tokens[m.ActionID] = m.Token
	}
	ta := tokens[a.ActionID]
	altered := []byte(ta)
	altered[3] ^= 1
	for _, tc := range []struct {
		name, person string
		body         map[string]string
		reason       string
	}{
		{"another prompt", "", map[string]string{"token": ta, "action_id": b.ActionID, "endpoint": phone.Endpoint}, channel.RefusedTokenPrompt},
		{"another subscription", "", map[string]string{"token": ta, "action_id": a.ActionID, "endpoint": bobs.Endpoint}, channel.RefusedTokenPerson},
		{"another person", "bob", map[string]string{"token": ta, "action_id": a.ActionID, "endpoint": phone.Endpoint}, channel.RefusedTokenPerson},
		{"altered", "", map[string]string{"token": string(altered), "action_id": a.ActionID, "endpoint": phone.Endpoint}, channel.RefusedToken},
	} {
		tc.body["decision"] = "allow_once"
		status, got := answer(t, s, tc.person, tc.body)
		details, _ := got["details"].(map[string]any)
		if status != 403 || got["code"] != "FORBIDDEN" || details["reason"] != tc.reason {
			t.Fatalf("%s: %d %v, want 403 %s", tc.name, status, got, tc.reason)
		}
	}
	body := map[string]string{"token": ta, "action_id": a.ActionID, "decision": "deny", "endpoint": phone.Endpoint}
	if status, got := answer(t, s, "alice", body); status != 200 || got["state"] != "denied" {
		t.Fatalf("alice's answer: %d %v", status, got)
	}
	if status, got := answer(t, s, "", body); status != 403 || got["details"].(map[string]any)["reason"] != channel.RefusedTokenReused {
		t.Fatalf("the token again: %d %v", status, got)
	}
	// b is answered on the API first: its token then gets the record.
	if status, data := doAs(t, s, "alice", "POST", "/v0/actions/"+b.ActionID+"/respond", map[string]string{"decision": "allow_once"}); status != 200 {
		t.Fatalf("respond: %d %s", status, data)
	}
	status, got := answer(t, s, "", map[string]string{"token": tokens[b.ActionID], "action_id": b.ActionID, "decision": "deny", "endpoint": phone.Endpoint})
	if recorded, _ := got["details"].(map[string]any)["recorded"].(map[string]any); status != 409 || recorded["state"] != "approved" {
		t.Fatalf("late token: %d %v", status, got)
	}
	st := s.Node.Channels.Stats()
	for reason, want := range map[string]uint64{channel.RefusedTokenPrompt: 1, channel.RefusedTokenPerson: 2, channel.RefusedToken: 1, channel.RefusedTokenReused: 1} {
		if n := st.Counted("webpush", channel.StatRefused, reason); n != want {
			t.Fatalf("refused %s: %d, want %d", reason, n, want)
		}
	}
	admin, err := auth.MintHS256([]byte(jwtSecret), auth.Claims{Subject: "ops", Role: auth.RoleAdmin, TTL: time.Hour, Issuer: jwtIss, Audience: jwtAud}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	_, metrics, _ := nodetest.Do(t, nil, "GET", s.URL+"/metrics", nil, "Authorization", "Bearer "+admin)
	for _, line := range []string{
		`gatehouse_channel_refused_total{channel="webpush",reason="token_reused"} 1`,
		`gatehouse_channel_refused_total{channel="webpush",reason="token_wrong_person"} 2`,
		`gatehouse_channel_refused_total{channel="webpush",reason="token_wrong_prompt"} 1`,
	} {
		if !strings.Contains(string(metrics), line) {
			t.Fatalf("metrics lack %s", line)
		}
	}
	// The deep link's page reads the prompt with the token, spending nothing.
	status, data := doAs(t, s, "", "POST", "/v0/channels/webpush/prompt", map[string]string{"token": tokens[b.ActionID], "endpoint": phone.Endpoint})
	if status != 200 || !strings.Contains(string(data), `"state":"approved"`) {
		t.Fatalf("peek: %d %s", status, data)
	}
}

// TestWebPushGoneSubscriptionIsRemoved: a subscription the push service
// answers 410 for is removed, and no more is pushed to it.
func TestWebPushGoneSubscriptionIsRemoved(t *testing.T) {
	svc := webpushtest.Start(t)
	s := start(t, node.Options{})
	sub := subscribe(t, s, svc, "alice")
	svc.Expire(t, sub)
	channeltest.Ask(t, s.Node, "alice", "deploy.app", nil)
	eventually.True(t, "the subscription removed", func() bool { return len(s.Node.Channels.Dests("webpush", "alice")) == 0 })
	if r := svc.Requests(sub); len(r) != 1 || r[0].Status != 410 {
		t.Fatalf("pushes: %+v", r)
	}
	info := object(t, s, "alice", "GET", "/v0/channels/webpush", nil)
	if subs := info["subscriptions"].([]any); len(subs) != 0 {
		t.Fatalf("still listed: %v", subs)
	}
	if n := s.Node.Channels.Stats().Counted("webpush", channel.StatDropped, "gone"); n != 1 {
		t.Fatalf("dropped gone: %d", n)
	}
}

// TestWebPushRefusesPrivateEndpoints: with the webhooks' address rules and
// no allow-list, a subscription whose endpoint is on a loopback, private
// or link-local address is refused (400, reason endpoint_denied, counted),
// and a malformed one is refused as invalid.
func TestWebPushRefusesPrivateEndpoints(t *testing.T) {
	s := start(t, node.Options{WebhookAllow: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}})
	keys := `"keys":{"p256dh":"` + base64.RawURLEncoding.EncodeToString(append([]byte{4}, make([]byte, 64)...)) +
		`","auth":"` + base64.RawURLEncoding.EncodeToString(make([]byte, 16)) + `"}`
	for _, host := range []string{"127.0.0.1", "localhost", "10.1.2.3", "169.254.169.254", "[::1]", "[fd00::1]", "100.64.0.1"} {
		status, data := doAs(t, s, "alice", "PUT", "/v0/channels/webpush/subscription", `{"endpoint":"https://`+host+`/push/1",`+keys+`}`)
		if status != 400 || !strings.Contains(string(data), `"reason":"endpoint_denied"`) {
			t.Fatalf("endpoint on %s: %d %s", host, status, data)
		}
	}
	for _, bad := range []string{
		`{"endpoint":"ftp://push.example/1",` + keys + `}`,
		`{"endpoint":"https://push.example/1","keys":{"p256dh":"AAAA","auth":"AAAA"}}`,
		`not json`,
	} {
		if status, data := doAs(t, s, "alice", "PUT", "/v0/channels/webpush/subscription", bad); status != 400 {
			t.Fatalf("%s: %d %s", bad, status, data)
		}
	}
	if n := s.Node.Channels.Stats().Counted("webpush", channel.StatRefused, channel.RefusedEndpoint); n != 7 {
		t.Fatalf("refused endpoint_denied: %d", n)
	}
}

// publicKey is the gateway's VAPID public key, as the page is given it.
func publicKey(t *testing.T, s *nodetest.Server) string {
	t.Helper()
	return object(t, s, "alice", "GET", "/v0/channels/webpush", nil)["public_key"].(string)
}

// TestWebPushVAPIDKeyOutlivesARestartInTheStore: the key pair is made on
// first start and kept in the store, not in a file of the data folder: the
// same after a restart.
func TestWebPushVAPIDKeyOutlivesARestartInTheStore(t *testing.T) {
	dir := t.TempDir()
	s := start(t, node.Options{Data: dir})
	first := publicKey(t, s)
	s.Restart()
	if again := publicKey(t, s); again != first {
		t.Fatalf("the key changed across a restart: %s, then %s", first, again)
	}
	if _, err := os.Stat(filepath.Join(dir, webpush.KeyFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a key file was written: %v", err)
	}
}

// TestWebPushImportsTheKeyFileOfAnEarlierRelease: a data folder whose
// key pair an earlier release kept in webpush-vapid.json keeps it, so that
// its subscriptions still receive; once imported, the file is no longer
// needed. A key file others may read is refused, as it was.
func TestWebPushImportsTheKeyFileOfAnEarlierRelease(t *testing.T) {
	private, public, err := webpushgo.GenerateVAPIDKeys()
	if err != nil {
		t.Fatal(err)
	}
	file, _ := json.Marshal(map[string]string{"public_key": public, "private_key": private})
	dir := t.TempDir()
	path := filepath.Join(dir, webpush.KeyFile)
	if err := os.WriteFile(path, file, 0o644); err != nil {
		t.Fatal(err)
	}
	o := node.Options{Data: dir, Addr: "127.0.0.1:0", WebPush: &webpush.Options{}}
	if n, err := node.Open(t.Context(), o); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		if n != nil {
			_ = n.Close(t.Context())
		}
		t.Fatalf("a key file open to others: %v", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	s := start(t, node.Options{Data: dir})
	if got := publicKey(t, s); got != public {
		t.Fatalf("public key %s, want the key file's %s", got, public)
	}
	s.Stop()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	if got := publicKey(t, s); got != public {
		t.Fatalf("without the key file, public key %s, want the imported %s", got, public)
	}
}
