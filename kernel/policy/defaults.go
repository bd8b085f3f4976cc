package policy

import (
	"regexp"
	"strings"
	"unicode"
)

// Default returns the policy used when the operator configures none: every
// tool is allowed except those that run commands or code (see the package
// documentation for the exact rule), because an unconfigured kernel must
// not hand agents arbitrary command execution.
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

// isShellLike reports whether a tool id names a shell, an interpreter or a
// command runner, however it is spelled. The id is judged in several
// readings, and denied if any of them is shell-like:
//
//   - as given, folded to one canonical form (see canonicalTool);
//   - cut at its first NUL, where a C program would stop reading;
//   - its first word, as a command line's program name;
//
// each also without its trailing executable extensions (.exe, .bat, ...).
// A reading is shell-like when the whole of it, or the part after any
// separator, names one (isShellName): so "system.shell", "tools/bash",
// "C:\Windows\System32\cmd.exe" and "mcp.run_command" are shell-like while
// "shellcheck" and "fs.read_file" are not.
func isShellLike(toolID string) bool {
	readings := []string{toolID}
	if i := strings.IndexByte(toolID, 0); i >= 0 {
		readings = append(readings, toolID[:i])
	}
	if f := strings.Fields(toolID); len(f) > 1 {
		readings = append(readings, f[0])
	}
	for _, r := range readings {
		// Each extension stripped is another reading: "cmd.exe" is cmd,
		// and "cmd" is itself an extension.
		for id, more := canonicalTool(r), true; more; id, more = trimExtension(id) {
			if hasShellSuffix(id) {
				return true
			}
		}
	}
	return false
}

// canonicalTool folds a tool id for the denylist: control and format
// characters (NUL, zero-width and bidirectional marks) are dropped,
// full-width forms become ASCII, letters are lower-cased, and every run of
// separators ('.', '_', '-', '/', '\', ':', white space) becomes one '.',
// with none at either end.
func canonicalTool(id string) string {
	var b strings.Builder
	b.Grow(len(id))
	sep := false
	for _, r := range id {
		if r >= 0xFF01 && r <= 0xFF5E { // full-width ASCII
			r -= 0xFEE0
		}
		switch {
		case unicode.IsControl(r) && !unicode.IsSpace(r), unicode.Is(unicode.Cf, r):
			continue
		case unicode.IsSpace(r) || strings.ContainsRune("._-/\\:", r):
			sep = b.Len() > 0
			continue
		}
		if sep {
			b.WriteByte('.')
			sep = false
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// trimExtension strips the last extension of a canonical id if it names a
// program file rather than what the program does ("bash.exe" is bash), and
// reports whether it did.
func trimExtension(id string) (string, bool) {
	i := strings.LastIndexByte(id, '.')
	if i < 0 {
		return id, false
	}
	switch id[i+1:] {
	case "exe", "com", "bat", "cmd", "ps1", "psm1", "vbs", "wsf", "msi", "app", "bin", "sh", "run", "out":
		return id[:i], true
	}
	return id, false
}

// hasShellSuffix reports whether a canonical id, or its part after any '.',
// is shell-like.
func hasShellSuffix(id string) bool {
	for id != "" {
		if isShellName(strings.ReplaceAll(id, ".", "")) {
			return true
		}
		i := strings.IndexByte(id, '.')
		if i < 0 {
			return false
		}
		id = id[i+1:]
	}
	return false
}

// isShellName reports whether s, a canonical name with its separators
// removed (so that run_command, run-command and runCommand are all
// "runcommand"), names a shell, an interpreter or a command runner.
func isShellName(s string) bool {
	switch s {
	case "shell", "sh", "bash", "zsh", "fish", "dash", "ksh", "mksh", "csh", "tcsh", "ash", "busybox", "terminal",
		"cmd", "commandcom", "powershell", "pwsh",
		// privilege and remote execution
		"sudo", "su", "doas", "pkexec", "runas", "ssh", "rsh",
		// command runners
		"exec", "execve", "popen", "subprocess", "childprocess", "ossystem",
		"runcommand", "runcmd", "execcommand", "executecommand", "shellexec", "shellcommand", "runshell", "runscript",
		// code runners
		"repl", "codeinterpreter", "runcode", "execcode", "executecode", "runpython", "execpython", "executepython":
		return true
	}
	return interpreter.MatchString(s)
}

// interpreter matches script interpreters, with any version digits
// (python3, python311 from python3.11, node18).
var interpreter = regexp.MustCompile(`^(?:python|pythonw|pypy|node|nodejs|deno|bun|ruby|irb|perl|php|lua|luajit|tclsh|wish|osascript|cscript|wscript|mshta|jshell)[0-9]*$`)
