// Package policytest gives tests the policies they run kernels and nodes
// with, parsed from the same YAML an operator writes.
package policytest

import (
	"testing"

	"github.com/gatehouse-dev/gatehouse/kernel/policy"
)

// AskDeploys holds every tool whose id starts with "deploy" for a person's
// approval, with a reason the tests look for on the prompt, and allows the
// rest: the policy of the tests that answer a permission prompt.
const AskDeploys = `
rules:
  - id: ask
    priority: 1
    when: {tool_id: "deploy*"}
    then: {decision: require_approval, reason: "deploys need a human"}
default:
  decision: allow
`

// Parse parses a policy written in a test, failing the test when it does
// not parse.
func Parse(tb testing.TB, src string) *policy.Engine {
	tb.Helper()
	e, err := policy.Parse([]byte(src), tb.Name()+".yaml")
	if err != nil {
		tb.Fatalf("policytest: %v", err)
	}
	return e
}
