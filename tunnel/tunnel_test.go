package tunnel

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/valyala/fasthttp"
	"golang.org/x/net/nettest"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
)

// TestConnPassesTheNetConnConformanceSuite runs x/net's net.Conn suite
// (basic I/O, ping-pong, deadlines past, present and future, Close during
// I/O, concurrent methods) over a dialed and accepted pair.
func TestConnPassesTheNetConnConformanceSuite(t *testing.T) {
	s := startServer(t, nil)
	ncD, ncL := connect(t, s), connect(t, s)
	l, err := Listen(ncL, "tunnel.conformance", Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		d, err := Dial(context.Background(), ncD, "tunnel.conformance", Options{})
		if err != nil {
			return nil, nil, nil, err
		}
		a, err := l.Accept()
		if err != nil {
			_ = d.Close()
			return nil, nil, nil, err
		}
		return d, a, func() { _ = d.Close(); _ = a.Close() }, nil
	})
}

// TestTransfers64MiBBothWaysAtOnceAcrossALeafLink sends 64 MiB each way at
// the same time between a client of a hub and a client of a leaf server
// linked to it, as the gateway reaches an edge box, and checks every byte.
func TestTransfers64MiBBothWaysAtOnceAcrossALeafLink(t *testing.T) {
	const size = 64 << 20
	k := startLeafLink(t)
	d, a, _ := pair(t, connect(t, k.hub), connect(t, k.leaf), Options{})

	type result struct {
		side string
		n    int64
		sum  [32]byte
		err  error
	}
	results := make(chan result, 4)
	stream := func(seed uint64) io.Reader {
		var s [32]byte
		s[0] = byte(seed)
		return io.LimitReader(rand.NewChaCha8(s), size)
	}
	send := func(side string, c *Conn, seed uint64) {
		_, err := io.Copy(c, stream(seed))
		if err == nil {
			err = c.CloseWrite()
		}
		results <- result{side: side + " write", err: err}
	}
	receive := func(side string, c *Conn) {
		h := sha256.New()
		n, err := io.Copy(h, c)
		r := result{side: side + " read", n: n, err: err}
		h.Sum(r.sum[:0])
		results <- r
	}
	want := func(seed uint64) [32]byte {
		h := sha256.New()
		_, _ = io.Copy(h, stream(seed))
		return [32]byte(h.Sum(nil))
	}
	go send("hub", d, 1)
	go send("edge", a, 2)
	go receive("hub", d)
	go receive("edge", a)
	sums := map[string]result{}
	for range 4 {
		r := <-results
		if r.err != nil {
			t.Fatalf("%s: %v", r.side, r.err)
		}
		sums[r.side] = r
	}
	for side, seed := range map[string]uint64{"edge read": 1, "hub read": 2} {
		if r := sums[side]; r.n != size || r.sum != want(seed) {
			t.Errorf("%s: %d bytes, sha256 %x; want %d bytes, sha256 %x", side, r.n, r.sum, size, want(seed))
		}
	}
}

// TestCloseDeliversTheDataThenEOFAndFailsThePeersWrites: Close is a full
// close; the peer still reads what was written before it.
func TestCloseDeliversTheDataThenEOFAndFailsThePeersWrites(t *testing.T) {
	s := startServer(t, nil)
	d, a, _ := pair(t, connect(t, s), connect(t, s), Options{})
	if _, err := d.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(a)
	if err != nil || string(got) != "last words" {
		t.Fatalf("peer read %q, %v; want %q, io.EOF", got, err, "last words")
	}
	if _, err := a.Write([]byte("anyone?")); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("peer write after close: %v, want io.ErrClosedPipe", err)
	}
	if _, err := d.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("read after close: %v, want net.ErrClosed", err)
	}
	if _, err := d.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("write after close: %v, want net.ErrClosed", err)
	}
	if err := d.Close(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("second close: %v, want net.ErrClosed", err)
	}
}

