package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// BenchmarkReplay measures replay throughput from Badger to a resuming
// client: one SSE client reads an execution's whole log from sequence 0.
// Reported as events/s.
func BenchmarkReplay(b *testing.B) {
	const events = 50000
	s := nodetest.Start(b, node.Options{Kernel: kernel.Options{MaxSignals: events + 10}})
	id := fillLog(b, s, events)
	url := s.URL + "/v0/executions/" + id + "/stream?after_sequence=0"
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if got := readFrames(b, url, events); got != events {
			b.Fatalf("read %d events, want %d", got, events)
		}
	}
	b.ReportMetric(float64(events*b.N)/time.Since(start).Seconds(), "events/s")
}

// fillLog writes n events into one execution's log (signals, written by
// 64 concurrent clients so group commit makes it quick).
func fillLog(b *testing.B, s *nodetest.Server, n int) string {
	b.Helper()
	resp, err := http.Post(s.URL+"/v0/executions", "application/json", strings.NewReader(`{"agent_id":"replay"}`))
	if err != nil {
		b.Fatal(err)
	}
	var id string
	fmt.Sscanf(readAll(resp), `{"id":%q`, &id)
	if id == "" {
		b.Fatal("no execution id")
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var wg sync.WaitGroup
	per := (n - 1) / 64
	for w := range 64 {
		count := per
		if w == 0 {
			count += (n - 1) % 64
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range count {
				resp, err := client.Post(s.URL+"/v0/executions/"+id+"/signal", "application/json",
					strings.NewReader(`{"signal_type":"tick","payload":{"note":"a realistic small payload of some tens of bytes"}}`))
				if err != nil {
					b.Error(err)
					return
				}
				readAll(resp)
			}
		}()
	}
	wg.Wait()
	return id
}

func readAll(resp *http.Response) string {
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	return buf.String()
}

// readFrames reads SSE frames until n have arrived.
func readFrames(b *testing.B, url string, n int) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	got := 0
	for got < n && sc.Scan() {
		if bytes.HasPrefix(sc.Bytes(), []byte("data: ")) {
			got++
		}
	}
	return got
}

// BenchmarkReconnectAfterRestart measures how long 1,000 agent consumers
// take to reconnect after a server restart and resume: each has one
// undelivered push waiting, and the clock stops when all have it.
func BenchmarkReconnectAfterRestart(b *testing.B) {
	const clients = 1000
	for range b.N {
		b.StopTimer()
		s := nodetest.Start(b, node.Options{Kernel: kernel.Options{AgentGrace: time.Minute}})
		// Each agent has a pending execution: it gets execution.assigned on connect.
		for i := range clients {
			resp, err := http.Post(s.URL+"/v0/executions", "application/json", strings.NewReader(fmt.Sprintf(`{"agent_id":"storm-%d"}`, i)))
			if err != nil {
				b.Fatal(err)
			}
			readAll(resp)
		}
		s.Restart()
		b.StartTimer()
		start := time.Now()
		err := reconnectStorm(context.Background(), s.URL, clients)
		elapsed := time.Since(start)
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(elapsed.Seconds()*1000, "ms/1000-reconnects")
		s.Close()
		b.StartTimer()
	}
}

// reconnectStorm connects agent consumers rc-0 … rc-(n-1) (agent ids
// "storm-%d") at once and waits until each got its execution.assigned.
func reconnectStorm(ctx context.Context, base string, n int) error {
	tr := &http.Transport{MaxIdleConnsPerHost: n}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/v0/agents/stream?agent_id=storm-%d&consumer_id=c", base, i), nil)
			resp, err := client.Do(req)
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				errs <- fmt.Errorf("client %d: status %d", i, resp.StatusCode)
				return
			}
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if sc.Text() == "event: execution.assigned" {
					return
				}
			}
			errs <- fmt.Errorf("client %d: stream ended before its delivery: %v", i, sc.Err())
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}
