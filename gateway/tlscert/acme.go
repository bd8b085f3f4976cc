package tlscert

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/mail"
	"net/url"
	"os"
	"slices"
	"strings"

	"golang.org/x/crypto/acme"
	"golang.org/x/crypto/acme/autocert"
)

// ErrACMEConfig reports ACME options that cannot work: no domain, a name no
// certificate authority issues for (an IP address, a wildcard, a single
// label), a malformed email or directory URL, or a cache folder that cannot
// be made.
var ErrACMEConfig = errors.New("tlscert: invalid ACME configuration")

// ACMEOptions configure certificates obtained over ACME.
type ACMEOptions struct {
	// Domains are the names to obtain certificates for; handshakes naming
	// any other (or none) are refused. At least one is required.
	Domains []string
	// Email is the contact address registered with the certificate
	// authority, for expiry and incident notices; empty registers none.
	Email string
	// CacheDir keeps the account key and the certificates across restarts
	// (certificate authorities limit how often a name may be issued). It is
	// created, or tightened, with mode 0700: it holds private keys.
	// Required.
	CacheDir string
	// DirectoryURL is the certificate authority's ACME directory; empty
	// means Let's Encrypt's production directory.
	DirectoryURL string
}

// ACME obtains and renews certificates from an ACME certificate authority
// (Let's Encrypt by default) for a fixed set of names, with
// golang.org/x/crypto/acme/autocert. The first handshake for a name
// without a cached certificate waits while one is obtained. The authority
// proves control of a name with a TLS-ALPN-01 challenge, answered by the
// TLS listener itself (it must be reachable on port 443), or, once
// HTTPHandler has been called, also with HTTP-01 on port 80.
type ACME struct {
	m *autocert.Manager
}

// NewACME checks o, creates the cache folder and returns an ACME that has
// contacted nobody yet.
func NewACME(o ACMEOptions) (*ACME, error) {
	domains, err := acmeDomains(o.Domains)
	if err != nil {
		return nil, err
	}
	if o.Email != "" {
		if a, err := mail.ParseAddress(o.Email); err != nil || a.Address != o.Email {
			return nil, fmt.Errorf("%w: email %q is not a plain address like ops@example.com", ErrACMEConfig, o.Email)
		}
	}
	if o.CacheDir == "" {
		return nil, fmt.Errorf("%w: a cache folder is required", ErrACMEConfig)
	}
	if err := os.MkdirAll(o.CacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: cache folder: %w", ErrACMEConfig, err)
	}
	// MkdirAll leaves an existing folder as it was, and the umask may have
	// narrowed nothing: the account key must be ours alone.
	if err := os.Chmod(o.CacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: cache folder: %w", ErrACMEConfig, err)
	}
	m := &autocert.Manager{
		Prompt:     autocert.AcceptTOS,
		Cache:      autocert.DirCache(o.CacheDir),
		HostPolicy: autocert.HostWhitelist(domains...),
		Email:      o.Email,
	}
	if o.DirectoryURL != "" {
		u, err := url.Parse(o.DirectoryURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return nil, fmt.Errorf("%w: directory URL %q: want https://host/path", ErrACMEConfig, o.DirectoryURL)
		}
		m.Client = &acme.Client{DirectoryURL: o.DirectoryURL, UserAgent: "gatehouse"}
	}
	return &ACME{m: m}, nil
}

// TLSConfig returns a server configuration that serves the ACME
// certificates and answers TLS-ALPN-01 challenges.
func (a *ACME) TLSConfig() *tls.Config { return serverConfig(a.m.GetCertificate, acme.ALPNProto) }

// HTTPHandler answers HTTP-01 challenges under /.well-known/acme-challenge/
// and redirects every other GET or HEAD to https on port 443. Serve it on
// port 80; calling it also enables HTTP-01 challenges.
func (a *ACME) HTTPHandler() http.Handler { return a.m.HTTPHandler(nil) }

// acmeDomains checks and normalizes the names certificates are asked for.
func acmeDomains(in []string) ([]string, error) {
	var out []string
	for _, d := range in {
		d = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(d)), ".")
		if d == "" {
			continue
		}
		if err := checkDomain(d); err != nil {
			return nil, fmt.Errorf("%w: domain %q: %w", ErrACMEConfig, d, err)
		}
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: at least one domain is required", ErrACMEConfig)
	}
	return out, nil
}

// checkDomain accepts a DNS name of two labels or more, in ASCII (an
// internationalized name in its xn-- form).
func checkDomain(d string) error {
	switch {
	case net.ParseIP(d) != nil:
		return errors.New("an IP address: ACME certificates name hosts")
	case strings.Contains(d, "*"):
		return errors.New("a wildcard needs a DNS-01 challenge, which is not supported")
	case len(d) > 253:
		return errors.New("longer than 253 characters")
	case !strings.Contains(d, "."):
		return errors.New("a single label: give the public name, e.g. gatehouse.example.com")
	}
	for label := range strings.SplitSeq(d, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("label %q: 1 to 63 letters, digits or inner hyphens", label)
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return fmt.Errorf("character %q: letters, digits, hyphens and dots only (punycode for international names)", r)
			}
		}
	}
	return nil
}
