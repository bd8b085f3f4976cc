package peer

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/store/storetest"
)

func countRecords(t *testing.T, st *store.Store) int {
	t.Helper()
	n := 0
	if err := st.Records(kindPeer, func(string, func(any) error) bool { n++; return true }); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestVanishedConsumersAreCollected: 10,000 consumers that connect once and
// vanish (half of them declared lost, as the kernel does after the grace
// period; some with deliveries they acknowledged) are forgotten after the
// retention, in memory and in the store, so a restart loads none of them.
func TestVanishedConsumersAreCollected(t *testing.T) {
	dir := t.TempDir()
	st := storetest.Open(t, store.Options{Dir: dir, Sync: store.SyncNone})
	const n = 10000
	h, err := NewHub(context.Background(), Options{Store: st, ConsumerRetention: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		k := Key{Role: "agent", ID: fmt.Sprintf("agent-%d", i), Consumer: "c"}
		if i%10 == 0 {
			deliver(t, h, k, "x")
		}
		c, _ := h.Attach(k, nil)
		if d, ok := c.Next(); ok {
			c.Ack(d.Seq)
		}
		c.Detach()
		if i%2 == 0 {
			h.Forget(k)
		}
	}
	eventually.True(t, "every vanished consumer collected", func() bool { return h.Stats().Consumers == 0 })
	if s := h.Stats(); s.Collected != n {
		t.Fatalf("collected %d, want %d", s.Collected, n)
	}
	h.Close()
	if got := countRecords(t, st); got != 0 {
		t.Fatalf("%d consumer records left in the store", got)
	}
	h = newHub(t, st, Options{})
	if p, _ := h.Peers(Query{}); len(p) != 0 {
		t.Fatalf("a restart loaded %d collected consumers", len(p))
	}
}

// TestCollectionSparesLiveConsumers: a consumer is kept while it is
// connected, while it has deliveries to receive, and for the retention
// after it was last seen.
func TestCollectionSparesLiveConsumers(t *testing.T) {
	h := newHub(t, nil, Options{ConsumerRetention: 50 * time.Millisecond})
	online := Key{Role: "runner", ID: "r", Consumer: "online"}
	waiting := Key{Role: "runner", ID: "r", Consumer: "waiting"}
	h.Attach(online, nil)
	deliver(t, h, waiting, "job.assigned")
	gone := Key{Role: "runner", ID: "r", Consumer: "gone"}
	c, _ := h.Attach(gone, nil)
	c.Detach()
	eventually.True(t, "the consumer that left collected", func() bool { return h.Stats().Collected == 1 })
	time.Sleep(150 * time.Millisecond) // three retentions: the others are not due
	p, _ := h.Peers(Query{})
	if len(p) != 2 || p[0].ConsumerID != "online" || p[1].ConsumerID != "waiting" {
		t.Fatalf("peers %+v, want online and waiting kept", p)
	}
	w, _ := h.Attach(waiting, nil)
	w.Ack(next(t, w).Seq)
	w.Detach()
	eventually.True(t, "the consumer with nothing left collected", func() bool { return h.Stats().Collected == 2 })
	// One that comes back starts afresh; its old cursor is ahead.
	one := uint64(1)
	if _, reset := h.Attach(waiting, &one); reset == nil || reset.Reason != ResetCursorAhead {
		t.Fatalf("reset %+v for a collected consumer's cursor, want cursor_ahead", reset)
	}
}

// TestConsumersAreKeptForTheRetention: a consumer that left is still
// known after sweeps have run, until the retention has passed.
func TestConsumersAreKeptForTheRetention(t *testing.T) {
	h := newHub(t, nil, Options{Rewind: 20 * time.Millisecond, ConsumerRetention: time.Hour})
	gone := Key{Role: "agent", ID: "a", Consumer: "gone"}
	c, _ := h.Attach(gone, nil)
	c.Detach()
	// A sweep turns this delivery into an acknowledgement: once it has,
	// a sweep has also judged the consumer that left.
	k := Key{Role: "agent", ID: "a", Consumer: "sse"}
	deliver(t, h, k, "x")
	c, _ = h.Attach(k, nil)
	c.Delivered(next(t, c).Seq)
	eventually.True(t, "a sweep", func() bool { return h.Pending(k) == 0 })
	time.Sleep(50 * time.Millisecond) // and a few more
	if p, _ := h.Peers(Query{}); len(p) != 2 || h.Stats().Collected != 0 {
		t.Fatalf("peers %+v: the consumer that left was collected within its retention", p)
	}
}

// TestPeersPages: the listing comes in key order, a page at a time.
func TestPeersPages(t *testing.T) {
	h := newHub(t, nil, Options{})
	for i := range 25 {
		h.Attach(Key{Role: "agent", ID: fmt.Sprintf("a%02d", i), Consumer: "c"}, nil)
		h.Attach(Key{Role: "runner", ID: fmt.Sprintf("r%02d", i), Consumer: "c"}, nil)
	}
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		page, more := h.Peers(Query{Role: "agent", After: after, Limit: 10})
		if pages > 3 || len(page) > 10 {
			t.Fatalf("page %d of %d rows", pages, len(page))
		}
		for _, p := range page {
			got = append(got, p.ID)
		}
		if !more {
			break
		}
		last := page[len(page)-1]
		after = Key{Role: last.Role, ID: last.ID, Consumer: last.ConsumerID}.String()
	}
	if len(got) != 25 || got[0] != "a00" || got[24] != "a24" {
		t.Fatalf("paged agents %v", got)
	}
	for i := 1; i < len(got); i++ {
		if got[i-1] >= got[i] {
			t.Fatalf("out of order: %v", got)
		}
	}
	if all, more := h.Peers(Query{}); len(all) != 50 || more {
		t.Fatalf("unbounded listing: %d rows, more %v", len(all), more)
	}
}

// logLines is a slog handler that keeps the messages it gets.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logLines) WithGroup(string) slog.Handler            { return l }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
	l.mu.Lock()
	l.lines = append(l.lines, b.String())
	l.mu.Unlock()
	return nil
}

