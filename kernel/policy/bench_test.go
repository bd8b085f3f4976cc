package policy

import (
	"encoding/json"
	"testing"
	"time"
)

// benchPolicy is a realistic 20-rule policy: a few hard denies, scoped
// allows with argument checks, approvals, labels, schedules and a limit.
const benchPolicy = `
rules:
  - {id: deny-shell, priority: 1, when: {tool_ids: ["shell", "bash", "*.exec"]}, then: {decision: deny, reason: no shells}}
  - {id: deny-secrets, priority: 2, when: {tool_id: "vault_*"}, then: {decision: deny}}
  - id: deny-rm
    priority: 3
    when:
      tool_id: "fs_delete"
      arguments: [{field: path, pattern: "^/(etc|usr|bin|var)"}]
    then: {decision: deny, reason: system paths}
  - {id: deny-long-runs, priority: 4, when: {min_step_count: 500}, then: {decision: deny}}
  - {id: deny-stale, priority: 5, when: {min_duration_ms: 86400000}, then: {decision: deny}}
  - {id: approve-prod-writes, priority: 10, when: {tool_ids: ["fs_write", "db_write"], labels: {env: prod}}, then: {decision: require_approval}}
  - {id: approve-off-hours, priority: 11, when: {tool_id: "deploy_*", schedule: "Sat-Sun 00:00-24:00 UTC"}, then: {decision: require_approval}}
  - id: allow-deploy
    priority: 12
    when:
      tool_id: "deploy_*"
      agent_ids: [release-bot, ops]
      schedule: "Mon-Fri 09:00-17:00 Europe/Berlin"
    then: {decision: allow, timeout_ms: 600000}
  - id: allow-http
    priority: 20
    when:
      tool_id: "http_*"
      arguments:
        - {field: url, required: true, pattern: "^https://", max_length: 2048}
        - {field: method, one_of: [GET, HEAD]}
        - {field: timeout, min: 1, max: 60}
    then: {decision: allow, timeout_ms: 60000}
    rate_limit: {max: 600, window: 1m}
  - {id: allow-web-search, priority: 21, when: {tool_ids: ["web_search", "web_fetch"], agent_ids: [researcher, writer]}, then: {decision: allow}}
  - {id: allow-docs, priority: 22, when: {tool_id: "doc_*"}, then: {decision: allow}}
  - {id: allow-fs-read, priority: 23, when: {tool_ids: ["fs_read", "fs_list", "fs_stat"]}, then: {decision: allow}}
  - {id: approve-fs-write, priority: 24, when: {tool_id: "fs_write"}, then: {decision: require_approval}}
  - {id: allow-db-read, priority: 25, when: {tool_id: "db_query", arguments: [{field: sql, pattern: "(?i)^\\s*select\\b"}]}, then: {decision: allow}}
  - {id: approve-db-write, priority: 26, when: {tool_id: "db_*"}, then: {decision: require_approval}}
  - {id: allow-calc, priority: 27, when: {tool_id: "calc_*"}, then: {decision: allow}}
  - {id: allow-mail-draft, priority: 28, when: {tool_id: "mail_draft", labels: {team: support}}, then: {decision: allow}}
  - {id: approve-mail-send, priority: 29, when: {tool_id: "mail_send"}, then: {decision: require_approval}}
  - {id: allow-staging, priority: 30, when: {labels: {env: staging}, agent_id: tester}, then: {decision: allow}}
  - {id: approve-rest, priority: 40, when: {action: tool.invoke}, then: {decision: require_approval}}
default: {decision: deny}
`

func BenchmarkEvaluate(b *testing.B) {
	e, err := Parse([]byte(benchPolicy), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	labels := map[string]string{"env": "prod", "team": "support"}
	now := time.Date(2025, time.January, 6, 10, 0, 0, 0, time.UTC)
	inputs := []struct {
		rule string
		in   Input
	}{
		{"allow-http", Input{ToolID: "http_get", AgentID: "researcher", Labels: labels, StepCount: 40, Elapsed: time.Minute, Now: now,
			Arguments: json.RawMessage(`{"url":"https://example.com/a","method":"GET","timeout":10}`)}},
		{"allow-web-search", Input{ToolID: "web_search", AgentID: "researcher", Labels: labels, StepCount: 40, Elapsed: time.Minute, Now: now,
			Arguments: json.RawMessage(`{"q":"policy engines"}`)}},
		{"allow-db-read", Input{ToolID: "db_query", AgentID: "analyst", Labels: labels, StepCount: 40, Elapsed: time.Minute, Now: now,
			Arguments: json.RawMessage(`{"sql":"select * from t"}`)}},
		{"approve-rest", Input{ToolID: "unknown_tool", AgentID: "analyst", Labels: labels, StepCount: 40, Elapsed: time.Minute, Now: now}},
	}
	for _, tt := range inputs {
		b.Run(tt.in.ToolID, func(b *testing.B) {
			in := tt.in
			b.ReportAllocs()
			for b.Loop() {
				// 100ms apart keeps allow-http just under its 600/min limit.
				in.Now = in.Now.Add(100 * time.Millisecond)
				if got := e.Evaluate(in); got.RuleID != tt.rule || got.RateLimited {
					b.Fatalf("Evaluate = %+v, want rule %s", got, tt.rule)
				}
			}
		})
	}
}
