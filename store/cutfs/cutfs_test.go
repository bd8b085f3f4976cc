package cutfs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gatehouse-dev/gatehouse/store/cutfs"
)

func TestMain(m *testing.M) {
	cutfs.Main()
	os.Exit(m.Run())
}

// fixture is a mount over a fresh backing folder.
type fixture struct {
	t  *testing.T
	fs *cutfs.FS
}

func mount(t *testing.T) *fixture {
	t.Helper()
	return &fixture{t: t, fs: cutfs.MountForTest(t, t.TempDir(), cutfs.Options{})}
}

// path is name on the mount.
func (f *fixture) path(name string) string { return filepath.Join(f.fs.Dir(), name) }

// create writes a new file with data through the mount, synced with its
// folder when durable is set.
func (f *fixture) create(name string, data []byte, durable bool) {
	f.t.Helper()
	w, err := os.OpenFile(f.path(name), os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		f.t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write(data); err != nil {
		f.t.Fatal(err)
	}
	if durable {
		if err := w.Sync(); err != nil {
			f.t.Fatal(err)
		}
		f.syncDir(filepath.Dir(name))
	}
}

func (f *fixture) syncDir(name string) {
	f.t.Helper()
	d, err := os.Open(f.path(name))
	if err != nil {
		f.t.Fatal(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		f.t.Fatalf("fsync folder %s: %v", name, err)
	}
}

// open opens name on the mount with flags; the file is closed at the end
// of the test, and may be closed before.
func (f *fixture) open(name string, flags int) *os.File {
	f.t.Helper()
	w, err := os.OpenFile(f.path(name), flags, 0o644)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { w.Close() })
	return w
}

// cut cuts the power, closes the mount and returns the backing folder, as
// the disk holds it after the power came back.
func (f *fixture) cut(o cutfs.CutOptions) (string, cutfs.CutReport) {
	f.t.Helper()
	r, err := f.fs.Cut(o)
	if err != nil {
		f.t.Fatal(err)
	}
	return f.fs.Backing(), r
}

// closeMount closes the mount, once every file on it is closed.
func (f *fixture) closeMount() string {
	f.t.Helper()
	if err := f.fs.Close(); err != nil {
		f.t.Fatal(err)
	}
	return f.fs.Backing()
}

// want checks the file name in the backing folder: its bytes, or that it
// is missing when data is nil.
func want(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join(dir, name))
	switch {
	case data == nil && err == nil:
		t.Errorf("%s: %d bytes survived the cut, want none", name, len(got))
	case data == nil && os.IsNotExist(err):
	case err != nil:
		t.Errorf("%s after the cut: %v", name, err)
	case !bytes.Equal(got, data):
		t.Errorf("%s after the cut: %q, want %q", name, abbrev(got), abbrev(data))
	}
}

func abbrev(b []byte) []byte {
	if len(b) > 64 {
		return append(append([]byte(nil), b[:64]...), "..."...)
	}
	return b
}

