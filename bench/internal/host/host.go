// Package host is what the bench tools know of the machine they load: that
// a server's URL is on it (they load loopback only), and how much CPU a
// process on it has used.
package host

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// ErrNotLoopback refuses an address off this machine.
var ErrNotLoopback = errors.New("refusing to talk to a non-loopback address (the bench tools are loopback-only)")

// CheckURL parses raw and refuses it unless it is http or https on a
// loopback address or "localhost". A client that dials should also check
// the address it reached.
func CheckURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("unsupported scheme %q", u.Scheme)
	}
	h := u.Hostname()
	if strings.EqualFold(h, "localhost") {
		return u, nil
	}
	ip := net.ParseIP(h)
	if ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("%w: host %q", ErrNotLoopback, h)
	}
	return u, nil
}

// CPU returns the user and system CPU time process pid has used (Linux
// /proc); false when it cannot be read. Clock ticks are taken to be 100 Hz
// (USER_HZ), which is what Linux reports in /proc/<pid>/stat on every
// mainstream architecture.
func CPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(b)
	// comm may contain spaces; the fields resume after the last ')'.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	// After ')': state(0) ppid(1) ... utime, field 14 of the line, is 11.
	if len(f) < 13 {
		return 0, false
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(ut+st) * (time.Second / 100), true
}
