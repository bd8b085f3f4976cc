package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/dgraph-io/badger/v4"

	"github.com/gatehouse-dev/gatehouse/store/seglog"
)

// The store keeps its logs in a segment log (package seglog, in the data
// folder's logs/), and Badger keeps the records. A group is journaled
// whole, its log writes with its records, in the journal's one write; the
// apply stage then hands its log writes to the segment log and the rest to
// Badger (see applyGroups), and a journal segment is released only once
// the segment log has synced what it holds (see releasable).
//
// Which logs go to the segment log is said by the start of their names
// (Options.SegmentLogs): by default the kernel's execution logs ("x/…"),
// the sessions' logs ("s/…") and the channels' logs ("chlog/…"), all
// deleted from their start, so that deleting entry seq of such a log
// deletes the entries below it too (see Batch.DeleteEntry). The others
// stay in Badger: the peer outboxes ("o/…"), written lazily and mostly
// deleted before Badger ever gets them, whose deliveries settled out of
// order are deleted in the middle, which a log's drops (every entry below
// a sequence) cannot say.

// defaultSegmentLogs returns the default Options.SegmentLogs.
func defaultSegmentLogs() []string { return []string{"x/", "s/", "chlog/"} }

// Data folder formats. Format 2 keeps the logs in logs/; a folder without
// a FORMAT file and with data is format 1, whose logs are in Badger: Open
// moves them. Format 3 is format 2 whose records may be laid out as the
// kernel lays them out since (its executions' records in one kind, see
// kernel/keys.go), which a build of format 2 would read as no executions
// at all. The store cannot tell the layouts apart, so Open records format
// 3 before anything else is written: a build that reads format 2 refuses
// the folder from then on, whatever the kernel has moved yet, and the
// kernel moves what is left of the earlier layout at every start until
// none is left.
const (
	formatFile    = "FORMAT"
	formatVersion = "3"
	logsDir       = "logs"
)

// formatSegmentLogs is the format that first kept the logs in logs/: a
// folder of it is opened as one of formatVersion, which it becomes.
const formatSegmentLogs = "2"

// ErrFormat means the data folder was written by a build that stores its
// data differently, and this build cannot read it.
var ErrFormat = errors.New("store: data folder format not supported")

// inSegments reports whether stream is kept in the segment log.
func (s *Store) inSegments(stream string) bool {
	return s.logs != nil && s.segmentName([]byte(stream))
}

// segmentName reports whether the log named name is kept in the segment
// log, without making a string of it: every write asks.
func (s *Store) segmentName(name []byte) bool {
	for _, p := range s.segmentLogs {
		if len(name) >= len(p) && string(name[:len(p)]) == p {
			return true
		}
	}
	return false
}

// segmentKey reports whether key is an entry of a log kept in the segment
// log, and if so its stream's name and its sequence.
func (s *Store) segmentKey(key []byte) (stream []byte, seq uint64, ok bool) {
	if s.logs == nil || len(key) < 2+1+8 || key[0] != 'l' || key[1] != '/' || key[len(key)-9] != 0 {
		return nil, 0, false
	}
	stream = key[2 : len(key)-9]
	if !s.segmentName(stream) {
		return nil, 0, false
	}
	return stream, binary.BigEndian.Uint64(key[len(key)-8:]), true
}

// splitLogs takes the segment log's writes out of ops: appends in order,
// and per stream one drop below its highest entry deleted. It adds them
// to s.split's, after those of the groups before it in the same append,
// and appends the rest, for Badger, to rest; ops itself is not changed. An
// entry at sequence 0 or 2^64-1, which no Scan reads (it reads after a
// sequence, and nothing comes after the largest), is not kept.
func (s *Store) splitLogs(ops, rest []op) []op {
	sp := &s.split
	entries, drops := sp.entries, sp.drops
	own := len(drops)
	for _, o := range ops {
		name, seq, ok := s.segmentKey(o.key)
		switch {
		case !ok:
			rest = append(rest, o)
		case o.del:
			before := seq + 1
			if seq == math.MaxUint64 {
				before = seq
			}
			i := len(drops) - 1
			for ; i >= own && drops[i].Stream != string(name); i-- {
			}
			if i < own {
				drops = append(drops, LogDrop{Stream: sp.intern(name), Before: before})
			} else {
				drops[i].Before = max(drops[i].Before, before)
			}
		case seq == 0, seq == math.MaxUint64:
		default:
			entries = append(entries, LogEntry{Stream: sp.intern(name), Seq: seq, Data: o.val})
		}
	}
	sp.entries, sp.drops = entries, drops
	return rest
}

