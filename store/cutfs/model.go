package cutfs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// The model: the backing folder holds what the page cache would show, the
// live state, and every operation goes through to it at once; the model
// keeps beside it what the disk holds, the durable image, as the
// difference between the two:
//
//   - per regular file (by the backing inode): its durable size, and the
//     durable bytes of every page overwritten, or cut off by a truncation,
//     since the file was last synced (undo). A page not in undo holds its
//     durable bytes in the backing file, up to the durable size;
//   - per directory (by the backing inode): its durable entries, the
//     entries it had when it was last synced;
//   - for every file that a durable entry names, a hard link in the
//     attic (the hidden stateDir), so that unlinking or replacing it in
//     the live folder keeps its inode, and so its durable bytes.
//
// A cut freezes the model; Close then rebuilds the backing folder as the
// durable image (materialize).

// pageSize is the unit of the page cache, of undo, and of a torn write.
const pageSize = 4096

// stateDir is the model's folder in the backing folder's root, hidden from
// the mount.
const stateDir = ".cutfs"

// backingFile is the live file an operation goes through.
type backingFile interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	Truncate(size int64) error
	Size() (int64, error)
}

// entry is a durable directory entry.
type entry struct {
	ino    uint64
	typ    uint32 // S_IFDIR, S_IFREG or S_IFLNK
	target string // a symbolic link's target
}

// fileState is what the model knows of one regular file.
type fileState struct {
	durable int64
	undo    map[int64][]byte // page -> durable bytes; nil: zeros
	attic   string           // hard link keeping the inode, or ""
	// last is the latest write not yet durable, for a torn cut.
	last *lastWrite
}

type lastWrite struct {
	seq    uint64
	off, n int64
}

// rename is a rename between two folders that neither has synced yet: it
// becomes durable in both when either is synced, as one journaled
// operation does.
type rename struct {
	fromDir, toDir   uint64
	fromName, toName string
	e                entry
}

type model struct {
	mu      sync.Mutex
	root    string
	rootIno uint64
	files   map[uint64]*fileState
	dirs    map[uint64]map[string]entry
	renames []rename
	seq     uint64
	cut     bool
	// Counters, for the report.
	syncs, dirSyncs, durableWrites, lostWrites uint64
}

// CutReport says what a cut found.
type CutReport struct {
	// UnsyncedFiles is how many files had writes, a truncation or a size
	// not yet durable.
	UnsyncedFiles int
	// TornAt and TornBytes are where the last unsynced write began (the
	// last the kernel sent: it may split one write(2) in several) and how
	// much of it the cut kept.
	TornAt, TornBytes int64
	// TornFile is the live path of the torn write's file, if known.
	TornFile string
	// DurableWrites, Syncs and DirSyncs count the O_SYNC/O_DSYNC writes,
	// the file syncs and the folder syncs before the cut.
	DurableWrites, Syncs, DirSyncs uint64
}

func (m *model) attic() string { return filepath.Join(m.root, stateDir, "attic") }

