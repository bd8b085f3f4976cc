package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/loopback"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
	"github.com/gatehouse-dev/gatehouse/store/cutfs"
	"github.com/gatehouse-dev/gatehouse/stream/ssetest"
)

// TestMain lets the test binary act as the gatehouse binary, so crash tests
// can run the real server in a child process and kill it, and as the
// server of the power-cut file systems they mount (see cutfs.Main).
func TestMain(m *testing.M) {
	cutfs.Main()
	if os.Getenv("GATEHOUSE_TEST_AS_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// child is a gatehouse server process, serving folder dir on addr.
type child struct {
	cmd       *exec.Cmd
	addr, dir string
	base      string
	logs      *syncbuf.Buffer
}

// startChild starts a server process on addr and folder dir and returns
// once it is ready.
func startChild(t testing.TB, addr, dir string) *child {
	t.Helper()
	c := newChild(addr, dir)
	c.start(t)
	return c
}

// newChild prepares a server process on addr and folder dir, with the
// further serve flags; the process is this test binary acting as the
// gatehouse binary.
func newChild(addr, dir string, flags ...string) *child {
	logs := &syncbuf.Buffer{}
	cmd := exec.Command(os.Args[0], append([]string{"serve", "--addr", addr, "--data", dir, "--log-level", "warn"}, flags...)...)
	cmd.Env = append(os.Environ(), "GATEHOUSE_TEST_AS_MAIN=1")
	cmd.Stdout, cmd.Stderr = logs, logs
	return &child{cmd: cmd, addr: addr, dir: dir, base: "http://" + addr, logs: logs}
}

// start starts the process, which stops when the test ends, and returns
// once it answers /v0/ready.
func (c *child) start(t testing.TB) {
	t.Helper()
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.stop)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(c.base + "/v0/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not become ready: %v\n%s", err, c.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop kills the process, unless it has already been waited for, and
// waits for it.
func (c *child) stop() {
	if c.cmd.ProcessState == nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	}
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

// TestKill9LosesNothingAcknowledged kills the server with SIGKILL while
// writers are busy, restarts it on the same folder, and checks that every
// write it acknowledged is there.
func TestKill9LosesNothingAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	c := startChild(t, loopback.FreeAddr(t), t.TempDir())

	type acked struct {
		id      string
		signals int
	}
	var mu sync.Mutex
	var all []*acked
	client := &http.Client{Timeout: 5 * time.Second}
	c = killDuringLoad(t, c, 8, func(ctx context.Context, w, i int) bool {
		status, ex, err := post(ctx, client, c.base+"/v0/executions", map[string]any{"agent_id": fmt.Sprintf("crash-%d", w), "input": i})
		if err != nil || status != 201 {
			return false
		}
		a := &acked{id: ex["id"].(string)}
		mu.Lock()
		all = append(all, a)
		mu.Unlock()
		for range 3 {
			status, _, err := post(ctx, client, c.base+"/v0/executions/"+a.id+"/signal", map[string]any{"signal_type": "tick"})
			if err != nil || status != 200 {
				return false
			}
			mu.Lock()
			a.signals++
			mu.Unlock()
		}
		return true
	}, func() int { mu.Lock(); defer mu.Unlock(); return len(all) }, 40, 20)

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

// TestKill9KeepsMemoryNotes: memory appends acknowledged through the
// Runtime API (an invocation answered completed) all survive a SIGKILL in
// the middle of a burst, and so do the sessions they were filed in.
func TestKill9KeepsMemoryNotes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	c := startChild(t, loopback.FreeAddr(t), t.TempDir())
	var mu sync.Mutex
	acked := map[string]string{} // line -> session
	client := &http.Client{Timeout: 10 * time.Second}
	c = killDuringLoad(t, c, 4, func(ctx context.Context, w, i int) bool {
		line := fmt.Sprintf("w%d-line%d", w, i)
		status, out, err := post(ctx, client, c.base+"/runtime/v1/tools/memory_append", map[string]any{
			"input": map[string]any{"path": "/crash/log.md", "content": line}, "wait": true})
		if err != nil || status != 200 || out["status"] != "completed" {
			return false
		}
		mu.Lock()
		acked[line] = out["sessionId"].(string)
		mu.Unlock()
		return true
	}, func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }, 20, 5)
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

// TestKill9KeepsSessions: AAP turns answered before a SIGKILL (a 201
// with the agent's reply) are all in their sessions after the restart:
// history through /aap/v1, and the turn's facts, deltas coalesced, through
// /agent-runtime.
func TestKill9KeepsSessions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	c := startChild(t, loopback.FreeAddr(t), t.TempDir())
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
	c = killDuringLoad(t, c, 4, func(ctx context.Context, w, i int) bool {
		words := fmt.Sprintf("hello %d-%d", w, i)
		status, out, err := send(ctx, client, http.MethodPut, c.base+"/aap/v1/session", map[string]any{
			"agent": map[string]any{"name": "example"}, "messages": []any{map[string]any{"role": "user", "content": words}}})
		if err != nil || status != 201 {
			return false
		}
		mu.Lock()
		acked[out["sessionId"].(string)] = words
		mu.Unlock()
		return true
	}, func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }, 6, 3)
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

// killDuringLoad kills child c with SIGKILL in the middle of a load: write
// runs on workers goroutines, the i-th call of worker w, until it returns
// false or the kill; the kill comes once acked reports want acknowledged
// writes (or after 20 s, so that a busy machine still loads the server
// first). After the writers have stopped, fewer than atLeast acknowledged
// writes fail the test: the load never reached the server. It returns a
// server started again on c's folder and address.
func killDuringLoad(t *testing.T, c *child, workers int, write func(ctx context.Context, w, i int) bool, acked func() int, want, atLeast int) *child {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil && i < 10000 && write(ctx, w, i); i++ {
			}
		})
	}
	for deadline := time.Now().Add(20 * time.Second); acked() < want && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
	cancel()
	wg.Wait()
	if n := acked(); n < atLeast {
		t.Fatalf("only %d writes acknowledged before the kill; the test did not load the server", n)
	}
	return startChild(t, c.addr, c.dir)
}

