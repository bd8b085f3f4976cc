package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/gateway/tlscert/tlscerttest"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
)

// natsNode is a `gatehouse serve` process with a NATS side, which a test
// can kill -9 and start again on the same data folder and ports.
type natsNode struct {
	name string
	base string // the gateway's URL
	nats string // the embedded server's client URL (--nats-listen)
	args []string
	cmd  *exec.Cmd
	logs *syncbuf.Buffer
}

// newNATSNode prepares a node named name with the further serve flags.
func newNATSNode(t *testing.T, name string, flags ...string) *natsNode {
	t.Helper()
	addr, natsAddr := loopback.FreeAddr(t), loopback.FreeAddr(t)
	args := append([]string{"serve", "--addr", addr, "--data", t.TempDir(), "--log-level", "warn",
		"--node-name", name, "--nats-listen", natsAddr, "--cluster-ready-timeout", "20s"}, flags...)
	n := &natsNode{name: name, base: "http://" + addr, nats: "nats://" + natsAddr, args: args}
	t.Cleanup(n.kill)
	return n
}

// start starts the process; ready waits for it.
func (n *natsNode) start(t *testing.T) {
	t.Helper()
	n.logs = &syncbuf.Buffer{}
	n.cmd = exec.Command(os.Args[0], n.args...)
	n.cmd.Env = append(os.Environ(), "GATEHOUSE_TEST_AS_MAIN=1")
	n.cmd.Stdout, n.cmd.Stderr = n.logs, n.logs
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
}

