package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/node"
)

// clusterFlags are serve's flags of the node's NATS side (docs/cluster.md).
// With none of them set the node runs no NATS at all.
type clusterFlags struct {
	name, nodeName, listen, peers string
	clientListen, domain          string
	leafListen, leafRemotes       string
	leafAdvertise                 string
	url, creds, advertise         string
	routeTLS, leafTLS, natsTLS    cluster.TLSFiles
	insecure                      bool
	readyTimeout, election, purge time.Duration
	replicas                      int
}

func (c *clusterFlags) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.name, "cluster-name", "", "run an embedded NATS server with JetStream clustered under this `name`, the same on every node")
	fs.StringVar(&c.nodeName, "node-name", "", "this node's NATS server `name`, unique in the cluster and its leaf nodes (default: the host name); alone, runs an embedded NATS server with JetStream, unclustered")
	fs.StringVar(&c.listen, "cluster-listen", "", "`host:port` the routes of the other nodes arrive on (default 0.0.0.0:6222 with --cluster-name)")
	fs.StringVar(&c.peers, "cluster-peers", "", "comma-separated route `host:port`s of the cluster's nodes (this node's own may be among them)")
	fs.StringVar(&c.routeTLS.Cert, "cluster-tls-cert", "", "this node's certificate (PEM `file`) for routes: mutual TLS, each node presenting its own")
	fs.StringVar(&c.routeTLS.Key, "cluster-tls-key", "", "the private key (PEM `file`) of --cluster-tls-cert")
	fs.StringVar(&c.routeTLS.CA, "cluster-tls-ca", "", "the CA (PEM `file`) that signs every node's route certificate; no other is trusted")
	fs.BoolVar(&c.insecure, "cluster-insecure", false, "allow routes and leaf links in clear text on addresses other than loopback (a network private end to end)")
	fs.DurationVar(&c.election, "cluster-election-timeout", 0, "how long JetStream's raft groups wait without a heartbeat before electing a new leader: that `duration` to twice it (default 1s in a cluster: a failover in about 2s; 4s is about NATS's own timing; at least 500ms; see docs/cluster.md)")
	fs.DurationVar(&c.purge, "cluster-purge-interval", node.Defaults().JournalPurgeInterval, "how often the leader drops the journal's groups that every node holds (`duration`, at least 1s)")
	fs.DurationVar(&c.readyTimeout, "cluster-ready-timeout", 30*time.Second, "how long start waits for JetStream (in a cluster, for a quorum of the nodes to elect a meta leader)")
	fs.StringVar(&c.clientListen, "nats-listen", "", "loopback `host:port` where NATS clients (the nats CLI) may reach the embedded server; empty: none")
	fs.StringVar(&c.domain, "nats-domain", "", "this node's JetStream `domain`: an edge box's own, so that its JetStream stays its own while linked to a hub")
	fs.StringVar(&c.leafListen, "leaf-listen", "", "`host:port` to accept leaf-node links from edge boxes on (a hub)")
	fs.StringVar(&c.leafAdvertise, "leaf-advertise", "", "`host:port` a hub tells its edge boxes to redial it on, when --leaf-listen is not what they reach (NAT, a load balancer)")
	fs.StringVar(&c.leafRemotes, "leaf-remote", "", "comma-separated hub `URL`s (tls://host:7422, or nats-leaf://) this node links out to as a leaf node (an edge box)")
	fs.StringVar(&c.leafTLS.Cert, "leaf-tls-cert", "", "certificate (PEM `file`) for leaf links: a hub's served certificate, or the one an edge box presents")
	fs.StringVar(&c.leafTLS.Key, "leaf-tls-key", "", "the private key (PEM `file`) of --leaf-tls-cert")
	fs.StringVar(&c.leafTLS.CA, "leaf-tls-ca", "", "CA (PEM `file`): on a hub, edge boxes must present a certificate it signed; on an edge box, it verifies the hub")
	fs.StringVar(&c.url, "nats-url", "", "join an existing NATS deployment (comma-separated server `URL`s) instead of embedding a server")
	fs.StringVar(&c.creds, "nats-creds", "", "NATS credentials `file` for --nats-url")
	fs.IntVar(&c.replicas, "nats-replicas", 0, "`replicas` of the journal and the buckets Gatehouse creates on --nats-url, 1 to 5 (default: an existing stream's own; 3 on a clustered deployment, 1 on a server alone)")
	fs.StringVar(&c.natsTLS.Cert, "nats-tls-cert", "", "client certificate (PEM `file`) for --nats-url")
	fs.StringVar(&c.natsTLS.Key, "nats-tls-key", "", "the private key (PEM `file`) of --nats-tls-cert")
	fs.StringVar(&c.advertise, "cluster-advertise", "", "`host:port` the other nodes relay this node's clients to while it leads (default: --addr, which must then name a host)")
	fs.StringVar(&c.natsTLS.CA, "nats-tls-ca", "", "CA (PEM `file`) that verifies the servers of --nats-url (default: the system's)")
}

// apply sets o's NATS side from the flags.
func (c *clusterFlags) apply(o *node.Options) error {
	if c.purge < time.Second {
		return fmt.Errorf("--cluster-purge-interval %s: at least 1s", c.purge)
	}
	o.Advertise = c.advertise
	o.JournalPurgeInterval = c.purge
	o.Cluster = cluster.Options{
		Name: c.name, NodeName: c.nodeName, Listen: c.listen, Peers: splitList(c.peers),
		ClientListen: c.clientListen, Domain: c.domain,
		LeafListen: c.leafListen, LeafAdvertise: c.leafAdvertise, LeafRemotes: splitList(c.leafRemotes),
		URL: c.url, Creds: c.creds, Replicas: c.replicas,
		RouteTLS: c.routeTLS, LeafTLS: c.leafTLS, ClientTLS: c.natsTLS,
		Insecure: c.insecure, ReadyTimeout: c.readyTimeout, ElectionTimeout: c.election,
	}
	return nil
}
