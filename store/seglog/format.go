package seglog

import (
	"encoding/binary"
	"errors"
	"hash/crc32"

	"github.com/gatehouse-dev/gatehouse/internal/recordsum"
)

// A segment is records back to back from offset 0. A record is its
// payload's length (uint32), the CRC-32C of the payload seeded with the
// segment's number (uint32), both little-endian, and the payload: the
// record's base version (uint64), a uvarint count of items, and the items.
// An item is a kind byte, the stream's name (uvarint length, bytes), and:
//
//   - itemAppend: uvarint sequence, uvarint version offset from the base,
//     uvarint data length, data;
//   - itemCopy: uvarint sequence, uvarint version (absolute: an entry
//     copied forward keeps its own), uvarint data length, data;
//   - itemDrop: uvarint sequence (the first kept), uvarint version offset.
//
// The checksum's seed makes what an earlier life of the file left behind
// read as the end of the segment.
const (
	itemAppend = 1
	itemCopy   = 2
	itemDrop   = 3

	recordHeader = 8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errMalformed says a record's checksum matched but its payload does not
// parse: written by something else, never by a torn write.
var errMalformed = errors.New("seglog: malformed record")

// item is one parsed item of a record. data and stream alias the record's
// bytes; dataOff is where data starts in the record's payload.
type item struct {
	kind    byte
	stream  []byte
	seq     uint64
	version uint64
	data    []byte
	dataOff int
}

// encoder builds one record.
type encoder struct {
	buf  []byte
	base uint64
	n    int
}

// begin starts a record at base version base.
func (e *encoder) begin(base uint64) {
	e.buf = append(e.buf[:0], make([]byte, recordHeader+8+binary.MaxVarintLen64)...)
	e.base, e.n = base, 0
}

// add appends an item, returning the offset of its data in the record
// (counted from the record's first byte).
func (e *encoder) add(kind byte, stream string, seq, version uint64, data []byte) int {
	e.buf = append(e.buf, kind)
	e.buf = binary.AppendUvarint(e.buf, uint64(len(stream)))
	e.buf = append(e.buf, stream...)
	e.buf = binary.AppendUvarint(e.buf, seq)
	if kind == itemCopy {
		e.buf = binary.AppendUvarint(e.buf, version)
	} else {
		e.buf = binary.AppendUvarint(e.buf, version-e.base)
	}
	e.n++
	if kind == itemDrop {
		return 0
	}
	e.buf = binary.AppendUvarint(e.buf, uint64(len(data)))
	off := len(e.buf)
	e.buf = append(e.buf, data...)
	return off
}

// finish completes the record for segment seg and returns its bytes and
// how far the payload had to move: the count is a uvarint in a slot sized
// for the largest, and the header and base are moved up to meet it, so the
// items' offsets returned by add shift by that much.
func (e *encoder) finish(seg uint64) (rec []byte, shift int) {
	var cnt [binary.MaxVarintLen64]byte
	k := binary.PutUvarint(cnt[:], uint64(e.n))
	shift = binary.MaxVarintLen64 - k
	rec = e.buf[shift:]
	binary.LittleEndian.PutUint64(rec[recordHeader:], e.base)
	copy(rec[recordHeader+8:], cnt[:k])
	payload := rec[recordHeader:]
	binary.LittleEndian.PutUint32(rec[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(rec[4:8], recordsum.Of(seg, payload))
	return rec, shift
}

// parse calls fn with every item of a record's payload, in order, and
// returns the record's base version.
func parse(p []byte, fn func(it *item)) (uint64, error) {
	if len(p) < 9 {
		return 0, errMalformed
	}
	base := binary.LittleEndian.Uint64(p)
	pos := 8
	n, k := binary.Uvarint(p[pos:])
	if k <= 0 || n > uint64(len(p)) {
		return 0, errMalformed
	}
	pos += k
	uv := func() (uint64, bool) {
		v, k := binary.Uvarint(p[pos:])
		if k <= 0 {
			return 0, false
		}
		pos += k
		return v, true
	}
	var it item
	for range n {
		if pos >= len(p) {
			return 0, errMalformed
		}
		it = item{kind: p[pos]}
		pos++
		if it.kind < itemAppend || it.kind > itemDrop {
			return 0, errMalformed
		}
		l, ok := uv()
		if !ok || l > uint64(len(p)-pos) {
			return 0, errMalformed
		}
		it.stream = p[pos : pos+int(l)]
		pos += int(l)
		var v uint64
		if it.seq, ok = uv(); !ok {
			return 0, errMalformed
		}
		if v, ok = uv(); !ok {
			return 0, errMalformed
		}
		if it.kind == itemCopy {
			it.version = v
		} else {
			it.version = base + v
		}
		if it.kind != itemDrop {
			if l, ok = uv(); !ok || l > uint64(len(p)-pos) {
				return 0, errMalformed
			}
			it.dataOff = pos
			it.data = p[pos : pos+int(l)]
			pos += int(l)
		}
		fn(&it)
	}
	if pos != len(p) {
		return 0, errMalformed
	}
	return base, nil
}
