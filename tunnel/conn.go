package tunnel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// controlSlack is the room a conn's subscription keeps, past its window's
// data frames, for the peer's control frames: a few acks, pings, fin and
// close.
const controlSlack = 64

// minPing is the shortest ping interval a peer's DeadAfter can ask for.
const minPing = 10 * time.Millisecond

// errSendDone: a close or reset frame went out, and nothing may follow it.
var errSendDone = errors.New("tunnel: conn finished sending")

// Conn is one end of a tunnel: a net.Conn whose bytes travel as frames
// between two NATS inboxes. Its methods are safe for concurrent use; one
// Write's bytes are never interleaved with another's.
type Conn struct {
	nc         *nats.Conn
	log        *slog.Logger
	local      Addr
	window     int // this side's receive window
	frameBytes int
	keepAlive  time.Duration
	deadAfter  time.Duration
	born       time.Time
	onEnd      func(reset bool) // the listener's count of open conns and resets

	rd, wd deadline

	// writeMu makes one Write's frames contiguous, and CloseWrite's fin
	// follow the Write in progress.
	writeMu sync.Mutex

	// sendMu orders frames: a frame's sequence number is given and the
	// frame published under it. It is taken before mu, never inside it.
	sendMu   sync.Mutex
	peer     Addr // set once, before the first frame is sent
	outSeq   uint64
	scratch  []byte
	finSent  bool
	sendDone bool
	lastSent atomic.Int64 // since born

	mu         sync.Mutex
	sub        *nats.Subscription
	timer      *time.Timer
	tickEvery  time.Duration
	pingAfter  time.Duration
	peerWindow uint64
	inSeq      uint64
	lastHeard  time.Duration // since born
	segs       [][]byte      // received data not yet read, frame by frame
	buffered   int           // bytes in segs
	peak       int           // the most bytes segs ever held
	recvd      uint64        // credit received
	consumed   uint64        // credit Read has consumed
	ackSent    uint64        // credit last acknowledged
	sent       uint64        // credit sent
	acked      uint64        // credit the peer acknowledged
	gotFin     bool          // the peer writes no more
	peerClosed bool          // the peer closed
	finOut     bool          // this side's fin went out
	wClosed    bool          // CloseWrite was called
	closed     bool          // Close was called
	err        error         // why the conn was reset
	released   bool          // subscription and timer ended
	readWake   chan struct{}
	writeWake  chan struct{}
}

// newConn subscribes a conn on inbox; its peer is set by connect.
func newConn(nc *nats.Conn, o Options, inbox string, onEnd func(bool)) (*Conn, error) {
	c := &Conn{
		nc: nc, log: o.Logger, local: Addr{inbox}, window: o.Window, frameBytes: o.FrameBytes,
		keepAlive: o.KeepAlive, deadAfter: o.DeadAfter, born: time.Now(), onEnd: onEnd,
		rd: newDeadline(), wd: newDeadline(),
	}
	// mu is held across Subscribe so that a frame arriving at once, which
	// may reset the conn, finds c.sub set.
	c.mu.Lock()
	defer c.mu.Unlock()
	sub, err := nc.Subscribe(inbox, c.onMsg)
	if err != nil {
		return nil, fmt.Errorf("tunnel: subscribe %s: %w", inbox, err)
	}
	msgs := o.Window/frameCost + controlSlack
	if err := sub.SetPendingLimits(msgs, o.Window+controlSlack*headerLen*2); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("tunnel: pending limits of %s: %w", inbox, err)
	}
	c.sub = sub
	return c, nil
}

// connect sets the peer the handshake named and starts the keepalive timer.
// It reports the reset that came first, if a forged frame reset the conn
// during the handshake.
func (c *Conn) connect(h hello) error {
	c.sendMu.Lock()
	c.peer = Addr{h.inbox}
	c.sendMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.peerWindow = uint64(h.window)
	// The handshake is word from the peer: a slow dial does not count
	// against DeadAfter.
	c.lastHeard = c.since()
	// A peer's short DeadAfter quickens the pings, down to minPing: a dial
	// cannot make the listener ping every millisecond.
	c.pingAfter = max(min(c.keepAlive, h.deadAfter/3), min(c.keepAlive, minPing))
	c.tickEvery = max(min(c.pingAfter/2, c.deadAfter/4), time.Millisecond)
	if c.released {
		// The peer may have written and closed before the dial took its
		// answer, which comes on another subscription than the frames:
		// what it sent stays to be read, and only a reset fails the dial.
		return c.err
	}
	c.timer = time.AfterFunc(c.tickEvery, c.tick)
	return nil
}

