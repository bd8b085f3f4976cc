package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/loopback"
)

// rssKiB reads a process's resident set from /proc (Linux only).
func rssKiB(tb testing.TB, pid int, field string) int {
	tb.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Skipf("no /proc: %v", err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			return n
		}
	}
	tb.Fatalf("%s not in /proc/%d/status", field, pid)
	return 0
}

// BenchmarkSlowClientsRSS measures what 1,000 hostile connections cost a
// gateway on its defaults, out of process: each opens, sends the start of
// a request and then nothing. The figure is the growth of the server's
// peak resident set (MB_rss_growth) while they hang on.
//
//	go test -run '^$' -bench SlowClientsRSS -benchtime 1x ./cmd/gatehouse
func BenchmarkSlowClientsRSS(b *testing.B) {
	const conns = 1000
	for _, sc := range []struct{ name, start string }{
		// Announces a body over the 1 MiB limit and sends none of it.
		{"body-over-limit", "POST /v0/executions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1100000\r\n\r\n"},
		// Announces a body just under the limit and sends one byte.
		{"body-under-limit", "POST /v0/executions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{"},
		// Slowloris: headers that never end.
		{"headers", "POST /v0/executions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + strings.Repeat("a", 1000)},
	} {
		b.Run(sc.name, func(b *testing.B) {
			for b.Loop() {
				c := startChild(b, loopback.FreeAddr(b), b.TempDir())
				pid := c.cmd.Process.Pid
				before := rssKiB(b, pid, "VmRSS")
				held := make([]net.Conn, 0, conns)
				for range conns {
					nc, err := net.Dial("tcp", strings.TrimPrefix(c.base, "http://"))
					if err != nil {
						b.Fatal(err)
					}
					held = append(held, nc)
					if _, err := nc.Write([]byte(sc.start)); err != nil {
						b.Fatal(err)
					}
				}
				time.Sleep(2 * time.Second)
				peak := rssKiB(b, pid, "VmHWM")
				for _, nc := range held {
					nc.Close()
				}
				b.ReportMetric(float64(peak-before)/1024, "MB_rss_growth")
				c.stop()
			}
		})
	}
}
