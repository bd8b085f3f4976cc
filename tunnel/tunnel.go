// Package tunnel carries a net.Conn over core NATS subjects: a reliable,
// ordered, flow-controlled byte stream between two *nats.Conn, which may sit
// on different servers joined by routes or a leaf link. It lets a hub reach a
// server behind NAT that links out to it: the server listens on a subject,
// the hub dials that subject, and both sides speak plain bytes (HTTP, SSE,
// WebSocket) over the pair.
//
// # Protocol
//
// Dial sends a NATS request to the listener's subject carrying an open
// message: the dialer's receive window, how long it waits for a frame
// before it gives up on the peer (its DeadAfter), and the inbox it has
// already subscribed for the conn. The listener answers with the same
// three for its side of the conn, or with a refusal and its reason. A
// request nobody listens to is answered at once by the server with "no
// responders" (ErrNoListener). Listeners on one subject form a queue group,
// so a dial opens exactly one conn.
//
// Each side makes its inboxes (the dialer's reply subject and conn inbox,
// the listener's conn inbox) under Options.InboxPrefix when it is set, so
// that NATS permissions on that prefix can confine a party to its own
// tunnels; otherwise under the connection's own inbox prefix.
//
// From then on each side publishes frames to the other's inbox. A frame is
// a 10-byte header, version (1), kind, and the frame's sequence number in
// its direction (uint64, big endian, from 1), followed by the kind's body:
//
//	data   1  the bytes (1 or more)
//	ack    2  8 bytes: window credit the reader has consumed, cumulative
//	fin    3  none: the sender writes no more (CloseWrite)
//	close  4  none: the sender closed the conn
//	reset  5  none: the sender reset the conn
//	ping   6  none: the sender is alive
//
// Core NATS delivers one publisher's messages in order but drops them when
// a subscriber falls behind, and nothing is retransmitted: a frame whose
// sequence number is not the next one resets the conn (ErrReset), as does
// any frame that breaks the protocol. Callers reconnect and resume.
//
// Flow control counts credit, not bytes: a data frame costs its length plus
// 64, so that the receive window bounds the number of queued frames as well
// as their bytes. A writer keeps at most the peer's window of credit
// unacknowledged and blocks past it; the reader acknowledges each time Read
// has consumed half its window, so its buffer never holds more than its
// window. Data past the window resets the conn. The subscription's pending
// limits allow the window's frames plus a margin of control frames, so a
// peer that floods the inbox loses frames and is reset instead of growing
// memory.
//
// A side that has sent nothing for KeepAlive (or a third of the peer's
// DeadAfter, when that is shorter, but not under 10ms) sends a ping; a side that has heard
// nothing for DeadAfter resets the conn, so a cut link ends every conn
// across it within DeadAfter.
//
// Close sends close after the data written: the peer reads that data, then
// io.EOF, and its writes fail. CloseWrite sends fin: the peer reads io.EOF
// after the data and may keep writing. A conn's subscription and timer end
// when it is closed, reset, closed by the peer, or half-closed both ways.
package tunnel

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gatehouse-dev/gatehouse/internal/option"
)

// ErrNoListener is the dial error when nothing listens on the subject (the
// server answered "no responders"): for an edge box, it is not linked.
var ErrNoListener = errors.New("tunnel: no listener on the subject")

// ErrRefused is the dial error when the listener refused the conn: its
// backlog or MaxConns was full, or it was closing.
var ErrRefused = errors.New("tunnel: dial refused by the listener")

// ErrReset is the error of a conn that was reset: a frame was lost (a
// sequence gap), the peer went silent for DeadAfter, or a frame broke the
// protocol. Both sides see it; the data received before it can still be read.
var ErrReset = errors.New("tunnel: connection reset")