// newModel takes the folder at root as durable as it is.
func newModel(root string) (*model, error) {
	m := &model{root: root, files: map[uint64]*fileState{}, dirs: map[uint64]map[string]entry{}}
	if err := os.RemoveAll(filepath.Join(root, stateDir)); err != nil {
		return nil, fmt.Errorf("cutfs: clear a stale state folder: %w", err)
	}
	if err := os.MkdirAll(m.attic(), 0o700); err != nil {
		return nil, fmt.Errorf("cutfs: %w", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(root, &st); err != nil {
		return nil, fmt.Errorf("cutfs: %w", err)
	}
	m.rootIno = st.Ino
	var walk func(dir string, ino uint64) error
	walk = func(dir string, ino uint64) error {
		entries, err := m.snapshot(dir)
		if err != nil {
			return err
		}
		m.dirs[ino] = entries
		for name, e := range entries {
			if e.typ == syscall.S_IFDIR {
				if err := walk(filepath.Join(dir, name), e.ino); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, st.Ino); err != nil {
		return nil, err
	}
	return m, nil
}

// snapshot reads the live entries of dir, giving every regular file an
// attic link and a state (durable as it is, when new to the model: only
// the walk at start meets files the model has not seen created).
func (m *model) snapshot(dir string) (map[string]entry, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("cutfs: %w", err)
	}
	out := make(map[string]entry, len(des))
	for _, de := range des {
		name := de.Name()
		if dir == m.root && name == stateDir {
			continue
		}
		p := filepath.Join(dir, name)
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			if errors.Is(err, syscall.ENOENT) {
				continue
			}
			return nil, fmt.Errorf("cutfs: %w", err)
		}
		e := entry{ino: st.Ino, typ: st.Mode & syscall.S_IFMT}
		switch e.typ {
		case syscall.S_IFDIR:
		case syscall.S_IFLNK:
			if e.target, err = os.Readlink(p); err != nil {
				return nil, fmt.Errorf("cutfs: %w", err)
			}
		case syscall.S_IFREG:
			f := m.files[st.Ino]
			if f == nil {
				f = &fileState{durable: st.Size}
				m.files[st.Ino] = f
			}
			if err := m.keep(f, st.Ino, p); err != nil {
				return nil, err
			}
		default:
			continue // devices, pipes, sockets: not modelled
		}
		out[name] = e
	}
	return out, nil
}

// keep gives f, live at path p, a hard link in the attic.
func (m *model) keep(f *fileState, ino uint64, p string) error {
	if f.attic != "" {
		return nil
	}
	a := filepath.Join(m.attic(), fmt.Sprint(ino))
	if err := os.Link(p, a); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("cutfs: keep %s: %w", p, err)
	}
	f.attic = a
	return nil
}

// file returns the state of the regular file ino, made for a file the
// model has not seen: created through the mount, it holds nothing durable.
func (m *model) file(ino uint64) *fileState {
	f := m.files[ino]
	if f == nil {
		f = &fileState{}
		m.files[ino] = f
	}
	return f
}

// created registers a file just created through the mount.
func (m *model) created(ino uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.file(ino)
}

// save records the durable bytes of page p of f before a change to it,
// once per page between syncs. Pages wholly past the durable size have
// none.
func (m *model) save(f *fileState, b backingFile, p int64) error {
	if p*pageSize >= f.durable {
		return nil
	}
	if _, ok := f.undo[p]; ok {
		return nil
	}
	page := make([]byte, pageSize)
	n := min(pageSize, f.durable-p*pageSize)
	if _, err := b.ReadAt(page[:n], p*pageSize); err != nil && !isEOF(err) {
		return fmt.Errorf("cutfs: save a page: %w", err)
	}
	if f.undo == nil {
		f.undo = map[int64][]byte{}
	}
	if bytes.Count(page, []byte{0}) == pageSize {
		page = nil
	}
	f.undo[p] = page
	return nil
}

// saveRange saves the pages of f that [from, to) touches.
func (m *model) saveRange(f *fileState, b backingFile, from, to int64) error {
	for p := from / pageSize; p*pageSize < to; p++ {
		if err := m.save(f, b, p); err != nil {
			return err
		}
	}
	return nil
}

// write writes data at off to the live file ino. With durable set (a
// descriptor opened O_SYNC or O_DSYNC) it is durable when it returns, as
// the kernel promises, unless the power is already cut.
func (m *model) write(ino uint64, b backingFile, data []byte, off int64, durable bool) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.file(ino)
	end := off + int64(len(data))
	if durable && !m.cut {
		return m.writeDurable(f, b, data, off)
	}
	if err := m.saveRange(f, b, off, end); err != nil {
		return 0, err
	}
	n, err := b.WriteAt(data, off)
	if n > 0 {
		m.seq++
		f.last = &lastWrite{seq: m.seq, off: off, n: int64(n)}
	}
	return n, err
}

// writeDurable writes data at off and makes it durable (see absorb).
func (m *model) writeDurable(f *fileState, b backingFile, data []byte, off int64) (int, error) {
	if err := m.prepareDurable(f, b, off, off+int64(len(data))); err != nil {
		return 0, err
	}
	n, err := b.WriteAt(data, off)
	if n > 0 {
		m.durableWrites++
		absorb(f, data[:n], off)
	}
	return n, err
}