// since is the time since the conn was made, on the monotonic clock.
func (c *Conn) since() time.Duration { return time.Since(c.born) }

// Read reads data received. It returns the data buffered before an end:
// io.EOF after the peer's Close or CloseWrite, ErrReset after a reset.
func (c *Conn) Read(p []byte) (int, error) {
	n, err := c.read(p)
	if err != nil && err != io.EOF {
		err = c.opErr("read", err)
	}
	return n, err
}

func (c *Conn) read(p []byte) (int, error) {
	for {
		dl := c.rd.wait()
		if isClosed(dl) {
			return 0, os.ErrDeadlineExceeded
		}
		c.mu.Lock()
		switch {
		case c.closed:
			c.mu.Unlock()
			return 0, net.ErrClosed
		case len(p) == 0 && c.err == nil:
			c.mu.Unlock()
			return 0, nil
		case c.buffered > 0:
			n := c.take(p)
			ack := !c.released && c.consumed-c.ackSent >= uint64(c.window/2)
			c.mu.Unlock()
			if ack {
				c.sendAck()
			}
			return n, nil
		case c.err != nil:
			err := c.err
			c.mu.Unlock()
			return 0, err
		case c.gotFin:
			c.mu.Unlock()
			return 0, io.EOF
		}
		wake := c.readWake
		if wake == nil {
			wake = make(chan struct{})
			c.readWake = wake
		}
		c.mu.Unlock()
		select {
		case <-wake:
		case <-dl:
		}
	}
}

// take moves buffered bytes into p and counts the credit consumed: the
// bytes, and frameCost for each frame read to its end.
func (c *Conn) take(p []byte) int {
	n := 0
	for n < len(p) && len(c.segs) > 0 {
		s := c.segs[0]
		k := copy(p[n:], s)
		n += k
		if k < len(s) {
			c.segs[0] = s[k:]
			break
		}
		c.segs[0] = nil
		c.segs = c.segs[1:]
		c.consumed += frameCost
	}
	c.buffered -= n
	c.consumed += uint64(n)
	return n
}

// sendAck acknowledges the credit consumed so far. The value is read under
// sendMu, so that acks leave in increasing order.
func (c *Conn) sendAck() {
	c.sendMu.Lock()
	c.mu.Lock()
	v := c.consumed
	if c.released || v <= c.ackSent {
		c.mu.Unlock()
		c.sendMu.Unlock()
		return
	}
	c.ackSent = v
	c.mu.Unlock()
	err := c.sendLocked(kindAck, binary.BigEndian.AppendUint64(nil, v))
	c.sendMu.Unlock()
	c.sendFailed(err)
}

// Write writes p, blocking while the peer's window is full. It fails with
// io.ErrClosedPipe once this side's CloseWrite or the peer's Close has
// ended the direction, with ErrReset after a reset.
func (c *Conn) Write(p []byte) (int, error) {
	n, err := c.write(p)
	if err != nil {
		err = c.opErr("write", err)
	}
	return n, err
}

