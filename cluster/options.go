package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/ident"
)

// ErrConfig is matched by every refusal of Options: a combination that
// cannot work, or a link that would carry the node's facts in clear text
// over a network.
var ErrConfig = errors.New("cluster: bad configuration")

// Options configure the node's NATS side. The zero value is not enabled:
// a node then runs without NATS, as a single node always has.
type Options struct {
	// Name is the cluster's name, the same on every node of one cluster.
	// With it the node opens a route listener (Listen) and dials Peers.
	Name string
	// NodeName is this node's server name, unique in the cluster and among
	// the leaf nodes it links to: JetStream's replicas are placed by it.
	// Empty means the host name.
	NodeName string
	// Listen is the host:port routes from the other nodes arrive on;
	// empty means 0.0.0.0:6222. Port 0 picks a free port.
	Listen string
	// Peers are the route addresses (host:port) of the cluster's nodes.
	// This node's own may be among them: every node can be given the same
	// list.
	Peers []string
	// ClientListen, when set, is a loopback host:port where NATS clients
	// (the nats CLI, tests) may connect to this node. The node's own
	// connection is in-process and needs none.
	ClientListen string
	// LeafListen, when set, is the host:port this node accepts leaf-node
	// links on: it is a hub for edge boxes.
	LeafListen string
	// LeafAdvertise is the host:port a hub tells the edge boxes linked to
	// it to dial it on next time, instead of LeafListen's: its address as
	// they see it, across NAT or a load balancer. A hub's other nodes'
	// addresses reach its edge boxes the same way, so that an edge box
	// redials another node of the hub when one is lost.
	LeafAdvertise string
	// LeafRemotes are hub URLs this node links out to as a leaf node
	// (nats-leaf://host:7422, or tls://host:7422): it is an edge box. The
	// link is dialed from here, so it passes NAT, and is redialed when it
	// drops; the node works on its own meanwhile.
	LeafRemotes []string
	// Domain is this node's JetStream domain. An edge box sets its own, so
	// that its JetStream stays its own while linked to a hub.
	Domain string
	// URL, instead of an embedded server, connects the node to an existing
	// NATS deployment (comma-separated server URLs). None of the embedded
	// server's options may be set with it.
	URL string
	// Creds is a NATS credentials file for URL.
	Creds string
	// Dir is where the embedded server keeps JetStream's files; required
	// for an embedded server.
	Dir string
	// RouteTLS secures routes: both ends present their certificate and
	// check the other's against CA.
	RouteTLS TLSFiles
	// LeafTLS secures leaf links. On a hub (LeafListen) the certificate is
	// served and, with CA, edge boxes must present one CA signed; on an
	// edge box (LeafRemotes) CA verifies the hub and the certificate, if
	// given, is presented to it.
	LeafTLS TLSFiles
	// ClientTLS secures the connection to URL: CA verifies the servers,
	// the certificate is presented if given.
	ClientTLS TLSFiles
	// Insecure allows routes and leaf links in clear text on addresses
	// other than loopback, for a network that is private end to end.
	Insecure bool
	// ReadyTimeout bounds the wait at start for JetStream to be ready: in a
	// cluster, for a meta leader, which takes a quorum of the nodes up.
	// Zero means 30s.
	ReadyTimeout time.Duration
	// Replicas is the replica count of the journal and the buckets on a
	// deployment joined with URL, at most 5. Zero keeps the streams'
	// existing count, and creates them at three on a clustered deployment
	// and at one on a server alone. An embedded cluster uses min(3, its
	// nodes).
	Replicas int
	// ElectionTimeout has the embedded server's raft groups (JetStream's
	// streams and its meta group) elect a new leader after d to 2d
	// without hearing from theirs, with heartbeats every d/4: the floor of
	// a failover when the lost node led them. Zero means
	// DefaultElectionTimeout on a cluster's node (Name set), NATS's own 4
	// to 9 s elsewhere. It is the whole process's (see raft.go); at least
	// 500ms.
	ElectionTimeout time.Duration
	// SyncAlways has the embedded server sync JetStream's files before it
	// acknowledges a write, as a node's own store does under --sync always.
	SyncAlways bool
	// Logger receives the NATS server's lines; nil discards them.
	Logger *slog.Logger
}

