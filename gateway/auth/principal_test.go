package auth

import (
	"errors"
	"testing"
)

func TestScopes(t *testing.T) {
	admin := &Principal{Subject: "root", Role: RoleAdmin}
	agent := &Principal{Subject: "a-svc", Role: RoleAgent, Agents: []string{"a"}}
	runner := &Principal{Subject: "r-svc", Role: RoleRunner, Runners: []string{"r1"}}
	client := &Principal{Subject: "cli", Role: RoleClient}
	scopedChannel := &Principal{Subject: "alice", Role: RoleChannel, Sessions: []string{"s1"}}
	openChannel := &Principal{Subject: "bob", Role: RoleChannel}
	var none *Principal

	asAgent := func(id string) func(*Principal) error {
		return func(p *Principal) error { return p.MayActAsAgent(id) }
	}
	asRunner := func(id string) func(*Principal) error {
		return func(p *Principal) error { return p.MayActAsRunner(id) }
	}
	session := func(id string) func(*Principal) error {
		return func(p *Principal) error { return p.MayAccessSession(id) }
	}
	administer := func(p *Principal) error { return p.MayAdminister() }

	tests := []struct {
		name  string
		p     *Principal
		check func(*Principal) error
		ok    bool
	}{
		{"admin acts as any agent", admin, asAgent("zzz"), true},
		{"admin acts as any runner", admin, asRunner("zzz"), true},
		{"admin accesses any session", admin, session("zzz"), true},
		{"admin administers", admin, administer, true},

		{"agent acts as granted agent", agent, asAgent("a"), true},
		{"agent may not act as other agent", agent, asAgent("b"), false},
		{"agent may not act as empty agent", agent, asAgent(""), false},
		{"agent may not act as runner", agent, asRunner("a"), false},
		{"agent may not access session", agent, session("s1"), false},
		{"agent may not administer", agent, administer, false},

		{"runner acts as granted runner", runner, asRunner("r1"), true},
		{"runner may not act as other runner", runner, asRunner("r2"), false},
		{"runner may not act as agent", runner, asAgent("r1"), false},
		{"runner may not administer", runner, administer, false},

		{"client administers", client, administer, true},
		{"client may not act as agent", client, asAgent("a"), false},
		{"client may not act as runner", client, asRunner("r1"), false},
		{"client may not access session", client, session("s1"), false},

		{"channel accesses listed session", scopedChannel, session("s1"), true},
		{"channel may not access unlisted session", scopedChannel, session("s2"), false},
		{"channel without list defers to caller", openChannel, session("s9"), true},
		{"channel may not act as agent", openChannel, asAgent("a"), false},
		{"channel may not administer", openChannel, administer, false},

		{"nil principal may not act as agent", none, asAgent("a"), false},
		{"nil principal may not access session", none, session("s1"), false},
		{"nil principal may not administer", none, administer, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.check(tt.p)
			if tt.ok && err != nil {
				t.Fatalf("want allowed, got %v", err)
			}
			if !tt.ok && !errors.Is(err, ErrForbidden) {
				t.Fatalf("want ErrForbidden, got %v", err)
			}
		})
	}
}
