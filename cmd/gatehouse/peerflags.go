package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/gatehouse-dev/gatehouse/client"
)

// gatewayFlags are the flags of every command that talks to a gateway as
// its client: where it is, the token, and the CA of its certificate.
type gatewayFlags struct {
	url, token, caFile string
}

// add registers the flags on fs; tokenUse says what the command's token is.
func (g *gatewayFlags) add(fs *flag.FlagSet, tokenUse string) {
	fs.StringVar(&g.url, "url", defaultURL(), "gateway base `URL` (http:// or https://)")
	caFileFlag(fs, &g.caFile)
	fs.StringVar(&g.token, "token", "", tokenUse)
}

// client builds the command's gateway client from the flags and the rest of
// o; cmd names the command in the error, which is one a user can fix
// (--url, --ca-file).
func (g *gatewayFlags) client(cmd string, o client.Options) (*client.Client, error) {
	tc, err := clientTLS(g.caFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cmd, err)
	}
	o.BaseURL, o.Token, o.TLSConfig = g.url, g.token, tc
	c, err := client.New(o)
	if err != nil {
		return nil, fmt.Errorf("%s: --url: %w", cmd, err)
	}
	return c, nil
}

// peerFlags are the flags of the commands that run a peer on its own
// outbound stream (agent, runner): the gateway's, which connection it is,
// and how much it logs.
type peerFlags struct {
	gatewayFlags
	consumerID, logLevel string
}

// add registers the flags on fs; tokenUse and consumerUse say what the
// command's token and default consumer id are.
func (p *peerFlags) add(fs *flag.FlagSet, tokenUse, consumerUse string) {
	p.gatewayFlags.add(fs, tokenUse)
	fs.StringVar(&p.consumerID, "consumer-id", "", consumerUse)
	fs.StringVar(&p.logLevel, "log-level", "info", "debug, info, warn or error")
}

// logger builds the command's text logger at --log-level.
func (p *peerFlags) logger(stderr io.Writer) (*slog.Logger, error) {
	return newLogger(stderr, p.logLevel, "text")
}
