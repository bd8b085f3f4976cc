package seglog

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gatehouse-dev/gatehouse/internal/option"
	"github.com/gatehouse-dev/gatehouse/internal/recordsum"
)

// Sentinel errors; callers branch on them with errors.Is.
var (
	// ErrClosed means the log was closed.
	ErrClosed = errors.New("seglog: closed")
	// ErrFailed means a write or sync failed: what reached the disk is
	// not known, so the log takes no further write.
	ErrFailed = errors.New("seglog: failed")
	// ErrTooLarge means a batch is over Options.MaxBatchBytes, or a
	// stream's name over MaxStreamName.
	ErrTooLarge = errors.New("seglog: too large")
	// ErrInvalid means a batch is empty, or names an empty stream, or
	// appends at sequence 0 or 2^64-1.
	ErrInvalid = errors.New("seglog: invalid")
	// ErrVersion means a batch's version is not above every version
	// written before it.
	ErrVersion = errors.New("seglog: version not above the last")
)

// SyncMode says when a commit is durable.
type SyncMode int

const (
	// SyncAlways syncs every group before its commits return.
	SyncAlways SyncMode = iota
	// SyncNone syncs at Sync, at Close and when the log moves to a new
	// segment: for a log behind a write-ahead journal of its own.
	SyncNone
)

// Bounds and defaults.
const (
	// DefaultSegmentSize is a segment's size unless Options say otherwise.
	DefaultSegmentSize = 32 << 20
	// MaxSegmentSize bounds a segment: an entry's place is 32 bits.
	MaxSegmentSize = 1 << 30
	// MaxStreamName bounds a stream's name, in bytes.
	MaxStreamName = 1024
	// DefaultMaxBatchBytes bounds one batch unless Options say otherwise.
	DefaultMaxBatchBytes = 64 << 20
	// DefaultMaxGroupBytes bounds the batches one group's record holds.
	DefaultMaxGroupBytes = 8 << 20
	// DefaultMaxWaiting bounds the commits waiting for the writer; past
	// it, Commit waits for room (or its context).
	DefaultMaxWaiting = 8192
	// itemOverhead is what an item costs besides its name and data, at
	// most: kind and four uvarints.
	itemOverhead = 1 + 4*binary.MaxVarintLen64
)

// Options configure a Log. The zero value is a SyncAlways log with the
// default bounds.
type Options struct {
	// Sync is when a commit is durable.
	Sync SyncMode
	// SegmentSize is the size of a segment file, preallocated; zero means
	// DefaultSegmentSize. A record larger than a segment gets one of its
	// own.
	SegmentSize int64
	// MaxBatchBytes bounds one batch (names, data and framing); zero
	// means DefaultMaxBatchBytes.
	MaxBatchBytes int
	// MaxGroupBytes bounds the batches grouped into one record; zero
	// means DefaultMaxGroupBytes. A larger batch goes alone.
	MaxGroupBytes int
	// MaxWaiting bounds the commits waiting for the writer; zero means
	// DefaultMaxWaiting.
	MaxWaiting int
	// Logger receives the log's warnings; nil discards them.
	Logger *slog.Logger
}

// Batch is a set of appends and drops written atomically by Commit, in
// one record. The zero value is an empty batch. The log reads the data
// slices until Commit returns; it does not keep them.
type Batch struct {
	items   []bitem
	size    int
	version uint64
	copies  bool
}

type bitem struct {
	kind    byte
	stream  string
	seq     uint64
	version uint64 // a copy's own
	data    []byte
}

// Append adds entry seq of stream. A stream's sequences must grow: a read
// merges the entries of one sequence into the newest.
func (b *Batch) Append(stream string, seq uint64, data []byte) {
	b.add(bitem{kind: itemAppend, stream: stream, seq: seq, data: data})
}

// DropBefore hides every entry of stream below sequence before that was
// written before this batch.
func (b *Batch) DropBefore(stream string, before uint64) {
	b.add(bitem{kind: itemDrop, stream: stream, seq: before})
}

// copyOf adds an entry copied forward, with its own version.
func (b *Batch) copyOf(stream string, l loc, data []byte) {
	b.copies = true
	b.add(bitem{kind: itemCopy, stream: stream, seq: l.seq, version: l.version, data: data})
}

// Reset empties b, keeping its room for items, so that it can be filled
// and committed again once Commit has returned.
func (b *Batch) Reset() {
	clear(b.items)
	*b = Batch{items: b.items[:0]}
}

