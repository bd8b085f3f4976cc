package seglog

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"slices"
	"sort"
)

// A sidecar indexes one sealed segment, in a file beside it named for it
// with the extension .idx. It is written once, synced, and renamed into
// place, so it is whole or absent: a start rebuilds a missing one from the
// segment. Layout, integers little-endian:
//
//	header   64 bytes: magic, segment number, end of the segment's
//	         records, newest version, counts of streams, entries and
//	         drops, Bloom filter words and hashes, bytes of the drops and
//	         of the names, and the CRC-32C of the header (with the CRC as
//	         zero), the filter, the fences and the drops
//	bloom    the Bloom filter of the streams' names, in uint64 words
//	fences   the hash of the first row of each block of rowsPerBlock rows
//	drops    per drop: uvarint name length, name, uvarint sequence,
//	         uvarint version
//	rows     per stream, sorted by (hash, name), rowSize bytes: hash,
//	         lowest and highest sequence, first entry, entry count, and the
//	         name's offset and length in names
//	names    the streams' names
//	entries  per entry, entrySize bytes: sequence, version, offset and
//	         length of its data in the segment; a stream's are contiguous,
//	         in sequence order
//
// What start-up reads, the first four parts, the checksum covers; rows and
// entries are read on demand, a block at a time.
const (
	sidecarMagic  = "GHSLIX01"
	sidecarHeader = 64
	rowSize       = 40
	entrySize     = 24
	rowsPerBlock  = 64
	bloomBits     = 10 // per stream: about 1% false positives
	bloomHashes   = 7
)

// errSidecar says a sidecar cannot be used; the segment is read instead.
var errSidecar = errors.New("seglog: sidecar unusable")

// sidecar is a sealed segment's index: its file, and what lookups need in
// memory.
type sidecar struct {
	f                    *os.File
	nStreams, nEntries   int
	bloom                []uint64
	k                    int
	fences               []uint64
	rowsOff, namesOff    int64
	entriesOff           int64
	end, maxVersion, num uint64
	drops                []namedDrop
}

// row is one stream's line in a sidecar.
type row struct {
	hash, minSeq, maxSeq uint64
	first, count         uint32
	nameOff, nameLen     uint32
}

