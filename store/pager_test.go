package store

import (
	"testing"
	"time"
)

func TestPagerDue(t *testing.T) {
	at := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	p := pager{last: 20 * mib, at: at}
	for _, tc := range []struct {
		name  string
		n     int64
		after time.Duration
		want  bool
	}{
		{"nothing grew", 20 * mib, 50 * time.Millisecond, false},
		{"grew less than a step", 21 * mib, 50 * time.Millisecond, false},
		{"grew a step", 22 * mib, 50 * time.Millisecond, true},
		{"shrank", 10 * mib, 50 * time.Millisecond, false},
		{"nothing grew for a second", 20 * mib, time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.due(tc.n, at.Add(tc.after)); got != tc.want {
				t.Errorf("due(%d MiB, %v after the last pass) = %v, want %v", tc.n/mib, tc.after, got, tc.want)
			}
		})
	}
	var first pager
	if !first.due(20*mib, at) {
		t.Error("no pass yet: the first look should pass")
	}
	first.passed(15*mib, at)
	if first.due(16*mib, at.Add(50*time.Millisecond)) || !first.due(17*mib, at.Add(50*time.Millisecond)) {
		t.Error("after a pass that left 15 MiB, the next is due from 17 MiB on")
	}
}
