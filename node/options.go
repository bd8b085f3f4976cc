package node

import (
	"crypto/tls"
	"log/slog"
	"net/netip"
	"time"

	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/channel/slack"
	"github.com/gatehouse-dev/gatehouse/channel/telegram"
	"github.com/gatehouse-dev/gatehouse/channel/webpush"
	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/internal/option"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/kernel/policy"
	"github.com/gatehouse-dev/gatehouse/memory"
	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/session"
	"github.com/gatehouse-dev/gatehouse/store"
)

// Options describe a whole gateway node: store, kernel, delivery hub and
// server. The zero value (plus Data or InMemory) runs the embedded default:
// zero fields take the values of Defaults.
type Options struct {
	Addr string // listen address
	// TLS, when set, makes the node serve HTTPS (and wss) on Addr instead
	// of plain HTTP; see package gateway/tlscert for certificates reloaded
	// from files or obtained over ACME. HTTP/2 is never offered.
	TLS      *tls.Config
	Data     string // data folder; required unless InMemory
	InMemory bool   // keep everything in memory (nothing survives a restart)
	Sync     store.SyncMode
	Auth     auth.Options
	Policy   *policy.Engine // nil: the built-in default
	Logger   *slog.Logger

	// InsecureNoAuth lets a node with no credential in Auth listen on an
	// address other hosts can reach. Without it Open refuses such an
	// address (ErrNoAuthOnNetwork): with no credential every request acts
	// as the admin, and the Host check stops a browser's DNS rebinding,
	// not a client that writes the header itself.
	InsecureNoAuth bool

	// Cluster is the node's NATS side: an embedded nats-server with
	// JetStream (in Data's "nats" folder), clustered or linked as a leaf
	// node, or a connection to an existing deployment. Dir and Logger are
	// filled in. The zero value runs no NATS at all.
	Cluster cluster.Options
	// Advertise is the address (host:port) the other nodes of a cluster
	// relay this node's clients to while it leads; empty means Addr,
	// which must then name a host.
	Advertise string
	// JournalPurgeInterval is how often a cluster's leader drops the
	// journal's groups every node reports holding (zero: 30 s). Shorter
	// keeps the journal smaller, at the cost of a request to the
	// positions' bucket each time.
	JournalPurgeInterval time.Duration

	Kernel kernel.Options  // Store, Deliverer, Policy and Logger are filled in
	Server gateway.Options // Kernel, Hub, Auth and Logger are filled in
	Memory memory.Options  // Store and Logger are filled in, LegacyOwner when empty (auth's sole subject)

	OutboxLimit     int           // see peer.Options
	OutboxRetention time.Duration // see peer.Options

	// PeerRetention is how long a consumer (agent, runner or human
	// channel connection identity) that has no connection and nothing
	// left to deliver is remembered, with its cursor and, for a native
	// channel, its registration (see peer.Options.ConsumerRetention and
	// channel.Options.Retention). It is raised to the longer grace
	// period, so that no consumer is forgotten while the kernel still
	// keeps its executions or its job.
	PeerRetention time.Duration
	// WebhookAllow lists the internal networks chat webhooks may reach
	// (see channel.Options.WebhookAllow); nil: public addresses only.
	// Push endpoints follow the same rules.
	WebhookAllow []netip.Prefix
	// Channels configure the human channels: the chat and push adapters
	// (Adapters, an embedder's own), who may answer through them
	// (Responders) and their send bounds. Store, Hub, Logger, Retention
	// and WebhookAllow are filled in.
	Channels channel.Options
	// Telegram, when set, adds the Telegram channel (its Logger is
	// filled in).
	Telegram *telegram.Options
	// Slack, when set, adds the Slack channel (its Logger is filled in).
	Slack *slack.Options
	// WebPush, when set, adds the Web Push channel: its Store is the
	// node's, its Dir the data folder (none when InMemory), its Allow
	// WebhookAllow and its Logger are filled in.
	WebPush *webpush.Options
	// SessionsPerPrincipal is the most durable sessions one principal (an
	// owner within its tenant) may hold, archived ones included (see
	// session.Options.MaxPerOwner).
	SessionsPerPrincipal int

	// Retention deletes finished executions this long after they ended.
	// RetentionCount, when positive, also keeps at most that many finished
	// executions.
	Retention      time.Duration
	RetentionCount int
	// RetentionInterval is how often retention runs. The first pass runs
	// FirstRetention after start (or after one interval, if shorter), so
	// that a box that restarts often still prunes.
	RetentionInterval time.Duration

	// DiskBudget is the most the data folder may hold (zero: its size
	// plus the free space at start), DiskLowWater the room below which
	// new work is refused with 507 STORAGE_FULL (zero: derived), and
	// MemoryLimit the memory the process may use (zero: no bound); see
	// store.Options.
	DiskBudget, DiskLowWater, MemoryLimit int64
}

// Defaults returns the Options `gatehouse serve` starts from: every value
// Open gives a zero field, the kernel's, the server's, the memory's and
// the peer hub's included, and the data folder serve uses unless told
// (Open itself fills no Data). Fields whose default follows from others (the server's
// MaxFrameBytes and ConnectBurst, the store's disk marks) and fields with
// no default stay zero.
func Defaults() Options {
	peers := peer.Defaults()
	return Options{
		Addr:              "127.0.0.1:8080",
		Data:              "./gatehouse-data",
		Sync:              store.SyncAlways,
		Auth:              auth.Options{Leeway: auth.DefaultLeeway},
		Kernel:            kernel.Defaults(),
		Server:            gateway.Defaults(),
		Channels:          channel.Defaults(),
		Memory:            memory.Defaults(),
		OutboxLimit:       peers.OutboxLimit,
		OutboxRetention:   peers.Retention,
		PeerRetention:     peers.ConsumerRetention,
		Retention:         168 * time.Hour,
		RetentionInterval: 10 * time.Minute,

		JournalPurgeInterval: 30 * time.Second,

		SessionsPerPrincipal: session.DefaultMaxPerOwner,
	}
}

// FirstRetention is how long after start the first retention pass runs,
// unless RetentionInterval is shorter.
const FirstRetention = 30 * time.Second

// ShutdownTimeout is how long `gatehouse serve` lets Close wait for
// requests in flight before it closes the remaining connections.
const ShutdownTimeout = 10 * time.Second

// defaults gives the zero fields Open reads itself their default. The
// kernel's graces are filled here too, as the kernel would fill them,
// because PeerRetention is raised to them.
func (o *Options) defaults() {
	d := Defaults()
	if o.Addr == "" {
		o.Addr = d.Addr
	}
	option.Default(&o.PeerRetention, d.PeerRetention)
	option.Default(&o.Retention, d.Retention)
	option.Default(&o.RetentionInterval, d.RetentionInterval)
	option.Default(&o.JournalPurgeInterval, d.JournalPurgeInterval)
	option.Default(&o.Kernel.AgentGrace, d.Kernel.AgentGrace)
	option.Default(&o.Kernel.RunnerGrace, d.Kernel.RunnerGrace)
}
