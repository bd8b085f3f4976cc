package memory

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/gatehouse-dev/gatehouse/store"
)

// BM25's parameters, the usual ones.
const (
	bm25K1 = 1.2
	bm25B  = 0.75
	// pathWeight counts each term of a note's path this many times: a
	// note named for what is searched is the better hit.
	pathWeight = 3
)

// Bounds of a search, on every path a search comes by.
const (
	// MaxQuery bounds a query, in characters.
	MaxQuery = 1024
	// MaxQueryTerms bounds the distinct words of a query: each costs a
	// look into every posting record of its shard.
	MaxQueryTerms = 64
	// MaxLimit bounds the hits of a search.
	MaxLimit = 100
	// maxPrefix bounds a search's or a listing's path prefix, in bytes.
	maxPrefix = maxPathLen
)

// maxTermLen drops tokens longer than this (hashes, base64): nobody
// searches for them, and they would bloat the index.
const maxTermLen = 48

// tokens calls fn with each lower-cased word of s (letters and digits) and
// the byte offset where it starts.
func tokens(s string, fn func(term string, at int)) {
	start := -1
	emit := func(end int) {
		if end-start <= maxTermLen {
			fn(strings.ToLower(s[start:end]), start)
		}
		start = -1
	}
	for i, r := range s {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			if start < 0 {
				start = i
			}
		} else if start >= 0 {
			emit(i)
		}
	}
	if start >= 0 {
		emit(len(s))
	}
}

// termStat is one term of one note: its count, path terms weighted, and
// 1 + the offset of its first occurrence in the content (0: path only).
type termStat struct{ tf, pos uint32 }

// analyze returns the terms of a note and its length in terms.
func analyze(p, content string) (map[string]termStat, int) {
	terms := map[string]termStat{}
	length := 0
	tokens(p, func(t string, _ int) {
		s := terms[t]
		s.tf += pathWeight
		terms[t] = s
		length += pathWeight
	})
	tokens(content, func(t string, at int) {
		s := terms[t]
		s.tf++
		if s.pos == 0 {
			s.pos = uint32(at) + 1
		}
		terms[t] = s
		length++
	})
	return terms, length
}

// norm rounds a note's length down to its four leading bits (an error of
// under 1/8, which BM25's length normalization does not feel), so that
// most appends leave the postings of the shards they do not touch as they
// are.
func norm(length int) uint32 {
	if length < 16 {
		return uint32(length)
	}
	shift := bits.Len(uint(length)) - 4
	return uint32(length >> shift << shift)
}

// checkSearch refuses a search past the bounds: a query of more than
// MaxQuery characters or MaxQueryTerms distinct words, a prefix of more
// than 512 bytes.
func checkSearch(query, prefix string) ([]string, error) {
	if c := utf8.RuneCountInString(query); c > MaxQuery {
		return nil, fmt.Errorf("%w: query of %d characters, more than %d", ErrInvalid, c, MaxQuery)
	}
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	var terms []string
	seen := map[string]bool{}
	tokens(query, func(t string, _ int) {
		if !seen[t] {
			seen[t] = true
			terms = append(terms, t)
		}
	})
	if len(terms) > MaxQueryTerms {
		return nil, fmt.Errorf("%w: query of %d distinct words, more than %d", ErrInvalid, len(terms), MaxQueryTerms)
	}
	return terms, nil
}

func checkPrefix(prefix string) error {
	if len(prefix) > maxPrefix {
		return fmt.Errorf("%w: prefix of %d bytes, more than %d", ErrInvalid, len(prefix), maxPrefix)
	}
	return nil
}

// found is a posting of a searched term.
type found struct {
	path string
	p    posting
}

// candidate is a note holding a searched term.
type candidate struct {
	score float64
	pos   uint32 // the earliest first occurrence of a searched term, as termStat.pos
}

// ctxEvery is how many posting records a search reads between looks at
// its context.
const ctxEvery = 64

