package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/loopback"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
	"github.com/gatehouse-dev/gatehouse/store/fstest"
)

// The edge tests run the real server in a child process on a real, small
// file system (a tmpfs; mounting one needs root), fill it until new work
// is refused, kill it with SIGKILL and start it again. The short version
// runs always (where a tmpfs can be mounted); GATEHOUSE_EDGE=1 runs the
// full one: a 64 MiB file system filled from empty, five cycles. See
// docs/edge.md.

// edgeServer is a server process.
type edgeServer struct {
	proc *os.Process
	base string
	logs *syncbuf.Buffer
	done chan struct{} // closed once the process exited
}

// edgeChild starts a server process on dir; its output is kept for the
// test's failure messages.
func edgeChild(t *testing.T, addr, dir string) *edgeServer {
	t.Helper()
	logs := &syncbuf.Buffer{}
	cmd := exec.Command(os.Args[0], "serve", "--addr", addr, "--data", dir, "--log-level", "info")
	cmd.Env = append(os.Environ(), "GATEHOUSE_TEST_AS_MAIN=1")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &edgeServer{proc: cmd.Process, base: "http://" + addr, logs: logs, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() { _ = s.proc.Kill(); <-s.done })
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-s.done:
			t.Fatalf("server exited while starting:\n%s", logs)
		default:
		}
		resp, err := http.Get(s.base + "/v0/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not start: %v\n%s", err, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill kills the server with SIGKILL and waits for it to be gone.
func (s *edgeServer) kill(t *testing.T) {
	t.Helper()
	if err := s.proc.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-s.done
}

// input4K is an execution input of about 4 KB that compression cannot
// shrink much: base64 of random bytes.
func input4K() map[string]any {
	raw := make([]byte, 3000)
	_, _ = rand.Read(raw)
	return map[string]any{"data": base64.StdEncoding.EncodeToString(raw)}
}

// fill creates executions with 4 KB inputs from 8 writers until the server
// refuses one with 507 STORAGE_FULL; any other refusal fails the test. It
// returns the ids acknowledged.
func fill(t *testing.T, base string, limit int) []string {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	var (
		mu   sync.Mutex
		ids  []string
		full bool
		bad  error
	)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				mu.Lock()
				stop := full || bad != nil || len(ids) >= limit
				mu.Unlock()
				if stop {
					return
				}
				status, ex, err := post(context.Background(), client, base+"/v0/executions", map[string]any{"agent_id": "edge", "input": input4K()})
				mu.Lock()
				switch {
				case err != nil:
					bad = err
				case status == 201:
					ids = append(ids, ex["id"].(string))
				case status == 507 && ex["code"] == "STORAGE_FULL":
					full = true
				default:
					bad = fmt.Errorf("status %d: %v", status, ex)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if bad != nil {
		t.Fatalf("filling: %v after %d executions", bad, len(ids))
	}
	if !full {
		t.Fatalf("%d executions and still no 507", len(ids))
	}
	return ids
}

// checkAll fetches every acknowledged execution.
func checkAll(t *testing.T, base string, ids []string) {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	for _, id := range ids {
		resp, err := client.Get(base + "/v0/executions/" + id)
		if err != nil {
			t.Fatal(err)
		}
		var ex map[string]any
		err = json.NewDecoder(resp.Body).Decode(&ex)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || ex["id"] != id {
			t.Fatalf("acknowledged execution %s after SIGKILL and restart: %d %v (%v)", id, resp.StatusCode, ex, err)
		}
	}
}

// waitCreate posts a create until it is taken, and returns how long that
// took; a status other than 201 or 507 fails the test.
func waitCreate(t *testing.T, base string) time.Duration {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	start := time.Now()
	for {
		status, ex, err := post(context.Background(), client, base+"/v0/executions", map[string]any{"agent_id": "edge", "input": input4K()})
		if err != nil {
			t.Fatal(err)
		}
		if status == 201 {
			return time.Since(start)
		}
		if status != 507 || time.Since(start) > 30*time.Second {
			t.Fatalf("creating once space is back: %d %v", status, ex)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitRefused waits until a create is refused with 507: the server reads
// the free space a few times a second.
func waitRefused(t *testing.T, base string, cycle int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		status, _, err := post(context.Background(), http.DefaultClient, base+"/v0/executions", map[string]any{"agent_id": "edge"})
		if err != nil {
			t.Fatal(err)
		}
		if status == 507 {
			return
		}
		if status != 201 || time.Now().After(deadline) {
			t.Fatalf("cycle %d: a create on a full disk after the restart: %d, want 507", cycle, status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// crashed reports a server that died of a signal other than our SIGKILL,
// such as SIGBUS from a memory-mapped file on a full disk.
func crashed(logs string) bool {
	return strings.Contains(logs, "SIGBUS") || strings.Contains(logs, "fatal error") || strings.Contains(logs, "panic:")
}

// waitJournal waits until the journal in dir holds at most n bytes.
func waitJournal(t *testing.T, dir string, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var total int64
		segs, _ := filepath.Glob(filepath.Join(dir, "journal", "*"))
		for _, p := range segs {
			if fi, err := os.Stat(p); err == nil {
				total += fi.Size()
			}
		}
		if total <= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the journal still holds %d KiB on a full disk", total>>10)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// grow remounts the tmpfs at dir with size bytes: the partition grown.
func grow(t *testing.T, dir string, size int64) {
	t.Helper()
	if out, err := exec.Command("mount", "-o", fmt.Sprintf("remount,size=%d", size), dir).CombinedOutput(); err != nil {
		t.Fatalf("grow %s to %d MiB: %v: %s", dir, size>>20, err, out)
	}
}

// TestEdgeFullDiskKillRestart fills a gateway on a real small file system
// until it answers 507, takes the disk below the reserve, kills the
// server with SIGKILL, starts it again (it must come up, on the same full
// disk) and finds every acknowledged execution; once the file system is
// grown, new work is taken again by itself. The short version takes most
// of a 64 MiB tmpfs with a file first, so that the fill is quick;
// GATEHOUSE_EDGE=1 fills it from empty and runs five fill / kill / grow
// cycles.
func TestEdgeFullDiskKillRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	heavy := os.Getenv("GATEHOUSE_EDGE") == "1"
	size := int64(64 << 20)
	mnt := fstest.Small(t, size)
	dir := filepath.Join(mnt, "data")
	addr := loopback.FreeAddr(t)
	c := edgeChild(t, addr, dir)
	if !heavy {
		// Leave about 6 MiB above the low-water mark (about 16 MiB here).
		fstest.Ballast(t, filepath.Join(mnt, "taken"), fstest.Free(t, mnt)-22<<20)
	}
	cycles := 1
	if heavy {
		cycles = 5
	}
	var acked []string
	for cycle := 1; cycle <= cycles; cycle++ {
		began := time.Now()
		ids := fill(t, c.base, 20000)
		took := time.Since(began)
		acked = append(acked, ids...)
		t.Logf("cycle %d: %d executions with 4 KB inputs accepted before 507 in %v (%.0f/s; %.1f MiB free at the first 507)",
			cycle, len(ids), took.Round(time.Millisecond), float64(len(ids))/took.Seconds(), float64(fstest.Free(t, mnt))/(1<<20))
		// Below the reserve too: a file takes all but 8 MiB. The server
		// sheds its journal when it sees that (a start after a crash must
		// replay it); then it is killed.
		full := filepath.Join(mnt, fmt.Sprintf("full-%d", cycle))
		fstest.Ballast(t, full, max(0, fstest.Free(t, mnt)-8<<20))
		waitJournal(t, dir, 2<<20)
		c.kill(t)
		if crashed(c.logs.String()) {
			t.Fatalf("cycle %d: the server crashed:\n%s", cycle, c.logs)
		}
		c = edgeChild(t, addr, dir)
		checkAll(t, c.base, acked)
		// The marks of a start without a budget follow the folder's size
		// and the free space it finds, and the journal shed before the
		// kill gave some back: 4 MiB is below the reserve of any sizing.
		fuller := full + "-after"
		fstest.Ballast(t, fuller, max(0, fstest.Free(t, mnt)-4<<20))
		waitRefused(t, c.base, cycle)
		for _, f := range []string{full, fuller} {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
		size += 8 << 20
		grow(t, mnt, size)
		took = waitCreate(t, c.base)
		t.Logf("cycle %d: %d acknowledged executions all there after SIGKILL at full; new work taken %v after the disk grew by 8 MiB",
			cycle, len(acked), took.Round(time.Millisecond))
	}
	if crashed(c.logs.String()) {
		t.Fatalf("the server crashed:\n%s", c.logs)
	}
}

// TestEdgeStartOnFullDiskExitsOnce: a server started on a disk too full to
// recover on (after a SIGKILL, the journal holds writes to replay) exits at
// once with a clear message and writes nothing, however often a
// supervisor starts it again; once space is freed it starts and has every
// acknowledged execution.
func TestEdgeStartOnFullDiskExitsOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	mnt := fstest.Small(t, 64<<20)
	dir := filepath.Join(mnt, "data")
	addr := loopback.FreeAddr(t)
	c := edgeChild(t, addr, dir)
	var ids []string
	client := &http.Client{Timeout: 30 * time.Second}
	for range 50 {
		status, ex, err := post(context.Background(), client, c.base+"/v0/executions", map[string]any{"agent_id": "edge", "input": input4K()})
		if err != nil || status != 201 {
			t.Fatalf("create: %d %v %v", status, ex, err)
		}
		ids = append(ids, ex["id"].(string))
	}
	c.kill(t)
	fstest.Ballast(t, filepath.Join(mnt, "taken"), fstest.Free(t, mnt)-256<<10)
	free := fstest.Free(t, mnt)
	for try := range 3 {
		cmd := exec.Command(os.Args[0], "serve", "--addr", addr, "--data", dir)
		cmd.Env = append(os.Environ(), "GATEHOUSE_TEST_AS_MAIN=1")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if err == nil || !strings.Contains(out.String(), "storage full") || !strings.Contains(out.String(), "nothing was written") {
			t.Fatalf("start %d on a full disk: %v\n%s", try+1, err, out.String())
		}
		if strings.Count(strings.TrimSpace(out.String()), "\n") > 1 || crashed(out.String()) {
			t.Errorf("start %d: more than a line or two of output:\n%s", try+1, out.String())
		}
		if now := fstest.Free(t, mnt); now != free {
			t.Fatalf("start %d took %d bytes", try+1, free-now)
		}
	}
	if err := os.Remove(filepath.Join(mnt, "taken")); err != nil {
		t.Fatal(err)
	}
	c = edgeChild(t, addr, dir)
	checkAll(t, c.base, ids)
}
