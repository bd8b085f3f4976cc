package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/gatehouse-dev/gatehouse/client"
)

// peerFlags are the flags of the commands that run a peer on its own
// outbound stream (agent, runner): where the gateway is, how to prove who
// it is, which connection it is, and how much it logs.
type peerFlags struct {
	url, token, consumerID, logLevel, caFile string
}

// add registers the flags on fs; tokenUse and consumerUse say what the
// command's token and default consumer id are.
func (p *peerFlags) add(fs *flag.FlagSet, tokenUse, consumerUse string) {
	fs.StringVar(&p.url, "url", defaultURL(), "gateway base URL (http:// or https://)")
	caFileFlag(fs, &p.caFile)
	fs.StringVar(&p.token, "token", "", tokenUse)
	fs.StringVar(&p.consumerID, "consumer-id", "", consumerUse)
	fs.StringVar(&p.logLevel, "log-level", "info", "debug, info, warn or error")
}

// logger builds the command's text logger at --log-level.
func (p *peerFlags) logger(stderr io.Writer) (*slog.Logger, error) {
	return newLogger(stderr, p.logLevel, "text")
}

// client builds the peer's gateway client; cmd names the command in a TLS
// error, which is the one a user can fix (--ca-file).
func (p *peerFlags) client(cmd string, log *slog.Logger) (*client.Client, error) {
	tc, err := clientTLS(p.caFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cmd, err)
	}
	return client.New(client.Options{BaseURL: p.url, Token: p.token, Logger: log, TLSConfig: tc})
}
