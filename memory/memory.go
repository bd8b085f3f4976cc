// Package memory keeps durable notes for agents and their people: the
// Runtime API's memory (seeds 000 and 003). A note is text at a path in a
// space, versioned, and found again by ranked lexical search (BM25 over
// path and content).
//
// A space is a principal's own notes within its tenant, or the tenant's
// shared notes, which a caller names explicitly. Another principal's notes
// are, to a caller, notes that do not exist.
//
// Notes and their search index live in the gateway's store, written in one
// batch: a write is acknowledged once both are on disk, and nothing is
// loaded at Open, so a start costs the same whatever the notes. The index
// is inverted (postings.go): each note's terms, with their counts and first
// positions and the note's length, in records a search reads by prefix;
// BM25 takes its statistics from those records and from a usage record per
// space. Writes to one tenant's notes are serialized, so concurrent
// appends never lose text, IfVersion checks are exact and quotas are
// counted exactly. Calls of the tools queue fairly per tenant (sched.go).
package memory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gatehouse-dev/gatehouse/ident"
	"github.com/gatehouse-dev/gatehouse/internal/option"
	"github.com/gatehouse-dev/gatehouse/store"
)

// Errors, matchable with errors.Is.
var (
	ErrInvalidPath = errors.New("invalid path")
	ErrInvalid     = errors.New("invalid input")
	ErrNotFound    = errors.New("note not found")
	ErrConflict    = errors.New("version conflict")
	ErrTooLarge    = errors.New("note too large")
	// ErrQuota reports a write past a quota; the error is a *QuotaError.
	ErrQuota = errors.New("note quota exceeded")
	// ErrBusy reports a call refused because its tenant, or everyone, has
	// as many calls waiting or running as allowed; it may be tried again.
	ErrBusy = errors.New("memory busy")
)

// QuotaError is a write refused by a quota. It matches ErrQuota.
type QuotaError struct {
	// Scope is "space" (the notes of one principal, or the tenant's shared
	// space) or "tenant" (every space of a tenant).
	Scope string
	// Resource is "notes" (their number) or "bytes" (their content).
	Resource string
	// Max is the quota.
	Max int64
}

func (e *QuotaError) Error() string {
	who := "a space"
	if e.Scope == "tenant" {
		who = "a tenant"
	}
	if e.Resource == "bytes" {
		return fmt.Sprintf("%v: %s keeps at most %d bytes of notes", ErrQuota, who, e.Max)
	}
	return fmt.Sprintf("%v: %s keeps at most %d notes", ErrQuota, who, e.Max)
}

// Is makes a QuotaError match ErrQuota.
func (e *QuotaError) Is(target error) bool { return target == ErrQuota }

// Limits of paths; the content and count limits are Options.
const (
	maxPathLen   = 512
	maxPathDepth = 16
)

