package seglog

import (
	"cmp"
	"slices"
)

// loc is one entry's place: its sequence and version, and where its data
// lies in its segment.
type loc struct {
	seq, version uint64
	off          uint32
	len          uint32
}

// compareLoc orders a stream's entries by sequence, then version.
func compareLoc(a, b loc) int {
	if c := cmp.Compare(a.seq, b.seq); c != 0 {
		return c
	}
	return cmp.Compare(a.version, b.version)
}

// drop hides the entries of a stream below before that are older than
// version; seg is the segment that holds it.
type drop struct {
	before, version, seg uint64
}

// hides reports whether the drop hides l.
func (d drop) hides(l loc) bool { return l.seq < d.before && l.version < d.version }

// memIndex indexes a segment in memory: the one being written, and one
// sealed whose sidecar is not written yet. Only the leader adds to it,
// under the log's lock; readers read it under the read lock.
type memIndex struct {
	streams map[string][]loc // sorted by compareLoc
	drops   []namedDrop
	entries int
}

type namedDrop struct {
	stream string
	drop
}

func newMemIndex() *memIndex { return &memIndex{streams: map[string][]loc{}} }

// add indexes an entry. Appends come in sequence order; a copy brought
// forward may come below what the stream holds here, and is put in place.
func (m *memIndex) add(stream string, l loc) {
	ls := m.streams[stream]
	if n := len(ls); n == 0 || compareLoc(ls[n-1], l) < 0 {
		m.streams[stream] = append(ls, l)
	} else {
		i, _ := slices.BinarySearchFunc(ls, l, compareLoc)
		m.streams[stream] = slices.Insert(ls, i, l)
	}
	m.entries++
}

// segmentIndex is what reads need of one segment's index, in memory or in
// its sidecar.
type segmentIndex interface {
	// lookup returns at most n of the stream's entries in the segment, in
	// (sequence, version) order: the first at or past from; or, with back
	// set, the last before from. It returns none when the segment holds
	// none. A read goes on from past the last it got, so that no version
	// of a sequence is skipped. The entries are in sc.locs, valid until
	// sc's next use.
	lookup(sc *scratch, stream string, from loc, n int, back bool) ([]loc, error)
	// has reports whether the segment may hold entries of stream.
	has(stream string) bool
}

func (m *memIndex) has(stream string) bool { return len(m.streams[stream]) > 0 }

func (m *memIndex) lookup(sc *scratch, stream string, from loc, n int, back bool) ([]loc, error) {
	ls := m.streams[stream]
	i, _ := slices.BinarySearchFunc(ls, from, compareLoc)
	if back {
		ls = ls[max(0, i-n):i]
	} else {
		ls = ls[i:min(len(ls), i+n)]
	}
	sc.locs = append(sc.locs[:0], ls...)
	return sc.locs, nil
}

// scratch is what an index lookup reads into: the entries found, and the
// bytes read of a sidecar. A Reader keeps one from one read to the next.
type scratch struct {
	locs       []loc
	block      []byte
	name       []byte
	entryBytes [entrySize]byte
}

// blockOf returns n bytes of sc's block buffer.
func (sc *scratch) blockOf(n int) []byte {
	if cap(sc.block) < n {
		sc.block = make([]byte, n)
	}
	return sc.block[:n]
}
