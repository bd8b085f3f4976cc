package syncbuf

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// TestConcurrentWrites: lines written from many goroutines while another
// reads all arrive whole (run with -race, which also checks the locking).
func TestConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				fmt.Fprintf(&b, "g%d line %d\n", g, i)
			}
		})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 100 {
			_ = b.String()
		}
	}()
	wg.Wait()
	<-done
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 800 {
		t.Fatalf("got %d lines, want 800", len(lines))
	}
	for _, l := range lines {
		var g, i int
		if n, err := fmt.Sscanf(l, "g%d line %d", &g, &i); n != 2 || err != nil {
			t.Fatalf("torn line %q", l)
		}
	}
}
