package main

import (
	"os"
	"path/filepath"
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
