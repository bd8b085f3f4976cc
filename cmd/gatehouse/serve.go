package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/internal/procs"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/kernel/policy"
	"github.com/gatehouse-dev/gatehouse/memory"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/store"
)

// config is everything `serve` can be told.
type config struct {
	addr, data, token, policy, sync string
	inMemory, insecureNoAuth        bool
	cors                            string
	logLevel, logFormat             string
	stepTimeout, execTimeout        time.Duration
	agentGrace, runnerGrace         time.Duration
	heartbeat, shutdownTimeout      time.Duration
	maxBody, outboxLimit            int
	sessionsPerPrincipal            int
	outboxRetention, writeTimeout   time.Duration
	retention, retentionInterval    time.Duration
	retentionCount                  int
	idemWindow                      time.Duration
	idemKeys                        int
	peerRetention                   time.Duration
	webhookAllow                    prefixes
	channels                        channelFlags
	jwtSecret, jwtIssuer, jwtAud    string
	jwtKeys                         keyFiles
	jwtLeeway                       time.Duration
	headerTimeout, readTimeout      time.Duration
	idleTimeout                     time.Duration
	maxConns, maxConnsPerIP         int
	allowedHosts                    string
	tls                             tlsFlags
	diskBudget, diskLowWater        byteSize
	memoryLimit                     byteSize
	pprofAddr                       string
	adaptiveProcs                   bool
	notes, tenantNotes              int
	noteBytes, tenantNoteBytes      byteSize
	memoryWorkers                   int
	cluster                         clusterFlags

	// load is told of the requests served, for the processors' governor
	// (see serve); nil without one.
	load gateway.Load
}

// keyFiles collects repeated --jwt-public-key kid=path flags.
type keyFiles map[string]string

func (k *keyFiles) String() string { return fmt.Sprint(map[string]string(*k)) }

func (k *keyFiles) Set(v string) error {
	kid, path, ok := strings.Cut(v, "=")
	if !ok {
		kid, path = "", v
	}
	if path == "" {
		return fmt.Errorf("want [kid=]path")
	}
	if *k == nil {
		*k = keyFiles{}
	}
	(*k)[kid] = path
	return nil
}

// prefixes collects the networks of --webhook-allow-net: comma-separated
// CIDR prefixes or single addresses, repeatable.
type prefixes []netip.Prefix

func (p *prefixes) String() string {
	s := make([]string, len(*p))
	for i, x := range *p {
		s[i] = x.String()
	}
	return strings.Join(s, ",")
}

func (p *prefixes) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if pr, err := netip.ParsePrefix(part); err == nil {
			*p = append(*p, pr.Masked())
			continue
		}
		a, err := netip.ParseAddr(part)
		if err != nil {
			return fmt.Errorf("%q is neither an address nor a CIDR prefix", part)
		}
		*p = append(*p, netip.PrefixFrom(a, a.BitLen()))
	}
	return nil
}

