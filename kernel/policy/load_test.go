package policy

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// ruleWith builds a one-rule file; extra is spliced into the rule mapping.
func ruleWith(extra string) string {
	return "rules:\n  - id: r1\n    priority: 1\n    then: {decision: allow}\n" + extra
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string // substrings of the error
	}{
		{"empty file", "", []string{"file is empty"}},
		{"comment only", "# nothing\n", []string{"file is empty"}},
		{"two documents", "rules: []\n---\nrules: []\n", []string{"more than one YAML document"}},
		{"top level list", "- id: x\n", []string{"top level must be a mapping"}},
		{"syntax error", "rules: [\n", []string{"yaml"}},
		{"unknown top-level key", "rulez: []\n", []string{`unknown key "rulez"`, "line 1"}},
		{"unknown rule key", ruleWith("    whn: {}\n"), []string{`rule "r1"`, `unknown key "whn"`}},
		{"unknown when key", ruleWith("    when: {tool: x}\n"), []string{`rule "r1"`, `unknown key "when.tool"`}},
		{"unknown predicate key", ruleWith("    when: {arguments: [{field: a, regex: x}]}\n"), []string{`unknown key "when.arguments[0].regex"`}},
		{"rate_limit inside then", "rules:\n  - {id: r1, priority: 1, then: {decision: allow, rate_limit: {max: 1, window: 1m}}}\n",
			[]string{`unknown key "then.rate_limit"`}},
		{"unknown default key", "default: {decision: deny, reasn: x}\n", []string{`unknown key "reasn"`}},
		{"wrong type", "rules:\n  - {id: r1, priority: high, then: {decision: allow}}\n", []string{`rule "r1"`, "cannot unmarshal"}},
		{"rules not a list", "rules: {id: x}\n", []string{"cannot unmarshal"}},

		{"missing id", "rules:\n  - {priority: 1, then: {decision: allow}}\n", []string{"rule #1", "id is required"}},
		{"missing id names position", "rules:\n  - {id: a, priority: 1, then: {decision: allow}}\n  - {priority: 2}\n", []string{"rule #2", "id is required"}},
		{"bad decision", "rules:\n  - {id: r1, priority: 1, then: {decision: maybe}}\n", []string{`rule "r1"`, `unknown decision "maybe"`}},
		{"missing then", "rules:\n  - {id: r1, priority: 1}\n", []string{`rule "r1"`, "decision is required"}},
		{"bad default decision", "default: {decision: allow_all}\n", []string{"default", `unknown decision "allow_all"`}},
		{"duplicate id", "rules:\n  - {id: a, priority: 1, then: {decision: allow}}\n  - {id: a, priority: 2, then: {decision: deny}}\n",
			[]string{`rule "a"`, "duplicate rule id"}},
		{"duplicate priority", "rules:\n  - {id: a, priority: 1, then: {decision: allow}}\n  - {id: b, priority: 1, then: {decision: deny}}\n",
			[]string{`rule "b"`, "duplicate priority 1", `rule "a"`}},
		{"negative timeout", "rules:\n  - {id: r1, priority: 1, then: {decision: allow, timeout_ms: -1}}\n", []string{"timeout_ms"}},
		{"overflowing timeout", "rules:\n  - {id: r1, priority: 1, then: {decision: allow, timeout_ms: 9223372036854775807}}\n", []string{"timeout_ms", "too large"}},

		{"predicate without constraint", ruleWith("    when: {arguments: [{field: a}]}\n"), []string{`rule "r1"`, "when.arguments[0]", "at least one of"}},
		{"predicate with required false only", ruleWith("    when: {arguments: [{field: a, required: false}]}\n"), []string{"at least one of"}},
		{"predicate without field", ruleWith("    when: {arguments: [{max: 1}]}\n"), []string{"field is required"}},
		{"predicate mixing types", ruleWith("    when: {arguments: [{field: a, pattern: x, max: 1}]}\n"), []string{"mixes string constraints"}},
		{"bad regex", ruleWith("    when: {arguments: [{field: a, pattern: \"(\"}]}\n"), []string{`rule "r1"`, "pattern", "missing closing )"}},
		{"empty one_of", ruleWith("    when: {arguments: [{field: a, one_of: []}]}\n"), []string{"one_of: list must not be empty"}},
		{"negative max_length", ruleWith("    when: {arguments: [{field: a, max_length: -1}]}\n"), []string{"max_length must not be negative"}},
		{"min above max", ruleWith("    when: {arguments: [{field: a, min: 5, max: 1}]}\n"), []string{"min 5 is greater than max 1"}},
		{"empty arguments", ruleWith("    when: {arguments: []}\n"), []string{"arguments: list must not be empty"}},
		{"empty tool_ids", ruleWith("    when: {tool_ids: []}\n"), []string{"when.tool_ids: list must not be empty"}},
		{"empty agent_ids", ruleWith("    when: {agent_ids: []}\n"), []string{"when.agent_ids: list must not be empty"}},
		{"negative min_step_count", ruleWith("    when: {min_step_count: -1}\n"), []string{`rule "r1"`, "min_step_count must not be negative"}},
		{"zero min_duration_ms", ruleWith("    when: {min_duration_ms: 0}\n"), []string{"min_duration_ms must be greater than 0"}},
		{"negative min_duration_ms", ruleWith("    when: {min_duration_ms: -5}\n"), []string{"min_duration_ms must be greater than 0"}},
		{"bad schedule", ruleWith("    when: {schedule: \"weekdays 9-5\"}\n"), []string{`rule "r1"`, "when.schedule"}},
		{"unknown zone", ruleWith("    when: {schedule: \"Mon-Fri 09:00-17:00 Mars/Olympus\"}\n"), []string{"zone", "Mars/Olympus"}},

		{"rate_limit max 0", ruleWith("    rate_limit: {max: 0, window: 1m}\n"), []string{`rule "r1"`, "rate_limit: max must be greater than 0"}},
		{"rate_limit bad window", ruleWith("    rate_limit: {max: 1, window: \"1 minute\"}\n"), []string{"rate_limit: window"}},
		{"rate_limit zero window", ruleWith("    rate_limit: {max: 1, window: 0s}\n"), []string{"window must be positive"}},
		{"rate_limit missing window", ruleWith("    rate_limit: {max: 1}\n"), []string{"rate_limit: window"}},
		{"rate_limit validated on deny rules too", "rules:\n  - {id: r1, priority: 1, then: {decision: deny}, rate_limit: {max: 0, window: 1m}}\n",
			[]string{"rate_limit: max"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.src), "test.yaml")
			if err == nil {
				t.Fatal("Parse succeeded, want error")
			}
			if !errors.Is(err, ErrInvalidPolicy) {
				t.Errorf("error %q does not match ErrInvalidPolicy", err)
			}
			for _, want := range append([]string{"test.yaml"}, tt.want...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

func TestParseAcceptsAnchorsAndMerge(t *testing.T) {
	e := mustParse(t, `
rules:
  - &base
    id: a
    priority: 1
    when: {tool_id: a}
    then: {decision: allow}
  - <<: *base
    id: b
    priority: 2
    when: {tool_id: b}
`)
	if got := e.Evaluate(Input{ToolID: "b"}); got.RuleID != "b" || got.Decision != Allow {
		t.Errorf("Evaluate = %+v", got)
	}
}

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLoadFile(t *testing.T) {
	dir := writeFiles(t, map[string]string{"policy.yaml": "rules:\n  - {id: web, priority: 1, when: {tool_id: web}, then: {decision: allow}}\n"})
	p := filepath.Join(dir, "policy.yaml")
	e, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if e.Source() != p {
		t.Errorf("Source = %q, want %q", e.Source(), p)
	}
	// A single file applies to every agent.
	for _, agent := range []string{"", "a", "b"} {
		if got := e.Evaluate(Input{ToolID: "web", AgentID: agent}); got.RuleID != "web" {
			t.Errorf("agent %q: Evaluate = %+v", agent, got)
		}
	}

	_, err = Load(filepath.Join(dir, "missing.yaml"))
	if !errors.Is(err, ErrInvalidPolicy) || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("Load(missing) error = %v", err)
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"_global.yaml": `
rules:
  - {id: g-deny-shell, priority: 1, when: {tool_id: shell}, then: {decision: deny, reason: no shells}}
  - {id: g-allow-fs, priority: 100, when: {tool_id: "fs_*"}, then: {decision: allow}}
default: {decision: allow, reason: global default}
`,
		"researcher.yaml": `
rules:
  - {id: r-allow-web, priority: 10, when: {tool_id: "web_*"}, then: {decision: allow}}
  - {id: r-deny-write, priority: 50, when: {tool_id: fs_write}, then: {decision: deny}}
`,
		"writer.yml": `
rules:
  - {id: w-approve-fs, priority: 5, when: {tool_id: "fs_*"}, then: {decision: require_approval}}
default: {decision: require_approval, reason: writer default}
`,
		"README.md":         "not a policy",
		"nested/other.yaml": "not: [valid",
	})
	e, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if e.Source() != dir {
		t.Errorf("Source = %q, want %q", e.Source(), dir)
	}
	tests := []struct {
		agent, tool string
		rule        string
		decision    Decision
		reason      string
	}{
		{"researcher", "web_search", "r-allow-web", Allow, ""},
		{"researcher", "shell", "g-deny-shell", Deny, "no shells"},
		{"researcher", "fs_write", "r-deny-write", Deny, ""},
		{"researcher", "fs_read", "g-allow-fs", Allow, ""},
		// The agent file has no default: built-in deny, not the global allow.
		{"researcher", "other", "default", Deny, "No explicit allow rule matched"},
		{"writer", "fs_read", "w-approve-fs", RequireApproval, ""},
		{"writer", "shell", "g-deny-shell", Deny, "no shells"},
		{"writer", "web_search", "default", RequireApproval, "writer default"},
		// Agents without a file get the global rules and default.
		{"stranger", "fs_read", "g-allow-fs", Allow, ""},
		{"stranger", "web_search", "default", Allow, "global default"},
		{"", "shell", "g-deny-shell", Deny, "no shells"},
	}
	for _, tt := range tests {
		got := e.Evaluate(Input{AgentID: tt.agent, ToolID: tt.tool})
		if got.RuleID != tt.rule || got.Decision != tt.decision || (tt.reason != "" && got.Reason != tt.reason) {
			t.Errorf("agent %q tool %q: got %+v, want rule %s %s %q", tt.agent, tt.tool, got, tt.rule, tt.decision, tt.reason)
		}
	}
}

