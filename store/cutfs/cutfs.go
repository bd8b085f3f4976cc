// Package cutfs is a power-cut file system for tests: a FUSE mount that
// passes every operation through to a real backing folder and keeps, in
// memory, what the disk would not hold yet. A cut throws that away: after
// Close, the backing folder holds what a disk would hold once the power
// came back.
//
// What becomes durable, and when, follows the strict reading of POSIX
// that storage engines must be written against:
//
//   - a file's bytes and size, when the file is fsynced or fdatasynced
//     (msync of a shared mapping arrives as the same fsync: FUSE carries
//     no range, so the whole file is synced);
//   - a write through a descriptor opened O_SYNC or O_DSYNC, when it
//     returns. O_DIRECT alone promises nothing of the kind (no cache
//     flush, no metadata), so it is a plain write here;
//   - a folder's entries (files created, renamed, linked, deleted), when
//     the folder is fsynced; a rename between two folders becomes durable
//     in both when either is synced, so it is never half done;
//   - nothing else: not a file's name because its bytes were synced, not
//     a size because the file was closed.
//
// A cut may tear the last write not yet durable at a 4 KiB page boundary
// (CutOptions.Tear): a prefix of its pages is kept, as if the disk had
// written that much of it back when the power failed.
//
// The FUSE server runs in a child process, the test binary itself started
// again (its TestMain calls Main): a process that maps files of a FUSE
// mount it serves deadlocks as soon as the Go runtime stops the world
// while a page fault waits for the server. The mount is made with mount(2)
// directly (go-fuse's DirectMount), so it needs root and /dev/fuse and
// nothing installed.
package cutfs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// The child process learns what to serve from its environment.
const (
	envServe   = "CUTFS_SERVE"
	envBacking = "CUTFS_BACKING"
	envMount   = "CUTFS_MOUNT"
)

// ErrUnsupported means this machine cannot mount the file system: no
// /dev/fuse, or not root.
var ErrUnsupported = errors.New("cutfs: needs /dev/fuse and root")

// Options configure a mount.
type Options struct {
	// MountPoint is the folder to mount on; empty makes a temporary one,
	// removed by Close.
	MountPoint string
	// Log receives the server's diagnostics; nil keeps them for the
	// errors of Cut and Close.
	Log io.Writer
}

// CutOptions configure a cut.
type CutOptions struct {
	// Tear keeps a prefix of the last write not yet durable, up to a page
	// boundary inside it (or the whole write), picked with Seed.
	Tear bool
	// Seed picks the tear's boundary.
	Seed uint64
	// KeepPageCache makes the cut a crash of the process alone, as kill -9
	// is: everything written so far is kept, synced or not, shared
	// mappings included. Tear is then ignored.
	KeepPageCache bool
}

// FS is a mounted power-cut file system.
type FS struct {
	dir, backing string
	madeDir      bool
	cmd          *exec.Cmd
	in           io.WriteCloser
	replies      chan string
	logs         *lockedBuffer

	mu     sync.Mutex
	cut    bool
	closed bool
}

// Supported returns nil when this machine can mount the file system, and
// otherwise an error matching ErrUnsupported that says why not.
func Supported() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: running as uid %d", ErrUnsupported, os.Geteuid())
	}
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnsupported, err)
	}
	_ = f.Close()
	return nil
}

// Mount mounts a power-cut file system over the folder backing, whose
// contents count as durable as they are, and returns once it serves. The
// test binary's TestMain must call Main first thing.
func Mount(ctx context.Context, backing string, o Options) (*FS, error) {
	if os.Getenv(envServe) != "" {
		return nil, errors.New("cutfs: Mount in a server process: the test binary's TestMain must call cutfs.Main first")
	}
	if err := Supported(); err != nil {
		return nil, err
	}
	backing, err := filepath.Abs(backing)
	if err != nil {
		return nil, fmt.Errorf("cutfs: %w", err)
	}
	m := &FS{backing: backing, dir: o.MountPoint, logs: &lockedBuffer{w: o.Log}, replies: make(chan string, 1)}
	if m.dir == "" {
		if m.dir, err = os.MkdirTemp("", "cutfs-"); err != nil {
			return nil, fmt.Errorf("cutfs: %w", err)
		}
		m.madeDir = true
	}
	if m.dir, err = filepath.Abs(m.dir); err != nil {
		return nil, fmt.Errorf("cutfs: %w", err)
	}
	// -test.run=^$: a test binary whose TestMain does not call Main runs
	// no test, instead of starting the tests (and mounts) again.
	m.cmd = exec.Command(os.Args[0], "-test.run=^$")
	// A race-enabled binary sleeps a second before it exits, unless told.
	m.cmd.Env = append(os.Environ(), envServe+"=1", envBacking+"="+backing, envMount+"="+m.dir,
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	m.cmd.Stderr = m.logs
	if m.in, err = m.cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("cutfs: %w", err)
	}
	out, err := m.cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("cutfs: %w", err)
	}
	if err := m.cmd.Start(); err != nil {
		return nil, fmt.Errorf("cutfs: start the server: %w", err)
	}
	go func() {
		defer close(m.replies)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			m.replies <- sc.Text()
		}
	}()
	if _, err := m.reply(ctx, 20*time.Second); err != nil {
		m.abandon()
		return nil, fmt.Errorf("cutfs: mount %s over %s: %w", m.dir, backing, err)
	}
	return m, nil
}

