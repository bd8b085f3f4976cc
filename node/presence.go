package node

import (
	"sync/atomic"

	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
)

// presence carries what the peer hub knows of who is connected to those who
// act on it: the kernel hands work only to agents and runners with a
// connection attached, and a native channel's owner sees it disconnect. The
// hub is built before them, so they are set once they exist; webhook
// senders attach while the channels are still being opened, and a
// connection before the kernel exists (none: the server is not listening
// yet) would simply not count.
type presence struct {
	kernel   atomic.Pointer[kernel.Kernel]
	channels atomic.Pointer[channel.Registry]
}

func (p *presence) Connected(k peer.Key, caps []string) (disconnected func()) {
	switch kr, ch := p.kernel.Load(), p.channels.Load(); {
	case k.Role == kernel.RoleAgent && kr != nil:
		return kr.AgentConnected(k.ID, k.Consumer)
	case k.Role == kernel.RoleRunner && kr != nil:
		return kr.RunnerConnected(k.ID, k.Consumer, caps)
	case k.Role == channel.RoleChannel && ch != nil:
		return ch.Connected(k)
	}
	return func() {}
}