// TestCloseWriteEndsOneDirectionAndTheOtherKeepsWorking: a request, a
// half-close, then the answer, as an HTTP/1.0 client does; when both sides
// have half-closed, the conn's subscriptions end without a Close.
func TestCloseWriteEndsOneDirectionAndTheOtherKeepsWorking(t *testing.T) {
	s := startServer(t, nil)
	d, a, l := pair(t, connect(t, s), connect(t, s), Options{})
	if _, err := d.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	if err := d.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Write([]byte("more")); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("write after CloseWrite: %v, want io.ErrClosedPipe", err)
	}
	got, err := io.ReadAll(a)
	if err != nil || string(got) != "request" {
		t.Fatalf("listener side read %q, %v; want %q, io.EOF", got, err, "request")
	}
	if _, err := a.Write([]byte("answer")); err != nil {
		t.Fatalf("write the other way after the peer's CloseWrite: %v", err)
	}
	if err := a.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err = io.ReadAll(d)
	if err != nil || string(got) != "answer" {
		t.Fatalf("dialer read %q, %v; want %q, io.EOF", got, err, "answer")
	}
	eventually.True(t, "the listener counts the conn half-closed both ways as ended", func() bool {
		return l.Stats().Open == 0
	})
	if st := l.Stats(); st.Resets != 0 || st.Accepted != 1 {
		t.Errorf("stats %+v, want 1 accepted and no reset", st)
	}
}

// TestTimeoutsAreNetErrorsMatchingErrDeadlineExceeded: a deadline's error
// is a net.Error whose Timeout is true and errors.Is os.ErrDeadlineExceeded,
// and a full window blocks Write until its deadline.
func TestTimeoutsAreNetErrorsMatchingErrDeadlineExceeded(t *testing.T) {
	s := startServer(t, nil)
	d, _, _ := pair(t, connect(t, s), connect(t, s), Options{Window: minWindow})
	if err := d.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	_, rerr := d.Read(make([]byte, 1))
	if err := d.SetWriteDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	n, werr := d.Write(make([]byte, 2*minWindow))
	if n == 0 || n >= minWindow {
		t.Errorf("wrote %d bytes before the deadline, want part of the window of %d that nobody reads", n, minWindow)
	}
	for op, err := range map[string]error{"read": rerr, "write": werr} {
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s: %v (%T), want a net.Error timeout matching os.ErrDeadlineExceeded", op, err, err)
		}
	}
}

// TestDialWithNoListenerFailsWithErrNoListener: the server's no-responders
// answer ends the dial at once, long before its timeout.
func TestDialWithNoListenerFailsWithErrNoListener(t *testing.T) {
	s := startServer(t, nil)
	nc := connect(t, s)
	_, err := Dial(context.Background(), nc, "tunnel.nobody", Options{DialTimeout: eventually.Deadline})
	if !errors.Is(err, ErrNoListener) {
		t.Fatalf("dial: %v, want ErrNoListener", err)
	}
	if n := nc.NumSubscriptions(); n != 0 {
		t.Errorf("%d subscriptions left after a failed dial, want none", n)
	}
}

