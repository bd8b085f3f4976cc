// Package auth decides who is calling the gateway and what they may touch.
//
// An [Authenticator] turns the Authorization header of a request into a
// [Principal]; the Principal's May* methods then answer scope questions
// (may this caller act as agent X, drive runner Y, read session Z). Every
// failure is one of the sentinel errors below, wrapped with detail, so HTTP
// handlers can map them with errors.Is: the authentication errors to 401
// UNAUTHORIZED and [ErrForbidden] to 403 FORBIDDEN.
package auth

import (
	"errors"
	"fmt"
	"slices"
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
	// ErrForbidden reports an authenticated principal acting outside its
	// scope.
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
	// Sessions lists the session ids a channel principal may access.
	Sessions []string
	// Tenant is carried through from the token for callers that partition
	// by tenant; this package does not interpret it.
	Tenant string
	// ExpiresAt is zero when the credential does not expire (open mode,
	// static token).
	ExpiresAt time.Time
}

// MayActAsAgent reports whether p may speak for agentID: admins always, agent
// principals for the ids listed in their credential, nobody else.
func (p *Principal) MayActAsAgent(agentID string) error {
	return p.mayUse(RoleAgent, "agent", agentID)
}

// MayActAsRunner reports whether p may speak for runnerID: admins always,
// runner principals for the ids listed in their credential, nobody else.
func (p *Principal) MayActAsRunner(runnerID string) error {
	return p.mayUse(RoleRunner, "runner", runnerID)
}

// MayAccessSession reports whether p may read or write the channel session
// sessionID. Admins always may. A channel principal whose credential lists
// sessions may access exactly those. A channel principal whose credential
// lists none passes this check for every session: such a credential stands
// for a person whose sessions are whatever the store records as theirs, so
// the caller must additionally check that the session belongs to p.Subject.
// Every other role is refused.
func (p *Principal) MayAccessSession(sessionID string) error {
	if p != nil && p.Role == RoleChannel && len(p.Sessions) == 0 {
		return nil
	}
	return p.mayUse(RoleChannel, "session", sessionID)
}

// MayAdminister reports whether p may use the general execution API (create,
// list, cancel and signal executions): admins and clients may. Clients get no
// agent or runner identity from this; those stay behind MayActAsAgent and
// MayActAsRunner.
func (p *Principal) MayAdminister() error {
	if p == nil {
		return fmt.Errorf("%w: no principal", ErrForbidden)
	}
	if p.Role == RoleAdmin || p.Role == RoleClient {
		return nil
	}
	return fmt.Errorf("%w: %s %q may not use the execution API", ErrForbidden, p.Role, p.Subject)
}

// mayUse is the shared shape of the scoped checks: admin passes, the owning
// role passes for the ids its credential lists, everything else is
// forbidden. An empty id never matches so that a missing path parameter
// cannot be mistaken for a grant.
func (p *Principal) mayUse(owner Role, kind, id string) error {
	if p == nil {
		return fmt.Errorf("%w: no principal", ErrForbidden)
	}
	if p.Role == RoleAdmin {
		return nil
	}
	var granted []string
	switch owner {
	case RoleAgent:
		granted = p.Agents
	case RoleRunner:
		granted = p.Runners
	case RoleChannel:
		granted = p.Sessions
	}
	if p.Role == owner && id != "" && slices.Contains(granted, id) {
		return nil
	}
	return fmt.Errorf("%w: %s %q may not access %s %q", ErrForbidden, p.Role, p.Subject, kind, id)
}
