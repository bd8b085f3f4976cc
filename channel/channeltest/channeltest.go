// Package channeltest raises permission prompts on real nodes for the
// tests of the human channels: a direct execution of a tool that policy
// holds for a person, as an operator's policy would.
package channeltest

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/node"
)

// Policy holds every tool whose id starts with "deploy" for a person
// (rule "ask"), every "expire*" tool for 1s, then denied (rule "brief"),
// every "timed*" tool for 10 minutes (rule "timed"), and allows the rest.
const Policy = `
rules:
  - id: ask
    priority: 1
    when: {tool_id: "deploy*"}
    then: {decision: require_approval, reason: "deploys need a human"}
  - id: brief
    priority: 2
    when: {tool_id: "expire*"}
    then: {decision: require_approval, reason: "answer quickly", expires_in: 1s}
  - id: timed
    priority: 3
    when: {tool_id: "timed*"}
    then: {decision: require_approval, reason: "answer within 10 minutes", expires_in: 10m}
default:
  decision: allow
`

// Ask starts a direct execution of tool for owner on n and returns its
// prompt once the bridge holds it.
func Ask(tb testing.TB, n *node.Node, owner, tool string, args any) bridge.Record {
	tb.Helper()
	raw, err := json.Marshal(args)
	if err != nil {
		tb.Fatal(err)
	}
	v, _, err := n.Kernel.Create(context.Background(), kernel.CreateRequest{Tool: &kernel.ToolCall{ToolID: tool, Arguments: raw}},
		kernel.Meta{Principal: owner})
	if err != nil {
		tb.Fatalf("channeltest: create %s for %s: %v", tool, owner, err)
	}
	return eventually.Value(tb, "a prompt for "+tool, func() (bridge.Record, bool) {
		for _, r := range n.Bridge.Pending(owner) {
			if r.ExecutionID == v.ID {
				return r, true
			}
		}
		return bridge.Record{}, false
	})
}

// Settled waits until the prompt actionID of n is settled and returns it.
func Settled(tb testing.TB, n *node.Node, actionID string) bridge.Record {
	tb.Helper()
	return eventually.Value(tb, "prompt "+actionID+" settled", func() (bridge.Record, bool) {
		r, err := n.Bridge.Get(actionID)
		return r, err == nil && r.State != bridge.StatePending
	})
}