// TestPowerCutFSKeepsSyncedDataAndLosesTheRest: bytes fsynced (or
// fdatasynced) survive; bytes written after, appended or overwritten, do
// not; nor does anything done after the cut, synced or not.
func TestPowerCutFSKeepsSyncedDataAndLosesTheRest(t *testing.T) {
	f := mount(t)
	f.create("synced", []byte("one"), true)
	f.create("datasynced", nil, true)
	w := f.open("synced", os.O_RDWR)
	if _, err := w.WriteAt([]byte("two"), 3); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt([]byte("O"), 0); err != nil {
		t.Fatal(err)
	}
	// Through a descriptor opened for writing only, too.
	wo := f.open("synced", os.O_WRONLY)
	if _, err := wo.WriteAt([]byte("N"), 1); err != nil {
		t.Fatal(err)
	}
	wo.Close()
	d := f.open("datasynced", os.O_RDWR)
	if _, err := d.Write([]byte("kept")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fdatasync(int(d.Fd())); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Write([]byte(" lost")); err != nil {
		t.Fatal(err)
	}
	if live, _ := os.ReadFile(f.path("synced")); string(live) != "ONetwo" {
		t.Fatalf("the mount reads %q before the cut, want the live bytes", live)
	}
	f.cut(cutfs.CutOptions{})
	// The process goes on as a ghost: nothing it does now is kept.
	if _, err := w.WriteAt([]byte("after"), 0); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	d.Close()
	dir := f.closeMount()
	want(t, dir, "synced", []byte("one"))
	want(t, dir, "datasynced", []byte("kept"))
}

// TestPowerCutFSLosesAFileCreatedWithoutAFolderSync: a file whose bytes
// were synced but whose folder was not is gone, in the root and in a
// subfolder; with the folder synced it stays.
func TestPowerCutFSLosesAFileCreatedWithoutAFolderSync(t *testing.T) {
	f := mount(t)
	if err := os.Mkdir(f.path("sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A folder synced before its parent names it: what it held when
	// synced is there once the parent is, even a file deleted since.
	if err := os.Mkdir(f.path("late"), 0o755); err != nil {
		t.Fatal(err)
	}
	f.create("late/file", []byte("late"), true)
	if err := os.Remove(f.path("late/file")); err != nil {
		t.Fatal(err)
	}
	f.syncDir(".")
	f.create("sub/kept", []byte("data"), true)
	for _, name := range []string{"lost", "sub/lost"} {
		w := f.open(name, os.O_CREATE|os.O_RDWR)
		if _, err := w.Write([]byte("data")); err != nil {
			t.Fatal(err)
		}
		if err := w.Sync(); err != nil {
			t.Fatal(err)
		}
		w.Close()
	}
	// A folder made without its parent synced goes, with what it held.
	if err := os.Mkdir(f.path("newdir"), 0o755); err != nil {
		t.Fatal(err)
	}
	f.create("newdir/file", []byte("data"), true)
	f.cut(cutfs.CutOptions{})
	dir := f.closeMount()
	want(t, dir, "lost", nil)
	want(t, dir, "sub/lost", nil)
	want(t, dir, "sub/kept", []byte("data"))
	want(t, dir, "newdir/file", nil)
	want(t, dir, "late/file", []byte("late"))
}

// TestPowerCutFSRenameWithoutAFolderSyncReverts: a file renamed over
// another, without the folder synced, leaves the old file whole under
// its name; synced, the new one. A file deleted without the folder
// synced comes back. A rename between folders is durable in both or in
// neither.
func TestPowerCutFSRenameWithoutAFolderSyncReverts(t *testing.T) {
	f := mount(t)
	for _, name := range []string{"a", "b", "doomed"} {
		f.create(name, []byte("old "+name), true)
	}
	if err := os.Mkdir(f.path("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(f.path("y"), 0o755); err != nil {
		t.Fatal(err)
	}
	f.syncDir(".")
	f.create("x/moved", []byte("moved"), true)
	// Rename over a without a sync; over b with one.
	f.create("a.tmp", []byte("new a"), false)
	if err := os.Rename(f.path("a.tmp"), f.path("a")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(f.path("doomed")); err != nil {
		t.Fatal(err)
	}
	f.cut(cutfs.CutOptions{})
	dir := f.closeMount()
	want(t, dir, "a", []byte("old a"))
	want(t, dir, "a.tmp", nil)
	want(t, dir, "doomed", []byte("old doomed"))

	f = &fixture{t: t, fs: cutfs.MountForTest(t, dir, cutfs.Options{})}
	f.create("b.tmp", []byte("new b"), true) // its bytes synced: the rename publishes them
	if err := os.Rename(f.path("b.tmp"), f.path("b")); err != nil {
		t.Fatal(err)
	}
	f.syncDir(".")
	if err := os.Rename(f.path("x/moved"), f.path("y/moved")); err != nil {
		t.Fatal(err)
	}
	f.syncDir("y") // the source folder, x, is never synced
	f.cut(cutfs.CutOptions{})
	dir = f.closeMount()
	want(t, dir, "b", []byte("new b"))
	want(t, dir, "b.tmp", nil)
	want(t, dir, "a", []byte("old a"))
	want(t, dir, "y/moved", []byte("moved"))
	want(t, dir, "x/moved", nil)
}

// TestPowerCutFSDsyncWritesAreDurable: a write through a descriptor opened
// O_DSYNC, or O_DIRECT|O_DSYNC, is durable when it returns, as the
// kernel promises; one through O_DIRECT alone is not.
func TestPowerCutFSDsyncWritesAreDurable(t *testing.T) {
	f := mount(t)
	for _, name := range []string{"dsync", "direct-dsync", "direct"} {
		f.create(name, nil, true)
	}
	block := alignedBlock(t, 2*4096)
	copy(block, bytes.Repeat([]byte("d"), len(block)))
	for name, flags := range map[string]int{
		"dsync":        os.O_RDWR | unix.O_DSYNC,
		"direct-dsync": os.O_RDWR | unix.O_DIRECT | unix.O_DSYNC,
		"direct":       os.O_RDWR | unix.O_DIRECT,
	} {
		w := f.open(name, flags)
		if _, err := w.WriteAt(block, 0); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		w.Close()
	}
	f.cut(cutfs.CutOptions{})
	dir := f.closeMount()
	want(t, dir, "dsync", block)
	want(t, dir, "direct-dsync", block)
	want(t, dir, "direct", []byte{})
}

func alignedBlock(t *testing.T, n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}

// TestPowerCutFSTearsTheLastWriteAtAPageBoundary: a torn cut keeps a
// prefix of the last unsynced write, up to a page boundary or its end,
// over the durable bytes; the seeds between them tear it at more than one
// place.
func TestPowerCutFSTearsTheLastWriteAtAPageBoundary(t *testing.T) {
	const size = 8 * 4096
	old := bytes.Repeat([]byte("a"), size)
	dir := t.TempDir()
	seen := map[int64]bool{}
	for seed := range uint64(6) {
		if err := os.WriteFile(filepath.Join(dir, "log"), old, 0o644); err != nil {
			t.Fatal(err)
		}
		f := &fixture{t: t, fs: cutfs.MountForTest(t, dir, cutfs.Options{})}
		w := f.open("log", os.O_RDWR)
		const from, n = 50, size - 100
		if _, err := w.WriteAt(bytes.Repeat([]byte("b"), n), from); err != nil {
			t.Fatal(err)
		}
		w.Close()
		_, r := f.cut(cutfs.CutOptions{Tear: true, Seed: seed})
		f.closeMount()
		got, err := os.ReadFile(filepath.Join(dir, "log"))
		if err != nil {
			t.Fatal(err)
		}
		end := r.TornAt + r.TornBytes
		if r.TornAt < from || r.TornBytes <= 0 || end > from+n || end%4096 != 0 && end != from+n {
			t.Fatalf("seed %d: kept [%d, %d) of the write [%d, %d)", seed, r.TornAt, end, from, from+n)
		}
		wantBytes := append(append(append([]byte(nil), old[:r.TornAt]...), bytes.Repeat([]byte("b"), int(r.TornBytes))...), old[end:]...)
		if !bytes.Equal(got, wantBytes) {
			t.Fatalf("seed %d: the file is not the old bytes with [%d, %d) of the write over them", seed, r.TornAt, end)
		}
		seen[end] = true
	}
	if len(seen) < 2 {
		t.Errorf("every seed tore the write at the same place: %v", seen)
	}
}

// TestPowerCutFSTruncation: a truncation, shorter or longer, is not
// durable until the file is synced; then it is.
func TestPowerCutFSTruncation(t *testing.T) {
	f := mount(t)
	data := bytes.Repeat([]byte("0123456789"), 1000) // 10,000 bytes: a partial last page
	for _, name := range []string{"shrunk", "grown", "synced"} {
		f.create(name, data, true)
	}
	if err := os.Truncate(f.path("shrunk"), 3000); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(f.path("grown"), 1<<20); err != nil {
		t.Fatal(err)
	}
	w := f.open("synced", os.O_RDWR)
	if err := w.Truncate(5000); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := w.Truncate(0); err != nil { // and then to nothing, unsynced
		t.Fatal(err)
	}
	w.Close()
	// Truncated to nothing at open, then written: neither is durable.
	f.create("shrunk", []byte("x"), false)
	f.cut(cutfs.CutOptions{})
	dir := f.closeMount()
	want(t, dir, "shrunk", data)
	want(t, dir, "grown", data)
	want(t, dir, "synced", data[:5000])
}

// TestPowerCutFSMmapWritesNeedMsync: writes to a shared mapping are
// durable once msync'ed (MS_SYNC), and only then, as Badger relies on for
// its tables and memory-table logs.
func TestPowerCutFSMmapWritesNeedMsync(t *testing.T) {
	f := mount(t)
	f.create("mapped", make([]byte, 4*4096), true)
	w := f.open("mapped", os.O_RDWR)
	mem, err := unix.Mmap(int(w.Fd()), 0, 4*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	copy(mem[:4096], bytes.Repeat([]byte("s"), 4096))
	if err := unix.Msync(mem, unix.MS_SYNC); err != nil {
		t.Fatal(err)
	}
	copy(mem[4096:], bytes.Repeat([]byte("u"), 4096))
	// Written back, but not synced: still not durable.
	if err := unix.Msync(mem, unix.MS_ASYNC); err != nil {
		t.Fatal(err)
	}
	f.cut(cutfs.CutOptions{})
	if err := unix.Munmap(mem); err != nil {
		t.Fatal(err)
	}
	w.Close()
	dir := f.closeMount()
	want(t, dir, "mapped", append(bytes.Repeat([]byte("s"), 4096), make([]byte, 3*4096)...))
}

// TestPowerCutFSKeepPageCacheIsAKill: a cut that keeps the page cache, as
// kill -9 does, keeps everything written, synced or not: bytes, new
// names, and pages written through a shared mapping.
func TestPowerCutFSKeepPageCacheIsAKill(t *testing.T) {
	f := mount(t)
	f.create("mapped", make([]byte, 4096), true)
	f.create("unsynced", []byte("written"), false)
	w := f.open("mapped", os.O_RDWR)
	mem, err := unix.Mmap(int(w.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	copy(mem, bytes.Repeat([]byte("m"), 4096))
	f.cut(cutfs.CutOptions{KeepPageCache: true})
	if err := unix.Munmap(mem); err != nil {
		t.Fatal(err)
	}
	w.Close()
	dir := f.closeMount()
	want(t, dir, "unsynced", []byte("written"))
	want(t, dir, "mapped", bytes.Repeat([]byte("m"), 4096))
}
