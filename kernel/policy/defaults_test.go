package policy

import "testing"

func TestDefault(t *testing.T) {
	tests := []struct {
		tool    string
		allowed bool
	}{
		{"web.search", true},
		{"shell", false},
		{"system.shell", false},
		{"bash", false},
		{"fs.read_file", true},
		{"shellcheck", true},
		{"SHELL", false},
		{"Sys.Bash", false},
		{"tools/bash", false},
		{"run-shell", false},
		{"os.exec", false},
		{"run_command", false},
		{"mcp.run_command", false},
		{"github:execute_command", false},
		{"powershell", false},
		{"cmd", false},
		{"my_terminal", false},
		{"exec_sql", true},
		{"bashful", true},
		{"fish_market.lookup", true},
		{"publish", true},
		{"command", true},
		{"", true},
	}
	e := Default()
	for _, tt := range tests {
		t.Run(tt.tool, func(t *testing.T) {
			got := e.Evaluate(Input{ToolID: tt.tool, AgentID: "any"})
			want := Result{Decision: Allow, RuleID: "default-allow", Reason: "allowed by the built-in default policy"}
			if !tt.allowed {
				want = Result{Decision: Deny, RuleID: "default-deny-shell", Reason: "Shell commands denied by default"}
			}
			if got != want {
				t.Errorf("Evaluate(%q) = %+v, want %+v", tt.tool, got, want)
			}
		})
	}
	if got, want := e.Source(), "built-in default (shell-like tools denied)"; got != want {
		t.Errorf("Source = %q, want %q", got, want)
	}
}
