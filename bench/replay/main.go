// Command replay measures a resuming client's catch-up rate: how many
// events a second a server sends to clients that read executions' SSE
// streams from sequence 0, as a seed 004 client does after a restart
// (`GET /v0/executions/{id}/stream?after_sequence=0`).
//
//	go run ./bench/replay -url http://127.0.0.1:8080 [-read-url URL] [-server-pid PID]
//
// It fills -executions executions with -signals signals each through -url
// (32 writers at once; the kernel API caps an execution's unconsumed
// signals at 1,000, and the reference kernel replays at most 1,000 events
// until a new one comes, so the default makes streams of 1,000), cancels them so that each stream ends with its
// terminal event, then reads every stream from sequence 0 through
// -read-url (a follower of a cluster, say), -readers at a time, -repeat
// times in each of -rounds rounds. Each round's rate is the events read over its wall time; the
// output is one JSON line with the median round's figures and, with
// -server-pid, the server's CPU per event (Linux /proc). Loopback only,
// bounded by -timeout. Go standard library only, like kbench.
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gatehouse-dev/gatehouse/bench/internal/host"
)

type config struct {
	url, readURL, token string
	executions, signals int
	readers, rounds     int
	repeat              int
	serverPID           int
	timeout             time.Duration
}

// round is one pass over every stream.
type round struct {
	Events       int     `json:"events"`
	Bytes        int64   `json:"bytes"`
	Seconds      float64 `json:"seconds"`
	EventsPerS   float64 `json:"events_per_s"`
	MBPerS       float64 `json:"mb_per_s"`
	ServerCPUSec float64 `json:"server_cpu_s,omitempty"`
	// ServerUSPerEvent is the server's CPU per event in microseconds.
	ServerUSPerEvent float64 `json:"server_us_per_event,omitempty"`
}

func main() {
	var c config
	flag.StringVar(&c.url, "url", "http://127.0.0.1:8080", "kernel base URL the executions are written through (loopback only)")
	flag.StringVar(&c.readURL, "read-url", "", "base URL the streams are read through (default: -url)")
	flag.StringVar(&c.token, "token", "", "bearer token sent on every request")
	flag.IntVar(&c.executions, "executions", 50, "executions to fill")
	flag.IntVar(&c.signals, "signals", 998, "signals per execution (at most 1,000, the API's cap on unconsumed signals; 998 makes a stream of 1,000 events, all the reference replays at once)")
	flag.IntVar(&c.readers, "readers", 1, "streams read at once")
	flag.IntVar(&c.rounds, "rounds", 5, "rounds measured (the median is reported)")
	flag.IntVar(&c.repeat, "repeat", 5, "times a round reads every stream")
	flag.IntVar(&c.serverPID, "server-pid", 0, "report this process's CPU per event (Linux /proc)")
	flag.DurationVar(&c.timeout, "timeout", 5*time.Minute, "bound on the whole run")
	flag.Parse()
	if c.readURL == "" {
		c.readURL = c.url
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "replay:", err)
		os.Exit(1)
	}
}

