package gateway_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/node"
)

// TestSocketCutsProcessEachJobOnce cuts the runner's stream at random points
// of a long run of jobs (before it reports a job started, after, or after
// the result) and reconnects with the same consumer id. Deliveries are at
// least once; deduplicating by job id, every job runs exactly once and every
// execution completes.
func TestSocketCutsProcessEachJobOnce(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	const n = 60
	rng := rand.New(rand.NewPCG(7, 11))

	ag := a.agent("cut-agent", "c1")
	var ids []string
	leases := map[string]string{}
	for range n {
		id, lease := a.assigned(ag, nil)
		ids = append(ids, id)
		leases[id] = lease
	}
	for _, id := range ids {
		a.intent(id, leases[id], obj{"type": "invoke_tool", "tool_id": "cut.tool", "arguments": id, "remote": true}, 200)
	}

	runs := map[string]int{} // step id -> times the tool ran
	seen := map[string]bool{}
	cuts := 0
	run := a.runner("cut-runner", "rc", "cut.tool")
	for done := 0; done < n; {
		f := run.next()
		job := f.obj(t)
		jobID, step, exec := job["id"].(string), job["step_id"].(string), job["execution_id"].(string)
		if seen[jobID] {
			continue // a redelivery of a job already handled
		}
		switch rng.IntN(4) {
		case 0: // cut before acting: the job must come again
			run.close()
			cuts++
			run = a.runner("cut-runner", "rc", "cut.tool")
			continue
		case 1: // cut after reporting the start: the runner still holds it
			a.json("POST", "/v0/runners/steps/"+step+"/started", obj{"execution_id": exec, "runner_id": "cut-runner"}, 200)
			run.close()
			cuts++
			run = a.runner("cut-runner", "rc", "cut.tool")
		}
		seen[jobID] = true
		runs[step]++
		a.json("POST", "/v0/runners/cut-runner/results", obj{"job_id": jobID, "execution_id": exec, "step_id": step, "success": true, "data": job["arguments"]}, 200)
		if rng.IntN(4) == 0 { // cut after the result
			run.close()
			cuts++
			run = a.runner("cut-runner", "rc", "cut.tool")
		}
		done++
	}
	for range n {
		p := ag.expect("tool.result")
		a.intent(p["execution_id"].(string), leases[p["execution_id"].(string)], obj{"type": "complete"}, 200)
	}
	for _, id := range ids {
		a.waitStatus(id, "completed")
	}
	if len(runs) != n {
		t.Fatalf("%d steps ran, want %d", len(runs), n)
	}
	for step, c := range runs {
		if c != 1 {
			t.Fatalf("step %s ran %d times", step, c)
		}
	}
	if cuts < 10 {
		t.Fatalf("only %d cuts; the test did not exercise reconnects", cuts)
	}
	t.Logf("%d jobs, %d socket cuts", n, cuts)
}