func (c *Conn) write(p []byte) (int, error) {
	if isClosed(c.wd.wait()) {
		return 0, os.ErrDeadlineExceeded
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	n := 0
	for {
		if n > 0 && n == len(p) {
			return n, nil
		}
		dl := c.wd.wait()
		if isClosed(dl) {
			return n, os.ErrDeadlineExceeded
		}
		c.mu.Lock()
		if err := c.writeErr(); err != nil || len(p) == 0 {
			c.mu.Unlock()
			return n, err
		}
		avail := int64(c.peerWindow) - int64(c.sent-c.acked) - frameCost
		if avail <= 0 {
			wake := c.writeWake
			if wake == nil {
				wake = make(chan struct{})
				c.writeWake = wake
			}
			c.mu.Unlock()
			select {
			case <-wake:
			case <-dl:
			}
			continue
		}
		k := int(min(int64(len(p)-n), int64(c.frameBytes), avail))
		c.sent += uint64(k) + frameCost
		c.mu.Unlock()
		c.sendMu.Lock()
		err := c.sendLocked(kindData, p[n:n+k])
		c.sendMu.Unlock()
		if err != nil {
			// A close, reset or fin that raced this frame: writeErr says
			// which on the next turn. A failed publish resets the conn.
			c.sendFailed(err)
			continue
		}
		n += k
	}
}

// writeErr is why this side may not write, or nil. mu is held.
func (c *Conn) writeErr() error {
	switch {
	case c.closed:
		return net.ErrClosed
	case c.err != nil:
		return c.err
	case c.wClosed, c.peerClosed, c.released:
		return io.ErrClosedPipe
	}
	return nil
}

// sendLocked publishes a frame of kind k to the peer; sendMu is held. A
// data frame after fin, or any frame after close or reset, is refused.
func (c *Conn) sendLocked(k kind, body []byte) error {
	switch {
	case c.sendDone:
		return errSendDone
	case k == kindData && c.finSent:
		return io.ErrClosedPipe
	case c.peer.Subject == "":
		// A reset during the handshake: nobody to tell yet.
		return nil
	}
	c.outSeq++
	c.scratch = appendFrame(c.scratch[:0], k, c.outSeq, body)
	if err := c.nc.Publish(c.peer.Subject, c.scratch); err != nil {
		c.sendDone = true
		return fmt.Errorf("%w: publish %v: %w", ErrReset, k, err)
	}
	c.lastSent.Store(int64(c.since()))
	switch k {
	case kindFin:
		c.finSent = true
	case kindClose, kindReset:
		c.sendDone = true
	}
	return nil
}

// sendFailed resets the conn when a publish failed: a frame is lost.
func (c *Conn) sendFailed(err error) {
	if errors.Is(err, ErrReset) {
		c.reset(err, false)
	}
}

// CloseWrite half-closes the conn: the peer reads io.EOF after the data
// written, and may keep writing; this side's Writes fail from now on.
func (c *Conn) CloseWrite() error {
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	case c.err != nil:
		err := c.err
		c.mu.Unlock()
		return c.opErr("close", err)
	case c.wClosed || c.released:
		c.mu.Unlock()
		return nil
	}
	c.wClosed = true
	c.signalWrite()
	c.mu.Unlock()

	c.writeMu.Lock()
	c.sendMu.Lock()
	err := c.sendLocked(kindFin, nil)
	c.sendMu.Unlock()
	c.writeMu.Unlock()
	if errors.Is(err, ErrReset) {
		c.reset(err, false)
		return c.opErr("close", err)
	}
	c.mu.Lock()
	c.finOut = err == nil
	both := c.finOut && c.gotFin
	c.mu.Unlock()
	if both {
		c.release(false)
	}
	return nil
}

// Close closes the conn: the peer reads the data written, then io.EOF. Data
// received and not read is dropped. Blocked Reads and Writes return.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.closed = true
	c.segs, c.buffered = nil, 0
	c.signalRead()
	c.signalWrite()
	live := !c.released && c.err == nil // a reset under way releases the conn
	c.mu.Unlock()
	c.rd.stop()
	c.wd.stop()
	if live {
		c.sendMu.Lock()
		_ = c.sendLocked(kindClose, nil)
		c.sendMu.Unlock()
		c.release(false)
	}
	return nil
}

// reset ends the conn with cause, telling the peer unless it reset first.
func (c *Conn) reset(cause error, tell bool) {
	c.mu.Lock()
	if c.released || c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = cause
	c.signalRead()
	c.signalWrite()
	c.mu.Unlock()
	c.log.Debug("tunnel: reset", "conn", c.local.Subject, "peer", c.peerSubject(), "cause", cause)
	if tell {
		c.sendMu.Lock()
		_ = c.sendLocked(kindReset, nil)
		c.sendMu.Unlock()
	}
	c.release(true)
}

// peerSubject is the peer's inbox, read under sendMu which guards it.
func (c *Conn) peerSubject() string {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	return c.peer.Subject
}

// release ends the conn's subscription and timer, once.
func (c *Conn) release(reset bool) {
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return
	}
	c.released = true
	sub, timer := c.sub, c.timer
	c.signalRead()
	c.signalWrite()
	c.mu.Unlock()
	if timer != nil {
		timer.Stop()
	}
	if err := sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
		c.log.Warn("tunnel: unsubscribe", "conn", c.local.Subject, "err", err)
	}
	if c.onEnd != nil {
		c.onEnd(reset)
	}
}

// onMsg takes one frame from the peer. It runs on the subscription's
// goroutine and never blocks on the conn's reader or writer.
func (c *Conn) onMsg(m *nats.Msg) {
	f, perr := parseFrame(m.Data)
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return
	}
	c.lastHeard = c.since()
	var (
		cause error
		end   bool
		tell  = true
	)
	switch {
	case perr != nil:
		cause = fmt.Errorf("%w: the peer sent %w", ErrReset, perr)
	case f.kind == kindReset:
		// Out of sequence, it may not be the peer's: tell the peer too.
		cause, tell = fmt.Errorf("%w by the peer", ErrReset), f.seq != c.inSeq+1
	case f.seq != c.inSeq+1:
		cause = fmt.Errorf("%w: frame %d lost (frame %d came next)", ErrReset, c.inSeq+1, f.seq)
	default:
		c.inSeq = f.seq
		end, cause = c.apply(f)
	}
	c.mu.Unlock()
	switch {
	case cause != nil:
		c.reset(cause, tell)
	case end:
		c.release(false)
	}
}

