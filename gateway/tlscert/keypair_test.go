package tlscert_test

import (
	"crypto/tls"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/gateway/tlscert"
	"github.com/gatehouse-dev/gatehouse/gateway/tlscert/tlscerttest"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
)

// handshakes serves TLS handshakes with cfg on 127.0.0.1 until the test
// ends, and returns the address: what a test of the certificate a
// configuration serves dials.
func handshakes(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// serial returns the serial number of the certificate a handshake gets now.
func serial(t *testing.T, k *tlscert.KeyPair) int64 {
	t.Helper()
	c, err := k.GetCertificate(&tls.ClientHelloInfo{ServerName: "127.0.0.1"})
	if err != nil || c == nil || c.Leaf == nil {
		t.Fatalf("GetCertificate: %v, %v", c, err)
	}
	return c.Leaf.SerialNumber.Int64()
}

func TestLoadKeyPairRefuses(t *testing.T) {
	ca := tlscerttest.NewCA(t)
	certPEM, keyPEM := ca.Issue(t, 1, "127.0.0.1")
	_, otherKey := ca.Issue(t, 2, "127.0.0.1")
	for _, tc := range []struct {
		name      string
		cert, key []byte // nil: the file is missing
		want      error
	}{
		{"missing certificate", nil, keyPEM, fs.ErrNotExist},
		{"missing key", certPEM, nil, fs.ErrNotExist},
		{"key of another certificate", certPEM, otherKey, tlscert.ErrInvalid},
		{"files swapped", keyPEM, certPEM, tlscert.ErrInvalid},
		{"not PEM", []byte("hello"), keyPEM, tlscert.ErrInvalid},
		{"empty key", certPEM, []byte{}, tlscert.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			certFile, keyFile := tlscerttest.Files(t)
			if tc.cert != nil {
				tlscerttest.Replace(t, certFile, tc.cert)
			}
			if tc.key != nil {
				tlscerttest.Replace(t, keyFile, tc.key)
			}
			k, err := tlscert.LoadKeyPair(certFile, keyFile, tlscert.Options{})
			if !errors.Is(err, tc.want) || k != nil {
				t.Fatalf("LoadKeyPair: %v, %v; want %v", k, err, tc.want)
			}
		})
	}
}

// TestKeyPairReloadsChangedFiles: new files are served to handshakes that
// follow; a pair that does not fit, or a missing file, is logged once and
// the previous certificate stays.
func TestKeyPairReloadsChangedFiles(t *testing.T) {
	ca := tlscerttest.NewCA(t)
	var logs syncbuf.Buffer
	k, certFile, keyFile := ca.KeyPair(t, 1, tlscert.Options{Interval: time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, "127.0.0.1")
	if got := serial(t, k); got != 1 || k.Leaf().SerialNumber.Int64() != 1 {
		t.Fatalf("serial %d, want 1", got)
	}

	ca.WritePair(t, certFile, keyFile, 2, "127.0.0.1")
	eventually.True(t, "new certificate served", func() bool { return serial(t, k) == 2 })
	if n := strings.Count(logs.String(), "TLS certificate reloaded"); n != 1 {
		t.Fatalf("%d reload lines, want 1", n)
	}

	// A certificate whose key is not the one in the key file.
	certPEM, _ := ca.Issue(t, 3, "127.0.0.1")
	tlscerttest.Replace(t, certFile, certPEM)
	const refused = "TLS certificate files changed but cannot be used"
	eventually.True(t, "bad pair logged", func() bool { serial(t, k); return strings.Count(logs.String(), refused) > 0 })
	// Many handshakes later, each past the interval, the old certificate is
	// still served and the bad pair was logged once.
	for range 50 {
		time.Sleep(2 * time.Millisecond)
		if got := serial(t, k); got != 2 {
			t.Fatalf("serial %d after a bad pair, want 2 (the previous)", got)
		}
	}
	if n := strings.Count(logs.String(), refused); n != 1 {
		t.Fatalf("bad pair logged %d times, want once:\n%s", n, logs.String())
	}

	// The key file disappears in the middle of a rotation: a new state,
	// logged once more; the old certificate stays.
	if err := os.Remove(keyFile); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "missing key logged", func() bool { serial(t, k); return strings.Count(logs.String(), refused) == 2 })
	if got := serial(t, k); got != 2 {
		t.Fatalf("serial %d with the key missing, want 2", got)
	}

	// A good pair again.
	ca.WritePair(t, certFile, keyFile, 4, "127.0.0.1")
	eventually.True(t, "good pair served", func() bool { return serial(t, k) == 4 })
	if n := strings.Count(logs.String(), refused); n != 2 {
		t.Fatalf("refusals logged %d times, want 2", n)
	}
}

// TestKeyPairChecksAtMostOncePerInterval: within the interval no handshake
// looks at the files, so a change waits for the next check.
func TestKeyPairChecksAtMostOncePerInterval(t *testing.T) {
	ca := tlscerttest.NewCA(t)
	k, certFile, keyFile := ca.KeyPair(t, 1, tlscert.Options{Interval: time.Hour}, "127.0.0.1")
	ca.WritePair(t, certFile, keyFile, 2, "127.0.0.1")
	for range 100 {
		if got := serial(t, k); got != 1 {
			t.Fatalf("serial %d within the interval, want 1", got)
		}
	}
}

// TestKeyPairTLSConfigOffersHTTP1Only: a client that offers HTTP/2 first
// gets HTTP/1.1, the only protocol the gateway's server speaks.
func TestKeyPairTLSConfigOffersHTTP1Only(t *testing.T) {
	ca := tlscerttest.NewCA(t)
	k, _, _ := ca.KeyPair(t, 7, tlscert.Options{}, "127.0.0.1")
	addr := handshakes(t, k.TLSConfig())
	cfg := ca.ClientConfig()
	cfg.NextProtos = []string{"h2", "http/1.1"}
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st := c.ConnectionState()
	if st.NegotiatedProtocol != "http/1.1" || st.PeerCertificates[0].SerialNumber.Int64() != 7 || st.Version < tls.VersionTLS12 {
		t.Fatalf("negotiated %q, serial %v, version %x", st.NegotiatedProtocol, st.PeerCertificates[0].SerialNumber, st.Version)
	}
}

// BenchmarkGetCertificate is the cost the reload check adds to a
// handshake. With the default interval nearly every call only loads the
// current certificate; with "stat-each" every call checks the files (two
// stats), the most a check costs when nothing changed.
func BenchmarkGetCertificate(b *testing.B) {
	ca := tlscerttest.NewCA(b)
	certFile, keyFile := tlscerttest.Files(b)
	ca.WritePair(b, certFile, keyFile, 1, "127.0.0.1")
	hello := &tls.ClientHelloInfo{ServerName: "127.0.0.1"}
	load := func(b *testing.B, interval time.Duration) *tlscert.KeyPair {
		k, err := tlscert.LoadKeyPair(certFile, keyFile, tlscert.Options{Interval: interval})
		if err != nil {
			b.Fatal(err)
		}
		return k
	}
	b.Run("default", func(b *testing.B) {
		k := load(b, 0)
		for b.Loop() {
			if _, err := k.GetCertificate(hello); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("stat-each", func(b *testing.B) {
		k := load(b, time.Nanosecond)
		for b.Loop() {
			if _, err := k.GetCertificate(hello); err != nil {
				b.Fatal(err)
			}
		}
	})
}
