package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/relay"
	"github.com/gatehouse-dev/gatehouse/tunnel"
)

// edgeHub gives a node with a NATS side its hub part: requests under
// gateway.EdgePrefix are passed on to the edge box they name, through a
// tunnel over NATS. Its release closes what was passed on.
func (n *Node) edgeHub(so *gateway.Options) error {
	if n.Cluster == nil {
		return nil
	}
	nc, err := n.tunnelConn()
	if err != nil {
		return err
	}
	edges := relay.NewEdges(relay.EdgeOptions{
		Dial: func(ctx context.Context, name string) (net.Conn, error) {
			c, err := tunnel.Dial(ctx, nc, cluster.EdgeDialSubject(name), edgeTunnel(name, n.log))
			switch {
			case errors.Is(err, tunnel.ErrNoListener):
				return nil, fmt.Errorf("%w: %w", relay.ErrEdgeNotLinked, err)
			case err != nil:
				return nil, err
			}
			return c, nil
		},
		WriteTimeout: so.WriteTimeout,
		MaxConns:     so.MaxConns,
		Logger:       n.log.With("component", "edges"),
	})
	if err := so.Registry.Register(newEdgeCollector(edges)); err != nil {
		return fmt.Errorf("node: edge metrics: %w", err)
	}
	so.Edges = edges
	n.closers.push(edges.Shutdown)
	return nil
}

// newEdgeCollector exports a hub's figures of what it passed on to edge
// boxes.
func newEdgeCollector(e *relay.Edges) prometheus.Collector {
	c := gateway.NewSnapshotCollector(e.Stats)
	c.Gauge("gatehouse_edge_connections", "Client connections this hub passes on to edge boxes now.", func(s relay.EdgeStats) float64 { return float64(s.Open) })
	c.Counter("gatehouse_edge_passed_total", "Client connections passed on to edge boxes.", func(s relay.EdgeStats) float64 { return float64(s.Passed) })
	c.Counter("gatehouse_edge_sent_bytes_total", "Bytes passed from clients to edge boxes.", func(s relay.EdgeStats) float64 { return float64(s.ToEdge) })
	c.Counter("gatehouse_edge_received_bytes_total", "Bytes passed from edge boxes to clients.", func(s relay.EdgeStats) float64 { return float64(s.ToClient) })
	c.Counter("gatehouse_edge_not_linked_total", "Requests for an edge box that was not linked (503 EDGE_NOT_LINKED).", func(s relay.EdgeStats) float64 { return float64(s.NotLinked) })
	c.Counter("gatehouse_edge_full_total", "Requests for an edge box refused while the hub passed on as many connections as it may (503 SERVICE_UNAVAILABLE).", func(s relay.EdgeStats) float64 { return float64(s.Full) })
	c.Counter("gatehouse_edge_unreachable_total", "Requests for a linked edge box that could not be passed on, or whose edge connection ended before their answer (502 EDGE_UNREACHABLE).", func(s relay.EdgeStats) float64 { return float64(s.Unreachable) })
	return c
}

// edgeName is the name this node goes by as an edge box, if it is one: a
// node that links out to a hub as a leaf node.
func (n *Node) edgeName() string {
	if n.Cluster == nil || len(n.o.Cluster.LeafRemotes) == 0 {
		return ""
	}
	return n.o.Cluster.NodeName
}

// edgeListener is, on an edge box, the listener of the connections its
// hubs pass on, which the node's server serves beside its own (nil when
// the node is no edge box). An edge box with no token serves none of them
// (the gateway refuses each with 403), and one whose name cannot name a
// subject takes none.
func (n *Node) edgeListener() (net.Listener, error) {
	name := n.edgeName()
	if name == "" {
		return nil, nil
	}
	if !gateway.ValidEdgeName(name) {
		n.log.Warn("this edge box's name cannot be reached through its hub: give it a --node-name of letters, digits, '-' and '_'", "node", name)
		return nil, nil
	}
	if n.Auth.Open() {
		n.log.Warn("this edge box has no token: requests its hub passes on are refused (403 EDGE_TOKEN_REQUIRED)", "node", name)
	}
	nc, err := n.tunnelConn()
	if err != nil {
		return nil, err
	}
	ln, err := tunnel.Listen(nc, cluster.EdgeDialSubject(name), edgeTunnel(name, n.log))
	if err != nil {
		return nil, fmt.Errorf("node: edge: %w", err)
	}
	return ln, nil
}

// edgeTunnel are the tunnel options of the edge box named name's tunnels,
// on the hub's end and the box's: their inboxes under the box's own
// subjects, which are all its hubs let it reach (cluster.EdgesAccount).
func edgeTunnel(name string, log *slog.Logger) tunnel.Options {
	return tunnel.Options{InboxPrefix: cluster.EdgeInboxPrefix(name), Logger: log}
}

// tunnelConn is the node's NATS connection for tunnels, opened on first
// use: their own, apart from the one the journal and the lease use, so
// that tunnels the server cuts off as a slow consumer take nothing else
// with them, and in the account of edge boxes' leaf links
// (cluster.EdgesAccount), where nothing of the journal's runs. Its release
// closes it after every tunnel's.
func (n *Node) tunnelConn() (*nats.Conn, error) {
	if n.tunnels != nil {
		return n.tunnels, nil
	}
	nc, err := n.Cluster.ConnectEdges(n.o.Cluster.NodeName + "-tunnels")
	if err != nil {
		return nil, fmt.Errorf("node: tunnels: %w", err)
	}
	n.tunnels = nc
	n.closers.push(release(nc.Close))
	return nc, nil
}
