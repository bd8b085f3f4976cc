package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/store/fstest"
)

// waitSpace waits until the store's room reading is in state want, named
// as the 507 details name it: "ok", "low" or "full".
func waitSpace(t *testing.T, st interface{ Space() kernel.Space }, want string) kernel.Space {
	t.Helper()
	var sp kernel.Space
	eventually.Check(t, func() error {
		if sp = st.Space(); sp.State.String() != want {
			return fmt.Errorf("storage state %v, want %v (room %d KiB, low water %d KiB, reserve %d KiB)",
				sp.State, want, sp.Room()>>10, sp.LowWater>>10, sp.Reserve>>10)
		}
		return nil
	})
	return sp
}

// TestStorageFullRefusesNewWorkAndResumes runs a gateway on a real 64 MiB
// file system. Short of room, new executions get 507 STORAGE_FULL (with
// the figures and Retry-After) before any write fails, while work already
// running goes on to its end; /v0/ready and the metrics say so. Once space
// is freed, new work is taken again within seconds, with no restart.
func TestStorageFullRefusesNewWorkAndResumes(t *testing.T) {
	mnt := fstest.Small(t, 64<<20)
	s := start(t, node.Options{Data: filepath.Join(mnt, "data")})
	a := newAPI(t, s)
	st := s.Node.Store
	sp := waitSpace(t, st, "ok")
	if sp.Budget > 64<<20 || sp.LowWater >= sp.Budget/2 {
		t.Fatalf("budget %d MiB, low water %d MiB: the default budget is the disk's", sp.Budget>>20, sp.LowWater>>20)
	}

	ag := a.agent("edge", "edge-1")
	running, lease := a.assigned(ag, obj{"task": "finish me"})
	pending := a.create("nobody", obj{"task": "cancel me"})["id"].(string)

	// Take the room down between the reserve and the low-water mark.
	fstest.Ballast(t, filepath.Join(mnt, "ballast"), fstest.Free(t, mnt)-(sp.LowWater+sp.Reserve)/2)
	waitSpace(t, st, "low")

	refused := a.fail("POST", "/v0/executions", obj{"agent_id": "edge", "input": obj{"task": "new"}}, 507, "STORAGE_FULL")
	details, _ := refused["details"].(obj)
	if details["state"] != "low" || details["low_water_bytes"] == nil || details["free_bytes"] == nil {
		t.Errorf("507 details: %v", refused["details"])
	}
	// Every surface refuses new work the same way, with a Retry-After.
	for _, path := range []string{"/v0/executions", "/runtime/v1/sessions", "/agent-runtime/sessions"} {
		if status, body, hdr := a.do("POST", path, obj{"agent_id": "edge"}); status != 507 || hdr.Get("Retry-After") == "" {
			t.Errorf("POST %s when storage is low: %d (Retry-After %q) %s, want 507 with Retry-After", path, status, hdr.Get("Retry-After"), body)
		}
	}
	ready := a.fail("GET", "/v0/ready", nil, 503, "STORAGE_FULL")
	if !strings.Contains(ready["error"].(string), "storage full") {
		t.Errorf("ready: %v", ready)
	}
	if _, body, _ := a.do("GET", "/metrics", nil); !bytes.Contains(body, []byte("\ngatehouse_storage_full 1\n")) {
		t.Errorf("metrics do not say storage full:\n%s", grepLines(body, "gatehouse_storage"))
	}

	// Work already running finishes, and a cancellation goes through.
	a.intent(running, lease, obj{"type": "complete", "output": obj{"done": true}}, 200)
	a.waitStatus(running, "completed")
	a.json("POST", "/v0/executions/"+pending+"/cancel", obj{"reason": "no room"}, 200)
	a.waitStatus(pending, "cancelled")
	if got := a.eventTypes(running); got[len(got)-1] != "execution.completed" {
		t.Errorf("events of the running execution: %v", got)
	}

	// Space comes back: new work is taken again, by itself.
	if err := os.Remove(filepath.Join(mnt, "ballast")); err != nil {
		t.Fatal(err)
	}
	eventually.Check(t, func() error {
		status, body, _ := a.do("POST", "/v0/executions", obj{"agent_id": "edge", "input": obj{"task": "after"}})
		switch status {
		case 201:
			return nil
		case 507:
			return fmt.Errorf("after space came back: still %d %s", status, body)
		}
		t.Fatalf("after space came back: %d %s", status, body)
		return nil
	})
	a.json("GET", "/v0/ready", nil, 200)
}

