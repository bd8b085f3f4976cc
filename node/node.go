// Package node is a gateway node: the composition root. Open builds the
// store, the peer hub, the human channels, the permission bridge, the
// sessions, the kernel, the memory, the protocol surfaces and the gateway's
// server, in that order, and Close releases them in the reverse order.
// Nothing else in Gatehouse wires these pieces together; the gateway
// receives them built.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/channel/slack"
	"github.com/gatehouse-dev/gatehouse/channel/telegram"
	"github.com/gatehouse-dev/gatehouse/channel/webpush"
	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/gateway"
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

// Node is a running gateway with everything it owns.
type Node struct {
	Store    *store.Store
	Sessions *session.Registry
	Bridge   *bridge.Bridge
	Channels *channel.Registry
	Kernel   *kernel.Kernel
	Hub      *peer.Hub
	Server   *gateway.Server
	Policy   *policy.Engine
	Auth     *auth.Authenticator
	// Cluster is the node's NATS side; nil unless Options.Cluster is
	// enabled.
	Cluster *cluster.Node

	ln  net.Listener
	log *slog.Logger
	// member is the cluster member this node leads for, if any.
	member *Member
	push   *webpush.Push // the Web Push channel, if any
	// tunnels is the NATS connection of the edge tunnels, if any.
	tunnels *nats.Conn
	o       Options
	// closers release what Open built, last first.
	closers closers
}

// Open opens the store, recovers the kernel and starts serving on o.Addr.
// When a step fails, what the steps before it built is released again.
func Open(ctx context.Context, o Options) (*Node, error) {
	o.defaults()
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Policy == nil {
		o.Policy = policy.Default()
	}
	n := &Node{Policy: o.Policy, log: o.Logger, o: o}
	if err := n.build(ctx); err != nil {
		// Nothing was served yet: releasing does not wait on anyone.
		return nil, errors.Join(err, n.closers.close(context.Background()))
	}
	return n, nil
}

