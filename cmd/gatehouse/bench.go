package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
	"github.com/gatehouse-dev/gatehouse/node"
)

// benchConfig is everything `bench` can be told.
type benchConfig struct {
	executions, concurrency int
	agents, runners         int
	repeat                  int
	sync                    string
	duration                time.Duration
	url, token, caFile      string
}

func (c *benchConfig) flags(fs *flag.FlagSet) {
	fs.IntVar(&c.executions, "executions", 20000, "executions to run")
	fs.IntVar(&c.concurrency, "concurrency", 32, "executions kept in flight")
	fs.IntVar(&c.agents, "agents", 4, "agent connections")
	fs.IntVar(&c.runners, "runners", 4, "runner connections (each runs one job at a time)")
	fs.IntVar(&c.repeat, "repeat", 1, "runs, each with a fresh gateway and data folder; with more than one, medians are reported")
	fs.StringVar(&c.sync, "sync", "always", "durability of the in-process gateway: always, batch or none")
	fs.DurationVar(&c.duration, "duration", 60*time.Second, "stop starting executions after this long")
	fs.StringVar(&c.url, "url", "", "bench the gateway at this URL instead of starting one in-process")
	fs.StringVar(&c.token, "token", "", "bearer token for --url")
	caFileFlag(fs, &c.caFile)
}

// The bench's names: one agent id shared by all agent connections, one tool
// offered by every runner.
const (
	benchAgent = "bench-agent"
	benchTool  = "bench.echo"
)

// execTimeout bounds one execution; a slower one counts as an error.
const execTimeout = 30 * time.Second

// bench measures end-to-end executions: create, the agent's invoke_tool
// intent, the job on a runner, its result pushed back to the agent, and the
// agent's complete intent. Each execution's latency runs from sending the
// create request to the answer of the agent's complete intent.
func bench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c benchConfig
	fs := newFlagSet("bench", stderr)
	c.flags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if c.executions <= 0 || c.concurrency <= 0 || c.agents <= 0 || c.runners <= 0 || c.duration <= 0 || c.repeat <= 0 {
		return errors.New("bench: --executions, --concurrency, --agents, --runners, --duration and --repeat must be positive")
	}
	fmt.Fprintf(stdout, "command:     gatehouse bench %s\n", strings.Join(args, " "))
	var runs []*benchResult
	for i := range c.repeat {
		rig, err := newBenchRig(ctx, c, stderr)
		if err != nil {
			return err
		}
		res := rig.run(ctx, c.executions, c.concurrency, c.duration)
		stats := rig.storeStats()
		if err := rig.close(); err != nil {
			return err
		}
		if c.repeat == 1 {
			fmt.Fprintf(stdout, "gateway:     %s\n", rig.where)
			fmt.Fprintf(stdout, "load:        %d executions, %d in flight, %d agents, %d runners\n", c.executions, c.concurrency, c.agents, c.runners)
			res.print(stdout)
			if stats != "" {
				fmt.Fprintf(stdout, "store:       %s\n", stats)
			}
		} else {
			fmt.Fprintf(stdout, "run %d/%d:     %s\n", i+1, c.repeat, res.summary())
		}
		if res.errors > 0 {
			return fmt.Errorf("bench: %d of %d executions failed (first: %v)", res.errors, res.started, res.firstErr)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		runs = append(runs, res)
	}
	if len(runs) > 1 {
		printMedians(stdout, runs)
	}
	return nil
}

// printMedians prints the median of each figure over runs: single runs of
// the same build vary by several percent, which one run hides.
func printMedians(w io.Writer, runs []*benchResult) {
	median := func(f func(*benchResult) float64) (med, lo, hi float64) {
		v := make([]float64, len(runs))
		for i, r := range runs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[(len(v)-1)/2], v[0], v[len(v)-1]
	}
	pct := func(p float64) func(*benchResult) float64 {
		return func(r *benchResult) float64 { return float64(r.percentile(p)) / float64(time.Millisecond) }
	}
	tp, tpLo, tpHi := median((*benchResult).rate)
	p50, _, _ := median(pct(50))
	p99, p99Lo, p99Hi := median(pct(99))
	fmt.Fprintf(w, "median:      %.0f executions/s (%.0f-%.0f), p50 %.2fms, p99 %.2fms (%.2f-%.2f) over %d runs\n",
		tp, tpLo, tpHi, p50, p99, p99Lo, p99Hi, len(runs))
}

// benchRig is a gateway (in-process unless --url) with agents and runners
// connected to it over loopback HTTP and SSE, all served by package client,
// the SDK users run.
type benchRig struct {
	where   string
	cl      *client.Client
	node    *node.Node // nil with --url
	dir     string
	tracker *tracker
	stop    context.CancelFunc
	roles   sync.WaitGroup
	roleErr chan error
}

