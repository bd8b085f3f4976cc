package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// Replication. In a cluster one node leads: its store hands every group,
// before anything else sees it, to a Replica (a stream the other nodes
// read), and counts the group committed only once the Replica holds it.
// The other nodes follow: they apply the groups they read, in the
// Replica's order, through their own Write, so that each keeps a whole
// store to lead from when its turn comes. Each group applied, led or
// followed, also writes its position in the Replica (replicatedKey), in
// the same write: after a crash, a node resumes reading right after what
// its store holds.
//
// A Replica may refuse a group: the leader then learns that it no longer
// leads (another node has appended since), and the group is not applied
// anywhere. Its writers get the error; the node must stop leading and
// follow again, which brings its store to the Replica's order.

// Replica is where a leading store makes each group durable before it
// counts it committed.
type Replica interface {
	// Replicate appends payload and returns its position, one above the
	// previous group's. An error means the group is not committed, or,
	// for a timeout, that it may be: either way this store stops leading.
	Replicate(ctx context.Context, payload []byte) (uint64, error)
}

// Replicated is one group read from a Replica, to apply on a follower.
type Replicated struct {
	Seq  uint64
	Data []byte
}

// Replication errors. Callers branch on them with errors.Is.
var (
	// ErrLeading is returned by Follow while the store leads.
	ErrLeading = errors.New("store: leading, not following")
	// ErrReplicaGap is returned by Follow for a group that is not the one
	// after the last applied: the replica lost groups this store needs.
	ErrReplicaGap = errors.New("store: replica has a gap")
	// ErrNotLeading is returned for writes refused because the store's
	// Replica refused an earlier group: it has stopped leading.
	ErrNotLeading = errors.New("store: no longer leading")
)

// replicatedKey holds the position in the Replica of the last group
// applied (8 bytes, big endian).
var replicatedKey = []byte("m/replicated")

// leader is the state of a leading store.
type leader struct {
	r Replica
	// deposed is set once r refused a group: later groups are refused
	// without asking it.
	deposed bool
}

// Replicated returns the position in the Replica of the last group this
// store applied, led or followed; zero before the first.
func (s *Store) Replicated() uint64 { return s.replicated.Load() }

// DurableReplicated returns the Replica's position of the last group this
// store holds durably: Replicated under SyncAlways; under SyncBatch, as of
// the journal's last sync; in memory, or under SyncNone before the first
// sync, what the store held when it was opened.
func (s *Store) DurableReplicated() uint64 {
	if s.opts.Sync == SyncAlways && s.journal != nil {
		return s.Replicated()
	}
	return s.replicatedSynced.Load()
}

// Lead makes every later group go to r first, then writes the term's first
// group: the store's epoch, so that a fresh cluster takes its first
// leader's, and r learns at once whether another node appended since this
// store's last group. On error the store does not lead.
func (s *Store) Lead(ctx context.Context, r Replica) error {
	s.leadMu.Lock()
	if s.leading.Load() != nil {
		s.leadMu.Unlock()
		return ErrLeading
	}
	s.leading.Store(&leader{r: r})
	s.leadMu.Unlock()
	b := &Batch{ops: []op{{key: epochKey, val: []byte(s.Epoch())}}}
	if err := s.Write(ctx, b); err != nil {
		s.leading.Store(nil)
		return fmt.Errorf("store: lead: %w", err)
	}
	return nil
}

// Unlead stops leading: later writes are refused with ErrNotLeading until
// the node follows again (Follow accepts groups once the store no longer
// leads).
func (s *Store) Unlead() {
	s.leadMu.Lock()
	defer s.leadMu.Unlock()
	s.leading.Store(nil)
}

// Leading reports whether the store leads and its Replica has refused
// nothing.
func (s *Store) Leading() bool {
	l := s.leading.Load()
	return l != nil && !l.deposed
}

// Follow applies groups read from the Replica, in one write: they must
// follow one another, the first right after Replicated. The store takes
// the epoch they carry.
func (s *Store) Follow(ctx context.Context, groups []Replicated) error {
	if len(groups) == 0 {
		return nil
	}
	if s.leading.Load() != nil {
		return ErrLeading
	}
	next := s.Replicated() + 1
	b := &Batch{}
	epoch := ""
	for _, g := range groups {
		if g.Seq != next {
			return fmt.Errorf("%w: group %d after %d", ErrReplicaGap, g.Seq, next-1)
		}
		next++
		ops, err := decodeReplica(g.Data)
		if err != nil {
			return fmt.Errorf("store: replicated group %d: %w", g.Seq, err)
		}
		for _, o := range ops {
			if string(o.key) == string(epochKey) && !o.del {
				epoch = string(o.val)
			}
			b.add(o)
		}
	}
	b.add(op{key: replicatedKey, val: binary.BigEndian.AppendUint64(nil, next-1)})
	b.follow = next - 1
	if err := s.Write(ctx, b); err != nil {
		return err
	}
	if epoch != "" {
		s.epoch.Store(&epoch)
	}
	return nil
}

