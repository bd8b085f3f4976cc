package client

import (
	"container/list"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gatehouse-dev/gatehouse/client/sse"
)

// ToolFunc runs one tool call. args is the raw JSON arguments (JSON null
// when the caller gave none). The result must be JSON-encodable; a
// json.RawMessage is sent as is. Wrap an error with Retryable to ask the
// kernel for another attempt.
type ToolFunc func(ctx context.Context, args json.RawMessage) (any, error)

// Runner runs tools for the kernel: it holds one stream on which the kernel
// assigns jobs, one at a time, and reports each job's result.
type Runner struct {
	// RunnerID names the runner; required.
	RunnerID string
	// ConsumerID names this process's connection; it is kept across
	// reconnects so the kernel hands the connection back its job. Zero
	// means RunnerID + "-" + 8 random hex digits, chosen once per RunRunner
	// call.
	ConsumerID string
	// Tools are the tools this runner offers, by tool id; required. A
	// tool served on a connected account is offered as "<tool>@<account>"
	// (a job for that account comes only to a runner offering it).
	Tools map[string]ToolFunc
	// Info describes tools for the Runtime API's capabilities (optional):
	// sent with the tool list each time the runner connects.
	Info []ToolInfo
}

// ToolInfo describes one tool as a Runtime API capability
// (docs/runtime-api.md). Credentials for its accounts stay with the runner.
type ToolInfo struct {
	Name                string          `json:"name"`
	Description         string          `json:"description,omitempty"`
	Parameters          json.RawMessage `json:"parameters,omitempty"` // a JSON Schema object
	IsReadOnly          bool            `json:"isReadOnly"`
	SupportsIdempotency bool            `json:"supportsIdempotency"`
	Accounts            []Account       `json:"accounts,omitempty"`
}

// Account is a connected account a tool runs on.
type Account struct {
	ConnectedAccountID string `json:"connectedAccountId"`
	IntegrationID      string `json:"integrationId,omitempty"`
	Backend            string `json:"backend,omitempty"`
}

// maxSeenJobs bounds the memory of jobs already taken, which guards against
// running a tool twice when the kernel delivers a job again.
const maxSeenJobs = 4096

// startReportDelay is how long a tool runs before the runner reports the
// step started.
const startReportDelay = 100 * time.Millisecond

// resultTimeout bounds posting a finished job's result once the runner is
// shutting down.
const resultTimeout = 10 * time.Second

// job is the job.assigned push.
type job struct {
	ID          string          `json:"id"`
	ExecutionID string          `json:"execution_id"`
	StepID      string          `json:"step_id"`
	ToolID      string          `json:"tool_id"`
	Arguments   json.RawMessage `json:"arguments"`
	// Account is the connected account to run the tool with, if any.
	Account string `json:"account"`
}

// tool is the function that runs j: the one offered for its account when
// it names one.
func (r *Runner) tool(j *job) ToolFunc {
	if j.Account != "" {
		if f := r.Tools[j.ToolID+"@"+j.Account]; f != nil {
			return f
		}
	}
	return r.Tools[j.ToolID]
}

// jobResult is the body of POST /v0/runners/{id}/results.
type jobResult struct {
	JobID       string          `json:"job_id"`
	ExecutionID string          `json:"execution_id"`
	StepID      string          `json:"step_id"`
	Success     bool            `json:"success"`
	Data        json.RawMessage `json:"data,omitempty"`
	Error       string          `json:"error,omitempty"`
	Retryable   bool            `json:"retryable,omitempty"`
	ConsumerID  string          `json:"consumer_id"`
	StartedAt   time.Time       `json:"started_at"`
	CompletedAt time.Time       `json:"completed_at"`
}

// RunRunner serves r until ctx is done, reconnecting with jittered backoff
// whenever the stream drops. It returns ctx.Err(), or earlier an error that
// reconnecting cannot fix (the server refused the stream with a 4xx, or its
// TLS certificate is not trusted), once the tools in flight, whose context
// is then cancelled, have returned.
func (c *Client) RunRunner(ctx context.Context, r *Runner) error {
	if r.RunnerID == "" || len(r.Tools) == 0 {
		return errors.New("client: Runner.RunnerID and Runner.Tools are required")
	}
	rr := &runnerRun{c: c, r: r, consumer: r.ConsumerID, seen: newJobSet(maxSeenJobs), workers: newWorkers()}
	if rr.consumer == "" {
		rr.consumer = r.RunnerID + "-" + randomHex(4)
	}
	rr.log = c.log.With("runner", r.RunnerID, "consumer", rr.consumer)
	tools := make([]string, 0, len(r.Tools))
	for t := range r.Tools {
		tools = append(tools, t)
	}
	sort.Strings(tools)
	q := url.Values{"runner_id": {r.RunnerID}, "consumer_id": {rr.consumer}, "capabilities": {strings.Join(tools, ",")}}
	// Jobs end with RunRunner, also when it returns early because the
	// gateway refused the stream.
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		rr.workers.wait()
		rr.jobs.Wait()
	}()
	var opened func(context.Context)
	if len(r.Info) > 0 {
		opened = rr.describe
	}
	return c.serveStream(ctx, "/v0/runners/stream", q, rr.log, opened, func(ev sse.Event) {
		if ev.Type != "job.assigned" {
			return
		}
		var j job
		if err := json.Unmarshal(ev.Data, &j); err != nil || j.ID == "" {
			rr.log.Warn("malformed job dropped", "err", err)
			return
		}
		rr.take(ctx, &j)
	})
}