// hashName is FNV-1a, 64 bits: stable across processes, which the
// sidecars need.
func hashName(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

func bloomAdd(bits []uint64, k int, h uint64) {
	m := uint64(len(bits) * 64)
	h2 := h>>33 | 1
	for i := range uint64(k) {
		b := (h + i*h2) % m
		bits[b/64] |= 1 << (b % 64)
	}
}

func bloomHas(bits []uint64, k int, h uint64) bool {
	m := uint64(len(bits) * 64)
	h2 := h>>33 | 1
	for i := range uint64(k) {
		b := (h + i*h2) % m
		if bits[b/64]&(1<<(b%64)) == 0 {
			return false
		}
	}
	return true
}

// writeSidecar writes the sidecar of segment num, whose records end at end
// and hold versions up to maxVersion, from its index in memory, at path:
// through a temporary file, synced, renamed. The caller syncs the folder.
//
// The rows, names and entries are written as they are encoded, through a
// small buffer: a sidecar is as large as the index it is written from, and
// building it whole in memory first allocated six times its size at each
// segment's seal (BenchmarkWriteSidecar), a transient on the memory peak of
// a box under --memory-limit.
func writeSidecar(path string, num, end, maxVersion uint64, m *memIndex) error {
	type stream struct {
		name string
		hash uint64
		locs []loc
	}
	streams := make([]stream, 0, len(m.streams))
	for name, ls := range m.streams {
		if len(ls) > 0 {
			streams = append(streams, stream{name, hashName(name), ls})
		}
	}
	slices.SortFunc(streams, func(a, b stream) int {
		return cmp.Or(cmp.Compare(a.hash, b.hash), cmp.Compare(a.name, b.name))
	})
	words := max(1, (len(streams)*bloomBits+63)/64)
	bloom := make([]uint64, words)
	fences := make([]uint64, 0, (len(streams)+rowsPerBlock-1)/rowsPerBlock)
	var drops []byte
	for _, d := range m.drops {
		drops = binary.AppendUvarint(drops, uint64(len(d.stream)))
		drops = append(drops, d.stream...)
		drops = binary.AppendUvarint(drops, d.before)
		drops = binary.AppendUvarint(drops, d.version)
	}
	entries, names := 0, 0
	for i, s := range streams {
		bloomAdd(bloom, bloomHashes, s.hash)
		if i%rowsPerBlock == 0 {
			fences = append(fences, s.hash)
		}
		entries += len(s.locs)
		names += len(s.name)
	}
	head := make([]byte, sidecarHeader, sidecarHeader+words*8+len(fences)*8+len(drops))
	copy(head, sidecarMagic)
	binary.LittleEndian.PutUint64(head[8:], num)
	binary.LittleEndian.PutUint64(head[16:], end)
	binary.LittleEndian.PutUint64(head[24:], maxVersion)
	binary.LittleEndian.PutUint32(head[32:], uint32(len(streams)))
	binary.LittleEndian.PutUint32(head[36:], uint32(entries))
	binary.LittleEndian.PutUint32(head[40:], uint32(len(m.drops)))
	binary.LittleEndian.PutUint32(head[44:], uint32(words))
	binary.LittleEndian.PutUint32(head[48:], bloomHashes)
	binary.LittleEndian.PutUint32(head[52:], uint32(len(drops)))
	binary.LittleEndian.PutUint32(head[56:], uint32(names))
	for _, w := range bloom {
		head = binary.LittleEndian.AppendUint64(head, w)
	}
	for _, f := range fences {
		head = binary.LittleEndian.AppendUint64(head, f)
	}
	head = append(head, drops...)
	binary.LittleEndian.PutUint32(head[60:], crc32.Checksum(head, castagnoli))

	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("seglog: sidecar: %w", err)
	}
	w := bufio.NewWriterSize(f, 64<<10)
	_, _ = w.Write(head) // a bufio.Writer keeps its first error for Flush
	var r [rowSize]byte
	first, nameOff := 0, 0
	for _, s := range streams {
		binary.LittleEndian.PutUint64(r[0:], s.hash)
		binary.LittleEndian.PutUint64(r[8:], s.locs[0].seq)
		binary.LittleEndian.PutUint64(r[16:], s.locs[len(s.locs)-1].seq)
		binary.LittleEndian.PutUint32(r[24:], uint32(first))
		binary.LittleEndian.PutUint32(r[28:], uint32(len(s.locs)))
		binary.LittleEndian.PutUint32(r[32:], uint32(nameOff))
		binary.LittleEndian.PutUint32(r[36:], uint32(len(s.name)))
		_, _ = w.Write(r[:])
		first += len(s.locs)
		nameOff += len(s.name)
	}
	for _, s := range streams {
		_, _ = w.WriteString(s.name)
	}
	var e [entrySize]byte
	for _, s := range streams {
		for _, l := range s.locs {
			binary.LittleEndian.PutUint64(e[0:], l.seq)
			binary.LittleEndian.PutUint64(e[8:], l.version)
			binary.LittleEndian.PutUint32(e[16:], l.off)
			binary.LittleEndian.PutUint32(e[20:], l.len)
			_, _ = w.Write(e[:])
		}
	}
	err = w.Flush()
	if err == nil {
		err = fdatasync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("seglog: sidecar %s: %w", path, err)
	}
	return nil
}

// openSidecar opens the sidecar at path of segment num and reads what
// lookups need in memory. It fails with errSidecar when the file is not
// a whole sidecar of that segment.
func openSidecar(path string, num uint64) (*sidecar, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	sc, err := readSidecar(f, num)
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return sc, nil
}

