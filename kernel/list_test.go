package kernel

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/store"
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

// TestListPagesInCreationOrderAcrossBuckets: List reads the entries of one
// kind in which index and idempotency records sit between them, many per
// millisecond and several per nanosecond; pages of every size, each from
// the cursor of the one before, return every execution once, newest first
// and then by id, and a cursor spelt by hand as clients of the earlier
// layout kept it (base64 of "created|id") goes on right after its row.
func TestListPagesInCreationOrderAcrossBuckets(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	base := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	var want []Summary
	var b store.Batch
	for i := range 240 {
		// Five to a nanosecond, eight nanoseconds to a millisecond, six
		// milliseconds, some far apart.
		created := base.Add(time.Duration(i/40)*time.Millisecond*time.Duration(1+i/200*1000) + time.Duration(i%40/5))
		id := fmt.Sprintf("0190aaaa-%04x-7000-8000-%012x", i%7, i)
		s := Summary{ID: id, Status: StatusCompleted, AgentID: "ag", Labels: map[string]string{},
			CreatedAt: created, UpdatedAt: created}
		want = append(want, s)
		for _, put := range []struct {
			key string
			v   any
		}{{summaryKey(created, id), s}, {indexKey(id), summaryKey(created, id)}, {idemKey(id, "k"), idemRecord{Hash: "h"}}} {
			if err := b.Put(kindExec, put.key, put.v); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := r.st.Write(ctx, &b); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(want, func(a, b Summary) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	ids := func(ss []Summary) []string {
		out := make([]string, len(ss))
		for i, s := range ss {
			out[i] = s.ID
		}
		return out
	}
	for _, limit := range []int{1, 7, 50, 200} {
		var got []Summary
		cursor := ""
		for pages := 0; ; pages++ {
			if pages > len(want) {
				t.Fatalf("limit %d: the cursors go round", limit)
			}
			page, err := r.k.List(ctx, ListRequest{Limit: limit, Cursor: cursor})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, page.Executions...)
			if page.NextCursor == "" {
				break
			}
			cursor = page.NextCursor
		}
		if !slices.Equal(ids(got), ids(want)) {
			t.Fatalf("limit %d: got\n %v\nwant\n %v", limit, ids(got), ids(want))
		}
	}
	for _, i := range []int{0, 4, 5, 39, 40, 199, 238} {
		cursor := base64.StdEncoding.EncodeToString([]byte(want[i].CreatedAt.Format(time.RFC3339Nano) + "|" + want[i].ID))
		page, err := r.k.List(ctx, ListRequest{Limit: 2, Cursor: cursor})
		if err != nil || len(page.Executions) == 0 || page.Executions[0].ID != want[i+1].ID {
			t.Errorf("cursor of row %d: %v %v; want %s first", i, ids(page.Executions), err, want[i+1].ID)
		}
	}
	if last, err := r.k.summary(want[239].ID); err != nil || last.ID != want[239].ID {
		t.Errorf("summary by id through its index: %+v %v", last, err)
	}
}
