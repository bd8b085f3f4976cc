package client

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"
)

func TestJobSet(t *testing.T) {
	s := newJobSet(2)
	if _, known := s.add("a"); known {
		t.Fatal("a is new")
	}
	if res, known := s.add("a"); !known || res != nil {
		t.Fatalf("a while running: %v %v", res, known)
	}
	done := &jobResult{JobID: "a", Success: true}
	s.done("a", done)
	if res, known := s.add("a"); !known || res != done {
		t.Fatalf("a when done: %v %v", res, known)
	}
	s.add("b")
	s.add("c") // evicts a, the oldest
	if _, known := s.add("a"); known {
		t.Error("a should have been evicted")
	}
}

func TestTruncate(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly", 7, "exactly"},
		{"abcdef", 3, "abc"},
		{"aé", 2, "a"}, // é is two bytes: not split
		{"ééé", 5, "éé"},
	}
	for _, tc := range tests {
		if got := truncate(tc.in, tc.n); got != tc.want {
			t.Errorf("truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestBackoff(t *testing.T) {
	b := &backoff{min: 100 * time.Millisecond, max: 400 * time.Millisecond}
	for i, ceiling := range []time.Duration{100, 200, 400, 400, 400} {
		ceiling *= time.Millisecond
		if d := b.next(); d < ceiling/2 || d > ceiling {
			t.Errorf("wait %d = %s, want within [%s, %s]", i, d, ceiling/2, ceiling)
		}
	}
	b.reset()
	if d := b.next(); d > 100*time.Millisecond {
		t.Errorf("after reset: %s", d)
	}
}

func TestPolicyErrorRule(t *testing.T) {
	tests := []struct{ msg, rule string }{
		{"policy denied: no shell (rule: deny-shell)", "deny-shell"},
		{"rate limit exceeded: max 3 per 1m0s (rule: limit)", "limit"},
		{"denied", ""},
	}
	for _, tc := range tests {
		if got := newPolicyError("t", tc.msg).RuleID; got != tc.rule {
			t.Errorf("%q: rule %q, want %q", tc.msg, got, tc.rule)
		}
	}
}

func TestAPIErrorIs(t *testing.T) {
	tests := []struct {
		err  *APIError
		want error
	}{
		{&APIError{Status: 404, Code: "NOT_FOUND"}, ErrNotFound},
		{&APIError{Status: 409, Code: "CONFLICT"}, ErrConflict},
		{&APIError{Status: http.StatusNotFound}, ErrNotFound},           // plain-text router 404
		{&APIError{Status: 400, Code: "UNAUTHORIZED"}, ErrUnauthorized}, // the code wins
		{&APIError{Status: 418}, nil},
	}
	for _, tc := range tests {
		for _, s := range []error{ErrNotFound, ErrConflict, ErrUnauthorized, ErrValidation} {
			if got := errors.Is(tc.err, s); got != (s == tc.want) {
				t.Errorf("errors.Is(%v, %v) = %v", tc.err, s, got)
			}
		}
	}
}

// TestWorkersReuse: a worker that finished its function waits for the
// next one, and every worker ends with its context.
func TestWorkersReuse(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	w := newWorkers()
	ran := make(chan int, 3)
	w.run(ctx, func() { ran <- 1 })
	<-ran
	// The worker is idle once it takes a function handed to idle.
	deadline := time.Now().Add(10 * time.Second)
	for handed := false; !handed; {
		select {
		case w.idle <- func() { ran <- 2 }:
			handed = true
		default:
			if time.Now().After(deadline) {
				t.Fatal("the worker did not wait for more work")
			}
			time.Sleep(time.Millisecond)
		}
	}
	if n := <-ran; n != 2 {
		t.Fatalf("ran %d", n)
	}
	w.run(ctx, func() { ran <- 3 })
	if n := <-ran; n != 3 {
		t.Fatalf("ran %d", n)
	}
	cancel()
	w.wait()
}
