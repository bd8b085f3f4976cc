package peer

import "sort"

// queue holds an outbox's unacknowledged entries in sequence order. It is
// a slice read from a head index: acknowledging or trimming the oldest
// entries moves the head instead of copying what remains, so a consumer
// that never acknowledges costs O(1) per delivery, not O(outbox size).
// The live entries are moved to the front only when the slice is full and
// at least half of it is dead, which keeps that copy amortized O(1).
type queue struct {
	buf  []entry
	head int
}

// shrinkCap is the capacity above which an emptied queue lets go of its
// array, so an idle consumer does not keep a large one.
const shrinkCap = 64

func (q *queue) len() int { return len(q.buf) - q.head }

// at returns the i-th live entry, oldest first.
func (q *queue) at(i int) *entry { return &q.buf[q.head+i] }

func (q *queue) push(e entry) {
	if len(q.buf) == cap(q.buf) && q.head > 0 && q.head >= len(q.buf)/2 {
		n := copy(q.buf, q.buf[q.head:])
		clear(q.buf[n:])
		q.buf, q.head = q.buf[:n], 0
	}
	q.buf = append(q.buf, e)
}

// popFront drops the n oldest entries.
func (q *queue) popFront(n int) {
	clear(q.buf[q.head : q.head+n]) // let go of the payloads
	q.head += n
	if q.head == len(q.buf) {
		q.reset()
	}
}

// removeAt drops the i-th live entry: a copy of the entries after it,
// which is cheap for its callers (an aborted or settled delivery, near the
// end or in a short outbox).
func (q *queue) removeAt(i int) {
	j := q.head + i
	copy(q.buf[j:], q.buf[j+1:])
	q.buf[len(q.buf)-1] = entry{}
	q.buf = q.buf[:len(q.buf)-1]
	if q.head == len(q.buf) {
		q.reset()
	}
}

func (q *queue) reset() {
	if cap(q.buf) > shrinkCap {
		q.buf = nil
	} else {
		q.buf = q.buf[:0]
	}
	q.head = 0
}

// clearAll drops every entry.
func (q *queue) clearAll() {
	clear(q.buf)
	q.buf, q.head = nil, 0
}

// search returns the index of the first live entry whose sequence is at
// least seq (len() when there is none).
func (q *queue) search(seq uint64) int {
	live := q.buf[q.head:]
	return sort.Search(len(live), func(i int) bool { return live[i].Seq >= seq })
}

// find returns the index of the entry with sequence seq, or -1.
func (q *queue) find(seq uint64) int {
	if i := q.search(seq); i < q.len() && q.at(i).Seq == seq {
		return i
	}
	return -1
}
