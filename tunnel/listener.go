package tunnel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
)

// queueGroup joins the listeners of one subject, so that a dial reaches
// one of them and opens one conn.
const queueGroup = "tunnel"

// Listener accepts the conns dialed to its subject. It implements
// net.Listener.
type Listener struct {
	nc   *nats.Conn
	o    Options
	addr Addr
	sub  *nats.Subscription

	backlog chan *Conn
	done    chan struct{}

	// mu orders a dial's hand-off to the backlog against Close.
	mu      sync.Mutex
	closing bool

	open                      atomic.Int64
	accepted, refused, resets atomic.Uint64
}

// Stats counts a Listener's conns, for metrics.
type Stats struct {
	// Open is the conns accepted and not yet ended, Accept()ed or not.
	Open int64
	// Accepted is the dials accepted.
	Accepted uint64
	// Refused is the dials refused: backlog or MaxConns full, closing, or
	// malformed.
	Refused uint64
	// Resets is the accepted conns that ended in a reset.
	Resets uint64
}

// Listen listens for conns dialed to subject on nc. The subscription is
// flushed to the server before Listen returns, so a dial through the same
// server finds it.
func Listen(nc *nats.Conn, subject string, o Options) (*Listener, error) {
	o, err := o.withDefaults(nc)
	if err != nil {
		return nil, err
	}
	l := &Listener{
		nc: nc, o: o, addr: Addr{subject},
		backlog: make(chan *Conn, o.Backlog), done: make(chan struct{}),
	}
	sub, err := nc.QueueSubscribe(subject, queueGroup, l.onDial)
	if err != nil {
		return nil, fmt.Errorf("tunnel: listen on %q: %w", subject, err)
	}
	// Dials are small; the bound keeps a flood of them from growing memory.
	if err := sub.SetPendingLimits(o.Backlog+controlSlack, (o.Backlog+controlSlack)*(helloLen+maxInbox)); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("tunnel: listen on %q: %w", subject, err)
	}
	if err := nc.FlushTimeout(o.DialTimeout); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("tunnel: listen on %q: %w", subject, err)
	}
	l.sub = sub
	return l, nil
}

// onDial answers one dial: it opens a conn and hands it to the backlog, or
// refuses.
func (l *Listener) onDial(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	k, h, _, err := parseHello(m.Data)
	if err == nil && k != kindOpen {
		err = fmt.Errorf("a handshake of %v, want open", k)
	}
	if err != nil {
		l.refuse(m, "malformed dial: "+err.Error())
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closing:
		l.refuse(m, "the listener is closing")
		return
	case l.open.Load() >= int64(l.o.MaxConns):
		l.refuse(m, fmt.Sprintf("MaxConns (%d) conns are open", l.o.MaxConns))
		return
	case len(l.backlog) == cap(l.backlog):
		l.refuse(m, fmt.Sprintf("the backlog of %d is full", cap(l.backlog)))
		return
	}
	l.open.Add(1)
	c, err := newConn(l.nc, l.o, l.o.newInbox(l.nc), l.ended)
	if err != nil {
		l.open.Add(-1)
		l.o.Logger.Warn("tunnel: open a conn", "subject", l.addr.Subject, "err", err)
		l.refuse(m, "the listener could not open a conn")
		return
	}
	if err := c.connect(h); err != nil {
		l.refuse(m, "the conn was reset as it opened")
		return
	}
	if err := m.Respond(appendHello(nil, kindAccept, hello{window: l.o.Window, deadAfter: l.o.DeadAfter, inbox: c.local.Subject})); err != nil {
		l.o.Logger.Warn("tunnel: answer a dial", "subject", l.addr.Subject, "err", err)
		c.release(true)
		return
	}
	l.accepted.Add(1)
	l.backlog <- c
}

// ended counts a conn of this listener out.
func (l *Listener) ended(reset bool) {
	l.open.Add(-1)
	if reset {
		l.resets.Add(1)
	}
}

func (l *Listener) refuse(m *nats.Msg, reason string) {
	l.refused.Add(1)
	l.o.Logger.Debug("tunnel: dial refused", "subject", l.addr.Subject, "reason", reason)
	_ = m.Respond(appendRefuse(nil, reason))
}

// Accept waits for and returns the next conn.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: "nats", Addr: l.addr, Err: net.ErrClosed}
	default:
	}
	select {
	case c := <-l.backlog:
		return c, nil
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: "nats", Addr: l.addr, Err: net.ErrClosed}
	}
}

