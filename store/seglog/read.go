package seglog

import (
	"cmp"
	"fmt"
	"math"
	"runtime/debug"
	"slices"
	"sync"
	"unsafe"
)

// Read bounds.
const (
	// DefaultReadCount is how many entries a Read returns at most when
	// asked for zero or fewer; MaxReadCount bounds any.
	DefaultReadCount = 1024
	MaxReadCount     = 1 << 16
	// DefaultReadBytes is how many bytes of data a Read returns at most
	// when asked for zero or fewer; MaxReadBytes bounds any. A Read
	// returns at least one entry when there is one, however large.
	DefaultReadBytes = 4 << 20
	MaxReadBytes     = 64 << 20
	// maxSpan bounds one read of a segment: entries close together are
	// read at once, up to this many bytes, gaps between them included.
	maxSpan = 1 << 20
	// maxGap is the widest gap between two entries read at once from a
	// segment that is not mapped. A read costs about as much as copying
	// 16 KiB of the page cache on the machines measured, and the entries
	// of one execution sit a few KiB apart when tens of executions write
	// at once: a replay then reads its entries in spans, not one system
	// call each.
	maxGap = 16 << 10
)

// Entry is one entry of a stream.
type Entry struct {
	// Seq is the entry's sequence in its stream.
	Seq uint64
	// Data is the entry's bytes, owned by the caller.
	Data []byte
}

// hit is an entry found for a read, in its segment.
type hit struct {
	seg *segment
	loc
}

// visible filters out of ls the entries that ds hide.
func visible(ls []loc, ds []drop) []loc {
	if len(ds) == 0 {
		return ls
	}
	return slices.DeleteFunc(ls, func(l loc) bool {
		for _, d := range ds {
			if d.hides(l) {
				return true
			}
		}
		return false
	})
}

// floor returns the lowest sequence of stream that seg may hold visibly:
// a drop newer than everything in seg hides all of the stream below it.
func floor(seg *segment, ds []drop) uint64 {
	f := uint64(0)
	for _, d := range ds {
		if d.version > seg.maxVersion {
			f = max(f, d.before)
		}
	}
	return f
}

// Read returns the entries of stream after sequence after, in order: at
// most maxCount of them and, past the first, at most maxBytes of data (zero
// or less means the defaults; both are capped, see MaxReadCount and
// MaxReadBytes). It returns none when there are none. The entries are the
// caller's; a Reader reads without allocating them.
func (l *Log) Read(stream string, after uint64, maxCount, maxBytes int) ([]Entry, error) {
	var r Reader
	return r.Read(l, stream, after, maxCount, maxBytes)
}

// A Reader reads entries into buffers it keeps from one read to the next,
// so that reads allocate nothing once the buffers have grown: a catch-up
// reads a stream page after page. The entries a read returns, and their
// data, are valid until the Reader's next read. The zero value is ready
// for use; a Reader is not safe for concurrent use.
type Reader struct {
	hits    []hit
	sc      scratch
	order   []int
	data    []byte
	entries []Entry
}

// Read is Log.Read into r's buffers.
func (r *Reader) Read(l *Log, stream string, after uint64, maxCount, maxBytes int) ([]Entry, error) {
	if maxCount <= 0 {
		maxCount = DefaultReadCount
	}
	if maxBytes <= 0 {
		maxBytes = DefaultReadBytes
	}
	maxCount, maxBytes = min(maxCount, MaxReadCount), min(maxBytes, MaxReadBytes)
	if after == math.MaxUint64 {
		return nil, nil
	}
	l.files.RLock()
	defer l.files.RUnlock()
	hits, err := r.find(l, stream, after, maxCount)
	if err != nil || len(hits) == 0 {
		return nil, err
	}
	n, size := 0, 0
	for n < len(hits) && n < maxCount && (n == 0 || size+int(hits[n].len) <= maxBytes) {
		size += int(hits[n].len)
		n++
	}
	// The data is read outside mu, so that the writer publishing a record
	// waits for no read of a disk; files keeps the segments open.
	es, err := r.readData(hits[:n])
	clear(hits) // a reader kept for later holds on to no segment
	return es, err
}

// Retained returns the bytes r's buffers hold, for a pool of readers to
// bound what it keeps.
func (r *Reader) Retained() int {
	return cap(r.data) + cap(r.sc.block) + cap(r.sc.name) +
		cap(r.hits)*int(unsafe.Sizeof(hit{})) + cap(r.sc.locs)*int(unsafe.Sizeof(loc{})) +
		cap(r.order)*int(unsafe.Sizeof(0)) + cap(r.entries)*int(unsafe.Sizeof(Entry{}))
}

// find returns the places of stream's entries after sequence after that a
// read returns, at most maxCount, in sequence order, in r.hits.
func (r *Reader) find(l *Log, stream string, after uint64, maxCount int) ([]hit, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.segs == nil {
		return nil, ErrClosed
	}
	ds := l.drops[stream]
	hits := r.hits[:0]
	defer func() { r.hits = hits[:0] }()
	// Once maxCount are found, a segment whose first entry comes after
	// the last of them has nothing to add: a stream's entries mostly grow
	// with the segments, and a replay skips the later ones at one read.
	bound := uint64(math.MaxUint64)
	for _, seg := range l.segs {
		idx := seg.index()
		if !idx.has(stream) {
			continue
		}
		from := loc{seq: max(after+1, floor(seg, ds))}
		if bound != math.MaxUint64 {
			probe, err := idx.lookup(&r.sc, stream, from, 1, false)
			if err != nil {
				return nil, err
			}
			if len(probe) == 0 || probe[0].seq > bound {
				continue
			}
		}
		// Fetch until maxCount are visible, or the segment has no more.
		for got := 0; got < maxCount; {
			ls, err := idx.lookup(&r.sc, stream, from, maxCount, false)
			if err != nil {
				return nil, err
			}
			if len(ls) == 0 {
				break
			}
			full := len(ls) == maxCount
			last := ls[len(ls)-1]
			from = loc{seq: last.seq, version: last.version + 1}
			ls = visible(ls, ds)
			for _, lc := range ls {
				hits = append(hits, hit{seg, lc})
			}
			got += len(ls)
			if !full {
				break
			}
		}
		if len(hits) >= maxCount {
			hits = newestFirst(hits)
			hits = hits[:min(len(hits), maxCount)]
			if len(hits) == maxCount {
				bound = hits[maxCount-1].seq
			}
		}
	}
	hits = newestFirst(hits)
	return hits, nil
}

