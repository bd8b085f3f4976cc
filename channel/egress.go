package channel

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrDeniedAddress means a webhook would reach an address webhooks may not
// reach: loopback, unspecified, private (RFC 1918), shared (100.64.0.0/10,
// carrier-grade NAT), link-local (169.254.0.0/16, where cloud metadata
// services answer, and fe80::/10), unique-local (fc00::/7), site-local,
// multicast, broadcast or reserved, also when written as an IPv4-mapped,
// NAT64 or 6to4 IPv6 address. Options.WebhookAllow lets chosen networks
// through. Webhook URLs are checked when they are set (a literal address
// or localhost) and every connection is checked again at dial time, after
// name resolution, so a name that resolves, or later rebinds, to a denied
// address is refused too.
var ErrDeniedAddress = errors.New("channel: webhook address not allowed")

// deniedRange is a range of addresses webhooks may not reach by default
// that the netip.Addr predicates do not name.
type deniedRange struct {
	prefix netip.Prefix
	what   string
}

// deniedRanges is a fixed table, read only.
var deniedRanges = []deniedRange{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared (carrier-grade NAT)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignment"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved or broadcast"},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible"},
	{netip.MustParsePrefix("fec0::/10"), "site-local"},
}

// Prefixes of IPv6 ranges that carry an IPv4 address, checked as that
// address.
var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	nat64Loc  = netip.MustParsePrefix("64:ff9b:1::/48")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// deniedKind says why a is denied by default, or "" when webhooks may
// reach it.
func deniedKind(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case !a.IsValid():
		return "invalid"
	case a.IsUnspecified():
		return "unspecified"
	case a.IsLoopback():
		return "loopback"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case a.IsMulticast():
		return "multicast"
	case a.IsPrivate() && a.Is4():
		return "private"
	case a.IsPrivate():
		return "unique-local"
	}
	for _, r := range deniedRanges {
		if r.prefix.Contains(a) {
			return r.what
		}
	}
	if a.Is6() {
		b := a.As16()
		var v4 [4]byte
		switch {
		case nat64.Contains(a), nat64Loc.Contains(a):
			copy(v4[:], b[12:])
		case sixToFour.Contains(a):
			copy(v4[:], b[2:6])
		default:
			return ""
		}
		if k := deniedKind(netip.AddrFrom4(v4)); k != "" {
			return k + " (embedded in IPv6)"
		}
	}
	return ""
}

// egress decides which addresses webhooks may reach.
type egress struct {
	allow []netip.Prefix
}

// check returns an error matching ErrDeniedAddress when a may not be reached.
func (g egress) check(a netip.Addr) error {
	kind := deniedKind(a)
	if kind == "" {
		return nil
	}
	u := a.Unmap()
	for _, p := range g.allow {
		if p.Contains(u) || p.Contains(a) {
			return nil
		}
	}
	return &deniedError{what: u.String(), kind: kind}
}

// deniedError names the address refused and why; it matches
// ErrDeniedAddress.
type deniedError struct{ what, kind string }

func (e *deniedError) Error() string {
	return e.what + " is " + e.kind + ": webhooks reach only public addresses unless the webhook allow-list (--webhook-allow-net) lists it"
}

// Is makes errors.Is(err, ErrDeniedAddress) hold.
func (e *deniedError) Is(target error) bool { return target == ErrDeniedAddress }

// checkURL refuses a URL whose host is a literal address, or localhost,
// that may not be reached. Other names are checked when dialled.
func (g egress) checkURL(u *url.URL) error {
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		// Resolvers answer these with loopback (RFC 6761).
		if g.check(netip.IPv6Loopback()) == nil || g.check(netip.AddrFrom4([4]byte{127, 0, 0, 1})) == nil {
			return nil
		}
		return &deniedError{what: host, kind: "loopback"}
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return g.check(a)
	}
	return nil
}

// control is a net.Dialer Control function: it runs after name resolution,
// for each address a connection is attempted to.
func (g egress) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &deniedError{what: strconv.Quote(address), kind: "not an IP address and port"}
	}
	return g.check(ap.Addr())
}

// client is the default webhook client: it dials only allowed addresses,
// ignores proxy settings (a proxy would reach the target on the gateway's
// behalf, past the check), and follows no redirects (a redirected POST
// would lose its body, and a redirect could point inside the network).
func (g egress) client() *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second, Control: g.control}
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           d.DialContext,
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          64,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Egress is the webhooks' outbound address policy, for adapters that
// reach addresses people give them (push endpoints): the same refusals
// (ErrDeniedAddress) and the same allow-list.
type Egress struct{ g egress }

// NewEgress returns the policy that lets through the allow networks
// besides public addresses.
func NewEgress(allow []netip.Prefix) Egress {
	return Egress{g: egress{allow: append([]netip.Prefix(nil), allow...)}}
}

// CheckURL refuses a URL whose host is a literal address, or localhost,
// that may not be reached (an error matching ErrDeniedAddress). Other
// names are checked when Client dials them.
func (e Egress) CheckURL(u *url.URL) error { return e.g.checkURL(u) }

// Client returns an HTTP client that dials only addresses the policy
// allows, ignores proxy settings and follows no redirects, as the
// webhooks' client does.
func (e Egress) Client() *http.Client { return e.g.client() }