// TestDialAndListenKeepEveryInboxUnderTheirPrefix: with InboxPrefix, a
// dial's reply and both ends' inboxes lie under it, so two clients that the
// server allows nothing but edge.e1.> (to publish and to subscribe) open a
// conn, carry bytes both ways and see each other's end named under it; a
// dial to no listener still fails with ErrNoListener, and leaves no
// subscription. Without the prefix the same clients' dial is refused a
// subscription to _INBOX.
func TestDialAndListenKeepEveryInboxUnderTheirPrefix(t *testing.T) {
	only := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"edge.e1.>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"edge.e1.>"}},
	}
	s := startServer(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "hub", Password: "hub", Permissions: only}, {Username: "box", Password: "box", Permissions: only}}
	})
	confined := func(user string) *nats.Conn {
		// Violations are the server's answers the test checks; they are
		// not to be printed.
		nc, err := nats.Connect(s.ClientURL(), nats.UserInfo(user, user), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	hub, box := confined("hub"), confined("box")
	o := Options{InboxPrefix: "edge.e1.conns", DialTimeout: eventually.Deadline}
	if _, err := Dial(context.Background(), hub, "edge.e1.dial", o); !errors.Is(err, ErrNoListener) {
		t.Fatalf("dial with no listener: %v, want ErrNoListener", err)
	}
	if n := hub.NumSubscriptions(); n != 0 {
		t.Errorf("%d subscriptions left after a failed dial, want none", n)
	}
	l, err := Listen(box, "edge.e1.dial", o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	dialed, err := Dial(context.Background(), hub, "edge.e1.dial", o)
	if err != nil {
		t.Fatalf("dial under the prefix: %v", err)
	}
	t.Cleanup(func() { _ = dialed.Close() })
	accepted := accept(t, l)
	t.Cleanup(func() { _ = accepted.Close() })
	roundTrip(t, dialed, accepted, "to the box")
	roundTrip(t, accepted, dialed, "to the hub")
	for _, a := range []net.Addr{dialed.LocalAddr(), dialed.RemoteAddr(), accepted.LocalAddr(), accepted.RemoteAddr()} {
		if !strings.HasPrefix(a.String(), "edge.e1.conns.") {
			t.Errorf("an end's inbox %q, want it under edge.e1.conns", a)
		}
	}

	_, err = Dial(context.Background(), hub, "edge.e1.dial", Options{DialTimeout: 200 * time.Millisecond})
	if err == nil || errors.Is(err, ErrNoListener) {
		t.Fatalf("a dial of a confined client with _INBOX inboxes: %v, want it refused", err)
	}
}

// TestADialNobodyAnswersTimesOut: a subscriber that never answers (not a
// listener) makes the dial time out as a net.Error, and the dial gives its
// subscription back.
func TestADialNobodyAnswersTimesOut(t *testing.T) {
	s := startServer(t, nil)
	nc := connect(t, s)
	mute := connect(t, s)
	if _, err := mute.SubscribeSync("tunnel.mute"); err != nil {
		t.Fatal(err)
	}
	if err := mute.Flush(); err != nil { // the server has the subscription
		t.Fatal(err)
	}
	_, err := Dial(context.Background(), nc, "tunnel.mute", Options{DialTimeout: 50 * time.Millisecond})
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial: %v, want a net.Error timeout matching os.ErrDeadlineExceeded and context.DeadlineExceeded", err)
	}
	if n := nc.NumSubscriptions(); n != 0 {
		t.Errorf("%d subscriptions left after a failed dial, want none", n)
	}
}

// TestAMalformedDialIsRefused: a request that is not an open message gets
// a refusal, counted, and opens nothing.
func TestAMalformedDialIsRefused(t *testing.T) {
	s := startServer(t, nil)
	nc := connect(t, s)
	l, err := Listen(nc, "tunnel.strict", Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	for _, req := range [][]byte{
		nil,
		[]byte("GET / HTTP/1.1\r\n"),
		appendHello(nil, kindAccept, hello{window: minWindow, deadAfter: time.Second, inbox: "_INBOX.x"}),
		appendHello(nil, kindOpen, hello{window: minWindow, deadAfter: time.Second, inbox: "_INBOX.*"}),
		appendHello(nil, kindOpen, hello{window: 1, deadAfter: time.Second, inbox: "_INBOX.x"}),
	} {
		m, err := nc.Request("tunnel.strict", req, eventually.Deadline)
		if err != nil {
			t.Fatal(err)
		}
		if k, _, reason, err := parseHello(m.Data); err != nil || k != kindRefuse || !strings.HasPrefix(reason, "malformed dial") {
			t.Errorf("answer to %q: %v %q %v, want a refusal of a malformed dial", req, k, reason, err)
		}
	}
	if st := l.Stats(); st.Refused != 5 || st.Accepted != 0 || st.Open != 0 {
		t.Errorf("stats %+v, want 5 refused and nothing open", st)
	}
}

// TestDialPastTheBacklogOrMaxConnsIsRefused: a listener bounds the conns
// waiting for Accept and the conns open.
func TestDialPastTheBacklogOrMaxConnsIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		o      Options
		accept bool
	}{
		{"backlog full", Options{Backlog: 1}, false},
		{"MaxConns open", Options{MaxConns: 1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, nil)
			ncD := connect(t, s)
			d, a, l := pair(t, ncD, connect(t, s), tc.o)
			_, _ = d, a
			if !tc.accept {
				// pair accepted the first; fill the backlog again.
				next := dialWhenListening(t, ncD, l.Addr().String(), tc.o)
				t.Cleanup(func() { _ = next.Close() })
			}
			_, err := Dial(context.Background(), ncD, l.Addr().String(), tc.o)
			if !errors.Is(err, ErrRefused) {
				t.Fatalf("dial past the bound: %v, want ErrRefused", err)
			}
			if st := l.Stats(); st.Refused != 1 {
				t.Errorf("stats %+v, want 1 refused", st)
			}
		})
	}
}

