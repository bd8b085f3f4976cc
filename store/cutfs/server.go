package cutfs

import (
	"context"
	"os"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The mount's nodes are go-fuse's loopback nodes, with every operation
// that changes a file's bytes, its size or a folder's entries told to the
// model first. Files are opened without O_DIRECT, O_SYNC and O_DSYNC on
// the backing folder: the model keeps their promises, and the backing
// folder's own page cache is the "disk" here.

// node is one file or folder of the mount.
type node struct {
	fs.LoopbackNode
	m *model
}

func newRoot(m *model) (fs.InodeEmbedder, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(m.root, &st); err != nil {
		return nil, err
	}
	r := &fs.LoopbackRoot{Path: m.root, Dev: st.Dev}
	r.NewNode = func(r *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
		return &node{LoopbackNode: fs.LoopbackNode{RootData: r}, m: m}
	}
	root := r.NewNode(r, nil, "", &st)
	r.RootNode = root
	return root, nil
}

// backing is the node's path in the backing folder.
func (n *node) backing() string {
	return filepath.Join(n.RootData.Path, n.Path(nil))
}

// hidden reports whether name, in n, is the model's own folder.
func (n *node) hidden(name string) bool { return n.IsRoot() && name == stateDir }

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.hidden(name) {
		return nil, syscall.ENOENT
	}
	return n.LoopbackNode.Lookup(ctx, name, out)
}

// syncFlags are the open flags whose promise the model keeps.
const syncFlags = unix.O_DSYNC // O_SYNC includes it

// backingFlags are the flags to open the backing file with: without the
// ones the model keeps or does itself (truncation), and readable, since
// the model reads the durable bytes a write is about to replace.
func backingFlags(flags uint32) uint32 {
	flags &^= unix.O_DIRECT | unix.O_SYNC | unix.O_DSYNC | unix.O_TRUNC
	if flags&unix.O_ACCMODE == unix.O_WRONLY {
		flags = flags&^unix.O_ACCMODE | unix.O_RDWR
	}
	return flags
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, ff, errno := n.LoopbackNode.Open(ctx, backingFlags(flags))
	if errno != 0 {
		return nil, 0, errno
	}
	f, errno := n.wrap(ctx, fh, flags)
	return f, ff, errno
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if n.hidden(name) {
		return nil, nil, 0, syscall.EPERM
	}
	ch, fh, ff, errno := n.LoopbackNode.Create(ctx, name, backingFlags(flags), mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	f, errno := n.wrap(ctx, fh, flags)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	n.m.created(f.ino)
	return ch, f, ff, 0
}

// wrap makes a loopback file handle one of the model's, truncating it
// through the model when flags ask for it.
func (n *node) wrap(ctx context.Context, fh fs.FileHandle, flags uint32) (*file, syscall.Errno) {
	lf, ok := fh.(*fs.LoopbackFile)
	if !ok {
		return nil, syscall.EIO
	}
	var out fuse.AttrOut
	if errno := lf.Getattr(ctx, &out); errno != 0 {
		lf.Release(ctx)
		return nil, errno
	}
	f := &file{lf: lf, m: n.m, ino: out.Ino, durable: flags&syncFlags != 0}
	if flags&unix.O_TRUNC != 0 && flags&unix.O_ACCMODE != unix.O_RDONLY {
		if err := n.m.truncate(f.ino, f, 0); err != nil {
			lf.Release(ctx)
			return nil, fs.ToErrno(err)
		}
	}
	return f, 0
}

func (n *node) Tmpfile(context.Context, uint32, uint32, *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	// An unnamed file would need a handle the model can follow to a name
	// given later by linkat: not modelled.
	return nil, nil, 0, syscall.EOPNOTSUPP
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.hidden(name) {
		return nil, syscall.EPERM
	}
	return n.LoopbackNode.Mkdir(ctx, name, mode, out)
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.hidden(name) {
		return nil, syscall.EPERM
	}
	ch, errno := n.LoopbackNode.Mknod(ctx, name, mode, rdev, out)
	if errno == 0 && mode&syscall.S_IFMT == syscall.S_IFREG {
		n.m.created(out.Ino)
	}
	return ch, errno
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.hidden(name) {
		return nil, syscall.EPERM
	}
	return n.LoopbackNode.Symlink(ctx, target, name, out)
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.hidden(name) {
		return nil, syscall.EPERM
	}
	return n.LoopbackNode.Link(ctx, target, name, out)
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	p := filepath.Join(n.backing(), name)
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return fs.ToErrno(err)
	}
	if errno := n.LoopbackNode.Unlink(ctx, name); errno != 0 {
		return errno
	}
	n.m.unlinked(st.Ino, st.Nlink <= 1)
	return 0
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	to, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	if n.hidden(name) || to.hidden(newName) {
		return syscall.EPERM
	}
	var from, dest, replaced syscall.Stat_t
	if err := syscall.Stat(n.backing(), &from); err != nil {
		return fs.ToErrno(err)
	}
	if err := syscall.Stat(to.backing(), &dest); err != nil {
		return fs.ToErrno(err)
	}
	newPath := filepath.Join(to.backing(), newName)
	replacing := syscall.Lstat(newPath, &replaced) == nil
	if errno := n.LoopbackNode.Rename(ctx, name, newParent, newName, flags); errno != 0 {
		return errno
	}
	if replacing && flags&unix.RENAME_EXCHANGE == 0 {
		n.m.unlinked(replaced.Ino, replaced.Nlink <= 1)
	}
	if err := n.m.renamed(from.Ino, dest.Ino, name, newName, newPath); err != nil {
		return fs.ToErrno(err)
	}
	if flags&unix.RENAME_EXCHANGE != 0 {
		// The other file went the other way.
		if err := n.m.renamed(dest.Ino, from.Ino, newName, name, filepath.Join(n.backing(), name)); err != nil {
			return fs.ToErrno(err)
		}
	}
	return 0
}

