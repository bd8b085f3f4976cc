package seglog

import (
	"context"
	"fmt"
	"os"
	"slices"
)

// itemFraming estimates what an item takes besides its name and data:
// kind, lengths, sequence and version, and a share of its record's header.
const itemFraming = 8

// CompactStats says what a Compact did.
type CompactStats struct {
	// Segments is how many segments were deleted, and Freed their bytes.
	Segments int
	Freed    int64
	// Entries is how many entries were copied forward, and Copied their
	// bytes of data.
	Entries int
	Copied  int64
}

// Compact deletes sealed segments, oldest first, while the share of the
// oldest one's bytes still live (entries that no drop hides) is at most
// maxLive: its live entries are appended again, each with its own version,
// and synced, before it goes. With maxLive 0 only segments that hold
// nothing live go; with 1, every sealed segment is rewritten. The segment
// being written is never compacted. ctx bounds the wait for the copies'
// commits, and stops the walk between segments.
func (l *Log) Compact(ctx context.Context, maxLive float64) (CompactStats, error) {
	l.compactMu.Lock()
	defer l.compactMu.Unlock()
	var st CompactStats
	// The segments written from now on hold the copies: they are not for
	// this walk, which would otherwise go round for ever.
	l.mu.RLock()
	if l.segs == nil {
		l.mu.RUnlock()
		return st, ErrClosed
	}
	stop := l.segs[len(l.segs)-1].num
	l.mu.RUnlock()
	for ctx.Err() == nil {
		l.mu.RLock()
		if l.segs == nil {
			l.mu.RUnlock()
			return st, ErrClosed
		}
		var seg *segment
		if s := l.segs[0]; len(l.segs) > 1 && s.side != nil && s.num < stop {
			seg = s
		}
		drops := l.dropCount
		l.mu.RUnlock()
		if seg == nil || maxLive <= l.tooLive.maxLive && l.tooLive.num == seg.num && l.tooLive.drops == drops {
			// Nothing to compact, or nothing hidden since the oldest
			// was found too live.
			return st, nil
		}
		live, bytes, framed, err := l.liveOf(seg)
		if err != nil {
			return st, err
		}
		if maxLive < 1 && float64(framed) > maxLive*float64(seg.end) {
			l.tooLive.num, l.tooLive.drops, l.tooLive.maxLive = seg.num, drops, maxLive
			return st, nil
		}
		n, err := l.copyForward(ctx, seg, live)
		if err != nil {
			return st, err
		}
		if n > 0 {
			if err := l.Sync(); err != nil {
				return st, err
			}
		}
		if err := l.deleteSegment(seg); err != nil {
			return st, err
		}
		st.Segments++
		st.Freed += seg.end
		st.Entries += n
		st.Copied += bytes
	}
	return st, ctx.Err()
}

// liveOf returns the entries of seg that no drop hides, by stream, their
// bytes of data, and an estimate of the bytes they take in the segment,
// names and framing included.
func (l *Log) liveOf(seg *segment) (live map[string][]loc, bytes, framed int64, err error) {
	live = map[string][]loc{}
	err = seg.side.each(func(stream string, ls []loc) error {
		l.mu.RLock()
		ls = visible(ls, l.drops[stream])
		l.mu.RUnlock()
		if len(ls) > 0 {
			live[stream] = ls
			for _, lc := range ls {
				bytes += int64(lc.len)
				framed += int64(lc.len) + int64(len(stream)) + itemFraming
			}
		}
		return nil
	})
	if err != nil {
		return nil, 0, 0, fmt.Errorf("seglog: compact segment %d: %w", seg.num, err)
	}
	return live, bytes, framed, nil
}

// copyForward appends live's entries of seg again, in batches of at most
// half a group, and returns how many.
func (l *Log) copyForward(ctx context.Context, seg *segment, live map[string][]loc) (int, error) {
	limit := l.o.MaxGroupBytes / 2
	var (
		b     Batch
		hits  []hit
		names []string
		size  int
		n     int
	)
	flush := func() error {
		if len(hits) == 0 {
			return nil
		}
		var r Reader
		l.files.RLock()
		es, err := r.readData(hits)
		l.files.RUnlock()
		if err != nil {
			return err
		}
		b = Batch{}
		for i, e := range es {
			b.copyOf(names[i], hits[i].loc, e.Data)
		}
		if err := l.Commit(ctx, &b); err != nil {
			return fmt.Errorf("seglog: compact segment %d: %w", seg.num, err)
		}
		n += len(hits)
		hits, names, size = hits[:0], names[:0], 0
		return nil
	}
	streams := make([]string, 0, len(live))
	for s := range live {
		streams = append(streams, s)
	}
	slices.Sort(streams)
	for _, s := range streams {
		for _, lc := range live[s] {
			if len(hits) > 0 && size+int(lc.len)+len(s)+itemOverhead > limit {
				if err := flush(); err != nil {
					return n, err
				}
			}
			hits = append(hits, hit{seg, lc})
			names = append(names, s)
			size += int(lc.len) + len(s) + itemOverhead
		}
	}
	return n, flush()
}

// deleteSegment removes seg, the oldest, and the drops it holds: nothing
// older is left for them to hide (see the package's doc).
func (l *Log) deleteSegment(seg *segment) error {
	l.mu.Lock()
	l.segs = slices.DeleteFunc(l.segs, func(s *segment) bool { return s == seg })
	l.held -= seg.end
	for stream, ds := range l.drops {
		ds = slices.DeleteFunc(ds, func(d drop) bool { return d.seg == seg.num })
		if len(ds) == 0 {
			delete(l.drops, stream)
		} else {
			l.drops[stream] = ds
		}
	}
	l.mu.Unlock()
	// Reads that found its entries before it left the list may be
	// reading its data still.
	l.files.Lock()
	_ = seg.close()
	_ = seg.side.close()
	l.files.Unlock()
	// The sidecar goes first: a segment without one is read at the next
	// start, while a sidecar without its segment is only deleted.
	if err := os.Remove(l.idxPath(seg.num)); err != nil {
		return fmt.Errorf("seglog: compact: %w", err)
	}
	if err := os.Remove(l.segPath(seg.num)); err != nil {
		return fmt.Errorf("seglog: compact: %w", err)
	}
	return syncDir(l.dir)
}