func (b *Batch) add(it bitem) {
	b.items = append(b.items, it)
	b.size += len(it.stream) + len(it.data) + itemOverhead
}

// SetVersion sets the version the batch is written at; it must be above
// every version written before. Without it, Commit takes the next one.
func (b *Batch) SetVersion(v uint64) { b.version = v }

// Version returns the version the batch was written at, once committed.
func (b *Batch) Version() uint64 { return b.version }

// Len returns the number of appends and drops in the batch.
func (b *Batch) Len() int { return len(b.items) }

// Log is an open segment log. It is safe for concurrent use.
type Log struct {
	dir string
	o   Options
	log *slog.Logger

	// The commit queue: the leader writes what waits (see lead). waiters
	// keeps the commits' waiters, with their channels, for the next
	// commits; group is the leader's, the waiters of the group it writes.
	qmu      sync.Mutex
	queue    []*waiter
	leading  bool
	closed   bool
	inflight sync.WaitGroup
	slots    chan struct{}
	waiters  sync.Pool
	group    []*waiter

	// The leader's own: the segment written, the end of its records, its
	// size, the record being built, the next segment prepared in the
	// background, and the newest version given out.
	w           *segment
	off, size   int64
	enc         encoder
	pend        []pending
	next        chan prepared
	lastVersion uint64

	// mu guards the segments and the drops for readers; the leader takes
	// it to publish a record. files is held shared by a read while it
	// reads segments' data, outside mu, and exclusively to close them.
	mu    sync.RWMutex
	files sync.RWMutex
	segs  []*segment // oldest first; the last is the one written
	drops map[string][]drop
	held  int64 // bytes of records in every segment

	records   atomic.Uint64 // records written: groups and copies
	published atomic.Uint64 // newest version readers see
	durable   atomic.Uint64 // newest version on disk
	failed    atomic.Pointer[error]
	sealing   sync.WaitGroup
	compactMu sync.Mutex
	// dropCount counts the drops recorded, under mu; tooLive is the
	// oldest segment Compact last found too live for maxLive, and
	// dropCount then: until a drop comes, it is not read again for as
	// much. Under compactMu.
	dropCount uint64
	tooLive   struct {
		num, drops uint64
		maxLive    float64
	}
}

// segment is one segment file.
type segment struct {
	num uint64
	f   *os.File
	// data maps the file for reading (nil where it is not mapped: reads
	// then use f). Its length is the file's size when it was mapped: a
	// segment given back its unused room later is read only below end.
	data       []byte
	end        int64 // end of its records
	maxVersion uint64
	mem        *memIndex // while written, and until its sidecar is
	side       *sidecar
}

// mapData maps the segment's first size bytes for reading. A mapping
// refused (address space, a file system without mmap) leaves reads on the
// file: slower, not wrong.
func (s *segment) mapData(size int64, log *slog.Logger) {
	data, err := mapFile(s.f, size)
	if err != nil {
		log.Warn("seglog: segment not mapped; reading it through the file", "segment", s.f.Name(), "err", err)
		return
	}
	s.data = data
}

// close unmaps and closes the segment's file. No read may be under way:
// callers hold Log.files, or the segment holds no entry a read could find.
func (s *segment) close() error {
	uerr := unmapFile(s.data)
	s.data = nil
	return errors.Join(uerr, s.f.Close())
}

func (s *segment) index() segmentIndex {
	if s.side != nil {
		return s.side
	}
	return s.mem
}

type waiter struct {
	b    *Batch
	done chan error
	err  error
}

// errLead tells a waiting committer to lead the next group.
var errLead = errors.New("seglog: lead")

type pending struct {
	stream string
	kind   byte
	l      loc
	rel    int // the data's offset in the record being built
}

type prepared struct {
	num  uint64
	f    *os.File
	size int64
	err  error
}

// SegmentExt ends the name of a segment file, which a reader maps (on
// Linux) while the segment is open.
const SegmentExt = segExt

const (
	segExt  = ".seg"
	idxExt  = ".idx"
	tmpExt  = ".tmp"
	nameFmt = "%016x"
)