// flags declares serve's flags on fs; their defaults are node.Defaults.
func (c *config) flags(fs *flag.FlagSet) {
	d := node.Defaults()
	fs.StringVar(&c.addr, "addr", d.Addr, "listen address `host:port`")
	fs.StringVar(&c.data, "data", d.Data, "data folder (Badger database)")
	fs.BoolVar(&c.inMemory, "in-memory", false, "keep all state in memory (nothing survives a restart)")
	fs.StringVar(&c.token, "token", "", "static bearer token required on every endpoint but health and ready (empty: open, which only a loopback --addr allows)")
	fs.BoolVar(&c.insecureNoAuth, "insecure-no-auth", false, "serve a non-loopback --addr with no --token or JWT key: anyone who can reach it acts as the admin")
	fs.StringVar(&c.policy, "policy", "", "policy `file or folder` (YAML); empty: built-in default, which denies shell-like tools")
	fs.StringVar(&c.sync, "sync", d.Sync.String(), "durability: always (fsync before every answer), batch (fsync every 10ms), none")
	fs.StringVar(&c.cors, "cors-origins", "", "comma-separated allowed CORS origins, or *")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "text", "text or json")
	fs.DurationVar(&c.stepTimeout, "step-timeout", d.Kernel.StepTimeout, "step deadline unless the policy sets one")
	fs.DurationVar(&c.execTimeout, "execution-timeout", d.Kernel.ExecutionTimeout, "maximum lifetime of an execution")
	fs.DurationVar(&c.agentGrace, "agent-grace", d.Kernel.AgentGrace, "how long a disconnected agent keeps its executions")
	fs.DurationVar(&c.runnerGrace, "runner-grace", d.Kernel.RunnerGrace, "how long a disconnected runner keeps its job")
	fs.DurationVar(&c.heartbeat, "heartbeat", d.Server.Heartbeat, "SSE heartbeat interval")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", node.ShutdownTimeout, "how long shutdown waits for requests in flight")
	fs.IntVar(&c.maxBody, "max-body", d.Server.MaxBodyBytes, "maximum request body in bytes")
	fs.IntVar(&c.outboxLimit, "outbox-limit", d.OutboxLimit, "maximum unacknowledged pushes kept per agent or runner consumer")
	fs.IntVar(&c.sessionsPerPrincipal, "max-sessions-per-principal", d.SessionsPerPrincipal, "durable sessions one principal may hold, archived ones included; past it a new one is 403 QUOTA_EXCEEDED")
	fs.DurationVar(&c.outboxRetention, "outbox-retention", d.OutboxRetention, "how long unacknowledged pushes are kept for an absent consumer")
	fs.DurationVar(&c.writeTimeout, "write-timeout", d.Server.WriteTimeout, "a stream write that takes longer ends the stream (slow consumer)")
	fs.DurationVar(&c.retention, "retention", d.Retention, "finished executions are deleted this long after they end")
	fs.IntVar(&c.retentionCount, "retention-count", d.RetentionCount, "keep at most this many finished executions (0: no count bound)")
	fs.DurationVar(&c.retentionInterval, "retention-interval", d.RetentionInterval, fmt.Sprintf("how often retention runs; its first pass comes at most %v after start", node.FirstRetention))
	fs.DurationVar(&c.idemWindow, "idempotency-window", d.Kernel.IdempotencyWindow, "how long the Idempotency-Key of a create is remembered")
	fs.IntVar(&c.idemKeys, "idempotency-keys", d.Kernel.IdempotencyKeys, "create Idempotency-Keys remembered at most; the oldest make room")
	fs.DurationVar(&c.peerRetention, "peer-retention", d.PeerRetention, "how long a consumer (agent, runner, channel) with no connection and nothing to deliver is remembered; at least the longer grace")
	c.channels.flags(fs, d)
	fs.Var(&c.webhookAllow, "webhook-allow-net", "comma-separated `CIDRs or addresses` of internal networks chat webhooks may reach (loopback, private, link-local...); repeatable")
	fs.DurationVar(&c.headerTimeout, "header-timeout", d.Server.HeaderTimeout, "time to read a request's headers")
	fs.DurationVar(&c.readTimeout, "read-timeout", d.Server.ReadTimeout, "time to read a request's body")
	fs.DurationVar(&c.idleTimeout, "idle-timeout", d.Server.IdleTimeout, "how long a keep-alive connection may wait for its next request")
	fs.IntVar(&c.maxConns, "max-conns", d.Server.MaxConns, "concurrent connections; past it new ones get 503")
	fs.IntVar(&c.maxConnsPerIP, "max-conns-per-ip", d.Server.MaxConnsPerIP, "concurrent connections from one address; past it new ones get 429 (negative: no bound)")
	fs.StringVar(&c.allowedHosts, "allowed-hosts", "", "comma-separated host names a gateway without a token answers to, besides loopback (DNS-rebinding guard)")
	fs.StringVar(&c.jwtSecret, "jwt-secret", "", "HS256 secret (at least 32 bytes) accepted for JWT bearer tokens")
	fs.Var(&c.jwtKeys, "jwt-public-key", "`[kid=]path` of an Ed25519 or RSA public key (PEM) accepted for JWTs; repeatable")
	fs.StringVar(&c.jwtIssuer, "jwt-issuer", "", "required JWT issuer (iss)")
	fs.StringVar(&c.jwtAud, "jwt-audience", "", "required JWT audience (aud)")
	fs.DurationVar(&c.jwtLeeway, "jwt-leeway", d.Auth.Leeway, "clock skew allowed on JWT times (exp, nbf, iat); at most 5m")
	c.tls.flags(fs)
	fs.Var(&c.diskBudget, "disk-budget", "the most the data folder may hold (`size`: 64MiB, 2GB); 0: its size plus the free space at start")
	fs.Var(&c.memoryLimit, "memory-limit", "memory the gateway may use (`size`): sizes the Go heap's soft limit (unless GOMEMLIMIT is set) and the store's memory tables and caches; 0: the cgroup's limit, if any")
	fs.BoolVar(&c.adaptiveProcs, "adaptive-procs", true, "run Go on one processor while requests are few and on all of them under load (off when GOMAXPROCS is set)")
	fs.StringVar(&c.pprofAddr, "pprof-addr", "", "serve Go's profiles (/debug/pprof/) on this loopback `host:port`; empty: off")
	fs.Var(&c.diskLowWater, "disk-low-water", "room (free space, or what the budget leaves) below which new work gets 507 STORAGE_FULL (`size`); 0: derived from the budget")
	fs.IntVar(&c.notes, "memory-notes", d.Memory.MaxNotes, "memory notes one principal (or one tenant's shared space) may keep")
	c.noteBytes, c.tenantNoteBytes = byteSize(d.Memory.MaxBytes), byteSize(d.Memory.MaxTenantBytes)
	fs.Var(&c.noteBytes, "memory-bytes", "content of the memory notes one principal (or one tenant's shared space) may keep (`size`)")
	fs.IntVar(&c.tenantNotes, "memory-tenant-notes", d.Memory.MaxTenantNotes, "memory notes all the spaces of one tenant may keep together")
	fs.Var(&c.tenantNoteBytes, "memory-tenant-bytes", "content of the memory notes all the spaces of one tenant may keep together (`size`)")
	fs.IntVar(&c.memoryWorkers, "memory-workers", d.Memory.Workers, "memory calls run at once; one tenant runs at most one fewer")
	c.cluster.flags(fs)
}

