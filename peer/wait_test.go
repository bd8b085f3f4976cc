package peer

import (
	"context"
	"testing"
	"time"
)

// TestConnWait: Wait hands out a delivery published while it waits, and
// returns false, without a delivery, once the connection ends or its
// context does.
func TestConnWait(t *testing.T) {
	cases := []struct {
		name string
		// act runs once Wait is waiting.
		act    func(h *Hub, c *Conn, cancel context.CancelFunc)
		wantOK bool
	}{
		{"a delivery arrives", func(h *Hub, c *Conn, _ context.CancelFunc) { deliver(t, h, c.Key(), "job.assigned") }, true},
		{"the connection detaches", func(_ *Hub, c *Conn, _ context.CancelFunc) { c.Detach() }, false},
		{"a newer connection supersedes it", func(h *Hub, c *Conn, _ context.CancelFunc) { h.Attach(c.Key(), nil) }, false},
		{"the context ends", func(_ *Hub, _ *Conn, cancel context.CancelFunc) { cancel() }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHub(t, nil, Options{})
			c, _ := h.Attach(Key{Role: "runner", ID: "r", Consumer: "c"}, nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			type result struct {
				d  Delivery
				ok bool
			}
			got := make(chan result, 1)
			go func() {
				d, ok := c.Wait(ctx)
				got <- result{d, ok}
			}()
			// Wait must not return before anything happened.
			select {
			case r := <-got:
				t.Fatalf("Wait returned %+v before anything happened", r)
			case <-time.After(20 * time.Millisecond):
			}
			tc.act(h, c, cancel)
			r := <-got
			if r.ok != tc.wantOK {
				t.Fatalf("Wait: ok %v, want %v", r.ok, tc.wantOK)
			}
			if tc.wantOK && r.d.Type != "job.assigned" {
				t.Fatalf("Wait gave %+v, want the job.assigned delivery", r.d)
			}
		})
	}
}
