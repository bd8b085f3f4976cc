package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel/policy"
	"github.com/gatehouse-dev/gatehouse/relay"
	"github.com/gatehouse-dev/gatehouse/store"
)

// A cluster of several nodes (Options.Cluster with a cluster name or a
// NATS URL) runs one kernel: the leader's. Every node keeps a whole store,
// the leader's groups applied in the order of the cluster's journal (see
// cluster.Journal and store.Lead); every node accepts every client, and a
// follower relays each connection it accepts to the leader (see relay).
// When the leader is lost, the node that takes its lease catches up with
// the journal, fences the old leader out of it with its first group, and
// starts the kernel from its store, as a single node does after a restart.

// Member errors. Callers branch on them with errors.Is.
var (
	// ErrNoAdvertise is returned by OpenMember when the node's listen
	// address names no host the other nodes could relay to and
	// Options.Advertise is empty.
	ErrNoAdvertise = errors.New("node: a cluster member needs an address the other nodes can reach (--cluster-advertise)")
)

// Clustered reports whether o makes a node a member of a cluster of
// several, which OpenMember opens (Open opens every other node).
func (o *Options) Clustered() bool {
	return o.Cluster.Name != "" || o.Cluster.URL != ""
}

// Member is a node of a cluster: it follows the leader, relaying its
// clients there, and leads when it holds the lease.
type Member struct {
	o       Options
	log     *slog.Logger
	store   *store.Store
	nats    *cluster.Node
	journal *cluster.Journal
	leases  *cluster.Leases
	// positions has each node's journal position, for the purge.
	positions *cluster.Positions
	name      string // this node's name in the cluster
	authn     *auth.Authenticator
	board     *switchboard
	lease     []byte // this node's lease value: its leaderInfo
	dialTLS   *tls.Config
	// peers are the other nodes' addresses, which the leader's gateway
	// does not bound per address.
	peers *peerAddrs

	// serving is the node while this member leads, for tests and status.
	serving atomic.Pointer[Node]
	// gap is set when the journal no longer holds groups this node's
	// store needs: it cannot follow, nor lead.
	gap atomic.Bool
	// relays counts what this member's relays have done, across the
	// periods it followed.
	relays relayCounts

	cancel context.CancelFunc
	done   chan struct{} // closed when run has returned
	kept   chan struct{} // closed when keepPositions has returned
}

// leaderInfo is the value of the leader's lease.
type leaderInfo struct {
	Node string `json:"node"`
	Addr string `json:"addr"`
}

// followBatch bounds one apply of a follower: groups and bytes.
const (
	followCount = 256
	followBytes = 16 << 20
)

// OpenMember opens the store and the NATS side, starts serving o.Addr and
// joins the cluster's election. It returns once the node serves: as a
// follower, relaying, until it leads.
func OpenMember(ctx context.Context, o Options) (_ *Member, err error) {
	o.defaults()
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Policy == nil {
		o.Policy = policy.Default()
	}
	if o.InMemory {
		return nil, fmt.Errorf("%w: a cluster member keeps its store in its data folder", cluster.ErrConfig)
	}
	adv := o.Advertise
	if adv == "" {
		host, _, _ := net.SplitHostPort(o.Addr)
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			return nil, ErrNoAdvertise
		}
		adv = o.Addr
	}
	m := &Member{o: o, log: o.Logger, done: make(chan struct{}), kept: make(chan struct{})}
	var undo closers
	defer func() {
		if err != nil {
			err = errors.Join(err, undo.close(context.Background()))
		}
	}()
	if m.authn, err = auth.New(o.Auth); err != nil {
		return nil, err
	}
	if m.authn.Open() && !o.InsecureNoAuth {
		if err := requireLoopback(ctx, o.Addr); err != nil {
			return nil, err
		}
	}
	// The journal's stream is a cluster's durable point: with --sync
	// always it syncs every group on a quorum of nodes before the leader
	// counts it. A member's own store need not sync each group too: after
	// a crash it holds a prefix of the journal, and reads the rest again.
	// It reports only what it holds durably (see keepPositions), so the
	// purge never drops what a power cut could take from it.
	if m.store, err = openMemberStore(o); err != nil {
		return nil, err
	}
	undo.push(func(context.Context) error { return m.store.Close() })
	co := o.Cluster
	co.Dir, co.Logger, co.SyncAlways = cluster.DataDir(o.Data), o.Logger, o.Sync == store.SyncAlways
	if m.nats, err = cluster.Start(ctx, co); err != nil {
		return nil, err
	}
	undo.push(func(context.Context) error { m.nats.Close(); return nil })
	if m.journal, err = m.nats.Journal(ctx); err != nil {
		return nil, err
	}
	if m.leases, err = m.nats.Leases(ctx); err != nil {
		return nil, err
	}
	if m.positions, err = m.nats.Positions(ctx); err != nil {
		return nil, err
	}
	m.name = m.nats.Name()
	m.peers = &peerAddrs{read: m.nats.PeerAddrs}
	if o.TLS != nil {
		if m.dialTLS, err = relayTLS(o.Cluster.RouteTLS.CA); err != nil {
			return nil, err
		}
	}
	if m.lease, err = json.Marshal(leaderInfo{Node: m.name, Addr: adv}); err != nil {
		return nil, err
	}
	ln, err := gateway.Listen(o.Addr, o.TLS)
	if err != nil {
		return nil, err
	}
	m.board = newSwitchboard(ln)
	undo.push(func(context.Context) error { return m.board.close() })
	m.log = o.Logger.With("node", m.name)
	rctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go m.run(rctx)
	go m.keepPositions(rctx)
	return m, nil
}

