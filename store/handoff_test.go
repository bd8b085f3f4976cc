package store

import (
	"context"
	"runtime/metrics"
	"testing"
)

// TestIdleWriteCommitsOnItsOwnGoroutine: a write that finds nothing queued
// and no group being written is journaled on the writer's goroutine. Handed
// to the commit loop, each such write cost two goroutine wake-ups more (the
// loop's, then the writer's for its answer): at one execution at a time
// the larger part of a commit's time when the disk is fast. The runtime
// samples one in eight of the times a goroutine is scheduled
// (/sched/latencies:seconds), the same in both cases, so a write's share
// of that count tells how many wake-ups it took (2.5 handed over, 0.02
// on the writer's goroutine, where the apply stage takes several groups
// per wake-up).
func TestIdleWriteCommitsOnItsOwnGoroutine(t *testing.T) {
	s := openWith(t, Options{Dir: t.TempDir(), Sync: SyncNone})
	defer s.Close()
	ctx := context.Background()
	const writes = 4000
	payload := make([]byte, 100)
	sample := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	scheduled := func() uint64 {
		metrics.Read(sample)
		var n uint64
		for _, c := range sample[0].Value.Float64Histogram().Counts {
			n += c
		}
		return n
	}
	before := scheduled()
	for i := range uint64(writes) {
		var b Batch
		b.Append("x/handoff", i+1, payload)
		if err := s.Write(ctx, &b); err != nil {
			t.Fatal(err)
		}
	}
	perWrite := float64(scheduled()-before) * 8 / writes
	if perWrite >= 1 {
		t.Errorf("%.2f goroutines scheduled per write one at a time, want fewer than one: a write on an idle store is handed over", perWrite)
	}
}
