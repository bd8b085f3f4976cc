package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/gateway/tlscert"
)

// tlsFlags are serve's TLS flags.
type tlsFlags struct {
	cert, key                  string
	acmeDomains, acmeEmail     string
	acmeHTTP, acmeDirectoryURL string
}

func (t *tlsFlags) flags(fs *flag.FlagSet) {
	fs.StringVar(&t.cert, "tls-cert", "", "serve HTTPS with this certificate chain `file` (PEM, leaf first; re-read when it changes); needs --tls-key")
	fs.StringVar(&t.key, "tls-key", "", "private key `file` (PEM) of --tls-cert")
	fs.StringVar(&t.acmeDomains, "acme-domain", "", "serve HTTPS with certificates obtained automatically over ACME (Let's Encrypt) for these comma-separated public `names`; cache in <data>/acme")
	fs.StringVar(&t.acmeEmail, "acme-email", "", "contact `address` registered with the ACME certificate authority (expiry notices)")
	fs.StringVar(&t.acmeHTTP, "acme-http", "", "also answer ACME HTTP-01 challenges on this `host:port` (e.g. :80), redirecting other requests to https; without it only TLS-ALPN-01 on the TLS port (443)")
	fs.StringVar(&t.acmeDirectoryURL, "acme-directory", "", "ACME directory `URL` of the certificate authority (default: Let's Encrypt production)")
}

// check refuses flag combinations that cannot mean anything.
func (t *tlsFlags) check() error {
	files := t.cert != "" || t.key != ""
	acme := t.acmeDomains != ""
	switch {
	case t.cert != "" && t.key == "":
		return errors.New("serve: --tls-cert needs --tls-key (the private key of the certificate)")
	case t.key != "" && t.cert == "":
		return errors.New("serve: --tls-key needs --tls-cert (the certificate chain of the key)")
	case files && acme:
		return errors.New("serve: --tls-cert/--tls-key and --acme-domain exclude each other: serve your own certificate or one obtained over ACME")
	case !acme && (t.acmeEmail != "" || t.acmeHTTP != "" || t.acmeDirectoryURL != ""):
		return errors.New("serve: --acme-email, --acme-http and --acme-directory need --acme-domain")
	}
	return nil
}

// serverTLS is what serve's TLS flags built.
type serverTLS struct {
	config *tls.Config   // nil: plain HTTP
	mode   string        // "off", "files" or "acme"
	acme   *tlscert.ACME // with --acme-domain
	http01 *http.Server  // with --acme-http, once serving
	done   chan struct{} // closed when http01 has stopped serving
	attrs  []slog.Attr   // for the start-up line
	log    *slog.Logger
}

// build loads the certificate files or prepares ACME, its cache in
// <data>/acme (also with --in-memory: certificates must outlive the
// process, authorities limit how often they issue). It contacts nobody.
func (t *tlsFlags) build(data, addr string, log *slog.Logger) (*serverTLS, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	s := &serverTLS{mode: "off", log: log}
	switch {
	case t.cert != "":
		kp, err := tlscert.LoadKeyPair(t.cert, t.key, tlscert.Options{Logger: log})
		if err != nil {
			return nil, fmt.Errorf("serve: --tls-cert/--tls-key: %w", err)
		}
		leaf := kp.Leaf()
		s.config, s.mode = kp.TLSConfig(), "files"
		s.attrs = []slog.Attr{slog.String("tls_subject", leaf.Subject.String()), slog.Time("tls_not_after", leaf.NotAfter)}
	case t.acmeDomains != "":
		cache := filepath.Join(data, "acme")
		a, err := tlscert.NewACME(tlscert.ACMEOptions{Domains: strings.Split(t.acmeDomains, ","), Email: t.acmeEmail,
			CacheDir: cache, DirectoryURL: t.acmeDirectoryURL})
		if err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
		s.config, s.mode, s.acme = a.TLSConfig(), "acme", a
		challenges := "tls-alpn-01"
		if t.acmeHTTP != "" {
			challenges += ",http-01"
		}
		s.attrs = []slog.Attr{slog.String("acme_domains", t.acmeDomains), slog.String("acme_cache", cache), slog.String("acme_challenges", challenges)}
		if _, port, err := net.SplitHostPort(addr); t.acmeHTTP == "" && err == nil && port != "443" {
			log.Warn("ACME TLS-ALPN-01 challenges arrive on port 443: forward it to --addr, or answer HTTP-01 with --acme-http :80", "addr", addr)
		}
	}
	return s, nil
}

// serveHTTP01 starts answering HTTP-01 challenges on addr, when asked.
func (s *serverTLS) serveHTTP01(addr string) error {
	if s.acme == nil || addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("serve: --acme-http: %w", err)
	}
	s.http01 = &http.Server{
		Handler:           s.acme.HTTPHandler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    8 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		if err := s.http01.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("ACME HTTP-01 listener stopped", "addr", addr, "err", err)
		}
	}()
	s.attrs = append(s.attrs, slog.String("acme_http", ln.Addr().String()))
	return nil
}

// close stops the HTTP-01 listener, if any.
func (s *serverTLS) close(ctx context.Context) {
	if s.http01 == nil {
		return
	}
	if err := s.http01.Shutdown(ctx); err != nil {
		_ = s.http01.Close()
	}
	<-s.done
}

// caFileFlag adds --ca-file to a client subcommand.
func caFileFlag(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "ca-file", "", "PEM `file` of CA certificates to trust for an https:// gateway, besides the system's")
}

// clientTLS returns the TLS configuration of a client subcommand: the
// system's roots plus the certificates of caFile, or nil (the defaults)
// without one.
func clientTLS(caFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, nil
	}
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca-file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("--ca-file %s: no PEM certificate in it", caFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// explainTLS says what to do when err is the gateway's certificate being
// refused.
func explainTLS(err error) error {
	if untrustedCert(err) {
		return fmt.Errorf("%w (the gateway's TLS certificate is not trusted: give the CA that signed it with --ca-file)", err)
	}
	return err
}

// untrustedCert reports whether err is the refusal of the gateway's
// certificate.
func untrustedCert(err error) bool {
	var cerr *tls.CertificateVerificationError
	return errors.As(err, &cerr)
}