// authOptions turns the auth flags into auth.Options.
func (c *config) authOptions() auth.Options {
	o := auth.Options{StaticToken: c.token, PublicKeyFiles: c.jwtKeys, Issuer: c.jwtIssuer, Audience: c.jwtAud, Leeway: c.jwtLeeway}
	if c.jwtSecret != "" {
		o.HMACSecrets = map[string][]byte{"": []byte(c.jwtSecret)}
	}
	return o
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	o := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	}
	return nil, fmt.Errorf("log format %q: want text or json", format)
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	var c config
	fs := newFlagSet("serve", stderr)
	c.flags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	log, err := newLogger(stderr, c.logLevel, c.logFormat)
	if err != nil {
		return err
	}
	st, err := c.tls.build(c.data, c.addr, log)
	if err != nil {
		return err
	}
	if err := st.serveHTTP01(c.tls.acmeHTTP); err != nil {
		return err
	}
	stopPprof := func(context.Context) {}
	if c.pprofAddr != "" {
		if _, stopPprof, err = servePprof(c.pprofAddr, log); err != nil {
			st.close(context.Background())
			return err
		}
	}
	gov := c.governor()
	if gov != nil {
		c.load = gov
	}
	var g interface{ Close(context.Context) error }
	if c.cluster.name != "" || c.cluster.url != "" {
		g, err = startMember(ctx, c, st, log)
	} else {
		g, err = start(ctx, c, st, log)
	}
	if err != nil {
		stopPprof(context.Background())
		st.close(context.Background())
		if ctx.Err() != nil {
			// Stopped while starting: everything opened was closed again,
			// which is a clean shutdown.
			log.Info("shutting down", "during", "startup", "err", err)
			return nil
		}
		return err
	}
	stopGov := func() {}
	if gov != nil {
		stopGov = runGovernor(gov)
	}
	<-ctx.Done()
	stopGov()
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	err = g.Close(sctx)
	st.close(sctx)
	stopPprof(sctx)
	return err
}

