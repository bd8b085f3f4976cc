package memory

import (
	"container/heap"
	"math"
	"sort"
	"strings"
	"time"
	"unicode"
)

// BM25's parameters, the usual ones.
const (
	bm25K1 = 1.2
	bm25B  = 0.75
	// pathWeight counts each term of a note's path this many times: a
	// note named for what is searched is the better hit.
	pathWeight = 3
)

// doc is one note as the index knows it: no content, which stays in the
// store (a snippet reads it for the few hits shown).
type doc struct {
	id      uint32
	path    string
	size    int
	version uint64
	updated time.Time
	length  int // terms, path terms weighted
}

// posting is one note's count of one term.
type posting struct {
	doc uint32
	tf  uint32
}

// index is one tenant's inverted index.
type index struct {
	docs     map[uint32]*doc
	byPath   map[string]uint32
	postings map[string][]posting
	nextID   uint32
	total    int // sum of lengths
}

func newIndex() index {
	return index{docs: map[uint32]*doc{}, byPath: map[string]uint32{}, postings: map[string][]posting{}}
}

func (x *index) len() int { return len(x.docs) }

// counts returns a note's term counts, path terms weighted.
func counts(n *Note) (map[string]uint32, int) {
	c := map[string]uint32{}
	total := 0
	for _, t := range tokens(n.Path, nil) {
		c[t] += pathWeight
		total += pathWeight
	}
	for _, t := range tokens(n.Content, nil) {
		c[t]++
		total++
	}
	return c, total
}

// put indexes n, which must not be indexed already.
func (x *index) put(n *Note) {
	x.nextID++
	d := &doc{id: x.nextID, path: n.Path, size: len(n.Content), version: n.Version, updated: n.UpdatedAt}
	c, total := counts(n)
	d.length = total
	for t, tf := range c {
		x.postings[t] = append(x.postings[t], posting{doc: d.id, tf: tf})
	}
	x.docs[d.id] = d
	x.byPath[n.Path] = d.id
	x.total += total
}

// remove unindexes n, the note as it was indexed.
func (x *index) remove(n *Note) {
	id, ok := x.byPath[n.Path]
	if !ok {
		return
	}
	c, _ := counts(n)
	for t := range c {
		ps := x.postings[t]
		for i := range ps {
			if ps[i].doc == id {
				ps[i] = ps[len(ps)-1]
				ps = ps[:len(ps)-1]
				break
			}
		}
		if len(ps) == 0 {
			delete(x.postings, t)
		} else {
			x.postings[t] = ps
		}
	}
	x.total -= x.docs[id].length
	delete(x.docs, id)
	delete(x.byPath, n.Path)
}

// sorted returns the notes in path order.
func (x *index) sorted() []*doc {
	order := make([]*doc, 0, len(x.docs))
	for _, d := range x.docs {
		order = append(order, d)
	}
	sort.Slice(order, func(i, j int) bool { return order[i].path < order[j].path })
	return order
}

// ranked is a scored note.
type ranked struct {
	path  string
	score float64
}

// search scores the notes holding any of terms with BM25 and returns the
// best limit, best first.
func (x *index) search(terms []string, prefix string, limit int) []ranked {
	n := float64(len(x.docs))
	if n == 0 {
		return nil
	}
	avg := float64(x.total) / n
	scores := map[uint32]float64{}
	seen := map[string]bool{}
	for _, t := range terms {
		if seen[t] {
			continue
		}
		seen[t] = true
		ps := x.postings[t]
		if len(ps) == 0 {
			continue
		}
		idf := math.Log(1 + (n-float64(len(ps))+0.5)/(float64(len(ps))+0.5))
		for _, p := range ps {
			d := x.docs[p.doc]
			tf := float64(p.tf)
			scores[p.doc] += idf * tf * (bm25K1 + 1) / (tf + bm25K1*(1-bm25B+bm25B*float64(d.length)/avg))
		}
	}
	h := &topK{}
	for id, sc := range scores {
		d := x.docs[id]
		if !strings.HasPrefix(d.path, prefix) {
			continue
		}
		r := ranked{path: d.path, score: sc}
		if h.Len() < limit {
			heap.Push(h, r)
		} else if worse(h.s[0], r) {
			h.s[0] = r
			heap.Fix(h, 0)
		}
	}
	out := h.s
	sortHits(out)
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

// maxTermLen drops tokens longer than this (hashes, base64): nobody
// searches for them, and they would bloat the index.
const maxTermLen = 48

// tokens appends the lower-cased words of s (letters and digits) to into.
func tokens(s string, into []string) []string {
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
		if len(f) <= maxTermLen {
			into = append(into, strings.ToLower(f))
		}
	}
	return into
}
