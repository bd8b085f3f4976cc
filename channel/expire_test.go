package channel

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
)

// TestGoneChannelsExpire: native channels neither connected nor seen for
// the retention are removed with their outboxes, so a page that registers a
// channel per visit does not fill its owner's MaxChannels; a connected
// channel and a webhook stay, and an expired channel that comes back
// registers afresh and gets the pending prompts again.
func TestGoneChannelsExpire(t *testing.T) {
	o := fastRetry
	o.Retention = 100 * time.Millisecond
	o.MaxChannels = 8
	n := open(t, t.TempDir(), o)
	ctx := context.Background()
	b := newBot(t, 200)
	if _, _, err := n.reg.SetWebhook(ctx, "alice", b.srv.URL+"/hook", testSecret); err != nil {
		t.Fatal(err)
	}
	online, _ := connect(t, n.reg, "alice", "phone", "online")
	conn, _ := n.hub.Attach(Key(online.ChannelID, online.PeerID), nil)
	defer conn.Detach()
	// Far more visits than MaxChannels, each one a new tab id.
	for i := range 20 {
		ch, fresh := connect(t, n.reg, "alice", "web", fmt.Sprintf("tab-%d", i))
		if !fresh {
			t.Fatalf("tab %d not fresh", i)
		}
		n.reg.Prompt(pending("alice", fmt.Sprintf("act-%d", i)))
		n.reg.Connected(Key(ch.ChannelID, ch.PeerID))()
		eventually.True(t, "room for another tab", func() bool { return len(n.reg.List("alice")) < o.MaxChannels })
	}
	eventually.True(t, "the tabs expired", func() bool { return len(n.reg.List("alice")) == 2 })
	for _, ch := range n.reg.List("alice") {
		if ch.PeerID != "online" && ch.Kind != KindWebhook {
			t.Fatalf("kept %+v", ch)
		}
	}
	expired := 0
	for _, ev := range events(t, n.reg, "alice") {
		if ev.Type == TypeDisconnected && ev.Payload.Reason == "expired" {
			expired++
		}
	}
	if expired != 20 {
		t.Fatalf("%d channel.disconnected{reason: expired} events, want 20", expired)
	}
	for i := range 20 {
		if p := n.hub.Pending(Key("web", fmt.Sprintf("tab-%d", i))); p != 0 {
			t.Fatalf("tab %d's outbox still holds %d deliveries", i, p)
		}
	}
	if _, fresh := connect(t, n.reg, "alice", "web", "tab-0"); !fresh {
		t.Fatal("an expired channel that came back was not registered afresh")
	}
}
