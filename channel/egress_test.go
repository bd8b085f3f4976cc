package channel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
)

func TestDeniedAddresses(t *testing.T) {
	for _, c := range []struct {
		addr string
		kind string // "" when webhooks may reach it
	}{
		{"127.0.0.1", "loopback"},
		{"127.1.2.3", "loopback"},
		{"::1", "loopback"},
		{"::ffff:127.0.0.1", "loopback"},
		{"0.0.0.0", "unspecified"},
		{"::", "unspecified"},
		{"0.1.2.3", "this-network"},
		{"10.0.0.1", "private"},
		{"172.16.5.4", "private"},
		{"172.31.255.255", "private"},
		{"192.168.1.1", "private"},
		{"::ffff:10.0.0.1", "private"},
		{"169.254.169.254", "link-local"},
		{"169.254.0.1", "link-local"},
		{"fe80::1", "link-local"},
		{"100.64.0.1", "shared (carrier-grade NAT)"},
		{"100.127.255.254", "shared (carrier-grade NAT)"},
		{"fc00::1", "unique-local"},
		{"fd12:3456::1", "unique-local"},
		{"fec0::1", "site-local"},
		{"224.0.0.1", "multicast"},
		{"239.255.255.250", "multicast"},
		{"ff02::1", "multicast"},
		{"255.255.255.255", "reserved or broadcast"},
		{"240.0.0.1", "reserved or broadcast"},
		{"192.0.0.170", "IETF protocol assignment"},
		{"198.18.0.1", "benchmarking"},
		{"::127.0.0.1", "IPv4-compatible"},
		{"64:ff9b::a9fe:a9fe", "link-local (embedded in IPv6)"},
		{"64:ff9b::7f00:1", "loopback (embedded in IPv6)"},
		{"2002:a00:1::1", "private (embedded in IPv6)"},
		{"2002:7f00:1::", "loopback (embedded in IPv6)"},
		{"93.184.216.34", ""},
		{"8.8.8.8", ""},
		{"100.128.0.1", ""},
		{"172.32.0.1", ""},
		{"2606:4700::1111", ""},
		{"64:ff9b::808:808", ""},
		{"2002:808:808::1", ""},
	} {
		if got := deniedKind(netip.MustParseAddr(c.addr)); got != c.kind {
			t.Errorf("deniedKind(%s) = %q, want %q", c.addr, got, c.kind)
		}
	}
}

func TestEgressAllowList(t *testing.T) {
	g := egress{allow: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("::1/128")}}
	for addr, ok := range map[string]bool{
		"10.1.2.3": true, "::ffff:10.1.2.3": true, "10.2.0.1": false, "::1": true, "127.0.0.1": false,
		"169.254.169.254": false, "8.8.8.8": true,
	} {
		err := g.check(netip.MustParseAddr(addr))
		if (err == nil) != ok || (err != nil && !errors.Is(err, ErrDeniedAddress)) {
			t.Errorf("check(%s) = %v, want allowed %v", addr, err, ok)
		}
	}
}

// TestSetWebhookRefusesInternalAddresses: a URL naming a denied address
// (or localhost) is refused when set, unless the allow-list lists it.
func TestSetWebhookRefusesInternalAddresses(t *testing.T) {
	n := open(t, t.TempDir(), Options{})
	ctx := context.Background()
	for _, u := range []string{
		"http://127.0.0.1:8080/hook",
		"http://[::1]/hook",
		"http://169.254.169.254/latest/meta-data/",
		"http://10.0.0.5/hook",
		"https://192.168.0.1/hook",
		"http://[::ffff:127.0.0.1]/hook",
		"http://[fd00::1]/hook",
		"http://0.0.0.0:9000/hook",
		"http://100.64.1.1/hook",
		"http://localhost:9000/hook",
		"http://LOCALHOST./hook",
		"http://api.localhost/hook",
	} {
		_, _, err := n.reg.SetWebhook(ctx, "alice", u, testSecret)
		if !errors.Is(err, ErrInvalid) || !errors.Is(err, ErrDeniedAddress) {
			t.Errorf("SetWebhook(%s) = %v, want ErrInvalid and ErrDeniedAddress", u, err)
		}
	}
	if got := n.reg.List("alice"); len(got) != 0 {
		t.Fatalf("channels registered: %+v", got)
	}
	allowed := open(t, t.TempDir(), Options{WebhookAllow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	if _, _, err := allowed.reg.SetWebhook(ctx, "alice", "http://10.0.0.5/hook", testSecret); err != nil {
		t.Fatalf("an allowed private address: %v", err)
	}
}

// TestWebhookDialIsGuarded: the default client checks the address it
// connects to after name resolution, so a name that resolves to loopback
// is refused as a literal loopback address is.
func TestWebhookDialIsGuarded(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	c := egress{}.client()
	for _, u := range []string{srv.URL, "http://localhost:" + port} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
		resp, err := c.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
		}
		if !errors.Is(err, ErrDeniedAddress) {
			t.Errorf("POST %s: %v, want ErrDeniedAddress", u, err)
		}
	}
	if hits.Load() != 0 {
		t.Fatalf("the loopback server was reached %d times", hits.Load())
	}
	allowed := egress{allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}.client()
	resp, err := allowed.Post(srv.URL, "application/json", nil)
	if err != nil {
		t.Fatalf("allowed loopback: %v", err)
	}
	resp.Body.Close()
	if hits.Load() != 1 {
		t.Fatalf("%d hits on the allowed server", hits.Load())
	}
}

// TestWebhookRedirectsAreNotFollowed: a bot that redirects, here to an
// address the allow-list does not cover, gets its delivery retried, and
// the redirect's target is never contacted.
func TestWebhookRedirectsAreNotFollowed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no second loopback address: %v", err)
	}
	var inside atomic.Int32
	internal := &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) { inside.Add(1) })}}
	internal.Start()
	defer internal.Close()
	var attempts atomic.Int32
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts.Add(1)
		http.Redirect(w, r, internal.URL+"/hook", http.StatusTemporaryRedirect)
	}))
	defer redirector.Close()
	o := fastRetry
	o.WebhookAllow = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	n := open(t, t.TempDir(), o)
	ch, _, err := n.reg.SetWebhook(context.Background(), "alice", redirector.URL+"/hook", testSecret)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.hub.Deliver(context.Background(), Key(ch.ChannelID, ch.PeerID), "permission.requested", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	eventually.Check(t, func() error {
		if n := attempts.Load(); n < 3 {
			return fmt.Errorf("%d attempts, want 3", n)
		}
		return nil
	})
	if inside.Load() != 0 || n.hub.Pending(Key(ch.ChannelID, ch.PeerID)) != 1 {
		t.Fatalf("redirect target reached %d times, %d pending: a redirect counted as delivered or was followed",
			inside.Load(), n.hub.Pending(Key(ch.ChannelID, ch.PeerID)))
	}
}