// governor returns the processors' governor c asks for, or nil: none
// when the flag is off, when GOMAXPROCS is set (the operator chose), or
// when Go has one processor anyway.
func (c config) governor() *procs.Governor {
	if !c.adaptiveProcs || os.Getenv("GOMAXPROCS") != "" || runtime.GOMAXPROCS(0) < 2 {
		return nil
	}
	return &procs.Governor{Max: runtime.GOMAXPROCS(0)}
}

// runGovernor runs gov until the returned function is called, which waits
// for it to give the processors back.
func runGovernor(gov *procs.Governor) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		gov.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// startOptions are the options of the node described by c, serving TLS
// as st says, and what start logs of them.
type startOptions struct {
	node.Options
	pol               *policy.Engine
	memLimit, goLimit int64
	memSource         string
}

// options builds c's node options.
func (c config) options(st *serverTLS, log *slog.Logger) (startOptions, error) {
	mode, err := store.ParseSyncMode(c.sync)
	if err != nil {
		return startOptions{}, err
	}
	pol := policy.Default()
	if c.policy != "" {
		if pol, err = policy.Load(c.policy); err != nil {
			return startOptions{}, err
		}
	}
	memLimit, memSource := memoryLimit(int64(c.memoryLimit), cgroupRoot)
	goLimit := applyMemoryLimit(memLimit)
	origins := splitList(c.cors)
	o := node.Options{
		Addr: c.addr, TLS: st.config, Data: c.data, InMemory: c.inMemory, Sync: mode, Logger: log, Policy: pol,
		Auth: c.authOptions(), InsecureNoAuth: c.insecureNoAuth,
		OutboxLimit: c.outboxLimit, OutboxRetention: c.outboxRetention,
		Retention: c.retention, RetentionCount: c.retentionCount, RetentionInterval: c.retentionInterval,
		PeerRetention: c.peerRetention, WebhookAllow: c.webhookAllow, SessionsPerPrincipal: c.sessionsPerPrincipal,
		DiskBudget: int64(c.diskBudget), DiskLowWater: int64(c.diskLowWater), MemoryLimit: memLimit,
		Kernel: kernel.Options{
			StepTimeout: c.stepTimeout, ExecutionTimeout: c.execTimeout,
			AgentGrace: c.agentGrace, RunnerGrace: c.runnerGrace,
			IdempotencyWindow: c.idemWindow, IdempotencyKeys: c.idemKeys,
		},
		Memory: memory.Options{
			MaxNotes: c.notes, MaxBytes: int64(c.noteBytes), MaxTenantNotes: c.tenantNotes, MaxTenantBytes: int64(c.tenantNoteBytes),
			Workers: c.memoryWorkers,
		},
		Server: gateway.Options{
			Heartbeat: c.heartbeat, WriteTimeout: c.writeTimeout, MaxBodyBytes: c.maxBody, CORSOrigins: origins,
			HeaderTimeout: c.headerTimeout, ReadTimeout: c.readTimeout, IdleTimeout: c.idleTimeout,
			MaxConns: c.maxConns, MaxConnsPerIP: c.maxConnsPerIP, AllowedHosts: splitList(c.allowedHosts),
			Load: c.load,
		},
	}
	if err := c.channels.apply(&o); err != nil {
		return startOptions{}, err
	}
	if err := c.cluster.apply(&o); err != nil {
		return startOptions{}, err
	}
	return startOptions{Options: o, pol: pol, memLimit: memLimit, goLimit: goLimit, memSource: memSource}, nil
}

