package stream

import (
	"testing"
	"time"
)

// TestFirstPingIsSpreadOverTheSecondHalf: sockets opened together ping at
// different times, each within the second half of the interval, so none
// is noticed dead later than with a fixed interval.
func TestFirstPingIsSpreadOverTheSecondHalf(t *testing.T) {
	for _, interval := range []time.Duration{15 * time.Second, 100 * time.Millisecond, 3} {
		seen := map[time.Duration]bool{}
		for range 1000 {
			d := firstPing(interval)
			if d < interval/2 || d > interval {
				t.Fatalf("interval %v: first ping after %v, want within [%v, %v]", interval, d, interval/2, interval)
			}
			seen[d] = true
		}
		if len(seen) < 2 {
			t.Fatalf("interval %v: every first ping after the same %v", interval, firstPing(interval))
		}
	}
	for _, interval := range []time.Duration{0, 1} {
		if d := firstPing(interval); d != interval {
			t.Fatalf("interval %v: first ping after %v, want the interval itself", interval, d)
		}
	}
}
