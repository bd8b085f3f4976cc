package channel

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/store/storetest"
)

// node is a store, a hub and a registry on one data folder, as the gateway
// wires them.
type node struct {
	st  *store.Store
	hub *peer.Hub
	reg *Registry
}

func open(t *testing.T, dir string, o Options) *node {
	t.Helper()
	st := storetest.Open(t, store.Options{Dir: dir})
	hub, err := peer.NewHub(context.Background(), peer.Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	o.Store, o.Hub = st, hub
	reg, err := New(context.Background(), o)
	if err != nil {
		hub.Close()
		t.Fatal(err)
	}
	n := &node{st: st, hub: hub, reg: reg}
	t.Cleanup(n.close)
	return n
}

// close shuts down in the gateway's order; it may be called more than once.
func (n *node) close() {
	n.reg.Close()
	n.hub.Close()
	_ = n.st.Close()
}

func connect(t *testing.T, r *Registry, owner, channelID, peerID string) (Channel, bool) {
	t.Helper()
	ch, fresh, err := r.Connect(context.Background(), owner, channelID, peerID)
	if err != nil {
		t.Fatalf("connect %s %s/%s: %v", owner, channelID, peerID, err)
	}
	return ch, fresh
}

// logged is the part of a channel event the tests look at.
type logged struct {
	Type     string `json:"type"`
	EventID  string `json:"event_id"`
	Sequence uint64 `json:"sequence"`
	ActionID string `json:"action_id"`
	Payload  struct {
		ChannelID    string          `json:"channel_id"`
		NativePeerID string          `json:"native_peer_id"`
		ActionID     string          `json:"action_id"`
		Decision     string          `json:"decision"`
		Reason       string          `json:"reason"`
		Body         json.RawMessage `json:"body"`
	} `json:"payload"`
}

func events(t *testing.T, r *Registry, owner string) []logged {
	t.Helper()
	raw, latest, err := r.Events(owner, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]logged, len(raw))
	for i, m := range raw {
		if err := json.Unmarshal(m, &out[i]); err != nil {
			t.Fatalf("event %s: %v", m, err)
		}
		if out[i].Sequence != uint64(i+1) {
			t.Fatalf("event %d has sequence %d, want %d", i, out[i].Sequence, i+1)
		}
		if out[i].EventID == "" {
			t.Fatalf("event %d has no event_id", i)
		}
	}
	if latest != uint64(len(out)) {
		t.Fatalf("latest_sequence %d, want %d", latest, len(out))
	}
	return out
}

func types(evs []logged) string {
	s := make([]string, len(evs))
	for i, e := range evs {
		s[i] = e.Type
	}
	return strings.Join(s, " ")
}

func pending(owner, actionID string) bridge.Record {
	return bridge.Record{
		Approval: kernel.Approval{ActionID: actionID, Owner: owner, SessionID: "s1", ExecutionID: "e1", StepID: "st1",
			ToolID: "shell", Arguments: json.RawMessage(`{"cmd":"ls"}`), RequestedAt: time.Now().UTC()},
		State: bridge.StatePending,
	}
}

func settled(rec bridge.Record) bridge.Record {
	at := time.Now().UTC()
	rec.State, rec.Decision, rec.DecidedAt = bridge.StateApproved, bridge.DecisionAllowOnce, &at
	return rec
}

func TestConnectFreshResumedAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	n := open(t, dir, Options{})

	phone, fresh := connect(t, n.reg, "alice", "phone", "p1")
	if !fresh || phone.Kind != KindNative || phone.CreatedAt.IsZero() {
		t.Fatalf("first connect: fresh=%v %+v", fresh, phone)
	}
	if _, fresh := connect(t, n.reg, "alice", "phone", "p1"); fresh {
		t.Fatal("second connect is fresh")
	}
	connect(t, n.reg, "alice", "web", "tab1")
	connect(t, n.reg, "bob", "phone", "b1")
	n.reg.Connected(Key("phone", "p1"))()

	got := n.reg.List("alice")
	if len(got) != 2 || got[0].ChannelID != "phone" || got[1].ChannelID != "web" {
		t.Fatalf("List(alice) = %+v", got)
	}
	if all := n.reg.List(""); len(all) != 3 || all[0].Owner != "alice" || all[2].Owner != "bob" {
		t.Fatalf("List(\"\") = %+v", all)
	}

	n.close()
	n = open(t, dir, Options{})
	again, fresh := connect(t, n.reg, "alice", "phone", "p1")
	if fresh {
		t.Fatal("a channel registered before the restart is fresh after it")
	}
	if !again.CreatedAt.Equal(phone.CreatedAt) || !again.LastSeen.After(phone.LastSeen) {
		t.Fatalf("after restart: %+v, before: %+v", again, phone)
	}
	if len(n.reg.List("")) != 3 {
		t.Fatalf("List after restart = %+v", n.reg.List(""))
	}

	evs := events(t, n.reg, "alice")
	if want := "channel.connected channel.resumed channel.connected channel.disconnected channel.resumed"; types(evs) != want {
		t.Fatalf("alice's log: %s, want %s", types(evs), want)
	}
	if p := evs[3].Payload; p.ChannelID != "phone" || p.NativePeerID != "p1" {
		t.Fatalf("disconnected payload %+v", p)
	}
	if bob := events(t, n.reg, "bob"); types(bob) != "channel.connected" {
		t.Fatalf("bob's log: %s", types(bob))
	}

	page, latest, err := n.reg.Events("alice", 3, 1)
	if err != nil || len(page) != 1 || latest != 5 {
		t.Fatalf("Events(alice, 3, 1) = %d events, latest %d, %v", len(page), latest, err)
	}
	var e logged
	if err := json.Unmarshal(page[0], &e); err != nil || e.Sequence != 4 {
		t.Fatalf("Events(alice, 3, 1)[0] = %s", page[0])
	}
}

func TestConnectRejects(t *testing.T) {
	n := open(t, t.TempDir(), Options{MaxChannels: 2})
	ctx := context.Background()
	connect(t, n.reg, "alice", "phone", "p1")

	if _, _, err := n.reg.Connect(ctx, "bob", "phone", "p1"); !errors.Is(err, ErrOwned) {
		t.Fatalf("another owner's channel: %v", err)
	}
	for _, c := range []struct{ owner, channel, peer string }{
		{"", "phone", "p"}, {"alice", "", "p"}, {"alice", "phone", ""}, {"alice", "a/b", "p"},
		{"alice", WebhookChannel, "p"}, {"alice", "phone", "p\n"}, {"alice", strings.Repeat("x", MaxChannelID+1), "p"},
	} {
		if _, _, err := n.reg.Connect(ctx, c.owner, c.channel, c.peer); !errors.Is(err, ErrInvalid) {
			t.Errorf("Connect(%q, %q, %q) = %v, want ErrInvalid", c.owner, c.channel, c.peer, err)
		}
	}
	connect(t, n.reg, "alice", "web", "tab1")
	if _, _, err := n.reg.Connect(ctx, "alice", "web", "tab2"); !errors.Is(err, ErrTooMany) {
		t.Fatalf("third channel with MaxChannels 2: %v", err)
	}
	if _, fresh := connect(t, n.reg, "alice", "web", "tab1"); fresh {
		t.Fatal("resuming at the limit is fresh")
	}

	n.reg.Close()
	if _, _, err := n.reg.Connect(ctx, "alice", "phone", "p1"); !errors.Is(err, ErrClosed) {
		t.Fatalf("connect after close: %v", err)
	}
}

func TestMessage(t *testing.T) {
	n := open(t, t.TempDir(), Options{})
	connect(t, n.reg, "alice", "phone", "p1")

	if err := n.reg.Message("alice", "phone", "p1", json.RawMessage(`{"text":"on my way"}`)); err != nil {
		t.Fatal(err)
	}
	big := json.RawMessage(`"` + strings.Repeat("x", MaxMessage) + `"`)
	if err := n.reg.Message("alice", "phone", "p1", big); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized message: %v", err)
	}
	if err := n.reg.Message("alice", "phone", "p1", json.RawMessage(`{`)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("malformed message: %v", err)
	}
	if err := n.reg.Message("alice", "phone", "p2", json.RawMessage(`{}`)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("message on an unknown channel: %v", err)
	}
	if err := n.reg.Message("bob", "phone", "p1", json.RawMessage(`{}`)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("message on another owner's channel: %v", err)
	}
	evs := events(t, n.reg, "alice")
	if types(evs) != "channel.connected channel.message" {
		t.Fatalf("log: %s", types(evs))
	}
	if string(evs[1].Payload.Body) != `{"text":"on my way"}` {
		t.Fatalf("message body %s", evs[1].Payload.Body)
	}
}

