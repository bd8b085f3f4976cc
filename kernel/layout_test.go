package kernel

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/store/storetest"
)

// writeEarlierLayout turns the folder dir, closed, into one the earlier
// build wrote: every record of kindExec goes back to the kinds of the
// earlier layout, as that build keyed them (list keys "inverted created
// ns/id", index by id, idempotency records by "id/key"), the layout record
// goes, and FORMAT says 2.
func writeEarlierLayout(t *testing.T, dir string) {
	t.Helper()
	st := storetest.Open(t, store.Options{Dir: dir})
	var b store.Batch
	err := st.Records(kindExec, func(key string, decode func(any) error) bool {
		var raw msgpack.RawMessage
		if err := decode(&raw); err != nil {
			t.Fatal(err)
		}
		raw = bytes.Clone(raw)
		family, rest := key[bucketLen:bucketLen+3], key[bucketLen+3:]
		var err error
		switch family {
		case "/s/":
			err = b.Put(kindOldSummary, rest, raw)
		case "/i/":
			var sk string
			if err := msgpack.Unmarshal(raw, &sk); err != nil {
				t.Fatal(err)
			}
			err = b.Put(kindOldIndex, rest, sk[bucketLen+3:])
		case "/k/":
			err = b.Put(kindOldIdem, rest, raw)
		default:
			t.Fatalf("record %q of kind %s", key, kindExec)
		}
		if err != nil {
			t.Fatal(err)
		}
		b.Delete(kindExec, key)
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	b.Delete(kindKernelMeta, metaLayout)
	if err := st.Write(t.Context(), &b); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "FORMAT"), []byte("2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// countKinds counts the records of each kind of the two layouts.
func countKinds(t *testing.T, st *store.Store) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, kind := range []string{kindExec, kindOldSummary, kindOldIndex, kindOldIdem} {
		if err := st.Records(kind, func(string, func(any) error) bool { n[kind]++; return true }); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// kernelState is what clients see of a kernel's executions: the list,
// each execution, and the answers to keyed intents, retried.
type kernelState struct {
	list    string
	views   map[string]string
	replies map[string]string
}

func readState(t *testing.T, k *Kernel, keyed map[string]IntentRequest) kernelState {
	t.Helper()
	ctx := context.Background()
	st := kernelState{views: map[string]string{}, replies: map[string]string{}}
	var all []Summary
	cursor := ""
	for {
		page, err := k.List(ctx, ListRequest{Limit: 7, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page.Executions...)
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	st.list = mustJSON(t, all)
	for _, s := range all {
		v, err := k.Get(ctx, s.ID)
		if err != nil {
			t.Fatalf("get %s: %v", s.ID, err)
		}
		st.views[s.ID] = mustJSON(t, v)
	}
	for id, req := range keyed {
		res, after, err := k.Intent(ctx, req, Meta{})
		if err != nil {
			t.Fatalf("retry of the keyed intent of %s: %v", id, err)
		}
		after.Run()
		st.replies[id] = mustJSON(t, res)
	}
	return st
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestEarlierLayoutMovesOnStart: a folder of format 2, whose executions'
// records are in the earlier layout's three kinds, opens with every
// execution, its place in the list and the answers to its keyed intents
// as they were, the records in kindExec and none left behind, FORMAT 3;
// a move cut short after a few batches (the process stopped, the folder
// opened again) is finished by the next start, which logs what it moved;
// a start after that moves nothing.
func TestEarlierLayoutMovesOnStart(t *testing.T) {
	dir := t.TempDir()
	r := openRig(t, dir, nil)
	disconnect := r.k.AgentConnected("ag", "c1")
	keyed := map[string]IntentRequest{}
	for i := range 18 {
		x := r.start("ag", "c1", CreateRequest{Labels: map[string]string{"n": string(rune('a' + i))}}, Meta{})
		var in Intent
		switch i % 3 {
		case 0: // finished by a keyed intent
			in = Intent{Type: IntentComplete, IdempotencyKey: "done", Output: json.RawMessage(`"ok"`)}
		case 1: // live, with a keyed intent
			in = Intent{Type: IntentInvokeTool, IdempotencyKey: "call/1", ToolID: "local.tool", Arguments: json.RawMessage(`{}`)}
		case 2: // cancelled
			if _, err := r.k.Cancel(context.Background(), x.id, Meta{}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		x.intent(t, r.k, in)
		keyed[x.id] = IntentRequest{ExecutionID: x.id, SessionID: x.lease, Intent: in}
	}
	disconnect()
	before := readState(t, r.k, keyed)
	r.close()
	if len(before.views) != 18 || len(before.replies) != 12 {
		t.Fatalf("%d executions and %d keyed answers to compare", len(before.views), len(before.replies))
	}

	writeEarlierLayout(t, dir)
	st, hub := openStoreAndHubIn(t, dir)
	if n := countKinds(t, st); n[kindExec] != 0 || n[kindOldSummary] != 18 || n[kindOldIndex] != 18 || n[kindOldIdem] != 12 {
		t.Fatalf("the earlier layout written: %v", n)
	}
	m, err := newLayoutMove(st)
	if err != nil || m == nil {
		t.Fatalf("no move of the earlier layout: %v", err)
	}
	m.maxRecords = 5
	for range 5 { // the idempotency records, then the first 5 of the index
		if done, err := m.step(t.Context()); err != nil || done {
			t.Fatalf("step: %v %v", done, err)
		}
	}
	if n := countKinds(t, st); n[kindOldIdem] != 0 || n[kindOldIndex] != 13 || n[kindOldSummary] != 18 || n[kindExec] != 17 {
		t.Fatalf("after the steps before the cut: %v", n)
	}
	hub.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if f, err := os.ReadFile(filepath.Join(dir, "FORMAT")); err != nil || strings.TrimSpace(string(f)) != "3" {
		t.Fatalf("FORMAT %q, %v: want 3 from the store's first open", f, err)
	}

	var logged bytes.Buffer
	r = openRig(t, dir, func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(&logged, nil)) })
	after := readState(t, r.k, keyed)
	if n := countKinds(t, r.st); n[kindOldIdem]+n[kindOldIndex]+n[kindOldSummary] != 0 || n[kindExec] != 18+18+12 {
		t.Errorf("records after the move: %v", n)
	}
	r.close()
	if line := logged.String(); !strings.Contains(line, "moved the records of executions") ||
		!strings.Contains(line, "summaries=18 index=13 idempotency=0") {
		t.Errorf("log of the move: %s", line)
	}
	if after.list != before.list {
		t.Errorf("list after the move:\n %s\nbefore:\n %s", after.list, before.list)
	}
	for id, v := range before.views {
		if after.views[id] != v {
			t.Errorf("execution %s after the move:\n %s\nbefore:\n %s", id, after.views[id], v)
		}
	}
	for id, res := range before.replies {
		if after.replies[id] != res {
			t.Errorf("answer to the keyed intent of %s after the move: %s, before: %s", id, after.replies[id], res)
		}
	}

	logged.Reset()
	r = openRig(t, dir, func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(&logged, nil)) })
	again := readState(t, r.k, keyed)
	r.close()
	if strings.Contains(logged.String(), "moved the records") || again.list != before.list {
		t.Errorf("a start after the move moved again or lost executions: %s", logged.String())
	}
}

// TestDamagedEarlierLayoutIsRefused: a record of the earlier layout whose
// key that layout never wrote stops the kernel's start with an error that
// names it, instead of being dropped or left behind.
func TestDamagedEarlierLayoutIsRefused(t *testing.T) {
	for _, tc := range []struct{ kind, id string }{
		{kindOldSummary, "not-a-list-key"},
		{kindOldIdem, "no-key"},
		{kindOldIndex, "0190aaaa-0000-7000-8000-000000000000"},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			st, hub := openStoreAndHub(t)
			var b store.Batch
			if err := b.Put(tc.kind, tc.id, "garbage"); err != nil {
				t.Fatal(err)
			}
			if err := st.Write(t.Context(), &b); err != nil {
				t.Fatal(err)
			}
			k, err := New(t.Context(), Options{Store: st, Deliverer: hubAdapter{hub}})
			if err == nil {
				k.Close()
				t.Fatal("the kernel started on a damaged record")
			}
			if !errors.Is(err, errLayout) || !strings.Contains(err.Error(), tc.kind+"/"+tc.id) {
				t.Errorf("New = %v; want errLayout naming %s/%s", err, tc.kind, tc.id)
			}
		})
	}
}