// TLSFiles name PEM files of one kind of link.
type TLSFiles struct {
	Cert, Key, CA string
}

func (f TLSFiles) set() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Enabled reports whether o asks for NATS at all.
func (o *Options) Enabled() bool {
	return o.embedded() || o.URL != "" || o.NodeName != ""
}

// embedded reports whether o sets any option of the embedded server.
func (o *Options) embedded() bool {
	return o.Name != "" || o.Listen != "" || len(o.Peers) > 0 || o.ClientListen != "" ||
		o.LeafListen != "" || len(o.LeafRemotes) > 0 || o.Domain != "" || o.RouteTLS.set() || o.LeafTLS.set()
}

// defaultListen is the route listener of a cluster's node, NATS's usual.
const defaultListen = "0.0.0.0:6222"

// maxReplicas is JetStream's most replicas of a stream.
const maxReplicas = 5

// DefaultElectionTimeout is a cluster node's Options.ElectionTimeout
// unless set: with it a leader's loss costs about 2 s (its lease and one
// election), against 5 to 9 s with NATS's own timing. A node that stalls
// for longer than it (a long GC pause, a starved VM) causes an election:
// set a longer one on such hosts.
const DefaultElectionTimeout = time.Second

// defaultReadyTimeout bounds the wait for JetStream at start.
const defaultReadyTimeout = 30 * time.Second

// check validates o and fills its defaults.
func (o *Options) check() error {
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = defaultReadyTimeout
	}
	if o.ElectionTimeout == 0 && o.Name != "" {
		o.ElectionTimeout = DefaultElectionTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.NodeName == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			return fmt.Errorf("%w: no --node-name, and no host name to use instead", ErrConfig)
		}
		o.NodeName = host
	}
	if !validName(o.NodeName) {
		return fmt.Errorf("%w: node name %q: want a name without spaces, '.', '*' or '>'", ErrConfig, o.NodeName)
	}
	if o.URL != "" {
		if o.embedded() {
			return fmt.Errorf("%w: --nats-url joins an existing deployment; the embedded server's options (--cluster-*, --leaf-*, --nats-listen, --nats-domain) do not apply", ErrConfig)
		}
		if o.Replicas < 0 || o.Replicas > maxReplicas {
			return fmt.Errorf("%w: --nats-replicas %d: want 1 to %d, or 0 for the streams' own", ErrConfig, o.Replicas, maxReplicas)
		}
		return nil
	}
	if o.Creds != "" || o.ClientTLS.set() || o.Replicas != 0 {
		return fmt.Errorf("%w: --nats-creds, --nats-tls-* and --nats-replicas are for --nats-url", ErrConfig)
	}
	if o.Dir == "" {
		return fmt.Errorf("%w: the embedded NATS server needs a data folder (not --in-memory)", ErrConfig)
	}
	if (o.Listen != "" || len(o.Peers) > 0 || o.RouteTLS.set()) && o.Name == "" {
		return fmt.Errorf("%w: --cluster-listen, --cluster-peers and --cluster-tls-* need --cluster-name", ErrConfig)
	}
	if o.Name != "" {
		if !validName(o.Name) {
			return fmt.Errorf("%w: cluster name %q: want a name without spaces, '.', '*' or '>'", ErrConfig, o.Name)
		}
		if o.Listen == "" {
			o.Listen = defaultListen
		}
		if err := o.secure("--cluster-listen", o.Listen, o.RouteTLS, true); err != nil {
			return err
		}
		for _, p := range o.Peers {
			u, err := routeURL(p)
			if err != nil {
				return err
			}
			if err := o.secure("--cluster-peers", u.Host, o.RouteTLS, true); err != nil {
				return err
			}
		}
	}
	if o.ClientListen != "" && !loopback(o.ClientListen) {
		return fmt.Errorf("%w: --nats-listen %s: NATS clients reach every fact of the node; listen on loopback only", ErrConfig, o.ClientListen)
	}
	if o.LeafListen != "" {
		if err := o.secure("--leaf-listen", o.LeafListen, o.LeafTLS, true); err != nil {
			return err
		}
	}
	if o.LeafAdvertise != "" {
		if o.LeafListen == "" {
			return fmt.Errorf("%w: --leaf-advertise is the address of --leaf-listen: set both", ErrConfig)
		}
		if _, _, err := hostPort(o.LeafAdvertise); err != nil {
			return fmt.Errorf("%w: --leaf-advertise: %w", ErrConfig, err)
		}
	}
	for _, r := range o.LeafRemotes {
		u, err := leafURL(r)
		if err != nil {
			return err
		}
		if u.Scheme != "tls" {
			if err := o.secure("--leaf-remote", u.Host, o.LeafTLS, false); err != nil {
				return err
			}
		}
	}
	if o.Domain != "" && !validName(o.Domain) {
		return fmt.Errorf("%w: JetStream domain %q: want a name without spaces, '.', '*' or '>'", ErrConfig, o.Domain)
	}
	return nil
}

