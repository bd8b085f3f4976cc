package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// monday10 is Monday 2025-01-06 10:00 UTC, the default evaluation time.
var monday10 = time.Date(2025, time.January, 6, 10, 0, 0, 0, time.UTC)

func mustParse(t testing.TB, src string) *Engine {
	t.Helper()
	e, err := Parse([]byte(src), "test.yaml")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return e
}

// matchesWhen reports whether a single allow rule with the given flow-style
// `when` matches in.
func matchesWhen(t *testing.T, when string, in Input) bool {
	t.Helper()
	e := mustParse(t, fmt.Sprintf("rules:\n  - id: r\n    priority: 1\n    when: %s\n    then: {decision: allow}\n", when))
	if in.Now.IsZero() {
		in.Now = monday10
	}
	return e.Evaluate(in).RuleID == "r"
}

func TestWhenConditions(t *testing.T) {
	tests := []struct {
		name string
		when string
		in   Input
		want bool
	}{
		{"empty when matches everything", "{}", Input{ToolID: "anything"}, true},
		{"action tool.invoke", "{action: tool.invoke}", Input{ToolID: "x"}, true},
		{"action glob", `{action: "tool.*"}`, Input{ToolID: "x"}, true},
		{"other action never matches", "{action: step.create}", Input{ToolID: "x"}, false},

		{"tool_id glob match", `{tool_id: "web_*"}`, Input{ToolID: "web_search"}, true},
		{"tool_id glob miss", `{tool_id: "web_*"}`, Input{ToolID: "doc_search"}, false},
		{"tool_id star stops at slash", `{tool_id: "web_*"}`, Input{ToolID: "web_a/b"}, false},
		{"tool_id question mark", `{tool_id: "fs_?"}`, Input{ToolID: "fs_r"}, true},
		{"tool_id class", `{tool_id: "fs_[rw]"}`, Input{ToolID: "fs_x"}, false},
		{"tool_id exact", `{tool_id: "shell"}`, Input{ToolID: "shell"}, true},
		{"bad glob compares literally", `{tool_id: "[web"}`, Input{ToolID: "[web"}, true},
		{"bad glob literal miss", `{tool_id: "[web"}`, Input{ToolID: "w"}, false},

		{"tool_ids any-of first", `{tool_ids: ["web_*", "doc_*"]}`, Input{ToolID: "web_x"}, true},
		{"tool_ids any-of second", `{tool_ids: ["web_*", "doc_*"]}`, Input{ToolID: "doc_x"}, true},
		{"tool_ids miss", `{tool_ids: ["web_*", "doc_*"]}`, Input{ToolID: "fs_x"}, false},
		{"tool_id and tool_ids both required", `{tool_id: "web_*", tool_ids: ["doc_*"]}`, Input{ToolID: "web_x"}, false},

		{"agent_id exact", "{agent_id: researcher}", Input{AgentID: "researcher"}, true},
		{"agent_id is not a glob or prefix", "{agent_id: researcher}", Input{AgentID: "researcher2"}, false},
		{"agent_ids any-of", "{agent_ids: [a, b]}", Input{AgentID: "b"}, true},
		{"agent_ids miss", "{agent_ids: [a, b]}", Input{AgentID: "c"}, false},

		{"labels match", "{labels: {env: prod, team: x}}", Input{Labels: map[string]string{"env": "prod", "team": "x", "extra": "y"}}, true},
		{"labels value differs", "{labels: {env: prod}}", Input{Labels: map[string]string{"env": "dev"}}, false},
		{"labels missing", "{labels: {env: prod}}", Input{Labels: map[string]string{"team": "x"}}, false},
		{"labels nil input", "{labels: {env: prod}}", Input{}, false},
		{"labels empty value needs the label", `{labels: {env: ""}}`, Input{}, false},

		{"min_step_count zero", "{min_step_count: 0}", Input{StepCount: 0}, true},
		{"min_step_count below", "{min_step_count: 100}", Input{StepCount: 99}, false},
		{"min_step_count equal", "{min_step_count: 100}", Input{StepCount: 100}, true},

		{"min_duration_ms below", "{min_duration_ms: 3600000}", Input{Elapsed: time.Hour - time.Millisecond}, false},
		{"min_duration_ms equal", "{min_duration_ms: 3600000}", Input{Elapsed: time.Hour}, true},

		{"schedule inside", `{schedule: "Mon-Fri 09:00-17:00 UTC"}`, Input{Now: monday10}, true},
		{"schedule outside", `{schedule: "Mon-Fri 09:00-17:00 UTC"}`, Input{Now: monday10.Add(8 * time.Hour)}, false},

		{"arguments nil never matches", "{arguments: [{field: x, max: 1}]}", Input{}, false},
		{"arguments null never matches", "{arguments: [{field: x, max: 1}]}", Input{Arguments: json.RawMessage(`null`)}, false},
		{"arguments array never matches", "{arguments: [{field: x, max: 1}]}", Input{Arguments: json.RawMessage(`[1]`)}, false},
		{"arguments string never matches", "{arguments: [{field: x, max: 1}]}", Input{Arguments: json.RawMessage(`"x"`)}, false},
		{"arguments invalid JSON never matches", "{arguments: [{field: x, max: 1}]}", Input{Arguments: json.RawMessage(`{`)}, false},
		{"arguments empty object, key optional", "{arguments: [{field: x, max: 1}]}", Input{Arguments: json.RawMessage(`{}`)}, true},

		{"all conditions together", `{action: tool.invoke, tool_id: "web_*", agent_id: r, labels: {env: prod}, min_step_count: 1, min_duration_ms: 1, schedule: "Mon 09:00-11:00", arguments: [{field: q, required: true}]}`,
			Input{ToolID: "web_x", AgentID: "r", Labels: map[string]string{"env": "prod"}, StepCount: 1, Elapsed: time.Millisecond, Arguments: json.RawMessage(`{"q":"go"}`)}, true},
		{"all conditions, one fails", `{action: tool.invoke, tool_id: "web_*", agent_id: r, labels: {env: prod}, min_step_count: 2, arguments: [{field: q, required: true}]}`,
			Input{ToolID: "web_x", AgentID: "r", Labels: map[string]string{"env": "prod"}, StepCount: 1, Arguments: json.RawMessage(`{"q":"go"}`)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := matchesWhen(t, tt.when, tt.in); got != tt.want {
				t.Errorf("match = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestArgumentPredicates(t *testing.T) {
	tests := []struct {
		name string
		pred string
		args string
		want bool
	}{
		{"pattern match", `{field: command, pattern: "^(ls|cat)"}`, `{"command":"ls -la"}`, true},
		{"pattern miss", `{field: command, pattern: "^(ls|cat)"}`, `{"command":"rm -rf /"}`, false},
		{"pattern unanchored", `{field: command, pattern: "rm"}`, `{"command":"sudo rm x"}`, true},
		{"pattern on number is a type mismatch", `{field: command, pattern: "1"}`, `{"command":1}`, false},
		{"pattern on object is a type mismatch", `{field: command, pattern: "."}`, `{"command":{"a":"b"}}`, false},
		{"pattern on null is a type mismatch", `{field: command, pattern: "."}`, `{"command":null}`, false},
		{"pattern missing key passes", `{field: command, pattern: "^ls"}`, `{"other":"x"}`, true},

		{"one_of in", `{field: mode, one_of: [read, list]}`, `{"mode":"list"}`, true},
		{"one_of out", `{field: mode, one_of: [read, list]}`, `{"mode":"write"}`, false},
		{"one_of is case-sensitive", `{field: mode, one_of: [read]}`, `{"mode":"READ"}`, false},
		{"one_of type mismatch", `{field: mode, one_of: ["1"]}`, `{"mode":1}`, false},
		{"one_of missing key passes", `{field: mode, one_of: [read]}`, `{}`, true},

		{"min/max inside", `{field: n, min: 0, max: 30}`, `{"n":12.5}`, true},
		{"min boundary inclusive", `{field: n, min: 0, max: 30}`, `{"n":0}`, true},
		{"max boundary inclusive", `{field: n, min: 0, max: 30}`, `{"n":30}`, true},
		{"below min", `{field: n, min: 0}`, `{"n":-1}`, false},
		{"above max", `{field: n, max: 30}`, `{"n":31}`, false},
		{"number as string is a type mismatch", `{field: n, max: 30}`, `{"n":"5"}`, false},
		{"bool is a type mismatch", `{field: n, min: 0}`, `{"n":true}`, false},
		{"numeric missing key passes", `{field: n, max: 30}`, `{}`, true},

		{"max_length counts runes", `{field: s, max_length: 5}`, `{"s":"héllo"}`, true},
		{"max_length exceeded", `{field: s, max_length: 5}`, `{"s":"héllo!"}`, false},
		{"max_length zero allows empty", `{field: s, max_length: 0}`, `{"s":""}`, true},
		{"max_length type mismatch", `{field: s, max_length: 5}`, `{"s":12}`, false},

		{"required present", `{field: path, required: true}`, `{"path":"/tmp"}`, true},
		{"required missing", `{field: path, required: true}`, `{}`, false},
		{"required empty string", `{field: path, required: true}`, `{"path":""}`, false},
		{"required non-string value", `{field: path, required: true}`, `{"path":3}`, true},
		{"required with pattern, empty string", `{field: path, required: true, pattern: ""}`, `{"path":""}`, false},
		{"required with max, missing", `{field: n, required: true, max: 3}`, `{}`, false},
		{"required with max, present", `{field: n, required: true, max: 3}`, `{"n":3}`, true},

		{"string constraints combine", `{field: s, pattern: "^a", one_of: [ab, ac], max_length: 2}`, `{"s":"ac"}`, true},
		{"string constraints combine, one fails", `{field: s, pattern: "^a", one_of: [ab, abc], max_length: 2}`, `{"s":"abc"}`, false},
		{"predicates are ANDed", `{field: a, required: true}, {field: b, max: 1}`, `{"a":"x","b":2}`, false},
		{"predicates are ANDed, all hold", `{field: a, required: true}, {field: b, max: 1}`, `{"a":"x","b":1}`, true},
		{"only top-level keys", `{field: "a.b", required: true}`, `{"a":{"b":"x"}}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := Input{Arguments: json.RawMessage(tt.args)}
			if got := matchesWhen(t, "{arguments: ["+tt.pred+"]}", in); got != tt.want {
				t.Errorf("match = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPriorityOrderAndResult(t *testing.T) {
	e := mustParse(t, `
rules:
  - id: allow-all
    priority: 100
    then: {decision: allow, timeout_ms: 5000}
  - id: approve-fs-write
    priority: 20
    when: {tool_id: "fs_write"}
    then: {decision: require_approval, reason: "writes need a human", timeout_ms: 9000}
  - id: deny-shell
    priority: 5
    when: {tool_ids: ["shell", "fs_*"], labels: {env: prod}}
    then: {decision: deny}
`)
	prod := map[string]string{"env": "prod"}
	tests := []struct {
		name string
		in   Input
		want Result
	}{
		{"lowest priority checked first", Input{ToolID: "fs_write", Labels: prod},
			Result{Decision: Deny, RuleID: "deny-shell", Reason: `matched policy rule "deny-shell"`}},
		{"next rule when first misses", Input{ToolID: "fs_write"},
			Result{Decision: RequireApproval, RuleID: "approve-fs-write", Reason: "writes need a human", Timeout: 9 * time.Second}},
		{"catch-all last, timeout for allow", Input{ToolID: "web"},
			Result{Decision: Allow, RuleID: "allow-all", Reason: `matched policy rule "allow-all"`, Timeout: 5 * time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := e.Evaluate(tt.in); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Evaluate = %+v, want %+v", got, tt.want)
			}
		})
	}
	if got := e.Source(); got != "test.yaml" {
		t.Errorf("Source = %q", got)
	}
}

func TestDefaultDecision(t *testing.T) {
	const rules = "rules:\n  - {id: web, priority: 1, when: {tool_id: web}, then: {decision: allow}}\n"
	tests := []struct {
		name string
		dflt string
		want Result
	}{
		{"left out is deny", "",
			Result{Decision: Deny, RuleID: "default", Reason: "No explicit allow rule matched"}},
		{"explicit deny", "default: {decision: deny, reason: nope}",
			Result{Decision: Deny, RuleID: "default", Reason: "nope"}},
		{"explicit allow", "default: {decision: allow, reason: open}",
			Result{Decision: Allow, RuleID: "default", Reason: "open"}},
		{"require_approval without reason", "default: {decision: require_approval}",
			Result{Decision: RequireApproval, RuleID: "default", Reason: "no rule matched; the policy default is require_approval"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustParse(t, rules+tt.dflt)
			if got := e.Evaluate(Input{ToolID: "other"}); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Evaluate = %+v, want %+v", got, tt.want)
			}
			if got := e.Evaluate(Input{ToolID: "web"}); got.RuleID != "web" {
				t.Errorf("rule not applied before default: %+v", got)
			}
		})
	}
	t.Run("default only", func(t *testing.T) {
		e := mustParse(t, "default: {decision: allow, reason: open}")
		want := Result{Decision: Allow, RuleID: "default", Reason: "open"}
		if got := e.Evaluate(Input{ToolID: "web"}); !reflect.DeepEqual(got, want) {
			t.Errorf("Evaluate = %+v, want %+v", got, want)
		}
	})
}

// Deny has no step to time; an approved step keeps its rule's timeout.
func TestTimeoutForAllowAndApproval(t *testing.T) {
	e := mustParse(t, `
rules:
  - {id: a, priority: 1, when: {tool_id: a}, then: {decision: allow, timeout_ms: 30000}}
  - {id: d, priority: 2, when: {tool_id: d}, then: {decision: deny, timeout_ms: 30000}}
  - {id: r, priority: 3, when: {tool_id: r}, then: {decision: require_approval, timeout_ms: 30000}}
`)
	for tool, want := range map[string]time.Duration{"a": 30 * time.Second, "d": 0, "r": 30 * time.Second} {
		if got := e.Evaluate(Input{ToolID: tool}).Timeout; got != want {
			t.Errorf("tool %s: Timeout = %v, want %v", tool, got, want)
		}
	}
}

func TestApprovalExpiry(t *testing.T) {
	e := mustParse(t, `
rules:
  - {id: a, priority: 1, when: {tool_id: a}, then: {decision: require_approval, expires_in: 10m, on_expiry: allow}}
  - {id: b, priority: 2, when: {tool_id: b}, then: {decision: require_approval, expires_in: 90s}}
  - {id: c, priority: 3, when: {tool_id: c}, then: {decision: require_approval}}
`)
	for tool, want := range map[string]Result{
		"a": {Decision: RequireApproval, RuleID: "a", ExpiresIn: 10 * time.Minute, OnExpiry: Allow},
		"b": {Decision: RequireApproval, RuleID: "b", ExpiresIn: 90 * time.Second},
		"c": {Decision: RequireApproval, RuleID: "c"},
	} {
		got := e.Evaluate(Input{ToolID: tool})
		got.Reason = ""
		if !reflect.DeepEqual(got, want) {
			t.Errorf("tool %s: %+v, want %+v", tool, got, want)
		}
	}
	for name, src := range map[string]string{
		"expiry on allow": `rules: [{id: x, priority: 1, then: {decision: allow, expires_in: 1m}}]`,
		"bad duration":    `rules: [{id: x, priority: 1, then: {decision: require_approval, expires_in: soon}}]`,
		"negative":        `rules: [{id: x, priority: 1, then: {decision: require_approval, expires_in: -1m}}]`,
		"bad on_expiry":   `rules: [{id: x, priority: 1, then: {decision: require_approval, on_expiry: maybe}}]`,
	} {
		if _, err := Parse([]byte(src), name); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("%s: err = %v, want ErrInvalidPolicy", name, err)
		}
	}
}

func TestApprovalResponders(t *testing.T) {
	e := mustParse(t, `
rules:
  - {id: a, priority: 1, when: {tool_id: a}, then: {decision: require_approval, responders: [bob, carol]}}
  - {id: b, priority: 2, when: {tool_id: b}, then: {decision: require_approval}}
`)
	if got := e.Evaluate(Input{ToolID: "a"}).Responders; !reflect.DeepEqual(got, []string{"bob", "carol"}) {
		t.Errorf("rule a's responders: %q", got)
	}
	if got := e.Evaluate(Input{ToolID: "b"}).Responders; got != nil {
		t.Errorf("rule b's responders: %q, want none", got)
	}
	many := "[" + strings.Repeat("p,", maxResponders) + "p]"
	for name, src := range map[string]string{
		"responders on allow": `rules: [{id: x, priority: 1, then: {decision: allow, responders: [bob]}}]`,
		"an empty responder":  `rules: [{id: x, priority: 1, then: {decision: require_approval, responders: [""]}}]`,
		"a control character": `rules: [{id: x, priority: 1, then: {decision: require_approval, responders: ["bo\nb"]}}]`,
		"too many":            `rules: [{id: x, priority: 1, then: {decision: require_approval, responders: ` + many + `}}]`,
	} {
		if _, err := Parse([]byte(src), name); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("%s: err = %v, want ErrInvalidPolicy", name, err)
		}
	}
}
