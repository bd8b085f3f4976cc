package store

import (
	"context"
	"sync"

	"github.com/gatehouse-dev/gatehouse/store/seglog"
)

// Logs is the engine under the store's sequenced logs: execution logs,
// session logs, peer outboxes. The store's journal makes each group
// durable first, records and log entries in one write; the store then
// hands the group's appends and drops to the engine at the group's
// version, as it hands its records to Badger, and reads the logs through
// it. Locally that is a segment log (package seglog, see segmentLogs);
// across several nodes, JetStream streams: one subject per stream, the
// version in a header, a drop a purge of the subject below a sequence.
type Logs interface {
	// Append writes entries and drops atomically at version, which is
	// above every version appended before. A drop hides its stream's
	// entries below its sequence that came before it, and only those.
	Append(ctx context.Context, version uint64, entries []LogEntry, drops []LogDrop) error
	// Scan calls fn with stream's entries after sequence after, in order:
	// at most maxCount, and past the first at most maxBytes of data (zero
	// or less means the engine's defaults, which it also caps), until fn
	// returns false. It returns how many fn was given. fn's data is valid
	// only during the call, so that a catch-up reading page after page
	// allocates nothing per entry; fn may read the logs again.
	Scan(ctx context.Context, stream string, after uint64, maxCount, maxBytes int, fn func(seq uint64, data []byte) bool) (int, error)
	// Bounds returns the first and last sequence a read can return, or
	// zeros when the stream holds none.
	Bounds(ctx context.Context, stream string) (first, last uint64, err error)
	// Sync makes everything appended durable and returns the newest
	// version that outlives a power cut: the journal keeps every group
	// above it.
	Sync(ctx context.Context) (durable uint64, err error)
	// Close releases the engine.
	Close() error
}

// LogEntry is one entry to append.
type LogEntry struct {
	Stream string
	Seq    uint64
	Data   []byte
}

// LogDrop hides the entries of Stream below Before.
type LogDrop struct {
	Stream string
	Before uint64
}

// segmentLogs is Logs on a local segment log, run behind the journal: it
// syncs only when asked (seglog.SyncNone).
type segmentLogs struct {
	l *seglog.Log
	// readers keeps the scans' buffers from one scan to the next, and
	// batches the appends' batches (their items) from one append to the
	// next.
	readers *sync.Pool
	batches *sync.Pool
}

// maxPooledReader bounds the buffers a reader keeps when it goes back to
// the pool: a scan's page (scanPageBytes) and its index, with room. A
// reader that read a larger page is dropped.
const maxPooledReader = 2 << 20

var _ Logs = segmentLogs{}

// openSegmentLogs opens the segment log in dir.
func openSegmentLogs(dir string, o seglog.Options) (segmentLogs, error) {
	o.Sync = seglog.SyncNone
	l, err := seglog.Open(dir, o)
	return segmentLogs{l: l,
		readers: &sync.Pool{New: func() any { return new(seglog.Reader) }},
		batches: &sync.Pool{New: func() any { return new(seglog.Batch) }},
	}, err
}

// maxPooledBatch bounds the items of a batch that goes back to the pool:
// a group's log writes, with room. A larger one, such as a move's, is
// dropped.
const maxPooledBatch = 1024

func (s segmentLogs) Append(ctx context.Context, version uint64, entries []LogEntry, drops []LogDrop) error {
	b := s.batches.Get().(*seglog.Batch)
	for _, e := range entries {
		b.Append(e.Stream, e.Seq, e.Data)
	}
	for _, d := range drops {
		b.DropBefore(d.Stream, d.Before)
	}
	b.SetVersion(version)
	err := s.l.Commit(ctx, b)
	// The segment log keeps nothing of a batch once Commit returns.
	if b.Len() <= maxPooledBatch {
		b.Reset()
		s.batches.Put(b)
	}
	return err
}

func (s segmentLogs) Scan(_ context.Context, stream string, after uint64, maxCount, maxBytes int, fn func(seq uint64, data []byte) bool) (int, error) {
	r := s.readers.Get().(*seglog.Reader)
	es, err := r.Read(s.l, stream, after, maxCount, maxBytes)
	n := 0
	if err == nil {
		// fn runs with no lock of the log held: the entries are in r.
		for _, e := range es {
			n++
			if !fn(e.Seq, e.Data) {
				break
			}
		}
	}
	if r.Retained() <= maxPooledReader {
		s.readers.Put(r)
	}
	return n, err
}

func (s segmentLogs) Bounds(_ context.Context, stream string) (uint64, uint64, error) {
	return s.l.Bounds(stream)
}

func (s segmentLogs) Sync(context.Context) (uint64, error) {
	v := s.l.LastVersion()
	if err := s.l.Sync(); err != nil {
		return s.l.Durable(), err
	}
	return max(v, s.l.Durable()), nil
}

func (s segmentLogs) Close() error { return s.l.Close() }

// retainer is a Logs that the store runs retention on: the segment log
// drops its oldest segments, copying forward what is still live in them.
type retainer interface {
	Retain(ctx context.Context) error
}

// retainLive is the share of the oldest segment's bytes still live below
// which retention rewrites it: at most half of what is written again is
// copied, so a byte is copied at most once on average.
const retainLive = 0.5

// Retain compacts the segment log (see seglog.Log.Compact).
func (s segmentLogs) Retain(ctx context.Context) error {
	_, err := s.l.Compact(ctx, retainLive)
	return err
}
