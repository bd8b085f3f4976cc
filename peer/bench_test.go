package peer

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"
)

// BenchmarkNonAckingConsumer pushes to an SSE-style consumer that never
// acknowledges: every delivery is written and marked delivered, so once the
// outbox is full each push also trims its oldest entry. The logger formats
// every line, as a production logger does.
func BenchmarkNonAckingConsumer(b *testing.B) {
	for _, limit := range []int{1024, 8192} {
		b.Run("limit="+strconv.Itoa(limit), func(b *testing.B) {
			h, err := NewHub(context.Background(), Options{OutboxLimit: limit,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close()
			k := Key{Role: "agent", ID: "a", Consumer: "c"}
			c, _ := h.Attach(k, nil)
			data := []byte(`{"execution_id":"01a200a6-6146-734e-9a74-a2569a723249","signal_type":"x"}`)
			push := func() {
				if _, err := h.Deliver(context.Background(), k, "signal.received", data); err != nil {
					b.Fatal(err)
				}
				d, ok := c.Next()
				if !ok {
					b.Fatal("no delivery")
				}
				c.Delivered(d.Seq)
			}
			for range limit {
				push()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				push()
			}
		})
	}
}
