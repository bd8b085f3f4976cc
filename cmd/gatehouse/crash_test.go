package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestMain lets the test binary act as the gatehouse binary, so crash tests
// can run the real server in a child process and kill it.
func TestMain(m *testing.M) {
	if os.Getenv("GATEHOUSE_TEST_AS_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// child is a gatehouse server process.
type child struct {
	cmd  *exec.Cmd
	base string
	logs *bytes.Buffer
}

func startChild(t testing.TB, addr, dir string) *child {
	t.Helper()
	logs := &bytes.Buffer{}
	cmd := exec.Command(os.Args[0], "serve", "--addr", addr, "--data", dir, "--log-level", "warn")
	cmd.Env = append(os.Environ(), "GATEHOUSE_TEST_AS_MAIN=1")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, base: "http://" + addr, logs: logs}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(c.base + "/v0/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not become ready: %v\n%s", err, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func post(ctx context.Context, client *http.Client, url string, body any) (int, map[string]any, error) {
	return send(ctx, client, http.MethodPost, url, body)
}

// send makes a JSON request and decodes the JSON answer.
func send(ctx context.Context, client *http.Client, method, url string, body any) (int, map[string]any, error) {
	data, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(data))
	if err != nil {
		return 0, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, err
	}
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out, nil
}

// TestPowerCutLosesNothingAcknowledged kills the server with SIGKILL while
// writers are busy, restarts it on the same folder, and checks that every
// write it acknowledged is there.
func TestPowerCutLosesNothingAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	dir := t.TempDir()
	addr := freeAddr(t)
	c := startChild(t, addr, dir)

	type acked struct {
		id      string
		signals int
	}
	var mu sync.Mutex
	var all []*acked
	ctx, cancel := context.WithCancel(context.Background())
	client := &http.Client{Timeout: 5 * time.Second}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil && i < 10000; i++ {
				status, ex, err := post(ctx, client, c.base+"/v0/executions", map[string]any{"agent_id": fmt.Sprintf("crash-%d", w), "input": i})
				if err != nil || status != 201 {
					return
				}
				a := &acked{id: ex["id"].(string)}
				mu.Lock()
				all = append(all, a)
				mu.Unlock()
				for range 3 {
					status, _, err := post(ctx, client, c.base+"/v0/executions/"+a.id+"/signal", map[string]any{"signal_type": "tick"})
					if err != nil || status != 200 {
						return
					}
					mu.Lock()
					a.signals++
					mu.Unlock()
				}
			}
		}()
	}
	waitAcked(t, &mu, func() int { return len(all) }, 40)
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(all) < 20 {
		t.Fatalf("only %d executions acknowledged before the kill; the test did not load the server", len(all))
	}

	c = startChild(t, addr, dir)
	for _, a := range all {
		resp, err := client.Get(c.base + "/v0/executions/" + a.id + "/events?limit=1000")
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
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("execution %s after the crash: status %d, %v", a.id, resp.StatusCode, err)
		}
		signals := 0
		for i, e := range page.Events {
			if e.Sequence != i+1 {
				t.Fatalf("execution %s: sequence gap after the crash", a.id)
			}
			if e.Type == "signal.received" {
				signals++
			}
		}
		if page.Events[0].Type != "execution.created" || signals < a.signals {
			t.Fatalf("execution %s: %d of %d acknowledged signals survived", a.id, signals, a.signals)
		}
	}
	t.Logf("%d acknowledged executions checked after SIGKILL", len(all))
}

