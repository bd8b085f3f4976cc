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
