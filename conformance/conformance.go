// Package conformance checks a running gateway, black-box, against the
// contracts Gatehouse implements: the kernel API of seed 004 completed by
// the kernel wire facts, the delivery contract and permission bridge of the
// design, and the applicable "Validation" items of the Agent Runtime draft
// (seed 001).
//
// The suite speaks only public protocols (HTTP, SSE and WebSocket) and
// imports nothing of Gatehouse, so it can judge any implementation. It acts
// as client, agent and runner itself, with identifiers unique to each check,
// so checks run concurrently and against a server that others are using.
//
// A check for a feature the server does not offer yet is reported as a skip
// that says so, never as a pass: features are detected, not assumed. The
// probes are: agent-stream deliveries carrying an id: line (per-peer outbox
// cursors), a route for POST /v0/peers/ack (explicit acks), GET /v0/peers
// (presence), the WebSocket twins /v0/agents/ws, /v0/runners/ws and
// /v0/executions/{id}/ws, and GET /v0/actions (the permission bridge). A
// route counts as missing when it answers 404, or 405 when only other
// methods exist at its path. A check whose made-up tool the server's policy
// denies skips too, naming the tool and the policy's reason: a gateway may
// run any policy.
//
// From the command line:
//
//	gatehouse conformance --url http://127.0.0.1:8080 [--token T] [--json]
//	    [--restart-cmd 'systemctl restart gatehouse'] [--approval-tool ID]
//	    [--run REGEXP]
//
// Checks that restart the server need --restart-cmd (or Options.Restart)
// and run alone, after the others. The suite writes to the server it tests
// (executions, signals, and for the slow-consumer check rounds of about
// 6 MB of signals, as many as fit in its time) and cancels what it leaves
// running.
package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"
)

// Status is the outcome of one check.
type Status string

// Check outcomes.
const (
	// Pass means the server behaved as the specification requires.
	Pass Status = "pass"
	// Fail means it did not; Result.Reason says how.
	Fail Status = "fail"
	// Skip means the check could not run: the feature is not built, or the
	// check needs an option that was not given. Result.Reason says which.
	Skip Status = "skip"
)

// Options configure a run. URL is required; the zero value of every other
// field is usable.
type Options struct {
	// URL is the gateway's base URL, for example "http://127.0.0.1:8080";
	// a trailing "/v0" is dropped.
	URL string
	// Token is the bearer token with full (admin) rights, when the server
	// requires one.
	Token string
	// RestartCmd is a shell command (run with sh -c) that restarts the
	// server on the same data and address. Checks that need a restart are
	// skipped without it or Restart.
	RestartCmd string
	// Restart restarts the server in-process; it takes precedence over
	// RestartCmd. After either, the suite waits for /v0/ready.
	Restart func(ctx context.Context) error
	// HTTPClient is used for every request; nil means a private client. It
	// must not set a Timeout, since streams are long-lived.
	HTTPClient *http.Client
	// Timeout bounds each check; zero means 30s.
	Timeout time.Duration
	// Parallel is how many checks run at once; zero means 8. Checks that
	// restart the server always run alone, after the others.
	Parallel int
	// DeniedTool is a tool id the server's policy denies; empty means
	// "shell", which the built-in default policy denies.
	DeniedTool string
	// ApprovalTool is a tool id the server's policy sends to human approval;
	// empty skips the approval checks, since no default policy asks for one.
	ApprovalTool string
	// RunnerToken is a bearer token scoped to the single runner id
	// RunnerTokenID; both enable the runner token-scope checks.
	RunnerToken, RunnerTokenID string
	// AgentToken is a bearer token scoped to the single agent id
	// AgentTokenID; both enable the agent token-scope checks.
	AgentToken, AgentTokenID string
	// ClientToken and OtherClientToken are bearer tokens of two different
	// principals with the rights of a client (create and read their own
	// executions, answer their own prompts); both enable the ownership
	// checks.
	ClientToken, OtherClientToken string
	// AAPAgent names a running AAP agent (one that declared its AgentInfo,
	// such as `gatehouse agent`); empty skips the check that talks to it.
	AAPAgent string
	// Progress, when set, is called with each check's result as soon as
	// the check ends, in the order they end, one call at a time; Run still
	// returns every result in suite order.
	Progress func(Result)
}