// TestPowerCutKeepsMemoryNotes: memory appends acknowledged through the
// Runtime API (an invocation answered completed) all survive a SIGKILL in
// the middle of a burst, and so do the sessions they were filed in.
func TestPowerCutKeepsMemoryNotes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	dir := t.TempDir()
	addr := freeAddr(t)
	c := startChild(t, addr, dir)
	var mu sync.Mutex
	acked := map[string]string{} // line -> session
	ctx, cancel := context.WithCancel(context.Background())
	client := &http.Client{Timeout: 10 * time.Second}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil && i < 10000; i++ {
				line := fmt.Sprintf("w%d-line%d", w, i)
				status, out, err := post(ctx, client, c.base+"/runtime/v1/tools/memory_append", map[string]any{
					"input": map[string]any{"path": "/crash/log.md", "content": line}, "wait": true})
				if err != nil || status != 200 || out["status"] != "completed" {
					return
				}
				mu.Lock()
				acked[line] = out["sessionId"].(string)
				mu.Unlock()
			}
		})
	}
	waitAcked(t, &mu, func() int { return len(acked) }, 20)
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(acked) < 5 {
		t.Fatalf("only %d appends acknowledged before the kill; the test did not load the server", len(acked))
	}
	c = startChild(t, addr, dir)
	status, out, err := post(context.Background(), client, c.base+"/runtime/v1/tools/memory_read", map[string]any{
		"input": map[string]any{"path": "/crash/log.md"}, "wait": true})
	if err != nil || status != 200 || out["status"] != "completed" {
		t.Fatalf("read after the crash: %d %v %v", status, out, err)
	}
	content := out["output"].(map[string]any)["content"].(string)
	lines := map[string]bool{}
	for _, l := range strings.Split(content, "\n") {
		lines[l] = true
	}
	for line, sess := range acked {
		if !lines[line] {
			t.Fatalf("acknowledged append %q lost", line)
		}
		resp, err := client.Get(c.base + "/runtime/v1/sessions/" + sess)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("session %s of an acknowledged append: %v %v", sess, err, resp)
		}
		resp.Body.Close()
	}
	t.Logf("%d acknowledged appends checked after SIGKILL", len(acked))
}

// TestPowerCutKeepsSessions: AAP turns answered before a SIGKILL (a 201
// with the agent's reply) are all in their sessions after the restart:
// history through /aap/v1, and the turn's facts, deltas coalesced, through
// /agent-runtime.
func TestPowerCutKeepsSessions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	dir := t.TempDir()
	addr := freeAddr(t)
	c := startChild(t, addr, dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = agentCmd(ctx, []string{"--url", c.base, "--name", "example", "--log-level", "error"}, io.Discard, io.Discard)
	}()
	client := &http.Client{Timeout: 10 * time.Second}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := client.Get(c.base + "/aap/v1/meta")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(body), `"online":true`) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the example agent did not come online")
		}
	}
	var mu sync.Mutex
	acked := map[string]string{} // session -> the user's words
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; loadCtx.Err() == nil && i < 1000; i++ {
				words := fmt.Sprintf("hello %d-%d", w, i)
				status, out, err := send(loadCtx, client, http.MethodPut, c.base+"/aap/v1/session", map[string]any{
					"agent": map[string]any{"name": "example"}, "messages": []any{map[string]any{"role": "user", "content": words}}})
				if err != nil || status != 201 {
					return
				}
				mu.Lock()
				acked[out["sessionId"].(string)] = words
				mu.Unlock()
			}
		})
	}
	waitAcked(t, &mu, func() int { return len(acked) }, 6)
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
	stopLoad()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(acked) < 3 {
		t.Fatalf("only %d turns answered before the kill; the test did not load the server", len(acked))
	}
	c = startChild(t, addr, dir)
	for id, words := range acked {
		resp, err := client.Get(c.base + "/aap/v1/session/" + id + "?history=full")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), words) || !strings.Contains(string(body), `"role":"assistant"`) {
			t.Fatalf("session %s after the crash: %d %s", id, resp.StatusCode, body)
		}
		resp, err = client.Get(c.base + "/agent-runtime/sessions/" + id + "/events?limit=1000")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), `"turn.completed"`) {
			t.Fatalf("session %s events after the crash: %d %s", id, resp.StatusCode, body)
		}
	}
	t.Logf("%d answered turns checked after SIGKILL", len(acked))
}

// waitAcked lets the writers run until count (read under mu) reaches want,
// or 20 s pass, so that a kill falls in the middle of a load on a busy
// machine as on an idle one.
func waitAcked(t *testing.T, mu *sync.Mutex, count func() int, want int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := count()
		mu.Unlock()
		if n >= want {
			return
		}
	}
}
