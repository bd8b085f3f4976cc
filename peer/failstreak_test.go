package peer

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestFailStreak: a streak of failed writes is one line when it starts,
// one a minute while it goes on, and one when it ends; the flushes between
// wait longer and longer, up to 30 s.
func TestFailStreak(t *testing.T) {
	var out bytes.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	var f failStreak
	t0 := time.Unix(1000, 0)
	refused := errors.New("storage full")
	steps := []struct {
		at        time.Duration
		err       error
		lines     int           // log lines so far
		deferFor  time.Duration // the next flush waits this long after at
		wantReset bool
	}{
		{0, nil, 0, 0, true},
		{time.Second, refused, 1, time.Second, false},
		{2 * time.Second, refused, 1, 4 * time.Second, false},
		{6 * time.Second, refused, 1, 8 * time.Second, false},
		{14 * time.Second, refused, 1, 16 * time.Second, false},
		{30 * time.Second, refused, 1, 30 * time.Second, false},
		{60 * time.Second, refused, 1, 30 * time.Second, false},
		{62 * time.Second, refused, 2, 30 * time.Second, false},
		{92 * time.Second, nil, 3, 0, true},
		{93 * time.Second, nil, 3, 0, true},
	}
	for i, st := range steps {
		now := t0.Add(st.at)
		f.record(log, st.err, now)
		if n := strings.Count(out.String(), "\n"); n != st.lines {
			t.Fatalf("step %d: %d log lines, want %d:\n%s", i, n, st.lines, out.String())
		}
		if st.wantReset != (f.total == 0) {
			t.Fatalf("step %d: streak %+v", i, f)
		}
		if st.deferFor > 0 && !f.deferred.Equal(now.Add(st.deferFor)) {
			t.Errorf("step %d: next flush at +%v, want +%v", i, f.deferred.Sub(now), st.deferFor)
		}
	}
	if !strings.Contains(out.String(), "persisted again") || !strings.Contains(out.String(), "failures=7") {
		t.Errorf("the end of the streak is not logged with its count:\n%s", out.String())
	}
}