// replicate hands g to the store's Replica when it leads, and adds the
// position it got to g's writes. A follower's groups carry theirs already.
func (s *Store) replicate(g *group) error {
	if g.follow > 0 {
		return nil
	}
	l := s.leading.Load()
	if l == nil || g.settleOnly {
		// Handing lazy writes to Badger is this node's own bookkeeping.
		return nil
	}
	if l.deposed {
		return ErrNotLeading
	}
	seq, err := l.r.Replicate(context.Background(), encodeReplica(nil, g.ops))
	if err != nil {
		s.leading.Store(&leader{r: l.r, deposed: true})
		return fmt.Errorf("%w: %w", ErrNotLeading, err)
	}
	marker := op{key: replicatedKey, val: binary.BigEndian.AppendUint64(nil, seq)}
	g.ops = append(g.ops[:len(g.ops):len(g.ops)], marker)
	g.replicated = seq
	return nil
}

// Replicated group payload: uvarint op count, then per op a flag byte
// (replicaDelete, replicaLazy, replicaFresh), uvarint key length, key, and
// for a set uvarint value length and value. The Replica checksums and
// orders it; the flags keep each write's path through the follower's
// store the leader's.
const (
	replicaDelete = 1 << iota
	replicaLazy
	replicaFresh
)

func encodeReplica(b []byte, ops []op) []byte {
	n := 0
	for _, o := range ops {
		if !bytes.Equal(o.key, settleKey) {
			n++
		}
	}
	b = binary.AppendUvarint(b, uint64(n))
	for _, o := range ops {
		if bytes.Equal(o.key, settleKey) {
			continue // this node's own bookkeeping
		}
		var f byte
		if o.del {
			f |= replicaDelete
		}
		if o.lazy {
			f |= replicaLazy
		}
		if o.fresh {
			f |= replicaFresh
		}
		b = append(b, f)
		b = binary.AppendUvarint(b, uint64(len(o.key)))
		b = append(b, o.key...)
		if !o.del {
			b = binary.AppendUvarint(b, uint64(len(o.val)))
			b = append(b, o.val...)
		}
	}
	return b
}

// decodeReplica parses a replicated group. The ops' keys and values alias
// p.
func decodeReplica(p []byte) ([]op, error) {
	n, k := binary.Uvarint(p)
	if k <= 0 || n > uint64(len(p)) {
		return nil, errRecord
	}
	p = p[k:]
	ops := make([]op, 0, min(n, 1024)) // n is not trusted for an allocation
	field := func() ([]byte, bool) {
		l, k := binary.Uvarint(p)
		if k <= 0 || l > uint64(len(p)-k) {
			return nil, false
		}
		v := p[k : k+int(l) : k+int(l)]
		p = p[k+int(l):]
		return v, true
	}
	for range n {
		if len(p) == 0 || p[0]&^(replicaDelete|replicaLazy|replicaFresh) != 0 {
			return nil, errRecord
		}
		f := p[0]
		o := op{del: f&replicaDelete != 0, lazy: f&replicaLazy != 0, fresh: f&replicaFresh != 0}
		p = p[1:]
		var ok bool
		if o.key, ok = field(); !ok || len(o.key) == 0 {
			return nil, errRecord
		}
		if !o.del {
			if o.val, ok = field(); !ok {
				return nil, errRecord
			}
		}
		ops = append(ops, o)
	}
	if len(p) != 0 {
		return nil, errRecord
	}
	return ops, nil
}

// loadReplicated reads the Replica's position the store holds.
func (s *Store) loadReplicated() error {
	err := s.view(func(txn *badger.Txn) error {
		item, err := txn.Get(replicatedKey)
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			if len(v) != 8 {
				return fmt.Errorf("%w: replicated position of %d bytes", errRecord, len(v))
			}
			s.replicated.Store(binary.BigEndian.Uint64(v))
			s.replicatedSynced.Store(binary.BigEndian.Uint64(v))
			return nil
		})
	})
	if err != nil && !errors.Is(err, badger.ErrKeyNotFound) {
		return fmt.Errorf("store: read replicated position: %w", err)
	}
	return nil
}
