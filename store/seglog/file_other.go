//go:build !linux

package seglog

import "os"

// fdatasync flushes f; without fdatasync(2) that is a full fsync.
func fdatasync(f *os.File) error { return f.Sync() }

// preallocate extends f to size bytes, which read back as zeros.
func preallocate(f *os.File, size int64) error { return f.Truncate(size) }

// mapFile maps nothing here: reads use the file (ReadAt).
func mapFile(*os.File, int64) ([]byte, error) { return nil, nil }

// unmapFile undoes mapFile.
func unmapFile([]byte) error { return nil }
