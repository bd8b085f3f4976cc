package gateway_test

import (
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/serviceworker"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/channel/channeltest"
	"github.com/gatehouse-dev/gatehouse/channel/webpush"
	"github.com/gatehouse-dev/gatehouse/channel/webpush/webpushtest"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
	"github.com/gatehouse-dev/gatehouse/node"
)

// pushStub makes the page's PushManager hand out sub, the subscription of
// the test's push service, and note the key it was asked to subscribe
// with: a browser's own push service is on the Internet, which a test
// cannot reach. Everything else is the browser's own.
func pushStub(sub webpushtest.Subscription) string {
	raw, _ := json.Marshal(sub)
	return `(() => {
  const json = ` + string(raw) + `;
  const fake = { endpoint: json.endpoint, expirationTime: null, toJSON: () => json, unsubscribe: () => Promise.resolve(true) };
  let subscribed = false;
  PushManager.prototype.subscribe = function (opts) {
    const key = new Uint8Array(opts.applicationServerKey);
    self.__subscribedWith = btoa(String.fromCharCode(...key)).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
    self.__userVisibleOnly = opts.userVisibleOnly;
    subscribed = true;
    return Promise.resolve(fake);
  };
  PushManager.prototype.getSubscription = function () { return Promise.resolve(subscribed ? fake : null); };
  self.__subscribe = () => { subscribed = true; };
})();`
}