// MountForTest mounts a power-cut file system over backing for the test,
// and closes it when the test ends; it skips the test, saying why, where
// the machine cannot mount one.
func MountForTest(tb testing.TB, backing string, o Options) *FS {
	tb.Helper()
	if err := Supported(); err != nil {
		tb.Skipf("no power-cut file system here (%v): run the test as root on a machine with /dev/fuse", err)
	}
	if o.Log == nil {
		o.Log = testLog{tb}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := Mount(ctx, backing, o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := m.Close(); err != nil {
			tb.Errorf("cutfs: %v", err)
		}
	})
	return m
}

// Dir returns the mount point.
func (m *FS) Dir() string { return m.dir }

// Backing returns the backing folder.
func (m *FS) Backing() string { return m.backing }

// Cut cuts the power: what is not durable now never will be. The mount
// stays up until Close, so that a process still running on it (its files
// open, mapped) can be stopped or closed first, as a ghost: whatever it
// does from now on is lost. A second cut does nothing.
func (m *FS) Cut(o CutOptions) (CutReport, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return CutReport{}, errors.New("cutfs: cut after close")
	}
	cmd := fmt.Sprintf("cut %d %d", btoi(o.Tear), o.Seed)
	if o.KeepPageCache {
		// The kernel holds pages written through shared mappings until it
		// writes them back: have it hand them to the server first.
		if err := flushAll(m.dir); err != nil {
			return CutReport{}, err
		}
		cmd = "crash"
	}
	line, err := m.command(cmd, 30*time.Second)
	if err != nil {
		return CutReport{}, err
	}
	m.cut = true
	var r CutReport
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		return CutReport{}, fmt.Errorf("cutfs: cut: %q: %w", line, err)
	}
	return r, nil
}

// Close unmounts and leaves the backing folder as the disk would hold it
// after the cut, or, without one, after a cut now. Whatever runs on the
// mount must have let go of it first (its files closed, its process
// ended). A second Close does nothing.
func (m *FS) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	// A file the code under test dropped without closing it stays open,
	// and the mount busy, until its finalizer runs; a process that ends
	// would close it.
	runtime.GC()
	_, err := m.command("close", 2*time.Minute)
	if err != nil {
		m.abandon()
	} else {
		werr := make(chan error, 1)
		go func() { werr <- m.cmd.Wait() }()
		select {
		case err = <-werr:
		case <-time.After(30 * time.Second):
			m.abandon()
			err = errors.New("cutfs: the server did not exit")
		}
	}
	if m.madeDir {
		if rerr := os.Remove(m.dir); rerr != nil && err == nil {
			err = fmt.Errorf("cutfs: %w", rerr)
		}
	}
	return err
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// flushAll has the kernel hand the server every page it holds for a
// file of the mount at dir, and waits until the server has them: an fsync
// of each file, which waits for the writes in flight, where syncfs(2)
// does not for FUSE. The fsyncs make the files durable in the model too,
// as the crash that follows does anyway.
func flushAll(dir string) error {
	return filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil // gone meanwhile, or not a file: nothing to flush
		}
		f, err := os.Open(p)
		if err != nil {
			return nil
		}
		defer f.Close()
		if err := f.Sync(); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("cutfs: flush %s: %w", p, err)
		}
		return nil
	})
}

// command sends one line to the server and returns its answer.
func (m *FS) command(line string, wait time.Duration) (string, error) {
	if _, err := io.WriteString(m.in, line+"\n"); err != nil {
		return "", fmt.Errorf("cutfs: %s: %w%s", line, err, m.logs.tail())
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	r, err := m.reply(ctx, wait)
	if err != nil {
		return "", fmt.Errorf("cutfs: %s: %w", line, err)
	}
	return r, nil
}

// reply waits for the server's next answer: "ok" and what follows, or
// "err" and why.
func (m *FS) reply(ctx context.Context, wait time.Duration) (string, error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case line, ok := <-m.replies:
		if !ok {
			return "", fmt.Errorf("the server ended%s", m.logs.tail())
		}
		if rest, ok := strings.CutPrefix(line, "ok"); ok {
			return strings.TrimSpace(rest), nil
		}
		return "", fmt.Errorf("%s%s", strings.TrimPrefix(line, "err "), m.logs.tail())
	case <-ctx.Done():
		return "", fmt.Errorf("%w%s", ctx.Err(), m.logs.tail())
	case <-t.C:
		return "", fmt.Errorf("no answer in %v%s", wait, m.logs.tail())
	}
}

