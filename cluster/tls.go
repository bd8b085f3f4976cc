package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// mutualTLS is the configuration of a link whose two ends are peers, as
// routes are: each serves its certificate and checks the other's against
// the CA alone (the system's roots have no say in who joins a cluster).
func mutualTLS(f TLSFiles, flag string) (*tls.Config, error) {
	if f.Cert == "" || f.CA == "" {
		return nil, fmt.Errorf("%w: %s: TLS between nodes needs a certificate, its key and the CA that signs every node's", ErrConfig, flag)
	}
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("%w: %s certificate: %w", ErrConfig, flag, err)
	}
	pool, err := caPool(f.CA, flag)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{pair},
		RootCAs:      pool,
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// serverTLS is a listener's configuration (a hub's leaf listener): its
// certificate, and with a CA, the refusal of any dialer without a
// certificate that CA signed.
func serverTLS(f TLSFiles, flag string) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("%w: %s certificate: %w", ErrConfig, flag, err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		if c.ClientCAs, err = caPool(f.CA, flag); err != nil {
			return nil, err
		}
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return c, nil
}

// clientTLS is a dialer's configuration: the CA that verifies the server
// (nil: the system's roots) and the certificate to present, if any.
func clientTLS(f TLSFiles, flag string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		pool, err := caPool(f.CA, flag)
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	if f.Cert != "" || f.Key != "" {
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("%w: %s certificate: %w", ErrConfig, flag, err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}

func caPool(file, flag string) (*x509.CertPool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%w: %s CA: %w", ErrConfig, flag, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%w: %s CA %s: no PEM certificate in it", ErrConfig, flag, file)
	}
	return pool, nil
}
