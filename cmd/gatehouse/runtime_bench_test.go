package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
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
	c := startChild(b, loopback.FreeAddr(b), b.TempDir())
	cl, err := client.New(client.Options{BaseURL: c.base})
	if err != nil {
		b.Fatal(err)
	}
	background(b, func(ctx context.Context) {
		_ = cl.RunRunner(ctx, &client.Runner{RunnerID: "bench-runner", Tools: map[string]client.ToolFunc{
			"bench.echo": func(_ context.Context, args json.RawMessage) (any, error) { return args, nil },
		}})
	})
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
	warm(b, func() error {
		_, err := invoke()
		return err
	})
	r := spread(b, callers, 1, func() func() ([]time.Duration, error) {
		return func() ([]time.Duration, error) {
			d, err := invoke()
			return []time.Duration{d}, err
		}
	})[0]
	b.ReportMetric(r.rate(), "invocations/s")
	b.ReportMetric(millis(r.percentile(50)), "p50_ms")
	b.ReportMetric(millis(r.percentile(99)), "p99_ms")
}