// logSplit is the room splitLogs works in, kept from one group to the
// next by the apply stage (or the replay at Open, before it starts). The
// segment log keeps none of the entries and drops once its Append
// returns, and rest holds the writes for Badger of the groups applied
// together, until their transaction has them. names interns the names of
// the logs written lately: most groups write logs that earlier ones did.
// spans holds, per stream, the sequences of the entries waiting for one
// append (see appendLogs), and bytes their size.
type logSplit struct {
	entries []LogEntry
	drops   []LogDrop
	rest    []op
	names   map[string]string
	spans   map[string]seqSpan
	bytes   int
}

// seqSpan is the lowest and highest sequence of a stream's entries.
type seqSpan struct{ lo, hi uint64 }

// maxInterned bounds logSplit.names: past it, the names are forgotten.
const maxInterned = 4096

// intern returns name as a string, the same string as for the names
// before it, while it is remembered.
func (sp *logSplit) intern(name []byte) string {
	if n, ok := sp.names[string(name)]; ok {
		return n
	}
	if sp.names == nil {
		sp.names = make(map[string]string)
	} else if len(sp.names) >= maxInterned {
		clear(sp.names)
	}
	n := string(name)
	sp.names[n] = n
	return n
}

// done lets go of what the last split referred to, keeping the room.
func (sp *logSplit) done() {
	sp.entries, sp.drops = reusable(sp.entries), reusable(sp.drops)
	sp.forget()
}

// forget empties sp.spans, letting it go when a burst grew it past
// maxInterned streams (a map cleared keeps its room), and sp.bytes.
func (sp *logSplit) forget() {
	if len(sp.spans) > maxInterned {
		sp.spans = nil
	}
	clear(sp.spans)
	sp.bytes = 0
}

// conflicts reports whether the entries and drops from e and d on, a
// group's, read differently when appended together with the ones before
// them, whose spans sp.spans holds, than when appended after them. The
// segment log orders a stream's entries by sequence and then version, and
// a drop hides only entries of lower versions; in one append all have one
// version. So a group conflicts when it drops entries below a sequence
// that one before it appended, or appends a sequence at or below one
// appended before it (the kernel's logs never do: their sequences grow).
func (sp *logSplit) conflicts(e, d int) bool {
	if len(sp.spans) == 0 {
		return false
	}
	for _, x := range sp.drops[d:] {
		if span, ok := sp.spans[x.Stream]; ok && span.lo < x.Before {
			return true
		}
	}
	for _, x := range sp.entries[e:] {
		if span, ok := sp.spans[x.Stream]; ok && x.Seq <= span.hi {
			return true
		}
	}
	return false
}

// note adds the entries from e on to sp.spans and sp.bytes.
func (sp *logSplit) note(e int) {
	if sp.spans == nil {
		sp.spans = make(map[string]seqSpan)
	}
	sp.bytes += logBytes(sp.entries[e:])
	for _, x := range sp.entries[e:] {
		span, ok := sp.spans[x.Stream]
		if !ok {
			span = seqSpan{lo: x.Seq, hi: x.Seq}
		}
		span.lo, span.hi = min(span.lo, x.Seq), max(span.hi, x.Seq)
		sp.spans[x.Stream] = span
	}
}

// shift drops the first e entries and d drops, appended, keeping the ones
// after them, and forgets the spans and size of the appended ones.
func (sp *logSplit) shift(e, d int) {
	n := copy(sp.entries, sp.entries[e:])
	clear(sp.entries[n:])
	sp.entries = sp.entries[:n]
	n = copy(sp.drops, sp.drops[d:])
	clear(sp.drops[n:])
	sp.drops = sp.drops[:n]
	sp.forget()
}

// maxReused bounds the items of a slice the apply stage keeps for the
// next group: one grown larger, by a burst or a replay, is let go.
const maxReused = 4096

