// Package cluster is a node's NATS side: an embedded nats-server with
// JetStream, stored in the node's data folder, routed to the cluster's
// other nodes and optionally linked out to a hub as a leaf node; or a
// connection to an existing NATS deployment. It starts the server, waits
// until JetStream can serve (in a cluster, until a meta leader is elected),
// hands the node an in-process connection, and reports the cluster's state.
//
// A node without Options enabled has no NATS at all: one node stays one
// process and one data folder.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNotReady is returned by Start when JetStream did not become ready
// within Options.ReadyTimeout: in a cluster, no quorum of the nodes was up
// to elect a meta leader.
var ErrNotReady = errors.New("cluster: JetStream not ready")

// ErrCredentials is returned by Start when the NATS deployment of
// Options.URL refuses the node's credentials: the user and password (or
// token) in the URL, or the Options.Creds file.
var ErrCredentials = errors.New("cluster: the NATS deployment refused this node's credentials (the user in --nats-url, or --nats-creds)")

// ErrAccount is returned by Start, Journal, Leases and Positions when
// the NATS account the node connects as cannot hold what a member needs:
// JetStream is not enabled for it, its JetStream limits are too small for
// the journal and the buckets, or its user lacks a right. JetStream would
// refuse a retry again, so the start fails once it has refused for
// refusalSettle rather than after Options.ReadyTimeout.
var ErrAccount = errors.New("cluster: the NATS account cannot serve this node (JetStream not enabled for it, its limits too small, or a right its user lacks: see docs/cluster.md, On an existing NATS deployment)")

// StoreFolder is the folder of the data folder the embedded server keeps
// JetStream in.
const StoreFolder = "nats"

// readyPoll spaces the checks of the wait for JetStream at start.
const readyPoll = 50 * time.Millisecond

// statusTimeout bounds the requests a status makes of a NATS deployment.
const statusTimeout = 2 * time.Second

// Node is a running NATS side. Its methods are safe for concurrent use.
type Node struct {
	o    Options
	auth *authenticator // nil when connected to an existing deployment
	srv  *server.Server // nil when connected to an existing deployment
	nc   *nats.Conn
	js   jetstream.JetStream
	// refusedSince is when the account refusals in a row began (Unix
	// nanoseconds), 0 when the last answer was not one: see accountRefusal.
	refusedSince atomic.Int64
}

// refusalSettle is how long JetStream must keep refusing what an account's
// configuration decides before a start takes it as final. A meta leader
// that has not yet met an account (no client of it ever connected there)
// refuses it as "JetStream not enabled" until it has registered it.
const refusalSettle = 2 * time.Second