// Open opens the log in dir, creating the folder if needed. It indexes
// what a crash left without a sidecar, and begins a new segment.
func Open(dir string, o Options) (*Log, error) {
	option.Default(&o.SegmentSize, DefaultSegmentSize)
	o.SegmentSize = min(o.SegmentSize, MaxSegmentSize)
	option.Default(&o.MaxBatchBytes, DefaultMaxBatchBytes)
	o.MaxBatchBytes = min(o.MaxBatchBytes, MaxSegmentSize/2)
	option.Default(&o.MaxGroupBytes, DefaultMaxGroupBytes)
	option.Default(&o.MaxWaiting, DefaultMaxWaiting)
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := mkdirDurable(dir); err != nil {
		return nil, fmt.Errorf("seglog: open %s: %w", dir, err)
	}
	l := &Log{dir: dir, o: o, log: log, drops: map[string][]drop{}, slots: make(chan struct{}, o.MaxWaiting)}
	if err := l.load(); err != nil {
		l.closeFiles()
		return nil, err
	}
	num := uint64(1)
	if n := len(l.segs); n > 0 {
		num = l.segs[n-1].num + 1
	}
	p := l.prepare(num, o.SegmentSize)
	if p.err != nil {
		l.closeFiles()
		return nil, p.err
	}
	l.use(p)
	l.published.Store(l.lastVersion)
	l.durable.Store(l.lastVersion)
	return l, nil
}

func (l *Log) segPath(num uint64) string {
	return filepath.Join(l.dir, fmt.Sprintf(nameFmt, num)+segExt)
}

func (l *Log) idxPath(num uint64) string {
	return filepath.Join(l.dir, fmt.Sprintf(nameFmt, num)+idxExt)
}

// load opens every segment in the folder, oldest first.
func (l *Log) load() error {
	entries, err := os.ReadDir(l.dir)
	if err != nil {
		return fmt.Errorf("seglog: open %s: %w", l.dir, err)
	}
	var nums []uint64
	idx := map[uint64]bool{}
	for _, e := range entries {
		name := e.Name()
		if strings.HasSuffix(name, tmpExt) {
			_ = os.Remove(filepath.Join(l.dir, name))
			continue
		}
		base, ext := strings.TrimSuffix(name, filepath.Ext(name)), filepath.Ext(name)
		if ext != segExt && ext != idxExt {
			continue
		}
		n, err := strconv.ParseUint(base, 16, 64)
		if err != nil {
			return fmt.Errorf("seglog: open %s: unexpected file %q", l.dir, name)
		}
		if ext == segExt {
			nums = append(nums, n)
		} else {
			idx[n] = true
		}
	}
	slices.Sort(nums)
	for _, num := range nums {
		seg, err := l.loadSegment(num, idx[num])
		if err != nil {
			return err
		}
		delete(idx, num)
		if seg == nil {
			continue
		}
		l.segs = append(l.segs, seg)
		l.held += seg.end
		l.lastVersion = max(l.lastVersion, seg.maxVersion)
		for _, d := range seg.side.drops {
			l.addDrop(d.stream, d.drop)
		}
	}
	for num := range idx { // a sidecar whose segment is gone
		_ = os.Remove(l.idxPath(num))
	}
	return syncDir(l.dir)
}

// loadSegment opens segment num through its sidecar, or reads it and
// writes the sidecar. A segment that holds no record is deleted (nil).
func (l *Log) loadSegment(num uint64, hasIdx bool) (*segment, error) {
	if hasIdx {
		seg, err := l.openSealed(num)
		if err == nil {
			return seg, nil
		}
		l.log.Warn("seglog: sidecar unusable; reading its segment", "segment", l.segPath(num), "err", err)
	}
	f, err := os.OpenFile(l.segPath(num), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("seglog: open segment: %w", err)
	}
	seg := &segment{num: num, f: f, mem: newMemIndex()}
	if err := scanSegment(f, num, func(recOff int64, it *item) {
		seg.index1(it, recOff)
	}, &seg.end); err != nil {
		_ = f.Close()
		return nil, err
	}
	if seg.end == 0 {
		_ = f.Close()
		if err := os.Remove(l.segPath(num)); err != nil {
			return nil, fmt.Errorf("seglog: remove an empty segment: %w", err)
		}
		_ = os.Remove(l.idxPath(num))
		return nil, nil
	}
	// What was read may still be only in the page cache (a process killed,
	// not a power cut): the sidecar must never name more than the disk
	// holds.
	if err := f.Truncate(seg.end); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("seglog: segment %d: %w", num, err)
	}
	if err := fdatasync(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("seglog: segment %d: %w", num, err)
	}
	if err := l.sealNow(seg); err != nil {
		_ = f.Close()
		return nil, err
	}
	seg.mapData(seg.end, l.log)
	return seg, nil
}

