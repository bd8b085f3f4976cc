package main

import (
	"bytes"
	"context"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// BenchmarkEndToEnd runs b.N executions through an in-process gateway with
// durability "always": 32 in flight, 4 agents, 4 runners, as `gatehouse
// bench` does.
func BenchmarkEndToEnd(b *testing.B) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	oversubscribeProcs() // as the gatehouse binary does
	ctx := context.Background()
	rig, err := newBenchRig(ctx, benchConfig{agents: 4, runners: 4, sync: benchSync()}, testWriter{b})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	res := rig.run(ctx, b.N, 32, time.Hour)
	b.StopTimer()
	if err := rig.close(); err != nil {
		b.Errorf("close: %v", err)
	}
	if res.errors > 0 {
		b.Fatalf("%d of %d executions failed; first: %v", res.errors, res.started, res.firstErr)
	}
	b.ReportMetric(res.rate(), "exec/s")
	b.ReportMetric(float64(res.percentile(50))/1e6, "p50-ms")
	b.ReportMetric(float64(res.percentile(99))/1e6, "p99-ms")
}

// TestBenchSmoke runs the bench command briefly, as CI would.
func TestBenchSmoke(t *testing.T) {
	runBench(t, []string{"--executions", "200", "--concurrency", "8", "--agents", "2", "--runners", "2", "--duration", "30s"},
		"completed:   200 ", "(0 errors)", "executions/s", "p99", "command:     gatehouse bench --executions 200")
	// Nothing of the agents, runners and their connections outlives the
	// rig.
	deadline := time.Now().Add(5 * time.Second)
	for left := loadGoroutines(); left != ""; left = loadGoroutines() {
		if time.Now().After(deadline) {
			t.Fatalf("goroutines left after the bench:\n%s", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBenchRepeat: --repeat runs the bench on a fresh gateway each time
// and reports the medians.
func TestBenchRepeat(t *testing.T) {
	runBench(t, []string{"--executions", "50", "--concurrency", "4", "--agents", "1", "--runners", "1", "--repeat", "3"},
		"run 1/3: ", "run 3/3: ", "median: ", "over 3 runs")
}

// runBench runs the bench command with args and checks that its output
// holds every one of wants.
func runBench(t *testing.T, args []string, wants ...string) {
	t.Helper()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := bench(ctx, args, &out, testWriter{t}); err != nil {
		t.Fatalf("bench: %v\n%s", err, out.String())
	}
	for _, want := range wants {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestMedians(t *testing.T) {
	run := func(n int, p99 time.Duration) *benchResult {
		r := &benchResult{elapsed: time.Second}
		for range n {
			r.latencies = append(r.latencies, p99)
		}
		return r
	}
	var out bytes.Buffer
	printMedians(&out, []*benchResult{run(300, 30*time.Millisecond), run(100, 10*time.Millisecond), run(200, 20*time.Millisecond), run(400, 40*time.Millisecond)})
	want := "median:      200 executions/s (100-400), p50 20.00ms, p99 20.00ms (10.00-40.00) over 4 runs\n"
	if out.String() != want {
		t.Fatalf("got  %q\nwant %q", out.String(), want)
	}
}

// loadGoroutines returns the stacks of the goroutines that belong to the
// bench's load: its roles, the client's connection pool, the streams.
func loadGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var left []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		// Package main's functions are named by its import path in a test.
		for _, mark := range []string{"gatehouse.(*benchRig)", "client.(*Client)", "client.(*agentRun)", "client.(*runnerRun)",
			"client.(*acker)", "net/http.(*persistConn)"} {
			if strings.Contains(g, mark) {
				left = append(left, g)
				break
			}
		}
	}
	return strings.Join(left, "\n\n")
}

// TestBenchFlags checks that bad figures are refused before anything starts.
func TestBenchFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--executions", "0"},
		{"--concurrency", "-1"},
		{"--runners", "0"},
		{"--sync", "sometimes"},
	} {
		if err := bench(t.Context(), args, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
			t.Errorf("bench %v: no error", args)
		}
	}
}

// testWriter sends the gateway's warnings to the test log.
type testWriter struct{ tb testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// benchSync is the durability BenchmarkEndToEnd runs with: $BENCH_SYNC, else
// always, so that one benchmark can profile both ends of the scale.
func benchSync() string {
	if s := os.Getenv("BENCH_SYNC"); s != "" {
		return s
	}
	return "always"
}