// start opens the node described by c, serving TLS as st says (nil: plain
// HTTP).
func start(ctx context.Context, c config, st *serverTLS, log *slog.Logger) (*node.Node, error) {
	if st == nil {
		st = &serverTLS{mode: "off"}
	}
	so, err := c.options(st, log)
	if err != nil {
		return nil, err
	}
	o, pol, mode := so.Options, so.pol, so.Sync
	memLimit, memSource, goLimit := so.memLimit, so.memSource, so.goLimit
	n, err := node.Open(ctx, o)
	if errors.Is(err, node.ErrNoAuthOnNetwork) {
		return nil, fmt.Errorf("serve: %w: anyone who can reach %s would act as the admin; set --token (or --jwt-secret or --jwt-public-key), listen on loopback (--addr 127.0.0.1:%s), or add --insecure-no-auth if every host that can reach it is trusted",
			node.ErrNoAuthOnNetwork, c.addr, port(c.addr))
	}
	if err != nil {
		return nil, err
	}
	where := c.data
	if c.inMemory {
		where = "memory"
	}
	authMode := "open (no token)"
	switch {
	case n.Auth.Open():
	case c.jwtSecret != "" || len(c.jwtKeys) > 0:
		authMode = "jwt"
		if c.token != "" {
			authMode = "jwt and static token"
		}
	default:
		authMode = "static token"
	}
	attrs := []any{"addr", n.Addr().String(), "tls", st.mode}
	for _, a := range st.attrs {
		attrs = append(attrs, a)
	}
	log.Info("gatehouse listening", append(attrs, "data", where, "sync", mode.String(),
		"policy", pol.Source(), "auth", authMode, "epoch", n.Store.Epoch(), "procs", runtime.GOMAXPROCS(0))...)
	if n.Auth.Open() && c.insecureNoAuth {
		log.Warn("no credentials (--insecure-no-auth): anyone who can reach the gateway acts as the admin", "addr", n.Addr().String())
	}
	if n.Cluster != nil {
		st := n.Cluster.Status(ctx)
		log.Info("NATS", "mode", st.Mode, "node", st.Node, "cluster", st.Cluster, "meta_leader", st.JetStream.MetaLeader,
			"routes", len(st.Routes), "leafs", len(st.Leafs), "domain", st.JetStream.Domain)
	}
	if memLimit > 0 {
		log.Info("memory limit", "limit", byteSize(memLimit).String(), "from", memSource, "go_heap_limit", byteSize(goLimit).String())
	}
	if sp := n.Store.Space(); sp.Budget > 0 {
		log.Info("storage", "free", byteSize(sp.Free).String(), "used", byteSize(sp.Used).String(),
			"low_water", byteSize(sp.LowWater).String(), "reserve", byteSize(sp.Reserve).String())
	}
	return n, nil
}

// port is the port of a listen address, or 8080 when it has none.
func port(addr string) string {
	if _, p, err := net.SplitHostPort(addr); err == nil && p != "" {
		return p
	}
	return "8080"
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(v string) []string {
	var out []string
	for _, o := range strings.Split(v, ",") {
		if o = strings.TrimSpace(o); o != "" {
			out = append(out, o)
		}
	}
	return out
}

// startMember opens the cluster member described by c, serving TLS as st
// says.
func startMember(ctx context.Context, c config, st *serverTLS, log *slog.Logger) (*node.Member, error) {
	so, err := c.options(st, log)
	if err != nil {
		return nil, err
	}
	m, err := node.OpenMember(ctx, so.Options)
	if errors.Is(err, node.ErrNoAuthOnNetwork) {
		return nil, fmt.Errorf("serve: %w: anyone who can reach %s would act as the admin; set --token (or --jwt-secret or --jwt-public-key), or listen on loopback",
			node.ErrNoAuthOnNetwork, c.addr)
	}
	if err != nil {
		return nil, err
	}
	log.Info("gatehouse listening as a cluster member", "addr", m.Addr().String(), "tls", st.mode, "data", c.data,
		"sync", so.Sync.String(), "policy", so.pol.Source(), "node", so.Cluster.NodeName, "cluster", so.Cluster.Name,
		"journal", m.Store().Replicated(), "procs", runtime.GOMAXPROCS(0))
	return m, nil
}