// reusable clears s, so that it keeps nothing it held from the collector,
// and returns it emptied to be filled again, or nil when it grew past
// maxReused.
func reusable[T any](s []T) []T {
	if cap(s) > maxReused {
		return nil
	}
	clear(s)
	return s[:0]
}

// checkLogs refuses a batch the segment log would refuse: one whose log
// writes name a stream longer than seglog.MaxStreamName, or come to more
// than maxLogBatch bytes. Refused here, it is not written; refused by the
// segment log, after the journal, it would fail the store.
func (s *Store) checkLogs(b *Batch) error {
	size := 0
	for _, o := range b.ops {
		stream, _, ok := s.segmentKey(o.key)
		if !ok {
			continue
		}
		if len(stream) > seglog.MaxStreamName {
			return fmt.Errorf("%w: log name of %d bytes, at most %d", ErrTooLarge, len(stream), seglog.MaxStreamName)
		}
		size += len(stream) + len(o.val) + logItemOverhead
	}
	if size > maxLogBatch {
		return fmt.Errorf("%w: %d bytes of log entries in one batch, at most %d", ErrTooLarge, size, maxLogBatch)
	}
	return nil
}

// logItemOverhead is what the segment log counts for an entry besides its
// name and data (a kind byte and four varints, at most).
const logItemOverhead = 1 + 4*binary.MaxVarintLen64

// maxLogBatch bounds the log writes of one batch, and so of one group past
// maxGroupBytes: what one append to the segment log may hold.
const maxLogBatch = seglog.MaxSegmentSize / 4

// ErrTooLarge means a batch holds more than the store takes in one write.
var ErrTooLarge = errors.New("store: batch too large")

// appendLogs hands the segment log the log writes of groups, applied
// together, and appends the rest of their writes, for Badger, to rest. A
// group whose log writes went there at once keeps only the rest. The
// groups' log writes go in one append, at the last one's version: one
// write of the segment log's instead of one per group. A group that
// conflicts with those before it (logSplit.conflicts), or would take the
// append past maxLogAppend, starts another.
func (s *Store) appendLogs(groups []*group, rest []op) ([]op, error) {
	sp := &s.split
	defer sp.done()
	var at uint64
	for _, g := range groups {
		e, d, from := len(sp.entries), len(sp.drops), len(rest)
		rest = s.splitLogs(g.ops, rest)
		if at != 0 && (sp.conflicts(e, d) || sp.bytes+logBytes(sp.entries[e:]) > maxLogAppend) {
			if err := s.flushLogs(at, e, d); err != nil {
				return nil, err
			}
			sp.shift(e, d)
			e, at = 0, 0
		}
		sp.note(e)
		if len(sp.entries) > 0 || len(sp.drops) > 0 {
			at = g.ts
		}
		if kept := rest[from:len(rest):len(rest)]; len(kept) < len(g.ops) {
			// A lazy write to a log in the segment log went there at
			// once: nothing waits for it.
			g.ops, g.lazy = kept, 0
			for _, o := range kept {
				if o.lazy {
					g.lazy++
				}
			}
		}
	}
	if at == 0 {
		return rest, nil
	}
	return rest, s.flushLogs(at, len(sp.entries), len(sp.drops))
}

// maxLogAppend bounds the log writes of groups appended together: past
// it, a group starts another append. Groups are merged for the system
// calls they save, which a few hundred KiB already amortise; and a larger
// append, which the segment log keeps in one segment, would leave more of
// a small segment (a memory limit's) unused.
const maxLogAppend = 256 << 10

// logBytes is the size of entries as checkLogs counts it.
func logBytes(entries []LogEntry) int {
	n := 0
	for _, e := range entries {
		n += len(e.Stream) + len(e.Data) + logItemOverhead
	}
	return n
}

// flushLogs appends the first e entries and d drops of s.split at version
// at.
func (s *Store) flushLogs(at uint64, e, d int) error {
	sp := &s.split
	if err := s.logs.Append(context.Background(), at, sp.entries[:e], sp.drops[:d]); err != nil {
		return fmt.Errorf("store: logs: %w", err)
	}
	return nil
}

