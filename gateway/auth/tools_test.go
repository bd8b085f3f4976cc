package auth

import (
	"errors"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

func TestMatchTool(t *testing.T) {
	tests := []struct {
		pattern, capability string
		want                bool
	}{
		{"crm.search", "crm.search", true},
		{"crm.search", "crm.searchx", false},
		{"crm.search", "crm.searc", false},
		{"crm.search", "crm.search@acme", false}, // an account is part of what is matched
		{"crm.*", "crm.search", true},
		{"crm.*", "crm.", true},
		{"crm.*", "crm.search@acme", true},
		{"crm.*", "crmx.search", false},
		{"crm.*", "memory_read", false},
		{"crm.*@acme-*", "crm.search@acme-eu", true},
		{"crm.*@acme-*", "crm.search@globex", false},
		{"crm.*@acme-*", "crm.search", false},
		{"*", "anything@at-all", true},
		{"*", "", true},
		{"*.send", "mail.send", true},
		{"*.send", "mail.send.later", false},
		{"a*b*c", "aXXbYYc", true},
		{"a*b*c", "aXXbYYcZ", false},
		{"a*b*c", "abbbc", true},
		{"**", "x", true},
		{"", "", true},
		{"", "x", false},
	}
	for _, tt := range tests {
		if got := MatchTool(tt.pattern, tt.capability); got != tt.want {
			t.Errorf("MatchTool(%q, %q) = %v, want %v", tt.pattern, tt.capability, got, tt.want)
		}
	}
}

// TestMayServe: who may serve what, from the role and the tools claim.
// Every refusal is ErrToolNotAllowed and ErrForbidden both.
func TestMayServe(t *testing.T) {
	tests := []struct {
		name string
		p    *Principal
		tool string
		want bool
	}{
		{"an admin without a claim serves any tool", &Principal{Subject: "static", Role: RoleAdmin}, "crm.search", true},
		{"an admin with a claim serves what it matches", &Principal{Subject: "ops", Role: RoleAdmin, Tools: []string{"crm.*"}}, "crm.search", true},
		{"an admin with a claim serves nothing else", &Principal{Subject: "ops", Role: RoleAdmin, Tools: []string{"crm.*"}}, "mail.send", false},
		{"a runner without a claim serves nothing", &Principal{Subject: "r", Role: RoleRunner, Runners: []string{"r1"}}, "crm.search", false},
		{"a runner with an empty claim serves nothing", &Principal{Subject: "r", Role: RoleRunner, Tools: []string{}}, "crm.search", false},
		{"a runner serves a tool its claim names", &Principal{Subject: "r", Role: RoleRunner, Tools: []string{"mail.send", "crm.*"}}, "crm.search", true},
		{"a runner serves an account its claim matches", &Principal{Subject: "r", Role: RoleRunner, Tools: []string{"crm.*@acme-*"}}, "crm.search@acme-1", true},
		{"a runner does not serve another account", &Principal{Subject: "r", Role: RoleRunner, Tools: []string{"crm.*@acme-*"}}, "crm.search@globex", false},
		{"no principal serves nothing", nil, "crm.search", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.MayServe(tt.tool)
			if tt.want {
				if err != nil {
					t.Fatalf("MayServe(%q) = %v, want nil", tt.tool, err)
				}
				return
			}
			if !errors.Is(err, ErrForbidden) {
				t.Fatalf("MayServe(%q) = %v, want ErrForbidden", tt.tool, err)
			}
			if tt.p != nil && !errors.Is(err, ErrToolNotAllowed) {
				t.Fatalf("MayServe(%q) = %v, want ErrToolNotAllowed", tt.tool, err)
			}
			if tt.p != nil && !strings.Contains(err.Error(), `"`+tt.tool+`"`) {
				t.Fatalf("refusal %q does not name the tool", err)
			}
		})
	}
}

// TestToolsClaim: the claim reaches the principal as it was minted, a
// missing claim apart from an empty one, and a claim that breaks the id
// rule or the bound is refused, by Authenticate and by Mint.
func TestToolsClaim(t *testing.T) {
	key := secret('k')
	a := newAuth(t, Options{HMACSecrets: map[string][]byte{"": key}, Issuer: testIssuer, Audience: testAudience})
	for _, tt := range []struct {
		name  string
		tools []string
	}{{"missing", nil}, {"empty", []string{}}, {"patterns", []string{"crm.*", "mail.send@acc-1"}}} {
		t.Run(tt.name, func(t *testing.T) {
			c := baseClaims()
			c.Role, c.Tools = RoleRunner, tt.tools
			p, err := a.Authenticate(header(mintHS(t, key, c, testNow)), testNow)
			if err != nil {
				t.Fatal(err)
			}
			if (p.Tools == nil) != (tt.tools == nil) || strings.Join(p.Tools, ",") != strings.Join(tt.tools, ",") {
				t.Fatalf("tools = %#v, want %#v", p.Tools, tt.tools)
			}
		})
	}

	tooMany := make([]any, MaxToolPatterns+1)
	for i := range tooMany {
		tooMany[i] = "t"
	}
	for _, tt := range []struct {
		name  string
		tools any
	}{
		{"a pattern with a line feed", []any{"crm.*\nforged"}},
		{"a pattern with a bidi override", []any{"crm.\u202e*"}},
		{"an empty pattern", []any{""}},
		{"too many patterns", tooMany},
		{"not a list", "crm.*"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tok := signRaw(t, jwt.SigningMethodHS256, key, with(validMap(), "tools", tt.tools))
			if _, err := a.Authenticate(header(tok), testNow); !errors.Is(err, ErrInvalidToken) {
				t.Fatalf("Authenticate = %v, want ErrInvalidToken", err)
			}
		})
	}
	c := baseClaims()
	c.Tools = []string{"ok", "bad\x00"}
	if tok, err := MintHS256(key, c, testNow); err == nil {
		t.Fatalf("MintHS256 accepted a pattern with NUL: %s", tok)
	}
}
