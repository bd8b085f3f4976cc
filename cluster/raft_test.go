package cluster

import (
	"errors"
	"testing"
	"time"
)

// natsRaftTimings are the linked variables as the package's initialisation
// left them, before any test's cluster node set its own.
var natsRaftTimings = [3]time.Duration{raftMinElection, raftMaxElection, raftHeartbeat}

// TestRaftTimingsAreNATSDefaults reads the linked variables: the values
// nats-server v2.15.2 starts with. Another version that kept the names but
// changed what they mean fails here, before ElectionTimeout misleads.
func TestRaftTimingsAreNATSDefaults(t *testing.T) {
	if natsRaftTimings != [3]time.Duration{4 * time.Second, 9 * time.Second, time.Second} {
		t.Fatalf("raft timings %v (min, max, heartbeat); want NATS's 4s, 9s, 1s", natsRaftTimings)
	}
	if err := setElectionTimeout(100 * time.Millisecond); !errors.Is(err, ErrConfig) {
		t.Fatalf("an election timeout of 100ms = %v, want ErrConfig", err)
	}
	before := [3]time.Duration{raftMinElection, raftMaxElection, raftHeartbeat}
	if err := setElectionTimeout(0); err != nil || before != [3]time.Duration{raftMinElection, raftMaxElection, raftHeartbeat} {
		t.Fatalf("zero changed the timings: %v", err)
	}
}

// TestAClusterNodeElectsAfterOneSecondUnlessTold: a cluster's node gets
// DefaultElectionTimeout; a node outside a cluster keeps NATS's timing;
// a timeout set is kept.
func TestAClusterNodeElectsAfterOneSecondUnlessTold(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want time.Duration
	}{
		{"cluster", Options{Name: "gh", NodeName: "n1", Listen: "127.0.0.1:6222"}, DefaultElectionTimeout},
		{"cluster, set", Options{Name: "gh", NodeName: "n1", Listen: "127.0.0.1:6222", ElectionTimeout: 4 * time.Second}, 4 * time.Second},
		{"alone", Options{NodeName: "n1"}, 0},
		{"edge box", Options{NodeName: "e1", LeafRemotes: []string{"nats-leaf://127.0.0.1:7422"}}, 0},
	} {
		o := tc.o
		o.Dir = t.TempDir()
		if err := o.check(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if o.ElectionTimeout != tc.want {
			t.Errorf("%s: election timeout %s, want %s", tc.name, o.ElectionTimeout, tc.want)
		}
	}
}

func TestReplicasFollowTheConfiguredClusterNotTheMetaGroupSoFar(t *testing.T) {
	for _, tc := range []struct {
		name   string
		o      Options
		meta   int
		replic int
	}{
		{"unclustered", Options{NodeName: "n1"}, 1, 1},
		{"three, own route listed, two known so far", Options{Name: "gh", Listen: "a:1", Peers: []string{"a:1", "b:1", "c:1"}}, 2, 3},
		{"three, own route not listed", Options{Name: "gh", Listen: "a:1", Peers: []string{"b:1", "c:1"}}, 1, 3},
		{"two", Options{Name: "gh", Listen: "a:1", Peers: []string{"a:1", "b:1"}}, 2, 2},
		{"five", Options{Name: "gh", Listen: "a:1", Peers: []string{"a:1", "b:1", "c:1", "d:1", "e:1"}}, 5, 3},
		{"grown past its list", Options{Name: "gh", Listen: "a:1", Peers: []string{"a:1", "b:1"}}, 3, 3},
	} {
		if got := replicasOf(tc.o, tc.meta); got != tc.replic {
			t.Errorf("%s: %d replicas, want %d", tc.name, got, tc.replic)
		}
	}
}
