// Package tlscert provides the certificates the gateway serves TLS with:
// a key pair read from PEM files and read again when they change
// ([KeyPair]), or certificates obtained and renewed over ACME ([ACME],
// through golang.org/x/crypto/acme/autocert). Each gives a *tls.Config for
// node.Options.TLS.
package tlscert

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// ErrInvalid reports a certificate and key that cannot be served: a file
// that holds no PEM certificate or key, or a key that does not match the
// certificate.
var ErrInvalid = errors.New("tlscert: unusable certificate or key")

// Options configure a KeyPair. The zero value is usable.
type Options struct {
	// Interval is the least time between two checks of the files; zero
	// means 1s. A check, one stat of each file, is made by the handshake
	// that finds the last one older than Interval, so an idle gateway reads
	// nothing.
	Interval time.Duration
	// Logger receives reloads and refused files; nil discards.
	Logger *slog.Logger
}

// KeyPair serves a certificate chain and its private key from two PEM
// files, and reads them again when either changes (its modification time,
// size or inode, so a file replaced by a rename counts), without touching
// connections already open: only handshakes that start after the change get
// the new certificate. Files that changed but do not make a valid pair
// (half written, or a key that belongs to another certificate) are logged
// once and the previous certificate stays in service until they change
// again. A KeyPair is safe for concurrent use.
type KeyPair struct {
	certFile, keyFile string
	interval          time.Duration
	log               *slog.Logger

	cur  atomic.Pointer[tls.Certificate]
	next atomic.Int64 // unix nanoseconds before which no check is made

	mu      sync.Mutex // held by the one check in progress
	loaded  stamp      // the files cur was read from
	refused *stamp     // the files last refused, so they are logged once
}

// LoadKeyPair reads certFile (the certificate chain, leaf first) and keyFile
// (its private key), both PEM. It fails if either cannot be read or they do
// not make a pair (ErrInvalid).
func LoadKeyPair(certFile, keyFile string, o Options) (*KeyPair, error) {
	k := &KeyPair{certFile: certFile, keyFile: keyFile, interval: o.Interval, log: o.Logger}
	if k.interval <= 0 {
		k.interval = time.Second
	}
	if k.log == nil {
		k.log = slog.New(slog.DiscardHandler)
	}
	st, err := k.stat()
	if err != nil {
		return nil, err
	}
	c, err := k.read()
	if err != nil {
		return nil, err
	}
	k.cur.Store(c)
	k.loaded = st
	k.next.Store(time.Now().Add(k.interval).UnixNano())
	k.warnValidity(c.Leaf)
	return k, nil
}

// Leaf returns the certificate being served.
func (k *KeyPair) Leaf() *x509.Certificate { return k.cur.Load().Leaf }

// GetCertificate is the tls.Config.GetCertificate hook: it returns the
// current certificate, first checking the files when the last check is
// older than Options.Interval. A check that finds them changed reads them
// within this handshake; handshakes meanwhile get the previous certificate.
func (k *KeyPair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if now := time.Now().UnixNano(); now >= k.next.Load() && k.mu.TryLock() {
		// Another check may have finished between the load and the lock.
		if now >= k.next.Load() {
			k.check()
			k.next.Store(time.Now().Add(k.interval).UnixNano())
		}
		k.mu.Unlock()
	}
	return k.cur.Load(), nil
}

// TLSConfig returns a server configuration that serves k.
func (k *KeyPair) TLSConfig() *tls.Config { return serverConfig(k.GetCertificate) }

// check reads the files again if they changed since they were loaded or
// last refused. It runs with mu held.
func (k *KeyPair) check() {
	st, err := k.stat()
	if st.same(k.loaded) || k.refused != nil && st.same(*k.refused) {
		return
	}
	var c *tls.Certificate
	if err == nil {
		c, err = k.read()
	}
	if err != nil {
		k.refused = &st
		k.log.Error("TLS certificate files changed but cannot be used; still serving the previous certificate",
			"cert_file", k.certFile, "key_file", k.keyFile, "err", err)
		return
	}
	k.cur.Store(c)
	k.loaded, k.refused = st, nil
	k.log.Info("TLS certificate reloaded", "cert_file", k.certFile, "subject", c.Leaf.Subject.String(),
		"serial", c.Leaf.SerialNumber.Text(16), "not_after", c.Leaf.NotAfter)
	k.warnValidity(c.Leaf)
}

// stamp identifies the versions of the two files: what a check compares.
// An entry is nil when its file could not be stat'ed.
type stamp struct{ cert, key fs.FileInfo }

func (k *KeyPair) stat() (stamp, error) {
	var st stamp
	var cerr, kerr error
	st.cert, cerr = os.Stat(k.certFile)
	st.key, kerr = os.Stat(k.keyFile)
	if err := errors.Join(cerr, kerr); err != nil {
		return st, fmt.Errorf("tlscert: %w", err)
	}
	return st, nil
}

func (s stamp) same(o stamp) bool { return sameFile(s.cert, o.cert) && sameFile(s.key, o.key) }

func sameFile(a, b fs.FileInfo) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return os.SameFile(a, b) && a.ModTime().Equal(b.ModTime()) && a.Size() == b.Size()
}

func (k *KeyPair) read() (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(k.certFile)
	if err != nil {
		return nil, fmt.Errorf("tlscert: %w", err)
	}
	keyPEM, err := os.ReadFile(k.keyFile)
	if err != nil {
		return nil, fmt.Errorf("tlscert: %w", err)
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: %s and %s: %w", ErrInvalid, k.certFile, k.keyFile, err)
	}
	return &c, nil
}

// warnValidity logs a certificate that clients will refuse for its dates:
// it is served all the same, as the operator put it there.
func (k *KeyPair) warnValidity(leaf *x509.Certificate) {
	now := time.Now()
	switch {
	case now.After(leaf.NotAfter):
		k.log.Warn("TLS certificate has expired; clients will refuse it", "cert_file", k.certFile, "not_after", leaf.NotAfter)
	case now.Before(leaf.NotBefore):
		k.log.Warn("TLS certificate is not valid yet; clients will refuse it", "cert_file", k.certFile, "not_before", leaf.NotBefore)
	}
}

// serverConfig is the TLS configuration the gateway serves with: TLS 1.2 or
// later, HTTP/1.1 (the gateway's server speaks no HTTP/2, so a client that
// offers h2 must not get it) plus any extra ALPN protocols, certificates
// from get.
func serverConfig(get func(*tls.ClientHelloInfo) (*tls.Certificate, error), protos ...string) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     append([]string{"http/1.1"}, protos...),
		GetCertificate: get,
	}
}
