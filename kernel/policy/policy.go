// Package policy decides, for every tool invocation an agent attempts,
// whether the kernel allows it, denies it, or holds it for human approval.
// Every decision names the rule that produced it and a reason, so that
// denials and approval requests can be explained to operators.
//
// # Policy files
//
// A policy file is YAML with a list of rules and an optional default:
//
//	rules:
//	  - id: "allow-web"                # required, unique
//	    priority: 10                   # unique; lower is checked first
//	    when:                          # all given conditions must hold
//	      action: "tool.invoke"        # glob; the only action evaluated is tool.invoke
//	      tool_id: "web_*"             # glob (path.Match syntax)
//	      tool_ids: ["web_*", "doc_*"] # any-of globs
//	      agent_id: "researcher"       # exact
//	      agent_ids: ["a", "b"]        # any-of exact
//	      labels: {env: "prod"}        # every pair must equal an execution label
//	      arguments:                   # predicates on top-level argument keys
//	        - field: "command"
//	          pattern: "^(ls|cat)"     # RE2, unanchored, strings only
//	          one_of: ["a", "b"]       # strings only
//	          min: 0                   # numbers only, inclusive
//	          max: 30                  # numbers only, inclusive
//	          max_length: 256          # strings only, counted in runes
//	          required: true           # key must exist and must not be ""
//	      min_step_count: 100          # steps created so far >= N
//	      min_duration_ms: 3600000     # time since the execution was created >= N ms
//	      schedule: "Mon-Fri 09:00-17:00 UTC"
//	    then:
//	      decision: allow              # allow | deny | require_approval
//	      reason: "text"
//	      timeout_ms: 30000            # step deadline; honoured only for allow
//	    rate_limit:                    # honoured only for allow
//	      max: 30
//	      window: "1m"
//	default:
//	  decision: deny
//	  reason: "No explicit allow rule matched"
//
// Rules are checked in ascending priority and the first match wins. When no
// rule matches, the file's default applies; without one the decision is deny
// with rule id "default" and reason "No explicit allow rule matched".
//
// Loading is strict because a typo in a security policy must not silently
// widen or narrow it: unknown keys, unknown decisions, empty lists, invalid
// regular expressions, schedules or zones, predicates without a constraint
// and predicates mixing string and numeric constraints (which could never
// match) are all load errors. Globs that path.Match rejects are compared
// literally instead, as the original engine did. Every load error matches
// [ErrInvalidPolicy] and names the file and, when known, the rule.
//
// # Argument predicates
//
// A missing key passes unless the predicate is required. A value of the
// wrong type for a constraint fails. When the invocation has no arguments,
// or they are not a JSON object, rules with argument predicates never match.
//
// # Schedules
//
// A schedule is "<days> <HH:MM-HH:MM> [zone]". Days are a comma list of
// Sun..Sat entries, each a single day or a range that may wrap (Fri-Mon).
// The time window is [start, end), "24:00" is accepted as an end, and a
// window whose end is before its start wraps midnight; the part after
// midnight belongs to the day the window started, so "Fri 22:00-02:00"
// covers Saturday 01:00 but not Friday 01:00. The zone is an IANA name and
// defaults to UTC; the tz database is embedded so zones load on hosts
// without one.
//
// # Directory mode
//
// [Load] on a directory reads every *.yaml and *.yml file in it (not
// recursively). The file name without extension is the agent id, and
// _global.yaml (or _global.yml) holds rules shared by every agent. An
// agent's rule set is its own rules plus the global rules, ordered by
// priority together; ids and priorities must be unique across that merged
// set. Only the agent file's default applies to the agent: without one the
// built-in deny applies and the global default is ignored. An agent without
// a file gets the global rules and the global default. An agent without a
// file when there is no global file is denied with rule id "agent-default".
//
// # Rate limits
//
// When the matched rule allows and has a rate_limit, allowed calls are
// counted in a sliding window per rule and per agent/tool pair, and a call
// over the limit is denied with RateLimited set. Denied and approval-bound
// calls are not counted. Limiter state is kept in memory per [Engine]:
// expired pairs are pruned on access and by a periodic sweep, and at most
// 100,000 pairs are tracked. Past that cap a call for a new pair is denied
// as rate limited until existing pairs expire; evicting live pairs instead
// would let a caller reset its own limit by flooding new tool ids.
//
// # Built-in default
//
// [Default] is used when the operator configures no policy. It allows every
// tool except those that run commands or code, which it denies with rule id
// "default-deny-shell". A tool id is first folded to a canonical form:
// control and format characters (NUL, zero-width and bidirectional marks)
// are dropped, full-width letters become ASCII, letters are lower-cased,
// and runs of separators ('.', '_', '-', '/', '\', ':', white space)
// become one '.'. The id is also read cut at its first NUL and as its first
// word, and each reading also without trailing program-file extensions
// (exe, com, bat, cmd, ps1, psm1, vbs, wsf, msi, app, bin, sh, run, out).
// A reading is denied when the whole of it, or its part after any
// separator, with the separators removed, is one of:
//
//   - shells and terminals: shell, sh, bash, zsh, fish, dash, ksh, mksh,
//     csh, tcsh, ash, busybox, terminal, cmd, commandcom, powershell, pwsh;
//   - privilege and remote execution: sudo, su, doas, pkexec, runas, ssh,
//     rsh;
//   - command runners: exec, execve, popen, subprocess, childprocess,
//     ossystem, runcommand, runcmd, execcommand, executecommand,
//     shellexec, shellcommand, runshell, runscript;
//   - code runners: repl, codeinterpreter, runcode, execcode, executecode,
//     runpython, execpython, executepython;
//   - interpreters, with any version digits: python, pythonw, pypy, node,
//     nodejs, deno, bun, ruby, irb, perl, php, lua, luajit, tclsh, wish,
//     osascript, cscript, wscript, mshta, jshell.
//
// So "system.shell", "tools/bash", "bash.exe", "C:\Windows\System32\cmd.exe",
// "bash " (trailing space), "python3.11", "execute-command" and
// "mcp.run_command" are denied, while "shellcheck", "exec_sql",
// "fs.read_file" and "nodes.list" are allowed. A namespaced tool that only
// ends in such a name ("k8s.node") is denied too: allow it with a policy of
// your own. Rules in policy files match tool ids exactly as given (globs);
// only this built-in rule normalizes them.
package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ErrInvalidPolicy is matched, via errors.Is, by every error Load and Parse
// return, so callers can tell a rejected policy from other startup failures.
var ErrInvalidPolicy = errors.New("invalid policy")

