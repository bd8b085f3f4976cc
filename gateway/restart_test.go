package gateway_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
	"github.com/gatehouse-dev/gatehouse/node"
)

// TestRestartInTheMiddleOfWork stops the server with executions in every
// state, reopens the same data folder, and finishes the work: nothing that
// was acknowledged is lost, and clients that reconnect with their consumer
// ids pick up where they were.
func TestRestartInTheMiddleOfWork(t *testing.T) {
	pol := policytest.Parse(t, policytest.AskDeploys)
	ko := testKernel()
	ko.AgentGrace, ko.RunnerGrace = 5*time.Second, 5*time.Second
	s := start(t, node.Options{Policy: pol, Kernel: ko})
	a := newAPI(t, s)
	ag := a.agent("rs-agent", "c1")
	run := a.runner("rs-runner", "rc1", "remote.tool")

	pending := a.create("rs-late-agent", obj{"p": 1})["id"].(string)
	dispatched, leaseB := a.assigned(ag, nil)
	stepB := a.intent(dispatched, leaseB, obj{"type": "invoke_tool", "tool_id": "remote.tool", "remote": true, "arguments": "b"}, 200)["step_id"]
	jobB := run.expect("job.assigned")
	approval, leaseC := a.assigned(ag, nil)
	stepC := a.intent(approval, leaseC, obj{"type": "invoke_tool", "tool_id": "deploy.now"}, 200)["step_id"]
	queued, leaseD := a.assigned(ag, nil)
	stepD := a.intent(queued, leaseD, obj{"type": "invoke_tool", "tool_id": "later.tool", "remote": true}, 200)["step_id"]
	waiting, leaseE := a.assigned(ag, nil)
	a.intent(waiting, leaseE, obj{"type": "wait", "signal_type": "resume"}, 200)
	a.waitStatus(waiting, "blocked")

	before := map[string][]obj{}
	for _, id := range []string{pending, dispatched, approval, queued, waiting} {
		before[id] = a.events(id)
	}

	s.Restart()
	a = newAPI(t, s)
	for id, evs := range before {
		after := a.events(id)
		if len(after) < len(evs) {
			t.Fatalf("execution %s lost events: %d before, %d after", id, len(evs), len(after))
		}
		for i := range evs {
			if after[i]["id"] != evs[i]["id"] {
				t.Fatalf("execution %s event %d changed across the restart", id, i+1)
			}
		}
	}
	for id, want := range map[string]string{pending: "pending", dispatched: "running", approval: "blocked", queued: "running", waiting: "blocked"} {
		if ex := a.json("GET", "/v0/executions/"+id, nil, 200); ex["status"] != want {
			t.Fatalf("after restart %s is %v, want %s", id, ex["status"], want)
		}
	}

	// Clients come back under their consumer ids, within the grace period.
	ag = a.agent("rs-agent", "c1")
	run = a.runner("rs-runner", "rc1", "remote.tool")
	// The runner had not started its job, so it gets it again, same id.
	if job := run.expect("job.assigned"); job["id"] != jobB["id"] || job["step_id"] != stepB {
		t.Fatalf("resent job: %v, want %v", job, jobB)
	}
	a.json("POST", "/v0/runners/steps/"+stepB.(string)+"/started", obj{"execution_id": dispatched, "runner_id": "rs-runner"}, 200)
	a.json("POST", "/v0/runners/rs-runner/results", obj{"job_id": jobB["id"], "execution_id": dispatched, "step_id": stepB, "success": true, "data": "done"}, 200)
	if p := ag.expect("tool.result"); p["step_id"] != stepB {
		t.Fatalf("tool.result: %v", p)
	}
	a.intent(dispatched, leaseB, obj{"type": "complete"}, 200)

	a.json("POST", "/v0/executions/"+approval+"/signal", obj{"signal_type": "step.approve", "payload": obj{"step_id": stepC, "approved": true}}, 200)
	if p := ag.expect("approval.resolved"); p["step_id"] != stepC || p["session_id"] != leaseC {
		t.Fatalf("approval.resolved after restart: %v", p)
	}
	ag.expect("signal.received")
	a.json("POST", "/v0/agents/step-result", obj{"execution_id": approval, "session_id": leaseC, "step_id": stepC, "success": true}, 200)
	ag.expect("tool.result")
	a.intent(approval, leaseC, obj{"type": "complete"}, 200)

	later := a.runner("rs-later", "x", "later.tool")
	jobD := later.expect("job.assigned")
	if jobD["step_id"] != stepD {
		t.Fatalf("queued job after restart: %v", jobD)
	}
	a.json("POST", "/v0/runners/rs-later/results", obj{"job_id": jobD["id"], "execution_id": queued, "step_id": stepD, "success": true}, 200)
	ag.expect("tool.result")
	a.intent(queued, leaseD, obj{"type": "complete"}, 200)

	a.json("POST", "/v0/executions/"+waiting+"/signal", obj{"signal_type": "resume"}, 200)
	ag.expect("signal.received")
	a.waitStatus(waiting, "running")
	a.intent(waiting, leaseE, obj{"type": "complete"}, 200)

	late := a.agent("rs-late-agent", "z")
	if p := late.expect("execution.assigned"); p["execution_id"] != pending || p["input"].(obj)["p"] != 1.0 {
		t.Fatalf("pending execution after restart: %v", p)
	}
	for _, id := range []string{dispatched, approval, queued, waiting} {
		evs := a.events(id)
		for i, e := range evs {
			if e["sequence"] != float64(i+1) {
				t.Fatalf("execution %s: sequence gap at %d", id, i+1)
			}
		}
		if ex := a.json("GET", "/v0/executions/"+id, nil, 200); ex["status"] != "completed" {
			t.Fatalf("%s: %v", id, ex["status"])
		}
	}
}