// TestListenerCloseRefusesDialsAndKeepsAcceptedConns: net.Listener
// semantics. The conn accepted stays usable, the one still in the backlog
// is reset, Accept fails, and a new dial finds no listener.
func TestListenerCloseRefusesDialsAndKeepsAcceptedConns(t *testing.T) {
	s := startServer(t, nil)
	ncD := connect(t, s)
	d, a, l := pair(t, ncD, connect(t, s), Options{})
	waiting := dialWhenListening(t, ncD, l.Addr().String(), Options{})
	t.Cleanup(func() { _ = waiting.Close() })
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("accept after close: %v, want net.ErrClosed", err)
	}
	if _, err := waiting.Read(make([]byte, 1)); !errors.Is(err, ErrReset) {
		t.Errorf("read on the conn left in the backlog: %v, want ErrReset", err)
	}
	roundTrip(t, d, a, "still open")
	eventually.Check(t, func() error {
		_, err := Dial(context.Background(), ncD, l.Addr().String(), Options{})
		if !errors.Is(err, ErrNoListener) {
			return fmt.Errorf("dial after the listener closed: %v, want ErrNoListener", err)
		}
		return nil
	})
}

// roundTrip writes msg on one end and reads it on the other.
func roundTrip(t *testing.T, from, to *Conn, msg string) {
	t.Helper()
	if _, err := from.Write([]byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(to, got); err != nil || string(got) != msg {
		t.Fatalf("read %q, %v; want %q", got, err, msg)
	}
}

// TestACutLeafLinkResetsBothEndsWithinDeadAfter: when the link between an
// edge box and the hub breaks, every conn across it ends on both sides
// within DeadAfter and a margin, and leaves no goroutine behind.
func TestACutLeafLinkResetsBothEndsWithinDeadAfter(t *testing.T) {
	const conns = 8
	o := Options{KeepAlive: 100 * time.Millisecond, DeadAfter: 500 * time.Millisecond}
	// margin covers the keepalive timer's granularity and a loaded machine.
	const margin = 2 * time.Second
	k := startLeafLink(t)
	ncHub, ncEdge := connect(t, k.hub), connect(t, k.leaf)
	l, err := Listen(ncEdge, "tunnel.edge.cut", o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	// A first conn, closed, makes what lasts beyond conns (nats's response
	// subscription) part of the baseline.
	first := dialWhenListening(t, ncHub, "tunnel.edge.cut", o)
	_ = first.Close()
	_ = accept(t, l).Close()
	eventually.True(t, "the first conn ended", func() bool { return l.Stats().Open == 0 })
	base := runtime.NumGoroutine()

	type end struct {
		side string
		err  error
		at   time.Time
	}
	ends := make(chan end, 2*conns)
	var all []*Conn
	for range conns {
		d := dialWhenListening(t, ncHub, "tunnel.edge.cut", o)
		a := accept(t, l)
		all = append(all, d, a)
		roundTrip(t, d, a, "up")
		for side, c := range map[string]*Conn{"hub": d, "edge": a} {
			go func() {
				_, err := io.Copy(io.Discard, c)
				ends <- end{side, err, time.Now()}
			}()
		}
	}
	cut := time.Now()
	k.proxy.Cut()
	for range 2 * conns {
		select {
		case e := <-ends:
			if !errors.Is(e.err, ErrReset) {
				t.Errorf("%s read after the cut: %v, want ErrReset", e.side, e.err)
			}
			if took := e.at.Sub(cut); took > o.DeadAfter+margin {
				t.Errorf("%s reset %v after the cut, want within %v", e.side, took, o.DeadAfter+margin)
			}
		case <-time.After(eventually.Deadline):
			t.Fatalf("a conn still open %v after the link was cut; hub leafs %d, leaf leafs %d; stats %+v", eventually.Deadline, k.hub.NumLeafNodes(), k.leaf.NumLeafNodes(), l.Stats())
		}
	}
	// A reader learns of its reset before the listener has counted it.
	eventually.Check(t, func() error {
		if st := l.Stats(); st.Open != 0 || st.Resets != conns {
			return fmt.Errorf("stats %+v, want 0 open and %d resets", st, conns)
		}
		return nil
	})
	for _, c := range all {
		_ = c.Close()
	}
	k.proxy.Restore()
	k.waitLinked(t)
	eventually.Check(t, func() error {
		if n := runtime.NumGoroutine(); n > base {
			return fmt.Errorf("%d goroutines, %d before the conns opened", n, base)
		}
		return nil
	})
}

// TestOptionsOutOfRangeAreRefused: a window or DeadAfter out of range is
// an error naming it; an unset (zero or negative) field takes its default.
func TestOptionsOutOfRangeAreRefused(t *testing.T) {
	s := startServer(t, nil)
	nc := connect(t, s)
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Window: minWindow - 1}, "Window"},
		{Options{Window: maxWindow + 1}, "Window"},
		{Options{DeadAfter: time.Microsecond}, "DeadAfter"},
		{Options{InboxPrefix: "edge.*"}, "InboxPrefix"},
		{Options{InboxPrefix: "edge..e1"}, "InboxPrefix"},
		{Options{InboxPrefix: "edge.e1."}, "InboxPrefix"},
		{Options{InboxPrefix: "edge e1"}, "InboxPrefix"},
		{Options{InboxPrefix: strings.Repeat("e", maxInboxPrefix+1)}, "InboxPrefix"},
	} {
		_, lerr := Listen(nc, "tunnel.options", tc.o)
		_, derr := Dial(context.Background(), nc, "tunnel.options", tc.o)
		for _, err := range []error{lerr, derr} {
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%+v: %v, want an error naming %s", tc.o, err, tc.want)
			}
		}
	}
	o, err := Options{Window: -1, FrameBytes: 1 << 30, KeepAlive: -1, Backlog: -1}.withDefaults(nc)
	if err != nil {
		t.Fatal(err)
	}
	if o.Window != defaultWindow || o.KeepAlive != defaultKeepAlive || o.DeadAfter != 3*defaultKeepAlive ||
		o.Backlog != defaultBacklog || int64(o.FrameBytes) != nc.MaxPayload()-headerLen {
		t.Errorf("defaults %+v", o)
	}
}