// openSealed opens segment num through its sidecar.
func (l *Log) openSealed(num uint64) (*segment, error) {
	sc, err := openSidecar(l.idxPath(num), num)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(l.segPath(num))
	if err != nil {
		_ = sc.close()
		return nil, err
	}
	if fi, err := f.Stat(); err != nil || fi.Size() < int64(sc.end) {
		_ = f.Close()
		_ = sc.close()
		return nil, fmt.Errorf("%w: its segment is shorter than it says", errSidecar)
	}
	seg := &segment{num: num, f: f, end: int64(sc.end), maxVersion: sc.maxVersion, side: sc}
	seg.mapData(seg.end, l.log)
	return seg, nil
}

func (s *sidecar) closeIfOpen() error {
	if s == nil {
		return nil
	}
	return s.close()
}

// index1 indexes one parsed item of the record at recOff.
func (s *segment) index1(it *item, recOff int64) {
	s.maxVersion = max(s.maxVersion, it.version)
	if it.kind == itemDrop {
		s.mem.drops = append(s.mem.drops, namedDrop{stream: string(it.stream), drop: drop{before: it.seq, version: it.version, seg: s.num}})
		return
	}
	s.mem.add(string(it.stream), loc{seq: it.seq, version: it.version,
		off: uint32(recOff + recordHeader + int64(it.dataOff)), len: uint32(len(it.data))})
}

// scanSegment calls fn with every item of the whole records of segment
// num, in order, and sets *end to where they end: at the first record
// that is not whole, or is malformed.
func scanSegment(f *os.File, num uint64, fn func(recOff int64, it *item), end *int64) error {
	r := bufio.NewReaderSize(io.NewSectionReader(f, 0, 1<<62), 1<<20)
	var hdr [recordHeader]byte
	var payload []byte
	off := int64(0)
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			break
		}
		n := binary.LittleEndian.Uint32(hdr[0:4])
		if n == 0 || n > MaxSegmentSize {
			break
		}
		payload = slices.Grow(payload[:0], int(n))[:n]
		if _, err := io.ReadFull(r, payload); err != nil {
			break
		}
		if recordsum.Of(num, payload) != binary.LittleEndian.Uint32(hdr[4:8]) {
			break
		}
		// Parse first, index after: a malformed record indexes nothing.
		var items []item
		if _, err := parse(payload, func(it *item) { items = append(items, *it) }); err != nil {
			break
		}
		for i := range items {
			fn(off, &items[i])
		}
		off += recordHeader + int64(n)
	}
	*end = off
	return nil
}

// sealNow writes seg's sidecar and reads it back: seg is then indexed by
// it, and its index in memory goes.
func (l *Log) sealNow(seg *segment) error {
	path := l.idxPath(seg.num)
	if err := writeSidecar(path, seg.num, uint64(seg.end), seg.maxVersion, seg.mem); err != nil {
		return err
	}
	if err := syncDir(l.dir); err != nil {
		return err
	}
	sc, err := openSidecar(path, seg.num)
	if err != nil {
		return fmt.Errorf("seglog: read back the sidecar just written: %w", err)
	}
	l.mu.Lock()
	seg.side, seg.mem = sc, nil
	l.mu.Unlock()
	return nil
}

// addDrop records a drop of stream; one that another hides no less is
// forgotten. The caller holds mu, or is the only user.
func (l *Log) addDrop(stream string, d drop) {
	l.dropCount++
	ds := l.drops[stream]
	for _, o := range ds {
		if o.before >= d.before && o.version >= d.version {
			return
		}
	}
	ds = slices.DeleteFunc(ds, func(o drop) bool { return d.before >= o.before && d.version >= o.version })
	l.drops[stream] = append(ds, d)
}

