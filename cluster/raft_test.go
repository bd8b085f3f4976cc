package cluster

import (
	"errors"
	"testing"
	"time"
)

// TestRaftTimingsAreNATSDefaults reads the linked variables: the values
// nats-server v2.15.2 starts with. Another version that kept the names but
// changed what they mean fails here, before ElectionTimeout misleads.
func TestRaftTimingsAreNATSDefaults(t *testing.T) {
	if raftMinElection != 4*time.Second || raftMaxElection != 9*time.Second || raftHeartbeat != time.Second {
		t.Fatalf("raft timings %s..%s, heartbeat %s; want NATS's 4s..9s, 1s", raftMinElection, raftMaxElection, raftHeartbeat)
	}
	if err := setElectionTimeout(100 * time.Millisecond); !errors.Is(err, ErrConfig) {
		t.Fatalf("an election timeout of 100ms = %v, want ErrConfig", err)
	}
	if err := setElectionTimeout(0); err != nil || raftMinElection != 4*time.Second {
		t.Fatalf("zero changed the timings: %v", err)
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
