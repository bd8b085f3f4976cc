package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// placeTimeout bounds each request of Gather.
const placeTimeout = 2 * time.Second

// Gather asks JetStream to move the leadership of the journal's stream
// and of the lease's bucket to this node's server (the embedded one, or
// the one of a deployment joined by URL that this node is connected to),
// each that another server leads and this one holds a replica of. (The
// meta group's is the system account's to move, not Gatehouse's.) A
// cluster runs one kernel, whose every write goes through the journal's
// leader and whose lease through the bucket's: with all of them on the
// kernel's server, losing any other server interrupts nothing, and losing
// that one costs one round of elections, held at once, instead of one
// after another. It is a preference, not a rule: JetStream moves them
// again as it must, and Gather reports what it could not move (on a
// deployment, an account may lack the right to ask). It touches no other
// stream.
func (n *Node) Gather(ctx context.Context) error {
	var name string
	switch {
	case n.srv != nil && n.o.Name != "":
		name = n.srv.Name()
	case n.srv == nil:
		name = n.nc.ConnectedServerName()
	}
	if name == "" {
		return nil // one server alone: nothing to move
	}
	var errs []error
	for _, stream := range []string{JournalStream, "KV_" + LeaseBucket} {
		s, err := n.js.Stream(ctx, stream)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		info, err := s.Info(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if info.Cluster == nil || info.Cluster.Leader == name ||
			!slices.ContainsFunc(info.Cluster.Replicas, func(p *jetstream.PeerInfo) bool { return p.Name == name }) {
			continue
		}
		errs = append(errs, n.stepDown(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, name))
	}
	return errors.Join(errs...)
}

// stepDown asks the leader behind subject to hand its group to preferred.
func (n *Node) stepDown(ctx context.Context, subject, preferred string) error {
	req, err := json.Marshal(map[string]any{"placement": map[string]string{"preferred": preferred}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, placeTimeout)
	defer cancel()
	msg, err := n.nc.RequestWithContext(ctx, subject, req)
	if err != nil {
		return fmt.Errorf("cluster: %s: %w", subject, err)
	}
	var resp struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return fmt.Errorf("cluster: %s: %w", subject, err)
	}
	if resp.Error != nil {
		return fmt.Errorf("cluster: %s: %w", subject, resp.Error)
	}
	return nil
}