// TestExplicitAcksResumeWithoutGapOrDuplicate: an agent reading with
// ack=explicit over SSE, cut at random points, sees every delivery in order
// exactly once after deduplicating by sequence, and acknowledged deliveries
// are never sent again.
func TestExplicitAcksResumeWithoutGapOrDuplicate(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	rng := rand.New(rand.NewPCG(3, 5))
	open := func(cursor string) *sseStream {
		q := "/v0/agents/stream?agent_id=ack-agent&consumer_id=c1&ack=explicit"
		if cursor != "" {
			return a.openSSE(q, "Last-Event-ID", cursor)
		}
		return a.openSSE(q)
	}
	ag := &agent{sseStream: open(""), id: "ack-agent", consumer: "c1"}
	const n = 40
	var mu sync.Mutex
	var created []string
	createdAll := make(chan struct{})
	go func() {
		defer close(createdAll)
		for range n {
			id := a.create("ack-agent", nil)["id"].(string)
			mu.Lock()
			created = append(created, id)
			mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	}()
	var got []string
	var lastSeq uint64
	lastID := ""
	acked := uint64(0)
	for len(got) < n {
		f := ag.next()
		if f.Event != "execution.assigned" {
			t.Fatalf("frame %s", f.Event)
		}
		epoch, seqStr, ok := strings.Cut(f.ID, ".")
		if !ok || epoch == "" {
			t.Fatalf("peer frame id %q, want <epoch>.<seq>", f.ID)
		}
		var seq uint64
		fmt.Sscan(seqStr, &seq)
		if seq <= acked {
			t.Fatalf("acknowledged delivery %d sent again", seq)
		}
		if seq <= lastSeq {
			continue // a redelivery of something not yet acknowledged
		}
		if seq != lastSeq+1 {
			t.Fatalf("gap: %d after %d", seq, lastSeq)
		}
		lastSeq, lastID = seq, f.ID
		got = append(got, f.obj(t)["execution_id"].(string))
		switch rng.IntN(5) {
		case 0:
			a.json("POST", "/v0/peers/ack", obj{"role": "agent", "id": "ack-agent", "consumer_id": "c1", "sequence": seq}, 200)
			acked = seq
		case 1: // cut without acknowledging: the next connection starts at the oldest unacknowledged
			ag.close()
			ag = &agent{sseStream: open(""), id: "ack-agent", consumer: "c1"}
		case 2: // cut and resume from a cursor: everything up to it counts as processed
			ag.close()
			ag = &agent{sseStream: open(lastID), id: "ack-agent", consumer: "c1"}
			acked = lastSeq
		}
	}
	<-createdAll // a delivery can arrive before its create's answer is read
	mu.Lock()
	defer mu.Unlock()
	// Executions created while the consumer was between connections are
	// assigned when it returns, so assignment order may differ from creation
	// order; what must hold is that each arrives exactly once.
	slices.Sort(got)
	slices.Sort(created)
	if strings.Join(got, ",") != strings.Join(created, ",") {
		t.Fatalf("deliveries missing or repeated:\n got  %v\n want %v", got, created)
	}
	peers := a.json("GET", "/v0/peers?role=agent", nil, 200)["peers"].([]any)
	if len(peers) != 1 || peers[0].(obj)["state"] != "online" || peers[0].(obj)["latest_sequence"] != float64(n) {
		t.Fatalf("peers: %v", peers)
	}
	a.fail("POST", "/v0/peers/ack", obj{"role": "agent", "id": "ack-agent", "consumer_id": "nobody", "sequence": 1}, 404, "NOT_FOUND")
	a.fail("POST", "/v0/peers/ack", obj{"role": "pilot", "id": "x", "consumer_id": "y"}, 400, "VALIDATION_ERROR")
	a.fail("GET", "/v0/peers?role=pilot", nil, 400, "VALIDATION_ERROR")
}

// TestResetOnForeignCursor: a cursor from another store's epoch, or ahead
// of anything this store sent, gets an explicit stream.reset.
func TestResetOnForeignCursor(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	st := a.openSSE("/v0/agents/stream?agent_id=reset-agent&consumer_id=c1", "Last-Event-ID", "someotherepoch.12")
	r := st.expect("stream.reset")
	if r["reason"] != "epoch_changed" || r["epoch"] != s.Node.Kernel.Epoch() || r["previous_epoch"] != "someotherepoch" {
		t.Fatalf("reset: %v", r)
	}
	st.close()
	st = a.openSSE("/v0/agents/stream?agent_id=reset-agent&consumer_id=c1&cursor=500")
	if r := st.expect("stream.reset"); r["reason"] != "cursor_ahead" {
		t.Fatalf("reset: %v", r)
	}
	a.fail("GET", "/v0/agents/stream?agent_id=reset-agent&consumer_id=c1&cursor=abc", nil, 400, "VALIDATION_ERROR")
}

// TestThousandClientsReconnectAtOnce: 1,000 agent consumers, each with an
// unacknowledged delivery, reconnect at the same moment after a restart
// and every one resumes it. Admission control must not turn a reconnect
// storm of this size away (its default allows 2,000/s with bursts of 4,000).
func TestThousandClientsReconnectAtOnce(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("opens 1,000 connections")
	}
	const clients = 1000
	s := start(t, node.Options{Kernel: kernel.Options{AgentGrace: time.Minute}})
	a := newAPI(t, s)
	for i := range clients {
		a.create(fmt.Sprintf("storm-%d", i), nil)
	}
	s.Restart()
	if err := reconnectStorm(t.Context(), s.URL, clients); err != nil {
		t.Fatal(err)
	}
}