// spans are the buffers readData reads spans of entries into, maxSpan
// bytes each, reused.
var spans = sync.Pool{New: func() any { b := make([]byte, maxSpan); return &b }}

// newestFirst sorts hits by sequence and keeps, of each sequence, the
// newest version: a copy brought forward lies after newer entries, in
// another segment.
func newestFirst(hits []hit) []hit {
	slices.SortFunc(hits, func(a, b hit) int {
		return cmp.Or(cmp.Compare(a.seq, b.seq), cmp.Compare(b.version, a.version))
	})
	return slices.CompactFunc(hits, func(a, b hit) bool { return a.seq == b.seq })
}

// readData reads the hits' data into r.data and returns them as entries in
// the hits' order, in r.entries. An entry of a mapped segment is copied
// from the mapping; the others are read with one read for entries close
// together in a segment.
//
// A fault on the mapping (an I/O error under it, a segment cut short by
// hand) is turned into an error, not a crash: the runtime then panics
// instead of killing the process (debug.SetPanicOnFault), and the panic is
// recovered here.
func (r *Reader) readData(hits []hit) (_ []Entry, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		rec := recover()
		if rec == nil {
			return
		}
		if fault, ok := rec.(interface{ Addr() uintptr }); ok {
			err = fmt.Errorf("seglog: read a mapped segment: fault at %#x: %v", fault.Addr(), rec)
			return
		}
		panic(rec)
	}()
	out := slices.Grow(r.entries[:0], len(hits))[:len(hits)]
	order := slices.Grow(r.order[:0], len(hits))[:len(hits)]
	r.entries, r.order = out, order
	total := 0
	for i := range order {
		order[i] = i
		total += int(hits[i].len)
	}
	slices.SortFunc(order, func(a, b int) int {
		ha, hb := hits[a], hits[b]
		return cmp.Or(cmp.Compare(ha.seg.num, hb.seg.num), cmp.Compare(ha.off, hb.off))
	})
	if cap(r.data) < total {
		r.data = make([]byte, total)
	}
	backing := r.data[:total]
	at := 0
	place := func(k int) []byte {
		n := int(hits[k].len)
		d := backing[at : at+n : at+n]
		at += n
		out[k] = Entry{Seq: hits[k].seq, Data: d}
		return d
	}
	// A span buffer is taken only for a read of the file: a mapped
	// segment is copied from directly.
	var sp *[]byte
	defer func() {
		if sp != nil {
			spans.Put(sp)
		}
	}()
	for i := 0; i < len(order); {
		first := hits[order[i]]
		if data := first.seg.data; int64(first.off)+int64(first.len) <= int64(len(data)) {
			copy(place(order[i]), data[first.off:])
			i++
			continue
		}
		if first.len > maxSpan/2 {
			// Large: read where it goes.
			if _, err := first.seg.f.ReadAt(place(order[i]), int64(first.off)); err != nil {
				return nil, fmt.Errorf("seglog: read segment %d: %w", first.seg.num, err)
			}
			i++
			continue
		}
		start, end := int64(first.off), int64(first.off)+int64(first.len)
		j := i + 1
		for ; j < len(order); j++ {
			h := hits[order[j]]
			if h.seg != first.seg || int64(h.off) > end+maxGap || int64(h.off)+int64(h.len)-start > maxSpan {
				break
			}
			end = max(end, int64(h.off)+int64(h.len))
		}
		if sp == nil {
			sp = spans.Get().(*[]byte)
		}
		buf := (*sp)[:end-start]
		if _, err := first.seg.f.ReadAt(buf, start); err != nil {
			return nil, fmt.Errorf("seglog: read segment %d: %w", first.seg.num, err)
		}
		for _, k := range order[i:j] {
			a := int64(hits[k].off) - start
			copy(place(k), buf[a:])
		}
		i = j
	}
	return out, nil
}

// Bounds returns the lowest and highest sequence of stream that a read
// can return, or zeros when it holds none.
func (l *Log) Bounds(stream string) (first, last uint64, err error) {
	es, err := l.Read(stream, 0, 1, 1)
	if err != nil || len(es) == 0 {
		return 0, 0, err
	}
	first = es[0].Seq
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.segs == nil {
		return 0, 0, ErrClosed
	}
	ds := l.drops[stream]
	const chunk = 64
	var sc scratch
	for _, seg := range l.segs {
		idx := seg.index()
		if !idx.has(stream) {
			continue
		}
		low := max(floor(seg, ds), last+1)
		for from := (loc{seq: math.MaxUint64}); ; {
			ls, err := idx.lookup(&sc, stream, from, chunk, true)
			if err != nil {
				return 0, 0, err
			}
			if len(ls) == 0 || ls[len(ls)-1].seq < low {
				break
			}
			if v := visible(ls, ds); len(v) > 0 {
				last = max(last, v[len(v)-1].seq)
				break
			}
			if len(ls) < chunk {
				break
			}
			from = ls[0]
		}
	}
	return first, last, nil
}
