package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/ident"
	"github.com/gatehouse-dev/gatehouse/internal/option"
	"github.com/gatehouse-dev/gatehouse/internal/watch"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/store"
)

// Record kinds in the store.
const (
	kindSession = "session" // session id -> Session
	kindTurn    = "sturn"   // session id "/" turn id -> Turn
)

// Defaults of Options.
const (
	DefaultTitle       = "Agent Runtime Session"
	DefaultDeltaWindow = 50 * time.Millisecond
	DefaultDeltaBytes  = 64 << 10
	DefaultMaxEntries  = 100000
	DefaultMaxAge      = 30 * 24 * time.Hour
	DefaultThread      = "main"
	// DefaultMaxPerOwner is the most sessions one principal (an owner
	// within its tenant) may hold when Options.MaxPerOwner is zero.
	DefaultMaxPerOwner = 100000
)

// Limits of what a session holds.
const (
	maxTitleLen = 1024
	maxAttrSize = 256 << 10
	maxQueue    = 1000
)

// Kernel is what the registry needs of the execution kernel: it runs the
// turns.
type Kernel interface {
	Create(ctx context.Context, req kernel.CreateRequest, meta kernel.Meta) (kernel.View, bool, error)
	Cancel(ctx context.Context, id string, meta kernel.Meta) (kernel.View, error)
	Get(ctx context.Context, id string) (kernel.View, error)
}

// Options configure a Registry.
type Options struct {
	// Store keeps sessions and their logs; required.
	Store *store.Store
	// Logger receives warnings; nil discards.
	Logger *slog.Logger
	// DeltaWindow is how long a run of deltas may stay open before it is
	// written; zero means DefaultDeltaWindow (50ms): an agent streaming
	// 1,000 deltas a second costs about 20 writes a second.
	DeltaWindow time.Duration
	// DeltaBytes bounds the text of an open run; zero means 64 KiB.
	DeltaBytes int
	// MaxEntries and MaxAge bound each session's log: older entries go,
	// except those of a turn that has not ended. Zero means 100,000
	// entries and 30 days.
	MaxEntries int
	MaxAge     time.Duration
	// MaxPerOwner bounds the sessions one principal holds, archived ones
	// included (sessions are kept until deleted): past it a new session is
	// refused with ErrQuota. Zero means DefaultMaxPerOwner.
	MaxPerOwner int
}

// Registry keeps every durable session. It implements kernel.Sessions; it
// runs turns once Start gave it the kernel. It is safe for concurrent use.
type Registry struct {
	o   Options
	st  *store.Store
	log *slog.Logger

	mu    sync.Mutex
	books map[string]*book
	// owned counts each owner's sessions, by ownerKey, once counted.
	owned  map[string]int
	k      Kernel
	closed bool
	wg     sync.WaitGroup
	// closing is closed by Close: turns waiting for room stop waiting.
	closing chan struct{}

	// watches wakes the readers of session logs (see Watch).
	watches watch.Set
}

// book is one session in memory. mu orders every change of the session and
// is held across the store write of each append to its log, so sequences
// are handed out in commit order and a reader never sees a gap.
type book struct {
	mu    sync.Mutex
	id    string
	sess  Session
	saved bool   // the session record is in the store
	last  uint64 // the last durable sequence
	first uint64 // the first retained sequence
	run   *run
	// opened holds executions admitted by Open and not yet filed: what
	// their first filing must write.
	opened map[string]*opening
}

type opening struct {
	thread    string
	newThread bool
	turn      *Turn // an implicit turn, for an execution created outside the registry
}

// New opens the registry on o.Store.
func New(o Options) (*Registry, error) {
	if o.Store == nil {
		return nil, errors.New("session: Options.Store is required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	option.Default(&o.DeltaWindow, DefaultDeltaWindow)
	option.Default(&o.DeltaBytes, DefaultDeltaBytes)
	option.Default(&o.MaxEntries, DefaultMaxEntries)
	option.Default(&o.MaxAge, DefaultMaxAge)
	option.Default(&o.MaxPerOwner, DefaultMaxPerOwner)
	r := &Registry{o: o, st: o.Store, log: o.Logger, books: map[string]*book{}, owned: map[string]int{},
		closing: make(chan struct{})}
	if err := r.indexOwners(context.Background()); err != nil {
		return nil, err
	}
	return r, nil
}

// Close flushes open delta runs and stops starting turns. Turns queued or
// due to start are started again by the next Start.
func (r *Registry) Close() {
	r.mu.Lock()
	if !r.closed {
		close(r.closing)
	}
	r.closed = true
	books := make([]*book, 0, len(r.books))
	for _, b := range r.books {
		books = append(books, b)
	}
	r.mu.Unlock()
	for _, b := range books {
		b.mu.Lock()
		r.flushLocked(b)
		b.mu.Unlock()
	}
	r.wg.Wait()
	r.watches.Close()
}

// book returns the session's book, loading it from the store.
func (r *Registry) book(ctx context.Context, id string) (*book, error) {
	r.mu.Lock()
	b := r.books[id]
	r.mu.Unlock()
	if b != nil {
		return b, nil
	}
	var s Session
	if err := r.st.Get(kindSession, id, &s); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, NotFound(id)
		}
		return nil, fmt.Errorf("session: load %s: %w", id, err)
	}
	last, err := r.st.Last(streamOf(id))
	if err != nil {
		return nil, fmt.Errorf("session: load %s: %w", id, err)
	}
	first, err := r.firstRetained(id)
	if err != nil {
		return nil, err
	}
	nb := &book{id: id, sess: s, saved: true, last: last, first: first, opened: map[string]*opening{}}
	r.mu.Lock()
	defer r.mu.Unlock()
	if b := r.books[id]; b != nil {
		return b, nil // loaded meanwhile
	}
	r.books[id] = nb
	return nb, nil
}

