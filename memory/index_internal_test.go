package memory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/store/storetest"
)

// TestIndexIsTheNotes: after writes, rewrites and appends that grow notes
// past several rounded lengths, from word records to shard records and
// back, and drop terms, in two spaces, the stored index is exactly what
// indexing every note afresh gives, no record more or less; and each
// space's usage is the sum over its notes. The writes rewrite only the
// records that change, so this is what proves them.
func TestIndexIsTheNotes(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.Options{Dir: t.TempDir()})
	defer st.Close()
	n, err := Open(ctx, Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	spaces := []Space{{Tenant: "t", Principal: "a"}, {Tenant: "t", Shared: true}}
	r := rand.New(rand.NewPCG(1, 2))
	vocab := strings.Fields("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau upsilon phi chi psi omega Ünïcode ÉCOLE 42 7")
	// Most texts are a few words of a small vocabulary; some are hundreds
	// of a wide one, so that appends take notes past wordTerms distinct
	// terms (from word records to shard records) and rewrites bring them
	// back.
	text := func(words int, wide bool) string {
		var b strings.Builder
		for range words {
			if wide {
				fmt.Fprintf(&b, "v%d", r.IntN(4000))
			} else {
				b.WriteString(vocab[r.IntN(len(vocab))])
			}
			b.WriteString([]string{" ", ", ", "\n", ". "}[r.IntN(4)])
		}
		return b.String()
	}
	crossed := 0
	for i := range 200 {
		sp := spaces[r.IntN(len(spaces))]
		p := fmt.Sprintf("/n/%s-%d.md", vocab[r.IntN(3)], r.IntN(3))
		wide := r.IntN(5) == 0
		words := 1 + r.IntN(12)
		if wide {
			words = 300 + r.IntN(400)
		}
		before, _ := n.Read(ctx, sp, p)
		var note Note
		var err error
		switch r.IntN(4) {
		case 0:
			note, err = n.Write(ctx, sp, p, text(r.IntN(40), false), 0)
		default:
			note, err = n.Append(ctx, sp, p, text(words, wide))
		}
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		was, _ := analyze(p, before.Content)
		now, _ := analyze(p, note.Content)
		if (len(was) <= wordTerms) != (len(now) <= wordTerms) {
			crossed++
		}
	}
	if crossed < 4 {
		t.Fatalf("notes crossed between word and shard records %d times: the test needs more", crossed)
	}
	for _, sp := range spaces {
		sid := sp.id()
		want := map[string][]byte{}
		var use usage
		entries, err := n.List(ctx, sp, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			note, err := n.Read(ctx, sp, e.Path)
			if err != nil {
				t.Fatal(err)
			}
			terms, length := analyze(note.Path, note.Content)
			for id, rec := range postingRecords(sid, note.Path, terms, length) {
				want[id] = rec
			}
			use.Notes++
			use.Bytes += int64(len(note.Content))
			use.Length += int64(length)
			if e.Size != len(note.Content) || e.Version != note.Version {
				t.Fatalf("%s: listed %+v, read %d bytes at version %d", e.Path, e, len(note.Content), note.Version)
			}
		}
		got := map[string][]byte{}
		err = store.EachRecord(ctx, st, kindPost, sid, func(id string, rec *[]byte) bool {
			got[id] = *rec
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Errorf("space %q: %d postings stored, %d expected", sid, len(got), len(want))
		}
		for id, w := range want {
			if g, ok := got[id]; !ok || !bytes.Equal(g, w) {
				t.Errorf("posting record %q: stored %x (%v), expected %x", id, g, ok, w)
			}
		}
		stored, err := n.getUsage(kindSpace, sid)
		if err != nil || stored != use {
			t.Errorf("space %q: usage %+v, the notes hold %+v (%v)", sid, stored, use, err)
		}
	}
}

// TestNormRoundsToFourBits: the rounded length keeps four leading bits,
// never more than 1/8 below the length.
// TestPostingsFindEveryTerm: each term of a note, indexed by word or, for
// a note with many terms, by shard, is found with its count, first
// position and the note's rounded length; a term not there is not; a
// record cut short is an error, not a panic.
func TestPostingsFindEveryTerm(t *testing.T) {
	var many strings.Builder
	for i := range wordTerms + 10 {
		fmt.Fprintf(&many, "t%d ", i)
	}
	for _, content := range []string{
		"apple banana apple cherry élan 42 " + strings.Repeat("x", 48) + " " + strings.Repeat("y", 49),
		"apple banana apple cherry " + many.String(),
	} {
		terms, length := analyze("/notes/zebra.md", content)
		recs := postingRecords("sid", "/notes/zebra.md", terms, length)
		byWord := len(terms) <= wordTerms
		find := func(term string) (posting, bool, error) {
			if byWord {
				rec, ok := recs[wordPrefix("sid", term)+"/notes/zebra.md"]
				if !ok {
					return posting{}, false, nil
				}
				p, err := decodeWord(rec)
				return p, err == nil, err
			}
			rec, ok := recs[shardPrefix("sid", shardOf(term))+"/notes/zebra.md"]
			if !ok {
				return posting{}, false, nil
			}
			return lookup(rec, []byte(term))
		}
		for term, s := range terms {
			p, ok, err := find(term)
			if err != nil || !ok || p != (posting{tf: s.tf, norm: norm(length), pos: s.pos}) {
				t.Errorf("%s: %+v %v %v, want %+v", term, p, ok, err, s)
			}
		}
		if terms["apple"].tf != 2 || terms["zebra"].tf != pathWeight || terms["zebra"].pos != 0 || terms["banana"].pos != 7 {
			t.Errorf("terms: %+v", terms["apple"])
		}
		for _, missing := range []string{"appl", "apples", "durian", "t99999", strings.Repeat("y", 49)} {
			if _, ok, err := find(missing); ok || err != nil {
				t.Errorf("%q found: %v", missing, err)
			}
		}
		if !byWord {
			if len(recs) > shardCount {
				t.Errorf("%d shard records", len(recs))
			}
			for _, rec := range recs {
				if _, _, err := lookup(rec[:len(rec)-1], []byte("\uffff")); !errors.Is(err, errCorrupt) {
					t.Errorf("a record cut short: %v", err)
				}
			}
		}
	}
	if _, _, err := lookup([]byte{0x80}, []byte("a")); !errors.Is(err, errCorrupt) {
		t.Errorf("a bad shard record: %v", err)
	}
	if _, err := decodeWord([]byte{1, 2}); !errors.Is(err, errCorrupt) {
		t.Errorf("a word record cut short: %v", err)
	}
}

func TestNormRoundsToFourBits(t *testing.T) {
	for _, c := range []struct {
		in   int
		want uint32
	}{{0, 0}, {15, 15}, {16, 16}, {17, 16}, {31, 30}, {32, 32}, {33, 32}, {35, 32}, {1000, 960}, {262144, 262144}, {262143, 245760}} {
		if got := norm(c.in); got != c.want {
			t.Errorf("norm(%d) = %d, want %d", c.in, got, c.want)
		}
	}
	for l := 1; l < 1<<20; l = l*3/2 + 1 {
		if g := float64(norm(l)); g > float64(l) || g < float64(l)*7/8 {
			t.Fatalf("norm(%d) = %v", l, g)
		}
	}
}
