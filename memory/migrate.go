package memory

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/store"
)

// kindLegacy is the record kind of the notes an earlier version kept, one
// record per note with its content, per tenant: id tenant (length-prefixed)
// + path. Their index was rebuilt in memory at every start.
const kindLegacy = "memnote"

// legacyNote is a note as an earlier version stored it.
type legacyNote struct {
	Path      string    `msgpack:"p"`
	Content   string    `msgpack:"c"`
	Version   uint64    `msgpack:"v"`
	CreatedAt time.Time `msgpack:"ca"`
	UpdatedAt time.Time `msgpack:"ua"`
}

// migrate moves every note of the earlier layout, with its path, content,
// version and times, and indexes it: a tenant's note into the tenant's
// shared space, where every principal that could read it before still can
// (by naming that space); a note without a tenant into LegacyOwner's own
// space when the deployment has one principal (who wrote them all), else
// into the shared space of the principals without a tenant. Each note
// moves in one batch with the deletion of its old record, so a move cut
// short by a crash goes on at the next start where it stopped. Quotas do
// not apply: notes kept before must stay readable.
func (n *Notes) migrate(ctx context.Context) error {
	moved := 0
	start := time.Now()
	var werr error
	err := store.EachRecord(ctx, n.o.Store, kindLegacy, "", func(id string, old *legacyNote) bool {
		ten, ok := legacyTenant(id)
		if !ok {
			werr = fmt.Errorf("malformed record id %q of an earlier version's note", id)
			return false
		}
		if moved == 0 {
			n.o.Logger.Info("memory: moving the notes of an earlier release into spaces", "tenantless_to", cmp.Or(n.o.LegacyOwner, "the tenantless' shared space"))
		}
		sp := Space{Tenant: ten, Shared: true}
		if ten == "" && n.o.LegacyOwner != "" {
			sp = Space{Principal: n.o.LegacyOwner}
		}
		werr = n.move(ctx, id, sp, old)
		moved++
		return werr == nil
	})
	if err == nil {
		err = werr
	}
	if err != nil {
		return fmt.Errorf("migrate notes: %w", err)
	}
	if moved > 0 {
		n.o.Logger.Info("memory: notes moved", "notes", moved, "took", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// move writes old into sp, unless a note is there already, and deletes
// record id, in one batch.
func (n *Notes) move(ctx context.Context, id string, sp Space, old *legacyNote) error {
	var b store.Batch
	if _, exists, err := n.read(sp, old.Path); err != nil {
		return err
	} else if !exists {
		note := Note{Path: old.Path, Content: old.Content, Version: old.Version, CreatedAt: old.CreatedAt, UpdatedAt: old.UpdatedAt}
		if err := n.stage(&b, sp, &Note{}, false, &note, false); err != nil {
			return err
		}
	}
	b.Delete(kindLegacy, id)
	return n.o.Store.Write(ctx, &b)
}

// legacyTenant is the tenant of an earlier version's note record id.
func legacyTenant(id string) (string, bool) {
	l, rest, ok := strings.Cut(id, ":")
	n, err := strconv.Atoi(l)
	if !ok || err != nil || n < 0 || n > len(rest) {
		return "", false
	}
	return rest[:n], true
}
