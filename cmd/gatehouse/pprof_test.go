package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"
)

// TestPprofOnLoopbackOnly: the profiles are served on a loopback address
// and the listener is refused anywhere else.
func TestPprofOnLoopbackOnly(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	if _, _, err := servePprof("0.0.0.0:0", log); err == nil {
		t.Fatal("pprof listened on every address")
	}
	addr, stop, err := servePprof("127.0.0.1:0", log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop(context.Background())
	resp, err := http.Get("http://" + addr.String() + "/debug/pprof/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(body) == 0 {
		t.Fatalf("cmdline: %d %q", resp.StatusCode, body)
	}
}
