package cutproxy_test

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/cutproxy"
)

// echoServer echoes each line back on every connection.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

// roundTrip dials the proxy and echoes one line through it.
func roundTrip(addr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		c.Close()
		return nil, err
	}
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "ping\n" {
		c.Close()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return c, nil
}

// TestCutDropsAndRefusesUntilRestored: a connection relayed before the
// cut is closed by it, one dialed while cut is closed unanswered, and
// after Restore connections are relayed again.
func TestCutDropsAndRefusesUntilRestored(t *testing.T) {
	p := cutproxy.Start(t, echoServer(t))
	before, err := roundTrip(p.Addr())
	if err != nil {
		t.Fatalf("relayed before the cut: %v", err)
	}
	defer before.Close()
	p.Cut()
	if _, err := before.Read(make([]byte, 1)); err == nil {
		t.Fatal("a connection relayed before the cut still reads")
	}
	if c, err := roundTrip(p.Addr()); err == nil {
		c.Close()
		t.Fatal("a connection dialed while cut was relayed")
	}
	p.Restore()
	after, err := roundTrip(p.Addr())
	if err != nil {
		t.Fatalf("relayed after Restore: %v", err)
	}
	after.Close()
}