// BenchmarkTunnelThroughput: one conn's bytes per second, one way, through
// one server on loopback, at the default window and at a larger one (on
// loopback the window, not the CPU, bounds one conn at the default).
func BenchmarkTunnelThroughput(b *testing.B) {
	for _, window := range []int{defaultWindow, 4 << 20} {
		b.Run(fmt.Sprintf("window=%dKiB", window>>10), func(b *testing.B) {
			s := startServer(b, nil)
			d, a, _ := pair(b, connect(b, s), connect(b, s), Options{Window: window})
			chunk := bytes.Repeat([]byte("gatehouse"), (32<<10)/9+1)[:32<<10]
			done := make(chan error, 1)
			want := int64(b.N) * int64(len(chunk))
			go func() {
				n, err := io.CopyN(io.Discard, a, want)
				if err == nil && n != want {
					err = fmt.Errorf("read %d of %d bytes", n, want)
				}
				done <- err
			}()
			b.SetBytes(int64(len(chunk)))
			b.ResetTimer()
			for range b.N {
				if _, err := d.Write(chunk); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// TestEndedConnsLeaveNoGoroutineOrSubscription: conns closed by either
// side, half-closed both ways, or refused give back their subscription and
// goroutines.
func TestEndedConnsLeaveNoGoroutineOrSubscription(t *testing.T) {
	s := startServer(t, nil)
	ncD, ncL := connect(t, s), connect(t, s)
	l, err := Listen(ncL, "tunnel.leak", Options{Backlog: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	first := dialWhenListening(t, ncD, "tunnel.leak", Options{})
	_ = first.Close()
	_ = accept(t, l).Close()
	eventually.True(t, "the first conn ended", func() bool { return l.Stats().Open == 0 })
	base, subsD, subsL := runtime.NumGoroutine(), ncD.NumSubscriptions(), ncL.NumSubscriptions()

	for i := range 12 {
		d := dialWhenListening(t, ncD, "tunnel.leak", Options{})
		a := accept(t, l)
		roundTrip(t, d, a, "hello")
		switch i % 3 {
		case 0:
			_ = d.Close()
			_, _ = io.Copy(io.Discard, a)
			_ = a.Close()
		case 1:
			_ = a.Close()
			_, _ = io.Copy(io.Discard, d)
			_ = d.Close()
		case 2:
			_ = d.CloseWrite()
			_ = a.CloseWrite()
		}
	}
	waiting := dialWhenListening(t, ncD, "tunnel.leak", Options{})
	if _, err := Dial(context.Background(), ncD, "tunnel.leak", Options{}); !errors.Is(err, ErrRefused) {
		t.Fatalf("dial past the backlog: %v, want ErrRefused", err)
	}
	_ = waiting.Close()
	_ = accept(t, l).Close()
	eventually.Check(t, func() error {
		n, sd, sl := runtime.NumGoroutine(), ncD.NumSubscriptions(), ncL.NumSubscriptions()
		if n > base || sd > subsD || sl > subsL {
			return fmt.Errorf("%d goroutines, %d and %d subscriptions; %d, %d and %d before", n, sd, sl, base, subsD, subsL)
		}
		return nil
	})
}

// TestAFasthttpServerServesAcceptedConns: the edge box's use. A fasthttp
// server serves the listener on a leaf server; a client of the hub sends
// two requests on one dialed conn (keep-alive) and reads both answers.
func TestAFasthttpServerServesAcceptedConns(t *testing.T) {
	k := startLeafLink(t)
	l, err := Listen(connect(t, k.leaf), "tunnel.edge.http", Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		fmt.Fprintf(ctx, "edge saw %s", ctx.Path())
	}}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		_ = srv.Shutdown()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})

	c := dialWhenListening(t, connect(t, k.hub), "tunnel.edge.http", Options{})
	t.Cleanup(func() { _ = c.Close() })
	br := bufio.NewReader(c)
	for _, path := range []string{"/first", "/second"} {
		if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: edge\r\n\r\n", path); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer to %s: %v", path, err)
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || string(body) != "edge saw "+path {
			t.Errorf("answer to %s: %d %q %v", path, resp.StatusCode, body, err)
		}
	}
	if st := l.Stats(); st.Accepted != 1 {
		t.Errorf("stats %+v, want both requests on one conn", st)
	}
}
