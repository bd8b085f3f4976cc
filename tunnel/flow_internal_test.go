package tunnel

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
)

// credit is the window credit c has received and not yet consumed.
func (c *Conn) credit() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.recvd - c.consumed
}

// TestASlowReaderHoldsTheWriterAtTheWindow: a writer with more to send than
// the reader's window blocks once the window is out, and the reader's
// buffer never holds more than its window, however slowly it reads.
func TestASlowReaderHoldsTheWriterAtTheWindow(t *testing.T) {
	const window = 64 << 10
	s := startServer(t, nil)
	d, a, _ := pair(t, connect(t, s), connect(t, s), Options{Window: window, FrameBytes: 4 << 10})
	data := make([]byte, 1<<20)
	var seed [32]byte
	_, _ = rand.NewChaCha8(seed).Read(data)
	wrote := make(chan error, 1)
	go func() {
		_, err := d.Write(data)
		wrote <- err
	}()

	eventually.True(t, "a full window has reached the stalled reader", func() bool { return a.credit() == window })
	select {
	case err := <-wrote:
		t.Fatalf("Write returned (%v) while the reader read nothing", err)
	default:
	}
	d.mu.Lock()
	out := d.sent - d.acked
	d.mu.Unlock()
	if out != window {
		t.Errorf("the writer has %d credit out, want the window, %d", out, window)
	}

	// Read in small steps, each much less than the half window that earns
	// an ack, so the writer trickles.
	got := make([]byte, 0, len(data))
	buf := make([]byte, 1000)
	for len(got) < len(data) {
		n, err := a.Read(buf)
		if err != nil {
			t.Fatalf("read after %d bytes: %v", len(got), err)
		}
		got = append(got, buf[:n]...)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the bytes read differ from those written")
	}
	a.mu.Lock()
	peak := a.peak
	a.mu.Unlock()
	if peak > window || peak < window/2 {
		t.Errorf("the reader buffered at most %d bytes, want between half the window and the window (%d)", peak, window)
	}
}