func newBenchRig(ctx context.Context, c benchConfig, stderr io.Writer) (*benchRig, error) {
	log, err := newLogger(stderr, "warn", "text")
	if err != nil {
		return nil, err
	}
	r := &benchRig{tracker: newTracker(), roleErr: make(chan error, c.agents+c.runners)}
	url := c.url
	if url == "" {
		var sc config
		sc.flags(flag.NewFlagSet("serve", flag.ContinueOnError)) // the serve defaults
		if r.dir, err = os.MkdirTemp("", "gatehouse-bench-"); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		sc.addr, sc.data, sc.sync, sc.token = "127.0.0.1:0", r.dir, c.sync, c.token
		if r.node, err = start(ctx, sc, nil, log); err != nil {
			_ = os.RemoveAll(r.dir)
			return nil, err
		}
		url = "http://" + r.node.Addr().String()
		r.where = fmt.Sprintf("in-process at %s, sync=%s, data in %s", url, c.sync, r.dir)
	} else {
		r.where = url + " (external)"
	}
	tc, err := clientTLS(c.caFile)
	if err != nil {
		_ = r.close()
		return nil, fmt.Errorf("bench: %w", err)
	}
	// Streams that drop are opened again soon: a bench run is short.
	r.cl, err = client.New(client.Options{BaseURL: url, Token: c.token, TLSConfig: tc, Logger: log,
		MinBackoff: 100 * time.Millisecond, MaxBackoff: 2 * time.Second})
	if err != nil {
		_ = r.close()
		return nil, fmt.Errorf("bench: %w", err)
	}
	roleCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	r.stop = stop
	// Consumer ids are fresh each run, so that an external gateway does not
	// hand this run what an earlier one left behind.
	consumers := map[string]bool{}
	for i := range c.runners {
		run := &client.Runner{
			RunnerID:   fmt.Sprintf("bench-runner-%d", i+1),
			ConsumerID: fmt.Sprintf("bench-runner-%d-%d", i+1, time.Now().UnixNano()),
			Tools: map[string]client.ToolFunc{
				benchTool: func(_ context.Context, args json.RawMessage) (any, error) { return args, nil },
			},
		}
		consumers["runner/"+run.RunnerID+"/"+run.ConsumerID] = true
		r.role(func() error { return r.cl.RunRunner(roleCtx, run) })
	}
	for i := range c.agents {
		a := &client.Agent{
			AgentID:    benchAgent,
			ConsumerID: fmt.Sprintf("%s-%d-%d", benchAgent, i+1, time.Now().UnixNano()),
			// A wait never outlasts the execution it serves.
			WaitTimeout: execTimeout,
			Handle: func(ctx context.Context, t *client.Task) (any, error) {
				out, err := t.Invoke(ctx, benchTool, t.Input(), true)
				if err != nil {
					// Reported before the fail intent, so that the tracker
					// keeps why rather than that the intent was accepted.
					r.tracker.report(t.ID(), err)
				}
				return out, err
			},
			Finished: func(t *client.Task, err error) { r.tracker.report(t.ID(), err) },
		}
		consumers["agent/"+a.AgentID+"/"+a.ConsumerID] = true
		r.role(func() error { return r.cl.RunAgent(roleCtx, a) })
	}
	if err := r.waitOnline(ctx, consumers); err != nil {
		_ = r.close()
		return nil, err
	}
	return r, nil
}

// role runs one agent or runner until the rig closes.
func (r *benchRig) role(f func() error) {
	r.roles.Go(func() {
		if err := f(); err != nil && !errors.Is(err, context.Canceled) {
			r.roleErr <- err
		}
	})
}