// validName reports whether name can name a node, a cluster or a
// JetStream domain: an id (package ident) that is also one NATS subject
// token, since NATS puts these in subjects (and an edge box's name in its
// tunnels').
func validName(name string) bool {
	return ident.Check("name", name) == nil && !strings.ContainsAny(name, " \t.*>")
}

// secure refuses a link in clear text on an address other than loopback,
// unless Insecure. server says the address is this node's listener, which
// TLS then needs a certificate for; a dialed link needs TLS at all (a CA,
// or a certificate to present).
func (o *Options) secure(flag, addr string, f TLSFiles, server bool) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("%w: %s %q: want host:port", ErrConfig, flag, addr)
	}
	if server && (f.Cert == "") != (f.Key == "") {
		return fmt.Errorf("%w: %s: give both a certificate and its key", ErrConfig, flag)
	}
	tlsOn := f.Cert != "" || (!server && f.CA != "")
	if tlsOn || o.Insecure || loopback(addr) {
		return nil
	}
	return fmt.Errorf("%w: %s %s is not loopback: the link would carry the node's facts in clear text; give its TLS files, or --cluster-insecure on a private network", ErrConfig, flag, addr)
}

// loopback reports whether a host:port (or bare host) names only this
// machine.
func loopback(addr string) bool {
	host := hostOf(addr)
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return strings.Trim(addr, "[]")
}

// routeURL turns a peer, host:port or nats-route://host:port, into a
// route URL.
func routeURL(p string) (*url.URL, error) {
	if !strings.Contains(p, "://") {
		p = "nats-route://" + p
	}
	u, err := url.Parse(p)
	if err != nil || u.Port() == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("%w: --cluster-peers %q: want host:port", ErrConfig, p)
	}
	return u, nil
}

// leafURL parses a leaf remote: nats-leaf://, nats:// or tls:// with a
// host and port.
func leafURL(r string) (*url.URL, error) {
	u, err := url.Parse(r)
	if err != nil || u.Hostname() == "" || u.Port() == "" {
		return nil, fmt.Errorf("%w: --leaf-remote %q: want nats-leaf://host:port or tls://host:port", ErrConfig, r)
	}
	switch u.Scheme {
	case "nats-leaf", "nats", "tls":
		return u, nil
	}
	return nil, fmt.Errorf("%w: --leaf-remote %q: want nats-leaf://host:port or tls://host:port", ErrConfig, r)
}

// hostPort splits a listen address for NATS's options, where port 0 means
// the default, so a free port is asked for as NATS's RANDOM_PORT (-1).
func hostPort(addr string) (string, int, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%w: %q: want host:port", ErrConfig, addr)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%w: %q: bad port", ErrConfig, addr)
	}
	if port == 0 {
		port = -1
	}
	if h == "" {
		h = "0.0.0.0"
	}
	return h, port, nil
}