// memberSyncInterval is how often a member's store syncs its own journal
// under --sync always. The cluster's durable point is then the journal's
// stream, which syncs every group on a quorum before the leader counts it:
// the store's own syncs back only the position the member reports (see
// keepPositions), every positionEvery. Syncing every 10 ms, the store's
// default, cost each node up to a hundred fsyncs a second under load, and
// gave nothing the cluster relies on.
const memberSyncInterval = time.Second

// openMemberStore opens a member's store as openStore does a single node's,
// but under --sync always without syncing each group (see OpenMember).
func openMemberStore(o Options) (*store.Store, error) {
	so := store.Options{Dir: o.Data, Sync: o.Sync, Logger: o.Logger,
		DiskBudget: o.DiskBudget, LowWater: o.DiskLowWater, MemoryLimit: o.MemoryLimit}
	if o.Sync == store.SyncAlways {
		so.Sync, so.SyncInterval = store.SyncBatch, memberSyncInterval
	}
	return store.Open(so)
}

// relayTLS is how a follower dials a leader that serves TLS: verified
// against caFile, or the system's roots.
func relayTLS(caFile string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile == "" {
		return c, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", cluster.ErrConfig, err)
	}
	c.RootCAs = x509.NewCertPool()
	if !c.RootCAs.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: %s holds no certificate", cluster.ErrConfig, caFile)
	}
	return c, nil
}

// Addr returns the address the member listens on.
func (m *Member) Addr() net.Addr { return m.board.ln.Addr() }

// Leading returns the node this member runs while it leads, or nil.
func (m *Member) Leading() *Node { return m.serving.Load() }

// Store returns the member's store.
func (m *Member) Store() *store.Store { return m.store }

// Close stops serving, gives the lease up when leading, and closes the
// node, the NATS side and the store.
func (m *Member) Close(ctx context.Context) error {
	m.cancel()
	<-m.done
	<-m.kept
	var errs []error
	errs = append(errs, m.board.close())
	m.nats.Close()
	errs = append(errs, m.store.Close())
	return errors.Join(errs...)
}

// run follows and leads in turn until ctx ends.
func (m *Member) run(ctx context.Context) {
	defer close(m.done)
	rel := m.startRelay()
	for {
		lease := m.follow(ctx)
		if lease == nil {
			m.stopRelay(rel)
			return
		}
		rel = m.lead(ctx, lease, rel)
	}
}

// relayed is a relay serving the switchboard's connections.
type relayed struct {
	r      *relay.Relay
	served chan error
}

// startRelay serves the member's connections with a relay to the leader.
func (m *Member) startRelay() relayed {
	r := relay.New(relay.Options{
		Leader:     m.leaderAddr,
		Local:      m.local,
		LocalPaths: []string{"/v0/health", ClusterPath},
		DialTLS:    m.dialTLS,
		// A client meets the leader's bounds on every node.
		MaxBodyBytes:  m.o.Server.MaxBodyBytes,
		HeaderTimeout: m.o.Server.HeaderTimeout,
		ReadTimeout:   m.o.Server.ReadTimeout,
		IdleTimeout:   m.o.Server.IdleTimeout,
		WriteTimeout:  m.o.Server.WriteTimeout,
		MaxConnsPerIP: m.o.Server.MaxConnsPerIP,
		MaxConns:      m.o.Server.MaxConns,
		Logger:        m.log,
	})
	ln := m.board.take()
	served := make(chan error, 1)
	m.relays.start(r)
	go func() { served <- r.Serve(ln) }()
	return relayed{r: r, served: served}
}