// prepare creates segment num. Under SyncAlways it is preallocated to
// size bytes and written with zeros, so that the sync of each group's
// write, over blocks the file already has, commits no file-system
// metadata; under SyncNone, which syncs seldom, it grows as it is written,
// and an idle log takes no more room than it holds. The folder is synced,
// so the name outlives a power cut.
func (l *Log) prepare(num uint64, size int64) prepared {
	path := l.segPath(num)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return prepared{err: fmt.Errorf("seglog: new segment: %w", err)}
	}
	if l.o.Sync == SyncAlways {
		err = preallocate(f, size)
		if err == nil {
			err = zeroFill(f, size)
		}
	}
	if err == nil {
		err = fdatasync(f)
	}
	if err == nil {
		err = syncDir(l.dir)
	}
	if err != nil {
		_ = f.Close()
		_ = os.Remove(path)
		return prepared{err: fmt.Errorf("seglog: new segment %s: %w", path, err)}
	}
	return prepared{num: num, f: f, size: size}
}

func zeroFill(f *os.File, size int64) error {
	zeros := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(zeros)) {
		if _, err := f.WriteAt(zeros[:min(int64(len(zeros)), size-off)], off); err != nil {
			return err
		}
	}
	return nil
}

// use makes p the segment written.
func (l *Log) use(p prepared) {
	seg := &segment{num: p.num, f: p.f, mem: newMemIndex()}
	seg.mapData(p.size, l.log)
	l.mu.Lock()
	l.segs = append(l.segs, seg)
	l.mu.Unlock()
	l.w, l.off, l.size, l.next = seg, 0, p.size, nil
}

// Commit writes b atomically, grouped with the commits waiting beside it,
// and returns once it is durable as the sync mode says, or with an error,
// in which case none of b was written. ctx bounds only the wait for room
// in the queue: once queued, Commit waits for the outcome, so that a
// written batch is never reported as failed.
func (l *Log) Commit(ctx context.Context, b *Batch) error {
	if err := l.check(b); err != nil {
		return err
	}
	select {
	case l.slots <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("seglog: commit not queued: %w", ctx.Err())
	}
	defer func() { <-l.slots }()
	l.qmu.Lock()
	if l.closed {
		l.qmu.Unlock()
		return ErrClosed
	}
	l.inflight.Add(1)
	defer l.inflight.Done()
	w, _ := l.waiters.Get().(*waiter)
	if w == nil {
		w = &waiter{done: make(chan error, 1)}
	}
	w.b, w.err = b, nil
	l.queue = append(l.queue, w)
	lead := !l.leading
	l.leading = true
	l.qmu.Unlock()
	err := l.await(w, lead)
	// Every value sent on w.done was received: the next commit can use
	// w. The leader that answered it no longer reads it.
	w.b = nil
	l.waiters.Put(w)
	return err
}

// await waits for w's outcome, leading the group when told to (or when
// lead says it leads already).
func (l *Log) await(w *waiter, lead bool) error {
	if !lead {
		if err := <-w.done; err != errLead {
			return err
		}
	}
	l.lead()
	return <-w.done
}

// check refuses a batch that could never be written.
func (l *Log) check(b *Batch) error {
	if b == nil || len(b.items) == 0 {
		return fmt.Errorf("%w: empty batch", ErrInvalid)
	}
	if b.size > l.o.MaxBatchBytes {
		return fmt.Errorf("%w: batch of %d bytes, at most %d", ErrTooLarge, b.size, l.o.MaxBatchBytes)
	}
	for _, it := range b.items {
		switch {
		case it.stream == "":
			return fmt.Errorf("%w: empty stream name", ErrInvalid)
		case len(it.stream) > MaxStreamName:
			return fmt.Errorf("%w: stream name of %d bytes, at most %d", ErrTooLarge, len(it.stream), MaxStreamName)
		case it.seq == 0:
			return fmt.Errorf("%w: sequence 0 in stream %q", ErrInvalid, it.stream)
		case it.seq == math.MaxUint64 && it.kind != itemDrop:
			return fmt.Errorf("%w: sequence 2^64-1 in stream %q: nothing can be read after it", ErrInvalid, it.stream)
		}
	}
	return nil
}

// lead writes the group at the head of the queue, answers its committers,
// and hands the lead to the first committer still waiting, if any.
func (l *Log) lead() {
	l.qmu.Lock()
	n, size := 0, 0
	for n < len(l.queue) && (n == 0 || size+l.queue[n].b.size <= l.o.MaxGroupBytes) {
		size += l.queue[n].b.size
		n++
	}
	group := append(l.group[:0], l.queue[:n]...)
	l.queue = slices.Delete(l.queue, 0, n)
	l.qmu.Unlock()

	err := l.write(group)
	for _, w := range group {
		if w.err != nil {
			w.done <- w.err
		} else {
			w.done <- err
		}
	}
	// The answered waiters go back to their commits, to be used again.
	clear(group)
	l.group = group[:0]
	l.qmu.Lock()
	if len(l.queue) == 0 {
		l.leading = false
		l.qmu.Unlock()
		return
	}
	next := l.queue[0]
	l.qmu.Unlock()
	next.done <- errLead
}

