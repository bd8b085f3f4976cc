package store

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gatehouse-dev/gatehouse/store/seglog"
)

// pageOut hands back to the kernel the pages of dir's table and value log
// files, and of its segment log's segments, that this process maps (see
// tablePages). It reads the mappings
// from /proc/self/maps and advises MADV_PAGEOUT on each: a hint that
// never loses data, so a mapping Badger dropped (and the kernel reused)
// between the read and the advice is at worst paged out too. Reading
// them again faults the pages back from the file.
func pageOut(dir string) error {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return fmt.Errorf("page out: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		start, end, ok := tableMapping(sc.Text(), dir)
		if !ok {
			continue
		}
		_, _, errno := unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_PAGEOUT)
		switch {
		case errno == 0, errno == unix.ENOMEM:
			// ENOMEM: Badger unmapped it meanwhile (a compacted table).
		case errno == unix.EINVAL:
			// Before Linux 5.4, which has no MADV_PAGEOUT.
			return fmt.Errorf("page out: %w", errors.ErrUnsupported)
		default:
			return fmt.Errorf("page out: madvise: %w", errno)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("page out: read /proc/self/maps: %w", err)
	}
	return nil
}

// residentFiles returns the bytes of files this process holds mapped in
// memory (RssFile and RssShmem: the third field of /proc/self/statm, in
// pages): what a pass of pageOut may shrink.
func residentFiles() (int64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, fmt.Errorf("resident files: %w", err)
	}
	fields := strings.Fields(string(b))
	if len(fields) < 3 {
		return 0, fmt.Errorf("resident files: /proc/self/statm reads %q", b)
	}
	pages, err := strconv.ParseInt(fields[2], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("resident files: %w", err)
	}
	return pages * int64(os.Getpagesize()), nil
}

// tableMapping parses one line of /proc/PID/maps ("start-end perms offset
// dev inode path") and reports the address range when it maps one of
// Badger's table or value log files directly in dir.
func tableMapping(line, dir string) (start, end uintptr, ok bool) {
	fields := strings.Fields(line)
	if len(fields) != 6 {
		// No path, or a deleted file (" (deleted)" ends the line).
		return 0, 0, false
	}
	path := fields[5]
	switch pdir, ext := filepath.Dir(path), filepath.Ext(path); {
	case pdir == dir && (ext == ".sst" || ext == ".vlog"):
	case pdir == filepath.Join(dir, logsDir) && ext == seglog.SegmentExt:
		// The segment log's files, which its reads map too.
	default:
		return 0, 0, false
	}
	lo, hi, found := strings.Cut(fields[0], "-")
	if !found {
		return 0, 0, false
	}
	s, err1 := strconv.ParseUint(lo, 16, 64)
	e, err2 := strconv.ParseUint(hi, 16, 64)
	if err1 != nil || err2 != nil || e <= s {
		return 0, 0, false
	}
	return uintptr(s), uintptr(e), true
}
