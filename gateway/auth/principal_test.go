package auth

import (
	"errors"
	"testing"
)

func TestAuthorize(t *testing.T) {
	admin := &Principal{Subject: "root", Role: RoleAdmin}
	tenantAdmin := &Principal{Subject: "ops", Role: RoleAdmin, Tenant: "acme"}
	alice := &Principal{Subject: "alice", Role: RoleClient}
	aliceAcme := &Principal{Subject: "alice", Role: RoleClient, Tenant: "acme"}
	bob := &Principal{Subject: "bob", Role: RoleClient}
	agent := &Principal{Subject: "a-svc", Role: RoleAgent, Agents: []string{"a"}}
	acmeAgent := &Principal{Subject: "a-acme", Role: RoleAgent, Agents: []string{"a"}, Tenant: "acme"}
	runner := &Principal{Subject: "r-svc", Role: RoleRunner, Runners: []string{"r1"}}
	aliceChannel := &Principal{Subject: "alice", Role: RoleChannel}
	mallory := &Principal{Subject: "mallory", Role: RoleChannel}
	var none *Principal

	aliceOwns := Owner{Principal: "alice"}
	exec := Resource{Kind: KindExecution, ID: "x1", Owner: aliceOwns, AgentID: "a"}
	acmeExec := Resource{Kind: KindExecution, ID: "x2", Owner: Owner{Principal: "alice", Tenant: "acme"}, AgentID: "a"}
	prompt := Resource{Kind: KindAction, ID: "p1", Owner: aliceOwns}
	channels := Resource{Kind: KindChannel, ID: "alice", Owner: aliceOwns}
	agentA := Resource{Kind: KindAgent, ID: "a", AgentID: "a"}
	agentB := Resource{Kind: KindAgent, ID: "b", AgentID: "b"}
	runner1 := Resource{Kind: KindRunner, ID: "r1", RunnerID: "r1"}
	runner2 := Resource{Kind: KindRunner, ID: "r2", RunnerID: "r2"}
	peers := Resource{Kind: KindPeer}
	metrics := Resource{Kind: KindMetrics}

	const ok, forbidden, hidden = "ok", "forbidden", "hidden"
	tests := []struct {
		name string
		p    *Principal
		act  Action
		r    Resource
		want string
	}{
		{"admin reads any execution", admin, ActRead, exec, ok},
		{"admin reads another tenant's execution", admin, ActRead, acmeExec, ok},
		{"admin acts as any agent", admin, ActAct, agentB, ok},
		{"admin answers any prompt", admin, ActDecide, prompt, ok},
		{"tenant admin reads its tenant", tenantAdmin, ActWrite, acmeExec, ok},
		{"tenant admin does not see tenantless executions", tenantAdmin, ActRead, exec, hidden},
		{"tenant admin does not see tenantless prompts", tenantAdmin, ActDecide, prompt, hidden},
		{"tenant admin still drives any runner id", tenantAdmin, ActAct, runner2, ok},

		{"client reads its execution", alice, ActRead, exec, ok},
		{"client writes its execution", alice, ActWrite, exec, ok},
		{"client does not see another's execution", bob, ActRead, exec, hidden},
		{"client does not write another's execution", bob, ActWrite, exec, hidden},
		{"same subject in another tenant is another owner", aliceAcme, ActRead, exec, hidden},
		{"tenanted client reads its tenant's execution", aliceAcme, ActRead, acmeExec, ok},
		{"client never acts as an agent", alice, ActAct, exec, forbidden},
		{"client answers its prompt", alice, ActDecide, prompt, ok},
		{"client does not answer another's prompt", bob, ActDecide, prompt, hidden},
		{"client uses its channels", alice, ActWrite, channels, ok},
		{"client does not use another's channels", bob, ActRead, channels, hidden},
		{"client reads metrics", alice, ActRead, metrics, ok},
		{"client does not list peers", alice, ActRead, peers, forbidden},
		{"client does not use agent ids", alice, ActAct, agentA, forbidden},

		{"agent acts for its agent's execution", agent, ActAct, exec, ok},
		{"agent does not act for another agent's execution", agent, ActAct, Resource{Kind: KindExecution, ID: "x3", Owner: aliceOwns, AgentID: "b"}, hidden},
		{"agent does not act for an execution without agent", agent, ActAct, Resource{Kind: KindExecution, ID: "x4"}, hidden},
		{"tenanted agent does not act for another tenant", acmeAgent, ActAct, exec, hidden},
		{"tenanted agent acts for its tenant", acmeAgent, ActAct, acmeExec, ok},
		{"agent does not read executions", agent, ActRead, exec, forbidden},
		{"agent uses its agent id", agent, ActAct, agentA, ok},
		{"agent does not use another agent id", agent, ActAct, agentB, forbidden},
		{"agent never answers prompts", agent, ActDecide, prompt, forbidden},
		{"agent lists peers", agent, ActRead, peers, ok},
		{"agent sees its agent's presence", agent, ActRead, agentA, ok},
		{"agent does not see runners' presence", agent, ActRead, runner1, forbidden},

		{"runner uses its runner id", runner, ActAct, runner1, ok},
		{"runner does not use another runner id", runner, ActAct, runner2, forbidden},
		{"runner does not act as an agent", runner, ActAct, exec, forbidden},
		{"runner never answers prompts", runner, ActDecide, prompt, forbidden},
		{"runner does not read metrics", runner, ActRead, metrics, forbidden},

		{"channel answers its principal's prompt", aliceChannel, ActDecide, prompt, ok},
		{"channel does not answer another's prompt", mallory, ActDecide, prompt, hidden},
		{"channel does not read executions", aliceChannel, ActRead, exec, forbidden},
		{"channel uses its channels", aliceChannel, ActRead, channels, ok},

		{"nil principal", none, ActRead, exec, forbidden},
		{"unknown kind", admin, ActRead, Resource{Kind: "memo"}, ok},
		{"unknown kind for a client", alice, ActRead, Resource{Kind: "memo"}, forbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Authorize(tt.act, tt.r)
			switch tt.want {
			case ok:
				if err != nil {
					t.Fatalf("want allowed, got %v", err)
				}
			case forbidden:
				if !errors.Is(err, ErrForbidden) {
					t.Fatalf("want ErrForbidden, got %v", err)
				}
			case hidden:
				if !errors.Is(err, ErrHidden) {
					t.Fatalf("want ErrHidden, got %v", err)
				}
			}
		})
	}
}

