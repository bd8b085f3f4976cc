package memory

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/gatehouse-dev/gatehouse/store"
)

// The store's record kinds of notes. Ids start with the space's id (sid);
// paths and terms hold no NUL, so a NUL ends them inside an id.
const (
	// kindMeta: sid + path → meta, what a listing and a quota need.
	kindMeta = "mnote"
	// kindBody: sid + path + NUL + chunk number (4 bytes, big endian) →
	// chunk, the content in pieces of chunkSize bytes, so that a snippet
	// reads one or two of them and an append rewrites only the last.
	kindBody = "mbody"
	// kindPost: the inverted index, see postings.go.
	kindPost = "mpost"
	// kindSpace: sid → usage of the space, and the sum of its notes'
	// lengths, which BM25 needs.
	kindSpace = "mspace"
	// kindTenant: tenant → usage of all the tenant's spaces.
	kindTenant = "mtenant"
)

// chunkSize is the bytes of content one body record holds.
const chunkSize = 16 << 10

// meta is a note without its content.
type meta struct {
	Size      int       `msgpack:"s"`
	Version   uint64    `msgpack:"v"`
	CreatedAt time.Time `msgpack:"ca"`
	UpdatedAt time.Time `msgpack:"ua"`
	// Length is the note's length in terms, path terms weighted.
	Length int `msgpack:"l"`
}

// chunk is a piece of a note's content. The first also holds the note's
// version and times, so that one read of the chunks sees a whole note.
type chunk struct {
	Data string `msgpack:"d"`
	Head *head  `msgpack:"h,omitempty"`
}

type head struct {
	Version   uint64    `msgpack:"v"`
	CreatedAt time.Time `msgpack:"ca"`
	UpdatedAt time.Time `msgpack:"ua"`
}

// usage is what a space or a tenant holds.
type usage struct {
	Notes int   `msgpack:"n"`
	Bytes int64 `msgpack:"b"`
	// Length is the sum of the notes' lengths (spaces only).
	Length int64 `msgpack:"l,omitempty"`
}

func bodyPrefix(sid, p string) string { return sid + p + "\x00" }

func bodyID(sid, p string, i int) string {
	return string(binary.BigEndian.AppendUint32([]byte(bodyPrefix(sid, p)), uint32(i)))
}

// read returns the note at clean path p, and whether there is one, from
// one read of its chunks.
func (n *Notes) read(sp Space, p string) (Note, bool, error) {
	var (
		note Note
		h    *head
		b    []byte
		derr error
	)
	err := n.o.Store.RecordsWithPrefix(kindBody, bodyPrefix(sp.id(), p), func(id string, decode func(any) error) bool {
		var c chunk
		if derr = decode(&c); derr != nil {
			return false
		}
		if c.Head != nil {
			h = c.Head
		}
		b = append(b, c.Data...)
		return true
	})
	if err == nil {
		err = derr
	}
	if err != nil {
		return Note{}, false, fmt.Errorf("memory: read %s: %w", p, err)
	}
	if h == nil {
		return Note{}, false, nil
	}
	note = Note{Path: p, Content: string(b), Version: h.Version, CreatedAt: h.CreatedAt, UpdatedAt: h.UpdatedAt}
	return note, true, nil
}

// getUsage reads the usage record id of kind; none is zero.
func (n *Notes) getUsage(kind, id string) (usage, error) {
	var u usage
	if err := n.o.Store.Get(kind, id, &u); err != nil && !errors.Is(err, store.ErrNotFound) {
		return usage{}, fmt.Errorf("memory: usage: %w", err)
	}
	return u, nil
}

// update writes the note at p with the content next returns for what is
// there now, under the lock of the space's tenant.
func (n *Notes) update(ctx context.Context, sp Space, p string, next func(cur *Note, exists bool) (string, error)) (Note, error) {
	p, err := CleanPath(p)
	if err != nil {
		return Note{}, err
	}
	if err := sp.check(); err != nil {
		return Note{}, err
	}
	defer n.locks.lock(sp.turn())()
	cur, exists, err := n.read(sp, p)
	if err != nil {
		return Note{}, err
	}
	content, err := next(&cur, exists)
	if err != nil {
		return Note{}, err
	}
	if !utf8.ValidString(content) {
		return Note{}, fmt.Errorf("%w: content must be UTF-8", ErrInvalid)
	}
	if len(content) > n.o.MaxNoteBytes {
		return Note{}, fmt.Errorf("%w: %s would hold %d bytes, more than %d", ErrTooLarge, p, len(content), n.o.MaxNoteBytes)
	}
	now := n.o.Now().UTC()
	note := Note{Path: p, Content: content, Version: cur.Version + 1, CreatedAt: cur.CreatedAt, UpdatedAt: now}
	if !exists {
		note.Version, note.CreatedAt = 1, now
	}
	var b store.Batch
	if err := n.stage(&b, sp, &cur, exists, &note, true); err != nil {
		return Note{}, err
	}
	if err := n.o.Store.Write(ctx, &b); err != nil {
		return Note{}, fmt.Errorf("memory: write %s: %w", p, err)
	}
	return note, nil
}

