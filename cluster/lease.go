package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Leadership. One node of a cluster leads: it runs the kernel and appends
// to the journal; the others follow. Who leads is one key of a JetStream
// key-value bucket whose entries expire LeaseTTL after their last write:
// the leader rewrites it every LeaseTTL/4 with compare-and-set on its
// revision; a node that finds the key absent creates it, and one that sees
// its revision unchanged for LeaseTTL takes it over (see Campaign). The
// lease says who should lead; the journal's
// fencing (see Writer) is what keeps a node that lost it, unknowing, from
// committing anything.

// LeaseBucket is the bucket of the leader's lease, LeaseKey its key.
const (
	LeaseBucket = "gatehouse_leader"
	LeaseKey    = "kernel"
)

// LeaseTTL is how long a lease outlives its leader's last renewal: with
// the time a new leader takes to catch up and start, the time from a
// leader's loss to new work flowing.
const LeaseTTL = 2 * time.Second

// ErrNoLeader is returned by Leader while no node holds the lease.
var ErrNoLeader = errors.New("cluster: no leader")

// Leases is a handle on the lease bucket.
type Leases struct {
	kv jetstream.KeyValue
}

// Leases opens the lease bucket, creating it when the cluster has none.
func (n *Node) Leases(ctx context.Context) (*Leases, error) {
	kv, err := n.keyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      LeaseBucket,
		Description: "Gatehouse: which node leads",
		TTL:         LeaseTTL,
		History:     1,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return nil, err
	}
	return &Leases{kv: kv}, nil
}

// keyValue opens the bucket cfg describes, creating it when the cluster
// has none. Right after the meta leader is elected, creation may fail for
// want of peers, or its answer be lost while the nodes race to create it:
// it is retried, each try bounded, within ReadyTimeout. Its replicas are
// the bucket's stream's (see replicas).
func (n *Node) keyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	ctx, cancel := context.WithTimeout(ctx, n.o.ReadyTimeout)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(ctx, journalTimeout)
		var (
			kv  jetstream.KeyValue
			err error
		)
		if cfg.Replicas, err = n.replicas(actx, "KV_"+cfg.Bucket); err == nil {
			kv, err = n.js.CreateOrUpdateKeyValue(actx, cfg)
		}
		acancel()
		if err == nil {
			return kv, nil
		}
		if cause := n.accountRefusal(err); cause != nil {
			return nil, fmt.Errorf("%w: bucket %s: %w", ErrAccount, cfg.Bucket, cause)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: bucket %s: %w", ErrNotReady, cfg.Bucket, err)
		case <-time.After(readyPoll):
		}
	}
}

// Leader returns the value the current leader wrote with its lease.
func (l *Leases) Leader(ctx context.Context) ([]byte, error) {
	e, err := l.kv.Get(ctx, LeaseKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, ErrNoLeader
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: read lease: %w", err)
	}
	return e.Value(), nil
}

// Campaign returns once this node holds the lease, with value in it, or
// with ctx's error. It looks every LeaseTTL/8: it creates the key when
// there is none, and takes it over, with compare-and-set on the revision
// it saw, once that revision has not changed for LeaseTTL by this node's
// own clock: the holder stopped renewing. It does not wait for the
// bucket to expire the key, which a stream that has just changed leader
// may do seconds late, and no two nodes' clocks are compared.
func (l *Leases) Campaign(ctx context.Context, value []byte) (*Lease, error) {
	t := time.NewTicker(LeaseTTL / 8)
	defer t.Stop()
	var (
		seen  uint64    // the holder's revision last seen
		since time.Time // when seen was first seen
	)
	for {
		cctx, cancel := context.WithTimeout(ctx, LeaseTTL/2)
		rev, err := l.take(cctx, value, &seen, &since)
		cancel()
		if err == nil && rev > 0 {
			ls := &Lease{kv: l.kv, rev: rev, value: value, lost: make(chan struct{}), stop: make(chan struct{}), renewed: time.Now()}
			ls.wg.Add(1)
			go ls.keep()
			return ls, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// take makes one try at the lease: the revision it now holds, or zero
// while another node's holds.
func (l *Leases) take(ctx context.Context, value []byte, seen *uint64, since *time.Time) (uint64, error) {
	e, err := l.kv.Get(ctx, LeaseKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return l.kv.Create(ctx, LeaseKey, value)
	case err != nil:
		return 0, err
	case e.Revision() != *seen:
		*seen, *since = e.Revision(), time.Now()
		return 0, nil
	case time.Since(*since) < LeaseTTL:
		return 0, nil
	}
	return l.kv.Update(ctx, LeaseKey, value, e.Revision())
}

// Lease is this node's hold on leadership, renewed until Release or until
// it is lost.
type Lease struct {
	kv      jetstream.KeyValue
	rev     uint64
	value   []byte
	renewed time.Time
	lost    chan struct{}
	stop    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

// Lost is closed when the lease is lost: a renewal was refused (another
// node holds it) or none succeeded for LeaseTTL/2, after which another
// node may be about to take it.
func (ls *Lease) Lost() <-chan struct{} { return ls.lost }

// keep renews the lease every LeaseTTL/4.
func (ls *Lease) keep() {
	defer ls.wg.Done()
	t := time.NewTicker(LeaseTTL / 4)
	defer t.Stop()
	for {
		select {
		case <-ls.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), LeaseTTL/4)
		rev, err := ls.kv.Update(ctx, LeaseKey, ls.value, ls.rev)
		cancel()
		switch {
		case err == nil:
			ls.rev, ls.renewed = rev, time.Now()
		case isWrongLast(err), time.Since(ls.renewed) > LeaseTTL/2:
			ls.once.Do(func() { close(ls.lost) })
			return
		}
	}
}

// Release gives the lease up, so that another node need not wait for it
// to expire.
func (ls *Lease) Release(ctx context.Context) {
	close(ls.stop)
	ls.wg.Wait()
	select {
	case <-ls.lost:
		return
	default:
	}
	ls.once.Do(func() { close(ls.lost) })
	_ = ls.kv.Delete(ctx, LeaseKey, jetstream.LastRevision(ls.rev))
}

// isWrongLast reports a compare-and-set refused: another write came first.
func isWrongLast(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
