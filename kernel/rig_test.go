package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/store"
)

// rig is a kernel on a real store in a data folder, with the peer hub that
// carries its pushes, as the gateway wires them.
type rig struct {
	t   *testing.T
	dir string
	st  *store.Store
	hub *peer.Hub
	k   *Kernel
}

// openRig opens a kernel on dir; set, if not nil, adjusts its options.
// Retries back off from a millisecond unless set says otherwise. Close it
// with close.
func openRig(t *testing.T, dir string, set func(*Options)) *rig {
	t.Helper()
	st, hub := openStoreAndHubIn(t, dir)
	o := Options{Store: st, Deliverer: hubAdapter{hub}, RetryBase: time.Millisecond}
	if set != nil {
		set(&o)
	}
	k, err := New(context.Background(), o)
	if err != nil {
		hub.Close()
		st.Close()
		t.Fatal(err)
	}
	return &rig{t: t, dir: dir, st: st, hub: hub, k: k}
}

// newRig opens a kernel in a fresh folder, closed when the test ends.
func newRig(t *testing.T, set func(*Options)) *rig {
	t.Helper()
	r := openRig(t, t.TempDir(), set)
	t.Cleanup(r.close)
	return r
}

// close shuts the kernel, the hub and the store, in that order; it may be
// called again.
func (r *rig) close() {
	if r.k == nil {
		return
	}
	r.k.Close()
	r.hub.Close()
	r.st.Close()
	r.k = nil
}

// reopen closes the rig and opens a new kernel on the same folder, as a
// restart of the process does.
func (r *rig) reopen(set func(*Options)) *rig {
	r.t.Helper()
	r.close()
	n := openRig(r.t, r.dir, set)
	r.t.Cleanup(n.close)
	return n
}

// inbox reads the pushes of one consumer from the hub, as that consumer's
// connection does.
type inbox struct {
	t *testing.T
	c *peer.Conn
}

func (r *rig) inbox(role, id, consumer string) *inbox {
	r.t.Helper()
	c, reset := r.hub.Attach(peer.Key{Role: role, ID: id, Consumer: consumer}, nil)
	if reset != nil {
		r.t.Fatalf("attach %s/%s/%s: %+v", role, id, consumer, reset)
	}
	return &inbox{t: r.t, c: c}
}

// next waits for the consumer's next push, checks its type and decodes it
// into v when v is not nil.
func (in *inbox) next(typ string, v any) {
	in.t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		if d, ok := in.c.Next(); ok {
			in.c.Ack(d.Seq)
			if d.Type != typ {
				in.t.Fatalf("%s got a %s push (%s), want %s", in.c.Key(), d.Type, d.Data, typ)
			}
			if v != nil {
				if err := json.Unmarshal(d.Data, v); err != nil {
					in.t.Fatalf("%s push %s: %v", typ, d.Data, err)
				}
			}
			return
		}
		select {
		case <-in.c.Ready():
		case <-in.c.Done():
			in.t.Fatalf("%s ended (%v) while waiting for %s", in.c.Key(), in.c.Err(), typ)
		case <-deadline.C:
			in.t.Fatalf("%s: no %s push", in.c.Key(), typ)
		}
	}
}

// empty checks that no push is waiting for the consumer now.
func (in *inbox) empty() {
	in.t.Helper()
	if d, ok := in.c.Next(); ok {
		in.t.Fatalf("%s got an unexpected %s push: %s", in.c.Key(), d.Type, d.Data)
	}
}

// jobMsg is a job.assigned push as the tests read it: the kernel's own
// shape, with the runner's answer to it.
type jobMsg struct{ jobPush }

// result posts a runner's result for the job and runs what follows it.
func (j jobMsg) result(t *testing.T, k *Kernel, runnerID string, req RunnerResultRequest) {
	t.Helper()
	req.JobID, req.ExecutionID, req.StepID = j.ID, j.ExecutionID, j.StepID
	after, err := k.RunnerResult(context.Background(), runnerID, req, Meta{})
	if err != nil {
		t.Fatalf("result of job %s: %v", j.ID, err)
	}
	after.Run()
}

// running is an execution assigned to an agent consumer whose pushes the
// test reads.
type running struct {
	id    string
	lease string
	box   *inbox
}

// start creates an execution for agent ag, which must have consumer c
// connected, and reads its assignment.
func (r *rig) start(ag, c string, req CreateRequest, meta Meta) running {
	r.t.Helper()
	box := r.inbox(RoleAgent, ag, c)
	req.AgentID = ag
	v, _, err := r.k.Create(context.Background(), req, meta)
	if err != nil {
		r.t.Fatal(err)
	}
	var a assignedPush
	box.next("execution.assigned", &a)
	if a.ExecutionID != v.ID || a.SessionID == "" || v.Status != StatusRunning {
		r.t.Fatalf("create %+v: assigned %+v", v, a)
	}
	return running{id: v.ID, lease: a.SessionID, box: box}
}

// newRigRunning opens a kernel as newRig does, with agent ag's consumer c1
// connected until the test ends, and starts one execution on it: where
// most tests of an agent's side begin.
func newRigRunning(t *testing.T, set func(*Options)) (*rig, running) {
	t.Helper()
	r := newRig(t, set)
	t.Cleanup(r.k.AgentConnected("ag", "c1"))
	return r, r.start("ag", "c1", CreateRequest{}, Meta{})
}

// create creates an execution for agent agentID, connected or not, and
// returns it as Create does.
func (r *rig) create(agentID string) View {
	r.t.Helper()
	v, _, err := r.k.Create(context.Background(), CreateRequest{AgentID: agentID}, Meta{})
	if err != nil {
		r.t.Fatal(err)
	}
	return v
}

// intent sends an intent of the running execution and runs what follows it.
func (x running) intent(t *testing.T, k *Kernel, in Intent) IntentResult {
	t.Helper()
	res, after, err := k.Intent(context.Background(), IntentRequest{ExecutionID: x.id, SessionID: x.lease, Intent: in}, Meta{})
	if err != nil {
		t.Fatalf("intent %+v: %v", in, err)
	}
	after.Run()
	return res
}

// wantErr checks that err matches the sentinel want.
func wantErr(t *testing.T, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("got error %v, want %v", err, want)
	}
	for _, s := range []error{ErrNotFound, ErrValidation, ErrConflict, ErrUnauthorized, ErrUnavailable} {
		if s != want && errors.Is(err, s) {
			t.Fatalf("error %v matches %v as well as %v", err, s, want)
		}
	}
}
