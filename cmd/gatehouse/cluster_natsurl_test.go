package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gatehouse-dev/gatehouse/client"
	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/cluster/natstest"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
)

// The NATS deployment's one user, which its servers require.
const (
	deploymentUser     = "gatehouse"
	deploymentPassword = "s3cret-of-the-deployment"
)

// gatehouseRights are the rights docs/cluster.md says a member's NATS user
// needs: the JetStream API and its flow control, the journal's subject and
// the buckets', and the replies to its requests.
var gatehouseRights = &server.Permissions{
	Publish: &server.SubjectPermission{Allow: []string{"$JS.API.>", "$JS.FC.>", cluster.JournalSubject,
		"$KV." + cluster.LeaseBucket + ".>", "$KV." + cluster.PositionsBucket + ".>"}},
	Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
}

// natsDeployment runs size NATS servers as an operator's deployment that
// Gatehouse does not run (natstest.Deployment), whose one user is
// deploymentUser, with gatehouseRights. It returns the servers' client
// URLs, without credentials.
func natsDeployment(t *testing.T, size int) []string {
	t.Helper()
	return natstest.Deployment(t, size, []*server.User{{Username: deploymentUser, Password: deploymentPassword,
		Permissions: gatehouseRights}})
}

// withUser puts deploymentUser's credentials, or others, in each URL.
func withUser(urls []string, user, password string) string {
	var out []string
	for _, u := range urls {
		out = append(out, strings.Replace(u, "nats://", "nats://"+user+":"+password+"@", 1))
	}
	return strings.Join(out, ",")
}

// newExternalNode prepares a member named name that joins the NATS
// deployment at natsURL instead of embedding a server, with the further
// serve flags.
func newExternalNode(t *testing.T, name, natsURL string, flags ...string) *natsNode {
	t.Helper()
	addr := loopback.FreeAddr(t)
	args := append([]string{"serve", "--addr", addr, "--data", t.TempDir(), "--log-level", "warn",
		"--node-name", name, "--nats-url", natsURL, "--cluster-ready-timeout", "20s"}, flags...)
	n := &natsNode{name: name, base: "http://" + addr, args: args}
	t.Cleanup(n.kill)
	return n
}

// TestClusterMembersOnAnExistingNATSDeployment runs three `gatehouse
// serve --nats-url` processes on a NATS deployment that the test runs and
// that requires a password: three clustered servers, and one server alone.
// Exactly one member leads and the others follow it; the journal and both
// buckets are placed on the deployment at three replicas, or at one on the
// server alone (which refuses more); executions created through every
// node exist once, through every node. kill -9 of the leader: another
// leads, every execution acknowledged before the kill is there, and new
// ones are created. The killed node comes back on its data folder and
// follows, and (checked on three servers) the leader purges the journal
// below what every member holds. /v0/cluster never shows the deployment's password.
func TestClusterMembersOnAnExistingNATSDeployment(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		servers, want int
	}{
		{"three clustered servers", 3, 3},
		{"one server", 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) { membersOnADeployment(t, tc.servers, tc.want) })
	}
}

