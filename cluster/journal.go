package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The cluster's journal: one JetStream stream that the leading node
// appends each of its store's commit groups to and the other nodes read
// and apply, so that every node holds the whole store and any can lead
// next. Appends are fenced: each says which sequence it follows
// (Nats-Expected-Last-Sequence), so once another node has appended, a
// node that still believes it leads (paused, cut off) has its next append
// refused, and commits nothing more. The stream's own replication (R3 in
// a cluster of three or more) is what makes an append durable: an append
// is acknowledged once a quorum of the stream's replicas hold it.

// JournalStream is the name of the journal's stream, and JournalSubject
// the subject its groups are published on.
const (
	JournalStream  = "GATEHOUSE_JOURNAL"
	JournalSubject = "gatehouse.journal"
)

// MaxGroupBytes bounds one appended group. The embedded server's
// max_payload is set above it; a deployment joined with Options.URL must
// allow it too (Journal checks).
const MaxGroupBytes = 24 << 20

// JournalMaxBytes bounds the journal's stream.
const JournalMaxBytes = 4 << 30

// journalTimeout bounds one append's wait for its acknowledgement; an
// append is retried (with the same message id, so that it is stored once)
// until appendBudget has passed.
const (
	journalTimeout = 2 * time.Second
	appendBudget   = 6 * time.Second
)

// Journal errors. Callers branch on them with errors.Is.
var (
	// ErrFenced is returned by Append when another node appended since
	// the sequence this one follows: it no longer leads.
	ErrFenced = errors.New("cluster: journal fenced: another node appended")
	// ErrGroupTooLarge is returned by Append for a group over
	// MaxGroupBytes.
	ErrGroupTooLarge = errors.New("cluster: group too large for the journal")
)

// Journal is a handle on the cluster's journal stream.
type Journal struct {
	js     jetstream.JetStream
	stream jetstream.Stream
}

// Entry is one group read from the journal.
type Entry struct {
	Seq  uint64
	Data []byte
}

// Journal opens the journal's stream, creating it when the cluster has
// none, replicated as replicas says.
func (n *Node) Journal(ctx context.Context) (*Journal, error) {
	if max := n.nc.MaxPayload(); max < MaxGroupBytes+4096 {
		return nil, fmt.Errorf("%w: the NATS servers allow messages of %d bytes; the journal needs %d (max_payload)", ErrConfig, max, MaxGroupBytes+4096)
	}
	cfg := jetstream.StreamConfig{
		Name:        JournalStream,
		Description: "Gatehouse: the leading node's commit groups, applied by every node",
		Subjects:    []string{JournalSubject},
		Storage:     jetstream.FileStorage,
		MaxMsgSize:  MaxGroupBytes + 4096,
		// The leader purges what every node holds (see Purge); the bound
		// is for a node down so long that it holds the purge back: past
		// it, that node finds a gap and must be seeded again.
		MaxBytes: JournalMaxBytes,
		Discard:  jetstream.DiscardOld,
		// Retries of one append carry its message id: stored once.
		Duplicates: 2 * appendBudget,
	}
	ctx, cancel := context.WithTimeout(ctx, n.o.ReadyTimeout)
	defer cancel()
	var (
		s   jetstream.Stream
		err error
	)
	// Right after the meta leader is elected, stream creation may still
	// fail for want of peers, or its answer be lost while the nodes race
	// to create it: retried, each try bounded, within ReadyTimeout.
	for {
		actx, acancel := context.WithTimeout(ctx, journalTimeout)
		if cfg.Replicas, err = n.replicas(actx, JournalStream); err == nil {
			s, err = n.js.CreateOrUpdateStream(actx, cfg)
		}
		acancel()
		if err == nil {
			return &Journal{js: n.js, stream: s}, nil
		}
		if cause := n.accountRefusal(err); cause != nil {
			return nil, fmt.Errorf("%w: journal stream (%d replicas of at most %d bytes): %w", ErrAccount, cfg.Replicas, JournalMaxBytes, cause)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: journal stream: %w", ErrNotReady, err)
		case <-time.After(readyPoll):
		}
	}
}

// replicas is the replica count of the cluster's stream named stream.
//
// An embedded cluster's is three in a cluster of three or more nodes,
// every node in a smaller one. The cluster's size is the one configured
// (the peer list, this node's route among them or not), not the meta
// group's at the time, which may not have heard of every node yet: a
// journal created on two replicas of three nodes would stall for good
// when one of its two is lost.
//
// On a deployment joined with URL it is Options.Replicas when set;
// otherwise an existing stream keeps its own (the operator's choice, or
// the first member's, so that members do not scale it back and forth),
// and a new one gets three on a clustered deployment and one on a server
// alone, which refuses more.
func (n *Node) replicas(ctx context.Context, stream string) (int, error) {
	if n.srv != nil {
		meta := 0
		if js, err := n.srv.Jsz(nil); err == nil && js.Meta != nil {
			meta = js.Meta.Size
		}
		return replicasOf(n.o, meta), nil
	}
	if n.o.Replicas > 0 {
		return n.o.Replicas, nil
	}
	s, err := n.js.Stream(ctx, stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return externalReplicas(n.nc.ConnectedClusterName()), nil
	case err != nil:
		return 0, fmt.Errorf("cluster: stream %s: %w", stream, err)
	}
	return s.CachedInfo().Config.Replicas, nil
}

