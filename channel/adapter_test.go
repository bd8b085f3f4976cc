package channel_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/channel/channeltest"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// platform is a chat platform served from the test: an Adapter that keeps
// the cards it was asked to show, and fails as told.
type platform struct {
	name   string
	routes []channel.Route

	mu       sync.Mutex
	cards    map[string]*shown // by ref
	order    []string
	attempts int
	inFlight int
	peak     int
	// fail, when set, decides each call's error.
	fail func(op, dest string) error
	// hold, when set, makes every call wait for the context.
	hold bool
	data [][]byte // the Dest.Data of each call
	at   []time.Time
}

type shown struct {
	dest, action string
	card         channel.Card
	edits        []channel.Card
}

func newPlatform(routes ...channel.Route) *platform {
	return &platform{name: "fake", routes: routes, cards: map[string]*shown{}}
}

func (p *platform) Name() string            { return p.name }
func (p *platform) Routes() []channel.Route { return p.routes }

func (p *platform) enter(ctx context.Context, op, dest string, data []byte) error {
	p.mu.Lock()
	p.attempts++
	p.inFlight++
	p.peak = max(p.peak, p.inFlight)
	p.data = append(p.data, data)
	p.at = append(p.at, time.Now())
	hold, fail := p.hold, p.fail
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.inFlight--
		p.mu.Unlock()
	}()
	if hold {
		<-ctx.Done()
		return ctx.Err()
	}
	if fail != nil {
		return fail(op, dest)
	}
	return nil
}

