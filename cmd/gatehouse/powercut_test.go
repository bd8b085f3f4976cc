package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/loopback"
	"github.com/gatehouse-dev/gatehouse/store/cutfs"
)

// The power-cut cycles run the real gateway (`serve --sync always`) in a
// child process with its data folder on a power-cut file system
// (store/cutfs), load it from clients in this process, cut the power at a
// random moment, kill what is left of the process, and start it again on
// what the disk holds. Every write acknowledged before the cut must be
// there, and the folder must open every time. A few cycles run in the
// suite; GATEHOUSE_POWERCUT_CYCLES=100 runs more and logs the figures, and
// GATEHOUSE_POWERCUT_PRELOAD=10000 stores that many executions first, each
// cancelled once created, for the restart time of a fuller folder
// (GATEHOUSE_POWERCUT_PRELOAD_LIVE=1 leaves them pending instead, for the
// restart time with that many live executions to replay; at 100,000, the
// bound of live executions, the load then creates nothing).

// cutLedger is what the gateway acknowledged before a cut began; acks
// that come once it has begun (from the process running on, a ghost) are
// not recorded, since the disk may not hold them.
type cutLedger struct {
	mu      sync.Mutex
	cutting bool
	execs   map[string]int    // execution -> signals acknowledged
	notes   map[string]string // line -> note path
	session map[string]bool   // runtime API sessions of acknowledged appends
	turns   map[string]string // AAP session -> the user's words of its answered turn
	// actions are the prompts raised, by id; jobs the direct executions
	// whose step was read completed, and jobExecs every direct execution
	// of gatehouse.echo created; channels the two human channels, by
	// channel id (see powercut_facts_test.go).
	actions  map[string]*actionFact
	asked    map[string]bool // prompts an answer was sent to, acknowledged or not
	jobs     map[string]jobFact
	jobExecs map[string]bool
	channels map[string]*channelFact
}

func newCutLedger() *cutLedger {
	return &cutLedger{execs: map[string]int{}, notes: map[string]string{}, session: map[string]bool{}, turns: map[string]string{},
		actions: map[string]*actionFact{}, asked: map[string]bool{}, jobs: map[string]jobFact{}, jobExecs: map[string]bool{},
		channels: map[string]*channelFact{wsChannelID: newChannelFact(), sseChannelID: newChannelFact()}}
}

// record runs fn under the ledger's lock unless the cut has begun.
func (l *cutLedger) record(fn func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.cutting {
		fn()
	}
}

func (l *cutLedger) size() int {
	return l.count(func() int { return len(l.execs) + len(l.notes) + len(l.turns) + len(l.actions) + len(l.jobs) })
}

// count returns what n counts, under the ledger's lock.
func (l *cutLedger) count(n func() int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return n()
}

// restart records a restart that took d, of child c; a slow one is logged
// with what the child logged.
func (f *cutFigures) restart(t *testing.T, d time.Duration, c *child) {
	f.restarts = append(f.restarts, d)
	if d > 5*time.Second {
		t.Logf("restart %d took %v, from %s:\n%s", len(f.restarts), d.Round(time.Millisecond),
			time.Now().Add(-d).UTC().Format("15:04:05.000"), c.logs)
	}
}

// cutFigures are a run's counts.
type cutFigures struct {
	cycles, lost, corrupted int
	restarts                []time.Duration
	signals                 int
	// answered and pending count the prompts acknowledged with and without
	// an answer acknowledged; jobs the steps read completed; peerAcks the
	// channels' acknowledgements answered.
	answered, pending, jobs, peerAcks int
}

func TestPowerCutFSGatewayLosesNothingAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	if err := cutfs.Supported(); err != nil {
		t.Skipf("no power-cut file system here (%v): run as root on a machine with /dev/fuse", err)
	}
	cycles := 3
	if n, err := strconv.Atoi(os.Getenv("GATEHOUSE_POWERCUT_CYCLES")); err == nil && n > 0 {
		cycles = n
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("%d cycles, seed %d", cycles, seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	backing := t.TempDir()
	addr := loopback.FreeAddr(t)
	flags := cutServeFlags(t)
	ledger := newCutLedger()
	var fig cutFigures
	client := &http.Client{Timeout: 10 * time.Second}
	// Streams last as long as their reader wants.
	streams := &http.Client{}
	if n, err := strconv.Atoi(os.Getenv("GATEHOUSE_POWERCUT_PRELOAD")); err == nil && n > 0 {
		preload(t, client, backing, addr, flags, ledger, n, os.Getenv("GATEHOUSE_POWERCUT_PRELOAD_LIVE") == "1")
	}
	for cycle := range cycles {
		m := cutfs.MountForTest(t, backing, cutfs.Options{})
		c := newChild(addr, m.Dir(), flags...)
		began := time.Now()
		c.start(t) // a folder that does not open fails here
		if cycle > 0 {
			fig.restart(t, time.Since(began), c)
		}
		if cycle == 0 {
			registerChannels(t, streams, c.base)
		}
		// Everything acknowledged so far is there: checked after the
		// first cut, every tenth, the last, and after the end, since each
		// check reads every execution acknowledged.
		if cycle == 1 || cycle > 0 && (cycle%10 == 0 || cycle == cycles-1) {
			checkLedger(t, client, c.base, ledger, &fig)
			checkFacts(t, client, streams, c.base, ledger, &fig)
		}
		ledger.mu.Lock()
		ledger.cutting = false
		ledger.mu.Unlock()
		loadAndCut(t, client, streams, c, m, ledger, cycle, rng)
		fig.cycles++
		if cycle%10 == 9 {
			t.Logf("%d cuts: %s", cycle+1, folderFigures(backing))
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// The folder after the last cut opens, with everything.
	m := cutfs.MountForTest(t, backing, cutfs.Options{})
	c := newChild(addr, m.Dir(), flags...)
	began := time.Now()
	c.start(t)
	fig.restart(t, time.Since(began), c)
	checkLedger(t, client, c.base, ledger, &fig)
	checkFacts(t, client, streams, c.base, ledger, &fig)
	ended, completed := awaitJobsEnd(t, client, c.base, ledger)
	c.stop()

	slices.Sort(fig.restarts)
	t.Logf("restarts to /v0/ready: p50 %v, p90 %v, max %v", fig.restarts[len(fig.restarts)/2].Round(time.Millisecond),
		fig.restarts[len(fig.restarts)*9/10].Round(time.Millisecond), fig.restarts[len(fig.restarts)-1].Round(time.Millisecond))
	t.Logf("%d cuts: %d executions (%d signals), %d memory appends, %d AAP turns, %d prompts (%d answers), %d runner results, %d channel acks acknowledged; "+
		"%d lost, %d corrupted, 0 failed starts; %d tool calls ended after the last restart, %d completed; restart p50 %v, max %v",
		fig.cycles, len(ledger.execs), fig.signals, len(ledger.notes), len(ledger.turns), fig.answered+fig.pending, fig.answered, fig.jobs, fig.peerAcks,
		fig.lost, fig.corrupted, ended, completed,
		fig.restarts[len(fig.restarts)/2].Round(time.Millisecond), fig.restarts[len(fig.restarts)-1].Round(time.Millisecond))
	if fig.lost > 0 || fig.corrupted > 0 {
		t.Errorf("%d acknowledged writes lost, %d corrupted", fig.lost, fig.corrupted)
	}
}

// preload stores n executions in the folder backing, through a gateway
// with flags on a power-cut file system, closed cleanly after, and records
// them. Each is cancelled once created unless live is set.
func preload(t *testing.T, client *http.Client, backing, addr string, flags []string, l *cutLedger, n int, live bool) {
	t.Helper()
	m := cutfs.MountForTest(t, backing, cutfs.Options{})
	c := newChild(addr, m.Dir(), flags...)
	c.start(t)
	began := time.Now()
	var wg sync.WaitGroup
	var next sync.Mutex
	i := 0
	for w := range 8 {
		wg.Go(func() {
			for {
				next.Lock()
				i++
				mine := i
				next.Unlock()
				if mine > n {
					return
				}
				status, ex, err := post(context.Background(), client, c.base+"/v0/executions", map[string]any{"agent_id": fmt.Sprintf("pre-%d", w), "input": mine})
				if err != nil || status != 201 {
					t.Errorf("preload %d: %d %v", mine, status, err)
					return
				}
				id, _ := ex["id"].(string)
				if !live {
					if status, _, err := post(context.Background(), client, c.base+"/v0/executions/"+id+"/cancel", nil); err != nil || status != 200 {
						t.Errorf("preload %d: cancel: %d %v", mine, status, err)
						return
					}
				}
				l.record(func() { l.execs[id] = 0 })
			}
		})
	}
	wg.Wait()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("preloaded %d executions in %v", n, time.Since(began).Round(time.Second))
}

// loadAndCut loads the gateway c, on mount m, with executions and their
// signals, memory appends, AAP turns answered by the example agent, tool
// calls run by two runners, prompts answered over HTTP and over the
// WebSocket channel, and the two channels acknowledging what they are
// sent; it cuts the power at a random moment, and kills the process.
func loadAndCut(t *testing.T, client, streams *http.Client, c *child, m *cutfs.FS, l *cutLedger, cycle int, rng *rand.Rand) {
	t.Helper()
	// The connections kept alive to the last process are dead.
	client.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() {
		_ = agentCmd(ctx, []string{"--url", c.base, "--name", "example", "--log-level", "error"}, io.Discard, io.Discard)
	})
	startRunners(ctx, &wg, c.base)
	waitAgentOnline(t, client, c.base)
	wsRand, sseRand := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())), rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
	wg.Go(func() { loadWSChannel(ctx, t, c.base, l, wsRand) })
	wg.Go(func() { loadSSEChannel(ctx, t, client, streams, c.base, l, sseRand) })
	wg.Go(func() { loadPrompts(ctx, client, streams, c.base, l, fmt.Sprintf("c%d-p", cycle)) })
	for w := range 2 {
		wg.Go(func() { loadJobs(ctx, client, streams, c.base, l, fmt.Sprintf("c%d-j%d", cycle, w)) })
	}
	for w := range 2 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				words := fmt.Sprintf("hello c%d-w%d-%d", cycle, w, i)
				status, out, err := send(ctx, client, http.MethodPut, c.base+"/aap/v1/session", map[string]any{
					"agent": map[string]any{"name": "example"}, "messages": []any{map[string]any{"role": "user", "content": words}}})
				if err != nil || status != 201 {
					continue
				}
				id, _ := out["sessionId"].(string)
				l.record(func() { l.turns[id] = words })
			}
		})
	}
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				status, ex, err := post(ctx, client, c.base+"/v0/executions", map[string]any{"agent_id": fmt.Sprintf("cut-%d", w), "input": i})
				if err != nil || status != 201 {
					continue
				}
				id, _ := ex["id"].(string)
				l.record(func() { l.execs[id] = 0 })
				for range 2 {
					status, _, err := post(ctx, client, c.base+"/v0/executions/"+id+"/signal", map[string]any{"signal_type": "tick"})
					if err != nil || status != 200 {
						break
					}
					l.record(func() { l.execs[id]++ })
				}
			}
		})
	}
	for w := range 2 {
		wg.Go(func() {
			path := fmt.Sprintf("/cut/c%d-w%d.md", cycle, w)
			for i := 0; ctx.Err() == nil; i++ {
				line := fmt.Sprintf("c%d-w%d-line%d", cycle, w, i)
				status, out, err := post(ctx, client, c.base+"/runtime/v1/tools/memory_append", map[string]any{
					"input": map[string]any{"path": path, "content": line}, "wait": true})
				if err != nil || status != 200 || out["status"] != "completed" {
					continue
				}
				sess, _ := out["sessionId"].(string)
				l.record(func() { l.notes[line] = path; l.session[sess] = true })
			}
		})
	}
	// A random moment: after some acknowledged writes, or some time, and
	// once a turn was answered (a turn takes a few hundred milliseconds),
	// or at the latest after 10 s.
	want := l.size() + 5 + rng.IntN(80)
	soon := time.Now().Add(time.Duration(200+rng.IntN(1800)) * time.Millisecond)
	latest := time.Now().Add(10 * time.Second)
	turns := l.count(func() int { return len(l.turns) })
	for time.Now().Before(latest) {
		if (l.size() >= want || time.Now().After(soon)) && l.count(func() int { return len(l.turns) }) > turns {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	l.mu.Lock()
	l.cutting = true
	l.mu.Unlock()
	// Half the cuts tear the last write not yet durable (Badger's memory
	// table, a table being written, the MANIFEST) at a page boundary.
	if _, err := m.Cut(cutfs.CutOptions{Tear: rng.IntN(2) == 0, Seed: rng.Uint64()}); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
	cancel()
	wg.Wait()
}

// folderFigures sums up the data folder dir: the bytes it takes on disk,
// and the journal's segments.
func folderFigures(dir string) string {
	var total int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					total += st.Blocks * 512 // allocated: Badger's logs are sparse
				}
			}
		}
		return nil
	})
	segs, _ := filepath.Glob(filepath.Join(dir, "journal", "*"))
	tables, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
	return fmt.Sprintf("the folder holds %.1f MiB, %d journal files, %d tables", float64(total)/(1<<20), len(segs), len(tables))
}