// TestAForgedOrMalformedFrameResetsTheConn: whatever lands on a conn's
// inbox that is not the peer's next frame resets the conn on both sides,
// with no panic.
func TestAForgedOrMalformedFrameResetsTheConn(t *testing.T) {
	f := func(k kind, seq uint64, body []byte) []byte { return appendFrame(nil, k, seq, body) }
	u64 := func(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
	s := startServer(t, nil)
	ncD, ncL, forger := connect(t, s), connect(t, s), connect(t, s)
	for _, tc := range []struct {
		name   string
		frames [][]byte
	}{
		{"nothing", [][]byte{nil}},
		{"shorter than a header", [][]byte{{version, byte(kindPing), 0, 0}}},
		{"another version", [][]byte{append([]byte{version + 1}, f(kindPing, 1, nil)[1:]...)}},
		{"an unknown kind", [][]byte{f(kind(99), 1, nil)}},
		{"a handshake on a conn", [][]byte{f(kindOpen, 1, []byte("_INBOX.x"))}},
		{"an empty data frame", [][]byte{f(kindData, 1, nil)}},
		{"an ack with a short body", [][]byte{f(kindAck, 1, []byte{1})}},
		{"a ping with a body", [][]byte{f(kindPing, 1, []byte("x"))}},
		{"a sequence gap", [][]byte{f(kindPing, 2, nil)}},
		{"a replayed sequence number", [][]byte{f(kindPing, 1, nil), f(kindPing, 1, nil)}},
		{"an ack of credit never sent", [][]byte{f(kindAck, 1, u64(1<<40))}},
		{"data past the window", [][]byte{f(kindData, 1, make([]byte, minWindow))}},
		{"data after fin", [][]byte{f(kindFin, 1, nil), f(kindData, 2, []byte("x"))}},
		{"a second fin", [][]byte{f(kindFin, 1, nil), f(kindFin, 2, nil)}},
		{"a reset out of sequence", [][]byte{f(kindReset, 7, nil)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The peer stays quiet (no ping for a minute), so the forged
			// sequence numbers are the only ones the conn sees.
			d, a, l := pair(t, ncD, ncL, Options{Window: minWindow, KeepAlive: time.Minute})
			for _, b := range tc.frames {
				if err := forger.Publish(a.LocalAddr().String(), b); err != nil {
					t.Fatal(err)
				}
			}
			eventually.Check(t, func() error {
				a.mu.Lock()
				defer a.mu.Unlock()
				if a.err == nil {
					return fmt.Errorf("the conn is not reset")
				}
				return nil
			})
			if _, err := a.Read(make([]byte, 8)); !errors.Is(err, ErrReset) {
				t.Errorf("read on the conn: %v, want ErrReset", err)
			}
			_ = d.SetReadDeadline(time.Now().Add(eventually.Deadline))
			if _, err := io.Copy(io.Discard, d); !errors.Is(err, ErrReset) {
				t.Errorf("read on its peer: %v, want ErrReset", err)
			}
			if _, err := d.Write([]byte("x")); !errors.Is(err, ErrReset) {
				t.Errorf("write on its peer: %v, want ErrReset", err)
			}
			eventually.True(t, "the listener counts the reset", func() bool {
				st := l.Stats()
				return st.Resets == 1 && st.Open == 0
			})
		})
	}
}

// TestDataBeforeAGapIsReadThenErrReset: the bytes that arrived in order
// before a lost frame are delivered; the reset comes where the stream
// broke.
func TestDataBeforeAGapIsReadThenErrReset(t *testing.T) {
	s := startServer(t, nil)
	ncD, ncL, forger := connect(t, s), connect(t, s), connect(t, s)
	_, a, _ := pair(t, ncD, ncL, Options{KeepAlive: time.Minute})
	for _, b := range [][]byte{appendFrame(nil, kindData, 1, []byte("intact")), appendFrame(nil, kindData, 3, []byte("after a gap"))} {
		if err := forger.Publish(a.LocalAddr().String(), b); err != nil {
			t.Fatal(err)
		}
	}
	_ = a.SetReadDeadline(time.Now().Add(eventually.Deadline))
	got, err := io.ReadAll(a)
	if string(got) != "intact" || !errors.Is(err, ErrReset) {
		t.Errorf("read %q, %v; want %q, then ErrReset", got, err, "intact")
	}
}

// TestAFloodingPeerIsResetWithinItsBounds: a conn's subscription holds at
// most its window's frames, and a peer that keeps sending past the window
// is reset however fast it sends.
func TestAFloodingPeerIsResetWithinItsBounds(t *testing.T) {
	s := startServer(t, nil)
	ncD, ncL, forger := connect(t, s), connect(t, s), connect(t, s)
	d, a, _ := pair(t, ncD, ncL, Options{Window: minWindow, KeepAlive: time.Minute})
	msgs, bytes, err := a.sub.PendingLimits()
	if err != nil {
		t.Fatal(err)
	}
	if msgs != minWindow/frameCost+controlSlack || bytes > 2*minWindow {
		t.Errorf("pending limits of %d messages and %d bytes, want the window's frames (%d) and about its bytes (%d)",
			msgs, bytes, minWindow/frameCost+controlSlack, minWindow)
	}
	for seq := uint64(1); seq <= 10_000; seq++ {
		if err := forger.Publish(a.LocalAddr().String(), appendFrame(nil, kindData, seq, []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
	_ = a.SetReadDeadline(time.Now().Add(eventually.Deadline))
	if _, err := io.Copy(io.Discard, a); !errors.Is(err, ErrReset) {
		t.Errorf("read on the flooded conn: %v, want ErrReset", err)
	}
	a.mu.Lock()
	peak := a.peak
	a.mu.Unlock()
	if peak > minWindow {
		t.Errorf("the flooded conn buffered %d bytes, past its window of %d", peak, minWindow)
	}
	_ = d.SetReadDeadline(time.Now().Add(eventually.Deadline))
	if _, err := io.Copy(io.Discard, d); !errors.Is(err, ErrReset) {
		t.Errorf("read on its peer: %v, want ErrReset", err)
	}
}

// TestAPeersDeadAfterQuickensPingsDownToMinPing: a conn pings at a third
// of its peer's DeadAfter when that is shorter than its KeepAlive, never
// faster than minPing, and its own KeepAlive otherwise.
func TestAPeersDeadAfterQuickensPingsDownToMinPing(t *testing.T) {
	s := startServer(t, nil)
	nc := connect(t, s)
	for _, tc := range []struct {
		keepAlive, peerDeadAfter, want time.Duration
	}{
		{2 * time.Second, 6 * time.Second, 2 * time.Second},
		{2 * time.Second, 600 * time.Millisecond, 200 * time.Millisecond},
		{2 * time.Second, 3 * time.Millisecond, minPing},
		{time.Millisecond, 3 * time.Millisecond, time.Millisecond},
	} {
		o, err := Options{KeepAlive: tc.keepAlive}.withDefaults(nc)
		if err != nil {
			t.Fatal(err)
		}
		c, err := newConn(nc, o, nc.NewInbox(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.connect(hello{window: minWindow, deadAfter: tc.peerDeadAfter, inbox: nc.NewInbox()}); err != nil {
			t.Fatal(err)
		}
		c.mu.Lock()
		got := c.pingAfter
		c.mu.Unlock()
		_ = c.Close()
		if got != tc.want {
			t.Errorf("KeepAlive %v, peer's DeadAfter %v: pings after %v, want %v", tc.keepAlive, tc.peerDeadAfter, got, tc.want)
		}
	}
}

// TestAPeerThatWritesAndClosesBeforeTheDialTakesItsAnswerIsRead: the
// listener's accept and its first frames come on different subscriptions,
// so a listener that writes and closes at once may have its frames taken
// before the dial takes the accept; the dial still succeeds and the data
// reads back, then io.EOF.
func TestAPeerThatWritesAndClosesBeforeTheDialTakesItsAnswerIsRead(t *testing.T) {
	s := startServer(t, nil)
	nc, peer := connect(t, s), connect(t, s)
	o, err := Options{}.withDefaults(nc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := newConn(nc, o, nc.NewInbox(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // the server has the conn's subscription
		t.Fatal(err)
	}
	for _, f := range [][]byte{appendFrame(nil, kindData, 1, []byte("hello")), appendFrame(nil, kindClose, 2, nil)} {
		if err := peer.Publish(c.local.Subject, f); err != nil {
			t.Fatal(err)
		}
	}
	eventually.True(t, "the peer's close ends the conn", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.released
	})
	if err := c.connect(hello{window: minWindow, deadAfter: time.Second, inbox: peer.NewInbox()}); err != nil {
		t.Fatalf("the dial's answer after the peer's close: %v", err)
	}
	if got, err := io.ReadAll(c); err != nil || string(got) != "hello" {
		t.Fatalf("read %q, %v; want hello", got, err)
	}
}

// FuzzParseFrame: no input panics the frame parser, and what it accepts
// encodes back to the same bytes.
func FuzzParseFrame(f *testing.F) {
	for _, b := range [][]byte{
		appendFrame(nil, kindData, 1, []byte("hello")),
		appendFrame(nil, kindAck, 2, binary.BigEndian.AppendUint64(nil, 4096)),
		appendFrame(nil, kindFin, 3, nil),
		appendFrame(nil, kindClose, 4, nil),
		appendFrame(nil, kindReset, 5, nil),
		appendFrame(nil, kindPing, 6, nil),
		{version},
		nil,
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := parseFrame(b)
		if err != nil {
			return
		}
		body := fr.data
		if fr.kind == kindAck {
			body = binary.BigEndian.AppendUint64(nil, fr.ack)
		}
		if re := appendFrame(nil, fr.kind, fr.seq, body); !bytes.Equal(re, b) {
			t.Fatalf("%x parsed as %+v, encodes back as %x", b, fr, re)
		}
	})
}

// FuzzParseHello: no input panics the handshake parser, and the hello it
// accepts is within bounds and encodes back to the same bytes.
func FuzzParseHello(f *testing.F) {
	f.Add(appendHello(nil, kindOpen, hello{window: defaultWindow, deadAfter: 6 * time.Second, inbox: "_INBOX.abc"}))
	f.Add(appendHello(nil, kindAccept, hello{window: minWindow, deadAfter: time.Millisecond, inbox: "a.b"}))
	f.Add(appendRefuse(nil, "the backlog of 128 is full"))
	f.Add([]byte{version, byte(kindOpen), 0, 0, 16, 0, 0, 0, 0, 1, '>'})
	f.Fuzz(func(t *testing.T, b []byte) {
		k, h, reason, err := parseHello(b)
		if err != nil {
			return
		}
		var re []byte
		if k == kindRefuse {
			re = appendRefuse(nil, reason)
		} else {
			if h.window < minWindow || h.window > maxWindow || h.deadAfter <= 0 || !literalSubject(h.inbox) {
				t.Fatalf("%x accepted as %+v", b, h)
			}
			re = appendHello(nil, k, h)
		}
		if !bytes.Equal(re, b) {
			t.Fatalf("%x parsed as %v %+v %q, encodes back as %x", b, k, h, reason, re)
		}
	})
}
