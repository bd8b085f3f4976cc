package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
)

// TestConformancePrintsEachCheckAsItEnds: gatehouse conformance prints a
// check's line as soon as it ends, while another is still running, and the
// summary once all have.
func TestConformancePrintsEachCheckAsItEnds(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v0/health":
			io.WriteString(w, `{"status":"ok"}`)
		case "/v0/ready":
			// Holds api/ready until the test has seen api/health's line.
			select {
			case <-release:
			case <-r.Context().Done():
			}
			io.WriteString(w, `{"status":"ready"}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	var out syncbuf.Buffer
	done := make(chan error, 1)
	go func() {
		done <- conformanceCmd(context.Background(), []string{"--url", srv.URL, "--run", "^api/health$", "--run", "^api/ready$"}, &out, io.Discard)
	}()
	eventually.True(t, "the line of api/health", func() bool { return strings.Contains(out.String(), "PASS    api/health") })
	select {
	case err := <-done:
		t.Fatalf("conformance ended before api/ready did: %v\n%s", err, out.String())
	default:
	}
	if strings.Contains(out.String(), "api/ready") || strings.Contains(out.String(), "checks") {
		t.Fatalf("printed before api/ready ended:\n%s", out.String())
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("conformance: %v\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 6 || !strings.HasPrefix(lines[0], "STATUS  CHECK") || !strings.HasPrefix(lines[2], "PASS    api/ready") ||
		lines[4] != "2 checks" || lines[5] != "conformance: 2 passed, 0 failed, 0 skipped" {
		t.Fatalf("want the header, a line per check as it ended, and the summary:\n%s", out.String())
	}
}