// waitAgentOnline waits for the example agent to be online on the gateway
// at base.
func waitAgentOnline(t *testing.T, client *http.Client, base string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := client.Get(base + "/aap/v1/meta")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(body), `"online":true`) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the example agent did not come online")
		}
	}
}

// checkLedger checks that every acknowledged write is there, counting
// the lost and the corrupted.
func checkLedger(t *testing.T, client *http.Client, base string, l *cutLedger, fig *cutFigures) {
	t.Helper()
	fig.signals = 0
	for id, signals := range l.execs {
		fig.signals += signals
		resp, err := client.Get(base + "/v0/executions/" + id + "/events?limit=1000")
		if err != nil {
			t.Fatal(err)
		}
		var page struct {
			Events []struct {
				Type     string `json:"type"`
				Sequence int    `json:"sequence"`
			} `json:"events"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		switch {
		case resp.StatusCode == 404:
			fig.lost++
			t.Errorf("execution %s, acknowledged, is gone", id)
			continue
		case err != nil || resp.StatusCode != 200 || len(page.Events) == 0:
			fig.corrupted++
			t.Errorf("execution %s: status %d, %d events, %v", id, resp.StatusCode, len(page.Events), err)
			continue
		}
		got := 0
		for i, e := range page.Events {
			if e.Sequence != i+1 {
				fig.corrupted++
				t.Errorf("execution %s: event %d has sequence %d", id, i+1, e.Sequence)
				break
			}
			if e.Type == "signal.received" {
				got++
			}
		}
		if page.Events[0].Type != "execution.created" || got < signals {
			fig.lost++
			t.Errorf("execution %s: %d of %d acknowledged signals", id, got, signals)
		}
	}
	paths := map[string]string{}
	for _, p := range l.notes {
		if _, ok := paths[p]; ok {
			continue
		}
		status, out, err := post(context.Background(), client, base+"/runtime/v1/tools/memory_read", map[string]any{
			"input": map[string]any{"path": p}, "wait": true})
		if err != nil || status != 200 || out["status"] != "completed" {
			fig.lost++
			t.Errorf("note %s: %d %v %v", p, status, out, err)
			paths[p] = ""
			continue
		}
		output, _ := out["output"].(map[string]any)
		content, _ := output["content"].(string)
		paths[p] = "\n" + content + "\n"
	}
	for line, p := range l.notes {
		if !strings.Contains(paths[p], "\n"+line+"\n") {
			fig.lost++
			t.Errorf("acknowledged append %q to %s is gone", line, p)
		}
	}
	for id, words := range l.turns {
		resp, err := client.Get(base + "/aap/v1/session/" + id + "?history=full")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), words) || !strings.Contains(string(body), `"role":"assistant"`) {
			fig.lost++
			t.Errorf("AAP session %s, its turn answered: %d %.300s", id, resp.StatusCode, body)
			continue
		}
		resp, err = client.Get(base + "/agent-runtime/sessions/" + id + "/events?limit=1000")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), `"turn.completed"`) {
			fig.lost++
			t.Errorf("AAP session %s: its events lack turn.completed: %d %.300s", id, resp.StatusCode, body)
		}
	}
	for sess := range l.session {
		resp, err := client.Get(base + "/runtime/v1/sessions/" + sess)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			fig.lost++
			t.Errorf("session %s of an acknowledged append: %d", sess, resp.StatusCode)
		}
	}
}