func (l *Log) failedErr() error {
	if p := l.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// fail poisons the log: after a failed write or sync, what reached the
// disk is not known.
func (l *Log) fail(err error) error {
	wrapped := fmt.Errorf("%w: %w", ErrFailed, err)
	if l.failed.CompareAndSwap(nil, &wrapped) {
		l.log.Error("seglog: failed; refusing further writes", "err", err)
	}
	return wrapped
}

// write writes a group as one record. A committer whose batch cannot be
// written gets its own error in w.err; the error returned is the group's.
func (l *Log) write(group []*waiter) error {
	if err := l.failedErr(); err != nil {
		return err
	}
	base, newest := uint64(0), l.lastVersion
	for _, w := range group {
		b := w.b
		if b.copies {
			continue
		}
		switch {
		case b.version == 0:
			b.version = newest + 1
		case b.version <= newest:
			w.err = fmt.Errorf("%w: version %d after %d", ErrVersion, b.version, newest)
			continue
		}
		newest = b.version
		if base == 0 {
			base = b.version
		}
	}
	l.enc.begin(base)
	l.pend = l.pend[:0]
	for _, w := range group {
		if w.err != nil {
			continue
		}
		for _, it := range w.b.items {
			v := it.version
			if it.kind != itemCopy {
				v = w.b.version
			}
			rel := l.enc.add(it.kind, it.stream, it.seq, v, it.data)
			l.pend = append(l.pend, pending{stream: it.stream, kind: it.kind, rel: rel,
				l: loc{seq: it.seq, version: v, len: uint32(len(it.data))}})
		}
	}
	if len(l.pend) == 0 {
		return nil
	}
	rec, shift := l.enc.finish(l.w.num)
	if l.off > 0 && l.off+int64(len(rec)) > l.size || int64(len(rec)) > l.size {
		if err := l.rotate(int64(len(rec))); err != nil {
			return l.fail(err)
		}
		rec, shift = l.enc.finish(l.w.num)
	}
	if _, err := l.w.f.WriteAt(rec, l.off); err != nil {
		return l.fail(fmt.Errorf("seglog: write: %w", err))
	}
	if l.o.Sync == SyncAlways {
		if err := fdatasync(l.w.f); err != nil {
			return l.fail(fmt.Errorf("seglog: sync: %w", err))
		}
	}
	seg := l.w
	l.mu.Lock()
	for _, p := range l.pend {
		seg.maxVersion = max(seg.maxVersion, p.l.version)
		if p.kind == itemDrop {
			d := drop{before: p.l.seq, version: p.l.version, seg: seg.num}
			seg.mem.drops = append(seg.mem.drops, namedDrop{stream: p.stream, drop: d})
			l.addDrop(p.stream, d)
			continue
		}
		p.l.off = uint32(l.off + int64(p.rel-shift))
		seg.mem.add(p.stream, p.l)
	}
	l.off += int64(len(rec))
	seg.end = l.off
	l.held += int64(len(rec))
	l.mu.Unlock()
	l.records.Add(1)
	l.lastVersion = newest
	l.published.Store(newest)
	if l.o.Sync == SyncAlways {
		l.durable.Store(newest)
	}
	if l.next == nil && l.off >= l.size/2 {
		next := make(chan prepared, 1)
		l.next = next
		go func(num uint64) { next <- l.prepare(num, l.o.SegmentSize) }(seg.num + 1)
	}
	return nil
}

// rotate moves the writes to the next segment, one of at least need
// bytes, and seals the finished one in the background. What the finished
// one holds is made durable first, so that a power cut leaves a prefix of
// the history.
func (l *Log) rotate(need int64) error {
	old := l.w
	if l.o.Sync != SyncAlways {
		if err := fdatasync(old.f); err != nil {
			return fmt.Errorf("seglog: sync: %w", err)
		}
	}
	// Give back the room preallocated and not used; were this lost, the
	// zeros past the records read as their end.
	_ = old.f.Truncate(l.off)
	var p prepared
	if l.next != nil {
		p = <-l.next
		l.next = nil
	}
	if p.err == nil && p.f != nil && p.size < need {
		_ = p.f.Close()
		_ = os.Remove(p.f.Name())
		p = prepared{}
	}
	if p.f == nil {
		if p = l.prepare(old.num+1, max(l.o.SegmentSize, need)); p.err != nil {
			return p.err
		}
	}
	l.use(p)
	if old.end == 0 {
		// Nothing in it: it goes.
		l.mu.Lock()
		l.segs = slices.DeleteFunc(l.segs, func(s *segment) bool { return s == old })
		l.mu.Unlock()
		_ = old.close()
		_ = os.Remove(l.segPath(old.num))
		return nil
	}
	l.sealing.Go(func() {
		if err := l.sealNow(old); err != nil {
			l.log.Warn("seglog: sidecar not written; the next start reads the segment", "segment", l.segPath(old.num), "err", err)
		}
	})
	return nil
}

// Sync makes every commit returned so far durable.
func (l *Log) Sync() error {
	v := l.published.Load()
	l.mu.RLock()
	if l.segs == nil {
		l.mu.RUnlock()
		return ErrClosed
	}
	f := l.segs[len(l.segs)-1].f
	l.mu.RUnlock()
	if err := fdatasync(f); err != nil {
		return l.fail(fmt.Errorf("seglog: sync: %w", err))
	}
	for {
		d := l.durable.Load()
		if d >= v || l.durable.CompareAndSwap(d, v) {
			return nil
		}
	}
}

// LastVersion returns the newest version written.
func (l *Log) LastVersion() uint64 { return l.published.Load() }

// Durable returns the newest version on disk: every commit up to it
// outlives a power cut.
func (l *Log) Durable() uint64 { return l.durable.Load() }

// Stats describe what the log holds.
type Stats struct {
	// Segments is the number of segment files, the one written included.
	Segments int
	// Bytes is the bytes of records they hold.
	Bytes int64
	// Streams with drops remembered, and those drops.
	DroppedStreams, Drops int
	// Records is how many records this Log wrote: one per group of
	// commits, each with one write (and under SyncAlways one sync).
	Records uint64
}

// Stats returns what the log holds.
func (l *Log) Stats() Stats {
	l.mu.RLock()
	defer l.mu.RUnlock()
	st := Stats{Segments: len(l.segs), Bytes: l.held, DroppedStreams: len(l.drops), Records: l.records.Load()}
	for _, ds := range l.drops {
		st.Drops += len(ds)
	}
	return st
}

// Close waits for the commits in flight, seals the segment written so
// that the next start reads no segment, and closes the files.
func (l *Log) Close() error {
	l.qmu.Lock()
	if l.closed {
		l.qmu.Unlock()
		return nil
	}
	l.closed = true
	l.qmu.Unlock()
	l.inflight.Wait()
	l.compactMu.Lock()
	defer l.compactMu.Unlock()
	var err error
	if l.next != nil {
		if p := <-l.next; p.f != nil {
			_ = p.f.Close()
			_ = os.Remove(p.f.Name())
		}
		l.next = nil
	}
	if l.failedErr() == nil {
		w := l.w
		if w.end == 0 {
			l.mu.Lock()
			l.segs = slices.DeleteFunc(l.segs, func(s *segment) bool { return s == w })
			l.mu.Unlock()
			_ = w.close()
			err = os.Remove(l.segPath(w.num))
		} else {
			err = w.f.Truncate(w.end)
			if err == nil {
				err = fdatasync(w.f)
			}
			if err == nil {
				err = l.sealNow(w)
			}
		}
	}
	l.sealing.Wait()
	if serr := syncDir(l.dir); err == nil {
		err = serr
	}
	l.closeFiles()
	return err
}

// closeFiles closes every segment and sidecar; reads fail with ErrClosed
// from then on.
func (l *Log) closeFiles() {
	l.files.Lock()
	defer l.files.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.segs {
		_ = s.close()
		_ = s.side.closeIfOpen()
	}
	l.segs = nil
}

// mkdirDurable makes dir and syncs the folder that holds it, so that its
// name outlives a power cut.
func mkdirDurable(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return syncDir(filepath.Dir(filepath.Clean(dir)))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("seglog: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("seglog: sync folder %s: %w", dir, err)
	}
	return nil
}