// prepareDurable readies the pages of f that a durable write of [off, end)
// changes: their durable bytes are saved, and pages between the durable
// size and off get a durable copy of zeros, since the write makes the
// durable size grow past them whatever the live file holds there.
func (m *model) prepareDurable(f *fileState, b backingFile, off, end int64) error {
	for p := min(off, f.durable) / pageSize; p*pageSize < end; p++ {
		if p*pageSize < f.durable {
			if err := m.save(f, b, p); err != nil {
				return err
			}
			continue
		}
		if _, ok := f.undo[p]; !ok {
			if f.undo == nil {
				f.undo = map[int64][]byte{}
			}
			f.undo[p] = nil
		}
	}
	return nil
}

// absorb makes data, written at off, durable in f: the pages it changes
// take its bytes into their durable copy (a page it wrote whole needs none:
// the live one is the durable one), and the durable size grows to cover it.
func absorb(f *fileState, data []byte, off int64) {
	end := off + int64(len(data))
	for p := off / pageSize; p*pageSize < end; p++ {
		lo, hi := p*pageSize, (p+1)*pageSize
		if lo >= off && hi <= end {
			delete(f.undo, p)
			continue
		}
		page, ok := f.undo[p]
		if !ok {
			continue
		}
		if page == nil {
			page = make([]byte, pageSize)
			f.undo[p] = page
		}
		wlo, whi := max(lo, off), min(hi, end)
		copy(page[wlo-lo:whi-lo], data[wlo-off:whi-off])
	}
	f.durable = max(f.durable, end)
}

// truncate sets the live size of ino, saving the durable pages it cuts
// off or zeroes.
func (m *model) truncate(ino uint64, b backingFile, size int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.file(ino)
	if err := m.saveRange(f, b, size, f.durable); err != nil {
		return err
	}
	if f.last != nil && f.last.off+f.last.n > size {
		f.last = nil
	}
	return b.Truncate(size)
}

// changeRange saves the durable pages of [off, off+n) of ino before an
// operation that changes them in place (a hole punched, a range zeroed).
func (m *model) changeRange(ino uint64, b backingFile, off, n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.file(ino)
	if f.last != nil && f.last.off+f.last.n > off {
		f.last = nil
	}
	return m.saveRange(f, b, off, off+n)
}

// fsync makes ino durable as the live file is: its bytes and its size.
// Its names are not: their folders must be synced.
func (m *model) fsync(ino uint64, b backingFile) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cut {
		return nil
	}
	size, err := b.Size()
	if err != nil {
		return fmt.Errorf("cutfs: fsync: %w", err)
	}
	f := m.file(ino)
	f.durable, f.undo, f.last = size, nil, nil
	m.syncs++
	return nil
}

// syncDir makes the live entries of the folder at path durable, and the
// renames between it and another folder, in both.
func (m *model) syncDir(path string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cut {
		return nil
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fmt.Errorf("cutfs: fsync folder: %w", err)
	}
	entries, err := m.snapshot(path)
	if err != nil {
		return err
	}
	m.dirs[st.Ino] = entries
	m.dirSyncs++
	kept := m.renames[:0]
	for _, r := range m.renames {
		switch st.Ino {
		case r.fromDir:
			if d := m.dirs[r.toDir]; d != nil {
				d[r.toName] = r.e
			}
		case r.toDir:
			if d := m.dirs[r.fromDir]; d != nil && d[r.fromName].ino == r.e.ino {
				delete(d, r.fromName)
			}
		default:
			kept = append(kept, r)
		}
	}
	m.renames = kept
	m.collect()
	return nil
}

