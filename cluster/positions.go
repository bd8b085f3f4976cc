package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
)

// PositionsBucket holds, per node, the journal position its store holds:
// the leader drops the groups every node holds (see Journal.Purge).
const PositionsBucket = "gatehouse_positions"

// Positions is a handle on the positions bucket.
type Positions struct {
	kv jetstream.KeyValue
}

// Positions opens the positions bucket, creating it when the cluster has
// none.
func (n *Node) Positions(ctx context.Context) (*Positions, error) {
	kv, err := n.keyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      PositionsBucket,
		Description: "Gatehouse: the journal position each node's store holds",
		History:     1,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return nil, err
	}
	return &Positions{kv: kv}, nil
}

// Report records that node's store holds the journal up to pos.
func (p *Positions) Report(ctx context.Context, node string, pos uint64) error {
	if _, err := p.kv.Put(ctx, node, strconv.AppendUint(nil, pos, 10)); err != nil {
		return fmt.Errorf("cluster: report position: %w", err)
	}
	return nil
}

// All returns every node's reported position.
func (p *Positions) All(ctx context.Context) (map[string]uint64, error) {
	keys, err := p.kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return map[string]uint64{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: positions: %w", err)
	}
	out := make(map[string]uint64, len(keys))
	for _, k := range keys {
		e, err := p.kv.Get(ctx, k)
		if err != nil {
			continue // deleted meanwhile
		}
		v, err := strconv.ParseUint(string(e.Value()), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("cluster: position of %s: %w", k, err)
		}
		out[k] = v
	}
	return out, nil
}

// Peers returns the names of the JetStream meta group's members, this
// node's among them; none when this node runs no server (a deployment
// joined by URL).
func (n *Node) Peers() []string {
	if n.srv == nil {
		return nil
	}
	out := []string{n.srv.Name()}
	if js, err := n.srv.Jsz(nil); err == nil && js.Meta != nil {
		for _, r := range js.Meta.Replicas {
			out = append(out, r.Name)
		}
	}
	return out
}

// Name returns this node's name in the cluster.
func (n *Node) Name() string { return n.o.NodeName }
