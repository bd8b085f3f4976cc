package store

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/gatehouse-dev/gatehouse/store/seglog"
)

// TestSegmentLogsServeTheLogsContract: the segment log, through the Logs
// interface the store consumes: appends and drops at the journal's
// versions, bounded reads, bounds, and Sync's durable version.
func TestSegmentLogsServeTheLogsContract(t *testing.T) {
	ctx := context.Background()
	var logs Logs
	logs, err := openSegmentLogs(t.TempDir(), seglog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	for v := uint64(1); v <= 10; v++ {
		if err := logs.Append(ctx, v*2, []LogEntry{{Stream: "x/a", Seq: v, Data: fmt.Appendf(nil, "e%d", v)}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := logs.Append(ctx, 21, nil, []LogDrop{{Stream: "x/a", Before: 4}}); err != nil {
		t.Fatal(err)
	}
	if err := logs.Append(ctx, 21, []LogEntry{{Stream: "x/a", Seq: 11}}, nil); !errors.Is(err, seglog.ErrVersion) {
		t.Errorf("a version not above the last: %v", err)
	}
	for _, tc := range []struct {
		name             string
		after            uint64
		count, maxBytes  int
		wantFirst, wantN uint64
	}{
		{"past the drop", 0, 100, 0, 4, 7},
		{"a page", 5, 2, 0, 6, 2},
		{"a byte bound", 5, 100, 4, 6, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			n, err := logs.Scan(ctx, "x/a", tc.after, tc.count, tc.maxBytes, func(seq uint64, data []byte) bool {
				got = append(got, fmt.Sprintf("%d:%s", seq, data))
				return true
			})
			if err != nil || n != len(got) || uint64(len(got)) != tc.wantN || got[0] != fmt.Sprintf("%d:e%d", tc.wantFirst, tc.wantFirst) {
				t.Fatalf("scan: %d %v, %v", n, got, err)
			}
		})
	}
	// A scan stops where fn says, and says how many it was given.
	if n, err := logs.Scan(ctx, "x/a", 0, 100, 0, func(seq uint64, _ []byte) bool { return seq < 6 }); err != nil || n != 3 {
		t.Errorf("a scan stopped at the third: %d, %v", n, err)
	}
	// fn may read the logs again: the entries it is given are in the
	// scan's own buffers, and no lock of the log is held.
	var nested []uint64
	if _, err := logs.Scan(ctx, "x/a", 0, 2, 0, func(seq uint64, _ []byte) bool {
		_, err := logs.Scan(ctx, "x/a", seq, 1, 0, func(next uint64, _ []byte) bool { nested = append(nested, next); return true })
		return err == nil
	}); err != nil || fmt.Sprint(nested) != "[5 6]" {
		t.Errorf("nested scans: %v, %v", nested, err)
	}
	if f, l, err := logs.Bounds(ctx, "x/a"); err != nil || f != 4 || l != 10 {
		t.Errorf("bounds %d-%d, %v; want 4-10", f, l, err)
	}
	if d, err := logs.Sync(ctx); err != nil || d != 21 {
		t.Errorf("Sync = %d, %v; want 21", d, err)
	}
}
