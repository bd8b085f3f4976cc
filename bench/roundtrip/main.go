// Command roundtrip measures the floor under every leg of a seed 004 flow
// on this machine: a TCP round trip on loopback between two processes,
// each waiting for the other's message, as kbench and the server do one
// execution at a time. It starts a copy of itself as the echoing peer,
// sends -count messages of -size bytes one after another, and prints the
// round trip's percentiles. The same exchange inside one process, whose
// goroutines hand the message over without waking another process, is
// printed beside it.
//
//	go run ./bench/roundtrip
//
// A round trip is two legs. At C=1 a seed 004 execution is a chain of
// about nine legs between kbench and the server (the create and its
// answer, the push of the assignment, the intent and the push of its job,
// the result and the push of the tool's result, the completing intent and
// the execution stream's last event): what an execution takes beyond
// nine half round trips is work, the client's and the server's.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"slices"
	"time"
)

func main() {
	var (
		peer  = flag.String("peer", "", "serve as the echoing peer on this loopback address (used by the command itself)")
		count = flag.Int("count", 20000, "round trips to time, after 1,000 unmeasured ones")
		size  = flag.Int("size", 200, "bytes per message")
	)
	flag.Parse()
	if *size < 1 || *size > 64<<10 || *count < 1 || *count > 1_000_000 {
		log.Fatal("roundtrip: -size must be 1 to 65536 and -count 1 to 1,000,000")
	}
	if *peer != "" {
		if err := echo(*peer, *size); err != nil {
			log.Fatal(err)
		}
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		if err := echoOn(ln, *size); err != nil && !errors.Is(err, net.ErrClosed) {
			log.Print(err)
		}
	}()
	in, err := timeRoundTrips(ln.Addr().String(), *count, *size)
	if err != nil {
		log.Fatal(err)
	}
	ln.Close()

	addr, stop, err := startPeer(*size)
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	across, err := timeRoundTrips(addr, *count, *size)
	if err != nil {
		log.Fatal(err)
	}
	report("between two processes", across)
	report("inside one process", in)
}

// startPeer runs this command again as the echoing peer and returns its
// address, read from its first line of output.
func startPeer(size int) (string, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(self, "-peer", addr, "-size", fmt.Sprint(size))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr, stop, nil
		}
	}
	stop()
	return "", nil, fmt.Errorf("roundtrip: the peer did not listen on %s within 10 s", addr)
}

// echo listens on addr, which must be a loopback address, and echoes.
func echo(addr string, size int) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("roundtrip: %s is not a loopback address", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return echoOn(ln, size)
}

// echoOn sends back each message of size bytes on every connection ln
// accepts.
func echoOn(ln net.Listener, size int) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			buf := make([]byte, size)
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
	}
}

// timeRoundTrips times count round trips of size bytes to the echo at
// addr, after a thousand it does not time.
func timeRoundTrips(addr string, count, size int) ([]time.Duration, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	msg, buf := make([]byte, size), make([]byte, size)
	const warmup = 1000
	took := make([]time.Duration, 0, count)
	for i := range warmup + count {
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return nil, err
		}
		if i >= warmup {
			took = append(took, time.Since(start))
		}
	}
	return took, nil
}

func report(what string, took []time.Duration) {
	slices.Sort(took)
	at := func(p float64) time.Duration { return took[int(p*float64(len(took)-1))] }
	fmt.Printf("%-22s  round trip p50 %6.1f µs  p90 %6.1f µs  p99 %6.1f µs  (%d)\n", what,
		us(at(0.5)), us(at(0.9)), us(at(0.99)), len(took))
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