// firstRetained returns the first sequence session id's log keeps.
func (r *Registry) firstRetained(id string) (uint64, error) {
	var first uint64
	var derr error
	err := r.st.Scan(streamOf(id), 0, func(seq uint64, data []byte) bool {
		var e entry
		if derr = store.Decode(data, &e); derr == nil {
			first = seq
			if e.First > 0 {
				first = e.First
			}
		}
		return false
	})
	if err == nil {
		err = derr
	}
	if err != nil {
		return 0, fmt.Errorf("session: load %s: %w", id, err)
	}
	return first, nil
}

// CreateRequest describes a session to create.
type CreateRequest struct {
	// ID is the session's id; empty makes one.
	ID      string
	Title   string
	Source  string
	AgentID string
	Owner   string
	Tenant  string
	Attrs   map[string]json.RawMessage
}

// validID checks an id a caller chose: package ident's rule, narrowed to
// what is URL-path-safe, since clients put session ids into paths
// unescaped.
func validID(what, id string) error {
	if err := ident.Check(what, id); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_.~:", c)) {
			return fmt.Errorf("%w: %s may hold only letters, digits and - _ . ~ :", ErrInvalid, what)
		}
	}
	return nil
}

// Create makes a session. A session id already taken is ErrExists; a
// session past its owner's quota is ErrQuota.
func (r *Registry) Create(ctx context.Context, req CreateRequest) (Session, error) {
	if req.ID == "" {
		req.ID = event.NewID()
	}
	if err := validID("session id", req.ID); err != nil {
		return Session{}, err
	}
	if req.Title == "" {
		req.Title = DefaultTitle
	}
	if len(req.Title) > maxTitleLen || !utf8.ValidString(req.Title) {
		return Session{}, fmt.Errorf("%w: title must be valid UTF-8 of at most %d bytes", ErrInvalid, maxTitleLen)
	}
	if req.Source == "" {
		req.Source = "api"
	}
	for surface, v := range req.Attrs {
		if len(v) > maxAttrSize {
			return Session{}, fmt.Errorf("%w: attributes of %s exceed %d bytes", ErrInvalid, surface, maxAttrSize)
		}
	}
	if err := r.st.Admit(); err != nil {
		return Session{}, err // short of room: new work waits
	}
	release, err := r.reserve(req.Tenant, req.Owner)
	if err != nil {
		return Session{}, err
	}
	now := time.Now().UTC()
	b := &book{id: req.ID, opened: map[string]*opening{}, sess: Session{
		ID: req.ID, Title: req.Title, Source: req.Source, Status: StatusActive, Owner: req.Owner, Tenant: req.Tenant,
		AgentID: req.AgentID, Created: now, Updated: now, Attrs: req.Attrs,
		Threads: []Thread{{ID: DefaultThread, Status: ThreadIdle, Created: now}},
	}}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := r.claim(ctx, b); err != nil {
		release()
		return Session{}, err
	}
	err = r.write(ctx, b, func(a *appender, s *Session) error {
		return r.created(a, s)
	})
	if err != nil {
		release()
		r.mu.Lock()
		delete(r.books, b.id)
		r.mu.Unlock()
		return Session{}, err
	}
	return b.sess.clone(), nil
}

