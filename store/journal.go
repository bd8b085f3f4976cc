package store

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// The journal is the store's write-ahead log, in the data folder's journal/
// subfolder. Every group of batches is appended to it, and under SyncAlways
// fdatasynced, before Badger is given the group; Badger's own log is never
// synced on the write path.
//
// Why not sync Badger's log: Badger syncs it with msync over the whole
// memtable mapping, which takes about twice as long as an fdatasync of an
// append-only file, burns CPU walking page tables, and covers only the
// current memtable, so a group that straddles a memtable switch needs two.
//
// Each record carries the Badger version (timestamp) its writes are applied
// at. Replaying a record Badger already holds rewrites the same versions with
// the same values, so replay needs no record of what Badger kept: at start-up
// every segment still present is replayed. A segment is deleted only once
// Badger's tables, which are synced when written, hold every version in it;
// segments are deleted oldest first and the deletion is synced, so those left
// are always a suffix of the history.
type journal struct {
	dir     string
	log     *slog.Logger
	segSize int64

	f   *os.File // the segment being written
	cur segment
	off int64
	buf []byte

	mu   sync.Mutex
	full []segment // written segments, oldest first
}

// segment is one journal file.
type segment struct {
	num    uint64
	lastTs uint64 // highest version written to it; 0 while empty
}

const (
	// defaultSegmentSize is how much a segment holds before the journal
	// moves to the next one; it is preallocated, so that a sync of the
	// segment writes data blocks, not the file's growing metadata.
	defaultSegmentSize = 32 << 20
	// recordHeader is a record's uint32 payload length and uint32 CRC-32C.
	recordHeader = 8
	// maxRecord bounds a record's length when reading, so that a corrupt
	// length cannot ask for an absurd allocation.
	maxRecord  = 1 << 30
	segmentExt = ".wal"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errTorn marks a record that was not completely written: the end of what
// the journal durably holds.
var errTorn = errors.New("torn record")

// openJournal opens the journal in dir, creating the folder if needed. It
// writes nothing until replay has run.
func openJournal(dir string, segSize int64, log *slog.Logger) (*journal, error) {
	if segSize <= 0 {
		segSize = defaultSegmentSize
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("store: journal: %w", err)
	}
	return &journal{dir: dir, segSize: segSize, log: log}, nil
}

// segments lists the segment numbers on disk, in order.
func (j *journal) segments() ([]uint64, error) {
	entries, err := os.ReadDir(j.dir)
	if err != nil {
		return nil, fmt.Errorf("store: journal: %w", err)
	}
	var nums []uint64
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), segmentExt)
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(name, 16, 64)
		if err != nil {
			return nil, fmt.Errorf("store: journal: unexpected file %q", e.Name())
		}
		nums = append(nums, n)
	}
	slices.Sort(nums)
	return nums, nil
}

func (j *journal) path(num uint64) string {
	return filepath.Join(j.dir, fmt.Sprintf("%016x%s", num, segmentExt))
}

// replay hands every record on disk to apply, in order, and then opens a new
// segment for writing. A torn record ends the history: it was never
// acknowledged (its group's sync had not returned), and neither was anything
// after it, which is removed.
func (j *journal) replay(apply func(ts uint64, ops []op) error) (lastTs uint64, err error) {
	nums, err := j.segments()
	if err != nil {
		return 0, err
	}
	next := uint64(1)
	for i, num := range nums {
		seg, err := j.replaySegment(num, apply)
		if seg.lastTs > 0 || !errors.Is(err, errTorn) {
			j.full = append(j.full, seg)
		}
		lastTs = max(lastTs, seg.lastTs)
		next = num + 1
		if errors.Is(err, errTorn) {
			j.log.Warn("journal ends in a torn record; discarding what follows it", "segment", j.path(num), "later_segments", len(nums)-i-1)
			for _, later := range nums[i+1:] {
				if err := os.Remove(j.path(later)); err != nil {
					return 0, fmt.Errorf("store: journal: %w", err)
				}
			}
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if err := j.openSegment(next); err != nil {
		return 0, err
	}
	return lastTs, nil
}

// replaySegment applies the records of one segment. It returns errTorn
// (wrapped) where the segment's records stop being whole, and nil when they
// end cleanly: at the end of the file or at the zeros of its preallocation.
func (j *journal) replaySegment(num uint64, apply func(ts uint64, ops []op) error) (segment, error) {
	seg := segment{num: num}
	f, err := os.Open(j.path(num))
	if err != nil {
		return seg, fmt.Errorf("store: journal: %w", err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	var hdr [recordHeader]byte
	var payload []byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return seg, nil
			}
			return seg, fmt.Errorf("%s: header: %w", j.path(num), errTorn)
		}
		n := binary.LittleEndian.Uint32(hdr[0:4])
		if n == 0 {
			return seg, nil
		}
		if n > maxRecord {
			return seg, fmt.Errorf("%s: length %d: %w", j.path(num), n, errTorn)
		}
		payload = slices.Grow(payload[:0], int(n))[:n]
		if _, err := io.ReadFull(r, payload); err != nil {
			return seg, fmt.Errorf("%s: payload: %w", j.path(num), errTorn)
		}
		if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(hdr[4:8]) {
			return seg, fmt.Errorf("%s: checksum: %w", j.path(num), errTorn)
		}
		ts, ops, err := decodeRecord(payload)
		if err != nil {
			return seg, fmt.Errorf("%s: %w: %w", j.path(num), errTorn, err)
		}
		if err := apply(ts, ops); err != nil {
			return seg, fmt.Errorf("store: journal replay: %w", err)
		}
		seg.lastTs = ts
	}
}

// openSegment creates segment num, preallocated, and makes it the one
// written. The folder is synced so the new file survives a power cut along
// with what is written to it.
func (j *journal) openSegment(num uint64) error {
	f, err := os.OpenFile(j.path(num), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("store: journal: %w", err)
	}
	if err := preallocate(f, j.segSize); err != nil {
		_ = f.Close()
		return fmt.Errorf("store: journal: preallocate %s: %w", f.Name(), err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("store: journal: %w", err)
	}
	if err := syncDir(j.dir); err != nil {
		_ = f.Close()
		return err
	}
	j.f, j.cur, j.off = f, segment{num: num}, 0
	return nil
}

// append writes one record holding ops at version ts. The record is not
// durable until sync returns.
func (j *journal) append(ts uint64, ops []op) error {
	j.buf = encodeRecord(j.buf[:0], ts, ops)
	if j.off > 0 && j.off+int64(len(j.buf)) > j.segSize {
		if err := j.rotate(); err != nil {
			return err
		}
	}
	if _, err := j.f.WriteAt(j.buf, j.off); err != nil {
		return fmt.Errorf("store: journal: write: %w", err)
	}
	j.off += int64(len(j.buf))
	j.cur.lastTs = ts
	return nil
}

// sync makes every appended record durable.
func (j *journal) sync() error {
	if err := fdatasync(j.f); err != nil {
		return fmt.Errorf("store: journal: sync: %w", err)
	}
	return nil
}

// rotate finishes the current segment, synced whatever the mode so that a
// torn record can only ever be in the newest segment, and starts the next.
func (j *journal) rotate() error {
	if err := j.sync(); err != nil {
		return err
	}
	if err := j.f.Close(); err != nil {
		return fmt.Errorf("store: journal: %w", err)
	}
	j.mu.Lock()
	j.full = append(j.full, j.cur)
	j.mu.Unlock()
	return j.openSegment(j.cur.num + 1)
}

// release deletes the written segments whose every version is at or below
// durable, oldest first. It is safe to call alongside append.
func (j *journal) release(durable uint64) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	n := 0
	for n < len(j.full) && j.full[n].lastTs <= durable {
		if err := os.Remove(j.path(j.full[n].num)); err != nil {
			return n, fmt.Errorf("store: journal: %w", err)
		}
		n++
	}
	if n == 0 {
		return 0, nil
	}
	j.full = slices.Delete(j.full, 0, n)
	return n, syncDir(j.dir)
}

// pending returns how many segments are kept, the one written included.
func (j *journal) pending() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.full) + 1
}