// Start starts the embedded server (or connects to o.URL) and returns once
// JetStream is ready, bounded by o.ReadyTimeout and ctx. Close releases it.
func Start(ctx context.Context, o Options) (*Node, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	n := &Node{o: o}
	var err error
	if o.URL != "" {
		err = n.connect(ctx)
	} else {
		err = n.embed(ctx)
	}
	if err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// DataDir is where the embedded server of a node with data folder data
// keeps JetStream.
func DataDir(data string) string { return filepath.Join(data, StoreFolder) }

// embed starts the embedded server and connects to it in-process.
func (n *Node) embed(ctx context.Context) error {
	so, err := n.serverOptions()
	if err != nil {
		return err
	}
	if err := setElectionTimeout(n.o.ElectionTimeout); err != nil {
		return err
	}
	srv, err := server.NewServer(so)
	if err != nil {
		return fmt.Errorf("%w: NATS server: %w", ErrConfig, err)
	}
	n.srv = srv
	if err := n.auth.bind(srv); err != nil {
		return err
	}
	warnCertName(&n.o)
	srv.SetLoggerV2(newLogger(n.o.Logger), n.o.Logger.Enabled(ctx, slog.LevelDebug), false, false)
	srv.Start()
	if !srv.ReadyForConnections(n.o.ReadyTimeout) {
		return fmt.Errorf("%w: the NATS server did not start listening within %s (are its ports free?)", ErrNotReady, n.o.ReadyTimeout)
	}
	if n.nc, err = n.Connect(n.o.NodeName); err != nil {
		return err
	}
	if n.js, err = jetstream.New(n.nc); err != nil {
		return fmt.Errorf("cluster: JetStream: %w", err)
	}
	return n.waitReady(ctx, func() error {
		if h := srv.Healthz(&server.HealthzOptions{JSMetaOnly: true}); h.Error != "" {
			return errors.New(h.Error)
		}
		return nil
	})
}

// serverOptions are the embedded server's options from n.o.
func (n *Node) serverOptions() (*server.Options, error) {
	o := n.o
	so := &server.Options{
		ServerName:             o.NodeName,
		JetStream:              true,
		JetStreamDomain:        o.Domain,
		StoreDir:               o.Dir,
		DontListen:             o.ClientListen == "" && o.Name == "",
		NoSigs:                 true,
		DisableJetStreamBanner: true,
		// The journal's groups, and an envelope.
		MaxPayload: MaxGroupBytes + 64<<10,
		SyncAlways: o.SyncAlways,
	}
	var err error
	if so.Accounts, err = accounts(); err != nil {
		return nil, err
	}
	// Every client and leaf link is admitted by the authenticator: the
	// node's own connections with a password only this process knows
	// (a clustered node's client listener, on a free loopback port, would
	// otherwise let another local process append to the journal or purge
	// it), edge boxes into EdgesAccount only.
	if n.auth, err = newAuthenticator(&n.o); err != nil {
		return nil, err
	}
	so.CustomClientAuthentication = n.auth
	switch {
	case o.ClientListen != "":
		h, p, err := hostPort(o.ClientListen)
		if err != nil {
			return nil, err
		}
		so.Host, so.Port = h, p
	case o.Name != "":
		// NATS opens its route listener only once its client listener is
		// open: a clustered node needs one, and takes a free loopback port.
		so.Host, so.Port = "127.0.0.1", server.RANDOM_PORT
	}
	if o.Name != "" {
		h, p, err := hostPort(o.Listen)
		if err != nil {
			return nil, err
		}
		so.Cluster = server.ClusterOpts{Name: o.Name, Host: h, Port: p}
		for _, peer := range o.Peers {
			u, err := routeURL(peer)
			if err != nil {
				return nil, err
			}
			so.Routes = append(so.Routes, u)
		}
		if o.RouteTLS.set() {
			if so.Cluster.TLSConfig, err = mutualTLS(o.RouteTLS, "--cluster-tls"); err != nil {
				return nil, err
			}
			so.Cluster.TLSTimeout = 5
		}
	}
	if o.LeafListen != "" {
		h, p, err := hostPort(o.LeafListen)
		if err != nil {
			return nil, err
		}
		so.LeafNode.Host, so.LeafNode.Port, so.LeafNode.Advertise = h, p, o.LeafAdvertise
		if o.LeafTLS.Cert != "" {
			if so.LeafNode.TLSConfig, err = serverTLS(o.LeafTLS, "--leaf-tls"); err != nil {
				return nil, err
			}
			so.LeafNode.TLSTimeout = 5
		}
	}
	for _, r := range o.LeafRemotes {
		u, err := leafURL(r)
		if err != nil {
			return nil, err
		}
		// The box's side of the link is its EdgesAccount too: its hubs
		// reach its tunnels' listener, and nothing of its own journal or
		// JetStream.
		ro := &server.RemoteLeafOpts{URLs: []*url.URL{u}, LocalAccount: EdgesAccount}
		if u.Scheme == "tls" || o.LeafTLS.set() {
			if ro.TLSConfig, err = clientTLS(o.LeafTLS, "--leaf-tls"); err != nil {
				return nil, err
			}
			ro.TLS, ro.TLSTimeout = true, 5
		}
		so.LeafNode.Remotes = append(so.LeafNode.Remotes, ro)
	}
	return so, nil
}

// Connect opens a further connection, named name, to the node's NATS (in
// process to the embedded server, or to the deployment of Options.URL, as
// the node's own), for traffic that must not share the node's own
// connection: a connection the server cuts off as a slow consumer takes
// its subscriptions with it. The caller closes it.
func (n *Node) Connect(name string) (*nats.Conn, error) {
	if n.srv != nil {
		return n.connectAs(name, n.auth.global)
	}
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				n.o.Logger.Warn("NATS connection lost", "connection", name, "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			n.o.Logger.Info("NATS connection back", "connection", name, "server", nc.ConnectedUrlRedacted())
		}),
		// Asynchronous errors, such as a permission the account lacks, go
		// to the node's log rather than to stderr.
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			n.o.Logger.Warn("NATS", "connection", name, "err", err)
		}),
	}
	if n.o.Creds != "" {
		if err := checkCreds(n.o.Creds); err != nil {
			return nil, fmt.Errorf("%w: --nats-creds: %w", ErrConfig, err)
		}
		opts = append(opts, nats.UserCredentials(n.o.Creds))
	}
	if n.o.ClientTLS.set() || strings.HasPrefix(n.o.URL, "tls://") {
		tc, err := clientTLS(n.o.ClientTLS, "--nats-tls")
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Secure(tc))
	}
	nc, err := nats.Connect(n.o.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: --nats-url %s: %w", ErrConfig, redactURLs(n.o.URL), err)
	}
	return nc, nil
}

