// Package natstest runs NATS deployments for tests: servers with
// JetStream in the test process, on loopback, as an operator's deployment
// that Gatehouse does not run and joins by URL (--nats-url). A deployment
// authenticates its users with passwords (Deployment), or, in operator
// mode, with the JWTs of an Operator's accounts (OperatorDeployment).
package natstest

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
)

// Deployment starts size servers named s1, s2, ... with JetStream, each
// storing in its own temporary folder and listening for clients on a free
// loopback port, with users as its only users. Past one server they are
// routed to each other on loopback (cluster "ops"), so that streams of
// three replicas can be placed. Their max_payload takes the journal's
// groups, as docs/cluster.md asks of an operator. It returns the servers'
// client URLs (nats://host:port, without credentials) once JetStream
// serves on each; the test's cleanup shuts them down.
func Deployment(tb testing.TB, size int, users []*server.User) []string {
	tb.Helper()
	urls, _ := deploy(tb, size, func(o *server.Options) { o.Users = users })
	return urls
}

// OperatorDeployment starts size servers as Deployment does, in operator
// mode: they trust op, take op's system account as theirs, and know the
// accounts op has made so far, whose JWTs (as they stand now: limits and
// revocations changed after this call are not seen) preload each
// server's memory resolver, as `resolver: MEMORY` with `resolver_preload`
// does. Users authenticate with their account's user JWTs (User.Creds).
func OperatorDeployment(tb testing.TB, size int, op *Operator) []string {
	tb.Helper()
	opJWT, err := op.claims.Encode(op.key)
	if err != nil {
		tb.Fatal(err)
	}
	opClaims, err := jwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		tb.Fatal(err)
	}
	jwts := map[string]string{}
	for _, a := range append([]*Account{op.system}, op.accounts...) {
		if jwts[a.pub], err = a.Claims.Encode(op.key); err != nil {
			tb.Fatal(err)
		}
	}
	withJetStream := map[string]bool{}
	for _, a := range op.accounts {
		withJetStream[a.pub] = a.Claims.Limits.JetStreamLimits.DiskStorage != 0 || a.Claims.Limits.JetStreamLimits.MemoryStorage != 0
	}
	urls, servers := deploy(tb, size, func(o *server.Options) {
		// Each server its own resolver, as each reads its own config.
		resolver := &server.MemAccResolver{}
		for pub, j := range jwts {
			if err := resolver.Store(pub, j); err != nil {
				tb.Fatal(err)
			}
		}
		o.TrustedOperators = []*jwt.OperatorClaims{opClaims}
		o.SystemAccount = op.system.pub
		o.AccountResolver = resolver
	})
	// A server registers an account, and enables the JetStream its JWT
	// grants, when it first meets it: until every server has, a request
	// that reaches one that has not is refused with "jetstream not enabled
	// for account", whatever the account's limits.
	for _, s := range servers {
		for pub, js := range withJetStream {
			eventually.Check(tb, func() error {
				acc, err := s.LookupAccount(pub)
				switch {
				case err != nil:
					return fmt.Errorf("%s: account %s: %w", s.Name(), pub, err)
				case js && !acc.JetStreamEnabled():
					return fmt.Errorf("%s: account %s: JetStream not enabled yet", s.Name(), pub)
				}
				return nil
			})
		}
	}
	return urls
}

// deploy starts size servers, each with the options configure completes,
// and returns their client URLs and the servers.
func deploy(tb testing.TB, size int, configure func(*server.Options)) ([]string, []*server.Server) {
	tb.Helper()
	var routes []*url.URL
	routePorts := make([]int, size)
	for i := range routePorts {
		routePorts[i] = loopback.FreePort(tb)
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", routePorts[i])})
	}
	servers := make([]*server.Server, size)
	for i := range servers {
		o := &server.Options{
			ServerName: fmt.Sprintf("s%d", i+1),
			Host:       "127.0.0.1",
			Port:       server.RANDOM_PORT,
			JetStream:  true,
			StoreDir:   tb.TempDir(),
			NoSigs:     true,
			MaxPayload: cluster.MaxGroupBytes + 64<<10,
		}
		configure(o)
		if size > 1 {
			o.Cluster = server.ClusterOpts{Name: "ops", Host: "127.0.0.1", Port: routePorts[i]}
			o.Routes = routes
		}
		s, err := server.NewServer(o)
		if err != nil {
			tb.Fatal(err)
		}
		servers[i] = s
		go s.Start()
		tb.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	}
	var out []string
	for _, s := range servers {
		if !s.ReadyForConnections(10 * time.Second) {
			tb.Fatalf("NATS server %s did not start", s.Name())
		}
		out = append(out, "nats://"+s.Addr().String())
	}
	for _, s := range servers {
		eventually.Check(tb, func() error {
			if h := s.Healthz(&server.HealthzOptions{JSMetaOnly: true}); h.Error != "" {
				return fmt.Errorf("%s: %s", s.Name(), h.Error)
			}
			return nil
		})
	}
	// A meta leader places a stream of three replicas only on the peers
	// it has heard from: until then, "no suitable peers for placement".
	eventually.Check(tb, func() error { return metaCurrent(servers) })
	return out, servers
}

