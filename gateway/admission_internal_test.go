package gateway

import (
	"testing"
	"time"
)

// TestAdmitAt: a full burst is admitted, then connections are refused with
// the wait until the next token; a refusal spends nothing, and a negative
// rate admits everything.
func TestAdmitAt(t *testing.T) {
	now := time.Now()
	l := newAdmission(0.5, 2)
	for i := range 2 {
		if wait, ok := admitAt(l, now); !ok || wait != 0 {
			t.Fatalf("connection %d of the burst: %v, %v", i+1, wait, ok)
		}
	}
	for range 3 {
		if wait, ok := admitAt(l, now); ok || wait != 2*time.Second {
			t.Fatalf("past the burst: %v, %v; want refused for 2s", wait, ok)
		}
	}
	if wait, ok := admitAt(l, now.Add(1500*time.Millisecond)); ok || wait != 500*time.Millisecond {
		t.Fatalf("1.5s later: %v, %v; want refused for 0.5s", wait, ok)
	}
	if _, ok := admitAt(l, now.Add(2*time.Second)); !ok {
		t.Fatal("2s later: refused")
	}
	open := newAdmission(-1, 1)
	for range 1000 {
		if _, ok := admitAt(open, now); !ok {
			t.Fatal("a negative rate refused a connection")
		}
	}
}
