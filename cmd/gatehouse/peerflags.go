package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/gatehouse-dev/gatehouse/client"
)

// gatewayFlags are the flags of every command that talks to a gateway as
// its client: where it is (the nodes of a cluster, tried in turn), the
// token, and the CA of its certificate.
type gatewayFlags struct {
	url           urlList
	token, caFile string
}

// add registers the flags on fs; tokenUse says what the command's token is.
func (g *gatewayFlags) add(fs *flag.FlagSet, tokenUse string) {
	g.url = urlList{urls: []string{defaultURL()}}
	fs.Var(&g.url, "url", "gateway base `URL` (http:// or https://); several, comma-separated or repeated, name the nodes of one cluster: the command uses one and moves to the next when it cannot be reached, resuming its stream there")
	caFileFlag(fs, &g.caFile)
	fs.StringVar(&g.token, "token", "", tokenUse)
}

// urlList is the value of --url: one or more gateway base URLs, given
// comma-separated or by repeating the flag. The first use replaces the
// default.
type urlList struct {
	urls []string
	set  bool
}

func (u *urlList) String() string { return strings.Join(u.urls, ",") }

func (u *urlList) Set(v string) error {
	if !u.set {
		u.urls, u.set = nil, true
	}
	parts := splitList(v)
	if len(parts) == 0 {
		return errors.New("want a URL")
	}
	u.urls = append(u.urls, parts...)
	return nil
}

// client builds the command's gateway client from the flags and the rest of
// o; cmd names the command in the error, which is one a user can fix
// (--url, --ca-file).
func (g *gatewayFlags) client(cmd string, o client.Options) (*client.Client, error) {
	tc, err := clientTLS(g.caFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cmd, err)
	}
	o.BaseURLs, o.Token, o.TLSConfig = g.url.urls, g.token, tc
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