// TestWebPushAppInChromium drives the installable approvals app in
// headless Chromium: its manifest parses and its service worker runs; the
// person turns notifications on and the subscription reaches the gateway;
// a prompt's push, encrypted by the gateway and decrypted by an
// independent push service, is delivered to the service worker, which
// shows a notification with Allow once and Deny; its Allow once answers
// the prompt without signing in; the withdrawal push replaces the
// notification by the outcome; and a notification's deep link opens the
// page at its prompt and answers it.
func TestWebPushAppInChromium(t *testing.T) {
	br := newBrowser(t)
	svc := webpushtest.Start(t)
	s := start(t, node.Options{Policy: policytest.Parse(t, channeltest.Policy), WebPush: &webpush.Options{},
		WebhookAllow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}})
	a := newAPI(t, s)
	key := a.json("GET", "/v0/channels/webpush", nil, 200)["public_key"].(string)
	sub := svc.Subscribe(t, key)

	ctx := br.ctx
	b := chromedp.FromContext(ctx)
	for _, p := range []string{"notifications", "push"} {
		if _, err := cdp.Call(ctx, b.Browser, cdpbrowser.SetPermission, cdpbrowser.SetPermissionParams{
			Permission: &cdpbrowser.PermissionDescriptor{Name: p, UserVisibleOnly: true}, Setting: cdpbrowser.PermissionSettingGranted, Origin: s.URL,
		}); err != nil {
			t.Fatalf("grant %s: %v", p, err)
		}
	}
	if _, err := cdp.Call(ctx, b.Target, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: pushStub(sub)}); err != nil {
		t.Fatal(err)
	}
	regs := make(chan *serviceworker.Registration, 16)
	go func() {
		for ev, err := range cdp.Events(ctx, b.Target, serviceworker.WorkerRegistrationUpdated) {
			if err != nil {
				return
			}
			for _, r := range ev.Registrations {
				if !r.IsDeleted && r.ScopeURL == s.URL+"/ui/" {
					select {
					case regs <- r:
					default:
					}
				}
			}
		}
	}()
	if _, err := cdp.Call(ctx, b.Target, serviceworker.Enable, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}

	br.do("open the app", 20*time.Second, chromedp.Navigate(s.URL+"/ui/"))
	mctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	manifest, err := cdp.Call(mctx, b.Target, page.GetAppManifest, page.GetAppManifestParams{})
	if err != nil || len(manifest.Errors) != 0 || !strings.HasSuffix(manifest.URL, "/ui/manifest.webmanifest") ||
		!strings.Contains(manifest.Data, `"display": "standalone"`) {
		t.Fatalf("manifest %s: %v, errors %v", manifest.URL, err, manifest.Errors)
	}
	if got := br.evalAsync(`navigator.serviceWorker.ready.then(r => r.active.scriptURL)`); got != s.URL+"/ui/sw.js" {
		t.Fatalf("service worker %q", got)
	}
	inst, err := cdp.Call(mctx, b.Target, page.GetInstallabilityErrors, cdp.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range inst.InstallabilityErrors {
		t.Errorf("installability: %s %v", e.ErrorID, e.ErrorArguments)
	}

	// Turn notifications on, as the person would.
	br.waitText("#push-status", "not notified")
	br.do("turn notifications on", 10*time.Second, chromedp.Click(chromedp.ID("push-on")))
	br.waitText("#push-status", "This device is notified of new prompts")
	if got := br.eval(`self.__subscribedWith + ' ' + self.__userVisibleOnly`); got != key+" true" {
		t.Fatalf("subscribed with %q, want the gateway's key %s and userVisibleOnly", got, key)
	}
	eventually.True(t, "the subscription at the gateway", func() bool {
		d := s.Node.Channels.Dests("webpush", "local")
		return len(d) == 1 && d[0].ID == webpush.ID(sub.Endpoint)
	})

	var reg *serviceworker.Registration
	select {
	case reg = <-regs:
	case <-time.After(20 * time.Second):
		t.Fatal("no service worker registration reported")
	}
	// deliver hands msg to the service worker, as the browser's push
	// service would, until shown holds. A push service delivers again
	// until the browser takes the message; DevTools' delivery is one
	// dispatch, which a worker being started on a loaded machine can
	// miss, so the test delivers again too.
	deliver := func(what, msg string, shown func() bool) {
		t.Helper()
		eventually.True(t, what, func() bool {
			if _, err := cdp.Call(ctx, b.Target, serviceworker.DeliverPushMessage, serviceworker.DeliverPushMessageParams{
				Origin: s.URL, RegistrationID: reg.RegistrationID, Data: msg,
			}); err != nil {
				t.Fatalf("deliver push: %v", err)
			}
			for range 20 {
				if shown() {
					return true
				}
				time.Sleep(100 * time.Millisecond)
			}
			return false
		})
	}
	notifications := func() string {
		return br.evalAsync(`navigator.serviceWorker.ready.then(r => r.getNotifications()).then(ns =>
			JSON.stringify(ns.map(n => ({tag: n.tag, title: n.title, body: n.body, actions: n.actions.map(a => a.action)}))))`)
	}

	rec := channeltest.Ask(t, s.Node, "local", "deploy.app", map[string]any{"target": "prod"})
	var shown []struct {
		Tag, Title, Body string
		Actions          []string
	}
	deliver("the notification shown", svc.WaitMessages(t, sub, 1)[0], func() bool {
		_ = json.Unmarshal([]byte(notifications()), &shown)
		return len(shown) == 1
	})
	if n := shown[0]; n.Tag != rec.ActionID || n.Title != "Allow deploy.app?" || strings.Join(n.Actions, ",") != "allow_once,deny" || !strings.Contains(n.Body, "prod") {
		t.Fatalf("notification: %+v", n)
	}

	// Press Allow once: the worker's click handler, run in the worker.
	sw := worker(t, ctx, s.URL+"/ui/sw.js")
	run := func(expr string) string {
		t.Helper()
		c, cancel := context.WithTimeout(sw, 20*time.Second)
		defer cancel()
		v, err := chromedp.Run(c, chromedp.Evaluate[string](expr, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("service worker: %s: %v", expr, err)
		}
		return v
	}
	run(pushStub(sub) + `; self.__subscribe(); 'ok'`)
	run(`self.registration.getNotifications({tag: '` + rec.ActionID + `'}).then(ns => clicked(ns[0], 'allow_once')).then(() => 'clicked')`)
	got := channeltest.Settled(t, s.Node, rec.ActionID)
	if got.State != bridge.StateApproved || got.DecidedBy.ChannelID != "webpush" || got.DecidedBy.NativePeerID != webpush.ID(sub.Endpoint) {
		t.Fatalf("record: %+v by %+v", got, got.DecidedBy)
	}
	// The withdrawal replaces the notification by the outcome.
	deliver("the notification replaced by the outcome", svc.WaitMessages(t, sub, 2)[1], func() bool {
		_ = json.Unmarshal([]byte(notifications()), &shown)
		return len(shown) == 1 && strings.HasPrefix(shown[0].Body, "Allowed once by local via webpush") && len(shown[0].Actions) == 0
	})

	// A deep link: the notification's body opens the page at its prompt.
	next := channeltest.Ask(t, s.Node, "local", "deploy.other", nil)
	var m webpush.Message
	_ = json.Unmarshal([]byte(svc.WaitMessages(t, sub, 3)[2]), &m)
	br.do("open the deep link", 20*time.Second, chromedp.Navigate(s.URL+"/ui/#answer="+m.Token+"&action="+next.ActionID))
	card := `#linked-prompts li[data-action-id="` + next.ActionID + `"]`
	br.waitText(card+" .tool", "deploy.other")
	if h := br.eval(`location.hash`); h != "" {
		t.Fatalf("the token stayed in the address bar: %q", h)
	}
	br.do("deny from the deep link", 10*time.Second, chromedp.Click(chromedp.CSS(card+` button[data-decision="deny"]`)))
	br.waitText(card+" .note", "You denied this call")
	if got := channeltest.Settled(t, s.Node, next.ActionID); got.State != bridge.StateDenied || got.DecidedBy.ChannelID != "webpush" {
		t.Fatalf("deep link answer: %+v by %+v", got, got.DecidedBy)
	}
}

// worker returns a chromedp context attached to the service worker whose
// script is url.
func worker(t *testing.T, ctx context.Context, url string) context.Context {
	t.Helper()
	id := eventually.Value(t, "the service worker target", func() (target.ID, bool) {
		ts, err := chromedp.Targets(ctx)
		if err != nil {
			return "", false
		}
		for _, ti := range ts {
			if ti.Type == "service_worker" && ti.URL == url {
				return ti.TargetID, true
			}
		}
		return "", false
	})
	wctx, cancel := chromedp.NewContext(ctx, chromedp.WithTargetID(id))
	t.Cleanup(cancel)
	if err := chromedp.Do(wctx); err != nil {
		t.Fatalf("attach to the service worker: %v", err)
	}
	return wctx
}
