package gateway_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/node"
)

// TestUIServesStaticFiles checks the page's files: types, caching and
// security headers, and that they need no token even when the API does.
func TestUIServesStaticFiles(t *testing.T) {
	s := start(t, node.Options{Auth: auth.Options{StaticToken: "s3cret"}})
	a := newAPI(t, s)
	// The redirect is what is checked, so the client must not follow it.
	a.hc = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	if status, _, h := a.do("GET", "/ui", nil); status != 301 || h.Get("Location") != "ui/" {
		t.Fatalf("GET /ui: %d Location %q, want 301 to ui/", status, h.Get("Location"))
	}
	for _, f := range []struct{ path, ctype, contains string }{
		{"/ui/", "text/html; charset=utf-8", "<title>Gatehouse approvals</title>"},
		{"/ui/app.js", "text/javascript; charset=utf-8", "permission.resolved"},
		{"/ui/style.css", "text/css; charset=utf-8", "prefers-color-scheme"},
		{"/ui/manifest.webmanifest", "application/manifest+json", `"display": "standalone"`},
		{"/ui/sw.js", "text/javascript; charset=utf-8", "notificationclick"},
		{"/ui/icon-192.png", "image/png", "PNG"},
	} {
		status, body, h := a.do("GET", f.path, nil)
		if status != 200 || h.Get("Content-Type") != f.ctype || !strings.Contains(string(body), f.contains) {
			t.Fatalf("GET %s: %d %q, body has %q: %v", f.path, status, h.Get("Content-Type"), f.contains, strings.Contains(string(body), f.contains))
		}
		if h.Get("Cache-Control") != "no-cache" || h.Get("ETag") == "" || h.Get("X-Content-Type-Options") != "nosniff" ||
			!strings.Contains(h.Get("Content-Security-Policy"), "connect-src 'self'") ||
			!strings.Contains(h.Get("Content-Security-Policy"), "manifest-src 'self'; worker-src 'self'") {
			t.Fatalf("GET %s headers: %v", f.path, h)
		}
		if again, body, _ := a.do("GET", f.path, nil, "If-None-Match", h.Get("ETag")); again != 304 || len(body) != 0 {
			t.Fatalf("GET %s with its ETag: %d, %d bytes; want 304", f.path, again, len(body))
		}
		if head, body, headHdr := a.do("HEAD", f.path, nil); head != 200 || len(body) != 0 || headHdr.Get("Content-Type") != f.ctype {
			t.Fatalf("HEAD %s: %d %q, %d bytes", f.path, head, headHdr.Get("Content-Type"), len(body))
		}
	}
	a.fail("GET", "/ui/nope.js", nil, 404, "NOT_FOUND")
	if status, _, _ := a.do("GET", "/ui/../v0/actions", nil); status != 401 {
		t.Fatalf("a path that leaves /ui/ must reach the API and its auth: %d", status)
	}
	if _, _, h := a.do("POST", "/ui/", nil); h.Get("Allow") != "GET, HEAD" {
		t.Fatalf("POST /ui/: Allow %q", h.Get("Allow"))
	}
	a.fail("POST", "/ui/", nil, 405, "METHOD_NOT_ALLOWED")
	if status, _, _ := a.do("GET", "/v0/actions?status=pending", nil); status != 401 {
		t.Fatalf("the API itself still needs the token: %d", status)
	}
}

const chromiumPath = "/usr/bin/chromium"

// browser is one headless Chromium tab for a test.
type browser struct {
	t   *testing.T
	ctx context.Context

	mu      sync.Mutex
	console []string
}