func (n *node) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	var lf fs.FileHandle
	f, _ := fh.(*file)
	if f != nil {
		lf = f.lf
	}
	if size, ok := in.GetSize(); ok {
		b, ino, errno := n.open(f)
		if errno != 0 {
			return errno
		}
		err := n.m.truncate(ino, b, int64(size))
		closeOpened(b)
		if err != nil {
			return fs.ToErrno(err)
		}
		in.Valid &^= fuse.FATTR_SIZE
	}
	return n.LoopbackNode.Setattr(ctx, lf, in, out)
}

// open returns the backing file to change: the handle's, or the node's
// path opened for it, which the caller closes (closeOpened).
func (n *node) open(f *file) (backingFile, uint64, syscall.Errno) {
	if f != nil {
		return f, f.ino, 0
	}
	o, err := os.OpenFile(n.backing(), os.O_RDWR, 0)
	if err != nil {
		return nil, 0, fs.ToErrno(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(o.Fd()), &st); err != nil {
		_ = o.Close()
		return nil, 0, fs.ToErrno(err)
	}
	return osFile{o}, st.Ino, 0
}

// closeOpened closes what open opened.
func closeOpened(b backingFile) {
	if o, ok := b.(osFile); ok {
		_ = o.Close()
	}
}

// Fsync serves fsync and fdatasync of files, and of folders whose handle
// does not (see dirHandle).
func (n *node) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	if n.StableAttr().Mode&syscall.S_IFMT == syscall.S_IFDIR {
		return fs.ToErrno(n.m.syncDir(n.backing()))
	}
	f, ok := fh.(*file)
	if !ok {
		b, ino, errno := n.open(nil)
		if errno != 0 {
			return errno
		}
		defer closeOpened(b)
		return fs.ToErrno(n.m.fsync(ino, b))
	}
	return fs.ToErrno(n.m.fsync(f.ino, f))
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	ds, errno := fs.NewLoopbackDirStream(n.backing())
	if errno != 0 {
		return nil, 0, errno
	}
	return &dirHandle{ds: ds, n: n}, 0, 0
}

