package main

import (
	"bytes"
	linkedlist "container/list" // "list" is the token subcommand
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gatehouse-dev/gatehouse/client/sse"
	"github.com/valyala/fasthttp"
)

// The bench drives the gateway with this lean client of the kernel API
// rather than with package client: the SDK's net/http round trips took about
// a third of the CPU that the load and the in-process gateway share, so the
// figure measured the SDK as much as the gateway. Requests go through one
// fasthttp.HostClient with pooled requests, responses and body buffers;
// bodies are appended by hand, answers decoded with encoding/json. Each
// agent and runner holds one SSE stream, opened as the SDK opens it and
// read with the SDK's reader (package client/sse). Nothing is retried that
// the SDK would not retry, and nothing waits without a bound.

// Limits of the load driver.
const (
	// maxBenchConns bounds the pooled connections to the gateway; in-flight
	// requests are about two per execution in flight plus one per role.
	maxBenchConns = 512
	// benchIdleConn is how long an unused pooled connection is kept.
	// fasthttp's cleaner goroutine sleeps this long between sweeps and only
	// ends on a sweep that finds no connection left, so a short value lets
	// it end soon after the rig closes.
	benchIdleConn = time.Second
	// benchResultTimeout bounds a runner's result post and an agent's ack,
	// as the SDK's per-attempt limits do.
	benchResultTimeout = 10 * time.Second
	// benchAckInterval spaces an agent's acknowledgements (the SDK's
	// interval): one request covers every delivery handled meanwhile.
	benchAckInterval = 50 * time.Millisecond
	// benchMaxEarly bounds the tool results an agent keeps for steps whose
	// intent answer it has not read yet (the SDK's bound).
	benchMaxEarly = 10000
	// benchStreamIdle ends a stream that received nothing, not even a
	// heartbeat, for this long, so a silently dead connection is replaced
	// (the SDK's default).
	benchStreamIdle = 45 * time.Second
	// benchMinBackoff and benchMaxBackoff bound the wait before a stream
	// that dropped is opened again.
	benchMinBackoff = 100 * time.Millisecond
	benchMaxBackoff = 2 * time.Second
	// maxBenchSSELine bounds one SSE line, so that a broken server cannot
	// make the driver buffer without limit.
	maxBenchSSELine = 4 << 20
	// maxBenchErrorBody bounds how much of an error answer is quoted.
	maxBenchErrorBody = 512
)

// loadDriver speaks the kernel API for the bench: executions are created
// through it, and its agents and runners serve them. It is safe for
// concurrent use.
type loadDriver struct {
	hc      *fasthttp.HostClient
	streams *http.Client // the long-lived SSE streams only
	base    string       // scheme://host[:port][/prefix], without a trailing slash
	auth    string       // the Authorization header; empty without a token
	log     *slog.Logger
	tracker *tracker
	bufs    sync.Pool // of *[]byte: request bodies, reused

	create, intent, ack endpoint
}

// endpoint is a POST route: the full URL for the request, the path for
// error messages.
type endpoint struct{ url, path string }

func (d *loadDriver) endpoint(path string) endpoint { return endpoint{d.base + path, path} }

