package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/gatehouse-dev/gatehouse/client"
	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/cluster/natstest"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
)

// gatehouseJWTRights are gatehouseRights as a user's JWT carries them.
var gatehouseJWTRights = jwt.Permissions{
	Pub: jwt.Permission{Allow: jwt.StringList(gatehouseRights.Publish.Allow)},
	Sub: jwt.Permission{Allow: jwt.StringList(gatehouseRights.Subscribe.Allow)},
}

// TestClusterMembersAuthenticateWithACredentialsFile runs two `gatehouse
// serve --nats-url --nats-creds` processes on a NATS deployment of three
// servers in operator mode (decentralized JWT auth, as NGS, Synadia Cloud
// and nsc-made deployments are), whose users authenticate with a creds
// file only, in an account given the least docs/cluster.md asks. One
// leads, the other follows it, an execution created through each is read
// through the other, and neither lacked a right. A member refused by the
// deployment (a user of an account it does not know, a revoked user), or
// whose creds file holds no seed, or whose account cannot serve it (no
// JetStream, limits a byte short of the journal's, max_bytes required of
// every stream, a user without JetStream's API) fails within seconds with
// one line that says which, and no output shows a user's seed.
func TestClusterMembersAuthenticateWithACredentialsFile(t *testing.T) {
	t.Parallel()
	op := natstest.NewOperator(t)
	// Untiered limits count each replica of a stream's max_bytes: the
	// journal's three of 4 GiB, and a byte for each of the buckets' (which
	// have none). Three streams, a consumer per member and two more.
	enough := jwt.JetStreamLimits{DiskStorage: 3*cluster.JournalMaxBytes + 1<<20, Streams: 3, Consumer: 2 + 2}
	account := op.Account("GATEHOUSE", enough)
	member := account.User("gatehouse", gatehouseJWTRights)
	revoked := account.User("revoked", gatehouseJWTRights)
	account.Revoke(revoked)
	noAPI := account.User("no-api", jwt.Permissions{Sub: gatehouseJWTRights.Sub, Pub: jwt.Permission{
		Allow: slices.DeleteFunc(slices.Clone(gatehouseJWTRights.Pub.Allow), func(s string) bool { return s == "$JS.API.>" })}})
	noJetStream := op.Account("NO_JETSTREAM", jwt.JetStreamLimits{}).User("no-jetstream", gatehouseJWTRights)
	short := enough
	short.DiskStorage = 3*cluster.JournalMaxBytes - 1
	tooSmall := op.Account("TOO_SMALL", short).User("too-small", gatehouseJWTRights)
	bounded := enough
	bounded.MaxBytesRequired = true
	boundsRequired := op.Account("MAX_BYTES_REQUIRED", bounded).User("bounds-required", gatehouseJWTRights)
	stranger := natstest.NewOperator(t).Account("ELSEWHERE", enough).User("stranger", gatehouseJWTRights)
	seedless := withoutSeed(t, member)
	servers := natstest.OperatorDeployment(t, 3, op)
	natsURL := strings.Join(servers, ",")

	nodes := []*natsNode{
		newExternalNode(t, "n1", natsURL, "--nats-creds", member.Creds),
		newExternalNode(t, "n2", natsURL, "--nats-creds", member.Creds),
	}
	startAll(t, nodes...)
	leaderOf(t, nodes)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for i, n := range nodes {
		through, err := client.New(client.Options{BaseURL: n.base})
		if err != nil {
			t.Fatal(err)
		}
		ex, err := through.CreateExecution(ctx, client.CreateRequest{AgentID: "nobody"})
		if err != nil {
			t.Fatalf("create through %s: %v", n.name, err)
		}
		other := nodes[1-i]
		via, err := client.New(client.Options{BaseURL: other.base})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := via.GetExecution(ctx, ex.ID); err != nil || got.ID != ex.ID {
			t.Fatalf("execution %s created through %s, read through %s: %+v %v", ex.ID, n.name, other.name, got, err)
		}
	}
	for _, n := range nodes {
		if strings.Contains(n.logs.String(), "Permissions Violation") {
			t.Errorf("%s lacked a right it needs:\n%s", n.name, n.logs)
		}
		if strings.Contains(n.logs.String(), member.Seed) {
			t.Errorf("%s's output shows its user's seed", n.name)
		}
	}

	const (
		refused = "refused this node's credentials (the user in --nats-url, or --nats-creds)"
		unfit   = "the NATS account cannot serve this node"
	)
	for _, tc := range []struct {
		name  string
		creds string
		seed  string
		want  []string
	}{
		{"a user of an account the deployment does not know", stranger.Creds, stranger.Seed, []string{refused}},
		{"a revoked user", revoked.Creds, revoked.Seed, []string{refused}},
		{"a creds file without its seed", seedless, member.Seed, []string{"--nats-creds", "no nkey seed found"}},
		{"an account without JetStream", noJetStream.Creds, noJetStream.Seed,
			[]string{unfit, "jetstream not enabled for account"}},
		{"an account whose limits are a byte short of the journal's", tooSmall.Creds, tooSmall.Seed,
			[]string{unfit, "journal stream (3 replicas of at most 4294967296 bytes)", "insufficient storage resources"}},
		{"an account that requires every stream's max_bytes", boundsRequired.Creds, boundsRequired.Seed,
			[]string{unfit, "max_bytes_required", "gatehouse_leader", "account requires a stream config to have max bytes set"}},
		{"a user without the right to use JetStream's API", noAPI.Creds, noAPI.Seed,
			[]string{unfit, `Permissions Violation for Publish to "$JS.API.INFO"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"serve", "--addr", loopback.FreeAddr(t), "--data", t.TempDir(), "--node-name", "n9",
				"--nats-url", natsURL, "--nats-creds", tc.creds, "--cluster-ready-timeout", "30s"}
			var stdout, stderr bytes.Buffer
			err := refusedStart(t, args, &stdout, &stderr)
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("serve's error %q does not say %q", err, want)
				}
			}
			for what, out := range map[string]string{"error": err.Error(), "stdout": stdout.String(), "stderr": stderr.String()} {
				if strings.Contains(out, tc.seed) {
					t.Errorf("serve's %s shows the user's seed: %s", what, out)
				}
			}
		})
	}
}

// withoutSeed writes u's creds file without its seed (its JWT only, as
// `nsc describe user --raw` prints it) and returns its path.
func withoutSeed(t *testing.T, u natstest.User) string {
	t.Helper()
	creds, err := os.ReadFile(u.Creds)
	if err != nil {
		t.Fatal(err)
	}
	jwtOnly, _, found := strings.Cut(string(creds), "-----BEGIN USER NKEY SEED-----")
	if !found {
		t.Fatalf("%s holds no seed to leave out", u.Creds)
	}
	path := filepath.Join(t.TempDir(), "jwt-only.creds")
	if err := os.WriteFile(path, []byte(jwtOnly), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