// membersOnADeployment is TestClusterMembersOnAnExistingNATSDeployment on
// a deployment of size servers, where the journal and the buckets are to
// have replicas replicas.
func membersOnADeployment(t *testing.T, size, replicas int) {
	servers := natsDeployment(t, size)
	natsURL := withUser(servers, deploymentUser, deploymentPassword)
	nodes := make([]*natsNode, 3)
	for i := range nodes {
		// Each member names the servers in another order, as members
		// spread over a deployment would.
		k := i % len(servers)
		order := append(append([]string{}, servers[k:]...), servers[:k]...)
		nodes[i] = newExternalNode(t, fmt.Sprintf("n%d", i+1), withUser(order, deploymentUser, deploymentPassword),
			"--cluster-purge-interval", "2s")
	}
	startAll(t, nodes...)
	lead := leaderOf(t, nodes)
	for _, n := range nodes {
		resp, err := http.Get(n.base + "/v0/cluster")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"mode":"external"`) ||
			!strings.Contains(string(body), `"leader":"`+nodes[lead].name+`"`) {
			t.Errorf("%s: GET /v0/cluster %d %s", n.name, resp.StatusCode, body)
		}
		if strings.Contains(string(body), deploymentPassword) {
			t.Errorf("%s: GET /v0/cluster shows the deployment's password: %s", n.name, body)
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{cluster.JournalStream, "KV_" + cluster.LeaseBucket, "KV_" + cluster.PositionsBucket} {
		info := eventually.Value(t, "stream "+name+" on the deployment", func() (*jetstream.StreamInfo, bool) {
			return streamInfo(ctx, js, name)
		})
		placed := 1
		if info.Cluster != nil {
			placed += len(info.Cluster.Replicas)
		}
		if info.Config.Replicas != replicas || placed != replicas {
			t.Errorf("stream %s: %d replicas, placed on %d servers; want %d", name, info.Config.Replicas, placed, replicas)
		}
	}

	acked := createThroughEach(ctx, t, nodes)
	listedOnce := func(n *natsNode, ids []string) error {
		via, err := client.New(client.Options{BaseURL: n.base})
		if err != nil {
			return err
		}
		list, err := via.ListExecutions(ctx, client.ListOptions{Limit: 100})
		if err != nil {
			return fmt.Errorf("list through %s: %w", n.name, err)
		}
		count := map[string]int{}
		for _, ex := range list.Executions {
			count[ex.ID]++
		}
		for _, id := range ids {
			if count[id] != 1 {
				return fmt.Errorf("execution %s listed %d times through %s", id, count[id], n.name)
			}
		}
		return nil
	}
	for _, n := range nodes {
		if err := listedOnce(n, acked); err != nil {
			t.Fatal(err)
		}
	}

	killed := time.Now()
	nodes[lead].kill()
	next := leaderOf(t, nodes, lead)
	t.Logf("%s leads %s after %s's kill -9", nodes[next].name, time.Since(killed).Round(time.Millisecond), nodes[lead].name)
	follower := 3 - lead - next
	cl, err := client.New(client.Options{BaseURLs: []string{nodes[follower].base, nodes[next].base},
		MinBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range acked {
		if _, err := cl.GetExecution(ctx, id); err != nil {
			t.Errorf("execution %s, acknowledged before the kill: %v", id, err)
		}
	}
	var after *client.Execution
	eventually.Check(t, func() (err error) {
		after, err = cl.CreateExecution(ctx, client.CreateRequest{AgentID: "nobody"})
		return err
	})
	t.Logf("new work flows %s after the kill", time.Since(killed).Round(time.Millisecond))
	acked = append(acked, after.ID)

	rejoin(t, nodes, lead, next)
	// A loaded machine may move the leadership again after the 1 s
	// election timeout (docs/cluster.md, "Failover"); that decides nothing
	// twice, which the listing below checks on every node.
	if got := leaderOf(t, nodes); got != next {
		t.Logf("%s leads once the killed node is back (the leadership moved again from %s)", nodes[got].name, nodes[next].name)
	}
	for _, n := range nodes {
		if err := listedOnce(n, acked); err != nil {
			t.Error(err)
		}
	}

	for _, n := range nodes {
		if strings.Contains(n.logs.String(), "Permissions Violation") {
			t.Errorf("%s lacked a right it needs:\n%s", n.name, n.logs)
		}
	}
	if size == 1 {
		return // the purge is the same code on one server: once is enough
	}
	// Every member reports the position its store holds (every 5 s); the
	// leader purges below the lowest, every --cluster-purge-interval of its
	// lead.
	eventually.Check(t, func() error {
		info, ok := streamInfo(ctx, js, cluster.JournalStream)
		if !ok {
			return fmt.Errorf("no answer about %s", cluster.JournalStream)
		}
		if info.State.FirstSeq <= 1 {
			return fmt.Errorf("the journal is not purged: %+v", info.State)
		}
		return nil
	})
}

// streamInfo reads the state of the stream named name, or says it got no
// answer: a request may go unanswered while the stream's leadership moves
// (the leader's Gather), so each is bounded.
func streamInfo(ctx context.Context, js jetstream.JetStream, name string) (*jetstream.StreamInfo, bool) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, false
	}
	info, err := s.Info(ctx)
	return info, err == nil
}

// TestClusterMemberRefusesToStartOnCredentialsTheDeploymentRefuses: a
// member whose credentials the deployment refuses (a wrong password, none,
// a creds file it does not know) does not wait out
// --cluster-ready-timeout: serve fails within seconds, with one line
// naming --nats-url and --nats-creds, and without the password it was
// given. A creds file that is not there is named as such.
func TestClusterMemberRefusesToStartOnCredentialsTheDeploymentRefuses(t *testing.T) {
	t.Parallel()
	servers := natsDeployment(t, 1)
	creds := filepath.Join(t.TempDir(), "user.creds")
	if err := os.WriteFile(creds, []byte(unknownUserCreds), 0o600); err != nil {
		t.Fatal(err)
	}
	const refused = "refused this node's credentials (the user in --nats-url, or --nats-creds)"
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a wrong password", []string{"--nats-url", withUser(servers, deploymentUser, "not-the-password")}, refused},
		{"no credentials", []string{"--nats-url", servers[0]}, refused},
		{"a creds file the deployment does not know", []string{"--nats-url", servers[0], "--nats-creds", creds}, refused},
		{"a creds file that is not there", []string{"--nats-url", servers[0], "--nats-creds", creds + ".missing"},
			"--nats-creds: open " + creds + ".missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"serve", "--addr", loopback.FreeAddr(t), "--data", t.TempDir(), "--node-name", "n1",
				"--cluster-ready-timeout", "30s"}, tc.args...)
			err := refusedStart(t, args, io.Discard, io.Discard)
			switch {
			case !strings.Contains(err.Error(), tc.want):
				t.Fatalf("serve's error %q does not say %q", err, tc.want)
			case strings.Contains(err.Error(), "not-the-password"):
				t.Fatalf("serve's error shows the password: %v", err)
			}
		})
	}
}

// refusedStart runs `gatehouse args` and returns its error, failing the
// test unless serve refused to start within 10 s with one line.
func refusedStart(t *testing.T, args []string, stdout, stderr io.Writer) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()
	began := time.Now()
	err := run(ctx, args, stdout, stderr)
	took := time.Since(began)
	switch {
	case err == nil:
		t.Fatal("serve started")
	case took > 10*time.Second:
		t.Fatalf("serve refused after %s, not at once: %v", took.Round(time.Millisecond), err)
	case strings.Contains(err.Error(), "\n"):
		t.Fatalf("serve's error is not one line: %q", err)
	}
	t.Logf("refused in %s: %v", took.Round(time.Millisecond), err)
	return err
}

// unknownUserCreds is a NATS credentials file of a user no deployment of
// these tests knows: a JWT and the example seed of NATS's documentation.
const unknownUserCreds = `-----BEGIN NATS USER JWT-----
eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJqdGkiOiJURVNUIiwiaWF0IjoxNzAwMDAwMDAwLCJpc3MiOiJBQUFBIiwibmFtZSI6InRlc3QiLCJzdWIiOiJVQUFBIiwibmF0cyI6eyJ0eXBlIjoidXNlciIsInZlcnNpb24iOjJ9fQ.c2lnbmF0dXJl
------END NATS USER JWT------

-----BEGIN USER NKEY SEED-----
SUAMK2FG4MI6UE3ACF3FK3OIQBCEIEZV7NSWFFEW63UXMRLFM2XLAXK4GY
------END USER NKEY SEED------
`