// ConnectEdges opens a connection for tunnels to and from edge boxes, as
// Connect does: on the embedded server, into EdgesAccount, where edge
// boxes' leaf links are bound and nothing else runs; on a deployment of
// Options.URL, into the node's account there, as Connect's. The caller
// closes it.
func (n *Node) ConnectEdges(name string) (*nats.Conn, error) {
	if n.srv != nil {
		return n.connectAs(name, n.auth.tunnels)
	}
	return n.Connect(name)
}

// connectAs opens an in-process connection to the embedded server as the
// user of cr.
func (n *Node) connectAs(name string, cr credential) (*nats.Conn, error) {
	nc, err := nats.Connect("", nats.InProcessServer(n.srv), nats.Name(name), nats.MaxReconnects(-1), nats.UserInfo(cr.user, cr.password))
	if err != nil {
		return nil, fmt.Errorf("cluster: in-process connection: %w", err)
	}
	return nc, nil
}

// checkCreds reads the credentials file at path as nats.go does on each
// connection: a user's JWT, and a seed that signs the server's nonce.
// Read here, so that a file that is not there, or holds no seed, is named
// as such rather than retried as a connection that fails until
// ReadyTimeout. nats.go's errors name the file, never its contents.
func checkCreds(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	f.Close()
	var o nats.Options
	if err := nats.UserCredentials(path)(&o); err != nil {
		return err
	}
	if _, err := o.UserJWT(); err != nil {
		return err
	}
	_, err = o.SignatureCB([]byte("gatehouse"))
	return err
}

// connect joins an existing NATS deployment at n.o.URL. Credentials the
// deployment refuses end the wait at once, with ErrCredentials: a retry
// would be refused again (nats.go closes a connection every server
// refused twice).
func (n *Node) connect(ctx context.Context) error {
	where := redactURLs(n.o.URL)
	nc, err := n.Connect(n.o.NodeName)
	if err != nil {
		return err
	}
	n.nc = nc
	if n.js, err = jetstream.New(nc); err != nil {
		return fmt.Errorf("cluster: JetStream: %w", err)
	}
	return n.waitReady(ctx, func() error {
		if !nc.IsConnected() {
			// A server that refused the credentials does not stop the
			// wait while another has taken them.
			if last := nc.LastError(); authError(last) {
				return fmt.Errorf("%w: --nats-url %s: %w", ErrCredentials, where, last)
			}
			if nc.IsClosed() {
				return fmt.Errorf("%w: --nats-url %s: connection closed: %w", ErrNotReady, where, nc.LastError())
			}
			return fmt.Errorf("not connected to --nats-url %s", where)
		}
		actx, cancel := context.WithTimeout(ctx, statusTimeout)
		defer cancel()
		ai, err := n.js.AccountInfo(actx)
		if cause := n.accountRefusal(err); cause != nil {
			return fmt.Errorf("%w: --nats-url %s: %w", ErrAccount, where, cause)
		}
		// Said by the account's own limits, this refusal needs no wait
		// and no try: creating the journal first, which such an account
		// takes, would leave a stream of 4 GiB reserved for a member that
		// then stops at the buckets. Tiered limits are left to JetStream's
		// answer when the bucket is made.
		if err == nil && ai.Limits.MaxBytesRequired {
			return fmt.Errorf("%w: --nats-url %s: %w", ErrAccount, where, errMaxBytesRequired)
		}
		return err
	})
}

// errMaxBytesRequired is an account's refusal of streams without a
// max_bytes, which the buckets (LeaseBucket, PositionsBucket) are.
var errMaxBytesRequired = fmt.Errorf("the account requires a stream config to have max bytes set (max_bytes_required), and the buckets %s and %s set none", LeaseBucket, PositionsBucket)

