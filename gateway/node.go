package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/kernel/policy"
	"github.com/gatehouse-dev/gatehouse/memory"
	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/protocol/aap"
	"github.com/gatehouse-dev/gatehouse/protocol/agentruntime"
	"github.com/gatehouse-dev/gatehouse/protocol/runtimeapi"
	"github.com/gatehouse-dev/gatehouse/session"
	"github.com/gatehouse-dev/gatehouse/store"
)

// Config describes a whole gateway node: store, kernel, delivery hub and
// server. The zero value (plus Data or InMemory) runs the embedded default.
type Config struct {
	Addr string // "127.0.0.1:8080" when empty
	// TLS, when set, makes the node serve HTTPS (and wss) on Addr instead
	// of plain HTTP; see package gateway/tlscert for certificates reloaded
	// from files or obtained over ACME. HTTP/2 is never offered.
	TLS      *tls.Config
	Data     string // data folder
	InMemory bool   // keep everything in memory (nothing survives a restart)
	Sync     store.SyncMode
	Auth     auth.Options
	Policy   *policy.Engine // nil: the built-in default
	Logger   *slog.Logger

	Kernel kernel.Options // Store, Deliverer, Policy and Logger are filled in
	Server Options        // Kernel, Hub, Auth and Logger are filled in

	OutboxLimit     int           // see peer.Options
	OutboxRetention time.Duration // see peer.Options

	// PeerRetention is how long a consumer (agent, runner or human
	// channel connection identity) that has no connection and nothing
	// left to deliver is remembered, with its cursor and, for a native
	// channel, its registration (see peer.Options.ConsumerRetention and
	// channel.Options.Retention). Zero means 1h; it is raised to the
	// longer grace period, so that no consumer is forgotten while the
	// kernel still keeps its executions or its job.
	PeerRetention time.Duration
	// WebhookAllow lists the internal networks chat webhooks may reach
	// (see channel.Options.WebhookAllow); nil: public addresses only.
	WebhookAllow []netip.Prefix

	// Retention deletes finished executions this long after they ended;
	// zero keeps them for 168h. RetentionCount, when positive, also keeps at
	// most that many finished executions.
	Retention      time.Duration
	RetentionCount int
	// RetentionInterval is how often retention runs; zero means 10m. The
	// first pass runs 30s after start (or after one interval, if shorter),
	// so that a box that restarts often still prunes.
	RetentionInterval time.Duration

	// DiskBudget is the most the data folder may hold (zero: its size
	// plus the free space at start), DiskLowWater the room below which
	// new work is refused with 507 STORAGE_FULL (zero: derived), and
	// MemoryLimit the memory the process may use (zero: no bound); see
	// store.Options.
	DiskBudget, DiskLowWater, MemoryLimit int64
}

// Node is a running gateway with everything it owns.
type Node struct {
	Store    *store.Store
	Sessions *session.Registry
	Bridge   *bridge.Bridge
	Channels *channel.Registry
	Kernel   *kernel.Kernel
	Hub      *peer.Hub
	Server   *Server
	Policy   *policy.Engine
	Auth     *auth.Authenticator

	runtime *runtimeapi.Surface
	ln      net.Listener
	log     *slog.Logger
	cfg     Config
	served  chan error
	// gcStop ends gcLoop, and the retention pass it is in; gcDone is
	// closed when it has ended.
	gcStop context.CancelFunc
	gcCtx  context.Context
	gcDone chan struct{}
}

