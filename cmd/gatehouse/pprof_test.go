package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"
)

// TestPprofOnLoopbackOnly: the profiles are served on a loopback address,
// the listener is refused anywhere else, a request naming another host
// (a DNS name rebound to 127.0.0.1) is refused, and the command line,
// which may carry a token, is not served.
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
	for _, tc := range []struct {
		path, host string
		want       int
	}{
		{"/debug/pprof/heap", "", http.StatusOK},
		{"/debug/pprof/heap", "localhost", http.StatusOK},
		{"/debug/pprof/heap", "[::1]:6060", http.StatusOK},
		{"/debug/pprof/heap", "attacker.example", http.StatusMisdirectedRequest},
		{"/debug/pprof/heap", "attacker.example:6060", http.StatusMisdirectedRequest},
		{"/debug/pprof/cmdline", "", http.StatusNotFound},
	} {
		req, err := http.NewRequest(http.MethodGet, "http://"+addr.String()+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.host != "" {
			req.Host = tc.host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s with Host %q: %d %.80q, want %d", tc.path, tc.host, resp.StatusCode, body, tc.want)
		}
	}
}