func readSidecar(f *os.File, num uint64) (*sidecar, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	head := make([]byte, sidecarHeader)
	if _, err := f.ReadAt(head, 0); err != nil || string(head[:8]) != sidecarMagic {
		return nil, fmt.Errorf("%w: %s: no header", errSidecar, f.Name())
	}
	le := binary.LittleEndian
	sc := &sidecar{f: f, num: le.Uint64(head[8:]), end: le.Uint64(head[16:]), maxVersion: le.Uint64(head[24:]),
		nStreams: int(le.Uint32(head[32:])), nEntries: int(le.Uint32(head[36:])), k: int(le.Uint32(head[48:]))}
	nDrops, words := int(le.Uint32(head[40:])), int64(le.Uint32(head[44:]))
	dropsLen, namesLen := int64(le.Uint32(head[52:])), int64(le.Uint32(head[56:]))
	nFences := int64((sc.nStreams + rowsPerBlock - 1) / rowsPerBlock)
	metaLen := words*8 + nFences*8 + dropsLen
	sc.rowsOff = sidecarHeader + metaLen
	sc.namesOff = sc.rowsOff + int64(sc.nStreams)*rowSize
	sc.entriesOff = sc.namesOff + namesLen
	if sc.num != num || sc.k < 1 || sc.k > 16 || words < 1 || sc.entriesOff+int64(sc.nEntries)*entrySize != size {
		return nil, fmt.Errorf("%w: %s: sizes do not add up", errSidecar, f.Name())
	}
	meta := make([]byte, metaLen)
	if _, err := f.ReadAt(meta, sidecarHeader); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", errSidecar, f.Name(), err)
	}
	want := le.Uint32(head[60:])
	clear(head[60:])
	if crc32.Update(crc32.Checksum(head, castagnoli), castagnoli, meta) != want {
		return nil, fmt.Errorf("%w: %s: checksum", errSidecar, f.Name())
	}
	sc.bloom = make([]uint64, words)
	for i := range sc.bloom {
		sc.bloom[i] = le.Uint64(meta[i*8:])
	}
	meta = meta[words*8:]
	sc.fences = make([]uint64, nFences)
	for i := range sc.fences {
		sc.fences[i] = le.Uint64(meta[i*8:])
	}
	p := meta[nFences*8:]
	uv := func() (uint64, bool) {
		v, k := binary.Uvarint(p)
		if k <= 0 {
			return 0, false
		}
		p = p[k:]
		return v, true
	}
	for range nDrops {
		l, ok := uv()
		if !ok || l > uint64(len(p)) {
			return nil, fmt.Errorf("%w: %s: drops", errSidecar, f.Name())
		}
		d := namedDrop{stream: string(p[:l]), drop: drop{seg: num}}
		p = p[l:]
		var ok1, ok2 bool
		d.before, ok1 = uv()
		d.version, ok2 = uv()
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%w: %s: drops", errSidecar, f.Name())
		}
		sc.drops = append(sc.drops, d)
	}
	return sc, nil
}

func (s *sidecar) close() error { return s.f.Close() }

func (s *sidecar) has(stream string) bool {
	return s.nStreams > 0 && bloomHas(s.bloom, s.k, hashName(stream))
}

// findRow returns the stream's row, or ok false.
func (s *sidecar) findRow(sc *scratch, stream string) (row, bool, error) {
	h := hashName(stream)
	if s.nStreams == 0 || !bloomHas(s.bloom, s.k, h) {
		return row{}, false, nil
	}
	// The first block that may hold h: rows of one hash may straddle a
	// fence, so start in the block before the first fence at or past h.
	b := max(0, sort.Search(len(s.fences), func(i int) bool { return s.fences[i] >= h })-1)
	buf := sc.blockOf(rowsPerBlock * rowSize)
	for ; b < len(s.fences); b++ {
		n := min(rowsPerBlock, s.nStreams-b*rowsPerBlock)
		blk := buf[:n*rowSize]
		if _, err := s.f.ReadAt(blk, s.rowsOff+int64(b*rowsPerBlock*rowSize)); err != nil {
			return row{}, false, fmt.Errorf("seglog: sidecar %s: %w", s.f.Name(), err)
		}
		for i := range n {
			r := decodeRow(blk[i*rowSize:])
			if r.hash < h {
				continue
			}
			if r.hash > h {
				return row{}, false, nil
			}
			sc.name = slices.Grow(sc.name[:0], int(r.nameLen))[:r.nameLen]
			name := sc.name
			if _, err := s.f.ReadAt(name, s.namesOff+int64(r.nameOff)); err != nil {
				return row{}, false, fmt.Errorf("seglog: sidecar %s: %w", s.f.Name(), err)
			}
			if string(name) == stream {
				return r, true, nil
			}
		}
	}
	return row{}, false, nil
}

func decodeRow(b []byte) row {
	le := binary.LittleEndian
	return row{hash: le.Uint64(b), minSeq: le.Uint64(b[8:]), maxSeq: le.Uint64(b[16:]),
		first: le.Uint32(b[24:]), count: le.Uint32(b[28:]), nameOff: le.Uint32(b[32:]), nameLen: le.Uint32(b[36:])}
}

func decodeLoc(b []byte) loc {
	le := binary.LittleEndian
	return loc{seq: le.Uint64(b), version: le.Uint64(b[8:]), off: le.Uint32(b[16:]), len: le.Uint32(b[20:])}
}

