package policy

import (
	"encoding/json"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// actionToolInvoke is the only action the kernel asks the policy about.
const actionToolInvoke = "tool.invoke"

// rule is a compiled policy rule.
type rule struct {
	id       string
	priority int
	decision Decision
	reason   string
	timeout  time.Duration
	// expiresIn and onExpiry are set only for require_approval rules.
	expiresIn time.Duration
	onExpiry  Decision
	// responders is set only for require_approval rules.
	responders []string
	// limit is set only for allow rules, the only ones it applies to.
	limit *rateLimit
	// conds are checked in order, cheapest first; all must hold.
	conds []condition
}

// condition is one compiled `when` clause.
type condition func(*evalContext) bool

// rateLimit is a compiled rate_limit block.
type rateLimit struct {
	max    int
	window time.Duration
	// exceeded is the denial reason, prebuilt with the window as written.
	exceeded string
}

func (r *rule) matches(ev *evalContext) bool {
	for _, c := range r.conds {
		if !c(ev) {
			return false
		}
	}
	return true
}

// evalContext carries one evaluation's input and the arguments, which are
// decoded at most once and only if some rule inspects them.
type evalContext struct {
	in      Input
	decoded bool
	args    map[string]any
}

// arguments returns the decoded arguments object, or nil when there are no
// arguments or they are not a JSON object.
func (ev *evalContext) arguments() map[string]any {
	if !ev.decoded {
		ev.decoded = true
		if len(ev.in.Arguments) > 0 {
			var m map[string]any
			if json.Unmarshal(ev.in.Arguments, &m) == nil {
				// JSON null decodes without error into a nil map, which
				// correctly counts as "not an object".
				ev.args = m
			}
		}
	}
	return ev.args
}

// glob matches with path.Match semantics. Patterns path.Match rejects are
// compared literally, as the original engine did, so they still match the
// tool id they spell.
type glob struct {
	pattern string
	literal bool
}

func newGlob(pattern string) glob {
	_, err := path.Match(pattern, "")
	return glob{pattern: pattern, literal: err != nil || !strings.ContainsAny(pattern, `*?[\`)}
}

func (g glob) match(s string) bool {
	if g.literal {
		return g.pattern == s
	}
	ok, _ := path.Match(g.pattern, s)
	return ok
}

func anyGlob(globs []glob, s string) bool {
	for _, g := range globs {
		if g.match(s) {
			return true
		}
	}
	return false
}

// predicate is a compiled argument predicate. String and numeric
// constraints are never mixed; load rejects that because such a predicate
// could never hold.
type predicate struct {
	field     string
	required  bool
	pattern   *regexp.Regexp
	oneOf     []string
	maxLength int // -1 when not set
	min, max  *float64
}

func (p *predicate) stringConstrained() bool {
	return p.pattern != nil || p.oneOf != nil || p.maxLength >= 0
}

func (p *predicate) numberConstrained() bool {
	return p.min != nil || p.max != nil
}

func (p *predicate) holds(args map[string]any) bool {
	v, ok := args[p.field]
	if !ok {
		return !p.required
	}
	if p.required {
		if s, isString := v.(string); isString && s == "" {
			return false
		}
	}
	if p.stringConstrained() {
		s, isString := v.(string)
		return isString && p.stringHolds(s)
	}
	if p.numberConstrained() {
		f, isNumber := v.(float64)
		return isNumber && (p.min == nil || f >= *p.min) && (p.max == nil || f <= *p.max)
	}
	return true
}

func (p *predicate) stringHolds(s string) bool {
	if p.maxLength >= 0 && utf8.RuneCountInString(s) > p.maxLength {
		return false
	}
	if p.oneOf != nil && !slices.Contains(p.oneOf, s) {
		return false
	}
	return p.pattern == nil || p.pattern.MatchString(s)
}