// newBrowser starts Chromium, or skips the test when it is not installed
// outside CI (CI installs it, so there a missing browser is a failure).
func newBrowser(t *testing.T, flags ...chromedp.ExecAllocatorOption) *browser {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set but Chromium is missing (%v): .ci/run installs Debian's chromium package", err)
		}
		t.Skipf("%s not found: install Debian's chromium package (apt-get install chromium) to run this end-to-end test", chromiumPath)
	}
	// Each start's profile is a TempDir made before the browser: cleanups
	// run last-in first-out, so the browser is gone before its folder is.
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath),
		chromedp.NoSandbox, // tests run as root in CI containers
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
	)
	opts = append(opts, flags...)
	// A start can fail on a loaded machine (the process exits before it
	// prints its DevTools address); it is tried once more with a fresh
	// profile before the test fails.
	var ctx context.Context
	for attempt := 1; ; attempt++ {
		var err error
		if ctx, err = startBrowser(t, append(opts, chromedp.UserDataDir(t.TempDir()))); err == nil {
			break
		} else if attempt == 2 {
			t.Fatalf("start Chromium: %v", err)
		}
		t.Logf("Chromium did not start (%v); trying again", err)
	}
	b := &browser{t: t, ctx: ctx}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.console = append(b.console, m.String())
			b.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		if t.Failed() {
			b.mu.Lock()
			t.Logf("browser console:\n%s", strings.Join(b.console, "\n"))
			b.mu.Unlock()
		}
	})
	return b
}

// do runs steps, bounded by timeout, and fails the test naming what.
func (b *browser) do(what string, timeout time.Duration, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("browser: %s: %v", what, err)
	}
}

// eval returns the value of a JavaScript expression in the page.
func (b *browser) eval(expr string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		b.t.Fatalf("browser: evaluate %s: %v", expr, err)
	}
	return v
}

// startBrowser starts Chromium with opts, bound to the test: the first
// run starts the browser on a context with no timeout (a timeout would end
// the whole browser), and a hung start is bounded by a watchdog instead.
func startBrowser(t *testing.T, opts []chromedp.ExecAllocatorOption) (context.Context, error) {
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(cancel)
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx) }()
	select {
	case err := <-started:
		if err != nil {
			cancel()
			cancelAlloc()
		}
		return ctx, err
	case <-time.After(60 * time.Second):
		cancel()
		cancelAlloc()
		return nil, errors.New("Chromium did not start within 60s")
	}
}

// evalAsync returns the value a JavaScript promise resolves to.
func (b *browser) evalAsync(expr string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("browser: evaluate %s: %v", expr, err)
	}
	return v
}

// waitText waits until the element matching sel contains want.
func (b *browser) waitText(sel, want string) {
	b.t.Helper()
	b.do("wait for "+sel+" to say "+want, 20*time.Second,
		chromedp.PollFunction[chromedp.Void](`(sel, want) => {
			const e = document.querySelector(sel);
			return !!e && e.textContent.toLowerCase().includes(want.toLowerCase());
		}`, chromedp.WithPollingArgs(sel, want), chromedp.WithPollingInterval(50*time.Millisecond)))
}

// TestUIApprovesInChromium drives the approvals page in headless Chromium:
// a person signs in with a channel token, sees an agent's prompt, clicks
// "Allow once", and the agent is approved and finishes; a prompt answered
// from another channel is retracted from the page.
func TestUIApprovesInChromium(t *testing.T) {
	br := newBrowser(t)
	s := bridgeNode(t, node.Options{Auth: jwtOptions()})
	a := newAPI(t, s)
	alice := mint(t, auth.Claims{Subject: "alice", Role: auth.RoleClient})
	aliceWeb := mint(t, auth.Claims{Subject: "alice", Role: auth.RoleChannel})
	alicePhone := mint(t, auth.Claims{Subject: "alice", Role: auth.RoleChannel})
	agentTok := mint(t, auth.Claims{Subject: "bot", Role: auth.RoleAgent, Agents: []string{"ui-agent"}})
	a.token = agentTok
	ag := a.agent("ui-agent", "c1")

	// ask has alice start an execution whose agent then calls a tool that
	// needs approval; it returns the execution, lease, step and action ids.
	ask := func(tool string) (string, string, string, string) {
		t.Helper()
		a.token = alice
		execID := a.create("ui-agent", nil)["id"].(string)
		lease := ag.expect("execution.assigned")["session_id"].(string)
		a.token = agentTok
		res := a.intent(execID, lease, obj{"type": "invoke_tool", "tool_id": tool, "arguments": obj{"target": "prod", "replicas": 3}}, 200)
		if res["pending_approval"] != true {
			t.Fatalf("intent for %s: %v", tool, res)
		}
		step := res["step_id"].(string)
		a.token = alice
		// The bridge lists a prompt once the intent's answer has gone out,
		// which can be a moment after the agent has it.
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			for _, x := range a.json("GET", "/v0/actions?status=pending", nil, 200)["actions"].([]any) {
				if rec := x.(obj); rec["step_id"] == step {
					return execID, lease, step, rec["action_id"].(string)
				}
			}
		}
		t.Fatalf("no pending action for step %s within 5s", step)
		return "", "", "", ""
	}
	execID, lease, step, action := ask("deploy.app")

	br.do("open the page", 20*time.Second, chromedp.Navigate(s.URL+"/ui/"))
	// Without a token the API refuses, and the page says so.
	br.waitText("#error", "UNAUTHORIZED")
	br.do("sign in", 10*time.Second,
		chromedp.SendKeys(chromedp.ID("token"), aliceWeb),
		chromedp.Click(chromedp.CSS(`#signin-form button[type=submit]`)),
	)
	br.waitText("#status", "Live")
	card := `li[data-action-id="` + action + `"]`
	br.waitText(card+" .tool", "deploy.app")
	br.waitText(card+" .arguments", `"target": "prod"`)
	br.waitText(card+" .reason", "deploys need a human")
	br.waitText(card+" .execution", execID)
	if got := br.eval(`document.getElementById('error').hidden ? 'hidden' : document.getElementById('error').textContent`); got != "hidden" {
		t.Fatalf("error still shown after signing in: %q", got)
	}
	br.do("click Allow once", 10*time.Second, chromedp.Click(chromedp.CSS(card+` button[data-decision="allow_once"]`)))

	p := ag.expect("approval.resolved")
	if p["approved"] != true || p["step_id"] != step || p["execution_id"] != execID {
		t.Fatalf("agent got %v, want approval of step %s", p, step)
	}
	peerID := br.eval(`sessionStorage.getItem('gatehouse.peer')`)
	rec := a.json("GET", "/v0/actions/"+action, nil, 200)
	by, _ := rec["decided_by"].(obj)
	if rec["state"] != "approved" || rec["decision"] != "allow_once" || by == nil ||
		by["channel_id"] != "web" || by["principal"] != "alice" || by["native_peer_id"] != peerID || peerID == "" {
		t.Fatalf("record after the click: %v (tab peer id %q)", rec, peerID)
	}
	br.waitText(card+" .note", "You allowed this call once")

	// The agent runs the approved tool and finishes.
	a.token = agentTok
	a.json("POST", "/v0/agents/step-result", obj{"execution_id": execID, "session_id": lease, "step_id": step, "success": true, "data": "deployed"}, 200)
	ag.expect("tool.result")
	a.intent(execID, lease, obj{"type": "complete", "output": "done"}, 200)
	a.token = alice
	a.waitStatus(execID, "completed")

	// A prompt answered from another channel leaves the page.
	_, _, _, action2 := ask("deploy.db")
	card2 := `li[data-action-id="` + action2 + `"]`
	br.waitText(card2+" .tool", "deploy.db")
	a.token = alicePhone
	a.json("POST", "/v0/actions/"+action2+"/respond", obj{"decision": "deny", "reason": "not now", "channel_id": "phone", "native_peer_id": "+15550100"}, 200)
	if p := ag.expect("approval.resolved"); p["approved"] != false {
		t.Fatalf("agent got %v after the phone denied", p)
	}
	br.waitText(card2+" .note", "Answered elsewhere: denied by alice via phone")
	if n := br.eval(`String(document.querySelectorAll('` + card2 + ` button').length)`); n != "0" {
		t.Fatalf("the retracted prompt still has %s buttons", n)
	}
	br.do("wait for the retracted prompt to leave", 20*time.Second, chromedp.WaitNotPresent(chromedp.CSS(card2)))
	br.waitText("#empty", "Nothing is waiting")

	// When the stream drops and cannot come back (here: the gateway
	// restarts and the browser may no longer reach the stream), the page
	// falls back to polling the pending list, and a prompt that leaves the
	// list is looked up and retracted.
	br.do("block the channel stream", 10*time.Second, chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
			return err
		}
		_, err := chromedp.Call(ctx, network.SetBlockedURLs, network.SetBlockedURLsParams{
			URLPatterns: []*network.BlockPattern{{URLPattern: "*://*:*/v0/channels/stream*", Block: true}},
		})
		return err
	}))
	s.Restart()
	a.token = agentTok
	ag = a.agent("ui-agent", "c1")
	br.waitText("#status", "Updating every 2 s")
	_, _, _, action3 := ask("deploy.cache")
	card3 := `li[data-action-id="` + action3 + `"]`
	br.waitText(card3+" .tool", "deploy.cache")
	a.token = alicePhone
	a.json("POST", "/v0/actions/"+action3+"/respond", obj{"decision": "allow_always", "channel_id": "phone"}, 200)
	if p := ag.expect("approval.resolved"); p["approved"] != true {
		t.Fatalf("agent got %v after the phone allowed", p)
	}
	br.waitText(card3+" .note", "Answered elsewhere: approved by alice via phone")
	if got := br.eval(`document.getElementById('status').textContent`); got != "Updating every 2 s" {
		t.Fatalf("status %q: the blocked stream should have left the page polling", got)
	}

	// The sign-in lasts as long as the tab.
	br.do("reload", 20*time.Second, chromedp.Reload())
	br.waitText("#whoami", "Signed in with a token")
	if got := br.eval(`sessionStorage.getItem('gatehouse.peer')`); got != peerID {
		t.Fatalf("tab id %q after a reload, want %q", got, peerID)
	}
}

