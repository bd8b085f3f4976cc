package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// TestActions lists, reads and answers a real permission prompt: an agent
// invokes a tool the policy holds for approval, the client finds the
// prompt, answers it (the agent's tool then runs), and a second answer
// gets the recorded outcome.
func TestActions(t *testing.T) {
	pol := policytest.Parse(t, policytest.AskDeploys)
	const token = "actions-secret"
	s := nodetest.Start(t, node.Options{Policy: pol, Auth: auth.Options{StaticToken: token}})
	c, err := client.New(client.Options{BaseURL: s.URL, Token: token, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	ctx := t.Context()

	page, err := c.ListActions(ctx, client.ActionListOptions{State: client.ActionPending})
	if err != nil || len(page.Actions) != 0 || page.NextCursor != "" {
		t.Fatalf("no prompt yet: %+v, %v", page, err)
	}

	ran := make(chan json.RawMessage, 1)
	background(t, func(ctx context.Context) error {
		return c.RunAgent(ctx, &client.Agent{
			AgentID: "deployer", ConsumerID: "deployer-1",
			Tools: map[string]client.ToolFunc{"deploy.app": func(_ context.Context, args json.RawMessage) (any, error) {
				ran <- args
				return args, nil
			}},
			Handle: func(ctx context.Context, t *client.Task) (any, error) {
				return t.Invoke(ctx, "deploy.app", map[string]string{"env": "prod"}, false)
			},
		})
	})
	peers := eventually.Value(t, "the agent listed online", func() (*client.PeerPage, bool) {
		p, err := c.ListPeers(ctx, client.PeerListOptions{Role: "agent"})
		return p, err == nil && len(p.Peers) == 1 && p.Peers[0].State == "online"
	})
	if p := peers.Peers[0]; p.ID != "deployer" || p.ConsumerID != "deployer-1" {
		t.Fatalf("peer: %+v", p)
	}
	ex, err := c.CreateExecution(ctx, client.CreateRequest{AgentID: "deployer"})
	if err != nil {
		t.Fatal(err)
	}
	// The bridge lists a prompt once the intent's answer has gone out.
	page = eventually.Value(t, "the prompt listed as pending", func() (*client.ActionPage, bool) {
		p, err := c.ListActions(ctx, client.ActionListOptions{State: client.ActionPending, Limit: 10})
		return p, err == nil && len(p.Actions) == 1
	})
	pending := page.Actions[0]
	if pending.State != client.ActionPending || pending.ExecutionID != ex.ID || pending.ToolID != "deploy.app" ||
		pending.Reason != "deploys need a human" || pending.RuleID != "ask" || pending.AgentID != "deployer" ||
		string(pending.Arguments) != `{"env":"prod"}` || len(pending.ArgumentsSHA256) != 64 || pending.RequestedAt.IsZero() {
		t.Fatalf("pending action: %+v", pending)
	}
	got, err := c.GetAction(ctx, pending.ActionID)
	if err != nil || got.ActionID != pending.ActionID || got.State != client.ActionPending {
		t.Fatalf("get: %+v, %v", got, err)
	}

	for _, tc := range []struct {
		name string
		id   string
		a    client.Answer
		want error
	}{
		{"unknown action", "no-such-action", client.Answer{Decision: client.DecisionAllowOnce}, client.ErrNotFound},
		{"bad decision", pending.ActionID, client.Answer{Decision: "maybe"}, client.ErrValidation},
	} {
		if _, err := c.Respond(ctx, tc.id, tc.a); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := c.GetAction(ctx, "no-such-action"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("get an unknown action: %v", err)
	}

	won, err := c.Respond(ctx, pending.ActionID, client.Answer{Decision: client.DecisionAllowOnce, Reason: "looks fine",
		ChannelID: "test", NativePeerID: "tester@host"})
	if err != nil {
		t.Fatalf("respond: %v", err)
	}
	if won.State != client.ActionApproved || won.Decision != client.DecisionAllowOnce || won.DecisionReason != "looks fine" ||
		won.DecidedAt == nil || won.DecidedBy == nil || won.DecidedBy.ChannelID != "test" || won.DecidedBy.NativePeerID != "tester@host" {
		t.Fatalf("settled action: %+v", won)
	}
	select {
	case args := <-ran:
		if string(args) != `{"env":"prod"}` {
			t.Fatalf("tool ran with %s", args)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the approved tool did not run")
	}

	_, err = c.Respond(ctx, pending.ActionID, client.Answer{Decision: client.DecisionDeny})
	var settled *client.SettledError
	if !errors.As(err, &settled) || !errors.Is(err, client.ErrConflict) {
		t.Fatalf("second answer: %v, want a *SettledError matching ErrConflict", err)
	}
	if r := settled.Recorded; r.ActionID != pending.ActionID || r.State != client.ActionApproved || r.Decision != client.DecisionAllowOnce ||
		r.DecidedBy == nil || r.DecidedBy.ChannelID != "test" {
		t.Fatalf("recorded outcome: %+v", r)
	}
	if p, err := c.ListActions(ctx, client.ActionListOptions{State: client.ActionApproved}); err != nil || len(p.Actions) != 1 {
		t.Fatalf("approved actions: %+v, %v", p, err)
	}
	if _, err := c.ListActions(ctx, client.ActionListOptions{State: "sleeping"}); !errors.Is(err, client.ErrValidation) {
		t.Fatalf("bad state filter: %v", err)
	}
}
