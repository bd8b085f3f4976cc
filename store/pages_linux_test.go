package store

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
)

func TestTableMapping(t *testing.T) {
	const dir = "/data/gh"
	for _, tc := range []struct {
		name, line string
		start, end uintptr
		ok         bool
	}{
		{"a table", "7f0000000000-7f0000200000 r--s 00000000 fd:01 1234 /data/gh/000001.sst", 0x7f0000000000, 0x7f0000200000, true},
		{"a value log", "7f0000000000-7f0008000000 rw-s 00000000 fd:01 1235 /data/gh/000001.vlog", 0x7f0000000000, 0x7f0008000000, true},
		{"a segment of the log", "7f0000000000-7f0002000000 r--s 00000000 fd:01 1241 /data/gh/logs/0000000000000001.seg", 0x7f0000000000, 0x7f0002000000, true},
		{"a segment's sidecar", "7f0000000000-7f0000200000 r--s 00000000 fd:01 1242 /data/gh/logs/0000000000000001.idx", 0, 0, false},
		{"a memory table's log", "7f0000000000-7f0000800000 rw-s 00000000 fd:01 1236 /data/gh/00001.mem", 0, 0, false},
		{"a table of another folder", "7f0000000000-7f0000200000 r--s 00000000 fd:01 1237 /data/other/000001.sst", 0, 0, false},
		{"a table in a folder below", "7f0000000000-7f0000200000 r--s 00000000 fd:01 1238 /data/gh/x/000001.sst", 0, 0, false},
		{"a deleted table", "7f0000000000-7f0000200000 r--s 00000000 fd:01 1239 /data/gh/000001.sst (deleted)", 0, 0, false},
		{"anonymous memory", "7f0000000000-7f0000200000 rw-p 00000000 00:00 0", 0, 0, false},
		{"a broken range", "7f0000200000-7f0000000000 r--s 00000000 fd:01 1240 /data/gh/000001.sst", 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start, end, ok := tableMapping(tc.line, dir)
			if start != tc.start || end != tc.end || ok != tc.ok {
				t.Errorf("tableMapping = %#x-%#x %v, want %#x-%#x %v", start, end, ok, tc.start, tc.end, tc.ok)
			}
		})
	}
}

// TestPageOutTables: the pages of the tables Badger wrote leave the RSS,
// and the data reads back the same.
func TestPageOutTables(t *testing.T) {
	t.Parallel()
	dir := pageableDir(t)
	// The store's own pass must not hand the pages back before the test
	// has seen them resident.
	s := openWith(t, Options{Dir: dir, MemoryLimit: 256 * mib, pageOutEvery: time.Hour})
	defer s.Close()
	if got := s.tablePages(); got != dir {
		t.Fatalf("tablePages = %q, want %q", got, dir)
	}
	vals := make([][]byte, 64)
	for i := range vals {
		vals[i] = []byte(rand.Text() + strings.Repeat(rand.Text(), 2000))
		var b Batch
		b.Append("pages", uint64(i+1), vals[i])
		if err := s.Write(context.Background(), &b); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Compact(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := tableRSS(t, dir)
	if before == 0 {
		t.Fatal("no table pages in the RSS after writing tables")
	}
	if err := pageOut(dir); err != nil {
		t.Fatal(err)
	}
	if after := tableRSS(t, dir); after >= before {
		t.Errorf("table pages in the RSS: %d KiB before paging out, %d KiB after", before, after)
	}
	n := 0
	err := s.Scan("pages", 0, func(seq uint64, v []byte) bool {
		if string(v) != string(vals[seq-1]) {
			t.Errorf("entry %d reads back as %d bytes, not the %d written", seq, len(v), len(vals[seq-1]))
		}
		n++
		return true
	})
	if err != nil || n != len(vals) {
		t.Fatalf("read %d entries (%v), want %d", n, err, len(vals))
	}
}

// TestStorePagesOutByItself: under a memory limit the store's own loop
// sees the pages of its files grow, as a compaction writes tables and a
// read faults them in, and hands them back with no call from outside.
func TestStorePagesOutByItself(t *testing.T) {
	t.Parallel()
	dir := pageableDir(t)
	s := openWith(t, Options{Dir: dir, MemoryLimit: 256 * mib})
	defer s.Close()
	// 4 MiB that no compression shrinks: twice the growth that makes a
	// pass.
	for i := range 64 {
		v := make([]byte, 64<<10)
		rand.Read(v)
		var b Batch
		b.Append("pages", uint64(i+1), v)
		if err := s.Write(context.Background(), &b); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Compact(context.Background()); err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := s.Scan("pages", 0, func(uint64, []byte) bool { n++; return true }); err != nil || n != 64 {
		t.Fatalf("read %d entries (%v), want 64", n, err)
	}
	eventually.True(t, "the store hands its table pages back", func() bool { return tableRSS(t, dir) < 1024 })
}

func TestResidentFiles(t *testing.T) {
	before, err := residentFiles()
	if err != nil || before <= 0 {
		t.Fatalf("residentFiles = %d, %v: want the binary's own pages at least", before, err)
	}
	const size = 8 * mib
	f, err := os.Create(filepath.Join(t.TempDir(), "mapped"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < size; i += os.Getpagesize() {
		m[i] = 1
	}
	touched, err := residentFiles()
	if err := unix.Munmap(m); err != nil {
		t.Fatal(err)
	}
	// Other goroutines of the test binary may map or drop a little
	// meanwhile; the file's 8 MiB show.
	if err != nil || touched < before+size*3/4 {
		t.Errorf("residentFiles = %d KiB before touching an 8 MiB mapping, %d KiB after (%v)", before/kib, touched/kib, err)
	}
}

// pageableDir returns a test folder whose file pages can leave memory:
// not a tmpfs, by its resolved path (as /proc/self/maps names it).
func pageableDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC {
		t.Skip("tmpfs pages have nowhere to go without swap")
	}
	return dir
}

// tableRSS sums the resident KiB of dir's table mappings in this process.
func tableRSS(t *testing.T, dir string) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	total, in := 0, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if fields := strings.Fields(line); len(fields) > 0 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			_, _, in = tableMapping(line, dir)
			continue
		}
		if rest, ok := strings.CutPrefix(line, "Rss:"); ok && in {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			if err != nil {
				t.Fatal(fmt.Errorf("smaps: %q: %w", line, err))
			}
			total += kb
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return total
}
