package policy

import (
	"reflect"
	"testing"
)

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

		// Spellings that bypassed the list: white space, NUL and other
		// invisible characters, extensions, paths, case.
		{"bash ", false},
		{" bash", false},
		{"bash\t", false},
		{"bash\n", false},
		{"bash\u0000", false},
		{"bash\u0000.txt", false},
		{"ba\u200bsh", false},
		{"\u202ebash", false},
		{"ｂａｓｈ", false},
		{"bash.exe", false},
		{"BASH.EXE", false},
		{"bash.exe.", false},
		{"cmd.exe", false},
		{"CMD.EXE", false},
		{`C:\Windows\System32\cmd.exe`, false},
		{"powershell.exe", false},
		{"pwsh.ps1", false},
		{"/bin/bash", false},
		{"/usr/bin/env", true},
		{"./sh", false},
		{"bash -c ls", false},
		{"deploy.sh", false},
		{"run.bat", true},
		{"bash.bat", false},

		// The interpreter family.
		{"sudo", false},
		{"su", false},
		{"doas", false},
		{"pkexec", false},
		{"ssh", false},
		{"remote.ssh", false},
		{"python", false},
		{"python3", false},
		{"python3.11", false},
		{"Python3.exe", false},
		{"pythonw", false},
		{"node", false},
		{"nodejs", false},
		{"node18", false},
		{"deno", false},
		{"ruby", false},
		{"perl", false},
		{"php", false},
		{"lua", false},
		{"execute-command", false},
		{"execute_command", false},
		{"executeCommand", false},
		{"runCommand", false},
		{"exec-command", false},
		{"shell_exec", false},
		{"os.system", false},
		{"subprocess", false},
		{"child_process", false},
		{"python_repl", false},
		{"code_interpreter", false},
		{"run_python", false},

		// Names that only look alike.
		{"pythonic.lint", true},
		{"nodes.list", true},
		{"rubygems.search", true},
		{"php_docs", true},
		{"perlin_noise", true},
		{"sushi.order", true},
		{"issue.search", true},
		{"execute", true},
		{"system.info", true},
		{"operating_system", true},
		{"sql.exec_query", true},
		{"executor.status", true},
		{"terminal_velocity.compute", true},
	}
	e := Default()
	for _, tt := range tests {
		t.Run(tt.tool, func(t *testing.T) {
			got := e.Evaluate(Input{ToolID: tt.tool, AgentID: "any"})
			want := Result{Decision: Allow, RuleID: "default-allow", Reason: "allowed by the built-in default policy"}
			if !tt.allowed {
				want = Result{Decision: Deny, RuleID: "default-deny-shell", Reason: "Shell commands denied by default"}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Evaluate(%q) = %+v, want %+v", tt.tool, got, want)
			}
		})
	}
	if got, want := e.Source(), "built-in default (shell-like tools denied)"; got != want {
		t.Errorf("Source = %q, want %q", got, want)
	}
}

func TestCanonicalTool(t *testing.T) {
	for in, want := range map[string]string{
		"Bash":                      "bash",
		"  bash  ":                  "bash",
		"bash\u0000":                "bash",
		"mcp.run_command":           "mcp.run.command",
		`C:\Windows\System32\x.EXE`: "c.windows.system32.x.exe",
		"a//b--c__d::e":             "a.b.c.d.e",
		"ｃｍｄ":                       "cmd",
		"":                          "",
	} {
		if got := canonicalTool(in); got != want {
			t.Errorf("canonicalTool(%q) = %q, want %q", in, got, want)
		}
	}
}