// Close stops listening: new dials find no listener, the conns in the
// backlog are reset, and conns already accepted stay open until their
// owners close them. Blocked Accepts return.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closing {
		l.mu.Unlock()
		return &net.OpError{Op: "close", Net: "nats", Addr: l.addr, Err: net.ErrClosed}
	}
	l.closing = true
	close(l.done)
	l.mu.Unlock()
	err := l.sub.Unsubscribe()
	for drained := false; !drained; {
		select {
		case c := <-l.backlog:
			c.reset(fmt.Errorf("%w: the listener closed before accepting the conn", ErrReset), true)
		default:
			drained = true
		}
	}
	if err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("tunnel: close the listener on %q: %w", l.addr.Subject, err)
	}
	return nil
}

// Addr is the subject listened on.
func (l *Listener) Addr() net.Addr { return l.addr }

// Stats counts the listener's conns.
func (l *Listener) Stats() Stats {
	return Stats{Open: l.open.Load(), Accepted: l.accepted.Load(), Refused: l.refused.Load(), Resets: l.resets.Load()}
}

// Dial opens a conn to the listener on subject, through nc. It fails with
// ErrNoListener when nothing listens there, ErrRefused when the listener
// refuses, and a timeout when neither the listener nor the server answers
// within ctx and Options.DialTimeout.
func Dial(ctx context.Context, nc *nats.Conn, subject string, o Options) (*Conn, error) {
	o, err := o.withDefaults(nc)
	if err != nil {
		return nil, err
	}
	opErr := func(err error) error { return &net.OpError{Op: "dial", Net: "nats", Addr: Addr{subject}, Err: err} }
	ctx, cancel := context.WithTimeout(ctx, o.DialTimeout)
	defer cancel()
	c, err := newConn(nc, o, o.newInbox(nc), nil)
	if err != nil {
		return nil, opErr(err)
	}
	msg, err := request(ctx, nc, subject, o.newInbox(nc), appendHello(nil, kindOpen, hello{window: o.Window, deadAfter: o.DeadAfter, inbox: c.local.Subject}))
	if err != nil {
		c.release(false)
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			err = fmt.Errorf("%w: %w", ErrNoListener, err)
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
			err = dialTimeout{err}
		}
		return nil, opErr(err)
	}
	k, h, reason, err := parseHello(msg.Data)
	switch {
	case err != nil:
		c.release(false)
		return nil, opErr(fmt.Errorf("%w: the listener sent %w", ErrReset, err))
	case k == kindRefuse:
		c.release(false)
		return nil, opErr(fmt.Errorf("%w: %s", ErrRefused, reason))
	case k != kindAccept:
		c.release(false)
		return nil, opErr(fmt.Errorf("%w: the listener answered with %v", ErrReset, k))
	}
	if err := c.connect(h); err != nil {
		// A forged frame reset the conn before the peer was known: tell
		// the peer now.
		c.sendMu.Lock()
		_ = c.sendLocked(kindReset, nil)
		c.sendMu.Unlock()
		return nil, opErr(err)
	}
	return c, nil
}

// request sends data to subject with reply as its reply subject, and
// waits for the one answer. It is nats.Conn.Request with a reply of the
// caller's choosing, where nats.go's shares one wildcard inbox of the
// connection's between every request: a party whose permissions allow it
// only the subjects under its prefix must get the answer there. The
// reply's subscription goes to the server ahead of the request, on the
// same connection, so its interest is known wherever the request goes
// before the answer can be sent; "no responders" arrives on it as on a
// Request's.
func request(ctx context.Context, nc *nats.Conn, subject, reply string, data []byte) (*nats.Msg, error) {
	sub, err := nc.SubscribeSync(reply)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := sub.AutoUnsubscribe(1); err != nil {
		return nil, err
	}
	if err := nc.PublishRequest(subject, reply, data); err != nil {
		return nil, err
	}
	return sub.NextMsgWithContext(ctx)
}

// dialTimeout is a dial that ran out of time: a net.Error whose Timeout is
// true, matching os.ErrDeadlineExceeded as the conn's timeouts do, and its
// cause.
type dialTimeout struct{ cause error }

func (e dialTimeout) Error() string   { return "tunnel: dial timed out: " + e.cause.Error() }
func (dialTimeout) Timeout() bool     { return true }
func (dialTimeout) Temporary() bool   { return true }
func (e dialTimeout) Unwrap() []error { return []error{os.ErrDeadlineExceeded, e.cause} }
