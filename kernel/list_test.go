package kernel

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

// TestListShowsEveryChange: the store keeps a live execution's list entry
// only as of its last change of status, yet List shows every change, before
// and after a restart, and the final entry once it finishes.
func TestListShowsEveryChange(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	k, closeKernel := openKernel(t, dir, nil)
	defer func() { closeKernel() }()
	disconnect := k.AgentConnected("ag", "c1")
	v, _, err := k.Create(ctx, CreateRequest{AgentID: "ag", Labels: map[string]string{"team": "a"}}, Meta{})
	if err != nil || v.Status != StatusRunning {
		t.Fatalf("create: %+v %v", v, err)
	}
	row := func(k *Kernel) Summary {
		t.Helper()
		page, err := k.List(ctx, ListRequest{Status: StatusRunning, Labels: map[string]string{"team": "a"}})
		if err != nil || len(page.Executions) != 1 {
			t.Fatalf("list: %+v %v", page, err)
		}
		return page.Executions[0]
	}
	created := row(k)
	k.mu.Lock()
	ex := k.live[v.ID]
	k.mu.Unlock()
	time.Sleep(2 * time.Millisecond)
	res, after, err := k.Intent(ctx, IntentRequest{ExecutionID: v.ID, SessionID: ex.Lease.ID,
		Intent: Intent{Type: IntentInvokeTool, ToolID: "local.tool", Arguments: json.RawMessage(`{}`)}}, Meta{})
	if err != nil || !res.Accepted {
		t.Fatalf("intent: %+v %v", res, err)
	}
	after.Run()
	changed := row(k)
	if !changed.UpdatedAt.After(created.UpdatedAt) || changed.Seq <= created.Seq || changed.Status != StatusRunning {
		t.Fatalf("list entry did not follow the change:\n before %+v\n after  %+v", created, changed)
	}

	disconnect()
	closeKernel()
	k, closeKernel = openKernel(t, dir, nil)
	if got := row(k); !got.UpdatedAt.Equal(changed.UpdatedAt) || got.Seq != changed.Seq {
		t.Fatalf("after restart:\n got  %+v\n want %+v", got, changed)
	}

	if _, err := k.Cancel(ctx, v.ID, Meta{}); err != nil {
		t.Fatal(err)
	}
	page, err := k.List(ctx, ListRequest{Labels: map[string]string{"team": "a"}})
	if err != nil || len(page.Executions) != 1 {
		t.Fatalf("list after cancel: %+v %v", page, err)
	}
	if got := page.Executions[0]; got.Status != StatusCancelled || !got.UpdatedAt.After(changed.UpdatedAt) {
		t.Fatalf("final entry: %+v", got)
	}
}