// accountRefusal returns, for a node on a deployment, the refusal behind
// err that a retry would meet again, once such refusals have come in a row
// for refusalSettle: err itself when JetStream refused what the account's
// configuration decides (JetStream not enabled for it, a limit), or the
// permissions violation the connection was last told of; otherwise nil. A
// JetStream that does not answer (no responders, no peers for placement
// yet, a timeout) may answer a retry.
func (n *Node) accountRefusal(err error) error {
	if n.srv != nil {
		return nil
	}
	cause := n.refusal(err)
	if cause == nil {
		n.refusedSince.Store(0)
		return nil
	}
	now := time.Now().UnixNano()
	if n.refusedSince.CompareAndSwap(0, now) || time.Duration(now-n.refusedSince.Load()) < refusalSettle {
		return nil
	}
	return cause
}

// refusal is accountRefusal's verdict on one answer.
func (n *Node) refusal(err error) error {
	if err == nil {
		return nil
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch server.ErrorIdentifier(api.ErrorCode) {
		case server.JSNotEnabledForAccountErr, server.JSStorageResourcesExceededErr,
			server.JSMemoryResourcesExceededErr, server.JSMaximumStreamsLimitErr,
			server.JSMaximumConsumersLimitErr, server.JSStreamMaxBytesRequired,
			server.JSStreamMaxStreamBytesExceeded:
			return err
		}
	}
	// A request whose subject the user may not publish on is dropped by
	// the server, which tells the connection; the request itself only
	// times out.
	if last := n.nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) {
		return last
	}
	return nil
}

// authError reports whether err is a NATS server's refusal of a client's
// credentials.
func authError(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired)
}

// redactURLs is a comma-separated list of NATS URLs fit for a log or an
// error: a password is replaced, and so is a user that stands alone (a
// token).
func redactURLs(list string) string {
	parts := strings.Split(list, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		switch {
		case err != nil:
			parts[i] = "(a URL that does not parse)"
			continue
		case u.User == nil:
		case hasPassword(u.User):
			u.User = url.UserPassword(u.User.Username(), redacted)
		default:
			u.User = url.User(redacted)
		}
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

// redacted stands for a secret in a redacted URL.
const redacted = "xxxxx"

func hasPassword(u *url.Userinfo) bool {
	_, ok := u.Password()
	return ok
}

// waitReady polls ready until it passes, ctx ends or ReadyTimeout passes.
func (n *Node) waitReady(ctx context.Context, ready func() error) error {
	deadline := time.Now().Add(n.o.ReadyTimeout)
	t := time.NewTicker(readyPoll)
	defer t.Stop()
	for {
		err := ready()
		if err == nil {
			n.o.Logger.Info("JetStream ready", "node", n.o.NodeName, "cluster", n.o.Name)
			return nil
		}
		if errors.Is(err, ErrCredentials) || errors.Is(err, ErrNotReady) || errors.Is(err, ErrAccount) {
			return err
		}
		if time.Now().After(deadline) {
			hint := ""
			if n.o.Name != "" {
				hint = " (a cluster needs a quorum of its nodes up: start them together)"
			}
			return fmt.Errorf("%w within %s: %w%s", ErrNotReady, n.o.ReadyTimeout, err, hint)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: waiting for JetStream: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// Conn is the node's NATS connection (in-process to the embedded server).
func (n *Node) Conn() *nats.Conn { return n.nc }

// JetStream is the node's JetStream context.
func (n *Node) JetStream() jetstream.JetStream { return n.js }

// ClientURL is where NATS clients reach the embedded server: at
// Options.ClientListen, or, on a clustered node without it, at the
// loopback port NATS needs, which takes only this process's connection.
// "" when it has no client listener.
func (n *Node) ClientURL() string {
	if n.srv == nil || (n.o.ClientListen == "" && n.o.Name == "") {
		return ""
	}
	addr := n.srv.Addr()
	if addr == nil {
		return ""
	}
	return "nats://" + addr.String()
}

// RouteAddr is the address the embedded server takes routes on, or "".
func (n *Node) RouteAddr() string {
	if n.srv == nil || n.o.Name == "" {
		return ""
	}
	if a := n.srv.ClusterAddr(); a != nil {
		return a.String()
	}
	return ""
}

// Close closes the connection and shuts the embedded server down, waiting
// until it has.
func (n *Node) Close() {
	if n.nc != nil {
		n.nc.Close()
	}
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
	}
}