// renamed notes a rename between folders (see rename), the file's inode
// kept in the attic, so that the entry can be made durable later whatever
// becomes of the file.
func (m *model) renamed(fromDir, toDir uint64, fromName, toName, newPath string) error {
	if fromDir == toDir {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var st syscall.Stat_t
	if err := syscall.Lstat(newPath, &st); err != nil {
		return fmt.Errorf("cutfs: rename: %w", err)
	}
	e := entry{ino: st.Ino, typ: st.Mode & syscall.S_IFMT}
	switch e.typ {
	case syscall.S_IFREG:
		if err := m.keep(m.file(st.Ino), st.Ino, newPath); err != nil {
			return err
		}
	case syscall.S_IFLNK:
		var err error
		if e.target, err = os.Readlink(newPath); err != nil {
			return fmt.Errorf("cutfs: rename: %w", err)
		}
	case syscall.S_IFDIR:
	default:
		return nil
	}
	m.renames = append(m.renames, rename{fromDir: fromDir, toDir: toDir, fromName: fromName, toName: toName, e: e})
	return nil
}

// unlinked forgets a file whose last name went, if no durable entry can
// name it again.
func (m *model) unlinked(ino uint64, lastLink bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f := m.files[ino]; f != nil && f.attic == "" && lastLink {
		delete(m.files, ino)
	}
}

// collect lets go of the attic links of files no durable entry names (in
// any folder: one not named yet may be, once its parent is synced), and
// of the state of those that have no live name either.
func (m *model) collect() {
	named := map[uint64]bool{}
	for _, r := range m.renames {
		named[r.e.ino] = true
	}
	for _, d := range m.dirs {
		for _, e := range d {
			named[e.ino] = true
		}
	}
	for ino, f := range m.files {
		if f.attic == "" || named[ino] {
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(f.attic, &st); err == nil && st.Nlink <= 1 {
			delete(m.files, ino)
		}
		_ = os.Remove(f.attic)
		f.attic = ""
	}
}

// freeze cuts the power: from now on nothing becomes durable. With tear,
// the last write not yet durable is kept in part, up to a page boundary
// picked with seed, as if the disk had written that much of it back.
func (m *model) freeze(tear bool, seed uint64) CutReport {
	m.mu.Lock()
	defer m.mu.Unlock()
	var r CutReport
	if m.cut {
		return r
	}
	m.cut = true
	r.DurableWrites, r.Syncs, r.DirSyncs = m.durableWrites, m.syncs, m.dirSyncs
	var last *fileState
	var lastIno uint64
	for ino, f := range m.files {
		if len(f.undo) > 0 || f.last != nil {
			r.UnsyncedFiles++
		}
		if f.last != nil && (last == nil || f.last.seq > last.last.seq) {
			last, lastIno = f, ino
		}
	}
	if !tear || last == nil {
		return r
	}
	w := last.last
	// The boundaries inside the write, and its end: a write within one
	// page is kept whole or not at all.
	first := (w.off/pageSize + 1) * pageSize
	var cuts []int64
	for c := first; c < w.off+w.n; c += pageSize {
		cuts = append(cuts, c)
	}
	cuts = append(cuts, w.off+w.n)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	end := cuts[rng.IntN(len(cuts))]
	src, err := os.Open(m.livePath(lastIno, last))
	if err != nil {
		return r
	}
	defer src.Close()
	data := make([]byte, end-w.off)
	if _, err := src.ReadAt(data, w.off); err != nil && !isEOF(err) {
		return r
	}
	// Made durable now, so that the pages it touches keep these bytes
	// whatever the live file does after the cut.
	if err := m.prepareDurable(last, osFile{src}, w.off, end); err != nil {
		return r
	}
	absorb(last, data, w.off)
	r.TornAt, r.TornBytes = w.off, int64(len(data))
	r.TornFile = m.livePath(lastIno, last)
	return r
}

// crash ends the process but spares the page cache, as kill -9 does:
// everything the server was given is kept, as if synced now.
func (m *model) crash() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cut {
		return nil
	}
	var walk func(dir string, ino uint64) error
	walk = func(dir string, ino uint64) error {
		entries, err := m.snapshot(dir)
		if err != nil {
			return err
		}
		m.dirs[ino] = entries
		for name, e := range entries {
			p := filepath.Join(dir, name)
			switch e.typ {
			case syscall.S_IFDIR:
				if err := walk(p, e.ino); err != nil {
					return err
				}
			case syscall.S_IFREG:
				var st syscall.Stat_t
				if err := syscall.Lstat(p, &st); err != nil {
					return fmt.Errorf("cutfs: %w", err)
				}
				f := m.file(e.ino)
				f.durable, f.undo, f.last = st.Size, nil, nil
			}
		}
		return nil
	}
	if err := walk(m.root, m.rootIno); err != nil {
		return err
	}
	m.renames = nil
	m.cut = true
	return nil
}

// livePath finds a path to the live inode: its attic link, else a walk of
// the live folder.
func (m *model) livePath(ino uint64, f *fileState) string {
	if f.attic != "" {
		return f.attic
	}
	var found string
	_ = filepath.WalkDir(m.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || found != "" {
			return filepath.SkipDir
		}
		if d.IsDir() && p == filepath.Join(m.root, stateDir) {
			return filepath.SkipDir
		}
		var st syscall.Stat_t
		if syscall.Lstat(p, &st) == nil && st.Ino == ino && st.Mode&syscall.S_IFMT == syscall.S_IFREG {
			found = p
			return filepath.SkipAll
		}
		return nil
	})
	return found
}