// metaCurrent reports whether the servers' meta leader counts every other
// server a current, online peer.
func metaCurrent(servers []*server.Server) error {
	if len(servers) == 1 {
		return nil
	}
	for _, s := range servers {
		if !s.JetStreamIsLeader() {
			continue
		}
		js, err := s.Jsz(nil)
		if err != nil || js.Meta == nil {
			return fmt.Errorf("%s: meta group: %v", s.Name(), err)
		}
		current := 0
		for _, p := range js.Meta.Replicas {
			if p.Current && !p.Offline {
				current++
			}
		}
		if current != len(servers)-1 {
			return fmt.Errorf("meta leader %s: %d of %d peers current", s.Name(), current, len(servers)-1)
		}
		return nil
	}
	return fmt.Errorf("no meta leader")
}

// Operator is the root of an operator-mode deployment's trust: its key
// signs the JWTs of its accounts (the system account among them), whose
// keys sign their users'.
type Operator struct {
	tb       testing.TB
	key      nkeys.KeyPair
	claims   *jwt.OperatorClaims
	system   *Account
	accounts []*Account
}

// NewOperator makes an operator with its system account ("SYS", without
// JetStream).
func NewOperator(tb testing.TB) *Operator {
	tb.Helper()
	key, pub := newKey(tb, nkeys.CreateOperator)
	op := &Operator{tb: tb, key: key, claims: jwt.NewOperatorClaims(pub)}
	op.claims.Name = "ops"
	op.system = op.newAccount("SYS")
	op.claims.SystemAccount = op.system.pub
	return op
}

// Account makes an account named name whose streams may use up to limits
// (zero limits: JetStream is not enabled for it).
func (op *Operator) Account(name string, limits jwt.JetStreamLimits) *Account {
	op.tb.Helper()
	a := op.newAccount(name)
	a.Claims.Limits.JetStreamLimits = limits
	op.accounts = append(op.accounts, a)
	return a
}

func (op *Operator) newAccount(name string) *Account {
	key, pub := newKey(op.tb, nkeys.CreateAccount)
	a := &Account{op: op, key: key, pub: pub, Claims: jwt.NewAccountClaims(pub)}
	a.Claims.Name = name
	return a
}

// UnlimitedJetStream are JetStream limits that do not limit.
var UnlimitedJetStream = jwt.JetStreamLimits{MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit,
	Streams: jwt.NoLimit, Consumer: jwt.NoLimit}

// Account is an account of an Operator. Its Claims are what the
// deployment started after a change reads (limits, revocations).
type Account struct {
	op     *Operator
	key    nkeys.KeyPair
	pub    string
	Claims *jwt.AccountClaims
}

// User is a user of an Account.
type User struct {
	// Public is the user's public key, the subject of its JWT.
	Public string
	// Seed is the user's private seed, which its creds file holds.
	Seed string
	// Creds is the path of its credentials file (JWT and seed, mode 0600),
	// in the test's temporary folder.
	Creds string
}

// User makes a user named name of the account, with perms, and writes its
// credentials file as `nsc generate creds` does.
func (a *Account) User(name string, perms jwt.Permissions) User {
	tb := a.op.tb
	tb.Helper()
	key, pub := newKey(tb, nkeys.CreateUser)
	uc := jwt.NewUserClaims(pub)
	uc.Name = name
	uc.Permissions = perms
	token, err := uc.Encode(a.key)
	if err != nil {
		tb.Fatal(err)
	}
	seed, err := key.Seed()
	if err != nil {
		tb.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(token, seed)
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(tb.TempDir(), name+".creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		tb.Fatal(err)
	}
	return User{Public: pub, Seed: string(seed), Creds: path}
}

// Revoke revokes every JWT of u issued up to now, in the account's
// claims.
func (a *Account) Revoke(u User) { a.Claims.Revoke(u.Public) }

// newKey makes a key pair with create and returns it with its public key.
func newKey(tb testing.TB, create func() (nkeys.KeyPair, error)) (nkeys.KeyPair, string) {
	tb.Helper()
	key, err := create()
	if err != nil {
		tb.Fatal(err)
	}
	pub, err := key.PublicKey()
	if err != nil {
		tb.Fatal(err)
	}
	return key, pub
}