// entryAt reads entry i of the sidecar.
func (s *sidecar) entryAt(sc *scratch, i uint32) (loc, error) {
	b := sc.entryBytes[:]
	if _, err := s.f.ReadAt(b, s.entriesOff+int64(i)*entrySize); err != nil {
		return loc{}, fmt.Errorf("seglog: sidecar %s: %w", s.f.Name(), err)
	}
	return decodeLoc(b), nil
}

// entries returns n entries of the sidecar from i, in sc.locs, read a
// block at a time.
func (s *sidecar) entries(sc *scratch, i uint32, n int) ([]loc, error) {
	b := sc.blockOf(min(n, entriesPerRead) * entrySize)
	sc.locs = sc.locs[:0]
	for n > 0 {
		k := min(n, entriesPerRead)
		if _, err := s.f.ReadAt(b[:k*entrySize], s.entriesOff+int64(i)*entrySize); err != nil {
			return nil, fmt.Errorf("seglog: sidecar %s: %w", s.f.Name(), err)
		}
		for j := range k {
			sc.locs = append(sc.locs, decodeLoc(b[j*entrySize:]))
		}
		i += uint32(k)
		n -= k
	}
	return sc.locs, nil
}

// entriesPerRead bounds the entries one read of a sidecar takes: a
// replay's page of 256 in one system call.
const entriesPerRead = 256

// search returns the index, within r's entries, of the first whose
// sequence is at least from. A stream whose sequences have no gap finds
// it at once; otherwise a binary search reads log2(count) entries.
func (s *sidecar) search(sc *scratch, r row, from uint64) (uint32, error) {
	switch {
	case from <= r.minSeq:
		return 0, nil
	case from > r.maxSeq:
		return r.count, nil
	}
	if r.maxSeq-r.minSeq+1 == uint64(r.count) {
		i := uint32(from - r.minSeq)
		l, err := s.entryAt(sc, r.first+i)
		if err != nil {
			return 0, err
		}
		if l.seq == from {
			if i == 0 {
				return 0, nil
			}
			p, err := s.entryAt(sc, r.first+i-1)
			if err != nil {
				return 0, err
			}
			if p.seq < from {
				return i, nil
			}
		}
	}
	lo, hi := uint32(0), r.count
	for lo < hi {
		mid := lo + (hi-lo)/2
		l, err := s.entryAt(sc, r.first+mid)
		if err != nil {
			return 0, err
		}
		if l.seq < from {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo, nil
}

func (s *sidecar) lookup(sc *scratch, stream string, from loc, n int, back bool) ([]loc, error) {
	r, ok, err := s.findRow(sc, stream)
	if err != nil || !ok {
		return nil, err
	}
	i, err := s.search(sc, r, from.seq)
	if err != nil {
		return nil, err
	}
	// Past the versions of from's sequence below from's: a sequence has
	// more than one only when a copy brought forward met its original.
	for ; from.version > 0 && i < r.count; i++ {
		l, err := s.entryAt(sc, r.first+i)
		if err != nil {
			return nil, err
		}
		if compareLoc(l, from) >= 0 {
			break
		}
	}
	if back {
		lo := uint32(max(0, int(i)-n))
		return s.entries(sc, r.first+lo, int(i-lo))
	}
	if i >= r.count {
		return nil, nil
	}
	return s.entries(sc, r.first+i, min(n, int(r.count-i)))
}

// each calls fn with every stream of the sidecar and its entries, for a
// compaction: it reads the rows, names and entries whole.
func (s *sidecar) each(fn func(stream string, ls []loc) error) error {
	fi, err := s.f.Stat()
	if err != nil {
		return err
	}
	body := make([]byte, fi.Size()-s.rowsOff)
	if _, err := s.f.ReadAt(body, s.rowsOff); err != nil {
		return fmt.Errorf("seglog: sidecar %s: %w", s.f.Name(), err)
	}
	names := body[s.namesOff-s.rowsOff:]
	ents := body[s.entriesOff-s.rowsOff:]
	for i := range s.nStreams {
		r := decodeRow(body[i*rowSize:])
		if int(r.first)+int(r.count) > s.nEntries || int64(r.nameOff)+int64(r.nameLen) > s.entriesOff-s.namesOff {
			return fmt.Errorf("%w: %s: row %d out of range", errSidecar, s.f.Name(), i)
		}
		ls := make([]loc, r.count)
		for j := range ls {
			ls[j] = decodeLoc(ents[(int(r.first)+j)*entrySize:])
		}
		if err := fn(string(names[r.nameOff:r.nameOff+r.nameLen]), ls); err != nil {
			return err
		}
	}
	return nil
}