// serveStream holds one of the long-lived role streams open until ctx is
// done, handing every delivery to handle in order. On reconnect it names
// the last delivery it handled (Last-Event-ID), so the gateway resumes right
// after it: nothing is lost and nothing is handed over twice.
func (c *Client) serveStream(ctx context.Context, path string, q url.Values, log *slog.Logger, opened func(context.Context), handle func(sse.Event)) error {
	b := c.backoff()
	lastID := ""
	// down is when the last connection was lost (zero while one is up, or
	// before the first), failed how many attempts to reconnect have failed
	// since: a drop and a reconnect are one line each, however long the
	// gateway is away.
	var down time.Time
	failed := 0
	for {
		s, err := c.openStream(ctx, path, q, lastID)
		if err == nil {
			if down.IsZero() {
				log.Debug("stream connected", "path", path, "cursor", lastID)
			} else {
				log.Info("stream reconnected", "path", path, "cursor", lastID,
					"down", time.Since(down).Round(time.Millisecond), "failed_attempts", failed)
			}
			down, failed = time.Time{}, 0
			if opened != nil {
				opened(ctx)
			}
			for {
				var ev sse.Event
				if ev, err = s.next(); err != nil {
					break
				}
				b.reset()
				switch ev.Type {
				case "stream.reset":
					// The gateway could not resume from our cursor: some
					// deliveries are gone. Work they carried is recovered by
					// the kernel's timeouts, not by this process.
					log.Warn("gateway reset the stream; deliveries may have been lost", "path", path, "detail", string(ev.Data))
				case "stream.expired":
					log.Warn("credential expired; the stream ends", "path", path)
				default:
					handle(ev)
				}
				lastID = ev.ID
			}
			s.close()
			if ctx.Err() == nil {
				// The gateway went away (or ended the stream, as it does
				// when it shuts down): the next connection goes to the next
				// one, resuming after lastID.
				c.failover(s.gw, err)
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if fatal(err) {
			return err
		}
		wait := b.next()
		switch {
		case !down.IsZero():
			failed++
			log.Debug("reconnect failed; retrying", "path", path, "in", wait, "err", err)
		case errors.Is(err, io.EOF):
			log.Info("stream ended by the gateway; reconnecting", "path", path, "in", wait)
		default:
			log.Warn("stream lost; reconnecting", "path", path, "in", wait, "err", err)
		}
		if down.IsZero() {
			down = time.Now()
		}
		if sleep(ctx, wait) != nil {
			return ctx.Err()
		}
	}
}

// runnerRun is the state of one RunRunner call.
type runnerRun struct {
	c        *Client
	r        *Runner
	consumer string
	log      *slog.Logger
	seen     *jobSet
	workers  *workers       // run the jobs
	jobs     sync.WaitGroup // start reports and repeated results
}

// take starts a job unless it was taken before. A job delivered again
// after its result was posted gets the same result again (the kernel
// accepts a repeated identical result), so a lost answer cannot leave the
// step hanging, and the tool never runs twice for one job.
func (rr *runnerRun) take(ctx context.Context, j *job) {
	res, known := rr.seen.add(j.ID)
	if known {
		if res != nil {
			rr.jobs.Go(func() { rr.post(ctx, res) })
		}
		return
	}
	rr.workers.run(ctx, func() { rr.run(ctx, j) })
}

// run executes one job and reports it.
func (rr *runnerRun) run(ctx context.Context, j *job) {
	// Reporting the start is best effort, and only for a tool still running
	// after startReportDelay: a quick tool's result says when it started,
	// and skipping the call spares the gateway a request and a durable
	// write per job. The report runs alongside the tool and, sometimes, the
	// result: the kernel ignores a start that arrives after the step
	// finished. Only a retryable failure waits for it, because the step then
	// becomes pending again and a late start would be taken for the next
	// attempt's. A timer rather than a goroutine per job: most tools finish
	// first, and then stopping the timer is all there is to do.
	reported := make(chan struct{}) // closed once no report is under way
	rr.jobs.Add(1)
	report := time.AfterFunc(startReportDelay, func() {
		defer rr.jobs.Done()
		defer close(reported)
		body := map[string]string{"execution_id": j.ExecutionID, "runner_id": rr.r.RunnerID}
		err := rr.c.do(ctx, call{method: http.MethodPost, path: "/v0/runners/steps/" + url.PathEscape(j.StepID) + "/started", body: body, retry: true}, nil)
		if err != nil && ctx.Err() == nil {
			rr.log.Debug("step start not recorded", "job", j.ID, "tool", j.ToolID, "step", j.StepID, "err", err)
		}
	})
	res := &jobResult{JobID: j.ID, ExecutionID: j.ExecutionID, StepID: j.StepID, ConsumerID: rr.consumer, StartedAt: time.Now().UTC()}
	out, err := runTool(ctx, rr.r.tool(j), j.ToolID, j.Arguments)
	if report.Stop() {
		close(reported)
		rr.jobs.Done()
	}
	res.CompletedAt = time.Now().UTC()
	if err != nil && ctx.Err() != nil {
		// Shutting down: the tool was interrupted, not failed. Reporting
		// nothing lets the kernel hand the job to another runner once this
		// connection's grace period ends.
		rr.log.Info("job abandoned at shutdown", "job", j.ID, "tool", j.ToolID, "step", j.StepID, "err", err)
		return
	}
	if err != nil {
		res.Error, res.Retryable = truncate(err.Error(), maxErrorLen), IsRetryable(err)
	} else {
		res.Success, res.Data = true, out
	}
	if res.Retryable {
		<-reported
	}
	rr.seen.done(j.ID, res)
	rr.post(ctx, res)
}

// post sends a job's result, bounded in time even when ctx is done so that
// finished work is not lost at shutdown.
func (rr *runnerRun) post(ctx context.Context, res *jobResult) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resultTimeout)
	defer cancel()
	err := rr.c.do(ctx, call{method: http.MethodPost, path: "/v0/runners/" + url.PathEscape(rr.r.RunnerID) + "/results", body: res, retry: true}, nil)
	switch {
	case err == nil:
	case errors.Is(err, ErrConflict):
		// The step was settled meanwhile (cancelled, timed out, or our own
		// earlier post of this result): nothing is left to do.
		rr.log.Debug("job result not needed", "job", res.JobID, "err", err)
	default:
		rr.log.Error("job result not delivered", "job", res.JobID, "err", err)
	}
}

