package cluster

import (
	"fmt"
	"sync"
	"time"
	_ "unsafe" // go:linkname, below
)

// JetStream's replicated streams elect their leaders with NATS's own raft,
// whose timings nats-server v2.15.2 fixes: a follower starts an election
// after 4 to 9 s without a heartbeat (sent every second). That is the
// floor of a failover whenever the lost node led a stream the kernel
// writes through, and the cluster gathers those on the kernel's node (see
// Gather). nats-server offers no option for them; its own tests set these
// variables, and Options.ElectionTimeout sets them the same way. The names
// are checked at link time: a nats-server that renamed them fails the
// build instead of ignoring the option.

//go:linkname raftMinElection github.com/nats-io/nats-server/v2/server.minElectionTimeout
var raftMinElection time.Duration

//go:linkname raftMaxElection github.com/nats-io/nats-server/v2/server.maxElectionTimeout
var raftMaxElection time.Duration

//go:linkname raftHeartbeat github.com/nats-io/nats-server/v2/server.hbInterval
var raftHeartbeat time.Duration

// raftMu orders the nodes of one process (tests start several at once)
// that set the timings: the variables it guards are the process's anyway.
var raftMu sync.Mutex

// minElectionTimeout bounds Options.ElectionTimeout from below: shorter,
// a busy machine's scheduling delays alone would start elections.
const minElectionTimeout = 500 * time.Millisecond

// setElectionTimeout has elections start after d to 2d without a
// heartbeat, and heartbeats sent every d/4; zero keeps NATS's defaults.
// The timings are the process's, shared by every server in it: it is
// called before the node's one server starts, and never after.
func setElectionTimeout(d time.Duration) error {
	if d == 0 {
		return nil
	}
	if d < minElectionTimeout {
		return fmt.Errorf("%w: election timeout %s is below %s", ErrConfig, d, minElectionTimeout)
	}
	raftMu.Lock()
	defer raftMu.Unlock()
	if raftMinElection == d && raftMaxElection == 2*d && raftHeartbeat == d/4 {
		// Set already, by an earlier server of this process (tests run
		// several): writing again would race with its raft's reads.
		return nil
	}
	raftMinElection, raftMaxElection, raftHeartbeat = d, 2*d, d/4
	return nil
}