// abandon ends a server that does not answer and detaches its mount, so
// that no later command hangs on it. The backing folder is left as the
// live state was, with the model's folder in it.
func (m *FS) abandon() {
	_ = m.cmd.Process.Kill()
	_ = m.cmd.Wait()
	_ = syscall.Unmount(m.dir, syscall.MNT_DETACH)
}

// Main serves a mount when the process was started as a cutfs server, and
// then exits; otherwise it returns at once. A test binary that mounts a
// power-cut file system calls it first thing in its TestMain.
func Main() {
	if os.Getenv(envServe) == "" {
		return
	}
	os.Exit(serve(os.Getenv(envBacking), os.Getenv(envMount), os.Stdin, os.Stdout, os.Stderr))
}

// serve mounts backing on mnt, answers the commands read from in on out
// until "close" or the end of in (the test process ended), then unmounts
// and leaves backing as the durable image.
func serve(backing, mnt string, in io.Reader, out, logw io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(out, "err %v\n", err)
		return 1
	}
	m, err := newModel(backing)
	if err != nil {
		return fail(err)
	}
	root, err := newRoot(m)
	if err != nil {
		return fail(err)
	}
	second := time.Second
	server, err := fs.Mount(mnt, root, &fs.Options{
		MountOptions: fuse.MountOptions{
			DirectMountStrict: true,
			FsName:            "cutfs:" + backing,
			Name:              "cutfs",
			// Every write must reach the server: no writeback cache (its
			// default), and no kernel passthrough (the file handles do
			// not offer their descriptors).
			MaxBackground: 64,
		},
		EntryTimeout: &second,
		AttrTimeout:  &second,
	})
	if err != nil {
		return fail(fmt.Errorf("cutfs: mount: %w", err))
	}
	fmt.Fprintln(out, "ok")
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if f[0] == "close" {
			break
		}
		if f[0] == "crash" {
			if err := m.crash(); err != nil {
				fmt.Fprintf(out, "err %v\n", err)
				continue
			}
			fmt.Fprintln(out, "ok {}")
			continue
		}
		if f[0] != "cut" || len(f) != 3 {
			fmt.Fprintf(out, "err cutfs: unknown command %q\n", sc.Text())
			continue
		}
		var seed uint64
		fmt.Sscan(f[2], &seed)
		r := m.freeze(f[1] == "1", seed)
		b, _ := json.Marshal(r)
		fmt.Fprintf(out, "ok %s\n", b)
	}
	m.freeze(false, 0)
	if err := unmount(server, mnt, logw); err != nil {
		return fail(err)
	}
	if err := m.materialize(); err != nil {
		return fail(err)
	}
	fmt.Fprintln(out, "ok")
	return 0
}

// unmount unmounts mnt, waiting a little for the kernel to let go of the
// files just closed; failing that, it detaches the mount and waits for
// the last user to let go.
func unmount(server *fuse.Server, mnt string, logw io.Writer) error {
	if err := server.Unmount(); err == nil {
		return nil
	} else {
		fmt.Fprintf(logw, "cutfs: unmount %s: %v; detaching it; in use by %s\n", mnt, err, holders(mnt))
	}
	if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("cutfs: detach %s: %w", mnt, err)
	}
	done := make(chan struct{})
	go func() { server.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("cutfs: %s is still in use 30s after it was detached", mnt)
	}
}

// holders names the processes that hold files of the mount at mnt open
// or mapped, and the first such file of each, for the log of a mount
// that will not go.
func holders(mnt string) string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, proc := range procs {
		var held []string
		fds, _ := filepath.Glob(proc + "/fd/*")
		for _, fd := range fds {
			if p, err := os.Readlink(fd); err == nil && (p == mnt || strings.HasPrefix(p, mnt+"/")) {
				held = append(held, "fd "+p)
			}
		}
		if maps, err := os.ReadFile(proc + "/maps"); err == nil {
			for _, line := range strings.Split(string(maps), "\n") {
				if i := strings.Index(line, mnt+"/"); i >= 0 {
					held = append(held, "map "+line[i:])
				}
			}
		}
		if len(held) > 0 {
			out = append(out, fmt.Sprintf("pid %s (%d files, %s)", filepath.Base(proc), len(held), held[0]))
		}
	}
	if len(out) == 0 {
		return "no process"
	}
	return strings.Join(out, "; ")
}

// lockedBuffer keeps what the server logs, for errors, and passes it on.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	w   io.Writer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 64<<10 {
		b.buf.Reset()
	}
	b.buf.Write(p)
	if b.w != nil {
		_, _ = b.w.Write(p)
	}
	return len(p), nil
}

// tail returns the last of the server's log, to end an error with.
func (b *lockedBuffer) tail() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := strings.TrimSpace(b.buf.String())
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	if s == "" {
		return ""
	}
	return "; server log: " + s
}

// testLog passes the server's log to the test's.
type testLog struct{ tb testing.TB }

func (l testLog) Write(p []byte) (int, error) {
	l.tb.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