// Decision is the outcome of evaluating a tool invocation.
type Decision string

// The decisions a policy can produce.
const (
	// Allow lets the tool invocation run.
	Allow Decision = "allow"
	// Deny rejects the tool invocation.
	Deny Decision = "deny"
	// RequireApproval holds the tool invocation until a human approves it.
	RequireApproval Decision = "require_approval"
)

// Input describes one tool invocation. The action is always tool.invoke.
type Input struct {
	// ToolID is the tool being invoked.
	ToolID string
	// AgentID is the agent invoking the tool.
	AgentID string
	// Labels are the execution's labels.
	Labels map[string]string
	// Arguments is the raw JSON arguments object; it may be nil.
	Arguments json.RawMessage
	// StepCount is the number of steps created so far in the execution,
	// whatever their status.
	StepCount int
	// Elapsed is the time since the execution was created.
	Elapsed time.Duration
	// Now is the current time. It drives schedules and rate limits and is
	// passed in rather than read from the clock so evaluation is
	// deterministic; callers must set it.
	Now time.Time
}

// Result is the decision for one tool invocation.
type Result struct {
	// Decision is what the kernel must do with the invocation.
	Decision Decision
	// RuleID is the id of the deciding rule, "default" for a file's default
	// decision, or "agent-default" when no policy covers the agent.
	RuleID string
	// Reason explains the decision to operators.
	Reason string
	// Timeout overrides the step deadline; zero when the rule sets none.
	// It applies to Allow and, once approved, to RequireApproval.
	Timeout time.Duration
	// ExpiresIn is how long a require_approval prompt waits for an answer;
	// zero means it never expires.
	ExpiresIn time.Duration
	// OnExpiry is what an expired prompt means for the step: Allow, or Deny
	// (also when empty). The outcome is recorded as "expired" either way.
	OnExpiry Decision
	// Responders, when not empty, are the people who may answer a
	// require_approval prompt through the chat and push channels, instead
	// of the prompt's owner. The caller must not modify it.
	Responders []string
	// RateLimited reports that Decision is Deny because the matched allow
	// rule's rate limit was exceeded; Reason then holds
	// "rate limit exceeded: max N per W".
	RateLimited bool
}

// Engine evaluates tool invocations against a loaded policy. It is safe for
// concurrent use.
type Engine struct {
	source string
	// global applies to agents without their own set; nil in directory mode
	// when there is no _global file.
	global *ruleSet
	// agents holds per-agent sets in directory mode.
	agents  map[string]*ruleSet
	limiter *limiter
}

// ruleSet is the ordered rules and fallback decision one agent is judged by.
type ruleSet struct {
	rules    []*rule
	fallback Result
}

// Evaluate decides whether the invocation described by in may run.
func (e *Engine) Evaluate(in Input) Result {
	set, ok := e.agents[in.AgentID]
	if !ok {
		set = e.global
	}
	if set == nil {
		return Result{
			Decision: Deny,
			RuleID:   "agent-default",
			Reason:   fmt.Sprintf("no policy configured for agent %q", in.AgentID),
		}
	}
	// One allocation holds the input and the decoded arguments for the
	// conditions, which escape analysis cannot see through.
	ev := &evalContext{in: in}
	for _, r := range set.rules {
		if r.matches(ev) {
			return e.decide(r, &ev.in)
		}
	}
	return set.fallback
}

// decide turns a matched rule into a result, applying its rate limit.
func (e *Engine) decide(r *rule, in *Input) Result {
	if r.limit != nil {
		if reason, ok := e.limiter.admit(r, in); !ok {
			return Result{Decision: Deny, RuleID: r.id, Reason: reason, RateLimited: true}
		}
	}
	return Result{Decision: r.decision, RuleID: r.id, Reason: r.reason, Timeout: r.timeout, ExpiresIn: r.expiresIn, OnExpiry: r.onExpiry, Responders: r.responders}
}

// Source describes where the policy came from, for the startup log.
func (e *Engine) Source() string {
	return e.source
}

func newEngine(source string, global *ruleSet, agents map[string]*ruleSet) *Engine {
	return &Engine{source: source, global: global, agents: agents, limiter: newLimiter()}
}
