package node_test

import (
	"fmt"
	"net"
	"net/http"
	"testing"

	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// TestEdgeBoxServesItsHubAndShutsDownCleanly runs a hub and an edge box
// linked to it in one process: the hub passes requests for the box on to
// it, and the box's shutdown, which closes the listener of what its hub
// passes on with the server's own, reports no error (nodetest fails the
// test on one). Once the box is gone the hub says it is not linked.
func TestEdgeBoxServesItsHubAndShutsDownCleanly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	leaf := ln.Addr().String()
	ln.Close()
	const token = "edge-token-0123456789"
	hub := nodetest.Start(t, node.Options{Auth: auth.Options{StaticToken: token},
		Cluster: cluster.Options{NodeName: "hub", LeafListen: leaf}})
	box := nodetest.Start(t, node.Options{Auth: auth.Options{StaticToken: token},
		Cluster: cluster.Options{NodeName: "e1", Domain: "e1", LeafRemotes: []string{"nats-leaf://" + leaf}}})
	via := hub.URL + "/edge/e1/v0/executions"
	answer := func(want int) func() error {
		return func() error {
			if st, _, _ := nodetest.Do(t, nil, "GET", via, nil, "Authorization", "Bearer "+token); st != want {
				return fmt.Errorf("through the hub: %d, want %d", st, want)
			}
			return nil
		}
	}
	eventually.Check(t, answer(http.StatusOK))
	box.Stop()
	eventually.Check(t, answer(http.StatusServiceUnavailable))
}
