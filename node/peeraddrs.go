package node

import (
	"net/netip"
	"slices"
	"sync"
	"time"
)

// peerAddrsAge is how long a leader trusts its last reading of its peers'
// addresses before it reads its routes again.
const peerAddrsAge = time.Second

// peerAddrs are the addresses of a cluster's other nodes, whose
// connections the leader's gateway does not count against its
// per-address bound: a follower relays every client of its own from its
// one address, and its own listener bounds those clients per address
// already. The routes are read on an accept at most once per peerAddrsAge,
// so a node that joins is known within a second of its route, without a
// goroutine of its own.
type peerAddrs struct {
	read func() []netip.Addr

	mu    sync.Mutex
	at    time.Time
	addrs []netip.Addr
}

// has reports whether a is a peer's address.
func (p *peerAddrs) has(a netip.Addr) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now := time.Now(); now.Sub(p.at) >= peerAddrsAge {
		p.addrs, p.at = p.read(), now
	}
	return slices.Contains(p.addrs, a)
}
