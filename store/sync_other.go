//go:build !linux

package store

import "os"

// openSegmentFile opens a journal segment for writing, creating it when
// create is set. Without O_DIRECT every record is synced after its write.
func openSegmentFile(path string, create, _ bool) (*os.File, bool, error) {
	flags := os.O_RDWR
	if create {
		flags |= os.O_CREATE | os.O_EXCL
	}
	f, err := os.OpenFile(path, flags, 0o644)
	return f, false, err
}

// fdatasync flushes f; without fdatasync(2) that is a full fsync.
func fdatasync(f *os.File) error { return f.Sync() }

// preallocate extends f to size bytes, which read back as zeros.
func preallocate(f *os.File, size int64) error { return f.Truncate(size) }
