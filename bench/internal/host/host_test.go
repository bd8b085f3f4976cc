package host

import (
	"errors"
	"os"
	"testing"
	"time"
)

func TestCheckURL(t *testing.T) {
	for _, u := range []string{"http://127.0.0.1:8080", "http://localhost:1", "http://LocalHost:1", "http://[::1]:80", "http://127.9.9.9", "https://127.0.0.1"} {
		if _, err := CheckURL(u); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
	for _, u := range []string{"http://10.0.0.1:8080", "http://example.com", "http://[2001:db8::1]"} {
		if _, err := CheckURL(u); !errors.Is(err, ErrNotLoopback) {
			t.Errorf("%s: %v, want ErrNotLoopback", u, err)
		}
	}
	for _, u := range []string{"ftp://127.0.0.1", "://x"} {
		if _, err := CheckURL(u); err == nil {
			t.Errorf("%s: accepted", u)
		}
	}
}

// TestCPUOfThisProcess: the test's own process, kept busy, is seen to use
// CPU, and a process that does not exist has none to read.
func TestCPUOfThisProcess(t *testing.T) {
	first, ok := CPU(os.Getpid())
	if !ok {
		t.Fatal("CPU of this process: not read")
	}
	x := 0
	for deadline := time.Now().Add(10 * time.Second); ; {
		for i := range 1_000_000 {
			x ^= i
		}
		if d, ok := CPU(os.Getpid()); ok && d > first {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s busy and CPU still %v (x=%d)", first, x)
		}
	}
	if _, ok := CPU(1 << 30); ok {
		t.Fatal("CPU of a process that does not exist: read")
	}
}
