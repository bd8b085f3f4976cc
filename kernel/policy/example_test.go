package policy

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// TestExamplePolicy: the example policy the README shows loads and decides
// as the README says, and the README shows it as it is.
func TestExamplePolicy(t *testing.T) {
	const file = "../../docs/examples/policy.yaml"
	e, err := Load(file)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, c := range []struct {
		tool, args string
		want       Decision
	}{
		{"gatehouse.sha256", `{"text":"hello"}`, Allow},
		{"gatehouse.echo", `[1,2]`, Allow},
		{"gatehouse.sleep", `{"ms":500}`, RequireApproval},
		{"gatehouse.sleep", `{"ms":900000}`, Deny},
		{"gatehouse.sleep", `{}`, Deny},
		{"save_memory_note", `{"path":"/topics/icp.md","content":"Ideal customer: B2B SaaS"}`, Allow},
		{"memory_search", `{"query":"ideal customer"}`, Allow},
		{"bash", `{"cmd":"ls"}`, Deny},
		{"web.search", `{}`, Deny},
	} {
		if got := e.Evaluate(Input{ToolID: c.tool, AgentID: "researcher", Arguments: json.RawMessage(c.args), Now: now}); got.Decision != c.want {
			t.Errorf("%s %s: %+v, want %s", c.tool, c.args, got, c.want)
		}
	}
	body, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```yaml\n"+string(body)+"```") {
		t.Error("README.md does not show docs/examples/policy.yaml as it is")
	}
}
