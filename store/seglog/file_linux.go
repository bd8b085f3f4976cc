package seglog

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

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
