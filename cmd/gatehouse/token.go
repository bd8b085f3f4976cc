package main

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
)

// tokenCmd mints a JWT for development: `gatehouse token --role runner
// --runners r1 --tools 'crm.*' --secret ...`. Production tokens come from your identity
// provider; the gateway only verifies them.
func tokenCmd(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("token", stderr)
	var (
		secret, keyFile, sub, role, agents, runners, tools, sessions, tenant, iss, aud, kid string
		ttl                                                                                 time.Duration
	)
	fs.StringVar(&secret, "secret", "", "HS256 secret (the server's --jwt-secret)")
	fs.StringVar(&keyFile, "ed25519-key", "", "PEM file of an Ed25519 private key (PKCS #8), instead of --secret")
	fs.StringVar(&sub, "sub", "dev", "subject: the principal's name")
	fs.StringVar(&role, "role", "admin", "admin, client, agent, runner or channel")
	fs.StringVar(&agents, "agents", "", "comma-separated agent ids an agent token may act as")
	fs.StringVar(&runners, "runners", "", "comma-separated runner ids a runner token may act as")
	fs.StringVar(&tools, "tools", "", "comma-separated patterns of the tools a runner token may serve (\"crm.*\", \"mail.send@acc-*\"); a runner token without them serves none")
	fs.StringVar(&sessions, "sessions", "", "comma-separated session ids a channel token may read")
	fs.StringVar(&tenant, "tenant", "", "tenant")
	fs.StringVar(&iss, "iss", "gatehouse-dev", "issuer (the server's --jwt-issuer)")
	fs.StringVar(&aud, "aud", "gatehouse", "audience (the server's --jwt-audience)")
	fs.StringVar(&kid, "kid", "", "key id header")
	fs.DurationVar(&ttl, "ttl", time.Hour, "lifetime")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	c := auth.Claims{
		Subject: sub, Role: auth.Role(role), Agents: splitList(agents), Runners: splitList(runners), Tools: splitList(tools), Sessions: splitList(sessions),
		Tenant: tenant, TTL: ttl, Issuer: iss, Audience: aud, KeyID: kid,
	}
	var tok string
	var err error
	switch {
	case keyFile != "":
		var key ed25519.PrivateKey
		if key, err = readEd25519(keyFile); err == nil {
			tok, err = auth.MintEdDSA(key, c, time.Now())
		}
	case secret != "":
		tok, err = auth.MintHS256([]byte(secret), c, time.Now())
	default:
		return errors.New("token: give --secret or --ed25519-key")
	}
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	fmt.Fprintln(stdout, tok)
	return nil
}

func readEd25519(path string) (ed25519.PrivateKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("%s: no PEM block", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	ed, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s: not an Ed25519 key", path)
	}
	return ed, nil
}