func (l *logLines) matching(s string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

// TestDropsAreReportedOncePerInterval: a consumer that never acknowledges
// overflows its outbox on every push; the drops are counted and reported in
// one line per consumer and interval, not one per push.
func TestDropsAreReportedOncePerInterval(t *testing.T) {
	logs := &logLines{}
	h, err := NewHub(context.Background(), Options{OutboxLimit: 16, ReportInterval: time.Hour, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	sse := Key{Role: "agent", ID: "a", Consumer: "sse"}
	c, _ := h.Attach(sse, nil)
	away := Key{Role: "agent", ID: "a", Consumer: "away"}
	for range 1000 {
		deliver(t, h, sse, "x")
		c.Delivered(next(t, c).Seq)
		deliver(t, h, away, "x")
	}
	s := h.Stats()
	if s.DroppedRewind != 1000-16 || s.DroppedUnacknowledged != 1000-16 {
		t.Fatalf("stats %+v, want %d dropped of each kind", s, 1000-16)
	}
	if got := logs.matching("outbox over its bound"); len(got) != 0 {
		t.Fatalf("logged before the interval ended: %q", got)
	}
	h.Close() // reports what the interval has counted
	warn := logs.matching("dropped unacknowledged deliveries")
	if len(warn) != 1 || !strings.Contains(warn[0], "WARN") || !strings.Contains(warn[0], "peer=agent/a/away") ||
		!strings.Contains(warn[0], "dropped=984") || !strings.Contains(warn[0], "through=984") {
		t.Fatalf("warnings %q, want one for agent/a/away with dropped=984", warn)
	}
	rewind := logs.matching("rewind window shortened")
	if len(rewind) != 1 || !strings.Contains(rewind[0], "DEBUG") || !strings.Contains(rewind[0], "rewind_dropped=984") {
		t.Fatalf("rewind lines %q, want one at debug level for agent/a/sse", rewind)
	}
}