// stopRelay ends a relay and the connections it relays.
func (m *Member) stopRelay(r relayed) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.r.Shutdown(ctx); err != nil {
		m.log.Warn("relay shutdown", "err", err)
	}
	<-r.served
	m.relays.stop(r.r)
}

// relayCounts sums the counters of a member's relays: a relay serves one
// period of following, and a node may follow many times in its life.
type relayCounts struct {
	mu   sync.Mutex
	past relay.Stats // the stopped relays', Open aside
	cur  *relay.Relay
}

func (c *relayCounts) start(r *relay.Relay) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cur = r
}

// stop adds r's final counters to the sum.
func (c *relayCounts) stop(r *relay.Relay) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := r.Stats()
	s.Open = 0
	c.past = c.past.Add(s)
	if c.cur == r {
		c.cur = nil
	}
}

// sum returns the counters of every relay so far, and the connections the
// running one relays now.
func (c *relayCounts) sum() relay.Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil {
		return c.past
	}
	return c.past.Add(c.cur.Stats())
}

// leaderAddr returns the leader's address, waiting for one within ctx.
func (m *Member) leaderAddr(ctx context.Context) (string, error) {
	t := time.NewTicker(cluster.LeaseTTL / 8)
	defer t.Stop()
	for {
		v, err := m.leases.Leader(ctx)
		if err == nil {
			var li leaderInfo
			if err := json.Unmarshal(v, &li); err != nil {
				return "", fmt.Errorf("node: lease value: %w", err)
			}
			if li.Node == m.name && m.serving.Load() == nil {
				// This node holds the lease but does not serve yet: a
				// relay to itself would loop.
				err = cluster.ErrNoLeader
			} else {
				return li.Addr, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%w: %w", cluster.ErrNoLeader, ctx.Err())
		case <-t.C:
		}
	}
}

// follow applies the journal to the store and campaigns for the lease; it
// returns the lease once this node holds it and its store holds the whole
// journal, or nil when ctx ends.
func (m *Member) follow(ctx context.Context) *cluster.Lease {
	fctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = m.apply(fctx)
	}()
	defer func() {
		stop()
		wg.Wait()
	}()
	for {
		if m.gap.Load() {
			// A store with a gap must not lead: it waits to be restarted
			// on a copy of a follower's data folder.
			<-ctx.Done()
			return nil
		}
		cctx, cancel := context.WithTimeout(fctx, time.Second)
		lease, err := m.leases.Campaign(cctx, m.lease)
		cancel()
		if err == nil {
			if m.caughtUp(fctx, lease) {
				return lease
			}
			m.releaseLease(lease)
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// caughtUp waits, while lease holds, until the store holds the journal's
// last group, read once the lease was won: whatever a former leader
// appended is then applied here. The reader that follows goes on
// meanwhile, so no consumer need be created now, when the node that lost
// its lease may have taken JetStream's meta leader with it.
func (m *Member) caughtUp(ctx context.Context, lease *cluster.Lease) bool {
	var last uint64
	for {
		lctx, cancel := context.WithTimeout(ctx, time.Second)
		l, err := m.journal.Last(lctx)
		cancel()
		if err == nil {
			last = l
			break
		}
		select {
		case <-lease.Lost():
			return false
		case <-ctx.Done():
			return false
		default:
		}
	}
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for m.store.Replicated() < last {
		select {
		case <-lease.Lost():
			return false
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		if m.gap.Load() {
			return false
		}
	}
	return true
}

// releaseLease gives a lease up, bounded.
func (m *Member) releaseLease(lease *cluster.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	lease.Release(ctx)
}

// apply reads the journal from the store's position and applies it until
// ctx ends or the journal has a gap.
func (m *Member) apply(ctx context.Context) error {
	for ctx.Err() == nil {
		r, err := m.journal.Reader(ctx, m.store.Replicated())
		if err != nil {
			m.log.Warn("journal reader", "err", err)
			sleep(ctx, 250*time.Millisecond)
			continue
		}
		err = m.applyFrom(ctx, r)
		r.Stop()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, store.ErrReplicaGap) {
			m.gap.Store(true)
			m.log.Error("the cluster's journal no longer holds what this node's store needs; copy a follower's data folder here (see docs/cluster.md)", "err", err)
			return err
		}
		m.log.Warn("applying the journal", "err", err)
		sleep(ctx, 250*time.Millisecond)
	}
	return ctx.Err()
}

// followGather is how long a follower lets groups gather before it
// applies them: under load one store write then takes many groups, which
// costs the follower's CPU far less than a write each. A follower lags by
// that much at most; a node taking over waits until it holds the whole
// journal anyway (caughtUp).
const followGather = 20 * time.Millisecond

// errStaleReader is applyFrom's error for a reader that delivers nothing
// while the journal holds groups past the store's position: the consumer
// behind it was on a node that is gone, and a new reader is made.
var errStaleReader = errors.New("node: the journal reader is behind the journal and silent")

// applyFrom applies what r reads until ctx ends or a group fails.
func (m *Member) applyFrom(ctx context.Context, r *cluster.Reader) error {
	// behind is the store's position when an idle second last found the
	// journal ahead of it, when ahead says one did.
	var (
		behind uint64
		ahead  bool
	)
	for {
		es, err := r.Next(ctx, followCount, followBytes, time.Second)
		if err != nil {
			return err
		}
		if len(es) == 0 {
			// A second without a group: idle, or a reader whose consumer
			// was lost with its node, which JetStream's own heartbeats
			// would notice only much later. Two such seconds in a row with
			// the journal ahead and the store not moving make it stale (a
			// group appended right then is in flight, not lost).
			lctx, cancel := context.WithTimeout(ctx, time.Second)
			last, err := m.journal.Last(lctx)
			cancel()
			pos := m.store.Replicated()
			switch {
			case err != nil || last <= pos:
				ahead = false
			case ahead && behind == pos:
				return errStaleReader
			default:
				behind, ahead = pos, true
			}
			continue
		}
		ahead = false
		if len(es) > 0 && len(es) < followCount {
			sleep(ctx, followGather)
			more, err := r.Next(ctx, followCount-len(es), followBytes, 0)
			if err != nil {
				return err
			}
			es = append(es, more...)
		}
		gs := make([]store.Replicated, len(es))
		for i, e := range es {
			gs[i] = store.Replicated{Seq: e.Seq, Data: e.Data}
		}
		if err := m.store.Follow(ctx, gs); err != nil {
			return err
		}
	}
}

// lead catches the store up with the journal, fences, and serves the node
// until the lease is lost, the journal refuses a group, or ctx ends. rel
// serves the connections until the node does; lead returns the relay that
// serves them when it is done.
func (m *Member) lead(ctx context.Context, lease *cluster.Lease, rel relayed) relayed {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-lease.Lost():
			cancel()
		case <-lctx.Done():
		}
	}()
	release := func() { m.releaseLease(lease) }
	n, err := m.takeOver(lctx)
	if err != nil {
		m.log.Warn("could not lead", "err", err)
		release()
		return rel
	}
	m.serving.Store(n)
	m.stopRelay(rel)
	m.log.Info("leading", "journal", m.store.Replicated())
	if err := m.nats.Gather(lctx); err != nil {
		m.log.Warn("could not move JetStream's leaders here", "err", err)
	}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for lctx.Err() == nil && m.store.Leading() {
		select {
		case <-lctx.Done():
		case <-t.C:
		}
	}
	m.log.Info("no longer leading", "lease_lost", lctx.Err() != nil && ctx.Err() == nil, "fenced", !m.store.Leading())
	// Connections move to the next term's relay first: the node's
	// shutdown then closes only those it was serving.
	m.serving.Store(nil)
	next := m.startRelay()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := n.Close(sctx); err != nil {
		m.log.Warn("closing the leader's node", "err", err)
	}
	scancel()
	m.store.Unlead()
	release()
	return next
}

// takeOver leads the store, which holds the whole journal, and opens the
// node on it.
func (m *Member) takeOver(ctx context.Context) (*Node, error) {
	if err := m.store.Lead(ctx, replica{m.journal.Writer(m.store.Replicated())}); err != nil {
		return nil, err
	}
	n := &Node{Policy: m.o.Policy, log: m.o.Logger, o: m.o, Store: m.store, Cluster: m.nats, member: m, ln: m.board.take()}
	if err := n.build(ctx); err != nil {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m.store.Unlead()
		return nil, errors.Join(err, n.closers.close(cctx))
	}
	return n, nil
}

// replica is the journal as the store's Replica.
type replica struct{ w *cluster.Writer }

func (r replica) Replicate(ctx context.Context, p []byte) (uint64, error) { return r.w.Append(ctx, p) }

// local answers the paths a follower serves itself: its health, and the
// cluster's state as it sees it.
func (m *Member) local(c *fasthttp.RequestCtx) {
	c.SetContentType("application/json")
	switch string(c.Path()) {
	case "/v0/health":
		c.SetBodyString("{\"status\":\"ok\"}\n")
	case ClusterPath:
		p, err := m.authn.Authenticate(c.Request.Header.Peek(fasthttp.HeaderAuthorization), time.Now())
		if err == nil {
			err = p.Authorize(auth.ActRead, auth.Resource{Kind: auth.KindMetrics})
		}
		if err != nil {
			c.SetStatusCode(fasthttp.StatusUnauthorized)
			c.SetBodyString("{\"error\":\"unauthorized\",\"code\":\"UNAUTHORIZED\"}\n")
			return
		}
		a := clusterAnswer{Status: m.nats.Status(c), Relay: newRelayAnswer(m.relays.sum())}
		a.Role, a.Journal = "follower", m.store.Replicated()
		// Bounded: while the lease's bucket elects a leader, the answer
		// goes out without one.
		lctx, cancel := context.WithTimeout(c, leaseReadTimeout)
		v, err := m.leases.Leader(lctx)
		cancel()
		if err == nil {
			var li leaderInfo
			if json.Unmarshal(v, &li) == nil {
				a.Leader = li.Node
			}
		}
		status := fasthttp.StatusOK
		if !a.Healthy || m.gap.Load() {
			if a.Problem == "" {
				a.Problem = "the cluster's journal no longer holds what this node needs"
			}
			status, a.Error, a.Code = fasthttp.StatusServiceUnavailable, "cluster unhealthy: "+a.Problem, CodeClusterUnhealthy
		}
		body, _ := json.Marshal(a)
		c.SetStatusCode(status)
		c.SetBody(append(body, '\n'))
	}
}

// leaseReadTimeout bounds /v0/cluster's read of the lease on a follower.
const leaseReadTimeout = 300 * time.Millisecond

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Every node reports its journal position on start and every
// positionEvery; the leader drops, every Options.JournalPurgeInterval, the
// groups every node (see purgeBelow) has reported holding.
const positionEvery = 5 * time.Second

// keepPositions reports the store's journal position and, while leading,
// purges what every node holds, until ctx ends.
func (m *Member) keepPositions(ctx context.Context) {
	defer close(m.kept)
	report := time.NewTicker(positionEvery)
	defer report.Stop()
	purge := time.NewTicker(m.o.JournalPurgeInterval)
	defer purge.Stop()
	// At once on start too: on a deployment joined by URL a node that has
	// not reported does not hold the purge back (see purgeBelow).
	m.reportPosition(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-report.C:
			m.reportPosition(ctx)
		case <-purge.C:
			if m.serving.Load() != nil {
				m.purge(ctx)
			}
		}
	}
}

