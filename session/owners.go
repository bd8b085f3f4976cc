package session

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gatehouse-dev/gatehouse/store"
)

// The owner index: every session is also listed under its owner, so that
// a caller's listing reads the caller's sessions, not every tenant's, and
// the registry knows how many each principal holds (Options.MaxPerOwner).
const (
	kindOwned = "sowned" // ownerKey + session id -> nothing
	kindMeta  = "smeta"  // metaOwnerIndex -> true once every session is indexed
	// metaOwnerIndex marks a store whose sessions are all in the owner
	// index: written after indexing the sessions of an earlier release.
	metaOwnerIndex = "owner-index"
	// indexBatch bounds one batch of the indexing of earlier sessions.
	indexBatch = 1000
)

// ownerKey is the index prefix of an owner: its tenant and principal, each
// with its length first, so that no pair is a prefix of another's
// ("a"/"bc" and "ab"/"c" differ) whatever the characters.
func ownerKey(tenant, owner string) string {
	return strconv.Itoa(len(tenant)) + ":" + tenant + strconv.Itoa(len(owner)) + ":" + owner + "/"
}

// parseOwned splits an owner index key into its owner prefix and session
// id.
func parseOwned(key string) (prefix, id string, ok bool) {
	rest := key
	for range 2 {
		n, after, found := strings.Cut(rest, ":")
		size, err := strconv.Atoi(n)
		if !found || err != nil || size < 0 || size > len(after) {
			return "", "", false
		}
		rest = after[size:]
	}
	if !strings.HasPrefix(rest, "/") {
		return "", "", false
	}
	prefix = key[:len(key)-len(rest)+1]
	return prefix, rest[1:], true
}

// indexOwners puts every session of an earlier release into the owner
// index, once per store.
func (r *Registry) indexOwners(ctx context.Context) error {
	var done bool
	err := r.st.Get(kindMeta, metaOwnerIndex, &done)
	if err == nil && done {
		return nil
	}
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("session: owner index: %w", err)
	}
	var batch store.Batch
	var werr error
	flush := func() {
		if batch.Len() > 0 {
			werr = r.st.Write(ctx, &batch)
			batch = store.Batch{}
		}
	}
	n := 0
	err = store.EachRecord(ctx, r.st, kindSession, "", func(id string, s *Session) bool {
		if werr = batch.Put(kindOwned, ownerKey(s.Tenant, s.Owner)+id, true); werr != nil {
			return false
		}
		n++
		if batch.Len() >= indexBatch {
			flush()
		}
		return werr == nil
	})
	if err == nil && werr == nil {
		flush()
	}
	if err == nil && werr == nil {
		werr = batch.Put(kindMeta, metaOwnerIndex, true)
		if werr == nil {
			werr = r.st.Write(ctx, &batch)
		}
	}
	if err = errors.Join(err, werr); err != nil {
		return fmt.Errorf("session: owner index: %w", err)
	}
	if n > 0 {
		r.log.Info("session: indexed the sessions of an earlier release by owner", "sessions", n)
	}
	return nil
}

// ownedCount returns how many sessions the owner with index prefix key
// holds: counted from the index the first time, then kept up to date by
// the registry. The caller does not hold r.mu.
func (r *Registry) ownedCount(key string) (int, error) {
	r.mu.Lock()
	n, known := r.owned[key]
	r.mu.Unlock()
	if known {
		return n, nil
	}
	count := 0
	err := r.st.RecordsWithPrefix(kindOwned, key, func(string, func(any) error) bool {
		count++
		return true
	})
	if err != nil {
		return 0, fmt.Errorf("session: count sessions: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// A count made meanwhile, and kept up since, wins over this one.
	if n, known = r.owned[key]; known {
		return n, nil
	}
	r.owned[key] = count
	return count, nil
}

// reserve takes one of the owner's session slots for a create, or refuses
// with ErrQuota; release gives it back when the create fails.
func (r *Registry) reserve(tenant, owner string) (release func(), err error) {
	key := ownerKey(tenant, owner)
	if _, err := r.ownedCount(key); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := r.owned[key]; n >= r.o.MaxPerOwner {
		return nil, quotaError(tenant, owner, n, r.o.MaxPerOwner)
	}
	r.owned[key]++
	return func() {
		r.mu.Lock()
		r.owned[key]--
		r.mu.Unlock()
	}, nil
}

// roomFor refuses a session made implicitly (Open) for an owner at its
// quota; the count moves when the session is written (Stage).
func (r *Registry) roomFor(tenant, owner string) error {
	key := ownerKey(tenant, owner)
	n, err := r.ownedCount(key)
	if err != nil {
		return err
	}
	if n >= r.o.MaxPerOwner {
		return quotaError(tenant, owner, n, r.o.MaxPerOwner)
	}
	return nil
}

// counted records a session written by Stage in the owner's count, if
// the count is kept yet (if not, counting the index will find it).
func (r *Registry) counted(tenant, owner string) {
	key := ownerKey(tenant, owner)
	r.mu.Lock()
	if _, known := r.owned[key]; known {
		r.owned[key]++
	}
	r.mu.Unlock()
}

// QuotaError is ErrQuota with the figures: what the owner holds and the
// most it may.
type QuotaError struct {
	Owner, Tenant string
	Held, Max     int
}

func (e *QuotaError) Error() string {
	who := strconv.Quote(e.Owner)
	if e.Tenant != "" {
		who += " of tenant " + strconv.Quote(e.Tenant)
	}
	return fmt.Sprintf("%v: %s holds %d sessions, and one principal may hold at most %d", ErrQuota, who, e.Held, e.Max)
}

// Details is what an error answer carries beside the message.
func (e *QuotaError) Details() any { return map[string]int{"held": e.Held, "max": e.Max} }

// Unwrap makes a QuotaError match ErrQuota.
func (e *QuotaError) Unwrap() error { return ErrQuota }

func quotaError(tenant, owner string, held, maximum int) error {
	return &QuotaError{Owner: owner, Tenant: tenant, Held: held, Max: maximum}
}

// listOwned is List through the owner index: the sessions of one owner, in
// id order, after req.After.
func (r *Registry) listOwned(ctx context.Context, req ListRequest) (ListPage, error) {
	var page ListPage
	var gerr error
	err := r.st.RecordsWithPrefix(kindOwned, ownerKey(req.Tenant, req.Owner), func(key string, _ func(any) error) bool {
		_, id, ok := parseOwned(key)
		if !ok || id <= req.After {
			return true
		}
		var s Session
		if gerr = r.st.Get(kindSession, id, &s); gerr != nil {
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
		err = gerr
	}
	if err != nil {
		return ListPage{}, fmt.Errorf("session: list: %w", err)
	}
	return page, nil
}
