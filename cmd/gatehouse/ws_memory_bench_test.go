package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
)

// gcAckEnv names the file in which a child server started by
// BenchmarkIdleWebSocketMemory confirms a garbage collection. Its memory is
// only comparable before and after the connections once garbage is gone,
// and nothing else in the server collects on demand.
const gcAckEnv = "GATEHOUSE_TEST_GC_ACK"

func init() {
	ack := os.Getenv(gcAckEnv)
	if ack == "" {
		return
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	go func() {
		for n := 1; ; n++ {
			<-sig
			runtime.GC()
			runtime.GC()
			debug.FreeOSMemory()
			_ = os.WriteFile(ack, []byte(strconv.Itoa(n)), 0o600)
		}
	}()
}

// BenchmarkIdleWebSocketMemory measures what an idle agent WebSocket costs
// the server: 10,000 or 100,000 sockets (JSON, one consumer id each) are
// opened to a gatehouse server in a child process, so that the clients' own
// memory is not counted, and the child's memory is compared before and
// after, each time after a forced GC. The sockets come from many loopback
// addresses, at most 1,000 from each, as peers of an edge box do (one
// address could open at most --max-conns-per-ip). Reported per connection
// as the growth of the Go heap and stacks in use (HeapInuse + StackInuse,
// "B/conn"), of the stacks alone, of VmRSS, and of the goroutine count. The
// time per op is the time to open the sockets, which admission control
// paces at 2,000 per second past its burst.
func BenchmarkIdleWebSocketMemory(b *testing.B) {
	for _, conns := range []int{10000, 100000} {
		b.Run(fmt.Sprintf("%dk", conns/1000), func(b *testing.B) { benchIdleSockets(b, conns) })
	}
}

func benchIdleSockets(b *testing.B, conns int) {
	// The clients hold one end of every socket, the child the other, and
	// each process needs room besides for the store and the test's files.
	ensureFiles(b, uint64(conns)+1024)
	for range b.N {
		b.StopTimer()
		srv := startMemChild(b, "--max-conns", strconv.Itoa(conns+1024))
		before := srv.measure(b)
		b.StartTimer()
		clients := dialIdle(b, srv.base, conns)
		b.StopTimer()
		// fasthttp's idle workers from the dial burst retire after a second;
		// and an idle socket is measured as it lives, after the server's
		// first ping round (coder/websocket keeps some state per socket from
		// its first ping on).
		time.Sleep(gateway.Defaults().PingInterval + 3*time.Second)
		after := srv.measure(b)
		if open := srv.metric(b, `gatehouse_streams_open{kind="ws_agent"}`); open != float64(conns) {
			b.Fatalf("%v agent sockets open at the measurement, want %d", open, conns)
		}
		n := float64(conns)
		b.ReportMetric((after.rss-before.rss)/n, "RSS-B/conn")
		b.ReportMetric((after.heap+after.stack-before.heap-before.stack)/n, "B/conn")
		b.ReportMetric((after.stack-before.stack)/n, "stack-B/conn")
		b.ReportMetric((after.goroutines-before.goroutines)/n, "goroutines/conn")
		for _, c := range clients {
			_ = c.CloseNow()
		}
		srv.stop()
		b.StartTimer()
	}
}

// ensureFiles raises this process's descriptor limit to at least n, which
// the child inherits, or skips the benchmark.
func ensureFiles(b *testing.B, n uint64) {
	b.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Skipf("cannot read RLIMIT_NOFILE: %v", err)
	}
	if lim.Cur >= n {
		return
	}
	// Raising the hard limit needs privileges; without them it stays.
	lim.Cur, lim.Max = n, max(lim.Max, n)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil {
		return
	}
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Max < n {
		b.Skipf("RLIMIT_NOFILE hard limit is %d, this benchmark needs %d descriptors per process (raise it with ulimit -Hn)", lim.Max, n)
	}
	lim.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Skipf("cannot raise RLIMIT_NOFILE to %d: %v", n, err)
	}
}

// memChild is a gatehouse server process that collects garbage on SIGUSR1.
type memChild struct {
	*child
	ack string // the file the child writes the count of its GCs to
	gcs int
}

