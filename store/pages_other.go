//go:build !linux

package store

import (
	"errors"
	"fmt"
)

// pageOut is Linux's alone (MADV_PAGEOUT): elsewhere the pages of Badger's
// tables stay mapped until the system needs them.
func pageOut(string) error { return fmt.Errorf("page out: %w", errors.ErrUnsupported) }

// residentFiles is Linux's alone (/proc/self/statm).
func residentFiles() (int64, error) {
	return 0, fmt.Errorf("resident files: %w", errors.ErrUnsupported)
}