// build opens the pieces of n in dependency order, pushing the release of
// each on n.closers as soon as it is open.
func (n *Node) build(ctx context.Context) error {
	o := n.o
	authn, err := auth.New(o.Auth)
	if err != nil {
		return err
	}
	n.Auth = authn
	if authn.Open() && !o.InsecureNoAuth {
		if err := requireLoopback(ctx, o.Addr); err != nil {
			return err
		}
	}
	// A cluster's member hands its leader the store and the NATS side it
	// keeps between terms (see Member).
	st := n.Store
	if st == nil {
		if st, err = openStore(o); err != nil {
			return err
		}
		n.Store = st
		n.closers.push(func(context.Context) error { return st.Close() })
	}
	// After the store, whose lock on the data folder keeps a second
	// process off the JetStream files in it too.
	clusterSurface, err := n.startCluster(ctx)
	if err != nil {
		return err
	}
	// No consumer is forgotten while the kernel still keeps its
	// executions or its job.
	retention := max(o.PeerRetention, o.Kernel.AgentGrace, o.Kernel.RunnerGrace)
	pres := &presence{}
	hub, err := peer.NewHub(ctx, peer.Options{Store: st, OutboxLimit: o.OutboxLimit, Retention: o.OutboxRetention,
		ConsumerRetention: retention, Logger: o.Logger, Presence: pres})
	if err != nil {
		return err
	}
	n.Hub = hub
	n.closers.push(release(hub.Close))
	co := o.Channels
	co.Store, co.Hub, co.Logger, co.Retention, co.WebhookAllow = st, hub, o.Logger, retention, o.WebhookAllow
	if err := n.adapters(ctx, &co); err != nil {
		return err
	}
	adapters := co.Adapters
	chans, err := channel.New(ctx, co)
	if err != nil {
		return err
	}
	n.Channels = chans
	pres.channels.Store(chans)
	n.closers.push(release(chans.Close))
	br, err := bridge.New(ctx, bridge.Options{Store: st, Notifier: chans, Logger: o.Logger})
	if err != nil {
		return err
	}
	n.Bridge = br
	sessions, err := session.New(session.Options{Store: st, Logger: o.Logger, MaxPerOwner: o.SessionsPerPrincipal})
	if err != nil {
		return err
	}
	n.Sessions = sessions
	ko := o.Kernel
	ko.Store, ko.Deliverer, ko.Policy, ko.Logger, ko.Approvals, ko.Sessions = st, hubDeliverer{hub}, o.Policy, o.Logger, br, sessions
	k, err := kernel.New(ctx, ko)
	if err != nil {
		return err
	}
	n.Kernel = k
	pres.kernel.Store(k)
	n.closers.push(release(k.Close))
	// The sessions drive the kernel: they stop before it.
	n.closers.push(release(sessions.Close))
	if err := sessions.Start(ctx, k); err != nil {
		return err
	}
	if err := chans.Start(ctx, decider{k: k, b: br}); err != nil {
		return err
	}
	mo := o.Memory
	mo.Store, mo.Logger = st, o.Logger
	if mo.LegacyOwner == "" {
		mo.LegacyOwner = authn.SoleSubject()
	}
	notes, err := memory.Open(ctx, mo)
	if err != nil {
		return err
	}
	so := o.Server
	if so.Registry == nil {
		so.Registry = prometheus.NewRegistry()
	}
	if err := so.Registry.Register(newStoreCollector(st)); err != nil {
		return fmt.Errorf("node: store metrics: %w", err)
	}
	if err := so.Registry.Register(newChannelCollector(chans)); err != nil {
		return fmt.Errorf("node: channel metrics: %w", err)
	}
	for _, a := range adapters {
		if h, ok := a.(channel.Hooker); ok {
			so.Hooks = append(so.Hooks, h.Hooks()...)
		}
	}
	if n.push != nil {
		so.Push = n.push
	}
	so.Kernel, so.Hub, so.Auth, so.Logger, so.Bridge, so.Channels, so.Sessions = k, hub, authn, o.Logger, br, chans, sessions
	if n.member != nil {
		so.PeerAddr = n.member.peers.has
	}
	rt := runtimeapi.New(runtimeapi.Options{Kernel: k, Sessions: sessions, Hub: hub, Memory: notes})
	so.Surfaces = append(so.Surfaces,
		agentruntime.New(agentruntime.Options{Kernel: k, Sessions: sessions}),
		aap.New(aap.Options{Kernel: k, Sessions: sessions}),
		rt,
	)
	if clusterSurface != nil {
		so.Surfaces = append(so.Surfaces, clusterSurface)
	}
	if err := n.edgeHub(&so); err != nil {
		return err
	}
	if name := n.edgeName(); name != "" {
		so.EdgeName = name
	}
	srv, err := gateway.New(so)
	if err != nil {
		return err
	}
	n.Server = srv
	ln := n.ln
	if ln == nil {
		if ln, err = gateway.Listen(o.Addr, o.TLS); err != nil {
			return err
		}
		n.ln = ln
	}
	rt.Start(o.Logger)
	n.closers.push(release(rt.Close))
	edgeLn, err := n.edgeListener()
	if err != nil {
		return err
	}
	n.serve(srv, ln, edgeLn)
	n.closers.push(n.startRetention())
	return nil
}

// openStore opens the store o describes.
func openStore(o Options) (*store.Store, error) {
	return store.Open(store.Options{Dir: o.Data, InMemory: o.InMemory, Sync: o.Sync, Logger: o.Logger,
		DiskBudget: o.DiskBudget, LowWater: o.DiskLowWater, MemoryLimit: o.MemoryLimit})
}