// ready waits until the gateway answers /v0/ready, which it does once its
// NATS side is ready.
func (n *natsNode) ready(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(n.base + "/v0/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not ready: %v\n%s", n.name, err, n.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill kills the process with SIGKILL, as a lost machine stops, and waits
// for it.
func (n *natsNode) kill() {
	if n.cmd != nil && n.cmd.ProcessState == nil {
		_ = n.cmd.Process.Kill()
		_ = n.cmd.Wait()
	}
}

// status reads GET /v0/cluster.
func (n *natsNode) status(t *testing.T) (int, cluster.Status, error) {
	t.Helper()
	resp, err := http.Get(n.base + "/v0/cluster")
	if err != nil {
		return 0, cluster.Status{}, err
	}
	defer resp.Body.Close()
	var st cluster.Status
	data, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(data, &st); err != nil {
		return resp.StatusCode, st, fmt.Errorf("GET /v0/cluster: %d %q: %w", resp.StatusCode, data, err)
	}
	return resp.StatusCode, st, nil
}

// jetStream connects to the node's embedded server as a NATS client.
func (n *natsNode) jetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(n.nats, nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("connect to %s's NATS: %v", n.name, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// startAll starts nodes at once (a cluster's first start needs a quorum of
// them up) and waits for each.
func startAll(t *testing.T, nodes ...*natsNode) {
	t.Helper()
	for _, n := range nodes {
		n.start(t)
	}
	for _, n := range nodes {
		n.ready(t)
	}
}

// TestClusterOfThreeKeepsQuorumThroughANodeKill runs three `gatehouse
// serve` processes clustered on loopback, each given the same peer list.
// They elect one meta leader; a stream of three replicas is written through
// one node and read back through another. kill -9 of the leader leaves a
// quorum: the other two report a new leader and stay healthy, and the
// stream takes writes. The node comes back on its data folder, rejoins,
// and its replica catches up.
func TestClusterOfThreeKeepsQuorumThroughANodeKill(t *testing.T) {
	t.Parallel()
	routes := []string{loopback.FreeAddr(t), loopback.FreeAddr(t), loopback.FreeAddr(t)}
	peers := strings.Join(routes, ",")
	nodes := make([]*natsNode, 3)
	for i := range nodes {
		nodes[i] = newNATSNode(t, fmt.Sprintf("n%d", i+1), "--cluster-name", "gh", "--cluster-listen", routes[i], "--cluster-peers", peers)
	}
	startAll(t, nodes...)
	leader := ""
	for _, n := range nodes {
		eventually.Check(t, func() error {
			code, st, err := n.status(t)
			switch {
			case err != nil:
				return err
			case code != http.StatusOK || !st.Healthy || len(st.Routes) != 2 || st.JetStream.ClusterSize != 3:
				return fmt.Errorf("%s: %d %+v", n.name, code, st)
			case leader != "" && st.JetStream.MetaLeader != leader:
				return fmt.Errorf("%s sees leader %s, another node %s", n.name, st.JetStream.MetaLeader, leader)
			}
			leader = st.JetStream.MetaLeader
			return nil
		})
	}

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	js1, js3 := nodes[0].jetStream(t), nodes[2].jetStream(t)
	if _, err := js1.CreateStream(ctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3}); err != nil {
		t.Fatalf("create R3 stream: %v", err)
	}
	// A publish is retried until the stream has a leader (after a kill,
	// its replicas elect one, as the meta group does); its message id makes
	// a retry of one that was stored but not answered a no-op.
	publish := func(js jetstream.JetStream, from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			eventually.Check(t, func() error {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				_, err := js.Publish(pctx, "r3.x", fmt.Appendf(nil, "m%d", i), jetstream.WithMsgID(fmt.Sprintf("m%d", i)))
				return err
			})
		}
	}
	publish(js1, 0, 5)
	wantMsgs := func(js jetstream.JetStream, n uint64) *jetstream.StreamInfo {
		t.Helper()
		s, err := js.Stream(ctx, "R3")
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != n || info.Config.Replicas != 3 {
			t.Fatalf("R3: %d messages at %d replicas, want %d at 3", info.State.Msgs, info.Config.Replicas, n)
		}
		return info
	}
	wantMsgs(js3, 5)

	down := slices.IndexFunc(nodes, func(n *natsNode) bool { return n.name == leader })
	nodes[down].kill()
	killed := time.Now()
	var survivor *natsNode
	for i, n := range nodes {
		if i == down {
			continue
		}
		survivor = n
		eventually.Check(t, func() error {
			code, st, err := n.status(t)
			switch {
			case err != nil:
				return err
			case code != http.StatusOK || !st.Healthy || st.JetStream.MetaLeader == "" || st.JetStream.MetaLeader == leader || len(st.Routes) != 1:
				return fmt.Errorf("%s after the kill of %s: %d %+v", n.name, leader, code, st)
			}
			return nil
		})
	}
	t.Logf("a new meta leader %s after the kill", time.Since(killed).Round(time.Millisecond))
	jsSurvivor := survivor.jetStream(t)
	publish(jsSurvivor, 5, 8)
	wantMsgs(jsSurvivor, 8)

	nodes[down].start(t)
	nodes[down].ready(t)
	eventually.Check(t, func() error {
		code, st, err := nodes[down].status(t)
		switch {
		case err != nil:
			return err
		case code != http.StatusOK || !st.Healthy || len(st.Routes) != 2 || st.JetStream.MetaLeader == "":
			return fmt.Errorf("%s back: %d %+v", nodes[down].name, code, st)
		}
		s, err := jsSurvivor.Stream(ctx, "R3")
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		for _, r := range append(info.Cluster.Replicas, &jetstream.PeerInfo{Name: info.Cluster.Leader, Current: true}) {
			if r.Name == nodes[down].name && r.Current && r.Lag == 0 {
				return nil
			}
		}
		return fmt.Errorf("%s's replica of R3 has not caught up: %+v", nodes[down].name, info.Cluster)
	})
	wantMsgs(nodes[down].jetStream(t), 8)
}

// TestClusterEdgeWorksAloneWhileItsHubLinkIsCut links an edge box, with its
// own JetStream domain, to a hub as a leaf node over mutual TLS. While
// linked, a request through the hub (/edge/edge/...) reaches the edge box,
// which answers it (403 EDGE_TOKEN_REQUIRED: it runs with no token).
// The hub is killed: the edge reports the link down and goes on working
// alone (healthy, executions created, its JetStream written). The hub comes
// back on its folder and port: the edge links again by itself, and
// requests cross again.
func TestClusterEdgeWorksAloneWhileItsHubLinkIsCut(t *testing.T) {
	t.Parallel()
	ca := tlscerttest.NewCA(t)
	caPath := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caPath, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	hubCert, hubKey := ca.WriteNodePair(t, 10, "127.0.0.1")
	edgeCert, edgeKey := ca.WriteEdgePair(t, 11, "edge", "127.0.0.1")
	leaf := loopback.FreeAddr(t)
	hub := newNATSNode(t, "hub", "--leaf-listen", leaf, "--leaf-tls-cert", hubCert, "--leaf-tls-key", hubKey, "--leaf-tls-ca", caPath)
	edge := newNATSNode(t, "edge", "--nats-domain", "edge", "--leaf-remote", "tls://"+leaf,
		"--leaf-tls-cert", edgeCert, "--leaf-tls-key", edgeKey, "--leaf-tls-ca", caPath)
	startAll(t, hub, edge)
	linked := func(want bool) func() error {
		return func() error {
			code, st, err := edge.status(t)
			switch {
			case err != nil:
				return err
			case code != http.StatusOK || !st.Healthy:
				return fmt.Errorf("edge unhealthy: %d %+v", code, st)
			case want && (len(st.Leafs) != 1 || st.Leafs[0].Node != "hub" || st.Leafs[0].Role != "hub"):
				return fmt.Errorf("edge not linked to the hub: %+v", st.Leafs)
			case !want && len(st.Leafs) != 0:
				return fmt.Errorf("edge still linked: %+v", st.Leafs)
			}
			return nil
		}
	}
	crosses := func() {
		t.Helper()
		// The edge box's listener reaches the hub a moment after the link.
		eventually.Check(t, func() error {
			code, body, err := edgeCall(t.Context(), "GET", hub.base+"/edge/edge/v0/health", "", nil)
			if err != nil || code != http.StatusForbidden || body["code"] != "EDGE_TOKEN_REQUIRED" {
				return fmt.Errorf("through the hub: %d %v %v, want the edge box's 403 EDGE_TOKEN_REQUIRED", code, body, err)
			}
			return nil
		})
	}
	eventually.Check(t, linked(true))
	crosses()

	hub.kill()
	eventually.Check(t, linked(false))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	code, ex, err := post(ctx, http.DefaultClient, edge.base+"/v0/executions", map[string]any{"agent_id": "edge-agent"})
	if err != nil || code != http.StatusCreated || ex["id"] == "" {
		t.Fatalf("create on the edge while alone: %d %v %v", code, ex, err)
	}
	js := edge.jetStream(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LOCAL", Subjects: []string{"local.>"}}); err != nil {
		t.Fatalf("edge JetStream while alone: %v", err)
	}
	if _, err := js.Publish(ctx, "local.x", []byte("kept")); err != nil {
		t.Fatalf("edge JetStream while alone: %v", err)
	}
	if ai, err := js.AccountInfo(ctx); err != nil || ai.Domain != "edge" {
		t.Fatalf("edge JetStream domain: %+v %v", ai, err)
	}

	hub.start(t)
	hub.ready(t)
	eventually.Check(t, linked(true))
	crosses()
}

// TestClusterServeRefusesBadFlags: serve refuses NATS flags that cannot
// work before it listens, with one line naming the flag.
func TestClusterServeRefusesBadFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cluster-peers", "127.0.0.1:6222"}, "--cluster-name"},
		{[]string{"--node-name", "n1", "--cluster-purge-interval", "10ms"}, "--cluster-purge-interval 10ms: at least 1s"},
		{[]string{"--cluster-name", "gh", "--node-name", "n1"}, "--cluster-listen 0.0.0.0:6222 is not loopback"},
		{[]string{"--nats-url", "nats://127.0.0.1:4222", "--cluster-name", "gh"}, "--nats-url joins an existing deployment"},
		{[]string{"--nats-listen", "0.0.0.0:4222"}, "listen on loopback only"},
		{[]string{"--in-memory", "--node-name", "n1"}, "needs a data folder"},
		{[]string{"--node-name", "hub", "--leaf-advertise", "hub.example:7422"}, "--leaf-advertise is the address of --leaf-listen"},
		{[]string{"--node-name", "hub", "--leaf-listen", "127.0.0.1:0", "--leaf-advertise", "hub.example"}, "--leaf-advertise"},
	} {
		args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data", dir}, tc.args...)
		if slices.Contains(tc.args, "--in-memory") {
			args = append([]string{"serve", "--addr", "127.0.0.1:0"}, tc.args...)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := run(ctx, args, io.Discard, io.Discard)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("serve %v: %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
}
