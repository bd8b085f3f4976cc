package store

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// openSegmentFile opens a journal segment for writing, creating it when
// create is set. With durable set it asks for direct, synchronous writes
// (O_DIRECT|O_DSYNC), and says whether it got them: some file systems, such
// as tmpfs, refuse O_DIRECT, and then the file is opened for ordinary writes
// and a sync.
func openSegmentFile(path string, create, durable bool) (*os.File, bool, error) {
	flags := os.O_RDWR
	if create {
		flags |= os.O_CREATE | os.O_EXCL
	}
	if durable {
		f, err := os.OpenFile(path, flags|unix.O_DIRECT|unix.O_DSYNC, 0o644)
		if err == nil {
			return f, true, nil
		}
		if !errors.Is(err, unix.EINVAL) {
			return nil, false, err
		}
	}
	f, err := os.OpenFile(path, flags, 0o644)
	return f, false, err
}

// fdatasync flushes f's data, and only the metadata needed to read it back.
func fdatasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }

// preallocate reserves size bytes for f, which read back as zeros. A file
// system without fallocate gets a sparse file instead.
func preallocate(f *os.File, size int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) {
		return f.Truncate(size)
	}
	return err
}
