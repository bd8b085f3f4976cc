package gateway_test

import (
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/memory"
	"github.com/gatehouse-dev/gatehouse/node"
)

// metric reads one series of GET /metrics (0 when absent).
func (a *api) metric(series string) float64 {
	a.t.Helper()
	status, body, _ := a.do("GET", "/metrics", nil)
	if status != 200 {
		a.t.Fatalf("GET /metrics: %d", status)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		a.t.Fatalf("%s: %v", series, err)
	}
	return v
}

// TestVanishedPeersAreCollected: agents, runners and browser tabs that
// connect once and vanish are forgotten after the retention: by the kernel,
// by the delivery hub and by the channel registry.
func TestVanishedPeersAreCollected(t *testing.T) {
	t.Parallel()
	s := start(t, node.Options{PeerRetention: 300 * time.Millisecond})
	a := newAPI(t, s)
	const agents, runners, tabs = 150, 150, 40
	for i := range agents {
		a.agent(fmt.Sprintf("agent-%d", i), "c").close()
	}
	for i := range runners {
		a.runner(fmt.Sprintf("runner-%d", i), "c", "tool").close()
	}
	for i := range tabs {
		a.openSSE(fmt.Sprintf("/v0/channels/stream?channel_id=web&peer_id=tab-%d", i)).close()
	}
	want := float64(agents + runners + tabs)
	eventually.Check(t, func() error {
		if got := a.metric("gatehouse_peer_consumers_collected_total"); got < want {
			return fmt.Errorf("%v of %v consumers collected", got, want)
		}
		return nil
	})
	// Left: the built-in memory runner's connections, always there.
	builtin := memory.Defaults().Queue
	got := a.json("GET", "/v0/peers", nil, 200)["peers"].([]any)
	if len(got) != builtin {
		t.Fatalf("%d peers listed after collection: %v", len(got), got)
	}
	for _, p := range got {
		if p.(obj)["id"] != "gatehouse.memory" {
			t.Fatalf("left after collection: %v", p)
		}
	}
	if got := a.metric("gatehouse_peer_consumers"); got != float64(builtin) {
		t.Fatalf("gatehouse_peer_consumers %v", got)
	}
	// The channel registry expires registrations on its own clock.
	eventually.Check(t, func() error {
		if got := a.json("GET", "/v0/channels", nil, 200)["channels"].([]any); len(got) != 0 {
			return fmt.Errorf("%d channels left registered", len(got))
		}
		return nil
	})
	if st := s.Node.Kernel.Stats(); st.AgentsOnline != 0 || st.RunnersOnline != builtin {
		t.Fatalf("kernel still counts consumers: %+v", st)
	}
}

// TestPeersListPages: GET /v0/peers pages with limit and next_cursor.
func TestPeersListPages(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	for i := range 30 {
		a.runner(fmt.Sprintf("r%02d", i), "c", "tool")
	}
	a.agent("an-agent", "c")
	var ids []string
	cursor := ""
	for pages := 1; ; pages++ {
		page := a.json("GET", "/v0/peers?role=runner&limit=7&cursor="+cursor, nil, 200)
		rows := page["peers"].([]any)
		if pages > (30+memory.Defaults().Queue+6)/7 || len(rows) > 7 {
			t.Fatalf("page %d has %d rows", pages, len(rows))
		}
		for _, r := range rows {
			if id := r.(obj)["id"].(string); id != "gatehouse.memory" {
				ids = append(ids, id)
			}
		}
		cursor = page["next_cursor"].(string)
		if cursor == "" {
			break
		}
	}
	if len(ids) != 30 || ids[0] != "r00" || ids[29] != "r29" {
		t.Fatalf("runners across pages: %v", ids)
	}
	if got := a.json("GET", "/v0/peers", nil, 200); len(got["peers"].([]any)) != 31+memory.Defaults().Queue || got["next_cursor"] != "" {
		t.Fatalf("default page: %d rows, next %q", len(got["peers"].([]any)), got["next_cursor"])
	}
	a.fail("GET", "/v0/peers?cursor=%25%25", nil, 400, "VALIDATION_ERROR")
	a.json("GET", "/v0/peers?role=channel&limit=0", nil, 200)
}

// TestDroppedDeliveriesAreCounted: an SSE agent that never acknowledges
// overflows a small outbox; the drops are in the metrics.
func TestDroppedDeliveriesAreCounted(t *testing.T) {
	s := start(t, node.Options{OutboxLimit: 4})
	a := newAPI(t, s)
	ag := a.agent("busy-agent", "c")
	for range 10 {
		a.create("busy-agent", nil)
		ag.expect("execution.assigned")
	}
	got := a.metric(`gatehouse_outbox_dropped_total{kind="rewind"}`) + a.metric(`gatehouse_outbox_dropped_total{kind="unacknowledged"}`)
	if got != 6 {
		t.Fatalf("%v deliveries counted as dropped, want 6", got)
	}
}