// TestRetractLogsWhereTheAnswerCameBack: a record settled by a person's
// answer logs one channel.permission_returned, naming the channel or door
// it came through (and the device, or the person), whether or not that is
// a registered channel; a record that expired or was cancelled logs none.
func TestRetractLogsWhereTheAnswerCameBack(t *testing.T) {
	for _, tc := range []struct {
		name           string
		state          string
		by             *kernel.DecidedBy
		channel, peer  string // the event's; "" for no event
		registeredSeen bool
	}{
		{"a registered channel", bridge.StateDenied, &kernel.DecidedBy{Principal: "alice", ChannelID: "phone", NativePeerID: "p1"}, "phone", "p1", true},
		{"an AAP client", bridge.StateApproved, &kernel.DecidedBy{Principal: "alice", ChannelID: "aap"}, "aap", "alice", false},
		{"the CLI", bridge.StateApproved, &kernel.DecidedBy{Principal: "alice", ChannelID: "cli", NativePeerID: "alice@laptop"}, "cli", "alice@laptop", false},
		{"an answer naming no channel", bridge.StateApproved, &kernel.DecidedBy{Principal: "alice"}, DoorAPI, "alice", false},
		{"a signal", bridge.StateDenied, &kernel.DecidedBy{Principal: "alice", ChannelID: "signal"}, "signal", "alice", false},
		{"expiry", bridge.StateExpired, nil, "", "", false},
		{"cancellation", bridge.StateCancelled, nil, "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := open(t, t.TempDir(), Options{})
			ch, _ := connect(t, n.reg, "alice", "phone", "p1")
			rec := pending("alice", "a1")
			n.reg.Prompt(rec)
			at := time.Now().UTC()
			rec.State, rec.DecidedAt, rec.DecidedBy = tc.state, &at, tc.by
			if tc.state == bridge.StateApproved {
				rec.Decision = bridge.DecisionAllowOnce
			} else if tc.state == bridge.StateDenied {
				rec.Decision = bridge.DecisionDeny
			}
			n.reg.Retract(rec)

			evs := events(t, n.reg, "alice")
			var returned []logged
			for _, e := range evs {
				if e.Type == TypePermissionReturned {
					returned = append(returned, e)
				}
			}
			if tc.channel == "" {
				if len(returned) != 0 {
					t.Fatalf("%s logged %+v", tc.state, returned)
				}
				return
			}
			if len(returned) != 1 {
				t.Fatalf("log %s: want one permission_returned", types(evs))
			}
			r := returned[0]
			if r.ActionID != "a1" || r.Payload.ActionID != "a1" || r.Payload.Decision != rec.Decision ||
				r.Payload.ChannelID != tc.channel || r.Payload.NativePeerID != tc.peer {
				t.Fatalf("returned event %+v", r)
			}
			seen := n.reg.List("alice")[0].LastSeen
			if moved := seen.After(ch.LastSeen); moved != tc.registeredSeen {
				t.Fatalf("the phone's last_seen moved %v, want %v", moved, tc.registeredSeen)
			}
		})
	}
}

// recv waits for the next delivery on c.
func recv(t *testing.T, c *peer.Conn) peer.Delivery {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		if d, ok := c.Next(); ok {
			return d
		}
		select {
		case <-c.Ready():
		case <-deadline:
			t.Fatal("no delivery within 5s")
		}
	}
}

func actionOf(t *testing.T, d peer.Delivery) bridge.Record {
	t.Helper()
	var rec bridge.Record
	if err := json.Unmarshal(d.Data, &rec); err != nil {
		t.Fatalf("delivery %s: %v", d.Data, err)
	}
	return rec
}

