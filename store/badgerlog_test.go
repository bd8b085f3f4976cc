package store

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestBadgerLoggerLevels(t *testing.T) {
	for _, tc := range []struct {
		name   string
		format string
		args   []any
		level  string
	}{
		{"a cache's statistics", "%s might be too small. Metrics: %s\n", []any{"Block cache", "hit: 1"}, "DEBUG"},
		{"its life expectancy", "Cache life expectancy (in seconds): %+v\n", []any{"histogram"}, "DEBUG"},
		{"any other warning", "Value log %d truncated", []any{3}, "WARN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			b := badgerLogger{slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))}
			b.Warningf(tc.format, tc.args...)
			if !strings.Contains(out.String(), "level="+tc.level) {
				t.Errorf("Warningf(%q) logged %q, want level %s", tc.format, out.String(), tc.level)
			}
		})
	}
}