// findWords adds to postings[i] the word postings of terms[i]: those of
// the notes with few terms.
func (n *Notes) findWords(ctx context.Context, sid string, terms []string, postings [][]found) error {
	for i, t := range terms {
		pre := wordPrefix(sid, t)
		var stop error
		err := n.o.Store.RecordsWithPrefix(kindPost, pre, func(id string, decode func(any) error) bool {
			if len(postings[i])%ctxEvery == 0 {
				if stop = ctx.Err(); stop != nil {
					return false
				}
			}
			var rec []byte
			if stop = decode(&rec); stop != nil {
				return false
			}
			p, err := decodeWord(rec)
			if stop = err; err != nil {
				return false
			}
			postings[i] = append(postings[i], found{id[len(pre):], p})
			return true
		})
		if err == nil {
			err = stop
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// findInShards adds to postings[i] the postings of terms[i] in the shard
// records of the notes with many terms, reading each shard that holds a
// searched term once.
func (n *Notes) findInShards(ctx context.Context, sid string, terms []string, postings [][]found) error {
	byShard := map[shard][]int{}
	for i, t := range terms {
		byShard[shardOf(t)] = append(byShard[shardOf(t)], i)
	}
	for sh, idx := range byShard {
		pre := shardPrefix(sid, sh)
		want := make([][]byte, len(idx))
		for j, i := range idx {
			want[j] = []byte(terms[i])
		}
		seen := 0
		var stop error
		err := n.o.Store.RecordsWithPrefix(kindPost, pre, func(id string, decode func(any) error) bool {
			if seen%ctxEvery == 0 {
				if stop = ctx.Err(); stop != nil {
					return false
				}
			}
			seen++
			var rec []byte
			if stop = decode(&rec); stop != nil {
				return false
			}
			for j, i := range idx {
				p, ok, err := lookup(rec, want[j])
				if stop = err; err != nil {
					return false
				}
				if ok {
					postings[i] = append(postings[i], found{id[len(pre):], p})
				}
			}
			return true
		})
		if err == nil {
			err = stop
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Search returns the notes best matching query, best first, at most limit
// (10 when zero, at most 100), each with a snippet around the first match.
// The query must hold at most MaxQuery characters and MaxQueryTerms
// distinct words. A search stops, with ctx's error, once ctx is done.
func (n *Notes) Search(ctx context.Context, sp Space, query, prefix string, limit int) ([]Hit, error) {
	terms, err := checkSearch(query, prefix)
	if err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 10
	}
	limit = min(limit, MaxLimit)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sid := sp.id()
	su, err := n.getUsage(kindSpace, sid)
	if err != nil {
		return nil, err
	}
	if su.Notes == 0 || len(terms) == 0 {
		return []Hit{}, nil
	}
	total := float64(su.Notes)
	avg := max(1, float64(su.Length)/total)
	postings := make([][]found, len(terms))
	if err := n.findWords(ctx, sid, terms, postings); err != nil {
		return nil, fmt.Errorf("memory: search: %w", err)
	}
	if err := n.findInShards(ctx, sid, terms, postings); err != nil {
		return nil, fmt.Errorf("memory: search: %w", err)
	}
	cands := map[string]*candidate{}
	for _, ps := range postings {
		df := float64(len(ps))
		idf := math.Log(1 + (total-df+0.5)/(df+0.5))
		for _, f := range ps {
			if !strings.HasPrefix(f.path, prefix) {
				continue
			}
			c := cands[f.path]
			if c == nil {
				c = &candidate{}
				cands[f.path] = c
			}
			tf := float64(f.p.tf)
			c.score += idf * tf * (bm25K1 + 1) / (tf + bm25K1*(1-bm25B+bm25B*float64(f.p.norm)/avg))
			if f.p.pos > 0 && (c.pos == 0 || f.p.pos < c.pos) {
				c.pos = f.p.pos
			}
		}
	}
	hits := make([]Hit, 0, min(limit, len(cands)))
	for _, r := range best(cands, limit) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var m meta
		if err := n.o.Store.Get(kindMeta, sid+r.path, &m); errors.Is(err, store.ErrNotFound) {
			continue // gone meanwhile
		} else if err != nil {
			return nil, fmt.Errorf("memory: search: %w", err)
		}
		s, err := n.snippet(sid, r.path, cands[r.path].pos, m.Size)
		if err != nil {
			return nil, err
		}
		hits = append(hits, Hit{Path: r.path, Score: round(r.score), Snippet: s})
	}
	return hits, nil
}

func round(f float64) float64 { return float64(int64(f*1e4+0.5)) / 1e4 }

// About how much of a note a snippet shows, in characters, and how much of
// it comes before the match.
const (
	snippetRunes  = 160
	snippetBefore = snippetRunes / 4
)

// snippet is the part of note p, of size bytes, around pos (as
// termStat.pos): it reads only the one or two chunks that hold it.
func (n *Notes) snippet(sid, p string, pos uint32, size int) (string, error) {
	if size == 0 {
		return "", nil
	}
	at := 0
	if pos > 0 {
		at = min(int(pos-1), size-1)
	}
	// Four bytes at most a character, and four more so that the walk back
	// never starts inside one.
	lo := max(0, at-utf8.UTFMax*(snippetBefore+1))
	hi := min(size, at+utf8.UTFMax*(snippetRunes+1))
	first, last := lo/chunkSize, (hi-1)/chunkSize
	var w []byte
	for i := first; i <= last; i++ {
		var c chunk
		if err := n.o.Store.Get(kindBody, bodyID(sid, p, i), &c); errors.Is(err, store.ErrNotFound) {
			break // shortened meanwhile
		} else if err != nil {
			return "", fmt.Errorf("memory: snippet of %s: %w", p, err)
		}
		w = append(w, c.Data...)
	}
	base := first * chunkSize
	start := min(len(w), at-base)
	for range snippetBefore {
		if start <= 0 {
			break
		}
		_, width := utf8.DecodeLastRune(w[:start])
		start -= width
	}
	end := start
	for range snippetRunes {
		if end >= len(w) {
			break
		}
		_, width := utf8.DecodeRune(w[end:])
		end += width
	}
	s := strings.Join(strings.Fields(string(w[start:end])), " ")
	if base+start > 0 {
		s = "…" + s
	}
	if base+end < size {
		s += "…"
	}
	return s, nil
}

// ranked is a scored note.
type ranked struct {
	path  string
	score float64
}

// best returns the limit best candidates, best first, then by path.
func best(cands map[string]*candidate, limit int) []ranked {
	h := &topK{}
	for p, c := range cands {
		r := ranked{path: p, score: c.score}
		if h.Len() < limit {
			heap.Push(h, r)
		} else if worse(h.s[0], r) {
			h.s[0] = r
			heap.Fix(h, 0)
		}
	}
	out := h.s
	sort.Slice(out, func(i, j int) bool { return worse(out[j], out[i]) })
	return out
}

// worse reports whether a ranks below b.
func worse(a, b ranked) bool {
	if a.score != b.score {
		return a.score < b.score
	}
	return a.path > b.path
}

// topK is a min-heap of the best hits so far.
type topK struct{ s []ranked }

func (h *topK) Len() int           { return len(h.s) }
func (h *topK) Less(i, j int) bool { return worse(h.s[i], h.s[j]) }
func (h *topK) Swap(i, j int)      { h.s[i], h.s[j] = h.s[j], h.s[i] }
func (h *topK) Push(v any)         { h.s = append(h.s, v.(ranked)) }
func (h *topK) Pop() any {
	v := h.s[len(h.s)-1]
	h.s = h.s[:len(h.s)-1]
	return v
}
