package gateway

import (
	"crypto/tls"
	"fmt"
	"net"
	"slices"
)

// Listen listens on the TCP address addr for a Server: plain HTTP when tc
// is nil, else TLS with a copy of tc fit for the gateway (see serverTLS).
func Listen(addr string, tc *tls.Config) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("gateway: listen: %w", err)
	}
	if tc != nil {
		ln = tls.NewListener(ln, serverTLS(tc))
	}
	return ln, nil
}

// serverTLS returns a copy of c fit for the gateway's listener: its ALPN
// list offers "http/1.1" and never "h2", because fasthttp speaks no HTTP/2
// and a client that negotiated it would send frames the server cannot
// read. Other protocols (acme-tls/1 for ACME challenges) are kept.
func serverTLS(c *tls.Config) *tls.Config {
	c = c.Clone()
	c.NextProtos = slices.DeleteFunc(slices.Clone(c.NextProtos), func(p string) bool { return p == "h2" })
	if !slices.Contains(c.NextProtos, "http/1.1") {
		c.NextProtos = append([]string{"http/1.1"}, c.NextProtos...)
	}
	if c.MinVersion < tls.VersionTLS12 {
		c.MinVersion = tls.VersionTLS12
	}
	return c
}
