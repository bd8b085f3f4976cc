package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
)

// BenchmarkRuntimeInvocations loads the Runtime API the way its clients
// do: a gateway process on its durable defaults, one runner serving the
// tool, and 32 callers that each invoke and then read the execution's
// event stream to its done event. It reports invocations per second and
// the POST-to-done latency.
//
//	go test -run '^$' -bench RuntimeInvocations -benchtime 2000x ./cmd/gatehouse
func BenchmarkRuntimeInvocations(b *testing.B) {
	const callers = 32
	c := startChild(b, freeAddr(b), b.TempDir())
	cl, err := client.New(client.Options{BaseURL: c.base})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runnerDone := make(chan struct{})
	go func() {
		defer close(runnerDone)
		_ = cl.RunRunner(ctx, &client.Runner{RunnerID: "bench-runner", Tools: map[string]client.ToolFunc{
			"bench.echo": func(_ context.Context, args json.RawMessage) (any, error) { return args, nil },
		}})
	}()
	defer func() { cancel(); <-runnerDone }()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * callers}, Timeout: 30 * time.Second}
	invoke := func() (time.Duration, error) {
		start := time.Now()
		resp, err := hc.Post(c.base+"/runtime/v1/tools/bench.echo", "application/json", strings.NewReader(`{"input":{"n":1}}`))
		if err != nil {
			return 0, err
		}
		var out struct{ ExecutionID string }
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 202 {
			return 0, fmt.Errorf("invoke: %d %v", resp.StatusCode, err)
		}
		resp, err = hc.Get(c.base + "/runtime/v1/executions/" + out.ExecutionID + "/events")
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if bytes.Equal(sc.Bytes(), []byte("event: done")) {
				return time.Since(start), nil
			}
		}
		return 0, fmt.Errorf("stream of %s ended without done", out.ExecutionID)
	}
	// The runner is connected once an invocation of its tool is accepted.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := invoke(); err == nil {
			break
		} else if time.Now().After(deadline) {
			b.Fatal(err)
		}
	}
	var mu sync.Mutex
	lat := make([]time.Duration, 0, b.N)
	work := make(chan struct{}, b.N)
	for range b.N {
		work <- struct{}{}
	}
	close(work)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range work {
				d, err := invoke()
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "invocations/s")
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
	}
}