// materialize rebuilds the backing folder as the durable image: the
// durable entries from the root down, each file with its durable bytes
// and size. It runs once nothing uses the mount.
func (m *model) materialize() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cut = true
	stage := filepath.Join(m.root, stateDir, "stage")
	if err := os.Mkdir(stage, 0o755); err != nil {
		return fmt.Errorf("cutfs: %w", err)
	}
	done := map[uint64]bool{}
	var build func(ino uint64, at string) error
	build = func(ino uint64, at string) error {
		names := make([]string, 0, len(m.dirs[ino]))
		for name := range m.dirs[ino] {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			e := m.dirs[ino][name]
			p := filepath.Join(at, name)
			switch e.typ {
			case syscall.S_IFDIR:
				if err := os.Mkdir(p, 0o755); err != nil {
					return fmt.Errorf("cutfs: %w", err)
				}
				if err := build(e.ino, p); err != nil {
					return err
				}
			case syscall.S_IFLNK:
				if err := os.Symlink(e.target, p); err != nil {
					return fmt.Errorf("cutfs: %w", err)
				}
			case syscall.S_IFREG:
				f := m.files[e.ino]
				if f == nil || f.attic == "" {
					return fmt.Errorf("cutfs: the durable file %s has no kept inode", p)
				}
				if err := os.Link(f.attic, p); err != nil {
					return fmt.Errorf("cutfs: %w", err)
				}
				if done[e.ino] {
					continue
				}
				done[e.ino] = true
				if err := restore(p, f); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := build(m.rootIno, stage); err != nil {
		return err
	}
	des, err := os.ReadDir(m.root)
	if err != nil {
		return fmt.Errorf("cutfs: %w", err)
	}
	for _, de := range des {
		if de.Name() == stateDir {
			continue
		}
		if err := os.RemoveAll(filepath.Join(m.root, de.Name())); err != nil {
			return fmt.Errorf("cutfs: %w", err)
		}
	}
	staged, err := os.ReadDir(stage)
	if err != nil {
		return fmt.Errorf("cutfs: %w", err)
	}
	for _, de := range staged {
		if err := os.Rename(filepath.Join(stage, de.Name()), filepath.Join(m.root, de.Name())); err != nil {
			return fmt.Errorf("cutfs: %w", err)
		}
	}
	if err := os.RemoveAll(filepath.Join(m.root, stateDir)); err != nil {
		return fmt.Errorf("cutfs: %w", err)
	}
	return nil
}

// restore gives the file at p its durable size and bytes.
func restore(p string, f *fileState) error {
	w, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("cutfs: %w", err)
	}
	defer w.Close()
	if err := w.Truncate(f.durable); err != nil {
		return fmt.Errorf("cutfs: %w", err)
	}
	zeros := make([]byte, pageSize)
	for pg, data := range f.undo {
		off := pg * pageSize
		if off >= f.durable {
			continue
		}
		n := min(pageSize, f.durable-off)
		if data == nil {
			// A hole reads as zeros and takes no space: a file the disk
			// holds sparse (a log sized and never filled) stays so.
			if unix.Fallocate(int(w.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n) == nil {
				continue
			}
			data = zeros
		}
		if _, err := w.WriteAt(data[:n], off); err != nil {
			return fmt.Errorf("cutfs: %w", err)
		}
	}
	return nil
}

// osFile is a backingFile over an *os.File.
type osFile struct{ *os.File }

func (f osFile) Size() (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }
