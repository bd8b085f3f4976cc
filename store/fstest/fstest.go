// Package fstest gives tests a real, small file system: a tmpfs mounted
// for the test (mounting needs root; without it the test is skipped, and
// docs/edge.md says how to run such tests), and ballast files that take
// its space.
package fstest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// Mount mounts a tmpfs of size bytes on dir (made if missing) until the
// test ends, or skips the test when mounting is refused.
func Mount(tb testing.TB, dir string, size int64) {
	tb.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		tb.Skipf("cannot mount a %d KiB tmpfs (%v: %s): run as root, or see docs/edge.md", size>>10, err, bytes.TrimSpace(out))
	}
	tb.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			tb.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
}

// Small mounts a tmpfs of size bytes on a fresh folder and returns it.
func Small(tb testing.TB, size int64) string {
	tb.Helper()
	dir := tb.TempDir()
	Mount(tb, dir, size)
	return dir
}

// Ballast takes n bytes of a file system with a file at path (none when n
// is not positive: the file is still made).
func Ballast(tb testing.TB, path string, n int64) {
	tb.Helper()
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if n <= 0 {
		return
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, n); err != nil {
		tb.Fatalf("take %d KiB of %s: %v", n>>10, path, err)
	}
}

// Free returns the bytes an unprivileged writer may still use on the file
// system holding dir.
func Free(tb testing.TB, dir string) int64 {
	tb.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		tb.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}