// newLoadDriver returns a driver for the gateway at base (http or https,
// optionally with a path prefix; tc, when not nil, configures https),
// reporting the end of each execution its agents run to t.
func newLoadDriver(base, token string, tc *tls.Config, log *slog.Logger, t *tracker) (*loadDriver, error) {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil {
		return nil, fmt.Errorf("bench: URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("bench: URL %q: want http(s)://host[:port]", base)
	}
	addr := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	d := &loadDriver{
		base:    u.Scheme + "://" + u.Host + u.EscapedPath(),
		log:     log,
		tracker: t,
		streams: &http.Client{Transport: &http.Transport{
			DialContext:     (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
			TLSClientConfig: tc.Clone(),
		}},
	}
	if token != "" {
		d.auth = "Bearer " + token
	}
	d.create = d.endpoint("/v0/executions")
	d.intent = d.endpoint("/v0/agents/intent")
	d.ack = d.endpoint("/v0/peers/ack")
	d.hc = &fasthttp.HostClient{
		Addr:      addr,
		IsTLS:     u.Scheme == "https",
		TLSConfig: tc.Clone(),
		Name:      "gatehouse-bench",
		MaxConns:  maxBenchConns,
		// Past MaxConns a request waits for a connection, within its
		// deadline, rather than failing at once.
		MaxConnWaitTimeout:  execTimeout,
		MaxIdleConnDuration: benchIdleConn,
		// fasthttp's default dialer starts a DNS-cache goroutine that never
		// ends; a plain dialer leaves nothing behind when the rig closes.
		// fasthttp passes what is left of the request's deadline.
		DialTimeout: func(addr string, timeout time.Duration) (net.Conn, error) {
			return (&net.Dialer{Timeout: timeout}).Dial("tcp", addr)
		},
		// Paths are escaped already; keep them byte for byte.
		DisablePathNormalizing: true,
		// fasthttp retries only GET-like requests by default. Intents carry
		// idempotency keys and results are settled by their recorded
		// outcome, so they are safe to send again over a fresh connection
		// (as the SDK does); a create is not: the kernel cannot tell a
		// repeat from a new execution.
		RetryIfErr: func(req *fasthttp.Request, _ int, _ error) (resetTimeout, retry bool) {
			return false, !bytes.HasSuffix(req.URI().Path(), []byte(d.create.path))
		},
	}
	return d, nil
}

// close drops the pooled connections: the gateway's shutdown would wait
// for them.
func (d *loadDriver) close() {
	d.hc.CloseIdleConnections()
	d.streams.CloseIdleConnections()
}

// benchAPIError is a non-2xx answer to the load driver.
type benchAPIError struct {
	method, path string
	status       int
	code, msg    string
}

func (e *benchAPIError) Error() string {
	if e.code != "" {
		return fmt.Sprintf("%s %s: %d %s: %s", e.method, e.path, e.status, e.code, e.msg)
	}
	return fmt.Sprintf("%s %s: %d: %s", e.method, e.path, e.status, e.msg)
}

func newBenchAPIError(method, path string, status int, body []byte) *benchAPIError {
	e := &benchAPIError{method: method, path: path, status: status}
	var b struct{ Error, Code string }
	if json.Unmarshal(body, &b) == nil && (b.Error != "" || b.Code != "") {
		e.code, e.msg = b.Code, b.Error
		return e
	}
	body = bytes.TrimSpace(body)
	if len(body) > maxBenchErrorBody {
		body = body[:maxBenchErrorBody]
	}
	if e.msg = string(body); e.msg == "" {
		e.msg = http.StatusText(status)
	}
	return e
}

// getBuf and putBuf lend a body buffer, so that building a body does not
// allocate once the pool is warm.
func (d *loadDriver) getBuf() *[]byte {
	if b, ok := d.bufs.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, 512)
	return &b
}

func (d *loadDriver) putBuf(b *[]byte) {
	if cap(*b) > 64<<10 {
		return // an outsized body; let it go rather than pin it
	}
	*b = (*b)[:0]
	d.bufs.Put(b)
}

// post sends a JSON body and, for a 2xx answer, decodes it into out (nil:
// the answer is not read). A non-2xx answer is a *benchAPIError. The body must
// not change until post returns.
func (d *loadDriver) post(ep endpoint, body []byte, deadline time.Time, out any) error {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(ep.url)
	req.Header.SetContentType("application/json")
	if d.auth != "" {
		req.Header.Set("Authorization", d.auth)
	}
	req.SetBodyRaw(body)
	if err := d.hc.DoDeadline(req, resp, deadline); err != nil {
		return fmt.Errorf("POST %s: %w", ep.path, err)
	}
	if code := resp.StatusCode(); code/100 != 2 {
		return newBenchAPIError("POST", ep.path, code, resp.Body())
	}
	if out != nil {
		if err := json.Unmarshal(resp.Body(), out); err != nil {
			return fmt.Errorf("POST %s: decode answer: %w", ep.path, err)
		}
	}
	return nil
}

// createExecution creates execution number i for the bench agent, with
// the input {"n":i}, and returns its id.
func (d *loadDriver) createExecution(i int, deadline time.Time) (string, error) {
	b := d.getBuf()
	defer d.putBuf(b)
	*b = appendCreateBody(*b, i)
	var ex struct {
		ID string `json:"id"`
	}
	if err := d.post(d.create, *b, deadline, &ex); err != nil {
		return "", err
	}
	if ex.ID == "" {
		return "", errors.New("POST /v0/executions: answer without an id")
	}
	return ex.ID, nil
}

// appendCreateBody appends the body of createExecution, as the SDK's
// CreateRequest encodes it.
func appendCreateBody(dst []byte, i int) []byte {
	dst = append(dst, `{"agent_id":`...)
	dst = appendJSONString(dst, benchAgent)
	dst = append(dst, `,"input":{"n":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	return append(dst, "}}"...)
}

// --- agents ---

// benchAssignment is the execution.assigned push, as far as the bench
// needs it.
type benchAssignment struct {
	ExecutionID string          `json:"execution_id"`
	SessionID   string          `json:"session_id"` // the lease
	Input       json.RawMessage `json:"input"`
}

// benchToolResult is the tool.result push.
type benchToolResult struct {
	StepID string          `json:"step_id"`
	Status string          `json:"status"`
	Result json.RawMessage `json:"result"`
	Data   json.RawMessage `json:"data"` // what some kernels send instead of result, as the SDK reads it
	Error  string          `json:"error"`
}

// benchIntentAnswer is an IntentResult.
type benchIntentAnswer struct {
	Accepted        bool   `json:"accepted"`
	StepID          string `json:"step_id"`
	PendingApproval bool   `json:"pending_approval"`
	Error           string `json:"error"`
}

// agentConn is one agent connection and the executions it runs.
type agentConn struct {
	d          *loadDriver
	consumerID string
	box        *stepBox
	acks       *acker
	work       chan *benchAssignment // unbuffered: taken only by an idle handler
	handlers   sync.WaitGroup

	mu     sync.Mutex
	active map[string]string // execution id → lease, while a handler runs it
}

// runAgent serves one agent connection until ctx is done: each assigned
// execution invokes the bench tool remotely, waits for its result and
// completes with it, and its end is reported to the tracker. It returns
// ctx.Err(), or earlier an error reconnecting cannot fix, once its
// handlers and its acknowledgements have finished.
func (d *loadDriver) runAgent(ctx context.Context, agentID, consumerID string) error {
	ctx, cancel := context.WithCancel(ctx)
	a := &agentConn{d: d, consumerID: consumerID, box: newStepBox(benchMaxEarly),
		work: make(chan *benchAssignment), active: map[string]string{}}
	a.acks = &acker{d: d, wake: make(chan struct{}, 1)}
	a.acks.prefix = appendJSONString(append([]byte(nil), `{"role":"agent","id":`...), agentID)
	a.acks.prefix = appendJSONString(append(a.acks.prefix, `,"consumer_id":`...), consumerID)
	ackDone := make(chan struct{})
	go func() { defer close(ackDone); a.acks.run(ctx) }()
	defer func() {
		cancel()
		a.handlers.Wait()
		<-ackDone
	}()
	// Explicit acks, as the SDK's agents use: a push in flight when a
	// connection breaks is sent again instead of lost. The gateway then
	// keeps each push in the consumer's outbox until an ack covers it, work
	// it does for real agents too.
	q := url.Values{"agent_id": {agentID}, "consumer_id": {consumerID}, "ack": {"explicit"}}
	return d.serveStream(ctx, "/v0/agents/stream", q, func(ev *sse.Event) {
		switch ev.Type {
		case "execution.assigned":
			a.assigned(ctx, ev.Data)
		case "tool.result":
			var tr benchToolResult
			if err := json.Unmarshal(ev.Data, &tr); err != nil || tr.StepID == "" {
				d.log.Warn("bench: malformed tool result dropped", "agent", consumerID, "err", err)
				break
			}
			a.box.deliver(tr.StepID, &tr)
		}
		a.acks.note(ev.ID)
	})
}

// assigned starts a handler for an assignment. A repeat of one being
// handled (a redelivery) is dropped.
func (a *agentConn) assigned(ctx context.Context, data []byte) {
	as := new(benchAssignment)
	if err := json.Unmarshal(data, as); err != nil || as.ExecutionID == "" || as.SessionID == "" {
		a.d.log.Warn("bench: malformed assignment dropped", "agent", a.consumerID, "err", err)
		return
	}
	a.mu.Lock()
	if a.active[as.ExecutionID] == as.SessionID {
		a.mu.Unlock()
		return
	}
	a.active[as.ExecutionID] = as.SessionID
	a.mu.Unlock()
	// An idle handler takes the execution, else a new one starts and stays
	// for later ones: a fresh goroutine per execution would grow its stack
	// under the HTTP client's deep calls each time, a cost the profile
	// showed. The reader never blocks here, since the handlers it would
	// wait for need the pushes it reads.
	select {
	case a.work <- as:
	default:
		a.handlers.Go(func() { a.handler(ctx, as) })
	}
}

// handler runs as and then whatever assignments come its way until ctx is
// done. There are as many handlers as executions were ever in flight at
// once on this connection.
func (a *agentConn) handler(ctx context.Context, as *benchAssignment) {
	for {
		err := a.execute(ctx, as)
		a.mu.Lock()
		if a.active[as.ExecutionID] == as.SessionID {
			delete(a.active, as.ExecutionID)
		}
		a.mu.Unlock()
		if err != nil {
			err = fmt.Errorf("agent %s: %w", a.consumerID, err)
		}
		a.d.tracker.report(as.ExecutionID, err)
		select {
		case as = <-a.work:
		case <-ctx.Done():
			return
		}
	}
}

// execute runs one execution as the SDK's bench handler did
// (Task.Invoke(benchTool, input, remote) and the complete intent), within
// execTimeout.
func (a *agentConn) execute(ctx context.Context, as *benchAssignment) error {
	if err := ctx.Err(); err != nil {
		return err // the rig is closing: leave the execution alone, as the SDK does
	}
	deadline := time.Now().Add(execTimeout)
	var ans benchIntentAnswer
	if err := a.invoke(as, deadline, &ans); err != nil {
		return fmt.Errorf("invoke %s: %w", benchTool, err)
	}
	switch {
	case !ans.Accepted:
		return fmt.Errorf("invoke %s: refused by policy: %s", benchTool, ans.Error)
	case ans.StepID == "":
		return fmt.Errorf("invoke %s: accepted without a step id", benchTool)
	case ans.PendingApproval:
		// The SDK would wait for a human; a bench has none to ask.
		return fmt.Errorf("invoke %s: step %s awaits approval; the bench needs a policy that allows the tool", benchTool, ans.StepID)
	}
	tr, err := a.box.wait(ctx, ans.StepID, deadline)
	if err != nil {
		return fmt.Errorf("invoke %s: wait for the result of step %s: %w", benchTool, ans.StepID, err)
	}
	if tr.Status == "failed" {
		return fmt.Errorf("invoke %s: step %s failed: %s", benchTool, ans.StepID, tr.Error)
	}
	out := tr.Result
	if out == nil {
		out = tr.Data
	}
	if err := a.complete(as, out, deadline, &ans); err != nil {
		return fmt.Errorf("complete: %w", err)
	}
	if !ans.Accepted {
		return fmt.Errorf("complete: refused: %s", ans.Error)
	}
	return nil
}

// invoke posts the invoke_tool intent, with the body and idempotency key
// Task.Invoke sends: the execution's input as arguments, remote.
func (a *agentConn) invoke(as *benchAssignment, deadline time.Time, ans *benchIntentAnswer) error {
	b := a.d.getBuf()
	defer a.d.putBuf(b)
	*b = appendInvokeBody(*b, as)
	return a.d.post(a.d.intent, *b, deadline, ans)
}

// appendInvokeBody appends the body of invoke.
func appendInvokeBody(dst []byte, as *benchAssignment) []byte {
	dst = appendIntentStart(dst, as, "invoke_tool")
	dst = append(dst, `,"tool_id":`...)
	dst = appendJSONString(dst, benchTool)
	dst = append(dst, `,"arguments":`...)
	dst = appendRawJSON(dst, as.Input)
	dst = appendIdempotencyKey(dst, as.ExecutionID, benchTool)
	return append(dst, `,"remote":true}}`...)
}

// complete posts the complete intent with output, as the SDK does with a
// handler's result.
func (a *agentConn) complete(as *benchAssignment, output json.RawMessage, deadline time.Time, ans *benchIntentAnswer) error {
	b := a.d.getBuf()
	defer a.d.putBuf(b)
	*b = appendCompleteBody(*b, as, output)
	*ans = benchIntentAnswer{}
	return a.d.post(a.d.intent, *b, deadline, ans)
}

// appendCompleteBody appends the body of complete.
func appendCompleteBody(dst []byte, as *benchAssignment, output json.RawMessage) []byte {
	dst = appendIntentStart(dst, as, "complete")
	dst = appendIdempotencyKey(dst, as.ExecutionID, "complete")
	dst = append(dst, `,"output":`...)
	dst = appendRawJSON(dst, output)
	return append(dst, "}}"...)
}

// appendIntentStart appends an intent body up to the intent's type.
func appendIntentStart(dst []byte, as *benchAssignment, typ string) []byte {
	dst = append(dst, `{"execution_id":`...)
	dst = appendJSONString(dst, as.ExecutionID)
	dst = append(dst, `,"session_id":`...)
	dst = appendJSONString(dst, as.SessionID)
	dst = append(dst, `,"intent":{"type":`...)
	return appendJSONString(dst, typ)
}

// appendIdempotencyKey appends the key the SDK gives an intent,
// "<execution>:<name>:<8 random hex digits>": a retry of the request
// repeats it, a second call of the same tool does not.
func appendIdempotencyKey(dst []byte, executionID, name string) []byte {
	var r [4]byte
	_, _ = rand.Read(r[:]) // never fails
	dst = append(dst, `,"idempotency_key":`...)
	if !jsonPlain(executionID) || !jsonPlain(name) {
		return appendJSONString(dst, executionID+":"+name+":"+hex.EncodeToString(r[:]))
	}
	dst = append(append(dst, '"'), executionID...)
	dst = append(append(append(dst, ':'), name...), ':')
	return append(hex.AppendEncode(dst, r[:]), '"')
}

// acker acknowledges an agent stream's deliveries in batches, as the SDK
// does: at most one request per benchAckInterval.
type acker struct {
	d       *loadDriver
	prefix  []byte        // the ack body up to "sequence"
	wake    chan struct{} // something new was handled
	handled atomic.Uint64 // the highest sequence handled
}

// note records that the delivery with SSE id "<epoch>.<sequence>" was
// handled.
func (k *acker) note(id string) {
	if i := strings.LastIndexByte(id, '.'); i >= 0 {
		id = id[i+1:]
	}
	seq, ok := parseSeq(id)
	if !ok || seq <= k.handled.Load() {
		return
	}
	k.handled.Store(seq) // note has one caller, the stream's reader
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// parseSeq parses a decimal sequence number without allocating; 19 digits
// at most, which cannot overflow.
func parseSeq(b string) (uint64, bool) {
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	var n uint64
	for _, c := range []byte(b) {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}

// run sends acknowledgements until ctx is done, then a last one, so that
// the gateway does not keep the consumer's handled pushes.
func (k *acker) run(ctx context.Context) {
	var sent uint64
	body := append([]byte(nil), k.prefix...)
	flush := func(timeout time.Duration) {
		seq := k.handled.Load()
		if seq <= sent {
			return
		}
		body = append(strconv.AppendUint(append(body[:len(k.prefix)], `,"sequence":`...), seq, 10), '}')
		if err := k.d.post(k.d.ack, body, time.Now().Add(timeout), nil); err != nil {
			// Harmless: the next ack covers these deliveries too.
			k.d.log.Debug("bench: ack not recorded", "sequence", seq, "err", err)
			return
		}
		sent = seq
	}
	t := time.NewTimer(benchAckInterval)
	t.Stop()
	defer t.Stop()
	for {
		select {
		case <-k.wake:
			flush(benchResultTimeout)
			t.Reset(benchAckInterval)
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
		flush(time.Second)
		return
	}
}

// stepBox pairs tool.result pushes with the handlers waiting for them. A
// push may come before its handler has read the intent answer that names
// the step (the push travels on another connection and can overtake the
// answer), so pushes nobody waits for yet are kept, up to a bound, oldest
// dropped first.
type stepBox struct {
	max int

	mu    sync.Mutex
	slots map[string]*stepSlot // by step id
	early linkedlist.List      // step ids of unclaimed pushes, oldest first
}

// stepSlot is one step's rendezvous.
type stepSlot struct {
	ch    chan *benchToolResult // the first push; repeats are dropped
	early *linkedlist.Element   // in stepBox.early while no handler claimed the slot
}

func newStepBox(max int) *stepBox {
	return &stepBox{max: max, slots: map[string]*stepSlot{}}
}

// deliver hands the result of step stepID to its handler, or keeps it for
// the handler to come.
func (b *stepBox) deliver(stepID string, tr *benchToolResult) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.slots[stepID]
	if s == nil {
		s = &stepSlot{ch: make(chan *benchToolResult, 1)}
		s.early = b.early.PushBack(stepID)
		b.slots[stepID] = s
		if b.early.Len() > b.max {
			delete(b.slots, b.early.Remove(b.early.Front()).(string))
		}
	}
	select {
	case s.ch <- tr:
	default:
	}
}

// wait returns the result of step stepID, waiting for it until deadline or
// the end of ctx.
func (b *stepBox) wait(ctx context.Context, stepID string, deadline time.Time) (*benchToolResult, error) {
	b.mu.Lock()
	s := b.slots[stepID]
	if s == nil {
		s = &stepSlot{ch: make(chan *benchToolResult, 1)}
		b.slots[stepID] = s
	} else if s.early != nil {
		b.early.Remove(s.early)
		s.early = nil
	}
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		if b.slots[stepID] == s {
			delete(b.slots, stepID)
		}
		b.mu.Unlock()
	}()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case tr := <-s.ch:
		return tr, nil
	case <-t.C:
		return nil, errors.New("no result pushed in time")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// --- runners ---

// benchJob is the job.assigned push, as far as the bench needs it.
type benchJob struct {
	ID          string          `json:"id"`
	ExecutionID string          `json:"execution_id"`
	StepID      string          `json:"step_id"`
	ToolID      string          `json:"tool_id"`
	Arguments   json.RawMessage `json:"arguments"`
}

// runRunner serves one runner connection offering the bench tool until ctx
// is done: each job is answered at once with its arguments as the result.
// It returns ctx.Err(), or earlier an error reconnecting cannot fix.
//
// The result is posted from the stream's reader: the gateway hands a
// connection one job at a time, so nothing else can arrive meanwhile. A
// job's start is not reported: the bench tool finishes at once, the SDK is
// moving to report starts only for slow tools, and the gateway settles a
// job by its result alone.
func (d *loadDriver) runRunner(ctx context.Context, runnerID, consumerID string) error {
	results := d.endpoint("/v0/runners/" + url.PathEscape(runnerID) + "/results")
	q := url.Values{"runner_id": {runnerID}, "consumer_id": {consumerID}, "capabilities": {benchTool}}
	return d.serveStream(ctx, "/v0/runners/stream", q, func(ev *sse.Event) {
		if ev.Type != "job.assigned" {
			return
		}
		var j benchJob
		if err := json.Unmarshal(ev.Data, &j); err != nil || j.ID == "" {
			d.log.Warn("bench: malformed job dropped", "runner", consumerID, "err", err)
			return
		}
		if err := d.postResult(results, consumerID, &j); err != nil {
			var aerr *benchAPIError
			if errors.As(err, &aerr) && aerr.status == http.StatusConflict {
				// Settled meanwhile (a redelivered job whose result was
				// recorded, a cancelled or timed out step): nothing to do.
				return
			}
			// The agent would wait for a push that will not come: fail
			// the execution now rather than at its timeout.
			d.tracker.report(j.ExecutionID, fmt.Errorf("runner %s: job %s: %w", consumerID, j.ID, err))
		}
	})
}

// postResult posts a job's result with the fields of the SDK's jobResult:
// success with the arguments echoed, or, for a tool this runner does not
// offer, the SDK's failure.
func (d *loadDriver) postResult(ep endpoint, consumerID string, j *benchJob) error {
	b := d.getBuf()
	defer d.putBuf(b)
	*b = appendResultBody(*b, consumerID, j, time.Now().UTC())
	return d.post(ep, *b, time.Now().Add(benchResultTimeout), nil)
}

// appendResultBody appends the body of postResult for a job started at
// started and finished now.
func appendResultBody(body []byte, consumerID string, j *benchJob, started time.Time) []byte {
	body = append(body, `{"job_id":`...)
	body = appendJSONString(body, j.ID)
	body = append(body, `,"execution_id":`...)
	body = appendJSONString(body, j.ExecutionID)
	body = append(body, `,"step_id":`...)
	body = appendJSONString(body, j.StepID)
	if j.ToolID == benchTool {
		body = append(body, `,"success":true,"data":`...)
		body = appendRawJSON(body, j.Arguments)
	} else {
		body = append(body, `,"success":false,"error":`...)
		body = appendJSONString(body, fmt.Sprintf("tool %q is not offered by this process", j.ToolID))
	}
	body = append(body, `,"consumer_id":`...)
	body = appendJSONString(body, consumerID)
	body = append(body, `,"started_at":"`...)
	body = started.AppendFormat(body, time.RFC3339Nano)
	body = append(body, `","completed_at":"`...)
	body = time.Now().UTC().AppendFormat(body, time.RFC3339Nano)
	return append(body, `"}`...)
}

// --- streams ---

// serveStream holds a role's SSE stream open until ctx is done, handing
// every delivery to handle in order; ev and its slices are valid only
// during the call. A stream that drops is opened again after a backoff,
// resuming after the last delivery handled (Last-Event-ID), as the SDK
// does. It returns ctx.Err(), or the error of a refused stream (4xx other
// than 429), which reconnecting cannot fix.
func (d *loadDriver) serveStream(ctx context.Context, path string, q url.Values, handle func(ev *sse.Event)) error {
	target := d.base + path + "?" + q.Encode()
	wait := benchMinBackoff
	lastID := ""
	for {
		progressed, err := d.streamOnce(ctx, target, path, &lastID, handle)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var aerr *benchAPIError
		if errors.As(err, &aerr) && aerr.status/100 == 4 && aerr.status != http.StatusTooManyRequests {
			return err
		}
		if progressed {
			wait = benchMinBackoff
		}
		d.log.Warn("bench: stream lost; reconnecting", "path", path, "in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		wait = min(2*wait, benchMaxBackoff)
	}
}

// streamOnce reads one connection of a stream until it ends. progressed
// says whether anything arrived; *lastID becomes the stream's last event
// id.
func (d *loadDriver) streamOnce(ctx context.Context, target, path string, lastID *string, handle func(*sse.Event)) (progressed bool, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("User-Agent", "gatehouse-bench")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Cache-Control", "no-cache")
	if d.auth != "" {
		req.Header.Set("Authorization", d.auth)
	}
	if *lastID != "" {
		req.Header.Set("Last-Event-ID", *lastID)
	}
	// The watchdog also covers a gateway that accepts the connection but
	// never answers.
	errIdle := fmt.Errorf("GET %s: nothing received for %s", path, benchStreamIdle)
	idle := time.AfterFunc(benchStreamIdle, func() { cancel(errIdle) })
	defer idle.Stop()
	resp, err := d.streams.Do(req)
	if err != nil {
		if cause := context.Cause(ctx); cause == errIdle {
			err = cause
		}
		return false, fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxBenchErrorBody))
		return false, newBenchAPIError("GET", path, resp.StatusCode, body)
	}
	sr := sse.NewReader(sse.ResetOnRead(resp.Body, idle, benchStreamIdle), maxBenchSSELine)
	for {
		ev, err := sr.Next()
		if err != nil {
			if cause := context.Cause(ctx); cause == errIdle {
				err = cause
			}
			return progressed, err
		}
		progressed = true
		if ev.ID != "" {
			*lastID = ev.ID
		}
		switch ev.Type {
		case "stream.reset":
			// Some deliveries are gone; the executions they carried fail
			// at their timeout, as they would with the SDK.
			d.log.Warn("bench: gateway reset the stream; deliveries may have been lost", "path", path, "detail", string(ev.Data))
		case "stream.expired":
			d.log.Warn("bench: credential expired; the stream ends", "path", path)
		default:
			handle(&ev)
		}
	}
}

// --- JSON ---

// appendJSONString appends s as a JSON string, as encoding/json writes it.
// Ids and names are plain ASCII, copied as they are; anything else goes
// through encoding/json, so an odd id cannot break a body.
func appendJSONString(dst []byte, s string) []byte {
	if !jsonPlain(s) {
		b, _ := json.Marshal(s) // a string always encodes
		return append(dst, b...)
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

// jsonPlain reports whether s is printable ASCII that encoding/json writes
// unescaped.
func jsonPlain(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// appendRawJSON appends a JSON value that came from the gateway, which
// writes valid compact JSON; a missing value is null, as the SDK sends it.
func appendRawJSON(dst []byte, v json.RawMessage) []byte {
	if len(v) == 0 {
		return append(dst, "null"...)
	}
	return append(dst, v...)
}