// externalReplicas is the replica count of a new stream on a deployment
// whose server names cluster as its own: none on a server alone.
func externalReplicas(cluster string) int {
	if cluster == "" {
		return 1
	}
	return 3
}

// replicasOf is replicas for a node configured with o, whose meta group
// has meta members now.
func replicasOf(o Options, meta int) int {
	if o.Name == "" {
		return 1
	}
	size := len(o.Peers)
	if !slices.Contains(o.Peers, o.Listen) {
		size++
	}
	return min(3, max(size, meta))
}

// Last returns the sequence of the journal's last group; zero when empty.
func (j *Journal) Last(ctx context.Context) (uint64, error) {
	info, err := j.stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("cluster: journal state: %w", err)
	}
	return info.State.LastSeq, nil
}

// Writer appends to the journal after sequence after: the first append
// succeeds only if the journal's last group is still after.
func (j *Journal) Writer(after uint64) *Writer {
	var id [8]byte
	_, _ = rand.Read(id[:])
	return &Writer{j: j, last: after, term: hex.EncodeToString(id[:])}
}

// Writer appends groups to the journal, each after the one before. It is
// used from one goroutine at a time (the store's committer).
type Writer struct {
	j    *Journal
	last uint64
	// term names this writer in its appends' message ids, so that a
	// retried append is stored once and another writer's is never taken
	// for it.
	term string
}

// Append appends data after the writer's last group and returns its
// sequence. ErrFenced means another node appended first: nothing was
// stored, and no later append by this writer can succeed.
func (w *Writer) Append(ctx context.Context, data []byte) (uint64, error) {
	if len(data) > MaxGroupBytes {
		return 0, fmt.Errorf("%w: %d bytes", ErrGroupTooLarge, len(data))
	}
	msg := &nats.Msg{Subject: JournalSubject, Data: data, Header: nats.Header{}}
	id := w.term + "." + strconv.FormatUint(w.last+1, 10)
	deadline := time.Now().Add(appendBudget)
	for {
		actx, cancel := context.WithTimeout(ctx, journalTimeout)
		ack, err := w.j.js.PublishMsg(actx, msg, jetstream.WithMsgID(id), jetstream.WithExpectLastSequence(w.last))
		cancel()
		if err == nil {
			if ack.Sequence != w.last+1 {
				// A duplicate's acknowledgement names the first copy,
				// which is where this group is.
				return 0, fmt.Errorf("%w: appended at %d after %d", ErrFenced, ack.Sequence, w.last)
			}
			w.last = ack.Sequence
			return ack.Sequence, nil
		}
		if isWrongLast(err) {
			return 0, fmt.Errorf("%w (after %d)", ErrFenced, w.last)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, fmt.Errorf("cluster: journal append: %w", err)
		}
		// No responders or a lost acknowledgement: the stream may be
		// electing a leader. Retried with the same id.
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Reader reads the journal in order from a sequence on.
type Reader struct {
	cc   jetstream.ConsumeContext
	msgs chan Entry
	done chan struct{}
}

// readerBuffer bounds the groups a reader holds that Next has not
// returned; readerBytes the bytes its consumer pulls ahead.
const (
	readerBuffer = 256
	readerBytes  = 64 << 20
)

// Reader reads the groups after sequence after, until Stop.
func (j *Journal) Reader(ctx context.Context, after uint64) (*Reader, error) {
	c, err := j.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{JournalSubject},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    after + 1,
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: journal reader: %w", err)
	}
	r := &Reader{msgs: make(chan Entry, readerBuffer), done: make(chan struct{})}
	r.cc, err = c.Consume(func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err != nil {
			return // not a JetStream message: nothing to apply
		}
		select {
		case r.msgs <- Entry{Seq: md.Sequence.Stream, Data: m.Data()}:
		case <-r.done:
		}
	}, jetstream.PullMaxBytes(readerBytes))
	if err != nil {
		return nil, fmt.Errorf("cluster: journal reader: %w", err)
	}
	return r, nil
}

// Next returns the groups available, at most maxCount and, past the
// first, at most maxBytes, waiting up to wait for the first (not at all
// when wait is zero). None within wait is not an error.
func (r *Reader) Next(ctx context.Context, maxCount, maxBytes int, wait time.Duration) ([]Entry, error) {
	var out []Entry
	select {
	case e := <-r.msgs:
		out = append(out, e)
	default:
		if wait <= 0 {
			return nil, nil
		}
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case e := <-r.msgs:
			out = append(out, e)
		case <-t.C:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	size := len(out[0].Data)
	for len(out) < maxCount && size < maxBytes {
		select {
		case e := <-r.msgs:
			out = append(out, e)
			size += len(e.Data)
			continue
		default:
		}
		break
	}
	return out, nil
}

// Stop ends the reader.
func (r *Reader) Stop() {
	close(r.done)
	r.cc.Stop()
}

// Purge drops the journal's groups below sequence before: every node's
// store holds them.
func (j *Journal) Purge(ctx context.Context, before uint64) error {
	if err := j.stream.Purge(ctx, jetstream.WithPurgeSequence(before)); err != nil {
		return fmt.Errorf("cluster: journal purge: %w", err)
	}
	return nil
}