func TestUnconfinedIsTheAdminWithoutTenant(t *testing.T) {
	for _, p := range []*Principal{
		{Subject: "local", Role: RoleAdmin},
		{Subject: "static", Role: RoleAdmin},
	} {
		if !p.Unconfined() {
			t.Fatalf("%+v is unconfined", p)
		}
	}
	for _, p := range []*Principal{
		nil,
		{Subject: "ops", Role: RoleAdmin, Tenant: "acme"},
		{Subject: "alice", Role: RoleClient},
	} {
		if p.Unconfined() {
			t.Fatalf("%+v is confined", p)
		}
	}
}

func TestRefusalsSayWhat(t *testing.T) {
	runner := &Principal{Subject: "r-svc", Role: RoleRunner, Runners: []string{"r1"}}
	for _, c := range []struct {
		err  error
		want string
	}{
		{runner.Can(ActRead, KindExecution), `forbidden: runner "r-svc" may not read executions`},
		{runner.Authorize(ActDecide, Resource{Kind: KindAction, ID: "a1"}), `forbidden: runner "r-svc" may not answer permission prompts`},
		{runner.Authorize(ActAct, Resource{Kind: KindRunner, ID: "r2", RunnerID: "r2"}), `forbidden: runner "r-svc" may not use runner "r2"`},
		{(&Principal{Subject: "bob", Role: RoleClient}).Authorize(ActRead, Resource{Kind: KindExecution, ID: "x1", Owner: Owner{Principal: "alice"}}), `not visible to the caller: execution x1`},
	} {
		if c.err == nil || c.err.Error() != c.want {
			t.Errorf("got %v, want %q", c.err, c.want)
		}
	}
}
