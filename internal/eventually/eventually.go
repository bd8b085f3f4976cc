// Package eventually waits, in tests, for what other goroutines make true:
// a delivery acknowledged, a status reached, a file written in the
// background. It polls, often at first and then less so, until the
// condition holds or a generous deadline passes; then the test fails saying
// what it waited for. The deadline bounds a failing test, never a passing
// one: tests make no timed assertions.
package eventually

import (
	"fmt"
	"testing"
	"time"
)

// Deadline is how long a condition may take before the test fails. It is
// generous because the race detector on a loaded two-core machine makes
// background work slow.
const Deadline = 30 * time.Second

// Poll intervals: the first poll comes soon, for conditions that hold at
// once; later ones back off to maxInterval so that an expensive check
// (an HTTP request, a folder walk) does not crowd the work it waits for.
const (
	minInterval = time.Millisecond
	maxInterval = 20 * time.Millisecond
)

// Check calls check until it returns nil and fails the test with its last
// error when Deadline passes first. The error says what is still missing,
// with the state observed, so a failure explains itself.
func Check(tb testing.TB, check func() error) {
	tb.Helper()
	deadline := time.Now().Add(Deadline)
	for wait := minInterval; ; wait = min(2*wait, maxInterval) {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("not within %v: %v", Deadline, err)
		}
		time.Sleep(wait)
	}
}

// True waits until cond holds; what names it in the failure.
func True(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	Check(tb, func() error {
		if cond() {
			return nil
		}
		return fmt.Errorf("%s", what)
	})
}

// Value calls f until it reports done and returns the value it gave then;
// what names the wait in the failure.
func Value[T any](tb testing.TB, what string, f func() (T, bool)) T {
	tb.Helper()
	var v T
	Check(tb, func() error {
		var ok bool
		if v, ok = f(); ok {
			return nil
		}
		return fmt.Errorf("%s: last value %v", what, v)
	})
	return v
}
