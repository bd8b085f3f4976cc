package auth

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/gatehouse-dev/gatehouse/ident"
)

// ErrToolNotAllowed reports a runner that declares a capability the
// deployment does not trust it with: one outside its credential's tools
// claim, or a tool reserved for a built-in runner of the gateway. It is
// always wrapped together with ErrForbidden, so that a caller that only
// knows ErrForbidden still answers 403.
var ErrToolNotAllowed = errors.New("tool not allowed")

// MaxToolPatterns bounds the patterns of a tools claim.
const MaxToolPatterns = 256

// MayServe decides whether p may serve capability as a runner: a tool id,
// or "<tool>@<account>" for a tool on a connected account. Whoever serves a
// tool receives its jobs, with their arguments, and answers them, so a
// capability is served only by the credentials the deployment trusts with
// it:
//   - a credential with a tools claim serves what one of its patterns
//     matches (see MatchTool), whatever its role;
//   - without one, an admin serves any tool (the static token and the
//     no-token default are admins), and a runner none.
//
// The tools reserved for the gateway's built-in runners are refused
// before this rule, whoever asks (the gateway knows them, not the
// credential).
func (p *Principal) MayServe(capability string) error {
	if p == nil {
		return fmt.Errorf("%w: no principal", ErrForbidden)
	}
	if p.Tools == nil {
		if p.Role == RoleAdmin {
			return nil
		}
		return fmt.Errorf("%w: %w: %s %q may not serve %s: its credential has no tools claim",
			ErrForbidden, ErrToolNotAllowed, p.Role, p.Subject, strconv.Quote(capability))
	}
	for _, pat := range p.Tools {
		if MatchTool(pat, capability) {
			return nil
		}
	}
	return fmt.Errorf("%w: %w: %s %q may not serve %s: no pattern of its tools claim matches it",
		ErrForbidden, ErrToolNotAllowed, p.Role, p.Subject, strconv.Quote(capability))
}

// MatchTool reports whether pattern matches capability, all of it. A '*'
// in the pattern matches any run of characters, none included, '.' and '@'
// as well; every other character matches itself. So "crm.*" matches every
// tool whose id starts with "crm.", on any account; "crm.*@acme-*" only on
// the accounts whose ids start with "acme-"; "*" every tool.
func MatchTool(pattern, capability string) bool {
	// The classic linear glob: on a mismatch, let the last '*' take one
	// more character and try again from there.
	p, c := 0, 0
	star, mark := -1, 0
	for c < len(capability) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, c
			p++
		case p < len(pattern) && pattern[p] == capability[c]:
			p++
			c++
		case star >= 0:
			mark++
			p, c = star+1, mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// checkToolPatterns validates a tools claim: at most MaxToolPatterns
// patterns, each an id by package ident's rule (a '*' is an ordinary
// character there).
func checkToolPatterns(patterns []string) error {
	if len(patterns) > MaxToolPatterns {
		return fmt.Errorf("claim tools has %d patterns, at most %d", len(patterns), MaxToolPatterns)
	}
	for _, pat := range patterns {
		if err := ident.Check("a pattern of claim tools", pat); err != nil {
			return err
		}
	}
	return nil
}
