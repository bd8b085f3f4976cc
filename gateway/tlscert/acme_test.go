package tlscert_test

import (
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gatehouse-dev/gatehouse/gateway/tlscert"
	"github.com/gatehouse-dev/gatehouse/gateway/tlscert/tlscerttest"
)

// unreachableDirectory is an ACME directory nothing answers at, so a test
// that wrongly contacted the certificate authority would fail at once
// rather than reach a real one.
const unreachableDirectory = "http://127.0.0.1:1/directory"

func TestNewACMERefuses(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ok := tlscert.ACMEOptions{Domains: []string{"gatehouse.example.com"}, CacheDir: t.TempDir()}
	for _, tc := range []struct {
		name string
		edit func(*tlscert.ACMEOptions)
	}{
		{"no domain", func(o *tlscert.ACMEOptions) { o.Domains = nil }},
		{"blank domains", func(o *tlscert.ACMEOptions) { o.Domains = []string{" ", ""} }},
		{"IP address", func(o *tlscert.ACMEOptions) { o.Domains = []string{"192.0.2.1"} }},
		{"wildcard", func(o *tlscert.ACMEOptions) { o.Domains = []string{"*.example.com"} }},
		{"single label", func(o *tlscert.ACMEOptions) { o.Domains = []string{"localhost"} }},
		{"with a port", func(o *tlscert.ACMEOptions) { o.Domains = []string{"example.com:443"} }},
		{"empty label", func(o *tlscert.ACMEOptions) { o.Domains = []string{"a..example.com"} }},
		{"leading hyphen", func(o *tlscert.ACMEOptions) { o.Domains = []string{"-a.example.com"} }},
		{"not punycode", func(o *tlscert.ACMEOptions) { o.Domains = []string{"bücher.example"} }},
		{"bad email", func(o *tlscert.ACMEOptions) { o.Email = "ops at example.com" }},
		{"email with a name", func(o *tlscert.ACMEOptions) { o.Email = "Ops <ops@example.com>" }},
		{"no cache folder", func(o *tlscert.ACMEOptions) { o.CacheDir = "" }},
		{"cache folder is a file", func(o *tlscert.ACMEOptions) { o.CacheDir = file }},
		{"directory not a URL", func(o *tlscert.ACMEOptions) { o.DirectoryURL = "acme.example.com/dir" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.edit(&o)
			if a, err := tlscert.NewACME(o); !errors.Is(err, tlscert.ErrACMEConfig) || a != nil {
				t.Fatalf("NewACME: %v, %v; want ErrACMEConfig", a, err)
			}
		})
	}
	if _, err := tlscert.NewACME(ok); err != nil {
		t.Fatalf("valid options: %v", err)
	}
}

// TestACMECacheFolderIsPrivate: the folder that will hold the account key
// is made with mode 0700, and an existing one is tightened.
func TestACMECacheFolderIsPrivate(t *testing.T) {
	fresh := filepath.Join(t.TempDir(), "data", "acme")
	loose := filepath.Join(t.TempDir(), "acme")
	if err := os.Mkdir(loose, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{fresh, loose} {
		if _, err := tlscert.NewACME(tlscert.ACMEOptions{Domains: []string{"gatehouse.example.com"}, CacheDir: dir}); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(dir)
		if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v, %v; want a folder with mode 0700", dir, fi.Mode(), err)
		}
	}
}

// TestACMEServesCachedCertificate: a certificate in the cache is served to
// handshakes naming its domain without contacting the authority; other
// names are refused; the configuration offers HTTP/1.1 and the TLS-ALPN-01
// protocol, never HTTP/2.
func TestACMEServesCachedCertificate(t *testing.T) {
	ca := tlscerttest.NewCA(t)
	dir := t.TempDir()
	certPEM, keyPEM := ca.Issue(t, 42, "gatehouse.test")
	// autocert's cache entry: the key, then the chain, under the domain.
	if err := os.WriteFile(filepath.Join(dir, "gatehouse.test"), append(keyPEM, certPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := tlscert.NewACME(tlscert.ACMEOptions{Domains: []string{"Gatehouse.TEST."}, Email: "ops@example.com",
		CacheDir: dir, DirectoryURL: unreachableDirectory})
	if err != nil {
		t.Fatal(err)
	}
	cfg := a.TLSConfig()
	if !slices.Equal(cfg.NextProtos, []string{"http/1.1", "acme-tls/1"}) || cfg.MinVersion != tls.VersionTLS12 {
		t.Fatalf("NextProtos %v, MinVersion %x", cfg.NextProtos, cfg.MinVersion)
	}
	addr := handshakes(t, cfg)
	dial := func(name string) (*tls.Conn, error) {
		c := ca.ClientConfig()
		c.ServerName = name
		return tls.Dial("tcp", addr, c)
	}
	c, err := dial("gatehouse.test")
	if err != nil {
		t.Fatalf("handshake for the cached domain: %v", err)
	}
	if got := c.ConnectionState().PeerCertificates[0].SerialNumber.Int64(); got != 42 {
		t.Fatalf("serial %d, want the cached 42", got)
	}
	c.Close()
	if c, err := dial("other.test"); err == nil {
		c.Close()
		t.Fatal("handshake for a name not configured succeeded")
	}

	// HTTP-01: a challenge not in progress is not found; anything else is
	// sent to https.
	h := a.HTTPHandler()
	for _, tc := range []struct {
		path   string
		status int
		loc    string
	}{
		{"/.well-known/acme-challenge/token", http.StatusNotFound, ""},
		{"/v0/health", http.StatusFound, "https://gatehouse.test/v0/health"},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "http://gatehouse.test"+tc.path, nil)
		h.ServeHTTP(rec, req)
		if rec.Code != tc.status || rec.Header().Get("Location") != tc.loc {
			t.Errorf("GET %s: %d %q, want %d %q", tc.path, rec.Code, rec.Header().Get("Location"), tc.status, tc.loc)
		}
	}
}