// Open opens the store, recovers the kernel and starts serving on c.Addr.
func Open(ctx context.Context, c Config) (*Node, error) {
	if c.Addr == "" {
		c.Addr = "127.0.0.1:8080"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Policy == nil {
		c.Policy = policy.Default()
	}
	authn, err := auth.New(c.Auth)
	if err != nil {
		return nil, err
	}
	// undo closes what Open has opened so far, last first, when a later
	// step fails.
	var undo []func()
	fail := func(err error) (*Node, error) {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		return nil, err
	}
	st, err := store.Open(store.Options{Dir: c.Data, InMemory: c.InMemory, Sync: c.Sync, Logger: c.Logger,
		DiskBudget: c.DiskBudget, LowWater: c.DiskLowWater, MemoryLimit: c.MemoryLimit})
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { _ = st.Close() })
	retention := c.PeerRetention
	if retention <= 0 {
		retention = time.Hour
	}
	for _, grace := range []time.Duration{c.Kernel.AgentGrace, c.Kernel.RunnerGrace} {
		if grace <= 0 {
			grace = 30 * time.Second // the kernel's default
		}
		retention = max(retention, grace)
	}
	hub, err := peer.NewHub(ctx, peer.Options{Store: st, OutboxLimit: c.OutboxLimit, Retention: c.OutboxRetention,
		ConsumerRetention: retention, Logger: c.Logger})
	if err != nil {
		return fail(err)
	}
	undo = append(undo, hub.Close)
	chans, err := channel.New(ctx, channel.Options{Store: st, Hub: hub, Logger: c.Logger, Retention: retention, WebhookAllow: c.WebhookAllow})
	if err != nil {
		return fail(err)
	}
	undo = append(undo, chans.Close)
	br, err := bridge.New(ctx, bridge.Options{Store: st, Notifier: chans, Logger: c.Logger})
	if err != nil {
		return fail(err)
	}
	sessions, err := session.New(session.Options{Store: st, Logger: c.Logger})
	if err != nil {
		return fail(err)
	}
	ko := c.Kernel
	ko.Store, ko.Deliverer, ko.Policy, ko.Logger, ko.Approvals, ko.Sessions = st, Deliverer(hub), c.Policy, c.Logger, br, sessions
	k, err := kernel.New(ctx, ko)
	if err != nil {
		return fail(err)
	}
	undo = append(undo, k.Close)
	// The sessions stop before the kernel, as in Close.
	undo = append(undo, sessions.Close)
	if err := sessions.Start(ctx, k); err != nil {
		return fail(err)
	}
	notes, err := memory.Open(memory.Options{Store: st})
	if err != nil {
		return fail(err)
	}
	so := c.Server
	so.Kernel, so.Hub, so.Auth, so.Logger, so.Bridge, so.Channels, so.Sessions = k, hub, authn, c.Logger, br, chans, sessions
	rt := runtimeapi.New(runtimeapi.Options{Kernel: k, Sessions: sessions, Hub: hub, Memory: notes})
	so.Surfaces = append(so.Surfaces,
		agentruntime.New(agentruntime.Options{Kernel: k, Sessions: sessions}),
		aap.New(aap.Options{Kernel: k, Sessions: sessions}),
		rt,
	)
	srv, err := New(so)
	if err != nil {
		return fail(err)
	}
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fail(fmt.Errorf("gateway: listen: %w", err))
	}
	if c.TLS != nil {
		ln = tls.NewListener(ln, serverTLS(c.TLS))
	}
	n := &Node{
		Store: st, Sessions: sessions, Bridge: br, Channels: chans, Kernel: k, Hub: hub, Server: srv, Policy: c.Policy, Auth: authn,
		ln: ln, log: c.Logger, cfg: c, served: make(chan error, 1), gcDone: make(chan struct{}),
	}
	n.runtime = rt
	rt.Start(c.Logger)
	n.gcCtx, n.gcStop = context.WithCancel(context.Background())
	go func() { n.served <- srv.Serve(ln) }()
	go n.gcLoop()
	return n, nil
}

// Addr returns the address the node listens on.
func (n *Node) Addr() net.Addr { return n.ln.Addr() }

// Retention runs every RetentionInterval, the first time firstRetention
// after start.
const (
	defaultRetentionInterval = 10 * time.Minute
	firstRetention           = 30 * time.Second
)

// gcLoop runs retention now and then, until Close.
func (n *Node) gcLoop() {
	defer close(n.gcDone)
	interval := n.cfg.RetentionInterval
	if interval <= 0 {
		interval = defaultRetentionInterval
	}
	t := time.NewTimer(min(firstRetention, interval))
	defer t.Stop()
	for {
		select {
		case <-t.C:
			n.retain(n.gcCtx)
			t.Reset(interval)
		case <-n.gcCtx.Done():
			return
		}
	}
}

// retain prunes finished executions past retention, sessions' logs and
// expired idempotency keys; when it deleted anything, the store compacts,
// so that the folder gives the space back (see store.Compact).
func (n *Node) retain(ctx context.Context) {
	retention := n.cfg.Retention
	if retention <= 0 {
		retention = 168 * time.Hour
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	start := time.Now()
	executions, err := n.Kernel.Prune(ctx, start.Add(-retention), n.cfg.RetentionCount)
	if err != nil {
		n.log.Warn("retention", "err", err)
	}
	sessions, err := n.Sessions.Prune(ctx, start)
	if err != nil {
		n.log.Warn("session retention", "err", err)
	}
	keys, err := n.Kernel.ExpireIdempotencyKeys(ctx)
	if err != nil {
		n.log.Warn("idempotency keys", "err", err)
	}
	if executions+sessions+keys == 0 {
		n.Store.RunGC()
		return
	}
	if err := n.Store.Compact(ctx); err != nil && ctx.Err() == nil {
		n.log.Warn("retention: compaction", "err", err)
	}
	n.log.Info("retention", "executions", executions, "sessions", sessions, "idempotency_keys", keys,
		"took", time.Since(start).Round(time.Millisecond))
}

// Close shuts the node down in dependency order: no new requests, streams
// ended, kernel timers stopped, store drained and closed. Everything
// acknowledged is already durable; Close writes nothing new.
func (n *Node) Close(ctx context.Context) error {
	n.gcStop()
	<-n.gcDone
	serr := n.Server.Shutdown(ctx)
	if err := <-n.served; err != nil && serr == nil {
		serr = err
	}
	n.runtime.Close()
	n.Sessions.Close()
	n.Kernel.Close()
	n.Channels.Close()
	n.Hub.Close()
	cerr := n.Store.Close()
	if serr != nil && !errors.Is(serr, context.DeadlineExceeded) {
		return serr
	}
	if serr != nil {
		n.log.Warn("shutdown timed out; remaining connections were closed", "err", serr)
	}
	return cerr
}