// waitOnline waits until every agent and runner connection is attached:
// executions created before their agent is connected would wait for it.
func (r *benchRig) waitOnline(ctx context.Context, want map[string]bool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		n, err := r.onlinePeers(ctx, want)
		if err == nil && n == len(want) {
			return nil
		}
		if untrustedCert(err) {
			return fmt.Errorf("bench: %w", explainTLS(err))
		}
		select {
		case err := <-r.roleErr:
			return fmt.Errorf("bench: %w", explainTLS(err))
		case <-ctx.Done():
			return fmt.Errorf("bench: %d of %d agents and runners connected (%v): %w", n, len(want), err, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// onlinePeers counts the consumers of want the gateway lists as online.
func (r *benchRig) onlinePeers(ctx context.Context, want map[string]bool) (int, error) {
	n := 0
	o := client.PeerListOptions{Limit: 1000}
	for {
		page, err := r.cl.ListPeers(ctx, o)
		if err != nil {
			return 0, err
		}
		for _, p := range page.Peers {
			if p.State == "online" && want[p.Role+"/"+p.ID+"/"+p.ConsumerID] {
				n++
			}
		}
		if page.NextCursor == "" {
			return n, nil
		}
		o.Cursor = page.NextCursor
	}
}

// benchResult is what one run measured.
type benchResult struct {
	started, errors int
	firstErr        error
	elapsed         time.Duration
	latencies       []time.Duration // of completed executions, sorted
}

// run executes up to n executions, concurrency at a time, starting new ones
// only within limit.
func (r *benchRig) run(ctx context.Context, n, concurrency int, limit time.Duration) *benchResult {
	var (
		next      atomic.Int64
		mu        sync.Mutex
		res       benchResult
		workers   sync.WaitGroup
		t0        = time.Now()
		stopAfter = t0.Add(limit)
	)
	record := func(d time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		res.started++
		if err != nil {
			res.errors++
			if res.firstErr == nil {
				res.firstErr = err
			}
			return
		}
		res.latencies = append(res.latencies, d)
	}
	for range concurrency {
		workers.Go(func() {
			for i := next.Add(1); i <= int64(n) && ctx.Err() == nil && time.Now().Before(stopAfter); i = next.Add(1) {
				record(r.one(ctx, int(i)))
			}
		})
	}
	workers.Wait()
	res.elapsed = time.Since(t0)
	slices.Sort(res.latencies)
	return &res
}

// one runs execution number i and returns its latency.
func (r *benchRig) one(ctx context.Context, i int) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, execTimeout)
	defer cancel()
	start := time.Now()
	ex, err := r.cl.CreateExecution(ctx, client.CreateRequest{AgentID: benchAgent,
		Input: json.RawMessage(`{"n":` + strconv.Itoa(i) + `}`)})
	if err != nil {
		return 0, err
	}
	id := ex.ID
	e := r.tracker.get(id)
	defer r.tracker.drop(id)
	select {
	case err := <-e.done:
		if err != nil {
			return 0, fmt.Errorf("execution %s: %w", id, err)
		}
		return time.Since(start), nil
	case <-ctx.Done():
		return 0, fmt.Errorf("execution %s: %w", id, ctx.Err())
	}
}

func (r *benchRig) storeStats() string {
	if r.node == nil {
		return ""
	}
	s := r.node.Store.Stats()
	if s.Commits == 0 {
		return ""
	}
	return fmt.Sprintf("%d writes in %d commits (%.1f per commit), %d fsyncs", s.Writes, s.Commits, float64(s.Writes)/float64(s.Commits), s.Syncs)
}

// close stops the roles, then the in-process gateway, and removes its data.
func (r *benchRig) close() error {
	if r.stop != nil {
		r.stop()
	}
	r.roles.Wait()
	if r.cl != nil {
		// The gateway's shutdown waits for kept-alive connections.
		r.cl.CloseIdleConnections()
	}
	var err error
	if r.node != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = r.node.Close(ctx)
	}
	if r.dir != "" {
		if rerr := os.RemoveAll(r.dir); err == nil {
			err = rerr
		}
	}
	return err
}

// percentile returns the p-th percentile (0 < p <= 100) of the sorted
// latencies, by the nearest-rank method.
func (b *benchResult) percentile(p float64) time.Duration {
	if len(b.latencies) == 0 {
		return 0
	}
	i := int(float64(len(b.latencies))*p/100+0.999999) - 1
	return b.latencies[min(max(i, 0), len(b.latencies)-1)]
}

// rate is completed executions per second of wall time.
func (b *benchResult) rate() float64 {
	if b.elapsed <= 0 {
		return 0
	}
	return float64(len(b.latencies)) / b.elapsed.Seconds()
}

// summary is one line of the figures, for a run among several.
func (b *benchResult) summary() string {
	return fmt.Sprintf("%.0f executions/s, p50 %s, p99 %s, max %s", b.rate(), ms(b.percentile(50)), ms(b.percentile(99)), ms(b.percentile(100)))
}

// ms formats d in milliseconds, as the bench prints latencies.
func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }

func (b *benchResult) print(w io.Writer) {
	fmt.Fprintf(w, "completed:   %d in %s (%d errors)\n", len(b.latencies), b.elapsed.Round(time.Millisecond), b.errors)
	fmt.Fprintf(w, "throughput:  %.0f executions/s\n", b.rate())
	fmt.Fprintf(w, "latency:     p50 %s  p90 %s  p99 %s  max %s  (create sent -> complete intent answered)\n",
		ms(b.percentile(50)), ms(b.percentile(90)), ms(b.percentile(99)), ms(b.percentile(100)))
}

// tracker pairs each execution's create with the report of its end, which
// may come first.
type tracker struct {
	mu sync.Mutex
	m  map[string]*tracked
}

// tracked is one execution's end: nil when its complete intent was
// accepted, else why it failed.
type tracked struct {
	done chan error // holds the first report
}

func newTracker() *tracker { return &tracker{m: map[string]*tracked{}} }

func (t *tracker) get(id string) *tracked {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[id]
	if e == nil {
		e = &tracked{done: make(chan error, 1)}
		t.m[id] = e
	}
	return e
}

// report records the end of execution id. Only the first report counts:
// the agent's Handle reports why a tool call failed, and Finished then
// reports that the fail intent was accepted.
func (t *tracker) report(id string, err error) {
	select {
	case t.get(id).done <- err:
	default:
	}
}

func (t *tracker) drop(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, id)
}