// TestRestartWithoutReturningAgent: an agent that does not come back after a
// restart loses its executions to another consumer once the grace passes.
func TestRestartWithoutReturningAgent(t *testing.T) {
	s := start(t, node.Options{Kernel: kernel.Options{AgentGrace: 300 * time.Millisecond}})
	a := newAPI(t, s)
	ag := a.agent("gone-agent", "c1")
	id, lease := a.assigned(ag, nil)
	a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "t"}, 200)
	s.Restart()
	a = newAPI(t, s)
	other := a.agent("gone-agent", "c2")
	p := other.expect("execution.assigned")
	if p["execution_id"] != id || len(p["history"].([]any)) != 1 {
		t.Fatalf("reassigned after restart: %v", p)
	}
	a.intent(id, p["session_id"].(string), obj{"type": "complete"}, 200)
	a.waitStatus(id, "completed")
}

func TestPruneDeletesOnlyOldFinishedExecutions(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	old := a.create("prune-agent", nil)["id"].(string)
	a.json("POST", "/v0/executions/"+old+"/cancel", nil, 200)
	live := a.create("prune-agent", nil)["id"].(string)
	recent := a.create("prune-agent", nil)["id"].(string)
	a.json("POST", "/v0/executions/"+recent+"/cancel", nil, 200)

	n, err := s.Node.Kernel.Prune(t.Context(), time.Now().Add(-time.Hour), 0)
	if err != nil || n != 0 {
		t.Fatalf("nothing is an hour old: pruned %d, %v", n, err)
	}
	n, err = s.Node.Kernel.Prune(t.Context(), time.Time{}, 1) // keep the newest finished one
	if err != nil || n != 1 {
		t.Fatalf("count bound: pruned %d, %v", n, err)
	}
	a.fail("GET", "/v0/executions/"+old, nil, 404, "NOT_FOUND")
	a.fail("GET", "/v0/executions/"+old+"/events", nil, 404, "NOT_FOUND")
	a.fail("GET", "/v0/executions/"+old+"/stream", nil, 404, "NOT_FOUND")
	a.json("GET", "/v0/executions/"+recent, nil, 200)
	n, err = s.Node.Kernel.Prune(t.Context(), time.Now().Add(time.Minute), 0)
	if err != nil || n != 1 {
		t.Fatalf("age bound: pruned %d, %v", n, err)
	}
	a.fail("GET", "/v0/executions/"+recent, nil, 404, "NOT_FOUND")
	if ex := a.json("GET", "/v0/executions/"+live, nil, 200); ex["status"] != "pending" {
		t.Fatalf("a live execution was touched: %v", ex)
	}
	if got := a.json("GET", "/v0/executions", nil, 200)["executions"].([]any); len(got) != 1 {
		t.Fatalf("list after prune: %v", got)
	}
}

// TestShutdownDoesNotWaitForIdleSockets: a client that opened a connection
// and sent nothing must not hold shutdown for its whole timeout.
func TestShutdownDoesNotWaitForIdleSockets(t *testing.T) {
	s := start(t, node.Options{})
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	begin := time.Now()
	if err := s.Node.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	s.Node = nil
	if took := time.Since(begin); took > 2*time.Second {
		t.Fatalf("shutdown took %v with one silent connection open", took)
	}
}