// TestKill9KeepsAcknowledgedAcks: a human channel's acknowledgement that
// the gateway answered (an HTTP ack's 200, an ack frame's reply) holds
// after a SIGKILL right after it: the channel, connecting again without a
// cursor, is not sent the acknowledged prompt again. Acknowledgements were
// persisted up to 50 ms after the answer, and an ack frame got no reply.
func TestKill9KeepsAcknowledgedAcks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	addr, dir, flags := loopback.FreeAddr(t), t.TempDir(), cutServeFlags(t)
	c := newChild(addr, dir, flags...)
	c.start(t)
	client, streams := &http.Client{Timeout: 10 * time.Second}, &http.Client{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	registerChannels(t, streams, c.base)
	prompt := func() string {
		t.Helper()
		status, ex, err := post(ctx, client, c.base+"/v0/executions", map[string]any{
			"tool": map[string]any{"tool_id": "gatehouse.sha256", "arguments": map[string]any{"text": "x"}}})
		if err != nil || status != 201 {
			t.Fatalf("create: %d %v %v", status, ex, err)
		}
		aid := promptOf(ctx, client, c.base, ex["id"].(string))
		if aid == "" {
			t.Fatal("no prompt")
		}
		return aid
	}
	first := prompt()

	w, err := dialChannel(ctx, c.base, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.c.CloseNow()
	var wsSeq uint64
	for wsSeq == 0 {
		var fr wsFrameIn
		_, data, err := w.c.Read(ctx)
		if err == nil {
			err = json.Unmarshal(data, &fr)
		}
		if err != nil {
			t.Fatal(err)
		}
		if d := parseDelivery(fr.Seq, fr.Event, fr.Data); fr.Type == "delivery" && d.action == first {
			wsSeq = fr.Seq
		}
	}
	if err := w.send(ctx, map[string]any{"type": "ack", "seq": wsSeq, "id": "a1"}); err != nil {
		t.Fatal(err)
	}
	for {
		var fr wsFrameIn
		_, data, err := w.c.Read(ctx)
		if err == nil {
			err = json.Unmarshal(data, &fr)
		}
		if err != nil {
			t.Fatalf("waiting for the ack's reply: %v", err)
		}
		if fr.Type == "reply" && fr.ID == "a1" {
			if fr.Status != 200 {
				t.Fatalf("ack reply: %d %s", fr.Status, fr.Body)
			}
			break
		}
	}

	resp, err := openSSEChannel(ctx, streams, c.base, "")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := ssetest.NewReader(resp.Body)
	var sseSeq uint64
	for sseSeq == 0 {
		f, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if d, _ := sseFrame(f); d.action == first {
			sseSeq = d.seq
		}
	}
	status, _, err := post(ctx, client, c.base+"/v0/peers/ack", map[string]any{
		"role": "channel", "id": sseChannelID, "consumer_id": ssePeerID, "sequence": sseSeq})
	if err != nil || status != 200 {
		t.Fatalf("ack: %d %v", status, err)
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()

	c = newChild(addr, dir, flags...)
	c.start(t)
	fence := prompt()
	w, err = dialChannel(ctx, c.base, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.c.CloseNow()
	var fr wsFrameIn
	_, data, err := w.c.Read(ctx)
	if err == nil {
		err = json.Unmarshal(data, &fr)
	}
	if d := parseDelivery(fr.Seq, fr.Event, fr.Data); err != nil || d.action != fence {
		t.Errorf("WebSocket channel, acknowledged up to %d, first sent after the crash: %s %v", wsSeq, data, err)
	}
	resp, err = openSSEChannel(ctx, streams, c.base, "")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	f, err := ssetest.NewReader(resp.Body).Next()
	if d, _ := sseFrame(f); err != nil || d.action != fence {
		t.Errorf("SSE channel, acknowledged up to %d, first sent after the crash: %+v %v", sseSeq, f, err)
	}
}
