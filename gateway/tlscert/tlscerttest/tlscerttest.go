// Package tlscerttest makes throwaway certificates for tests: a private
// certificate authority and server certificates it signs, written as the
// PEM files an operator hands to `gatehouse serve --tls-cert --tls-key` and
// a client's --ca-file. Keys are ECDSA P-256, which is quick to generate.
package tlscerttest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/gateway/tlscert"
)

// CA is a certificate authority for one test.
type CA struct {
	// PEM is the authority's certificate, PEM-encoded: what a client's
	// --ca-file holds.
	PEM  []byte
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a certificate authority valid from an hour ago for a day.
func NewCA(tb testing.TB) *CA {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "gatehouse test CA " + tb.Name()},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("tlscerttest: CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("tlscerttest: CA certificate: %v", err)
	}
	return &CA{PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert: cert, key: key}
}

// Pool returns a pool holding this authority alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// ClientConfig returns a client TLS configuration that trusts this
// authority alone.
func (ca *CA) ClientConfig() *tls.Config {
	return &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
}

// WriteFile writes the authority's certificate to a file in a fresh
// temporary folder and returns its path.
func (ca *CA) WriteFile(tb testing.TB) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "ca.pem")
	if err := os.WriteFile(path, ca.PEM, 0o600); err != nil {
		tb.Fatalf("tlscerttest: %v", err)
	}
	return path
}

// Issue returns a server certificate with the given serial number for
// hosts (DNS names or IP addresses), valid from an hour ago for a day, and
// its private key, both PEM-encoded.
func (ca *CA) Issue(tb testing.TB, serial int64, hosts ...string) (certPEM, keyPEM []byte) {
	tb.Helper()
	return ca.issue(tb, serial, serverName, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, hosts)
}

// IssueNode returns a certificate as Issue does that also serves as a
// client's: what each end of a mutual-TLS link between nodes (cluster
// routes, leaf links) presents.
func (ca *CA) IssueNode(tb testing.TB, serial int64, hosts ...string) (certPEM, keyPEM []byte) {
	tb.Helper()
	return ca.issue(tb, serial, serverName, nodeUsages(), hosts)
}

// WriteEdgePair writes, as WriteNodePair does, a certificate whose
// subject's common name is name: an edge box's leaf certificate, which
// names the box to a hub that checks it.
func (ca *CA) WriteEdgePair(tb testing.TB, serial int64, name string, hosts ...string) (certFile, keyFile string) {
	tb.Helper()
	certFile, keyFile = Files(tb)
	certPEM, keyPEM := ca.issue(tb, serial, name, nodeUsages(), hosts)
	Replace(tb, keyFile, keyPEM)
	Replace(tb, certFile, certPEM)
	return certFile, keyFile
}

// serverName is the subject's common name of the certificates Issue and
// IssueNode make.
const serverName = "gatehouse test server"

// nodeUsages are a node's certificate's: a server's and a client's.
func nodeUsages() []x509.ExtKeyUsage {
	return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
}

// WriteNodePair issues a certificate as IssueNode does and writes it and
// its key to fresh Files, whose paths it returns.
func (ca *CA) WriteNodePair(tb testing.TB, serial int64, hosts ...string) (certFile, keyFile string) {
	tb.Helper()
	certFile, keyFile = Files(tb)
	certPEM, keyPEM := ca.IssueNode(tb, serial, hosts...)
	Replace(tb, keyFile, keyPEM)
	Replace(tb, certFile, certPEM)
	return certFile, keyFile
}

func (ca *CA) issue(tb testing.TB, serial int64, commonName string, usages []x509.ExtKeyUsage, hosts []string) (certPEM, keyPEM []byte) {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usages,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatalf("tlscerttest: server certificate: %v", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatalf("tlscerttest: server key: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

// WritePair issues a certificate as Issue does and writes it and its key to
// certFile and keyFile. Each file is replaced by a rename, as deployment
// tools do, so a reader never sees half a file.
func (ca *CA) WritePair(tb testing.TB, certFile, keyFile string, serial int64, hosts ...string) {
	tb.Helper()
	certPEM, keyPEM := ca.Issue(tb, serial, hosts...)
	Replace(tb, keyFile, keyPEM)
	Replace(tb, certFile, certPEM)
}

// Files returns the paths of a certificate and its key in a fresh
// temporary folder, for WritePair or Replace to write.
func Files(tb testing.TB) (certFile, keyFile string) {
	tb.Helper()
	dir := tb.TempDir()
	return filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
}

// KeyPair writes a certificate for hosts as WritePair does, to fresh Files,
// and loads them with tlscert.LoadKeyPair and o: the pair a test's TLS
// server serves, as `gatehouse serve --tls-cert --tls-key` loads it. The
// files are returned for tests that replace them.
func (ca *CA) KeyPair(tb testing.TB, serial int64, o tlscert.Options, hosts ...string) (kp *tlscert.KeyPair, certFile, keyFile string) {
	tb.Helper()
	certFile, keyFile = Files(tb)
	ca.WritePair(tb, certFile, keyFile, serial, hosts...)
	kp, err := tlscert.LoadKeyPair(certFile, keyFile, o)
	if err != nil {
		tb.Fatalf("tlscerttest: %v", err)
	}
	return kp, certFile, keyFile
}

// Replace writes data to path through a temporary file and a rename.
func Replace(tb testing.TB, path string, data []byte) {
	tb.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		tb.Fatalf("tlscerttest: %v", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		tb.Fatalf("tlscerttest: %v", err)
	}
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("tlscerttest: key: %v", err)
	}
	return key
}
