package cluster

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// Modes of a node's NATS side, as Status names them.
const (
	ModeEmbedded = "embedded"
	ModeExternal = "external"
)

// Status is the state of a node's NATS side, as GET /v0/cluster shows it.
type Status struct {
	// Mode is ModeEmbedded or ModeExternal (--nats-url).
	Mode string `json:"mode"`
	// Node is this node's name.
	Node string `json:"node"`
	// Cluster is the cluster's name, empty for an embedded server that is
	// not clustered.
	Cluster string `json:"cluster,omitempty"`
	// Healthy says JetStream can serve from this node: the server is up
	// and, in a cluster, a meta leader is known, which takes a quorum.
	// Problem says why not.
	Healthy bool   `json:"healthy"`
	Problem string `json:"problem,omitempty"`
	// Server is the NATS server the node is connected to (ModeExternal).
	Server    string          `json:"server,omitempty"`
	JetStream JetStreamStatus `json:"jetstream"`
	// Routes are the cluster's nodes this one has a route to.
	Routes []Route `json:"routes"`
	// Leafs are the leaf links up: to the hub (role "hub") from an edge
	// box, or from edge boxes (role "edge") to a hub.
	Leafs []Leaf `json:"leafs"`
}

// JetStreamStatus is JetStream as one node sees it.
type JetStreamStatus struct {
	Enabled bool   `json:"enabled"`
	Domain  string `json:"domain,omitempty"`
	// MetaLeader is the node that leads the cluster's JetStream meta
	// group; empty without a quorum, and for a single server.
	MetaLeader string `json:"meta_leader,omitempty"`
	// ClusterSize is the number of nodes the meta group knows.
	ClusterSize int `json:"cluster_size,omitempty"`
	// Peers are the meta group's other members.
	Peers     []Peer `json:"peers,omitempty"`
	Streams   int    `json:"streams"`
	Consumers int    `json:"consumers"`
	Messages  uint64 `json:"messages"`
	Bytes     uint64 `json:"bytes"`
}

// Peer is a member of the JetStream meta group.
type Peer struct {
	Name string `json:"name"`
	// Current says it has caught up with the leader; Offline that it has
	// not been heard from lately.
	Current bool `json:"current"`
	Offline bool `json:"offline,omitempty"`
	// ActiveMS is how long ago it was last heard from.
	ActiveMS int64  `json:"active_ms"`
	Lag      uint64 `json:"lag,omitempty"`
}

// Route is a route to another node of the cluster.
type Route struct {
	Node string `json:"node"`
	Addr string `json:"addr"`
}

// Leaf is a leaf link.
type Leaf struct {
	// Node is the server at the other end.
	Node string `json:"node"`
	Addr string `json:"addr"`
	// Role is what the other end is: "hub" (this node dialed it) or
	// "edge" (it dialed this hub).
	Role string `json:"role"`
}

// Status reports the state of the node's NATS side; it never fails: what
// cannot be read is a Problem.
func (n *Node) Status(ctx context.Context) Status {
	if n.srv == nil {
		return n.externalStatus(ctx)
	}
	st := Status{Mode: ModeEmbedded, Node: n.o.NodeName, Cluster: n.o.Name, Routes: []Route{}, Leafs: []Leaf{}}
	h := n.srv.Healthz(&server.HealthzOptions{JSMetaOnly: true})
	st.Healthy, st.Problem = h.Error == "", h.Error
	if js, err := n.srv.Jsz(nil); err == nil {
		st.JetStream = JetStreamStatus{Enabled: !js.Disabled, Domain: js.Config.Domain,
			Streams: js.Streams, Consumers: js.Consumers, Messages: js.Messages, Bytes: js.Bytes}
		if m := js.Meta; m != nil {
			st.JetStream.MetaLeader, st.JetStream.ClusterSize = m.Leader, m.Size
			for _, p := range m.Replicas {
				st.JetStream.Peers = append(st.JetStream.Peers, Peer{Name: p.Name, Current: p.Current, Offline: p.Offline,
					ActiveMS: p.Active.Milliseconds(), Lag: p.Lag})
			}
		}
	} else if st.Healthy {
		st.Healthy, st.Problem = false, "JetStream state: "+err.Error()
	}
	if rz, err := n.srv.Routez(nil); err == nil {
		// A route to one node is a pool of connections: one entry each.
		for _, r := range rz.Routes {
			if !slices.ContainsFunc(st.Routes, func(x Route) bool { return x.Node == r.RemoteName }) {
				st.Routes = append(st.Routes, Route{Node: r.RemoteName, Addr: joinHostPort(r.IP, r.Port)})
			}
		}
		slices.SortFunc(st.Routes, func(a, b Route) int { return strings.Compare(a.Node, b.Node) })
	}
	if lz, err := n.srv.Leafz(nil); err == nil {
		for _, l := range lz.Leafs {
			// IsSpoke says this end is the spoke: it dialed the hub.
			role := "edge"
			if l.IsSpoke {
				role = "hub"
			}
			st.Leafs = append(st.Leafs, Leaf{Node: l.Name, Addr: joinHostPort(l.IP, l.Port), Role: role})
		}
	}
	return st
}

// externalStatus is the state of a connection to an existing deployment.
func (n *Node) externalStatus(ctx context.Context) Status {
	st := Status{Mode: ModeExternal, Node: n.o.NodeName, Routes: []Route{}, Leafs: []Leaf{}}
	if !n.nc.IsConnected() {
		st.Problem = "not connected to " + redactURLs(n.o.URL)
		return st
	}
	st.Server, st.Cluster = n.nc.ConnectedUrlRedacted(), n.nc.ConnectedClusterName()
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	ai, err := n.js.AccountInfo(ctx)
	if err != nil {
		st.Problem = "JetStream: " + err.Error()
		return st
	}
	st.Healthy = true
	st.JetStream = JetStreamStatus{Enabled: true, Domain: ai.Domain, Streams: ai.Streams, Consumers: ai.Consumers}
	return st
}

func joinHostPort(ip string, port int) string {
	if ip == "" {
		return ""
	}
	return net.JoinHostPort(ip, strconv.Itoa(port))
}

// PeerAddrs returns the addresses of the cluster's other nodes, as this
// node's routes to them see them: the far end of each route connection
// (the address the other node dialed from, or the one this node dialed it
// at). A node dials this one's HTTP port from the same host as its routes,
// so these are, on ordinary hosts, the addresses its relayed connections
// come from. A route is up only once the other end passed the routes'
// mutual TLS (off loopback). None on a node that is not clustered or that
// uses an existing deployment (--nats-url), whose routes are not its own.
func (n *Node) PeerAddrs() []netip.Addr {
	if n.srv == nil {
		return nil
	}
	rz, err := n.srv.Routez(nil)
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, r := range rz.Routes {
		ip, err := netip.ParseAddr(r.IP)
		if err != nil {
			continue
		}
		if ip = ip.Unmap(); !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	return out
}
