package node

import (
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/store"
)

// hubDeliverer adapts a peer hub to the kernel's delivery interface: the
// kernel names peers, the hub keeps their outboxes, and neither knows the
// other.
type hubDeliverer struct{ h *peer.Hub }

func key(p kernel.Peer) peer.Key { return peer.Key{Role: p.Role, ID: p.ID, Consumer: p.Consumer} }

func (d hubDeliverer) Stage(b *store.Batch, p kernel.Peer, typ string, data []byte, settle string) kernel.Staged {
	return d.h.Stage(b, key(p), typ, data, settle)
}

func (d hubDeliverer) Settle(b *store.Batch, p kernel.Peer, settle string) func() {
	return d.h.Settle(b, key(p), settle)
}

func (d hubDeliverer) Forget(p kernel.Peer) { d.h.Forget(key(p)) }
