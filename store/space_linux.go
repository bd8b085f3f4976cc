package store

import (
	"io/fs"
	"syscall"

	"golang.org/x/sys/unix"
)

// statfs reads the space of the file system holding dir.
func statfs(dir string) (diskUsage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return diskUsage{}, err
	}
	return diskUsage{
		free: int64(st.Bavail) * st.Bsize,
		// A file system that counts files (not tmpfs with nr_inodes=0,
		// nor btrfs) refuses new ones when none is left.
		inodesLow: st.Files > 0 && st.Ffree < 64,
	}, nil
}

// allocated returns the bytes fi takes on disk.
func allocated(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}
