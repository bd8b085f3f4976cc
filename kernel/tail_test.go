package kernel

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/internal/race"
)

// events returns what read gives for id after each sequence up to last:
// one list of (sequence, JSON) per cursor.
// readEvents is AppendEvents for a reader that takes each event in turn.
func (k *Kernel) readEvents(id string, after uint64, fn func(seq uint64, data []byte) bool) error {
	_, err := k.AppendEvents(nil, id, after, 0, func(seq uint64, _ string, data []byte) bool { return fn(seq, data) })
	return err
}

func events(t *testing.T, read func(string, uint64, func(uint64, []byte) bool) error, id string, last uint64) [][]string {
	t.Helper()
	var out [][]string
	for after := uint64(0); after <= last; after++ {
		var got []string
		if err := read(id, after, func(seq uint64, data []byte) bool {
			got = append(got, fmt.Sprintf("%d %s", seq, data))
			return true
		}); err != nil {
			t.Fatal(err)
		}
		out = append(out, got)
	}
	return out
}

// TestTailReadsWhatTheStoreHas: an execution's events read from its tail
// are byte for byte what the store gives, from every cursor, while the
// tail keeps within its bound by dropping its oldest events (readers
// before them go to the store); an ended execution's tail goes with its
// last watcher.
func TestTailReadsWhatTheStoreHas(t *testing.T) {
	k := newKernel(t, nil)
	ctx := context.Background()
	v, _, err := k.Create(ctx, CreateRequest{AgentID: "a"}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	w := k.Watch(v.ID)
	for i, size := range []int{10, 1000, 20 << 10, 30 << 10, 5, 25 << 10, 100} {
		payload, _ := json.Marshal(map[string]any{"i": i, "pad": strings.Repeat("x", size)})
		if _, err := k.Signal(ctx, v.ID, SignalRequest{SignalType: "note", Payload: payload}, Meta{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := k.Cancel(ctx, v.ID, Meta{}); err != nil {
		t.Fatal(err)
	}
	k.tailMu.Lock()
	tl := k.tails[v.ID]
	if tl == nil || !tl.ended || tl.bytes > tailMaxBytes || tl.entries[0].seq == 1 || k.tailBytes != tl.bytes {
		t.Fatalf("tail of an ended, watched execution: %+v, %d bytes in all tails", tl, k.tailBytes)
	}
	first := tl.entries[0].seq
	last := tl.entries[len(tl.entries)-1].seq
	k.tailMu.Unlock()

	storedJSON := func(id string, after uint64, fn func(uint64, []byte) bool) error {
		return k.eachStored(id, after, 0, func(seq uint64, raw []byte) (bool, error) {
			data, _, err := event.AppendStoredJSON(nil, raw, id)
			return err == nil && fn(seq, data), err
		})
	}
	stored := events(t, storedJSON, v.ID, last)
	read := events(t, k.readEvents, v.ID, last)
	for after := range stored {
		if len(stored[after]) == 0 && uint64(after) != last {
			t.Fatalf("the store has nothing after %d", after)
		}
		if strings.Join(read[after], "\n") != strings.Join(stored[after], "\n") {
			t.Fatalf("after %d (the tail starts at %d): read\n%s\nwant\n%s", after, first, read[after], stored[after])
		}
	}
	// Decoded events from the tail are those decoded from the store.
	var fromTailValues, fromStoreValues []string
	if err := k.ReadEventValues(v.ID, first-1, func(ev *event.Event) bool {
		b, _ := json.Marshal(ev)
		fromTailValues = append(fromTailValues, string(b))
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if err := k.eachStored(v.ID, first-1, 0, func(_ uint64, raw []byte) (bool, error) {
		ev, err := event.DecodeStored(raw, v.ID)
		b, _ := json.Marshal(ev)
		fromStoreValues = append(fromStoreValues, string(b))
		return err == nil, err
	}); err != nil {
		t.Fatal(err)
	}
	if len(fromTailValues) == 0 || strings.Join(fromTailValues, "\n") != strings.Join(fromStoreValues, "\n") {
		t.Fatalf("decoded from the tail:\n%s\nfrom the store:\n%s", fromTailValues, fromStoreValues)
	}
	var fromTail int
	for after := first - 1; after <= last; after++ {
		if _, ok := k.tailFrom(nil, v.ID, after); ok {
			fromTail++
		}
	}
	if want := int(last - first + 2); fromTail != want {
		t.Fatalf("%d cursors served by the tail, want %d", fromTail, want)
	}
	if _, ok := k.tailFrom(nil, v.ID, first-2); ok {
		t.Fatal("a cursor before the tail was served by it")
	}

	w.Stop()
	k.tailMu.Lock()
	defer k.tailMu.Unlock()
	if len(k.tails) != 0 || k.tailBytes != 0 {
		t.Fatalf("after the last watcher: %d tails, %d bytes", len(k.tails), k.tailBytes)
	}
}

// TestTailsStayWithinTheirBound: past the bound on all tails together, a
// tail that would grow is emptied and its reader gets the same events from
// the store.
func TestTailsStayWithinTheirBound(t *testing.T) {
	k := newKernel(t, nil)
	ctx := context.Background()
	pad := strings.Repeat("y", 50<<10)
	var ids []string
	for range tailsMaxBytes/(50<<10) + 8 {
		v, _, err := k.Create(ctx, CreateRequest{AgentID: "a", Input: json.RawMessage(`{"pad":"` + pad + `"}`)}, Meta{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.ID)
	}
	k.tailMu.Lock()
	total := 0
	for _, tl := range k.tails {
		total += tl.bytes
	}
	held := k.tailBytes
	k.tailMu.Unlock()
	if held != total || held > tailsMaxBytes {
		t.Fatalf("tails hold %d bytes (counted %d), bound %d", total, held, tailsMaxBytes)
	}
	last := ids[len(ids)-1]
	var got [][]byte
	if err := k.readEvents(last, 0, func(_ uint64, data []byte) bool {
		got = append(got, bytes.Clone(data))
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 || !bytes.Contains(got[0], []byte(pad)) {
		t.Fatalf("the events of an execution past the bound: %d read", len(got))
	}
}

// TestNothingFollowsTheLargestSequence: a live execution's events after
// 2^64-1 are none, from its tail, from the store and as a page. after+1
// wrapped to 0 and gave them all.
func TestNothingFollowsTheLargestSequence(t *testing.T) {
	k := newKernel(t, nil)
	ctx := context.Background()
	v, _, err := k.Create(ctx, CreateRequest{AgentID: "a"}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	w := k.Watch(v.ID)
	defer w.Stop()
	if _, err := k.Signal(ctx, v.ID, SignalRequest{SignalType: "note"}, Meta{}); err != nil {
		t.Fatal(err)
	}
	if entries, ok := k.tailFrom(nil, v.ID, math.MaxUint64); !ok || len(entries) != 0 {
		t.Fatalf("tailFrom(2^64-1) = %d entries, %v; want none, from the tail", len(entries), ok)
	}
	n := 0
	if err := k.readEvents(v.ID, math.MaxUint64, func(uint64, []byte) bool { n++; return true }); err != nil || n != 0 {
		t.Fatalf("AppendEvents after 2^64-1: %d events (%v), want none", n, err)
	}
	if err := k.eachStored(v.ID, math.MaxUint64, 0, func(uint64, []byte) (bool, error) { n++; return true, nil }); err != nil || n != 0 {
		t.Fatalf("the store after 2^64-1: %d events (%v), want none", n, err)
	}
	if page, err := k.Events(ctx, v.ID, math.MaxUint64, 1000); err != nil || len(page.Events) != 0 {
		t.Fatalf("Events after 2^64-1: %d (%v), want none", len(page.Events), err)
	}
}

// TestAppendEventsFromTailAllocatesNothing: a stream's reader calls
// AppendEvents on every wake-up; from the tail, into a buffer with room,
// it takes the entries and runs its callback on the stack.
func TestAppendEventsFromTailAllocatesNothing(t *testing.T) {
	if race.Enabled {
		t.Skip("counts the allocations of a build without the race detector")
	}
	k := newKernel(t, nil)
	v, _, err := k.Create(context.Background(), CreateRequest{AgentID: "a"}, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, 64<<10)
	// A callback that captures nothing: the reader's own (the gateway's)
	// may cost it an allocation, not AppendEvents.
	keep := func(uint64, string, []byte) bool { return true }
	if out, err := k.AppendEvents(buf[:0], v.ID, 0, 0, keep); err != nil || len(out) == 0 {
		t.Fatalf("AppendEvents = %q, %v; want the events", out, err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := k.AppendEvents(buf[:0], v.ID, 0, 0, keep); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("AppendEvents from the tail allocated %v times, want none", allocs)
	}
}
