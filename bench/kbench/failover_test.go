package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// TestMain lets the test binary run as kbench, so that a test drives it
// out of process, as a benchmark does; kbench itself imports nothing of
// Gatehouse, its tests stand up real Gatehouse nodes.
func TestMain(m *testing.M) {
	if os.Getenv("KBENCH_TEST_AS_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// TestKbenchSpreadsOverURLsAndFailsOver runs kbench with two URLs, a
// gateway at the first and nothing yet at the second: the actors whose
// turn is the second move to the first. Mid-run the gateway stops and comes
// back, on the same data folder, at the second address, as another node of
// a cluster would take over: every actor moves there, resuming its stream,
// and every execution of the run completes.
func TestKbenchSpreadsOverURLsAndFailsOver(t *testing.T) {
	o := node.Options{Data: t.TempDir()}
	first := nodetest.Start(t, o)
	second := loopback.FreeAddr(t)
	var out bytes.Buffer
	var logs syncbuf.Buffer
	cmd := exec.Command(os.Args[0], "-url", first.URL+",http://"+second, "-agents", "2", "-runners", "2",
		"-remote", "-tools", "1", "-concurrency", "4", "-duration", "4s", "-exec-timeout", "20s", "-timeout", "50s",
		"-max-err-logs", "-1", "-q")
	cmd.Env = append(os.Environ(), "KBENCH_TEST_AS_MAIN=1")
	cmd.Stdout, cmd.Stderr = &out, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	eventually.Check(t, func() error {
		if c := first.Node.Kernel.Stats().Completed; c < 20 {
			return fmt.Errorf("%d executions completed", c)
		}
		return nil
	})
	first.Stop()
	o.Addr = second
	nodetest.Start(t, o)

	select {
	case <-done:
		if waitErr != nil {
			t.Fatalf("kbench: %v\n%s\n%s", waitErr, out.String(), logs.String())
		}
	case <-time.After(45 * time.Second):
		t.Fatalf("kbench did not end\n%s", logs.String())
	}
	var s summary
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		t.Fatalf("kbench output %q: %v", out.String(), err)
	}
	moved := s.Counters["agent_failovers"] + s.Counters["runner_failovers"] + s.Counters["client_failovers"]
	if s.Executions == 0 || s.OK != s.Executions || moved == 0 {
		t.Fatalf("%d executions, %d ok, %d failovers; fail reasons %v, counters %v\n%s", s.Executions, s.OK, moved, s.FailReasons, s.Counters, logs.String())
	}
	t.Logf("%d executions, all completed, %d failovers", s.Executions, moved)
}

// TestKbenchRefusesAURLOffLoopback: every -url must be loopback.
func TestKbenchRefusesAURLOffLoopback(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-url", "http://127.0.0.1:1,http://192.0.2.1:8080", "-timeout", "5s")
	cmd.Env = append(os.Environ(), "KBENCH_TEST_AS_MAIN=1")
	outb, err := cmd.CombinedOutput()
	if err == nil || !bytes.Contains(outb, []byte("non-loopback")) {
		t.Fatalf("kbench with a URL off loopback: %v %s", err, outb)
	}
}

// TestKbenchEndsItsRunOnSIGINT: a run with far more executions (or time)
// than the test waits for ends on SIGINT with its summary: every execution
// it started completed, and no more were started.
func TestKbenchEndsItsRunOnSIGINT(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"a count", []string{"-executions", "1000000"}},
		{"a duration", []string{"-duration", "10m"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw := nodetest.Start(t, node.Options{Data: t.TempDir()})
			var out bytes.Buffer
			var logs syncbuf.Buffer
			args := append([]string{"-url", gw.URL, "-agents", "1", "-runners", "1", "-remote", "-tools", "1",
				"-concurrency", "4", "-timeout", "10m", "-max-err-logs", "-1", "-q"}, tc.args...)
			cmd := exec.Command(os.Args[0], args...)
			cmd.Env = append(os.Environ(), "KBENCH_TEST_AS_MAIN=1")
			cmd.Stdout, cmd.Stderr = &out, &logs
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
			eventually.Check(t, func() error {
				if c := gw.Node.Kernel.Stats().Completed; c < 20 {
					return fmt.Errorf("%d executions completed", c)
				}
				return nil
			})
			if err := cmd.Process.Signal(os.Interrupt); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				done <- err
				if err != nil {
					t.Fatalf("kbench: %v\n%s\n%s", err, out.String(), logs.String())
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("kbench did not end on SIGINT\n%s", logs.String())
			}
			var s summary
			if err := json.Unmarshal(out.Bytes(), &s); err != nil {
				t.Fatalf("kbench output %q: %v", out.String(), err)
			}
			started := gw.Node.Kernel.Stats().Completed
			if s.Executions < 20 || s.OK != s.Executions || s.Executions > int(started) {
				t.Fatalf("%d executions, %d ok, %d completed by the gateway; fail reasons %v", s.Executions, s.OK, started, s.FailReasons)
			}
		})
	}
}

// TestKbenchMovesOnFromAServerWithoutALeader runs kbench with two URLs, a
// gateway and a server that answers every request 503 CLUSTER_NO_LEADER,
// as a cluster member does between leaders: the actors whose turn is the
// second open their streams there, move to the first, and the run
// completes every execution instead of ending at the first 503.
func TestKbenchMovesOnFromAServerWithoutALeader(t *testing.T) {
	gw := nodetest.Start(t, node.Options{Data: t.TempDir()})
	var streams atomic.Int32
	leaderless := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/stream") {
			streams.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":"no leader","code":"CLUSTER_NO_LEADER"}`))
	}))
	t.Cleanup(leaderless.Close)
	cmd := exec.Command(os.Args[0], "-url", gw.URL+","+leaderless.URL, "-agents", "2", "-runners", "2",
		"-remote", "-tools", "1", "-concurrency", "4", "-duration", "2s", "-exec-timeout", "20s", "-timeout", "40s",
		"-max-err-logs", "-1", "-q")
	cmd.Env = append(os.Environ(), "KBENCH_TEST_AS_MAIN=1")
	var out bytes.Buffer
	var logs syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &logs
	if err := cmd.Run(); err != nil {
		t.Fatalf("kbench: %v\n%s\n%s", err, out.String(), logs.String())
	}
	var s summary
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		t.Fatalf("kbench output %q: %v", out.String(), err)
	}
	if s.Executions == 0 || s.OK != s.Executions || streams.Load() == 0 {
		t.Fatalf("%d executions, %d ok, %d streams opened on the leaderless server; fail reasons %v\n%s", s.Executions, s.OK, streams.Load(), s.FailReasons, logs.String())
	}
}