func TestPromptRetractBackfill(t *testing.T) {
	n := open(t, t.TempDir(), Options{})
	ctx := context.Background()
	connect(t, n.reg, "alice", "phone", "p1")
	connect(t, n.reg, "alice", "web", "tab1") // registered, never attached
	connect(t, n.reg, "bob", "phone", "b1")
	phone, _ := n.hub.Attach(Key("phone", "p1"), nil)
	defer phone.Detach()

	a1 := pending("alice", "a1")
	n.reg.Prompt(a1)
	d := recv(t, phone)
	if d.Type != event.PermissionRequested || actionOf(t, d).ActionID != "a1" || actionOf(t, d).State != bridge.StatePending {
		t.Fatalf("phone got %s %s", d.Type, d.Data)
	}
	if got := n.hub.Pending(Key("web", "tab1")); got != 1 {
		t.Fatalf("offline web channel holds %d deliveries, want 1", got)
	}
	if got := n.hub.Pending(Key("phone", "b1")); got != 0 {
		t.Fatalf("bob's channel holds %d deliveries, want 0", got)
	}

	n.reg.Retract(settled(a1))
	d = recv(t, phone)
	if d.Type != event.PermissionResolved || actionOf(t, d).State != bridge.StateApproved {
		t.Fatalf("phone got %s %s", d.Type, d.Data)
	}
	web, _ := n.hub.Attach(Key("web", "tab1"), nil)
	defer web.Detach()
	if d := recv(t, web); d.Type != event.PermissionRequested || actionOf(t, d).ActionID != "a1" {
		t.Fatalf("web got %s %s first", d.Type, d.Data)
	}
	if d := recv(t, web); d.Type != event.PermissionResolved || actionOf(t, d).ActionID != "a1" {
		t.Fatalf("web got %s %s second", d.Type, d.Data)
	}

	// A prompt that lost the race with its own retraction stays retracted.
	n.reg.Prompt(a1)
	if got := n.hub.Pending(Key("web", "tab1")); got != 2 {
		t.Fatalf("a retracted prompt was forwarded again: %d pending", got)
	}

	// A channel registering while a2 is pending gets it by backfill, and
	// only what is pending and its owner's.
	a2 := pending("alice", "a2")
	n.reg.Prompt(a2)
	tablet, fresh := connect(t, n.reg, "alice", "tablet", "t1")
	if !fresh {
		t.Fatal("tablet is not fresh")
	}
	if err := n.reg.Backfill(ctx, tablet, []bridge.Record{pending("bob", "b9"), settled(pending("alice", "a0")), a2}); err != nil {
		t.Fatal(err)
	}
	tc, _ := n.hub.Attach(Key("tablet", "t1"), nil)
	defer tc.Detach()
	if d := recv(t, tc); d.Type != event.PermissionRequested || actionOf(t, d).ActionID != "a2" {
		t.Fatalf("tablet got %s %s", d.Type, d.Data)
	}
	if n.hub.Pending(Key("tablet", "t1")) != 1 {
		t.Fatalf("tablet holds %d deliveries, want 1", n.hub.Pending(Key("tablet", "t1")))
	}
	if err := n.reg.Backfill(ctx, Channel{Owner: "alice", ChannelID: "gone", PeerID: "x"}, []bridge.Record{a2}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("backfill to an unknown channel: %v", err)
	}

	var forwarded []string
	for _, e := range events(t, n.reg, "alice") {
		if e.Type == TypePermissionForwarded {
			if e.ActionID != e.Payload.ActionID {
				t.Fatalf("forwarded event %+v", e)
			}
			forwarded = append(forwarded, e.Payload.ActionID+"@"+e.Payload.ChannelID)
		}
	}
	if got := strings.Join(forwarded, " "); got != "a1@phone a1@web a2@phone a2@web a2@tablet" {
		t.Fatalf("forwarded: %s", got)
	}
	if bob := events(t, n.reg, "bob"); types(bob) != "channel.connected" {
		t.Fatalf("bob's log: %s", types(bob))
	}
}

func TestLogLimit(t *testing.T) {
	n := open(t, t.TempDir(), Options{LogLimit: 3})
	connect(t, n.reg, "alice", "phone", "p1")
	for range 4 {
		n.reg.Connected(Key("phone", "p1"))()
	}
	raw, latest, err := n.reg.Events("alice", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var first logged
	if len(raw) != 3 || latest != 5 || json.Unmarshal(raw[0], &first) != nil || first.Sequence != 3 {
		t.Fatalf("kept %d events from %d, latest %d", len(raw), first.Sequence, latest)
	}
}
