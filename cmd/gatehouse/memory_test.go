package main

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func TestMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flagged int64
		files   map[string]string
		want    int64
		source  string
	}{
		{"no cgroup, no flag", 0, nil, 0, ""},
		{"the flag wins", 512 << 20, map[string]string{"memory.max": "268435456\n"}, 512 << 20, "--memory-limit"},
		{"cgroup v2", 0, map[string]string{"memory.max": "268435456\n"}, 256 << 20, "cgroup"},
		{"cgroup v2 without a limit", 0, map[string]string{"memory.max": "max\n"}, 0, ""},
		{"cgroup v1", 0, map[string]string{"memory/memory.limit_in_bytes": "268435456\n"}, 256 << 20, "cgroup"},
		{"cgroup v1 without a limit", 0, map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0, ""},
		{"garbage", 0, map[string]string{"memory.max": "lots\n"}, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for name, content := range tc.files {
				path := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, source := memoryLimit(tc.flagged, root)
			if got != tc.want || source != tc.source {
				t.Errorf("memoryLimit = %d (%q), want %d (%q)", got, source, tc.want, tc.source)
			}
		})
	}
}

// TestApplyMemoryLimit: GOGC is set to half of Go's default, and to a
// quarter with a memory limit, which also sets the heap's soft limit; each
// unless its environment variable is set.
func TestApplyMemoryLimit(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	for _, tc := range []struct {
		name           string
		limit          int64
		gogc, gomemlim string
		wantGC         int
		wantLimit      int64
	}{
		{"no limit", 0, "", "", 50, math.MaxInt64},
		{"no limit, GOGC set", 0, "100", "", 100, math.MaxInt64},
		{"a limit", 256 << 20, "", "", 25, 192 << 20},
		{"GOGC set", 256 << 20, "100", "", 100, 192 << 20},
		{"GOMEMLIMIT set", 256 << 20, "", "1GiB", 25, math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOGC", tc.gogc)
			t.Setenv("GOMEMLIMIT", tc.gomemlim)
			debug.SetGCPercent(100)
			debug.SetMemoryLimit(math.MaxInt64)
			if got := applyMemoryLimit(tc.limit); got != tc.wantLimit {
				t.Errorf("applyMemoryLimit = %d, want %d", got, tc.wantLimit)
			}
			if got := debug.SetMemoryLimit(-1); got != tc.wantLimit {
				t.Errorf("heap limit %d, want %d", got, tc.wantLimit)
			}
			if got := debug.SetGCPercent(100); got != tc.wantGC {
				t.Errorf("GOGC %d, want %d", got, tc.wantGC)
			}
		})
	}
}
