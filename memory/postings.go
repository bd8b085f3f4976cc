package memory

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
)

// The inverted index: the posting records of kind kindPost, written with
// the note they index. A note with at most wordTerms distinct terms has a
// record per term, id sid + 'w' + term + NUL + path, so that a search for
// a term reads exactly the notes that hold it. A note with more (a note of
// 256 KiB holds some 20,000, and as many records cost the store's tree
// many times what a thousand do) has a record per shard of its terms, id
// sid + 's' + shard (2 bytes, big endian) + path, and a search for a term
// reads, of each such note, the record of the term's shard. Either way a
// note has at most about a thousand records, and a search reads one record
// per note holding the term, plus one per note with many terms.

// wordTerms is the most distinct terms a note may have to be indexed by
// word; it is also the number of shards, so that a note's records are
// bounded alike whichever way it is indexed.
const wordTerms = shardCount

// shardCount is how many shards terms are spread over. The shard of a term
// is in the store: changing the count or the hash needs a rebuild.
const shardCount = 1024

// shard is a shard's number.
type shard uint16

// shardOf is the shard of term: FNV-1a, 32 bits, modulo shardCount.
func shardOf(term string) shard {
	h := uint32(2166136261)
	for i := 0; i < len(term); i++ {
		h ^= uint32(term[i])
		h *= 16777619
	}
	return shard(h % shardCount)
}

func wordPrefix(sid, term string) string { return sid + "w" + term + "\x00" }

func shardPrefix(sid string, sh shard) string {
	return string(binary.BigEndian.AppendUint16([]byte(sid+"s"), uint16(sh)))
}

// postingRecords returns the posting records of note p, with its terms
// and length, by id: by word or by shard (see above). The values are
// uvarints: a word record holds the term's count, the note's rounded
// length (see norm) and the term's first position (termStat.pos); a shard
// record the note's rounded length, then each term of the shard in order
// with its length, its bytes, its count and its first position.
func postingRecords(sid, p string, terms map[string]termStat, length int) map[string][]byte {
	nm := uint64(norm(length))
	out := make(map[string][]byte, min(len(terms), shardCount))
	if len(terms) <= wordTerms {
		for t, s := range terms {
			rec := binary.AppendUvarint(nil, uint64(s.tf))
			rec = binary.AppendUvarint(rec, nm)
			out[wordPrefix(sid, t)+p] = binary.AppendUvarint(rec, uint64(s.pos))
		}
		return out
	}
	by := map[shard][]string{}
	for t := range terms {
		sh := shardOf(t)
		by[sh] = append(by[sh], t)
	}
	for sh, ts := range by {
		slices.Sort(ts)
		rec := binary.AppendUvarint(nil, nm)
		for _, t := range ts {
			rec = binary.AppendUvarint(rec, uint64(len(t)))
			rec = append(rec, t...)
			rec = binary.AppendUvarint(rec, uint64(terms[t].tf))
			rec = binary.AppendUvarint(rec, uint64(terms[t].pos))
		}
		out[shardPrefix(sid, sh)+p] = rec
	}
	return out
}

// posting is one term of one note, as a search reads it.
type posting struct {
	tf, norm, pos uint32
}

// errCorrupt reports a posting record that does not decode.
var errCorrupt = errors.New("corrupt posting record")

// uvarints reads uvarints off the front of a record.
type uvarints []byte

func (u *uvarints) next() (uint64, error) {
	v, n := binary.Uvarint(*u)
	if n <= 0 {
		return 0, errCorrupt
	}
	*u = (*u)[n:]
	return v, nil
}

// decodeWord decodes a word record.
func decodeWord(rec []byte) (posting, error) {
	u := uvarints(rec)
	var v [3]uint64
	for i := range v {
		var err error
		if v[i], err = u.next(); err != nil {
			return posting{}, err
		}
	}
	return posting{tf: uint32(v[0]), norm: uint32(v[1]), pos: uint32(v[2])}, nil
}

// lookup finds term in shard record rec.
func lookup(rec, term []byte) (posting, bool, error) {
	u := uvarints(rec)
	nm, err := u.next()
	if err != nil {
		return posting{}, false, err
	}
	for len(u) > 0 {
		l, err := u.next()
		if err != nil || l > uint64(len(u)) {
			return posting{}, false, errCorrupt
		}
		t := u[:l]
		u = u[l:]
		tf, err1 := u.next()
		pos, err2 := u.next()
		if err := errors.Join(err1, err2); err != nil {
			return posting{}, false, errCorrupt
		}
		switch c := bytes.Compare(t, term); {
		case c == 0:
			return posting{tf: uint32(tf), norm: uint32(nm), pos: uint32(pos)}, true, nil
		case c > 0:
			return posting{}, false, nil // terms are in order
		}
	}
	return posting{}, false, nil
}
