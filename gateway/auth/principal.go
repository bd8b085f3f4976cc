// Package auth decides who is calling the gateway and what they may touch.
//
// An [Authenticator] turns the Authorization header of a request into a
// [Principal]; [Principal.Authorize] then decides, in one place, what that
// caller may do with a resource, from the resource's [Owner] and the
// credential's role and scope. Every failure is one of the sentinel errors
// of this package, wrapped with detail, so HTTP handlers can map them with
// errors.Is: the authentication errors to 401 UNAUTHORIZED, [ErrForbidden]
// to 403 FORBIDDEN and [ErrHidden] to 404 NOT_FOUND.
package auth

import (
	"errors"
	"time"
)

var (
	// ErrMissingToken reports a request without an Authorization header.
	ErrMissingToken = errors.New("missing bearer token")
	// ErrMalformed reports an Authorization header that is not exactly
	// "Bearer <token>".
	ErrMalformed = errors.New("malformed authorization header")
	// ErrInvalidToken reports a credential that does not authenticate: an
	// unknown static token, or a JWT with a bad signature, a disallowed
	// method, the wrong audience or issuer, an unknown kid, or bad claims.
	ErrInvalidToken = errors.New("invalid token")
	// ErrExpiredToken reports a correctly signed JWT whose exp has passed
	// (beyond the configured leeway).
	ErrExpiredToken = errors.New("expired token")
	// ErrForbidden reports an authenticated principal acting outside what
	// its role and credential allow, whatever the resource.
	ErrForbidden = errors.New("forbidden")
)

// Role is the kind of caller a credential stands for.
type Role string

// The roles a credential may carry. Any other value in a token is rejected.
const (
	// RoleAdmin may do everything.
	RoleAdmin Role = "admin"
	// RoleAgent may act as the agents listed in its credential.
	RoleAgent Role = "agent"
	// RoleRunner may act as the runners listed in its credential.
	RoleRunner Role = "runner"
	// RoleChannel is a human channel; it may access its chat sessions.
	RoleChannel Role = "channel"
	// RoleClient may use the execution API but never acts as an agent or
	// runner.
	RoleClient Role = "client"
)

func (r Role) valid() bool {
	switch r {
	case RoleAdmin, RoleAgent, RoleRunner, RoleChannel, RoleClient:
		return true
	}
	return false
}

// Principal is an authenticated caller. The gateway treats it as read-only
// once Authenticate has returned it.
type Principal struct {
	// Subject names the caller: "local" in open mode, "static" for the static
	// token, the JWT sub otherwise.
	Subject string
	// Role bounds what the caller may do.
	Role Role
	// Agents lists the agent ids an agent principal may act as.
	Agents []string
	// Runners lists the runner ids a runner principal may act as.
	Runners []string
	// Tools is the credential's tools claim: patterns of the capabilities
	// it may serve as a runner (see MayServe). Nil when the credential has
	// no such claim; empty when it has one that allows nothing.
	Tools []string
	// Sessions is the credential's sessions claim. Nothing interprets it
	// yet: a channel sees every prompt of its principal, on every door.
	Sessions []string
	// Tenant partitions owned resources: a principal with a tenant touches
	// only resources of its tenant (see Authorize).
	Tenant string
	// ExpiresAt is zero when the credential does not expire (open mode,
	// static token).
	ExpiresAt time.Time
}
