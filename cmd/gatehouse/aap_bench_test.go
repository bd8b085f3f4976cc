package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/loopback"
)

// BenchmarkAAPTurns loads /aap/v1 as AAP clients do: a gateway process on
// its durable default, the example agent (`gatehouse agent`), and 32
// sessions each running delta-stream turns one after another (a PUT, then
// POSTs). It reports turns per second and, from the request, the p50 and
// p99 to turn_start and to the first text_delta.
//
//	go test -run '^$' -bench AAPTurns -benchtime 1000x ./cmd/gatehouse
func BenchmarkAAPTurns(b *testing.B) {
	const sessions = 32
	c := startChild(b, loopback.FreeAddr(b), b.TempDir())
	background(b, func(ctx context.Context) {
		_ = agentCmd(ctx, []string{"--url", c.base, "--name", "example", "--log-level", "error"}, io.Discard, io.Discard)
	})
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * sessions}, Timeout: 60 * time.Second}
	// turn runs one turn and returns the delays to turn_start and to the
	// first text_delta, and the session id.
	turn := func(session string) (start, first time.Duration, id string, err error) {
		body, _ := json.Marshal(map[string]any{"agent": map[string]any{"name": "example"}, "stream": "delta",
			"messages": []any{map[string]any{"role": "user", "content": "how are you"}}})
		method, url := http.MethodPut, c.base+"/aap/v1/session"
		if session != "" {
			method, url = http.MethodPost, url+"/"+session
			body, _ = json.Marshal(map[string]any{"stream": "delta", "messages": []any{map[string]any{"role": "user", "content": "and now"}}})
		}
		req, _ := http.NewRequest(method, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		t0 := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			return 0, 0, "", err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			return 0, 0, "", fmt.Errorf("%s: %d", method, resp.StatusCode)
		}
		sc := bufio.NewScanner(resp.Body)
		id = session
		stops := 0
		var event string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				event = line[7:]
				switch {
				case event == "turn_start" && start == 0:
					start = time.Since(t0)
				case event == "text_delta" && first == 0:
					first = time.Since(t0)
				case event == "turn_stop":
					stops++
				}
			case strings.HasPrefix(line, "data: ") && event == "session_start" && id == "":
				var d struct{ SessionID string }
				_ = json.Unmarshal([]byte(line[6:]), &d)
				id = d.SessionID
			}
		}
		if stops != 1 || first == 0 {
			return 0, 0, "", fmt.Errorf("turn: %d turn_stop, first delta %v", stops, first)
		}
		return start, first, id, nil
	}
	warm(b, func() error {
		_, _, _, err := turn("")
		return err
	})
	rs := spread(b, sessions, 2, func() func() ([]time.Duration, error) {
		id := "" // the session the worker's turns run in
		return func() ([]time.Duration, error) {
			start, first, got, err := turn(id)
			id = got
			return []time.Duration{start, first}, err
		}
	})
	starts, firsts := rs[0], rs[1]
	b.ReportMetric(starts.rate(), "turns/s")
	b.ReportMetric(millis(starts.percentile(50)), "turn_start_p50_ms")
	b.ReportMetric(millis(starts.percentile(99)), "turn_start_p99_ms")
	b.ReportMetric(millis(firsts.percentile(50)), "first_delta_p50_ms")
	b.ReportMetric(millis(firsts.percentile(99)), "first_delta_p99_ms")
}