// grepLines returns the lines of text holding substr.
func grepLines(text []byte, substr string) string {
	var out []string
	for _, l := range strings.Split(string(text), "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestFullStoreDoesNotSpin: with the store refusing every growing write
// (below the reserve), an agent that connects with executions waiting for
// it gets its stream at once, and the assignments that cannot be written
// are tried again after a wait that grows, not in a loop: a handful of
// refused writes and log lines, not thousands a second. When space
// returns, every execution is assigned, by itself; shutdown is prompt.
func TestFullStoreDoesNotSpin(t *testing.T) {
	mnt := fstest.Small(t, 64<<20)
	var logs syncbuf.Buffer
	s := start(t, node.Options{Data: filepath.Join(mnt, "data"), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	a := newAPI(t, s)
	st := s.Node.Store
	sp := waitSpace(t, st, "ok")
	var ids []string
	for range 20 {
		ids = append(ids, a.create("late", obj{"task": "wait for me"})["id"].(string))
	}
	fstest.Ballast(t, filepath.Join(mnt, "ballast"), fstest.Free(t, mnt)-sp.Reserve/2-(sp.Reserve*3/4-sp.Reserve/2)/2)
	waitSpace(t, st, "full")
	refused, errorsBefore := st.Stats().Refused, strings.Count(logs.String(), "level=ERROR")

	ag := a.agent("late", "late-1")
	// Long enough for a loop to show, short against the back-off.
	time.Sleep(2 * time.Second)
	if n := st.Stats().Refused - refused; n > 100 {
		t.Errorf("%d writes refused in 2 s: the assignments are retried in a loop", n)
	}
	if n := strings.Count(logs.String(), "level=ERROR") - errorsBefore; n > 5 {
		t.Errorf("%d error lines in 2 s:\n%s", n, logs.String())
	}

	if err := os.Remove(filepath.Join(mnt, "ballast")); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for len(got) < len(ids) {
		got[ag.expect("execution.assigned")["execution_id"].(string)] = true
	}
	for _, id := range ids {
		if !got[id] {
			t.Errorf("execution %s was not assigned once space came back", id)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Node.Close(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	s.Node = nil
}

// TestRetentionGivesSpaceBack: retention runs soon after start, and once
// it deleted every finished execution the data folder is back near the
// size of an empty one: the store compacts what was deleted away, the
// segment log drops its sealed segments, and the idle journal lets its
// segments go. The log segment being written stays until it fills: the
// disk budget of an edge box (64 MiB) makes segments of 1 MiB, so the
// executions' 6 MB of logs span several, all but that one given back.
func TestRetentionGivesSpaceBack(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const segment = 1 << 20
	s := start(t, node.Options{Data: dir, DiskBudget: 64 << 20, Retention: time.Millisecond, RetentionInterval: time.Second})
	a := newAPI(t, s)
	empty := waitSpace(t, s.Node.Store, "ok").Used
	data := strings.Repeat("retention gives the room back. ", 130) // 4 KB
	// Eight clients at once, as a busy gateway sees them: the group commit
	// shares their syncs.
	ids := make([]string, 1500)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < len(ids); i += 8 {
				status, body, _ := a.do("POST", "/v0/executions", obj{"agent_id": "nobody", "input": obj{"data": data}})
				var ex obj
				if status != 201 || json.Unmarshal(body, &ex) != nil {
					t.Errorf("create: %d %s", status, body)
					return
				}
				ids[i] = ex["id"].(string)
				if status, body, _ := a.do("POST", "/v0/executions/"+ids[i]+"/cancel", obj{"reason": "done"}); status != 200 {
					t.Errorf("cancel: %d %s", status, body)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	full := usedNow(t, dir)
	deadline := time.Now().Add(60 * time.Second)
	for {
		used := usedNow(t, dir)
		status, _, _ := a.do("GET", "/v0/executions/"+ids[len(ids)-1], nil)
		if status == 404 && used <= 2*empty+(1<<20)+segment {
			t.Logf("folder: %d KiB empty, %d KiB with 1,500 executions, %d KiB after retention", empty>>10, full>>10, used>>10)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("folder: %d KiB empty, %d KiB with 1,500 executions, still %d KiB after retention (last execution: %d)",
				empty>>10, full>>10, used>>10, status)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, id := range ids[:10] {
		a.fail("GET", "/v0/executions/"+id, nil, 404, "NOT_FOUND")
	}
}

// usedNow returns the bytes the files under dir take on disk.
func usedNow(t *testing.T, dir string) int64 {
	t.Helper()
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				total += st.Blocks * 512
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}
