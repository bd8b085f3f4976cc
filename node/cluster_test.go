package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/node"
)

// getCluster answers GET /v0/cluster with the token, if any.
func getCluster(t *testing.T, base, token string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, base+node.ClusterPath, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var body map[string]any
	if err := json.Unmarshal(data, &body); err != nil {
		t.Fatalf("GET %s: %d %q: %v", node.ClusterPath, resp.StatusCode, data, err)
	}
	return resp.StatusCode, body
}

// TestNodeWithNATSReportsItAndReleasesIt opens a node with an embedded
// NATS server (a single one, named): its JetStream lives in the data
// folder's nats folder, GET /v0/cluster reports it healthy to a credential
// holder and refuses anyone else, and Close ends every goroutine the NATS
// server started.
func TestNodeWithNATSReportsItAndReleasesIt(t *testing.T) {
	base := warmUp(t)
	dir := t.TempDir()
	n, err := node.Open(t.Context(), node.Options{Addr: "127.0.0.1:0", Data: dir, Auth: auth.Options{StaticToken: "s3cret"},
		Cluster: cluster.Options{NodeName: "solo"}})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	url := "http://" + n.Addr().String()
	status, body := getCluster(t, url, "s3cret")
	js, _ := body["jetstream"].(map[string]any)
	if status != http.StatusOK || body["healthy"] != true || body["mode"] != cluster.ModeEmbedded || body["node"] != "solo" || js["enabled"] != true {
		t.Fatalf("GET /v0/cluster: %d %v", status, body)
	}
	if status, body := getCluster(t, url, ""); status != http.StatusUnauthorized || body["code"] != "UNAUTHORIZED" {
		t.Fatalf("without the token: %d %v", status, body)
	}
	if _, err := os.Stat(filepath.Join(dir, cluster.StoreFolder, "jetstream")); err != nil {
		t.Fatalf("JetStream's files are not in the data folder: %v", err)
	}
	closeNode(t, n)
	settle(t, base)
}

// TestNodeWithoutNATSHasNoClusterEndpoint: the default node runs no NATS,
// and nothing is served at /v0/cluster.
func TestNodeWithoutNATSHasNoClusterEndpoint(t *testing.T) {
	n := open(t, t.TempDir())
	if n.Cluster != nil {
		t.Fatal("a default node has a NATS side")
	}
	if status, body := getCluster(t, "http://"+n.Addr().String(), ""); status != http.StatusNotFound {
		t.Fatalf("GET /v0/cluster on a default node: %d %v", status, body)
	}
}

// TestNodeWithNATSRefusesToStartWithoutQuorum: a clustered node whose peers
// are not up fails to open once the wait for a meta leader is over, and
// what it had opened (its store) is released: the folder opens again.
func TestNodeWithNATSRefusesToStartWithoutQuorum(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	_, err := node.Open(ctx, node.Options{Addr: "127.0.0.1:0", Data: dir, Cluster: cluster.Options{
		Name: "gh", NodeName: "n1", Listen: "127.0.0.1:0", Peers: []string{"127.0.0.1:1", "127.0.0.1:2"}, ReadyTimeout: 500 * time.Millisecond}})
	if !errors.Is(err, cluster.ErrNotReady) {
		t.Fatalf("open without quorum: %v, want ErrNotReady", err)
	}
	closeNode(t, open(t, dir))
}