// adapters adds the chat and push channels that o configures to co's.
func (n *Node) adapters(ctx context.Context, co *channel.Options) error {
	o := n.o
	co.Adapters = slices.Clone(co.Adapters)
	if o.Telegram != nil {
		to := *o.Telegram
		to.Logger = o.Logger.With("channel", channel.AdapterTelegram)
		tg, err := telegram.New(to)
		if err != nil {
			return err
		}
		co.Adapters = append(co.Adapters, tg)
	}
	if o.Slack != nil {
		so := *o.Slack
		so.Logger = o.Logger.With("channel", channel.AdapterSlack)
		app, err := slack.New(so)
		if err != nil {
			return err
		}
		co.Adapters = append(co.Adapters, app)
	}
	if o.WebPush != nil {
		wo := *o.WebPush
		wo.Store, wo.Dir, wo.Allow, wo.Logger = co.Store, o.Data, o.WebhookAllow, o.Logger.With("channel", channel.AdapterWebPush)
		if o.InMemory {
			wo.Dir = ""
		}
		p, err := webpush.New(ctx, wo)
		if err != nil {
			return err
		}
		n.push = p
		co.Adapters = append(co.Adapters, p)
	}
	return nil
}

// ErrNoAuthOnNetwork is the error of Open for a node with no credential
// (Options.Auth) on a listen address other hosts can reach, unless
// Options.InsecureNoAuth says that is meant.
var ErrNoAuthOnNetwork = errors.New("no credentials on a non-loopback address")

// requireLoopback fails with ErrNoAuthOnNetwork unless every address addr
// listens on is a loopback one: an IP literal of loopback, or a name all of
// whose addresses are. An empty host listens on every interface.
func requireLoopback(ctx context.Context, addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("node: listen address: %w", err)
	}
	var ips []netip.Addr
	if ip, perr := netip.ParseAddr(host); perr == nil {
		ips = []netip.Addr{ip}
	} else if host != "" {
		if ips, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host); err != nil {
			return fmt.Errorf("node: listen address %s: %w", addr, err)
		}
	}
	loopback := len(ips) > 0
	for _, ip := range ips {
		loopback = loopback && ip.Unmap().IsLoopback()
	}
	if !loopback {
		return fmt.Errorf("node: refusing to listen on %s: %w: anyone who can reach it would act as the admin (set Auth, listen on a loopback address, or set InsecureNoAuth)", addr, ErrNoAuthOnNetwork)
	}
	return nil
}

// serve serves ln, and edge when not nil (an edge box's listener of what
// its hubs pass on), on goroutines of their own; the release it pushes
// shuts the server down, which closes both listeners, and waits for those
// goroutines.
func (n *Node) serve(srv *gateway.Server, ln, edge net.Listener) {
	served := make(chan error, 2)
	go func() { served <- srv.Serve(ln) }()
	serving := 1
	if edge != nil {
		go func() { served <- srv.ServeEdge(edge) }()
		serving++
	}
	n.closers.push(func(ctx context.Context) error {
		err := srv.Shutdown(ctx)
		for range serving {
			if serr := <-served; err == nil {
				err = serr
			}
		}
		if errors.Is(err, context.DeadlineExceeded) {
			n.log.Warn("shutdown timed out; remaining connections were closed", "err", err)
			return nil
		}
		return err
	})
}

// Addr returns the address the node listens on.
func (n *Node) Addr() net.Addr { return n.ln.Addr() }

// Close shuts the node down in the reverse order of Open: retention
// stopped, no new requests, streams ended, the memory runner, sessions and
// kernel timers stopped, channels and hub closed, store drained and
// closed. Everything acknowledged is already durable; Close writes nothing
// new. A shutdown that runs out of ctx closes the remaining connections
// and is not an error.
func (n *Node) Close(ctx context.Context) error {
	return n.closers.close(ctx)
}

// closers is a stack of releases: what was opened last is released first.
type closers []func(context.Context) error

// release adapts a Close that cannot fail to a closer.
func release(f func()) func(context.Context) error {
	return func(context.Context) error {
		f()
		return nil
	}
}

func (c *closers) push(f func(context.Context) error) { *c = append(*c, f) }

// close runs every release, last first, and empties the stack: a second
// close releases nothing. A release that fails does not stop the ones
// after it; the errors are joined.
func (c *closers) close(ctx context.Context) error {
	var errs []error
	for i := len(*c) - 1; i >= 0; i-- {
		if err := (*c)[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	*c = nil
	return errors.Join(errs...)
}
