package kernel

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/store/storetest"
)

// TestVanishedConsumersAreForgotten: agent and runner ids that connect once
// and vanish leave nothing behind in the kernel once their grace period has
// passed; an agent id with an execution waiting for it is kept.
func TestVanishedConsumersAreForgotten(t *testing.T) {
	st := storetest.Open(t, store.Options{InMemory: true})
	hub, err := peer.NewHub(context.Background(), peer.Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer hub.Close()
	k, err := New(context.Background(), Options{Store: st, Deliverer: hubAdapter{hub}, AgentGrace: 20 * time.Millisecond, RunnerGrace: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	for i := range 1000 {
		k.AgentConnected(fmt.Sprintf("agent-%d", i), "c")()
		k.RunnerConnected(fmt.Sprintf("runner-%d", i), "c", []string{"tool"})()
	}
	if _, _, err := k.Create(context.Background(), CreateRequest{AgentID: "awaited"}, Meta{}); err != nil {
		t.Fatal(err)
	}
	eventually.Check(t, func() error {
		k.mu.Lock()
		agents, runners := len(k.agents), len(k.runners)
		_, awaited := k.agents["awaited"]
		k.mu.Unlock()
		if agents != 1 || runners != 0 || !awaited {
			return fmt.Errorf("%d agent ids and %d runner ids remembered after the grace period, want only the awaited agent", agents, runners)
		}
		return nil
	})
}
