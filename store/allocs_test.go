package store

import (
	"context"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/race"
	"github.com/gatehouse-dev/gatehouse/store/seglog"
)

// TestHotPathAllocations bounds what the hot path allocates per call, once
// its reused room has grown: the apply stage's split of a group, a rewrite
// of a lazy key, the building of a batch, and a segment log append.
func TestHotPathAllocations(t *testing.T) {
	if testing.Short() || race.Enabled {
		t.Skip("allocation counts are exact only without -race")
	}
	logs, err := openSegmentLogs(t.TempDir(), seglog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = logs.Close() })
	s := &Store{logs: logs, segmentLogs: defaultSegmentLogs()}
	group := []op{
		{key: logKey("x/exec", 1), val: []byte("a")},
		{key: logKey("x/exec", 2), val: []byte("b")},
		{key: logKey("s/session", 7), val: []byte("c")},
		{key: logKey("x/exec", 1), del: true},
		{key: recordKey("exec", "e1"), val: []byte("d")},
	}
	var lazy lazyWrites
	now := time.Now()
	rewrite := op{key: recordKey("exec", "e1"), val: []byte("w"), lazy: true}
	lazy.keep(1, op{key: recordKey("exec", "e1"), val: []byte("v"), lazy: true}, now)
	type record struct {
		A string
		B int
	}
	rec, data := &record{A: "a", B: 1}, []byte("a")
	entries := []LogEntry{{Stream: "x/exec", Data: data}}
	var b Batch
	for _, c := range []struct {
		name string
		max  float64
		run  func()
	}{
		// Before: the stream's name per entry, the rest and the entries.
		// The spans of the groups appended together keep their map.
		{"split", 0, func() {
			rest := s.splitLogs(group, s.split.rest[:0])
			if s.split.conflicts(0, 0) {
				t.Fatal("one group conflicts with itself")
			}
			s.split.note(0)
			s.split.done()
			s.split.rest = reusable(rest)
		}},
		// Before: the key's string, to assign it again.
		{"lazy rewrite", 0, func() {
			lazy.keep(2, rewrite, now)
		}},
		// The writes' room, the log keys' room, the records' room, a
		// key and value per record, and a lazy write's key; before, the
		// writes' room grew from one, each key was its own, and each
		// record took a buffer that grew as it was encoded.
		{"batch", 6, func() {
			b = Batch{}
			b.Append("x/exec", 1, data)
			b.Append("x/exec", 2, data)
			b.AppendLazy("o/peer", 3, data)
			if err := b.PutLazy("exec", "e1", rec); err != nil {
				t.Fatal(err)
			}
			if err := b.Put("live", "e1", true); err != nil {
				t.Fatal(err)
			}
		}},
		// Before: the batch, its items, a waiter and its channel, the
		// group's waiters and the checksum's seed.
		{"segment log append", 0, func() {
			entries[0].Seq++
			if err := logs.Append(context.Background(), entries[0].Seq, entries, nil); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.run() // grows the room reused
			if got := testing.AllocsPerRun(100, c.run); got > c.max {
				t.Errorf("%s: %v allocations a call, want at most %v", c.name, got, c.max)
			}
		})
	}
}
