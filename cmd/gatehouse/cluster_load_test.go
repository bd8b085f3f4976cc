package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
)

// loadResult is what these tests read of kbench's summary.
type loadResult struct {
	Executions  int            `json:"executions"`
	OK          int            `json:"ok"`
	ExecPerS    float64        `json:"exec_per_s"`
	P99         float64        `json:"p99_ms"`
	FailReasons map[string]int `json:"fail_reasons"`
	Counters    map[string]int64
	Windows     []struct {
		StartS float64 `json:"start_s"`
		OK     int     `json:"ok"`
	} `json:"windows"`
}

// loadWindow is kbench's window: a stall is measured in these.
const loadWindow = 250 * time.Millisecond

// stalls returns each run of windows in which no execution completed,
// longest first.
func (r loadResult) stalls() []time.Duration {
	var out []time.Duration
	run := 0
	for i, w := range r.Windows {
		if w.OK == 0 {
			run++
		}
		if (w.OK != 0 || i == len(r.Windows)-1) && run > 0 {
			out = append(out, time.Duration(run)*loadWindow)
			run = 0
		}
	}
	slices.SortFunc(out, func(a, b time.Duration) int { return cmp.Compare(b, a) })
	return out
}

// longestStall is the longest run of windows in which no execution
// completed.
func (r loadResult) longestStall() time.Duration {
	if s := r.stalls(); len(s) > 0 {
		return s[0]
	}
	return 0
}

// loadCap bounds a load of startLoad: its test stops it long before.
const loadCap = 3 * time.Minute

// startLoad builds bench/kbench and runs it against every node, as stock
// seed 004 clients: SSE agents and runners spread over the nodes, remote
// tools, a stream per execution. stop ends the load (kbench starts no
// execution after SIGINT and finishes those in flight) and returns its
// summary, so that a test loads the nodes for as long as its faults take.
func startLoad(t *testing.T, nodes []*natsNode) (stop func() loadResult) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kbench")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/gatehouse-dev/gatehouse/bench/kbench").CombinedOutput(); err != nil {
		t.Fatalf("build kbench: %v\n%s", err, out)
	}
	var us []string
	for _, n := range nodes {
		us = append(us, n.base)
	}
	var out bytes.Buffer
	logs := &syncbuf.Buffer{}
	cmd := exec.Command(bin, "-url", strings.Join(us, ","), "-agents", "3", "-runners", "3", "-remote", "-tools", "1",
		"-concurrency", "8", "-duration", loadCap.String(), "-window", loadWindow.String(), "-exec-timeout", "60s",
		"-timeout", (loadCap + 2*time.Minute).String(), "-max-err-logs", "-1", "-q")
	cmd.Stdout, cmd.Stderr = &out, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		done <- nil
	})
	return func() loadResult {
		t.Helper()
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatalf("stop kbench: %v\n%s", err, logs)
		}
		select {
		case err := <-done:
			done <- err
			if err != nil {
				t.Fatalf("kbench: %v\n%s\n%s", err, out.String(), logs)
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("kbench did not end\n%s", logs)
		}
		var r loadResult
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatalf("kbench output %q: %v", out.String(), err)
		}
		return r
	}
}

// checkLoad fails unless every execution kbench had acknowledged
// completed.
func checkLoad(t *testing.T, r loadResult) {
	t.Helper()
	if r.Executions == 0 || r.OK != r.Executions || len(r.FailReasons) > 0 {
		t.Fatalf("%d executions, %d completed; failures %v; counters %v", r.Executions, r.OK, r.FailReasons, r.Counters)
	}
}

// rejoined waits until node i, started again, answers as a member.
func rejoined(t *testing.T, nodes []*natsNode, i int) {
	t.Helper()
	eventually.Check(t, func() error {
		st, err := nodes[i].member()
		if err != nil {
			return err
		}
		if st.Role == "" {
			return fmt.Errorf("%s has no role yet", nodes[i].name)
		}
		return nil
	})
}

// clusterKills is how many nodes TestClusterNodeKillsUnderLoad kills:
// GATEHOUSE_CLUSTER_KILLS, or 2 (20 for the figure, see
// docs/cluster.md).
func clusterKills(t *testing.T) int {
	if v := os.Getenv("GATEHOUSE_CLUSTER_KILLS"); v != "" {
		k, err := strconv.Atoi(v)
		if err != nil || k < 1 || k > 100 {
			t.Fatalf("GATEHOUSE_CLUSTER_KILLS=%q: want 1 to 100", v)
		}
		return k
	}
	return 2
}

// TestClusterNodeKillsUnderLoad runs kbench against three members, with
// raft elections after 1 to 2 s of silence, and kill -9s a node every few
// seconds, the leader every other time, starting it again on its data
// folder: every execution kbench had acknowledged completes. The longest
// stretch without a completed execution is logged: the figure of new work
// flowing again after a kill.
func TestClusterNodeKillsUnderLoad(t *testing.T) {
	t.Parallel()
	kills := clusterKills(t)
	routes := []string{loopback.FreeAddr(t), loopback.FreeAddr(t), loopback.FreeAddr(t)}
	nodes := make([]*natsNode, 3)
	for i := range nodes {
		nodes[i] = newNATSNode(t, fmt.Sprintf("n%d", i+1), "--cluster-name", "gh", "--cluster-listen", routes[i],
			"--cluster-peers", strings.Join(routes, ","), "--cluster-election-timeout", "1s")
	}
	startAll(t, nodes...)
	leaderOf(t, nodes)
	// Each kill's node is down 2 s, and the load runs a few seconds
	// between its return and the next kill.
	const every = 8 * time.Second
	stop := startLoad(t, nodes)
	time.Sleep(3 * time.Second)
	for k := range kills {
		start := time.Now()
		lead := leaderOf(t, nodes)
		victim := lead
		if k%2 == 1 {
			victim = (lead + 1) % 3
		}
		nodes[victim].kill()
		t.Logf("kill %d: %s (%s)", k+1, nodes[victim].name, map[bool]string{true: "leader", false: "follower"}[victim == lead])
		time.Sleep(2 * time.Second)
		nodes[victim].start(t)
		rejoined(t, nodes, victim)
		time.Sleep(time.Until(start.Add(every)))
	}
	r := stop()
	checkLoad(t, r)
	t.Logf("%d kills: %d executions, all completed, %.0f/s, p99 %.0f ms; stalls (no execution completed), longest first: %v",
		kills, r.Executions, r.ExecPerS, r.P99, r.stalls())
}

// TestClusterRollingRestartUnderLoad stops each member in turn with
// SIGTERM, as an upgrade does, and starts it again on its data folder
// while kbench runs against all three: every acknowledged execution
// completes.
func TestClusterRollingRestartUnderLoad(t *testing.T) {
	t.Parallel()
	nodes := kernelCluster(t)
	stop := startLoad(t, nodes)
	time.Sleep(3 * time.Second)
	for i, n := range nodes {
		if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := n.cmd.Wait(); err != nil {
			t.Fatalf("%s did not stop cleanly: %v\n%s", n.name, err, n.logs)
		}
		n.start(t)
		rejoined(t, nodes, i)
	}
	// Work flows through the last one restarted before the load ends.
	time.Sleep(2 * time.Second)
	r := stop()
	checkLoad(t, r)
	t.Logf("rolling restart: %d executions, all completed, %.0f/s; longest stall %s", r.Executions, r.ExecPerS, r.longestStall())
}