func run(c config) error {
	for _, u := range []string{c.url, c.readURL} {
		if _, err := host.CheckURL(u); err != nil {
			return fmt.Errorf("%s: %w", u, err)
		}
	}
	if c.executions < 1 || c.signals < 0 || c.signals > 1000 || c.readers < 1 || c.rounds < 1 || c.repeat < 1 {
		return errors.New("want -executions ≥ 1, 0 ≤ -signals ≤ 1000, -readers ≥ 1, -rounds ≥ 1, -repeat ≥ 1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	cl := &client{hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}, token: c.token}
	ids, err := fill(ctx, cl, c)
	if err != nil {
		return err
	}
	// created, the signals, cancelled
	want := c.signals + 2
	var rounds []round
	for range c.rounds {
		r, err := readAll(ctx, cl, c, ids, want)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "replay: %d events in %.3f s = %.0f events/s\n", r.Events, r.Seconds, r.EventsPerS)
		rounds = append(rounds, r)
	}
	slices.SortFunc(rounds, func(a, b round) int { return cmp.Compare(a.EventsPerS, b.EventsPerS) })
	med := rounds[len(rounds)/2]
	out := map[string]any{
		"replay_events_per_s": med.EventsPerS, "replay_mb_per_s": med.MBPerS,
		"rounds": len(rounds), "executions": c.executions, "events_per_stream": want, "readers": c.readers,
		"bytes_per_event": med.Bytes / int64(max(med.Events, 1)),
	}
	if c.serverPID != 0 {
		out["replay_us_per_event"] = med.ServerUSPerEvent
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

type client struct {
	hc    *http.Client
	token string
}

func (cl *client) do(ctx context.Context, method, url string, body any) (*http.Response, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if cl.token != "" {
		req.Header.Set("Authorization", "Bearer "+cl.token)
	}
	return cl.hc.Do(req)
}

// post sends body and decodes the answer into out (nil: drop it).
func (cl *client) post(ctx context.Context, url string, body, out any) error {
	resp, err := cl.do(ctx, "POST", url, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return fmt.Errorf("POST %s: %s: %.200s", url, resp.Status, data)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// fill creates the executions, signals each c.signals times with 32
// writers at once, and cancels them.
func fill(ctx context.Context, cl *client, c config) ([]string, error) {
	ids := make([]string, c.executions)
	for i := range ids {
		var x struct {
			ID string `json:"id"`
		}
		if err := cl.post(ctx, c.url+"/v0/executions", map[string]any{"agent_id": "replay"}, &x); err != nil {
			return nil, err
		}
		ids[i] = x.ID
	}
	jobs := make(chan string)
	errs := make(chan error, 32)
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range jobs {
				err := cl.post(ctx, c.url+"/v0/executions/"+id+"/signal", map[string]any{
					"signal_type": "tick",
					"payload":     map[string]any{"note": "a realistic small payload of some tens of bytes"},
				}, nil)
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	start := time.Now()
feed:
	for k := 0; k < c.signals; k++ {
		for _, id := range ids {
			select {
			case jobs <- id:
			case err := <-errs:
				close(jobs)
				wg.Wait()
				return nil, err
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errs:
		return nil, err
	default:
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "replay: filled %d executions with %d signals each in %.1f s\n", len(ids), c.signals, time.Since(start).Seconds())
	for _, id := range ids {
		if err := cl.post(ctx, c.url+"/v0/executions/"+id+"/cancel", map[string]any{}, nil); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// readAll reads every stream from sequence 0 c.repeat times, c.readers at
// a time, and checks that each gave want events in sequence order.
func readAll(ctx context.Context, cl *client, c config, ids []string, want int) (round, error) {
	work := make(chan string, len(ids)*c.repeat)
	for range c.repeat {
		for _, id := range ids {
			work <- id
		}
	}
	close(work)
	var (
		mu    sync.Mutex
		r     round
		first error
		wg    sync.WaitGroup
		cpu0  time.Duration
		cpuOK = c.serverPID != 0
		start = time.Now()
	)
	if cpuOK {
		cpu0, cpuOK = host.CPU(c.serverPID)
	}
	for range c.readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				n, size, err := readStream(ctx, cl, c.readURL, id, want)
				mu.Lock()
				r.Events += n
				r.Bytes += size
				if err != nil && first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return r, first
	}
	r.Seconds = time.Since(start).Seconds()
	r.EventsPerS = float64(r.Events) / r.Seconds
	r.MBPerS = float64(r.Bytes) / r.Seconds / 1e6
	if cpu1, ok := host.CPU(c.serverPID); cpuOK && ok {
		r.ServerCPUSec = (cpu1 - cpu0).Seconds()
		r.ServerUSPerEvent = r.ServerCPUSec / float64(r.Events) * 1e6
	}
	return r, nil
}

// readStream reads one execution's stream from sequence 0 up to want
// events or the stream's end, checking that the ids count up from 1.
func readStream(ctx context.Context, cl *client, base, id string, want int) (int, int64, error) {
	resp, err := cl.do(ctx, "GET", base+"/v0/executions/"+id+"/stream?after_sequence=0", nil)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, 0, fmt.Errorf("stream %s: %s", id, resp.Status)
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	var (
		n    int
		size int64
		next uint64 = 1
	)
	for n < want {
		line, err := br.ReadSlice('\n')
		size += int64(len(line))
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return n, size, fmt.Errorf("stream %s: %w", id, err)
		}
		switch {
		case bytes.HasPrefix(line, []byte("id: ")):
			seq, err := strconv.ParseUint(string(bytes.TrimSpace(line[4:])), 10, 64)
			if err != nil || seq != next {
				return n, size, fmt.Errorf("stream %s: id %q, want %d: a gap or a duplicate", id, bytes.TrimSpace(line), next)
			}
			next++
		case bytes.HasPrefix(line, []byte("data: ")):
			n++
		}
	}
	if n != want {
		return n, size, fmt.Errorf("stream %s: %d events, want %d", id, n, want)
	}
	return n, size, nil
}