// dirHandle is an open folder: a loopback one, the model's folder left out
// of the root, and its fsync told to the model.
type dirHandle struct {
	ds fs.DirStream
	n  *node
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	r, ok := d.ds.(fs.FileReaddirenter)
	if !ok {
		return nil, syscall.ENOTSUP
	}
	for {
		de, errno := r.Readdirent(ctx)
		if de != nil && d.n.hidden(de.Name) {
			continue
		}
		return de, errno
	}
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if s, ok := d.ds.(fs.FileSeekdirer); ok {
		return s.Seekdir(ctx, off)
	}
	return syscall.ENOTSUP
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	if r, ok := d.ds.(fs.FileReleasedirer); ok {
		r.Releasedir(ctx, flags)
		return
	}
	d.ds.Close()
}

func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return fs.ToErrno(d.n.m.syncDir(d.n.backing()))
}

// file is an open regular file. It does not hand the kernel its
// descriptor (FUSE passthrough), so that every write comes to the model.
type file struct {
	lf      *fs.LoopbackFile
	m       *model
	ino     uint64
	durable bool // opened O_SYNC or O_DSYNC
}

func (f *file) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return f.lf.Read(ctx, buf, off)
}

func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n, err := f.m.write(f.ino, f, data, off, f.durable)
	return uint32(n), fs.ToErrno(err)
}

func (f *file) Release(ctx context.Context) syscall.Errno { return f.lf.Release(ctx) }
func (f *file) Flush(ctx context.Context) syscall.Errno   { return f.lf.Flush(ctx) }
func (f *file) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return f.lf.Getattr(ctx, out)
}
func (f *file) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	return f.lf.Lseek(ctx, off, whence)
}
func (f *file) Getlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	return f.lf.Getlk(ctx, owner, lk, flags, out)
}
func (f *file) Setlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return f.lf.Setlk(ctx, owner, lk, flags)
}
func (f *file) Setlkw(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return f.lf.Setlkw(ctx, owner, lk, flags)
}

// Allocate reserves space; a hole punched or a range zeroed changes bytes,
// which the model saves first. Reserving past the end changes the size,
// durable only once synced, like any size.
func (f *file) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if mode&^unix.FALLOC_FL_KEEP_SIZE != 0 {
		end := int64(off + size)
		if mode&(unix.FALLOC_FL_COLLAPSE_RANGE|unix.FALLOC_FL_INSERT_RANGE) != 0 {
			end = 1 << 62 // everything after off moves
		}
		if err := f.m.changeRange(f.ino, f, int64(off), end-int64(off)); err != nil {
			return fs.ToErrno(err)
		}
	}
	return f.lf.Allocate(ctx, off, size, mode)
}

// The backingFile methods, for the model.

func (f *file) ReadAt(p []byte, off int64) (int, error) {
	res, errno := f.lf.Read(context.Background(), p, off)
	if errno != 0 {
		return 0, errno
	}
	b, st := res.Bytes(p)
	if !st.Ok() {
		return 0, syscall.Errno(st)
	}
	n := copy(p, b)
	res.Done()
	return n, nil
}

func (f *file) WriteAt(p []byte, off int64) (int, error) {
	n, errno := f.lf.Write(context.Background(), p, off)
	if errno != 0 {
		return int(n), errno
	}
	return int(n), nil
}

func (f *file) Truncate(size int64) error {
	in := fuse.SetAttrIn{}
	in.Valid = fuse.FATTR_SIZE
	in.Size = uint64(size)
	var out fuse.AttrOut
	if errno := f.lf.Setattr(context.Background(), &in, &out); errno != 0 {
		return errno
	}
	return nil
}

func (f *file) Size() (int64, error) {
	var out fuse.AttrOut
	if errno := f.lf.Getattr(context.Background(), &out); errno != 0 {
		return 0, errno
	}
	return int64(out.Size), nil
}