// Result is the outcome of one check.
type Result struct {
	// ID names the check, "group/name"; --run matches it.
	ID string `json:"id"`
	// Spec is the specification section the check comes from.
	Spec string `json:"spec"`
	// Name says in a few words what is checked.
	Name string `json:"name"`
	// Status is pass, fail or skip.
	Status Status `json:"status"`
	// Reason explains a failure or skip.
	Reason string `json:"reason,omitempty"`
	// Duration is how long the check took; JSON renders it as duration_ms.
	Duration time.Duration `json:"-"`
}

// Check describes one check of the suite.
type Check struct {
	// ID names the check, "group/name".
	ID string
	// Spec is the specification section the check comes from.
	Spec string
	// Name says in a few words what is checked.
	Name string
	// Restart reports whether the check restarts the server.
	Restart bool
}

// check is a registered check with its body.
type check struct {
	Check
	run func(t *tc)
}

// Checks lists every check of the suite in run order.
func Checks() []Check {
	all := suite()
	out := make([]Check, len(all))
	for i, c := range all {
		out[i] = c.Check
	}
	return out
}

// Run runs the checks whose ID matches one of the only regular expressions
// (all checks when none are given) and returns their results in suite
// order. It returns an error only for unusable options or an unreachable
// server; a server that misbehaves yields failed results instead.
func Run(ctx context.Context, o Options, only ...string) ([]Result, error) {
	if err := o.normalize(); err != nil {
		return nil, err
	}
	// Streams and keep-alives of a run must not outlive it.
	defer o.HTTPClient.CloseIdleConnections()
	var pats []*regexp.Regexp
	for _, p := range only {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("conformance: check pattern %q: %w", p, err)
		}
		pats = append(pats, re)
	}
	var selected []check
	for _, c := range suite() {
		if matchAny(pats, c.ID) {
			selected = append(selected, c)
		}
	}
	if err := reachable(ctx, &o); err != nil {
		return nil, err
	}
	results := make([]Result, len(selected))
	var progress sync.Mutex
	done := func(i int, r Result) {
		results[i] = r
		if o.Progress != nil {
			progress.Lock()
			defer progress.Unlock()
			o.Progress(r)
		}
	}
	sem := make(chan struct{}, o.Parallel)
	var wg sync.WaitGroup
	for i, c := range selected {
		if c.Restart {
			continue
		}
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				done(i, Result{ID: c.ID, Spec: c.Spec, Name: c.Name, Status: Fail, Reason: "not run: " + ctx.Err().Error()})
				return
			}
			defer func() { <-sem }()
			done(i, runOne(ctx, &o, c))
		})
	}
	wg.Wait()
	for i, c := range selected {
		if c.Restart {
			done(i, runOne(ctx, &o, c))
		}
	}
	return results, nil
}

func matchAny(pats []*regexp.Regexp, id string) bool {
	if len(pats) == 0 {
		return true
	}
	for _, p := range pats {
		if p.MatchString(id) {
			return true
		}
	}
	return false
}

func (o *Options) normalize() error {
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("conformance: URL %q: want http(s)://host:port", o.URL)
	}
	// The kernel API's /v0 is part of every path the checks use.
	o.URL = strings.TrimSuffix(strings.TrimRight(o.URL, "/"), "/v0")
	if o.HTTPClient == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		o.HTTPClient = &http.Client{Transport: tr}
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.Parallel <= 0 {
		o.Parallel = 8
	}
	if o.DeniedTool == "" {
		o.DeniedTool = "shell"
	}
	return nil
}

// reachable makes sure something answers HTTP at the URL, so that a typo in
// the address is one clear error rather than dozens of failed checks.
func reachable(ctx context.Context, o *Options) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.URL+"/v0/health", nil)
	if err != nil {
		return fmt.Errorf("conformance: %w", err)
	}
	resp, err := o.HTTPClient.Do(req)
	if err != nil {
		return fmt.Errorf("conformance: server not reachable: %w", err)
	}
	resp.Body.Close()
	return nil
}

