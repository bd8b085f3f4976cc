package node

import (
	"context"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/protocol"
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
	Error   string `json:"error,omitempty"`
	Code    string `json:"code,omitempty"`
}

func (s clusterSurface) status(r *protocol.Request) error {
	if err := r.Principal.Authorize(auth.ActRead, auth.Resource{Kind: auth.KindMetrics}); err != nil {
		return err
	}
	a := clusterAnswer{Status: s.c.Status(r.Ctx)}
	if s.m != nil {
		a.Role, a.Leader, a.Journal = "leader", s.m.o.Cluster.NodeName, s.m.store.Replicated()
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
