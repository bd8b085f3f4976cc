package auth

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Claims describes a token to mint. Minting refuses anything Authenticate
// would reject for structural reasons, so a minted token fails only on key,
// issuer, audience or time mismatches.
type Claims struct {
	// Subject becomes sub, the principal's name; required.
	Subject string
	// Role must be one of the Role constants.
	Role Role
	// Agents, Runners and Sessions scope agent, runner and channel tokens.
	Agents, Runners, Sessions []string
	// Tools becomes the tools claim: the patterns of the capabilities the
	// token may serve as a runner (Principal.MayServe). Nil leaves the
	// claim out; empty, not nil, is a claim that allows nothing.
	Tools []string
	// Tenant is copied into the token unchanged.
	Tenant string
	// TTL sets exp relative to the minting time; it must be positive because
	// Authenticate requires exp.
	TTL time.Duration
	// Issuer and Audience become iss and aud; both required.
	Issuer, Audience string
	// KeyID, when set, becomes the kid header.
	KeyID string
}

// MintHS256 signs c with an HS256 secret of at least 32 bytes.
func MintHS256(secret []byte, c Claims, now time.Time) (string, error) {
	if len(secret) < minHMACSecret {
		return "", fmt.Errorf("auth: HMAC secret is %d bytes, need at least %d", len(secret), minHMACSecret)
	}
	return mint(jwt.SigningMethodHS256, secret, c, now)
}

// MintEdDSA signs c with an Ed25519 private key.
func MintEdDSA(key ed25519.PrivateKey, c Claims, now time.Time) (string, error) {
	if len(key) != ed25519.PrivateKeySize {
		return "", errors.New("auth: invalid Ed25519 private key")
	}
	return mint(jwt.SigningMethodEdDSA, key, c, now)
}

func mint(method jwt.SigningMethod, key any, c Claims, now time.Time) (string, error) {
	switch {
	case c.Subject == "":
		return "", errors.New("auth: mint: subject required")
	case !c.Role.valid():
		return "", fmt.Errorf("auth: mint: unknown role %q", c.Role)
	case c.TTL <= 0:
		return "", errors.New("auth: mint: TTL must be positive")
	case c.Issuer == "" || c.Audience == "":
		return "", errors.New("auth: mint: issuer and audience required")
	}
	if err := checkToolPatterns(c.Tools); err != nil {
		return "", fmt.Errorf("auth: mint: %w", err)
	}
	t := jwt.NewWithClaims(method, tokenClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   c.Subject,
			Issuer:    c.Issuer,
			Audience:  jwt.ClaimStrings{c.Audience},
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(c.TTL)),
		},
		Role:     c.Role,
		Agents:   c.Agents,
		Runners:  c.Runners,
		Tools:    c.Tools,
		Sessions: c.Sessions,
		Tenant:   c.Tenant,
	})
	if c.KeyID != "" {
		t.Header["kid"] = c.KeyID
	}
	s, err := t.SignedString(key)
	if err != nil {
		return "", fmt.Errorf("auth: mint: %w", err)
	}
	return s, nil
}