// readFormat returns the data folder's format: formatVersion, "1" for a
// folder of the earlier layout (Badger holds data, no FORMAT file), or ""
// for a new folder.
func readFormat(dir string, db *badger.DB) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, formatFile))
	switch {
	case err == nil:
		v := strings.TrimSpace(string(b))
		if v != formatVersion && v != formatSegmentLogs {
			return "", fmt.Errorf("%w: %s is format %q, and this build reads format %s (and moves formats 1 and %s on start): run the gatehouse that wrote it, or start afresh in an empty folder",
				ErrFormat, dir, v, formatVersion, formatSegmentLogs)
		}
		return v, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("store: read %s: %w", formatFile, err)
	}
	if db.MaxVersion() > 0 {
		return "1", nil
	}
	return "", nil
}

// writeFormat records the folder's format, durably.
func writeFormat(dir string) error {
	path := filepath.Join(dir, formatFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("store: write %s: %w", formatFile, err)
	}
	_, err = f.WriteString(formatVersion + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("store: write %s: %w", formatFile, err)
	}
	return nil
}

// migrateBatch bounds the entries moved in one append.
const migrateBatch = 4096

// moveLogs moves the logs of a format 1 folder from Badger to the segment
// log, stream by stream, at versions above last, then records format 2, then deletes them from
// Badger (see clearMovedLogs). A start cut short before the format is
// recorded moves them again into an emptied segment log; one cut short
// after it finds the format recorded and only deletes what is left.
func (s *Store) moveLogs(last uint64) (int, error) {
	txn := s.db.NewTransactionAt(math.MaxUint64, false)
	defer txn.Discard()
	it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte("l/"), PrefetchValues: true, PrefetchSize: 256})
	defer it.Close()
	var (
		entries []LogEntry
		size    int
		moved   int
		version = last
	)
	flush := func() error {
		if len(entries) == 0 {
			return nil
		}
		version++
		if err := s.logs.Append(context.Background(), version, entries, nil); err != nil {
			return fmt.Errorf("store: move the logs to %s: %w", logsDir, err)
		}
		moved += len(entries)
		entries, size = entries[:0], 0
		return nil
	}
	for it.Rewind(); it.Valid(); it.Next() {
		item := it.Item()
		name, seq, ok := s.segmentKey(item.Key())
		if !ok {
			continue
		}
		stream := string(name)
		val, err := item.ValueCopy(nil)
		if err != nil {
			return moved, fmt.Errorf("store: move the logs: read %s/%d: %w", stream, seq, err)
		}
		entries = append(entries, LogEntry{Stream: stream, Seq: seq, Data: val})
		size += len(val)
		if len(entries) >= migrateBatch || size >= maxGroupBytes/2 {
			if err := flush(); err != nil {
				return moved, err
			}
		}
	}
	if err := flush(); err != nil {
		return moved, err
	}
	if _, err := s.logs.Sync(context.Background()); err != nil {
		return moved, fmt.Errorf("store: move the logs: %w", err)
	}
	if err := writeFormat(s.opts.Dir); err != nil {
		return moved, err
	}
	return moved, s.clearMovedLogs()
}

// clearMovedLogs deletes from Badger the entries of the logs the segment
// log holds, left by a move, and syncs Badger.
func (s *Store) clearMovedLogs() error {
	var keys [][]byte
	txn := s.db.NewTransactionAt(math.MaxUint64, false)
	it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte("l/")})
	for it.Rewind(); it.Valid(); it.Next() {
		if _, _, ok := s.segmentKey(it.Item().Key()); ok {
			keys = append(keys, it.Item().KeyCopy(nil))
		}
	}
	it.Close()
	txn.Discard()
	if len(keys) == 0 {
		return nil
	}
	ts := s.db.MaxVersion() + 1
	wb := s.db.NewWriteBatchAt(ts)
	defer wb.Cancel()
	for _, k := range keys {
		if err := wb.Delete(k); err != nil {
			return fmt.Errorf("store: clear the moved logs: %w", err)
		}
	}
	if err := wb.Flush(); err != nil {
		return fmt.Errorf("store: clear the moved logs: %w", err)
	}
	if err := s.db.Sync(); err != nil {
		return fmt.Errorf("store: clear the moved logs: %w", err)
	}
	return nil
}