// runTool calls a tool, turning a missing tool, a panic or an unencodable
// result into an error, so that every job gets a result.
func runTool(ctx context.Context, fn ToolFunc, toolID string, args json.RawMessage) (data json.RawMessage, err error) {
	if fn == nil {
		return nil, fmt.Errorf("tool %q is not offered by this process", toolID)
	}
	if len(args) == 0 {
		args = json.RawMessage("null")
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("tool %q panicked: %v", toolID, p)
		}
	}()
	out, err := fn(ctx, args)
	if err != nil {
		return nil, err
	}
	if raw, ok := out.(json.RawMessage); ok {
		if !json.Valid(raw) {
			return nil, fmt.Errorf("tool %q returned invalid JSON", toolID)
		}
		return raw, nil
	}
	data, err = json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("tool %q: encode result: %w", toolID, err)
	}
	return data, nil
}

// jobSet remembers recent job ids, oldest evicted first. A job maps to nil
// while it runs and to its result once done.
type jobSet struct {
	mu    sync.Mutex
	max   int
	order *list.List // of job ids, oldest first
	jobs  map[string]*jobResult
}

func newJobSet(max int) *jobSet {
	return &jobSet{max: max, order: list.New(), jobs: map[string]*jobResult{}}
}

// add records id as running. If it was known, it returns its result (nil
// while it still runs) and true.
func (s *jobSet) add(id string) (*jobResult, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if res, ok := s.jobs[id]; ok {
		return res, true
	}
	s.jobs[id] = nil
	s.order.PushBack(id)
	for s.order.Len() > s.max {
		delete(s.jobs, s.order.Remove(s.order.Front()).(string))
	}
	return nil, false
}

func (s *jobSet) done(id string, res *jobResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.jobs[id]; ok {
		s.jobs[id] = res
	}
}

// maxErrorLen is the kernel's limit on an error text; a longer one would
// be refused, leaving the step unresolved.
const maxErrorLen = 4096

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// describe sends the runner's tool descriptions; a failure is logged and
// the next connection tries again.
func (rr *runnerRun) describe(ctx context.Context) {
	tools := make([]string, 0, len(rr.r.Tools))
	for t := range rr.r.Tools {
		tools = append(tools, t)
	}
	sort.Strings(tools)
	body := map[string]any{"tools": tools, "tool_info": rr.r.Info}
	if err := rr.c.do(ctx, call{method: http.MethodPost, path: "/v0/runners/" + url.PathEscape(rr.r.RunnerID) + "/capabilities", body: body, retry: true}, nil); err != nil && ctx.Err() == nil {
		rr.log.Warn("tool descriptions not sent", "err", err)
	}
}