// apply applies an in-sequence frame; mu is held. It reports whether the
// conn's traffic has ended, or why the frame resets it.
func (c *Conn) apply(f frame) (end bool, cause error) {
	switch f.kind {
	case kindData:
		if c.gotFin {
			return false, fmt.Errorf("%w: the peer sent data after its fin", ErrReset)
		}
		cost := uint64(len(f.data)) + frameCost
		if c.recvd+cost-c.consumed > uint64(c.window) {
			return false, fmt.Errorf("%w: the peer overran the window of %d", ErrReset, c.window)
		}
		c.recvd += cost
		if c.closed {
			c.consumed += cost
			return false, nil
		}
		c.segs = append(c.segs, f.data)
		c.buffered += len(f.data)
		c.peak = max(c.peak, c.buffered)
		c.signalRead()
	case kindAck:
		if f.ack < c.acked || f.ack > c.sent {
			return false, fmt.Errorf("%w: the peer acknowledged %d with %d acknowledged and %d sent", ErrReset, f.ack, c.acked, c.sent)
		}
		c.acked = f.ack
		c.signalWrite()
	case kindFin:
		if c.gotFin {
			return false, fmt.Errorf("%w: the peer sent a second fin", ErrReset)
		}
		c.gotFin = true
		c.signalRead()
		return c.finOut, nil
	case kindClose:
		c.gotFin, c.peerClosed = true, true
		c.signalRead()
		c.signalWrite()
		return true, nil
	}
	return false, nil
}

// tick runs on the keepalive timer: it resets a conn whose peer went
// silent, and pings a peer this side has sent nothing to.
func (c *Conn) tick() {
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return
	}
	now := c.since()
	if silent := now - c.lastHeard; silent >= c.deadAfter {
		c.mu.Unlock()
		c.reset(fmt.Errorf("%w: nothing heard from the peer for %v", ErrReset, silent.Round(time.Millisecond)), true)
		return
	}
	ping := now-time.Duration(c.lastSent.Load()) >= c.pingAfter
	c.timer.Reset(c.tickEvery)
	c.mu.Unlock()
	if ping {
		c.sendMu.Lock()
		err := c.sendLocked(kindPing, nil)
		c.sendMu.Unlock()
		c.sendFailed(err)
	}
}

// signalRead wakes blocked Reads; mu is held.
func (c *Conn) signalRead() {
	if c.readWake != nil {
		close(c.readWake)
		c.readWake = nil
	}
}

// signalWrite wakes blocked Writes; mu is held.
func (c *Conn) signalWrite() {
	if c.writeWake != nil {
		close(c.writeWake)
		c.writeWake = nil
	}
}

func (c *Conn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "nats", Source: c.local, Addr: c.peer, Err: err}
}

// LocalAddr is this side's inbox.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr is the peer's inbox.
func (c *Conn) RemoteAddr() net.Addr { return c.peer }

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// SetReadDeadline sets when blocked and future Reads fail with a timeout
// (os.ErrDeadlineExceeded); the zero time means never.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opErr("set", net.ErrClosed)
	}
	c.rd.set(t)
	return nil
}

// SetWriteDeadline sets when blocked and future Writes fail with a timeout
// (os.ErrDeadlineExceeded); the zero time means never. A Write that times
// out may have sent part of its bytes.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opErr("set", net.ErrClosed)
	}
	c.wd.set(t)
	return nil
}

func (c *Conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// deadline is a channel closed when a deadline passes, as net.Pipe keeps
// them: waiters select on it.
type deadline struct {
	mu    sync.Mutex
	timer *time.Timer
	done  chan struct{}
}

func newDeadline() deadline { return deadline{done: make(chan struct{})} }

// set moves the deadline to t; the zero time means none.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.done // the timer fired: wait for it to close done
	}
	d.timer = nil
	passed := isClosed(d.done)
	if t.IsZero() {
		if passed {
			d.done = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if passed {
			d.done = make(chan struct{})
		}
		done := d.done
		d.timer = time.AfterFunc(dur, func() { close(done) })
		return
	}
	if !passed {
		close(d.done)
	}
}

// stop drops a pending timer, so that a closed conn's far deadline does not
// keep it in memory.
func (d *deadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && d.timer.Stop() {
		d.timer = nil
	}
}

// wait is the channel closed when the deadline passes.
func (d *deadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.done
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