// reportPosition records the journal position the store holds durably.
func (m *Member) reportPosition(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := m.positions.Report(rctx, m.name, m.store.DurableReplicated()); err != nil && ctx.Err() == nil {
		m.log.Debug("journal position not reported", "err", err)
	}
}

// purge drops the journal's groups that every node holds (see
// purgeBelow).
func (m *Member) purge(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	all, err := m.positions.All(ctx)
	if err != nil {
		m.log.Debug("journal positions", "err", err)
		return
	}
	low := purgeBelow(m.nats.Peers(), all)
	if low == 0 {
		return
	}
	if err := m.journal.Purge(ctx, low+1); err != nil {
		m.log.Warn("journal purge", "err", err)
		return
	}
	m.log.Debug("journal purged", "below", low+1)
}

// purgeBelow is the journal position every node holds, by the positions
// reported (all), zero when none may be dropped. The nodes are peers, the
// JetStream meta group's members: one that has not reported holds
// everything back, so a node down for long keeps the journal growing, up
// to the stream's bound. On a deployment joined by URL the members are no
// JetStream peers (peers is nil), and the nodes are those that have
// reported, which they do from their start on.
func purgeBelow(peers []string, all map[string]uint64) uint64 {
	if peers == nil {
		peers = slices.Collect(maps.Keys(all))
	}
	var low uint64
	for i, peer := range peers {
		pos, ok := all[peer]
		if !ok {
			return 0
		}
		if i == 0 || pos < low {
			low = pos
		}
	}
	return low
}
