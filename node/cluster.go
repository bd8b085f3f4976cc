package node

import (
	"context"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/protocol"
	"github.com/gatehouse-dev/gatehouse/relay"
)

// ClusterPath is where a node with a NATS side reports it.
const ClusterPath = "/v0/cluster"

// CodeClusterUnhealthy is the machine code of GET /v0/cluster's 503: this
// node's JetStream cannot serve (no quorum, or no connection).
const CodeClusterUnhealthy = "CLUSTER_UNHEALTHY"

// startCluster starts the node's NATS side, when its options ask for one,
// and returns the surface that reports it at ClusterPath (nil without).
func (n *Node) startCluster(ctx context.Context) (protocol.Surface, error) {
	if n.Cluster != nil {
		return clusterSurface{c: n.Cluster, m: n.member}, nil
	}
	co := n.o.Cluster
	if !co.Enabled() {
		return nil, nil
	}
	if !n.o.InMemory {
		co.Dir = cluster.DataDir(n.o.Data)
	}
	co.Logger = n.o.Logger
	c, err := cluster.Start(ctx, co)
	if err != nil {
		return nil, err
	}
	n.Cluster = c
	n.closers.push(func(context.Context) error { c.Close(); return nil })
	return clusterSurface{c: c}, nil
}

// clusterSurface answers GET /v0/cluster: the node's cluster.Status, 200
// while healthy and 503 otherwise, so that a load balancer's probe can take
// a node without a quorum out of rotation. It is read as the metrics are:
// by a client or an admin.
type clusterSurface struct {
	c *cluster.Node
	m *Member // the member this node leads for, if any
}

// clusterJSON answers as the /v0 API does.
var clusterJSON = protocol.JSON{Newline: true, Fallback: `{"error":"internal error","code":"INTERNAL_ERROR"}`}

func (clusterSurface) Mount() string { return ClusterPath }

func (s clusterSurface) Routes() []protocol.Route {
	return []protocol.Route{{Method: fasthttp.MethodGet, Pattern: "", Handle: s.status}}
}

// clusterAnswer is the status, with the /v0 error envelope's fields when
// unhealthy.
type clusterAnswer struct {
	cluster.Status
	// Role is "leader" or "follower" on a cluster's member, Leader the
	// node that leads as this one knows, and Journal the position in the
	// cluster's journal this node's store holds.
	Role    string `json:"role,omitempty"`
	Leader  string `json:"leader,omitempty"`
	Journal uint64 `json:"journal,omitempty"`
	// Relay is what this member has relayed to the leaders while it
	// followed; a follower's /metrics are the leader's, since it relays
	// them, so its own counters are here.
	Relay *relayAnswer `json:"relay,omitempty"`
	Error string       `json:"error,omitempty"`
	Code  string       `json:"code,omitempty"`
}

// relayAnswer is relay.Stats as /v0/cluster shows them: connections open
// now, and totals since the node started.
type relayAnswer struct {
	Open          int64  `json:"open"`
	Relayed       uint64 `json:"relayed"`
	ToLeaderBytes uint64 `json:"to_leader_bytes"`
	ToClientBytes uint64 `json:"to_client_bytes"`
	// Refused counts refusals by their reason: no_leader (503
	// CLUSTER_NO_LEADER), unreachable (502 CLUSTER_LEADER_UNREACHABLE),
	// per_ip (429, --max-conns-per-ip), full (503, --max-conns).
	Refused map[string]uint64 `json:"refused"`
}

func newRelayAnswer(s relay.Stats) *relayAnswer {
	return &relayAnswer{
		Open: s.Open, Relayed: s.Relayed, ToLeaderBytes: s.ToLeader, ToClientBytes: s.ToClient,
		Refused: map[string]uint64{"no_leader": s.NoLeader, "unreachable": s.Unreachable, "per_ip": s.PerIP, "full": s.Full},
	}
}

func (s clusterSurface) status(r *protocol.Request) error {
	if err := r.Principal.Authorize(auth.ActRead, auth.Resource{Kind: auth.KindMetrics}); err != nil {
		return err
	}
	a := clusterAnswer{Status: s.c.Status(r.Ctx)}
	if s.m != nil {
		a.Role, a.Leader, a.Journal = "leader", s.m.o.Cluster.NodeName, s.m.store.Replicated()
		a.Relay = newRelayAnswer(s.m.relays.sum())
	}
	status := fasthttp.StatusOK
	if !a.Healthy {
		status, a.Error, a.Code = fasthttp.StatusServiceUnavailable, "cluster unhealthy: "+a.Problem, CodeClusterUnhealthy
	}
	// A Status always encodes; were it not to, Write has answered 500.
	_ = clusterJSON.Write(r.Ctx, status, a)
	return nil
}

func (clusterSurface) WriteError(ctx *fasthttp.RequestCtx, status int, code, msg string) {
	clusterJSON.WriteFailure(ctx, status, protocol.ErrorBody{Error: msg, Code: code})
}

func (clusterSurface) Fail(ctx *fasthttp.RequestCtx, err error) {
	status, body := protocol.Failure(err)
	clusterJSON.WriteFailure(ctx, status, body)
}