// stage adds to b the writes that turn note cur (when exists) into note:
// its chunks, postings and meta, and the usage of its space and tenant.
// With quotas, a write that would pass one is refused.
func (n *Notes) stage(b *store.Batch, sp Space, cur *Note, exists bool, note *Note, quotas bool) error {
	sid := sp.id()
	oldSize := 0
	if exists {
		oldSize = len(cur.Content)
	}
	added := 1
	if exists {
		added = 0
	}
	grown := int64(len(note.Content) - oldSize)
	su, err := n.getUsage(kindSpace, sid)
	if err != nil {
		return err
	}
	var tu usage
	if sp.Tenant != "" {
		if tu, err = n.getUsage(kindTenant, sp.Tenant); err != nil {
			return err
		}
	}
	if quotas {
		if err := n.admit(sp, su, tu, added, grown); err != nil {
			return err
		}
	}
	var oldTerms map[string]termStat
	oldLen := 0
	if exists {
		oldTerms, oldLen = analyze(cur.Path, cur.Content)
	}
	terms, length := analyze(note.Path, note.Content)
	stagePostings(b, sid, note.Path, oldTerms, oldLen, terms, length)
	if err := stageChunks(b, sid, note, cur.Content, exists); err != nil {
		return err
	}
	m := meta{Size: len(note.Content), Version: note.Version, CreatedAt: note.CreatedAt, UpdatedAt: note.UpdatedAt, Length: length}
	if err := b.Put(kindMeta, sid+note.Path, &m); err != nil {
		return err
	}
	su.Notes += added
	su.Bytes += grown
	su.Length += int64(length - oldLen)
	if err := b.Put(kindSpace, sid, &su); err != nil {
		return err
	}
	if sp.Tenant != "" {
		tu.Notes += added
		tu.Bytes += grown
		if err := b.Put(kindTenant, sp.Tenant, &tu); err != nil {
			return err
		}
	}
	return nil
}

// admit refuses a write that adds added notes and grown bytes past a
// quota of its space or its tenant. A write that does not grow what it
// counts passes, so that a space over a lowered quota can still shrink.
func (n *Notes) admit(sp Space, su, tu usage, added int, grown int64) error {
	over := func(have, more, max int64) bool { return more > 0 && have+more > max }
	switch {
	case over(int64(su.Notes), int64(added), int64(n.o.MaxNotes)):
		return &QuotaError{Scope: "space", Resource: "notes", Max: int64(n.o.MaxNotes)}
	case over(su.Bytes, grown, n.o.MaxBytes):
		return &QuotaError{Scope: "space", Resource: "bytes", Max: n.o.MaxBytes}
	case sp.Tenant == "":
		return nil
	case over(int64(tu.Notes), int64(added), int64(n.o.MaxTenantNotes)):
		return &QuotaError{Scope: "tenant", Resource: "notes", Max: int64(n.o.MaxTenantNotes)}
	case over(tu.Bytes, grown, n.o.MaxTenantBytes):
		return &QuotaError{Scope: "tenant", Resource: "bytes", Max: n.o.MaxTenantBytes}
	}
	return nil
}

// stagePostings adds the posting records that change from the old terms
// to the new: a record no longer there is deleted, one whose bytes
// changed is written again, the rest stays.
func stagePostings(b *store.Batch, sid, p string, old map[string]termStat, oldLen int, terms map[string]termStat, length int) {
	was, now := postingRecords(sid, p, old, oldLen), postingRecords(sid, p, terms, length)
	for id := range was {
		if _, ok := now[id]; !ok {
			b.Delete(kindPost, id)
		}
	}
	for id, rec := range now {
		if bytes.Equal(was[id], rec) {
			continue
		}
		// A []byte always encodes.
		_ = b.Put(kindPost, id, rec)
	}
}

// stageChunks adds the chunks of note that differ from those of old (the
// first always: it holds the version), and deletes those past its end.
func stageChunks(b *store.Batch, sid string, note *Note, old string, exists bool) error {
	count := func(s string) int { return max(1, (len(s)+chunkSize-1)/chunkSize) }
	piece := func(s string, i int) string { return s[min(len(s), i*chunkSize):min(len(s), (i+1)*chunkSize)] }
	have, want := 0, count(note.Content)
	if exists {
		have = count(old)
	}
	for i := range want {
		data := piece(note.Content, i)
		c := chunk{Data: data}
		if i == 0 {
			c.Head = &head{Version: note.Version, CreatedAt: note.CreatedAt, UpdatedAt: note.UpdatedAt}
		} else if i < have && piece(old, i) == data {
			continue
		}
		if err := b.Put(kindBody, bodyID(sid, note.Path, i), &c); err != nil {
			return err
		}
	}
	for i := want; i < have; i++ {
		b.Delete(kindBody, bodyID(sid, note.Path, i))
	}
	return nil
}
