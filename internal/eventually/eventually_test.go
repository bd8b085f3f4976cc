package eventually_test

import (
	"errors"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
)

// TestWaitsUntilTheConditionHolds: each wait returns only once its
// condition has held, after as many polls as it took.
func TestWaitsUntilTheConditionHolds(t *testing.T) {
	calls := 0
	eventually.True(t, "the third call", func() bool { calls++; return calls == 3 })
	if calls != 3 {
		t.Fatalf("True returned after %d calls, want 3", calls)
	}
	calls = 0
	eventually.Check(t, func() error {
		if calls++; calls < 4 {
			return errors.New("not yet")
		}
		return nil
	})
	if calls != 4 {
		t.Fatalf("Check returned after %d calls, want 4", calls)
	}
	got := eventually.Value(t, "a positive value", func() (int, bool) { calls++; return calls, calls > 6 })
	if got != 7 {
		t.Fatalf("Value returned %d, want 7", got)
	}
}