// memSample is a child's memory after a forced GC: bytes, and a goroutine
// count.
type memSample struct {
	rss, heap, stack, goroutines float64
}

func startMemChild(b *testing.B, flags ...string) *memChild {
	b.Helper()
	dir := b.TempDir()
	c := &memChild{child: newChild(loopback.FreeAddr(b), dir+"/data", flags...), ack: dir + "/gc-ack"}
	c.cmd.Env = append(c.cmd.Env, gcAckEnv+"="+c.ack)
	c.start(b)
	return c
}

// measure makes the child collect garbage and return memory to the OS, then
// reads its RSS and its Go memory statistics.
func (c *memChild) measure(b *testing.B) memSample {
	b.Helper()
	c.gcs++
	if err := c.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		b.Fatal(err)
	}
	want := strconv.Itoa(c.gcs)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if got, _ := os.ReadFile(c.ack); string(got) == want {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the server did not confirm GC %d\n%s", c.gcs, c.logs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return memSample{
		rss:        c.rss(b),
		heap:       c.metric(b, "go_memstats_heap_inuse_bytes"),
		stack:      c.metric(b, "go_memstats_stack_inuse_bytes"),
		goroutines: c.metric(b, "go_goroutines"),
	}
}

// rss reads VmRSS from /proc, in bytes.
func (c *memChild) rss(b *testing.B) float64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid))
	if err != nil {
		b.Skipf("no /proc to read the server's RSS from: %v", err)
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				b.Fatalf("VmRSS line %q: %v", line, err)
			}
			return kb * 1024
		}
	}
	b.Fatalf("no VmRSS in /proc/%d/status", c.cmd.Process.Pid)
	return 0
}

// metric reads one unlabelled sample, or one with exactly the labels given
// in name, from the child's /metrics.
func (c *memChild) metric(b *testing.B, name string) float64 {
	b.Helper()
	resp, err := http.Get(c.base + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				b.Fatalf("metric %s: %v", sc.Text(), err)
			}
			return v
		}
	}
	b.Fatalf("no metric %s in /metrics", name)
	return 0
}

// dialIdle opens n agent sockets, each under its own consumer id, at most
// socketsPerAddr from each loopback source address, and returns once every
// one has its hello. Connections refused by admission control come back
// after their Retry-After.
func dialIdle(b *testing.B, base string, n int) []*websocket.Conn {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	url := "ws" + strings.TrimPrefix(base, "http") + "/v0/agents/ws?agent_id=idle&consumer_id="
	conns := make([]*websocket.Conn, n)
	clients := make([]*http.Client, (n+socketsPerAddr-1)/socketsPerAddr)
	for i := range clients {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 1, byte(i/250), byte(i%250+1))}}
		clients[i] = &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	}
	next := make(chan int)
	errs := make(chan error, 64)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for i := range next {
				c, err := dialHello(ctx, clients[i/socketsPerAddr], url+"c"+strconv.Itoa(i))
				if err != nil {
					errs <- fmt.Errorf("socket %d: %w", i, err)
					cancel()
					return
				}
				conns[i] = c
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return conns
}

// socketsPerAddr is how many sockets dialIdle opens from one address: under
// the gateway's default --max-conns-per-ip.
const socketsPerAddr = 1000

// dialHello opens one JSON socket and reads its hello; the socket then keeps
// answering pings.
func dialHello(ctx context.Context, client *http.Client, url string) (*websocket.Conn, error) {
	opts := &websocket.DialOptions{HTTPClient: client, Subprotocols: []string{gateway.SubprotocolJSON}}
	for {
		c, resp, err := websocket.Dial(ctx, url, opts)
		if resp != nil && resp.StatusCode == http.StatusTooManyRequests {
			_, _ = io.Copy(io.Discard, resp.Body)
			secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			select {
			case <-time.After(time.Duration(max(secs, 1)) * time.Second):
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if err != nil {
			return nil, err
		}
		_, data, err := c.Read(ctx)
		if err != nil {
			return nil, err
		}
		if !bytes.HasPrefix(data, []byte(`{"type":"hello"`)) {
			return nil, errors.New("first frame is not a hello: " + string(data))
		}
		c.CloseRead(context.Background())
		return c, nil
	}
}