// tab opens another tab of the same browser; closing it is the returned
// function.
func (b *browser) tab() (*browser, func()) {
	b.t.Helper()
	ctx, cancel := chromedp.NewContext(b.ctx)
	// The first run opens the tab, bound to ctx: as for the browser, it
	// must carry no timeout, so a watchdog bounds it.
	opened := make(chan error, 1)
	go func() { opened <- chromedp.Do(ctx) }()
	select {
	case err := <-opened:
		if err != nil {
			b.t.Fatalf("open a tab: %v", err)
		}
	case <-time.After(30 * time.Second):
		cancel()
		b.t.Fatal("a tab did not open within 30s")
	}
	return &browser{t: b.t, ctx: ctx}, cancel
}

// TestUIOneChannelPerBrowser: the page registers one channel per browser,
// not one per page load; a second tab open at the same time takes a second
// id, which a later tab reuses once it is closed.
func TestUIOneChannelPerBrowser(t *testing.T) {
	br := newBrowser(t)
	s := start(t, node.Options{})
	a := newAPI(t, s)
	open := func(b *browser) string {
		t.Helper()
		b.do("open the page", 20*time.Second, chromedp.Navigate(s.URL+"/ui/"))
		b.waitText("#status", "Live")
		return b.eval(`sessionStorage.getItem('gatehouse.peer')`)
	}
	webChannels := func() []string {
		t.Helper()
		var ids []string
		for _, c := range a.json("GET", "/v0/channels", nil, 200)["channels"].([]any) {
			if c.(obj)["channel_id"] == "web" {
				ids = append(ids, c.(obj)["native_peer_id"].(string))
			}
		}
		return ids
	}
	first := open(br)
	if base := br.eval(`localStorage.getItem('gatehouse.peer')`); first != base || base == "" {
		t.Fatalf("tab id %q, browser id %q", first, base)
	}
	for range 3 {
		br.do("reload", 20*time.Second, chromedp.Reload())
		br.waitText("#status", "Live")
		if got := br.eval(`sessionStorage.getItem('gatehouse.peer')`); got != first {
			t.Fatalf("id %q after a reload, want %q", got, first)
		}
	}
	second, closeSecond := br.tab()
	if got := open(second); got != first+"-2" {
		t.Fatalf("a second tab open at once took %q, want %q", got, first+"-2")
	}
	closeSecond()
	third, closeThird := br.tab()
	defer closeThird()
	if got := open(third); got != first+"-2" {
		t.Fatalf("a tab opened after the second closed took %q, want %q", got, first+"-2")
	}
	if got := webChannels(); len(got) != 2 {
		t.Fatalf("web channels %v after five page loads in two tabs at a time, want 2", got)
	}
}