// close closes the segment being written. With clean set, Badger holds
// everything durably, and every segment is deleted.
func (j *journal) close(clean bool) error {
	err := j.f.Close()
	if !clean {
		return err
	}
	j.mu.Lock()
	full := append(slices.Clone(j.full), j.cur)
	j.full = nil
	j.mu.Unlock()
	for _, seg := range full {
		if rerr := os.Remove(j.path(seg.num)); rerr != nil && err == nil {
			err = fmt.Errorf("store: journal: %w", rerr)
		}
	}
	if serr := syncDir(j.dir); serr != nil && err == nil {
		err = serr
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("store: journal: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("store: journal: sync folder: %w", err)
	}
	return nil
}

// Record payload: uint64 version, uvarint op count, then per op a flag byte
// (0 set, 1 delete), uvarint key length, key, and for a set uvarint value
// length and value. The header before it holds the payload's length and
// CRC-32C.
const (
	opSet    = 0
	opDelete = 1
)

func encodeRecord(b []byte, ts uint64, ops []op) []byte {
	b = append(b, make([]byte, recordHeader)...)
	b = binary.LittleEndian.AppendUint64(b, ts)
	b = binary.AppendUvarint(b, uint64(len(ops)))
	for _, o := range ops {
		if o.del {
			b = append(b, opDelete)
		} else {
			b = append(b, opSet)
		}
		b = binary.AppendUvarint(b, uint64(len(o.key)))
		b = append(b, o.key...)
		if !o.del {
			b = binary.AppendUvarint(b, uint64(len(o.val)))
			b = append(b, o.val...)
		}
	}
	payload := b[recordHeader:]
	binary.LittleEndian.PutUint32(b[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[4:8], crc32.Checksum(payload, castagnoli))
	return b
}

var errRecord = errors.New("malformed record")

// decodeRecord parses a payload. The ops' keys and values are copies, owned
// by the caller.
func decodeRecord(p []byte) (uint64, []op, error) {
	if len(p) < 8 {
		return 0, nil, errRecord
	}
	ts := binary.LittleEndian.Uint64(p)
	p = p[8:]
	n, k := binary.Uvarint(p)
	if k <= 0 || n > uint64(len(p)) {
		return 0, nil, errRecord
	}
	p = p[k:]
	ops := make([]op, 0, min(n, 1024)) // n is not trusted for an allocation
	bytesField := func() ([]byte, bool) {
		l, k := binary.Uvarint(p)
		if k <= 0 || l > uint64(len(p)-k) {
			return nil, false
		}
		v := append([]byte(nil), p[k:k+int(l)]...)
		p = p[k+int(l):]
		return v, true
	}
	for range n {
		if len(p) == 0 || p[0] > opDelete {
			return 0, nil, errRecord
		}
		o := op{del: p[0] == opDelete}
		p = p[1:]
		var ok bool
		if o.key, ok = bytesField(); !ok {
			return 0, nil, errRecord
		}
		if !o.del {
			if o.val, ok = bytesField(); !ok {
				return 0, nil, errRecord
			}
		}
		ops = append(ops, o)
	}
	if len(p) != 0 {
		return 0, nil, errRecord
	}
	return ts, ops, nil
}