// claim registers a new book under its id, which must be free in memory and
// in the store. The caller holds b.mu.
func (r *Registry) claim(ctx context.Context, b *book) error {
	if _, err := r.book(ctx, b.id); err == nil {
		return fmt.Errorf("%w: %s", ErrExists, b.id)
	} else if !errors.Is(err, ErrNotFound) {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	if r.books[b.id] != nil {
		return fmt.Errorf("%w: %s", ErrExists, b.id)
	}
	r.books[b.id] = b
	return nil
}

// created appends the facts of a new session, session.created and its
// threads, and lists it under its owner.
func (r *Registry) created(a *appender, s *Session) error {
	if err := a.batch.Put(kindOwned, ownerKey(s.Tenant, s.Owner)+s.ID, true); err != nil {
		return err
	}
	if err := a.fact(FactSessionCreated, "", "", &SessionFact{Title: s.Title, Source: s.Source, Status: s.Status, AgentID: s.AgentID}); err != nil {
		return err
	}
	for _, t := range s.Threads {
		if err := a.fact(FactThreadStarted, t.ID, "", &ThreadFact{ThreadID: t.ID}); err != nil {
			return err
		}
	}
	return nil
}

// write appends to b's log in one durable write: change gets a copy of the
// session to change and an appender; on success the copy becomes the
// session. An open run of deltas is sealed first. The caller holds b.mu.
func (r *Registry) write(ctx context.Context, b *book, change func(*appender, *Session) error) error {
	var batch store.Batch
	sealed := r.sealInto(&batch, b)
	s := b.sess.clone()
	a := &appender{id: b.id, batch: &batch, next: b.last + 1, at: time.Now().UTC()}
	if sealed != nil {
		a.next = sealed.last() + 1
	}
	if err := change(a, &s); err != nil {
		r.unseal(b, sealed)
		return err
	}
	s.Updated = a.at
	if err := batch.Put(kindSession, b.id, &s); err != nil {
		r.unseal(b, sealed)
		return err
	}
	if err := r.st.Write(ctx, &batch); err != nil {
		r.unseal(b, sealed)
		return fmt.Errorf("session: write %s: %w", b.id, err)
	}
	r.committed(b, sealed, a.next-1)
	b.sess, b.saved = s, true
	r.notify(b.id)
	return nil
}

// sealInto moves b's open run, if any, into batch, and returns it. The
// caller holds b.mu.
func (r *Registry) sealInto(batch *store.Batch, b *book) *run {
	ru := b.run
	if ru == nil {
		return nil
	}
	ru.timer.Stop()
	b.run = nil
	batch.Append(streamOf(b.id), ru.last(), store.Encode(ru.entry()))
	return ru
}

// unseal gives back a run whose write failed: it stays open, its
// sequences unchanged, to be written with the next append.
func (r *Registry) unseal(b *book, ru *run) {
	if ru == nil {
		return
	}
	b.run = ru
	ru.timer = time.AfterFunc(r.o.DeltaWindow, func() { r.flush(b, ru) })
}

// committed records a durable write up to last, with the sealed run.
func (r *Registry) committed(b *book, sealed *run, last uint64) {
	if sealed != nil {
		sealed.settle(nil)
	}
	if last > b.last {
		b.last = last
	}
	if b.first == 0 && b.last > 0 {
		b.first = 1
	}
}

// Get returns session id.
func (r *Registry) Get(ctx context.Context, id string) (Session, error) {
	b, err := r.book(ctx, id)
	if err != nil {
		return Session{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.saved {
		return Session{}, NotFound(id)
	}
	return b.sess.clone(), nil
}

// Turns returns the turns of session id, oldest first.
func (r *Registry) Turns(ctx context.Context, id string) ([]Turn, error) {
	if _, err := r.Get(ctx, id); err != nil {
		return nil, err
	}
	var out []Turn
	err := store.EachRecord(ctx, r.st, kindTurn, id+"/", func(_ string, t *Turn) bool {
		out = append(out, *t)
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("session: turns of %s: %w", id, err)
	}
	slices.SortStableFunc(out, func(a, b Turn) int { return a.Submitted.Compare(b.Submitted) })
	return out, nil
}

// Turn returns turn turnID of session id.
func (r *Registry) Turn(ctx context.Context, id, turnID string) (Turn, error) {
	var t Turn
	if err := r.st.Get(kindTurn, id+"/"+turnID, &t); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return Turn{}, fmt.Errorf("%w: turn %s of session %s", ErrNotFound, turnID, id)
		}
		return Turn{}, fmt.Errorf("session: turn %s: %w", turnID, err)
	}
	return t, nil
}

// ListRequest selects a page of sessions.
type ListRequest struct {
	// After is the id the previous page ended with.
	After string
	// Limit bounds the page; zero means 100, at most 1,000.
	Limit int
	// Owner, when set, lists only the sessions of that principal of
	// Tenant, read through the owner index: the listing then costs what
	// the owner holds, not what every tenant does. Empty lists every
	// session (for an admin).
	Owner, Tenant string
	// Visible keeps the sessions the caller may see.
	Visible func(*Session) bool
}

// ListPage is a page of sessions, in id order; Next is empty on the last.
type ListPage struct {
	Sessions []Session
	Next     string
}

// List returns a page of sessions, in id order.
func (r *Registry) List(ctx context.Context, req ListRequest) (ListPage, error) {
	if req.Limit <= 0 {
		req.Limit = 100
	}
	req.Limit = min(req.Limit, 1000)
	if req.Owner != "" {
		return r.listOwned(ctx, req)
	}
	var page ListPage
	var derr error
	err := r.st.Records(kindSession, func(id string, decode func(any) error) bool {
		if id <= req.After {
			return true
		}
		var s Session
		if derr = decode(&s); derr != nil {
			return false
		}
		if req.Visible != nil && !req.Visible(&s) {
			return true
		}
		if len(page.Sessions) == req.Limit {
			page.Next = page.Sessions[len(page.Sessions)-1].ID
			return false
		}
		page.Sessions = append(page.Sessions, s)
		return ctx.Err() == nil
	})
	if err == nil {
		err = derr
	}
	if err != nil {
		return ListPage{}, fmt.Errorf("session: list: %w", err)
	}
	return page, nil
}

// Archive closes session id to new work; running turns finish.
func (r *Registry) Archive(ctx context.Context, id string) (Session, error) {
	return r.update(ctx, id, func(s *Session) ([]string, error) {
		if s.Status == StatusArchived {
			return nil, nil
		}
		s.Status = StatusArchived
		return []string{"status"}, nil
	})
}

// SetTitle changes session id's title.
func (r *Registry) SetTitle(ctx context.Context, id, title string) (Session, error) {
	if title == "" || len(title) > maxTitleLen || !utf8.ValidString(title) {
		return Session{}, fmt.Errorf("%w: title must be valid UTF-8 of 1-%d bytes", ErrInvalid, maxTitleLen)
	}
	return r.update(ctx, id, func(s *Session) ([]string, error) {
		if s.Title == title {
			return nil, nil
		}
		s.Title = title
		return []string{"title"}, nil
	})
}

// SetAttrs replaces what surface keeps about session id. The value never
// enters the log: the update fact names only the surface.
func (r *Registry) SetAttrs(ctx context.Context, id, surface string, v json.RawMessage) (Session, error) {
	if len(v) > maxAttrSize {
		return Session{}, fmt.Errorf("%w: attributes of %s exceed %d bytes", ErrInvalid, surface, maxAttrSize)
	}
	return r.update(ctx, id, func(s *Session) ([]string, error) {
		if s.Attrs == nil {
			s.Attrs = map[string]json.RawMessage{}
		}
		s.Attrs[surface] = v
		return []string{surface}, nil
	})
}

// update changes session id and records session.updated, naming what
// changed; a change that changes nothing writes nothing.
func (r *Registry) update(ctx context.Context, id string, change func(*Session) ([]string, error)) (Session, error) {
	b, err := r.book(ctx, id)
	if err != nil {
		return Session{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	probe := b.sess.clone()
	changed, err := change(&probe)
	if err != nil || len(changed) == 0 {
		return probe, err
	}
	err = r.write(ctx, b, func(a *appender, s *Session) error {
		if _, err := change(s); err != nil {
			return err
		}
		return a.fact(FactSessionUpdated, "", "", &SessionFact{Title: s.Title, Source: s.Source, Status: s.Status, AgentID: s.AgentID, Changed: changed})
	})
	if err != nil {
		return Session{}, err
	}
	return b.sess.clone(), nil
}

// kindCursor keeps the sequence each reader of a session acknowledged.
const kindCursor = "scursor" // session id "/" reader -> uint64

// Acknowledge records that reader (a channel, a UI) has processed session
// id's log up to seq; it never moves back. It writes no fact to the log.
func (r *Registry) Acknowledge(ctx context.Context, id, reader string, seq uint64) (uint64, error) {
	if err := validID("reader", reader); err != nil {
		return 0, err
	}
	b, err := r.book(ctx, id)
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if seq > b.last {
		return 0, fmt.Errorf("%w: sequence %d is past the log's last, %d", ErrInvalid, seq, b.last)
	}
	var cur uint64
	if err := r.st.Get(kindCursor, id+"/"+reader, &cur); err != nil && !errors.Is(err, store.ErrNotFound) {
		return 0, err
	}
	if seq <= cur {
		return cur, nil
	}
	var batch store.Batch
	if err := batch.Put(kindCursor, id+"/"+reader, seq); err != nil {
		return 0, err
	}
	if err := r.st.Write(ctx, &batch); err != nil {
		return 0, fmt.Errorf("session: acknowledge %s: %w", id, err)
	}
	return seq, nil
}

// Cursors returns what each reader of session id acknowledged.
func (r *Registry) Cursors(ctx context.Context, id string) (map[string]uint64, error) {
	out := map[string]uint64{}
	err := store.EachRecord(ctx, r.st, kindCursor, id+"/", func(key string, seq *uint64) bool {
		out[strings.TrimPrefix(key, id+"/")] = *seq
		return true
	})
	return out, err
}