func TestLoadDirectoryWithoutGlobal(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"researcher.yaml": "rules:\n  - {id: web, priority: 1, when: {tool_id: web}, then: {decision: allow}}\n",
	})
	e, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Evaluate(Input{AgentID: "researcher", ToolID: "web"}); got.RuleID != "web" {
		t.Errorf("researcher: %+v", got)
	}
	want := Result{Decision: Deny, RuleID: "agent-default", Reason: `no policy configured for agent "ghost"`}
	if got := e.Evaluate(Input{AgentID: "ghost", ToolID: "web"}); !reflect.DeepEqual(got, want) {
		t.Errorf("ghost: got %+v, want %+v", got, want)
	}
}

func TestLoadDirectoryErrors(t *testing.T) {
	const global = "rules:\n  - {id: g, priority: 1, then: {decision: deny}}\n"
	tests := []struct {
		name  string
		files map[string]string
		want  []string
	}{
		{"empty directory", map[string]string{}, []string{"no *.yaml or *.yml policy file"}},
		{"only other files", map[string]string{"notes.txt": "x", "sub/a.yaml": "rules: []"}, []string{"no *.yaml or *.yml policy file"}},
		{"duplicate id across agent and global", map[string]string{
			"_global.yaml": global,
			"a.yaml":       "rules:\n  - {id: g, priority: 2, then: {decision: allow}}\n",
		}, []string{"a.yaml", `rule "g"`, "duplicate rule id", "_global.yaml"}},
		{"duplicate priority across agent and global", map[string]string{
			"_global.yaml": global,
			"a.yaml":       "rules:\n  - {id: a, priority: 1, then: {decision: allow}}\n",
		}, []string{"a.yaml", `rule "a"`, "duplicate priority 1", `rule "g"`, "_global.yaml"}},
		{"agent configured twice", map[string]string{"a.yaml": global, "a.yml": global}, []string{"a.yml", `agent "a" is also configured by`}},
		{"invalid global", map[string]string{"_global.yml": "rules:\n  - {id: g, priority: 1, then: {decision: nope}}\n", "a.yaml": global},
			[]string{"_global.yml", `rule "g"`, "unknown decision"}},
		{"invalid agent file", map[string]string{"_global.yaml": global, "b.yaml": "rules:\n  - {id: b, priority: 2, tool: x}\n"},
			[]string{"b.yaml", `rule "b"`, `unknown key "tool"`}},
		{"empty agent id", map[string]string{".yaml": global}, []string{"empty agent id"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeFiles(t, tt.files)
			_, err := Load(dir)
			if err == nil {
				t.Fatal("Load succeeded, want error")
			}
			if !errors.Is(err, ErrInvalidPolicy) {
				t.Errorf("error %q does not match ErrInvalidPolicy", err)
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}
