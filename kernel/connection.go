package kernel

import "time"

// connection is an agent's or runner's consumer as the peer hub reports it
// (see peer.Presence): whether a connection of its is attached, which one
// (each bumps gen, so that the end of a superseded one changes nothing),
// and the grace timer that runs once the last one went away. The kernel's
// lock guards it.
type connection struct {
	online bool
	gen    uint64
	grace  *time.Timer
}

func (c *connection) stopGrace() {
	if c.grace != nil {
		c.grace.Stop()
		c.grace = nil
	}
}

// connect records a new connection and returns its generation.
func (c *connection) connect() uint64 {
	c.stopGrace()
	c.online = true
	c.gen++
	return c.gen
}

// lostSince reports that the connection of generation gen is the last one
// and has not come back.
func (c *connection) lostSince(gen uint64) bool { return c.gen == gen && !c.online }

// disconnected returns the function that records the end of c's
// connection gen: unless a newer one took over (or the kernel is
// closing), the consumer goes offline, and lost runs once grace has passed
// (it checks lostSince itself: the consumer may be back by then).
func (k *Kernel) disconnected(c *connection, gen uint64, grace time.Duration, lost func()) func() {
	return func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		if c.gen != gen || k.closed {
			return
		}
		c.online = false
		c.grace = time.AfterFunc(grace, lost)
	}
}

// awaitLocked starts the grace period of a consumer that holds work
// without a connection (a lease bound after it went away, a job it held
// before a restart), so that it is lost like any other unless it comes
// back. The caller holds k.mu.
func (k *Kernel) awaitLocked(c *connection, grace time.Duration, lost func()) {
	if c.online || c.grace != nil || k.closed {
		return
	}
	c.grace = time.AfterFunc(grace, lost)
}
