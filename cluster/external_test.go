package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gatehouse-dev/gatehouse/cluster"
	"github.com/gatehouse-dev/gatehouse/cluster/natstest"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
)

// deployment runs three NATS servers as an operator's deployment that
// Gatehouse joins by URL. Its users are "full", with every right, and
// "limited", who may not ask a stream's leader to step down. It returns
// the servers' client URLs, without credentials.
func deployment(t *testing.T) []string {
	t.Helper()
	return natstest.Deployment(t, 3, []*server.User{
		{Username: "full", Password: "pw"},
		{Username: "limited", Password: "pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Deny: []string{"$JS.API.STREAM.LEADER.STEPDOWN.>"}}}},
	})
}

// withUser is the client URL u with user's credentials in it.
func withUser(u, user string) string {
	return strings.Replace(u, "nats://", "nats://"+user+":pw@", 1)
}

// streamLeader returns the server that leads the stream named name. A
// request may go unanswered while the stream elects a leader: each is
// bounded.
func streamLeader(ctx context.Context, js jetstream.JetStream, name string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		return "", err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return "", err
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return "", fmt.Errorf("stream %s has no leader", name)
	}
	return info.Cluster.Leader, nil
}

// TestGatherOnADeploymentMovesGatehousesStreamsToItsServerAndNoOthers: a
// node on a deployment joined by URL creates the journal and the lease's
// bucket at three replicas. With their leaders moved elsewhere, Gather
// brings both to the server the node is connected to, and leaves a stream
// of the deployment's own where it was. A node whose account may not move
// leaders gets Gather's error, within seconds, and its journal still
// takes appends.
func TestGatherOnADeploymentMovesGatehousesStreamsToItsServerAndNoOthers(t *testing.T) {
	addrs := deployment(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	n, err := start(t, cluster.Options{NodeName: "n1", URL: withUser(addrs[0], "full"), ReadyTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	js := n.JetStream()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Journal(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Leases(ctx); err != nil {
		t.Fatal(err)
	}
	here := n.Conn().ConnectedServerName()
	elsewhere := "s2"
	if here == elsewhere {
		elsewhere = "s3"
	}
	// Every stream led elsewhere first, the deployment's own too.
	for _, stream := range []string{cluster.JournalStream, "KV_" + cluster.LeaseBucket, "OTHER"} {
		eventually.Check(t, func() error {
			if l, err := streamLeader(ctx, js, stream); err != nil || l == elsewhere {
				return err
			}
			req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": elsewhere}})
			m, err := n.Conn().Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, req, 2*time.Second)
			if err != nil {
				return err
			}
			return fmt.Errorf("%s moving to %s: %s", stream, elsewhere, m.Data)
		})
	}
	if err := n.Gather(ctx); err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, stream := range []string{cluster.JournalStream, "KV_" + cluster.LeaseBucket} {
		eventually.Check(t, func() error {
			if l, err := streamLeader(ctx, js, stream); err != nil || l != here {
				return fmt.Errorf("%s led by %s, want %s: %v", stream, l, here, err)
			}
			return nil
		})
	}
	if l, err := streamLeader(ctx, js, "OTHER"); err != nil || l != elsewhere {
		t.Fatalf("the deployment's own stream led by %s (%v), want it left on %s", l, err, elsewhere)
	}

	limited, err := start(t, cluster.Options{NodeName: "n2", URL: withUser(addrs[1], "limited"), ReadyTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lj, err := limited.Journal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if limited.Conn().ConnectedServerName() != here {
		began := time.Now()
		if err := limited.Gather(ctx); err == nil {
			t.Fatal("Gather without the right to move leaders: no error")
		} else if took := time.Since(began); took > 10*time.Second {
			t.Fatalf("Gather without the right took %s: %v", took, err)
		}
	}
	last, err := lj.Last(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lj.Writer(last).Append(ctx, []byte("still")); err != nil {
		t.Fatalf("append after a refused Gather: %v", err)
	}
}