// openLogs opens the folder's segment log (emptied first in a format 1
// folder, whose logs settleFormat moves once the journal is replayed),
// records the format of a new folder and of a format 2 one (see
// formatVersion), and reports whether the folder is of format 1.
func (s *Store) openLogs(z sizing) (legacy bool, err error) {
	format, err := readFormat(s.opts.Dir, s.db)
	if err != nil {
		return false, err
	}
	dir := filepath.Join(s.opts.Dir, logsDir)
	if format == "1" {
		// A move cut short left a partial copy: it starts again.
		if err := os.RemoveAll(dir); err != nil {
			return false, fmt.Errorf("store: move the logs: %w", err)
		}
	}
	size := z.logSegment
	if s.opts.segmentSize > 0 {
		size = s.opts.segmentSize
	}
	logs, err := openSegmentLogs(dir, seglog.Options{SegmentSize: size, MaxBatchBytes: 2 * maxLogBatch, Logger: s.log})
	if err != nil {
		return false, err
	}
	s.logs = logs
	if format == "" || format == formatSegmentLogs {
		if err := writeFormat(s.opts.Dir); err != nil {
			return false, err
		}
	}
	return format == "1", nil
}

// settleFormat finishes what the folder's format asks for once the
// journal is replayed: a format 1 folder's logs move to the segment log, at
// versions above last, the newest the store holds; in a format 2 folder,
// what a move cut short left in Badger is deleted.
func (s *Store) settleFormat(last uint64) error {
	if !s.legacy {
		return s.clearMovedLogs()
	}
	n, err := s.moveLogs(last)
	if err != nil {
		return err
	}
	s.legacy = false
	s.log.Info("store: moved the logs from Badger to the segment log (data folder format 1 to 2)", "entries", n)
	return nil
}

// closeLogs closes the segment log, if open.
func (s *Store) closeLogs() error {
	if s.logs == nil {
		return nil
	}
	return s.logs.Close()
}

// scanPage bounds one read of the segment log by a Scan.
const (
	scanPageCount = 1024
	scanPageBytes = 1 << 20
)

// scanSegments is Scan of a log in the segment log, a page at a time. It
// sees every write acknowledged before it: the apply stage hands a group's
// log writes to the segment log before it counts the group applied.
func (s *Store) scanSegments(stream string, after uint64, limit int, fn func(seq uint64, data []byte) bool) error {
	s.awaitApplied()
	for {
		count := scanPageCount
		if limit > 0 {
			count = min(count, limit)
		}
		more := true
		n, err := s.logs.Scan(context.Background(), stream, after, count, scanPageBytes, func(seq uint64, data []byte) bool {
			after = seq
			more = fn(seq, data)
			return more
		})
		if err != nil {
			return fmt.Errorf("store: read %s: %w", stream, err)
		}
		if n == 0 || !more {
			return nil
		}
		if limit > 0 {
			if limit -= n; limit <= 0 {
				return nil
			}
		}
	}
}

// segmentEntry is Entry of a log in the segment log.
func (s *Store) segmentEntry(stream string, seq uint64) ([]byte, error) {
	s.awaitApplied()
	if seq > 0 {
		var data []byte
		found := false
		_, err := s.logs.Scan(context.Background(), stream, seq-1, 1, 1, func(got uint64, d []byte) bool {
			if got == seq {
				data, found = bytes.Clone(d), true
			}
			return false
		})
		if err != nil {
			return nil, fmt.Errorf("store: read %s/%d: %w", stream, seq, err)
		}
		if found {
			return data, nil
		}
	}
	return nil, fmt.Errorf("%w: %s/%d", ErrNotFound, stream, seq)
}

// retainLogs has the segment log drop the segments that hold little still
// live (see retainer). A failure is logged: the segments stay, and the
// next checkpoint tries again.
func (s *Store) retainLogs(ctx context.Context) error {
	r, ok := s.logs.(retainer)
	if !ok {
		return nil
	}
	err := r.Retain(ctx)
	if err != nil && !errors.Is(err, seglog.ErrClosed) {
		s.log.Warn("store: segment log retention", "err", err)
	}
	return err
}
