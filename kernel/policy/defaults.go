package policy

import "strings"

// Default returns the policy used when the operator configures none: every
// tool is allowed except shell-like ones (see the package documentation for
// the exact rule), because an unconfigured kernel must not hand agents
// arbitrary command execution.
func Default() *Engine {
	denyShell := &rule{
		id:       "default-deny-shell",
		decision: Deny,
		reason:   "Shell commands denied by default",
		conds:    []condition{func(ev *evalContext) bool { return isShellLike(ev.in.ToolID) }},
	}
	set := &ruleSet{
		rules:    []*rule{denyShell},
		fallback: Result{Decision: Allow, RuleID: "default-allow", Reason: "allowed by the built-in default policy"},
	}
	return newEngine("built-in default (shell-like tools denied)", set, nil)
}

// isShellLike reports whether the tool id, or any part of it after a
// separator, names a shell. Checking every suffix rather than only the last
// segment catches namespaced multi-word names such as "mcp.run_command".
func isShellLike(toolID string) bool {
	id := strings.ToLower(toolID)
	for {
		if isShellName(id) {
			return true
		}
		i := strings.IndexAny(id, "._/-:")
		if i < 0 {
			return false
		}
		id = id[i+1:]
	}
}

func isShellName(s string) bool {
	switch s {
	case "shell", "bash", "sh", "zsh", "fish", "powershell", "pwsh", "cmd",
		"exec", "terminal", "run_command", "execute_command":
		return true
	}
	return false
}
