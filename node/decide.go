package node

import (
	"context"
	"fmt"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/kernel"
)

// decider settles prompts for the channel adapters: the bridge holds the
// records, the kernel decides, as for an answer through the API.
type decider struct {
	k *kernel.Kernel
	b *bridge.Bridge
}

func (d decider) Get(actionID string) (bridge.Record, error) { return d.b.Get(actionID) }

func (d decider) Pending(owner string) []bridge.Record { return d.b.Pending(owner) }

// Decide settles rec; when the kernel refuses because the prompt is no
// longer pending, the record says how it was settled.
func (d decider) Decide(ctx context.Context, rec bridge.Record, dec kernel.Decision) (bridge.Record, error) {
	meta := kernel.Meta{Tenant: rec.Tenant}
	if dec.DecidedBy != nil {
		meta.Principal = dec.DecidedBy.Principal
	}
	after, err := d.k.ResolveApproval(ctx, rec.ExecutionID, rec.ActionID, dec, meta)
	if err != nil {
		if cur, gerr := d.b.Get(rec.ActionID); gerr == nil && cur.State != bridge.StatePending {
			return cur, fmt.Errorf("%w: %w", channel.ErrDecided, err)
		}
		return bridge.Record{}, err
	}
	after.Run()
	return d.b.Get(rec.ActionID)
}