func (p *platform) Send(ctx context.Context, d channel.Dest, c channel.Card) (string, error) {
	if err := p.enter(ctx, "send", d.ID, d.Data); err != nil {
		return "", err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ref := fmt.Sprintf("m%d", len(p.order)+1)
	p.cards[ref] = &shown{dest: d.ID, action: c.Record.ActionID, card: c}
	p.order = append(p.order, ref)
	return ref, nil
}

func (p *platform) Edit(ctx context.Context, d channel.Dest, ref string, c channel.Card) error {
	if err := p.enter(ctx, "edit", d.ID, d.Data); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.cards[ref]
	if s == nil || s.dest != d.ID {
		return fmt.Errorf("%w: no card %s at %s", channel.ErrPermanent, ref, d.ID)
	}
	s.edits = append(s.edits, c)
	return nil
}

// card returns the card shown at dest for actionID.
func (p *platform) card(dest, actionID string) (shown, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ref := range p.order {
		if s := p.cards[ref]; s.dest == dest && s.action == actionID {
			return *s, true
		}
	}
	return shown{}, false
}

// refOf returns the ref Send returned for the card of actionID at dest.
func (p *platform) refOf(dest, actionID string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ref := range p.order {
		if s := p.cards[ref]; s.dest == dest && s.action == actionID {
			return ref
		}
	}
	return ""
}

// waitCard waits for the card of actionID at dest.
func (p *platform) waitCard(t *testing.T, dest, actionID string) shown {
	t.Helper()
	return eventually.Value(t, "a card at "+dest, func() (shown, bool) { return p.card(dest, actionID) })
}

// waitEdit waits for the card of actionID at dest to be edited to state.
func (p *platform) waitEdit(t *testing.T, dest, actionID, state string) channel.Card {
	t.Helper()
	return eventually.Value(t, "the card at "+dest+" edited to "+state, func() (channel.Card, bool) {
		s, ok := p.card(dest, actionID)
		if !ok || len(s.edits) == 0 {
			return channel.Card{}, false
		}
		last := s.edits[len(s.edits)-1]
		return last, last.Record.State == state
	})
}

func (p *platform) sends(dest string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.cards {
		if s.dest == dest {
			n++
		}
	}
	return n
}

func (p *platform) set(f func(*platform)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
}

// Hooks serves one form endpoint that echoes what it was given.
func (p *platform) Hooks() []channel.Hook {
	return []channel.Hook{{Path: "/v0/channels/fake/hook", Form: true, Serve: func(_ context.Context, h http.Header, body []byte) channel.HookReply {
		return channel.HookReply{Status: 202, ContentType: "text/plain", Body: []byte(h.Get("X-Test") + "|" + string(body))}
	}}}
}

// fastRetry makes the adapter layer retry at once in tests.
var fastRetry = channel.Options{RetryBase: time.Millisecond, RetryMax: 10 * time.Millisecond}

func startWith(t *testing.T, p *platform, co channel.Options, o node.Options) *nodetest.Server {
	t.Helper()
	co.Adapters = append(co.Adapters, p)
	o.Channels = co
	if o.Policy == nil {
		o.Policy = policytest.Parse(t, channeltest.Policy)
	}
	return nodetest.Start(t, o)
}

func answer(t *testing.T, s *nodetest.Server, a channel.Answer) (bridge.Record, bool, error) {
	t.Helper()
	return s.Node.Channels.Answer(context.Background(), a)
}

// TestAdapterShowsEveryCardAndEditsThemOnResolution: a prompt is shown at
// every destination of its owner and nowhere else; the first answer wins,
// its audit names the channel and the platform's user, every card is
// edited to the outcome, and a later answer gets the recorded outcome.
func TestAdapterShowsEveryCardAndEditsThemOnResolution(t *testing.T) {
	p := newPlatform(channel.Route{Owner: "alice", ID: "room1"}, channel.Route{Owner: "alice", ID: "room2"}, channel.Route{Owner: "bob", ID: "room3"})
	s := startWith(t, p, fastRetry, node.Options{})
	rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", map[string]any{"target": "prod"})
	c1 := p.waitCard(t, "room1", rec.ActionID)
	p.waitCard(t, "room2", rec.ActionID)
	if c1.card.Token == "" || len(c1.card.Values) != 3 {
		t.Fatalf("card without answers: %+v", c1.card)
	}
	for d, v := range c1.card.Values {
		if len(v) > 64 {
			t.Fatalf("value of %s is %d bytes, over Telegram's 64", d, len(v))
		}
	}

	got, won, err := answer(t, s, channel.Answer{Adapter: "fake", Dest: "room1", User: "U1", Principal: "alice", Value: c1.card.Values[bridge.DecisionAllowOnce]})
	if err != nil || !won || got.State != bridge.StateApproved {
		t.Fatalf("answer: %v won=%v %+v", err, won, got)
	}
	if by := got.DecidedBy; by == nil || by.Principal != "alice" || by.ChannelID != "fake" || by.NativePeerID != "U1" {
		t.Fatalf("audit: %+v", got.DecidedBy)
	}
	for _, room := range []string{"room1", "room2"} {
		c := p.waitEdit(t, room, rec.ActionID, bridge.StateApproved)
		if want := "Allowed once by alice via fake (U1) at "; !strings.HasPrefix(channel.Outcome(c.Record), want) {
			t.Fatalf("%s says %q", room, channel.Outcome(c.Record))
		}
	}
	c2, _ := p.card("room2", rec.ActionID)
	late, won, err := answer(t, s, channel.Answer{Adapter: "fake", Dest: "room2", User: "U2", Principal: "alice", Value: c2.card.Values[bridge.DecisionDeny]})
	if err != nil || won || late.State != bridge.StateApproved || late.DecidedBy.NativePeerID != "U1" {
		t.Fatalf("late answer: %v won=%v %+v", err, won, late)
	}
	if n := p.sends("room3"); n != 0 {
		t.Fatalf("bob's room got %d cards of alice's prompt", n)
	}
	raw, _, err := s.Node.Channels.Events("alice", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	returned := 0
	for _, ev := range raw {
		if strings.Contains(string(ev), `"channel.permission_returned"`) {
			returned++
			if !strings.Contains(string(ev), `"channel_id":"fake","native_peer_id":"U1"`) {
				t.Fatalf("permission_returned: %s", ev)
			}
		}
	}
	if returned != 1 {
		t.Fatalf("%d channel.permission_returned events, want 1", returned)
	}
	st := s.Node.Channels.Stats()
	if st.Counted("fake", channel.StatAnswers, "won") != 1 || st.Counted("fake", channel.StatAnswers, "recorded") != 1 ||
		st.Counted("fake", channel.StatSent, "") != 2 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestAdapterQueueSurvivesRestart: a prompt raised while the platform is
// down waits in its destination's durable queue; after a restart it is
// shown, once, and a further restart shows it no second time.
func TestAdapterQueueSurvivesRestart(t *testing.T) {
	p := newPlatform(channel.Route{Owner: "alice", ID: "room1"})
	down := errors.New("platform down")
	p.fail = func(string, string) error { return down }
	s := startWith(t, p, fastRetry, node.Options{})
	rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", nil)
	eventually.True(t, "failed sends retried", func() bool {
		return s.Node.Channels.Stats().Counted("fake", channel.StatFailed, "") >= 2
	})
	if q := s.Node.Channels.Stats().Queued; q != 1 {
		t.Fatalf("queued %d, want 1", q)
	}
	s.Stop()
	p.set(func(p *platform) { p.fail = nil })
	s.Restart()
	p.waitCard(t, "room1", rec.ActionID)
	eventually.True(t, "the queue drained", func() bool { return s.Node.Channels.Stats().Queued == 0 })
	s.Restart()
	rec2 := channeltest.Ask(t, s.Node, "alice", "deploy.other", nil)
	p.waitCard(t, "room1", rec2.ActionID)
	if n := p.sends("room1"); n != 2 {
		t.Fatalf("%d cards shown, want 2 (one per prompt)", n)
	}
}

// TestAdapterDeadPlatformDoesNotHoldTheBridge: with every call to the
// platform hanging, prompts are still raised and answered elsewhere, no
// more than MaxSends calls are in flight in all, and the node still stops.
func TestAdapterDeadPlatformDoesNotHoldTheBridge(t *testing.T) {
	var routes []channel.Route
	for i := range 6 {
		routes = append(routes, channel.Route{Owner: "alice", ID: fmt.Sprintf("room%d", i)})
	}
	p := newPlatform(routes...)
	p.hold = true
	co := fastRetry
	co.MaxSends, co.SendTimeout = 2, time.Hour
	s := startWith(t, p, co, node.Options{})
	var recs []bridge.Record
	for i := range 10 {
		recs = append(recs, channeltest.Ask(t, s.Node, "alice", fmt.Sprintf("deploy.%d", i), nil))
	}
	eventually.True(t, "calls in flight", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.inFlight == 2
	})
	// A person answers through the API meanwhile.
	status, body, _ := nodetest.Do(t, nil, "POST", s.URL+"/v0/actions/"+recs[0].ActionID+"/respond", map[string]string{"decision": "deny"})
	if status != 200 {
		t.Fatalf("respond: %d %s", status, body)
	}
	p.mu.Lock()
	peak := p.peak
	p.mu.Unlock()
	if peak != 2 {
		t.Fatalf("%d calls in flight at most, want MaxSends = 2", peak)
	}
	// Every prompt at every room (60) and the answered one's retraction
	// (6) wait in the queues; the two calls in flight are not done either.
	eventually.Check(t, func() error {
		if q := s.Node.Channels.Stats().Queued; q != 66 {
			return fmt.Errorf("queued %d, want 66", q)
		}
		return nil
	})
	s.Stop()
}

// TestAdapterRetriesWithBackoffThenGivesUpOnRefusals: transient failures
// are retried until the card is shown, a platform's Retry-After is
// waited, and a permanent refusal is not retried but counted.
func TestAdapterRetriesWithBackoffThenGivesUpOnRefusals(t *testing.T) {
	p := newPlatform(channel.Route{Owner: "alice", ID: "room1"}, channel.Route{Owner: "bob", ID: "room2"})
	fails := 0
	p.fail = func(_, dest string) error {
		switch {
		case dest == "room2":
			return fmt.Errorf("%w: message too long", channel.ErrPermanent)
		case fails < 2:
			fails++
			return errors.New("connection reset")
		case fails == 2:
			fails++
			return &channel.RetryAfterError{After: 300 * time.Millisecond, Err: errors.New("429 too many requests")}
		}
		return nil
	}
	s := startWith(t, p, fastRetry, node.Options{})
	rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", nil)
	p.waitCard(t, "room1", rec.ActionID)
	p.mu.Lock()
	gap := p.at[len(p.at)-1].Sub(p.at[len(p.at)-2])
	p.mu.Unlock()
	if gap < 300*time.Millisecond {
		t.Fatalf("retried %v after a Retry-After of 300ms", gap)
	}
	channeltest.Ask(t, s.Node, "bob", "deploy.app", nil)
	eventually.True(t, "the refusal counted", func() bool {
		return s.Node.Channels.Stats().Counted("fake", channel.StatDropped, "refused") == 1
	})
	st := s.Node.Channels.Stats()
	if st.Counted("fake", channel.StatFailed, "") != 3 || st.Counted("fake", channel.StatSent, "") != 1 {
		t.Fatalf("stats: %+v", st)
	}
	p.mu.Lock()
	attempts := p.attempts
	p.mu.Unlock()
	if attempts != 5 {
		t.Fatalf("%d attempts, want 4 for room1 and 1 for the refused room2", attempts)
	}
}

// TestAdapterExpiryIsItsOwnOutcome: a prompt nobody answers expires; its
// card says so (and what it means: denied), and an answer after that gets
// the recorded expiry.
func TestAdapterExpiryIsItsOwnOutcome(t *testing.T) {
	p := newPlatform(channel.Route{Owner: "alice", ID: "room1"})
	s := startWith(t, p, fastRetry, node.Options{})
	rec := channeltest.Ask(t, s.Node, "alice", "expire.soon", nil)
	c := p.waitCard(t, "room1", rec.ActionID)
	edited := p.waitEdit(t, "room1", rec.ActionID, bridge.StateExpired)
	if got := channel.Outcome(edited.Record); !strings.HasPrefix(got, "Expired with no answer: denied") {
		t.Fatalf("expired card says %q", got)
	}
	late, won, err := answer(t, s, channel.Answer{Adapter: "fake", Dest: "room1", User: "U1", Principal: "alice", Value: c.card.Values[bridge.DecisionAllowOnce]})
	if err != nil || won || late.State != bridge.StateExpired {
		t.Fatalf("answer after expiry: %v won=%v %+v", err, won, late)
	}
}

// TestAdapterRefusesWhoMayNotAnswer: a rule's responders answer its
// prompts (and its owner may not unless listed), a rule without any is
// answered by the owner alone, an unmapped user by no one, and a value
// altered or moved to another destination is refused as tampered; each
// refusal is counted by reason.
func TestAdapterRefusesWhoMayNotAnswer(t *testing.T) {
	p := newPlatform(channel.Route{Owner: "alice", ID: "room1"}, channel.Route{Owner: "alice", ID: "room2"})
	co := fastRetry
	co.Responders = map[string][]string{"ask": {"bob", "carol"}}
	s := startWith(t, p, co, node.Options{})
	rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", nil)
	c := p.waitCard(t, "room1", rec.ActionID)
	allow := c.card.Values[bridge.DecisionAllowOnce]
	refusals := []struct {
		a      channel.Answer
		reason string
	}{
		{channel.Answer{Dest: "room1", User: "U1", Principal: "alice", Value: allow}, channel.RefusedResponder},
		{channel.Answer{Dest: "room1", User: "U9", Principal: "", Value: allow}, channel.RefusedUnmapped},
		{channel.Answer{Dest: "room2", User: "U2", Principal: "bob", Value: allow}, channel.RefusedTampered},
		{channel.Answer{Dest: "room1", User: "U2", Principal: "bob", Value: "d" + allow[1:]}, channel.RefusedTampered},
		{channel.Answer{Dest: "room1", User: "U2", Principal: "bob", Value: strings.Replace(allow, rec.ActionID[:8], "00000000", 1)}, channel.RefusedTampered},
		{channel.Answer{Dest: "room1", User: "U2", Principal: "bob", Value: "garbage"}, channel.RefusedTampered},
	}
	for _, tc := range refusals {
		tc.a.Adapter = "fake"
		_, _, err := answer(t, s, tc.a)
		var re *channel.RefusedError
		if !errors.As(err, &re) || re.Reason != tc.reason || !errors.Is(err, channel.ErrRefused) {
			t.Fatalf("%+v: %v, want refused for %s", tc.a, err, tc.reason)
		}
	}
	got, won, err := answer(t, s, channel.Answer{Adapter: "fake", Dest: "room1", User: "U2", Principal: "bob", Value: allow})
	if err != nil || !won || got.DecidedBy.Principal != "bob" {
		t.Fatalf("bob's answer: %v won=%v %+v", err, won, got.DecidedBy)
	}
	brief := channeltest.Ask(t, s.Node, "alice", "expire.later", nil)
	bc := p.waitCard(t, "room1", brief.ActionID)
	if _, _, err := answer(t, s, channel.Answer{Adapter: "fake", Dest: "room1", User: "U2", Principal: "bob", Value: bc.card.Values[bridge.DecisionDeny]}); !errors.Is(err, channel.ErrRefused) {
		t.Fatalf("bob answered a rule with no responders: %v", err)
	}
	st := s.Node.Channels.Stats()
	for reason, want := range map[string]uint64{channel.RefusedResponder: 2, channel.RefusedUnmapped: 1, channel.RefusedTampered: 4} {
		if n := st.Counted("fake", channel.StatRefused, reason); n != want {
			t.Fatalf("refused %s: %d, want %d (%+v)", reason, n, want, st)
		}
	}
}

// TestAdapterRespondersComeWithThePrompt: a policy rule's responders are
// kept on each of its prompts and decide who may answer it through a
// channel, before the --channel-responders list of the same rule and
// instead of the owner.
func TestAdapterRespondersComeWithThePrompt(t *testing.T) {
	p := newPlatform(channel.Route{Owner: "alice", ID: "room1"})
	co := fastRetry
	co.Responders = map[string][]string{"team": {"carol"}}
	s := startWith(t, p, co, node.Options{Policy: policytest.Parse(t, `
rules:
  - id: team
    priority: 1
    when: {tool_id: "deploy*"}
    then: {decision: require_approval, reason: "the on-call team answers", responders: [bob, dave]}
default:
  decision: allow
`)})
	rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", nil)
	if !slices.Equal(rec.Responders, []string{"bob", "dave"}) {
		t.Fatalf("the prompt's responders: %q", rec.Responders)
	}
	allow := p.waitCard(t, "room1", rec.ActionID).card.Values[bridge.DecisionAllowOnce]
	for _, who := range []string{"alice", "carol"} {
		_, _, err := answer(t, s, channel.Answer{Adapter: "fake", Dest: "room1", User: "U-" + who, Principal: who, Value: allow})
		var re *channel.RefusedError
		if !errors.As(err, &re) || re.Reason != channel.RefusedResponder {
			t.Fatalf("%s's answer: %v, want refused for %s", who, err, channel.RefusedResponder)
		}
	}
	got, won, err := answer(t, s, channel.Answer{Adapter: "fake", Dest: "room1", User: "U-dave", Principal: "dave", Value: allow})
	if err != nil || !won || got.DecidedBy.Principal != "dave" {
		t.Fatalf("dave's answer: %v won=%v %+v", err, won, got.DecidedBy)
	}
}

// TestAdapterGoneDestinationIsRemoved: a destination the platform says is
// gone is unregistered, with a channel.disconnected whose reason is gone.
func TestAdapterGoneDestinationIsRemoved(t *testing.T) {
	p := newPlatform()
	p.fail = func(_, dest string) error {
		if dest == "sub-gone" {
			return fmt.Errorf("%w: 410", channel.ErrGone)
		}
		return nil
	}
	s := startWith(t, p, fastRetry, node.Options{})
	ctx := context.Background()
	for _, id := range []string{"sub-gone", "sub-ok"} {
		if _, _, err := s.Node.Channels.SetDest(ctx, "alice", "fake", id, []byte("keys of "+id)); err != nil {
			t.Fatal(err)
		}
	}
	rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", nil)
	p.waitCard(t, "sub-ok", rec.ActionID)
	eventually.True(t, "the gone destination removed", func() bool { return len(s.Node.Channels.Dests("fake", "alice")) == 1 })
	raw, _, err := s.Node.Channels.Events("alice", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if last := string(raw[len(raw)-1]); !strings.Contains(last, `"channel.disconnected"`) || !strings.Contains(last, `"reason":"gone"`) {
		t.Fatalf("last channel event: %s", last)
	}
	if n := s.Node.Channels.Stats().Counted("fake", channel.StatDropped, "gone"); n != 1 {
		t.Fatalf("dropped gone: %d", n)
	}
}

// TestAdapterSecretsStayOut: a destination's data and the cards' signed
// values and tokens reach no log line, channel listing or channel event.
func TestAdapterSecretsStayOut(t *testing.T) {
	var logs syncbuf.Buffer
	p := newPlatform()
	var failed atomic.Bool
	p.fail = func(op, _ string) error {
		if op == "send" && !failed.Swap(true) {
			return errors.New("try again")
		}
		return nil
	}
	s := startWith(t, p, fastRetry, node.Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	const secret = "SECRET-SUBSCRIPTION-KEYS"
	if _, _, err := s.Node.Channels.SetDest(context.Background(), "alice", "fake", "sub1", []byte(secret)); err != nil {
		t.Fatal(err)
	}
	rec := channeltest.Ask(t, s.Node, "alice", "deploy.app", nil)
	c := p.waitCard(t, "sub1", rec.ActionID)
	if _, _, err := answer(t, s, channel.Answer{Adapter: "fake", Dest: "sub1", User: "U1", Principal: "alice", Value: c.card.Values[bridge.DecisionDeny]}); err != nil {
		t.Fatal(err)
	}
	p.waitEdit(t, "sub1", rec.ActionID, bridge.StateDenied)
	p.mu.Lock()
	if string(p.data[0]) != secret {
		t.Fatalf("the adapter got %q", p.data[0])
	}
	p.mu.Unlock()
	_, list, _ := nodetest.Do(t, nil, "GET", s.URL+"/v0/channels?owner=alice", nil)
	raw, _, err := s.Node.Channels.Events("alice", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	evs := fmt.Sprintf("%s", raw)
	_, action, _ := nodetest.Do(t, nil, "GET", s.URL+"/v0/actions/"+rec.ActionID, nil)
	for what, text := range map[string]string{"logs": logs.String(), "channel list": string(list), "channel events": string(evs), "action": string(action)} {
		for _, s := range []string{secret, c.card.Token, c.card.Values[bridge.DecisionDeny], c.card.Values[bridge.DecisionAllowOnce]} {
			if strings.Contains(text, s) {
				t.Fatalf("%s show %q:\n%s", what, s, text)
			}
		}
	}
	if !strings.Contains(string(list), `"channel_id":"fake","native_peer_id":"sub1@alice","kind":"adapter"`) {
		t.Fatalf("channel list: %s", list)
	}
}

// TestAdapterHooksTakeFormBodies: an adapter's endpoint is served without
// a token and gets the platform's form body and headers; bodies of other
// types are refused before it.
func TestAdapterHooksTakeFormBodies(t *testing.T) {
	p := newPlatform()
	s := startWith(t, p, fastRetry, node.Options{})
	status, body, _ := nodetest.Do(t, nil, "POST", s.URL+"/v0/channels/fake/hook", "payload=%7B%7D",
		"Content-Type", "application/x-www-form-urlencoded", "X-Test", "hi")
	if status != 202 || string(body) != "hi|payload=%7B%7D" {
		t.Fatalf("hook: %d %q", status, body)
	}
	if status, _, _ := nodetest.Do(t, nil, "POST", s.URL+"/v0/channels/fake/hook", "x", "Content-Type", "text/plain"); status != 415 {
		t.Fatalf("a text/plain body: %d, want 415", status)
	}
}

// TestNativeChannelsCannotTakeAdapterNames: a native channel may not
// register under an adapter's channel id, configured or not, whose
// outbox its connection would take over.
func TestNativeChannelsCannotTakeAdapterNames(t *testing.T) {
	p := newPlatform()
	s := startWith(t, p, fastRetry, node.Options{})
	for _, id := range []string{"fake", channel.AdapterSlack, channel.AdapterTelegram, channel.AdapterWebPush, channel.WebhookChannel} {
		if _, _, err := s.Node.Channels.Connect(context.Background(), "alice", id, "p1"); !errors.Is(err, channel.ErrInvalid) {
			t.Fatalf("connect as %s: %v", id, err)
		}
	}
}