// runOne runs a check in its own goroutine, so that a failing helper can end
// it at once (runtime.Goexit, as the testing package does) while its
// cleanups still run.
func runOne(parent context.Context, o *Options, c check) Result {
	start := time.Now()
	ctx, cancel := context.WithTimeout(parent, o.Timeout)
	defer cancel()
	t := &tc{ctx: ctx, o: o, id: c.ID}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer t.runCleanups()
		defer func() {
			if r := recover(); r != nil {
				buf := make([]byte, 4096)
				buf = buf[:runtime.Stack(buf, false)]
				t.record(Fail, fmt.Sprintf("check panicked: %v\n%s", r, buf))
			}
		}()
		c.run(t)
	}()
	select {
	case <-done:
	case <-time.After(o.Timeout + 15*time.Second):
		// A check that ignores its context is a bug of the suite; report it
		// rather than hang the whole run.
		t.record(Fail, "check did not stop after its timeout")
	}
	r := Result{ID: c.ID, Spec: c.Spec, Name: c.Name, Duration: time.Since(start)}
	r.Status, r.Reason = t.outcome()
	return r
}

// tc is the state of one running check. Its fail and skip methods end the
// check's goroutine, so check bodies read as straight-line scripts.
type tc struct {
	ctx context.Context
	o   *Options
	id  string

	mu       sync.Mutex
	verdict  Status
	reason   string
	cleanups []func(ctx context.Context)
}

func (t *tc) record(s Status, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.verdict == "" {
		t.verdict, t.reason = s, reason
	}
}

func (t *tc) outcome() (Status, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.verdict == "" {
		return Pass, ""
	}
	return t.verdict, t.reason
}

// fatalf fails the check and ends it.
func (t *tc) fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if t.ctx.Err() != nil && !strings.Contains(msg, "timed out") {
		msg = "timed out: " + msg
	}
	t.record(Fail, msg)
	runtime.Goexit()
}

// skipf skips the check and ends it.
func (t *tc) skipf(format string, args ...any) {
	t.record(Skip, fmt.Sprintf(format, args...))
	runtime.Goexit()
}

// cleanup registers fn to run when the check ends, last registered first,
// with a fresh context: the check's own may have expired.
func (t *tc) cleanup(fn func(ctx context.Context)) {
	t.mu.Lock()
	t.cleanups = append(t.cleanups, fn)
	t.mu.Unlock()
}

func (t *tc) runCleanups() {
	t.mu.Lock()
	fns := t.cleanups
	t.cleanups = nil
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i](ctx)
	}
}

// within returns a context that ends after d or with the check.
func (t *tc) within(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.ctx, d)
}

// sleep pauses the check, ending it if its time runs out.
func (t *tc) sleep(d time.Duration) {
	select {
	case <-time.After(d):
	case <-t.ctx.Done():
		t.fatalf("timed out while waiting")
	}
}

// canRestart reports whether a restart hook or command was given.
func (t *tc) canRestart() bool { return t.o.Restart != nil || t.o.RestartCmd != "" }

// needRestart skips the check unless the server can be restarted.
func (t *tc) needRestart() {
	if !t.canRestart() {
		t.skipf("needs a server restart: pass --restart-cmd")
	}
}

// restart restarts the server and waits until it is ready again.
func (t *tc) restart() {
	var err error
	if t.o.Restart != nil {
		err = t.o.Restart(t.ctx)
	} else {
		cmd := exec.CommandContext(t.ctx, "sh", "-c", t.o.RestartCmd)
		// A server the command starts in the background may inherit the
		// output pipe; do not wait for it to close once the command is done.
		cmd.WaitDelay = 2 * time.Second
		var out []byte
		out, err = cmd.CombinedOutput()
		if errors.Is(err, exec.ErrWaitDelay) {
			err = nil
		}
		if err != nil {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
		}
	}
	if err != nil {
		t.fatalf("restart failed: %v", err)
	}
	// Kept-alive connections point at the old process.
	t.o.HTTPClient.CloseIdleConnections()
	t.waitReady()
}

// waitReady polls /v0/ready until it answers 200.
func (t *tc) waitReady() {
	last := "no answer"
	for {
		ctx, cancel := t.within(2 * time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.o.URL+"/v0/ready", nil)
		if err != nil {
			cancel()
			t.fatalf("ready request: %v", err)
		}
		resp, err := t.o.HTTPClient.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-t.ctx.Done():
			t.fatalf("timed out waiting for /v0/ready after restart (last: %s)", last)
		}
	}
}