// Options configure Notes. Store is required; zero fields take the values
// of Defaults.
type Options struct {
	Store *store.Store
	// MaxNoteBytes bounds one note's content.
	MaxNoteBytes int
	// MaxNotes and MaxBytes bound one space: a principal's notes, or a
	// tenant's shared notes.
	MaxNotes int
	MaxBytes int64
	// MaxTenantNotes and MaxTenantBytes bound all the spaces of one tenant
	// together. Principals without a tenant have no such bound: they share
	// nothing but the space they name explicitly.
	MaxTenantNotes int
	MaxTenantBytes int64
	// Workers is how many memory calls run at once. One tenant runs at
	// most Workers-1 of them (1 when Workers is 1), so another tenant's
	// call always finds a worker or is the next to get one.
	Workers int
	// TenantQueue bounds the calls of one tenant waiting or running, and
	// Queue those of everyone; past them a call is refused with ErrBusy.
	TenantQueue int
	Queue       int
	// LegacyOwner is the principal whose own space (without a tenant)
	// receives the notes an earlier release kept for principals without a
	// tenant, when the deployment has only one principal; empty: the
	// shared space of the principals without a tenant (see migrate).
	LegacyOwner string
	// Logger reports the migration of notes stored before spaces.
	Logger *slog.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Defaults returns the values zero Options fields take.
func Defaults() Options {
	return Options{
		MaxNoteBytes:   256 << 10,
		MaxNotes:       10000,
		MaxBytes:       64 << 20,
		MaxTenantNotes: 100000,
		MaxTenantBytes: 1 << 30,
		Workers:        4,
		TenantQueue:    8,
		Queue:          16,
	}
}

// Note is one note.
type Note struct {
	Path      string    `json:"path"`
	Content   string    `json:"content"`
	Version   uint64    `json:"version"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// Entry is a note in a listing.
type Entry struct {
	Path      string    `json:"path"`
	Size      int       `json:"size"`
	Version   uint64    `json:"version"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// Hit is a search result.
type Hit struct {
	Path    string  `json:"path"`
	Score   float64 `json:"score"`
	Snippet string  `json:"snippet"`
}

// Owner is who calls a memory tool: a principal and its tenant (empty
// for a principal without one).
type Owner struct {
	Tenant    string
	Principal string
}

// Space is a set of notes: Principal's own within Tenant, or, when Shared,
// Tenant's notes that every principal of the tenant reads and writes. The
// principals without a tenant share the shared space of the tenant "".
type Space struct {
	Tenant    string
	Principal string
	Shared    bool
}

// Names of the spaces in the tools' "space" field.
const (
	SpacePrincipal = "principal"
	SpaceTenant    = "tenant"
)

// SpaceOf returns the space name selects for o: "" or "principal" its
// own, "tenant" its tenant's shared one.
func SpaceOf(o Owner, name string) (Space, error) {
	switch name {
	case "", SpacePrincipal:
		return Space{Tenant: o.Tenant, Principal: o.Principal}, nil
	case SpaceTenant:
		return Space{Tenant: o.Tenant, Shared: true}, nil
	}
	return Space{}, fmt.Errorf("%w: space %q is neither %q nor %q", ErrInvalid, name, SpacePrincipal, SpaceTenant)
}

// check refuses a space without an owner: no note may land in a space
// nobody can name again.
func (s Space) check() error {
	if !s.Shared && s.Principal == "" {
		return fmt.Errorf("%w: a principal's space needs the principal", ErrInvalid)
	}
	return nil
}

// id is the space's part of its records' ids: every field
// length-prefixed, so that no name reaches into another space's ids.
func (s Space) id() string {
	if s.Shared {
		return lp(s.Tenant) + "t"
	}
	return lp(s.Tenant) + "p" + lp(s.Principal)
}

// turn is who the space's calls queue and write as: its tenant, or, for
// the principals without one, the space itself.
func (s Space) turn() string {
	if s.Tenant != "" {
		return "t" + lp(s.Tenant)
	}
	return "s" + s.id()
}

func lp(s string) string { return strconv.Itoa(len(s)) + ":" + s }

// Notes is the notes of every space.
type Notes struct {
	o     Options
	locks keyedLocks
	sched *sched
}

// Open returns the notes kept in o.Store. It moves the notes that an
// earlier version kept per tenant into their tenant's shared space first
// (see migrate); otherwise it reads nothing. ctx bounds the move.
func Open(ctx context.Context, o Options) (*Notes, error) {
	if o.Store == nil {
		return nil, errors.New("memory: Options.Store is required")
	}
	d := Defaults()
	option.Default(&o.MaxNoteBytes, d.MaxNoteBytes)
	option.Default(&o.MaxNotes, d.MaxNotes)
	option.Default(&o.MaxBytes, d.MaxBytes)
	option.Default(&o.MaxTenantNotes, d.MaxTenantNotes)
	option.Default(&o.MaxTenantBytes, d.MaxTenantBytes)
	option.Default(&o.Workers, d.Workers)
	option.Default(&o.TenantQueue, d.TenantQueue)
	option.Default(&o.Queue, d.Queue)
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	n := &Notes{o: o, sched: newSched(o.Workers, o.TenantQueue, o.Queue)}
	if err := n.migrate(ctx); err != nil {
		return nil, fmt.Errorf("memory: %w", err)
	}
	return n, nil
}

// Capacity is how many calls the notes hold at once, waiting or running:
// a runner serving them takes that many jobs at a time.
func (n *Notes) Capacity() int { return n.o.Queue }

// CleanPath returns p normalized, or ErrInvalidPath: absolute,
// "/"-separated, no "." or ".." segment, no empty segment, no backslash,
// at most 512 bytes and 16 segments, and, as ids (package ident), valid
// UTF-8 without control or format characters or line separators.
func CleanPath(p string) (string, error) {
	bad := func(why string) (string, error) { return "", fmt.Errorf("%w: %s", ErrInvalidPath, why) }
	if err := ident.CheckLen("path", p, maxPathLen); err != nil {
		return bad(err.Error())
	}
	switch {
	case !strings.HasPrefix(p, "/"):
		return bad(strconv.Quote(p) + " must start with /")
	case strings.HasSuffix(p, "/"):
		return bad(strconv.Quote(p) + " names a folder, not a note")
	case strings.ContainsRune(p, '\\'):
		return bad(strconv.Quote(p) + " holds a backslash")
	}
	segs := strings.Split(p[1:], "/")
	if len(segs) > maxPathDepth {
		return bad(strconv.Quote(p) + " is deeper than " + strconv.Itoa(maxPathDepth) + " segments")
	}
	for _, s := range segs {
		if s == "" || s == "." || s == ".." {
			return bad(strconv.Quote(p) + ": empty, . and .. segments are not allowed")
		}
	}
	return path.Clean(p), nil
}

// Read returns the note at p.
func (n *Notes) Read(ctx context.Context, sp Space, p string) (Note, error) {
	p, err := CleanPath(p)
	if err != nil {
		return Note{}, err
	}
	note, ok, err := n.read(sp, p)
	if err != nil {
		return Note{}, err
	}
	if !ok {
		return Note{}, fmt.Errorf("%w: %s", ErrNotFound, p)
	}
	return note, nil
}

// Write replaces (or creates) the note at p. With ifVersion > 0 the note
// must be at that version; ifVersion 0 writes whatever is there. It
// returns once the note is durable.
func (n *Notes) Write(ctx context.Context, sp Space, p, content string, ifVersion uint64) (Note, error) {
	return n.update(ctx, sp, p, func(cur *Note, exists bool) (string, error) {
		if ifVersion > 0 && (!exists || cur.Version != ifVersion) {
			have := uint64(0)
			if exists {
				have = cur.Version
			}
			return "", fmt.Errorf("%w: %s is at version %d, not %d", ErrConflict, p, have, ifVersion)
		}
		return content, nil
	})
}

// Append adds content to the end of the note at p, on a new line, creating
// the note when absent.
func (n *Notes) Append(ctx context.Context, sp Space, p, content string) (Note, error) {
	return n.update(ctx, sp, p, func(cur *Note, exists bool) (string, error) {
		return appended(cur.Content, content), nil
	})
}

// appended is cur with content added on a new line.
func appended(cur, content string) string {
	if cur == "" || strings.HasSuffix(cur, "\n") {
		return cur + content
	}
	return cur + "\n" + content
}

// maxListed bounds a listing.
const maxListed = 1000

// List returns the notes whose path starts with prefix, in path order, at
// most 1,000.
func (n *Notes) List(ctx context.Context, sp Space, prefix string) ([]Entry, error) {
	out := []Entry{}
	sid := sp.id()
	err := store.EachRecord(ctx, n.o.Store, kindMeta, sid+prefix, func(id string, m *meta) bool {
		out = append(out, Entry{Path: id[len(sid):], Size: m.Size, Version: m.Version, UpdatedAt: m.UpdatedAt})
		return len(out) < maxListed
	})
	if err != nil {
		return nil, fmt.Errorf("memory: list: %w", err)
	}
	return out, nil
}

// keyedLocks is a mutex per key, kept only while someone holds or waits
// for it.
type keyedLocks struct {
	mu sync.Mutex
	m  map[string]*keyedLock
}

type keyedLock struct {
	sync.Mutex
	refs int
}

// lock locks key and returns its unlock.
func (l *keyedLocks) lock(key string) func() {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*keyedLock{}
	}
	k := l.m[key]
	if k == nil {
		k = &keyedLock{}
		l.m[key] = k
	}
	k.refs++
	l.mu.Unlock()
	k.Lock()
	return func() {
		k.Unlock()
		l.mu.Lock()
		if k.refs--; k.refs == 0 {
			delete(l.m, key)
		}
		l.mu.Unlock()
	}
}