// Options tunes a Listener or a Dial. The zero value is useful: each zero
// or negative field takes the default given in its comment.
type Options struct {
	// FrameBytes is the largest data frame payload: 32 KiB, capped at the
	// NATS connection's MaxPayload less the frame header.
	FrameBytes int
	// Window is the credit a sender may have unacknowledged, and so the
	// most a receiver buffers: 256 KiB; 4 KiB to 1 GiB.
	Window int
	// KeepAlive is how long a side that has sent nothing waits before it
	// sends a ping: 2s.
	KeepAlive time.Duration
	// DeadAfter is how long a side waits for any frame from its peer
	// before it resets the conn: 3 × KeepAlive.
	DeadAfter time.Duration
	// DialTimeout bounds a Dial (its context may be shorter): 3s.
	DialTimeout time.Duration
	// Backlog is how many conns a Listener holds accepted but not yet
	// taken by Accept; a dial past it is refused: 128.
	Backlog int
	// MaxConns is how many conns of a Listener may be open at once; a dial
	// past it is refused: 4096.
	MaxConns int
	// InboxPrefix is the subject under which a Listener or a Dial makes
	// the inboxes it subscribes: a dial's reply, and each conn's inbox
	// for frames, are InboxPrefix.<unique token>. With one prefix per
	// party, NATS permissions can confine a party to its own tunnels
	// (a hub's edge boxes each to gatehouse.edge.<name>.>). It must be a
	// literal subject of at most 200 bytes. Empty: the connection's own
	// inboxes (nats.Conn.NewInbox, _INBOX.<token> by default).
	InboxPrefix string
	// Logger receives resets and refusals at debug level (Stats counts
	// them) and failures to subscribe or answer a dial at warn; nil
	// discards them.
	Logger *slog.Logger
}

const (
	defaultFrameBytes  = 32 << 10
	defaultWindow      = 256 << 10
	minWindow          = 4 << 10
	maxWindow          = 1 << 30
	defaultKeepAlive   = 2 * time.Second
	defaultDialTimeout = 3 * time.Second
	defaultBacklog     = 128
	defaultMaxConns    = 4096
	// maxDeadAfter fits the handshake's uint32 of milliseconds.
	maxDeadAfter = time.Duration(1<<32-1) * time.Millisecond
	// maxInboxPrefix leaves room in an inbox of maxInbox bytes for the
	// dot and the unique token (22 bytes) after the prefix.
	maxInboxPrefix = 200
)

// withDefaults fills the unset fields (option.Default: zero or negative)
// and checks the others; nc bounds the frame size.
func (o Options) withDefaults(nc *nats.Conn) (Options, error) {
	option.Default(&o.FrameBytes, defaultFrameBytes)
	if mp := nc.MaxPayload() - headerLen; mp > 0 && int64(o.FrameBytes) > mp {
		o.FrameBytes = int(mp)
	}
	option.Default(&o.Window, defaultWindow)
	if o.Window < minWindow || o.Window > maxWindow {
		return o, fmt.Errorf("tunnel: Options.Window is %d, outside %d to %d", o.Window, minWindow, maxWindow)
	}
	option.Default(&o.KeepAlive, defaultKeepAlive)
	option.Default(&o.DeadAfter, 3*o.KeepAlive)
	if o.DeadAfter < time.Millisecond || o.DeadAfter > maxDeadAfter {
		return o, fmt.Errorf("tunnel: Options.DeadAfter is %v, outside 1ms to %v", o.DeadAfter, maxDeadAfter)
	}
	option.Default(&o.DialTimeout, defaultDialTimeout)
	option.Default(&o.Backlog, defaultBacklog)
	option.Default(&o.MaxConns, defaultMaxConns)
	if o.InboxPrefix != "" && (len(o.InboxPrefix) > maxInboxPrefix || !literalSubject(o.InboxPrefix)) {
		return o, fmt.Errorf("tunnel: Options.InboxPrefix %q is not a literal subject of at most %d bytes", o.InboxPrefix, maxInboxPrefix)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// newInbox is a fresh inbox under o.InboxPrefix, or nc's own when unset.
func (o Options) newInbox(nc *nats.Conn) string {
	if o.InboxPrefix == "" {
		return nc.NewInbox()
	}
	return o.InboxPrefix + "." + strings.TrimPrefix(nats.NewInbox(), nats.InboxPrefix)
}

// Addr is the address of a tunnel endpoint: a listener's subject, or a
// conn's inbox.
type Addr struct {
	// Subject is the NATS subject the endpoint receives on.
	Subject string
}

// Network is "nats".
func (Addr) Network() string { return "nats" }

// String is the subject.
func (a Addr) String() string { return a.Subject }
