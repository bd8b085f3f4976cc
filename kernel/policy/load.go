package policy

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gatehouse-dev/gatehouse/ident"
)

// globalAgent is the directory-mode file name (without extension) that
// holds rules shared by every agent.
const globalAgent = "_global"

// maxResponders bounds a rule's then.responders: a prompt record carries
// the list.
const maxResponders = 64

// The spec types mirror the file format. Their yaml tags are also the list
// of keys checkKeys accepts.
type (
	fileSpec struct {
		Rules []yaml.Node `yaml:"rules"`
		// Default is a zero Node when the key is absent. It is not a
		// pointer because yaml.v3 leaves *yaml.Node fields empty when
		// decoding from a Node.
		Default yaml.Node `yaml:"default"`
	}
	ruleSpec struct {
		ID        string         `yaml:"id"`
		Priority  int            `yaml:"priority"`
		When      whenSpec       `yaml:"when"`
		Then      thenSpec       `yaml:"then"`
		RateLimit *rateLimitSpec `yaml:"rate_limit"`
	}
	whenSpec struct {
		Action        string            `yaml:"action"`
		ToolID        string            `yaml:"tool_id"`
		ToolIDs       []string          `yaml:"tool_ids"`
		AgentID       string            `yaml:"agent_id"`
		AgentIDs      []string          `yaml:"agent_ids"`
		Labels        map[string]string `yaml:"labels"`
		Arguments     []predicateSpec   `yaml:"arguments"`
		MinStepCount  *int              `yaml:"min_step_count"`
		MinDurationMS *int64            `yaml:"min_duration_ms"`
		Schedule      string            `yaml:"schedule"`
	}
	predicateSpec struct {
		Field     string   `yaml:"field"`
		Pattern   string   `yaml:"pattern"`
		OneOf     []string `yaml:"one_of"`
		Min       *float64 `yaml:"min"`
		Max       *float64 `yaml:"max"`
		MaxLength *int     `yaml:"max_length"`
		Required  bool     `yaml:"required"`
	}
	thenSpec struct {
		Decision  string `yaml:"decision"`
		Reason    string `yaml:"reason"`
		TimeoutMS int64  `yaml:"timeout_ms"`
		// Gatehouse extensions for require_approval: how long a prompt
		// waits for a human, and what its expiry means.
		ExpiresIn string `yaml:"expires_in"`
		OnExpiry  string `yaml:"on_expiry"`
		// Responders are the people who may answer the rule's prompts
		// through the chat and push channels, instead of the owner.
		Responders []string `yaml:"responders"`
	}
	rateLimitSpec struct {
		Max    int    `yaml:"max"`
		Window string `yaml:"window"`
	}
	defaultSpec struct {
		Decision string `yaml:"decision"`
		Reason   string `yaml:"reason"`
	}
)

// parsedFile is one policy file after validation, before merging.
type parsedFile struct {
	path     string
	rules    []*rule
	fallback Result
}

// Load reads the policy at path. A file is one policy applied to every
// agent; a directory holds one file per agent plus an optional _global file
// (see the package documentation).
func Load(path string) (*Engine, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, invalid(path, "", err)
	}
	if info.IsDir() {
		return loadDir(path)
	}
	f, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return singleFileEngine(f)
}

// Parse builds an engine from the content of one policy file applied to
// every agent. name identifies the content in errors and in Source.
func Parse(data []byte, name string) (*Engine, error) {
	f, err := parseFile(data, name)
	if err != nil {
		return nil, err
	}
	return singleFileEngine(f)
}

func singleFileEngine(f *parsedFile) (*Engine, error) {
	rules, err := mergeRules(f)
	if err != nil {
		return nil, err
	}
	return newEngine(f.path, &ruleSet{rules: rules, fallback: f.fallback}, nil), nil
}

func loadDir(dir string) (*Engine, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, invalid(dir, "", err)
	}
	paths := make(map[string]string) // agent id → file
	for _, entry := range entries {
		name := entry.Name()
		ext := filepath.Ext(name)
		if entry.IsDir() || (ext != ".yaml" && ext != ".yml") {
			continue
		}
		p := filepath.Join(dir, name)
		agent := strings.TrimSuffix(name, ext)
		if agent == "" {
			return nil, invalid(p, "", errors.New("file name gives an empty agent id"))
		}
		if other, dup := paths[agent]; dup {
			return nil, invalid(p, "", fmt.Errorf("agent %q is also configured by %s", agent, other))
		}
		paths[agent] = p
	}
	if len(paths) == 0 {
		return nil, invalid(dir, "", errors.New("directory holds no *.yaml or *.yml policy file"))
	}

	var global *parsedFile
	var globalSet *ruleSet
	if p, ok := paths[globalAgent]; ok {
		delete(paths, globalAgent)
		if global, err = readFile(p); err != nil {
			return nil, err
		}
		rules, err := mergeRules(global)
		if err != nil {
			return nil, err
		}
		globalSet = &ruleSet{rules: rules, fallback: global.fallback}
	}

	agents := make(map[string]*ruleSet, len(paths))
	// Sorted so the same broken directory always reports the same error.
	for _, agent := range slices.Sorted(maps.Keys(paths)) {
		f, err := readFile(paths[agent])
		if err != nil {
			return nil, err
		}
		// Global rules go first so a clash is reported against the agent
		// file, the one that introduced it.
		var files []*parsedFile
		if global != nil {
			files = append(files, global)
		}
		rules, err := mergeRules(append(files, f)...)
		if err != nil {
			return nil, err
		}
		// Only the agent's own default applies, so the global default
		// cannot silently loosen an agent that has a file.
		agents[agent] = &ruleSet{rules: rules, fallback: f.fallback}
	}
	return newEngine(dir, globalSet, agents), nil
}

func readFile(path string) (*parsedFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, invalid(path, "", err)
	}
	return parseFile(data, path)
}

// mergeRules orders the rules of files by priority, rejecting ids and
// priorities used twice, since either would make the order ambiguous.
func mergeRules(files ...*parsedFile) ([]*rule, error) {
	type origin struct {
		rule *rule
		path string
	}
	byID := make(map[string]origin)
	byPriority := make(map[int]origin)
	var rules []*rule
	for _, f := range files {
		for _, r := range f.rules {
			if other, dup := byID[r.id]; dup {
				return nil, invalid(f.path, strconv.Quote(r.id), fmt.Errorf("duplicate rule id (also in %s)", other.path))
			}
			if other, dup := byPriority[r.priority]; dup {
				return nil, invalid(f.path, strconv.Quote(r.id), fmt.Errorf("duplicate priority %d (also used by rule %q in %s)", r.priority, other.rule.id, other.path))
			}
			byID[r.id] = origin{r, f.path}
			byPriority[r.priority] = origin{r, f.path}
			rules = append(rules, r)
		}
	}
	slices.SortFunc(rules, func(a, b *rule) int { return cmp.Compare(a.priority, b.priority) })
	return rules, nil
}

func parseFile(data []byte, path string) (*parsedFile, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, invalid(path, "", errors.New("file is empty"))
		}
		return nil, invalid(path, "", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err == nil {
			err = errors.New("file holds more than one YAML document")
		}
		return nil, invalid(path, "", err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		return nil, invalid(path, "", errors.New("top level must be a mapping with rules and/or default"))
	}
	var spec fileSpec
	if err := decodeStrict(root, &spec); err != nil {
		return nil, invalid(path, "", err)
	}

	f := &parsedFile{
		path:     path,
		fallback: Result{Decision: Deny, RuleID: "default", Reason: "No explicit allow rule matched"},
	}
	for i := range spec.Rules {
		node := &spec.Rules[i]
		label := ruleLabel(node, i)
		var rs ruleSpec
		if err := decodeStrict(node, &rs); err != nil {
			return nil, invalid(path, label, err)
		}
		r, err := compileRule(&rs)
		if err != nil {
			return nil, invalid(path, label, err)
		}
		f.rules = append(f.rules, r)
	}
	if spec.Default.Kind != 0 {
		var ds defaultSpec
		if err := decodeStrict(&spec.Default, &ds); err != nil {
			return nil, invalid(path, "", fmt.Errorf("default: %w", err))
		}
		d, err := parseDecision(ds.Decision)
		if err != nil {
			return nil, invalid(path, "", fmt.Errorf("default: %w", err))
		}
		f.fallback = Result{Decision: d, RuleID: "default", Reason: ds.Reason}
		if f.fallback.Reason == "" {
			f.fallback.Reason = fmt.Sprintf("no rule matched; the policy default is %s", d)
		}
	}
	return f, nil
}

// invalid wraps a load error with ErrInvalidPolicy, the file and, when
// known, the rule.
func invalid(path, rule string, err error) error {
	if rule != "" {
		return fmt.Errorf("%w: %s: rule %s: %w", ErrInvalidPolicy, path, rule, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrInvalidPolicy, path, err)
}

// ruleLabel names a rule in errors by its id, or by its position when the
// id is missing or unreadable.
func ruleLabel(node *yaml.Node, index int) string {
	if node.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(node.Content); i += 2 {
			if k, v := node.Content[i], node.Content[i+1]; k.Value == "id" && v.Kind == yaml.ScalarNode && v.Value != "" {
				return strconv.Quote(v.Value)
			}
		}
	}
	return fmt.Sprintf("#%d", index+1)
}

// decodeStrict decodes node into out after rejecting keys out does not
// declare. yaml.Decoder.KnownFields cannot be used because it does not
// reach into nodes decoded on their own, which is how each rule is decoded
// so its errors can name it.
func decodeStrict(node *yaml.Node, out any) error {
	if err := checkKeys(node, reflect.TypeOf(out).Elem(), ""); err != nil {
		return err
	}
	return node.Decode(out)
}

// checkKeys walks node alongside type t and reports the first mapping key
// that has no matching yaml tag. Shape mismatches are left to Decode,
// which reports them with better messages. The walk is driven by t, which
// is not recursive, so alias cycles cannot make it loop.
func checkKeys(node *yaml.Node, t reflect.Type, at string) error {
	if node.Kind == yaml.AliasNode {
		node = node.Alias
	}
	switch t.Kind() {
	case reflect.Pointer:
		return checkKeys(node, t.Elem(), at)
	case reflect.Slice:
		if node.Kind != yaml.SequenceNode {
			return nil
		}
		for i, item := range node.Content {
			if err := checkKeys(item, t.Elem(), fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	case reflect.Struct:
		if t == reflect.TypeFor[yaml.Node]() || node.Kind != yaml.MappingNode {
			return nil
		}
		for i := 0; i+1 < len(node.Content); i += 2 {
			key, value := node.Content[i], node.Content[i+1]
			if key.Tag == "!!merge" {
				if err := checkMerge(value, t, at); err != nil {
					return err
				}
				continue
			}
			name := key.Value
			if at != "" {
				name = at + "." + key.Value
			}
			field, ok := fieldForKey(t, key.Value)
			if !ok {
				return fmt.Errorf("line %d: unknown key %q", key.Line, name)
			}
			if err := checkKeys(value, field.Type, name); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkMerge checks the mapping or mappings pulled in by a "<<" key.
func checkMerge(value *yaml.Node, t reflect.Type, at string) error {
	if value.Kind == yaml.SequenceNode {
		for _, item := range value.Content {
			if err := checkKeys(item, t, at); err != nil {
				return err
			}
		}
		return nil
	}
	return checkKeys(value, t, at)
}

func fieldForKey(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if name, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); name == key {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func parseDecision(s string) (Decision, error) {
	switch d := Decision(s); d {
	case Allow, Deny, RequireApproval:
		return d, nil
	case "":
		return "", errors.New("decision is required (allow, deny or require_approval)")
	default:
		return "", fmt.Errorf("unknown decision %q (want allow, deny or require_approval)", s)
	}
}

func compileRule(rs *ruleSpec) (*rule, error) {
	if rs.ID == "" {
		return nil, errors.New("id is required")
	}
	d, err := parseDecision(rs.Then.Decision)
	if err != nil {
		return nil, fmt.Errorf("then: %w", err)
	}
	r := &rule{id: rs.ID, priority: rs.Priority, decision: d, reason: rs.Then.Reason}
	if r.reason == "" {
		r.reason = fmt.Sprintf("matched policy rule %q", rs.ID)
	}
	if rs.Then.TimeoutMS < 0 {
		return nil, fmt.Errorf("then.timeout_ms must not be negative, got %d", rs.Then.TimeoutMS)
	}
	timeout, err := milliseconds(rs.Then.TimeoutMS)
	if err != nil {
		return nil, fmt.Errorf("then.timeout_ms: %w", err)
	}
	// A require_approval rule's timeout applies once the step is approved
	// (the original kernel dropped it); deny has no step to time.
	if d != Deny {
		r.timeout = timeout
	}
	if rs.Then.ExpiresIn != "" || rs.Then.OnExpiry != "" {
		if d != RequireApproval {
			return nil, fmt.Errorf("then.expires_in and then.on_expiry apply only to require_approval")
		}
		if rs.Then.ExpiresIn != "" {
			exp, err := time.ParseDuration(rs.Then.ExpiresIn)
			if err != nil || exp <= 0 {
				return nil, fmt.Errorf("then.expires_in %q: want a positive Go duration such as 10m", rs.Then.ExpiresIn)
			}
			r.expiresIn = exp
		}
		switch Decision(rs.Then.OnExpiry) {
		case "", Deny, Allow:
			r.onExpiry = Decision(rs.Then.OnExpiry)
		default:
			return nil, fmt.Errorf("then.on_expiry %q: want deny or allow", rs.Then.OnExpiry)
		}
	}
	if len(rs.Then.Responders) > 0 {
		if d != RequireApproval {
			return nil, fmt.Errorf("then.responders applies only to require_approval")
		}
		if len(rs.Then.Responders) > maxResponders {
			return nil, fmt.Errorf("then.responders: %d people, at most %d", len(rs.Then.Responders), maxResponders)
		}
		for i, who := range rs.Then.Responders {
			if err := ident.Check(fmt.Sprintf("then.responders[%d]", i), who); err != nil {
				return nil, err
			}
		}
		r.responders = slices.Clone(rs.Then.Responders)
	}
	if rs.RateLimit != nil {
		limit, err := compileRateLimit(rs.RateLimit)
		if err != nil {
			return nil, fmt.Errorf("rate_limit: %w", err)
		}
		// Validated for every rule so a later switch to allow cannot
		// surface a latent error, but enforced only where it applies.
		if d == Allow {
			r.limit = limit
		}
	}
	if r.conds, err = compileWhen(&rs.When); err != nil {
		return nil, fmt.Errorf("when.%w", err)
	}
	return r, nil
}

func compileRateLimit(spec *rateLimitSpec) (*rateLimit, error) {
	if spec.Max <= 0 {
		return nil, fmt.Errorf("max must be greater than 0, got %d", spec.Max)
	}
	window, err := time.ParseDuration(spec.Window)
	if err != nil {
		return nil, fmt.Errorf("window: %w", err)
	}
	if window <= 0 {
		return nil, fmt.Errorf("window must be positive, got %q", spec.Window)
	}
	return &rateLimit{
		max:      spec.Max,
		window:   window,
		exceeded: fmt.Sprintf("rate limit exceeded: max %d per %s", spec.Max, spec.Window),
	}, nil
}

// compileWhen turns the conditions into checks ordered cheapest first.
// Errors start with the key name so the caller can prefix "when.".
func compileWhen(w *whenSpec) ([]condition, error) {
	var conds []condition
	if w.Action != "" && !newGlob(w.Action).match(actionToolInvoke) {
		// Rules for other actions stay loadable for compatibility but can
		// never match, because tool.invoke is the only action evaluated.
		conds = append(conds, func(*evalContext) bool { return false })
	}
	if w.ToolID != "" {
		g := newGlob(w.ToolID)
		conds = append(conds, func(ev *evalContext) bool { return g.match(ev.in.ToolID) })
	}
	if w.ToolIDs != nil {
		if len(w.ToolIDs) == 0 {
			return nil, errors.New("tool_ids: list must not be empty")
		}
		globs := make([]glob, len(w.ToolIDs))
		for i, p := range w.ToolIDs {
			globs[i] = newGlob(p)
		}
		conds = append(conds, func(ev *evalContext) bool { return anyGlob(globs, ev.in.ToolID) })
	}
	if w.AgentID != "" {
		id := w.AgentID
		conds = append(conds, func(ev *evalContext) bool { return ev.in.AgentID == id })
	}
	if w.AgentIDs != nil {
		if len(w.AgentIDs) == 0 {
			return nil, errors.New("agent_ids: list must not be empty")
		}
		ids := slices.Clone(w.AgentIDs)
		conds = append(conds, func(ev *evalContext) bool { return slices.Contains(ids, ev.in.AgentID) })
	}
	if len(w.Labels) > 0 {
		labels := maps.Clone(w.Labels)
		conds = append(conds, func(ev *evalContext) bool {
			for k, want := range labels {
				if got, ok := ev.in.Labels[k]; !ok || got != want {
					return false
				}
			}
			return true
		})
	}
	if w.MinStepCount != nil {
		n := *w.MinStepCount
		if n < 0 {
			return nil, fmt.Errorf("min_step_count must not be negative, got %d", n)
		}
		conds = append(conds, func(ev *evalContext) bool { return ev.in.StepCount >= n })
	}
	if w.MinDurationMS != nil {
		ms := *w.MinDurationMS
		if ms <= 0 {
			return nil, fmt.Errorf("min_duration_ms must be greater than 0, got %d", ms)
		}
		d, err := milliseconds(ms)
		if err != nil {
			return nil, fmt.Errorf("min_duration_ms: %w", err)
		}
		conds = append(conds, func(ev *evalContext) bool { return ev.in.Elapsed >= d })
	}
	if w.Schedule != "" {
		sc, err := parseSchedule(w.Schedule)
		if err != nil {
			return nil, fmt.Errorf("schedule: %w", err)
		}
		conds = append(conds, func(ev *evalContext) bool { return sc.contains(ev.in.Now) })
	}
	if w.Arguments != nil {
		preds, err := compilePredicates(w.Arguments)
		if err != nil {
			return nil, err
		}
		conds = append(conds, func(ev *evalContext) bool {
			args := ev.arguments()
			if args == nil {
				return false
			}
			for _, p := range preds {
				if !p.holds(args) {
					return false
				}
			}
			return true
		})
	}
	return conds, nil
}

func compilePredicates(specs []predicateSpec) ([]*predicate, error) {
	if len(specs) == 0 {
		return nil, errors.New("arguments: list must not be empty")
	}
	preds := make([]*predicate, len(specs))
	for i, spec := range specs {
		p, err := compilePredicate(&spec)
		if err != nil {
			return nil, fmt.Errorf("arguments[%d]: %w", i, err)
		}
		preds[i] = p
	}
	return preds, nil
}

func compilePredicate(spec *predicateSpec) (*predicate, error) {
	if spec.Field == "" {
		return nil, errors.New("field is required")
	}
	p := &predicate{field: spec.Field, required: spec.Required, min: spec.Min, max: spec.Max, maxLength: -1}
	if spec.Pattern != "" {
		re, err := regexp.Compile(spec.Pattern)
		if err != nil {
			return nil, fmt.Errorf("pattern: %w", err)
		}
		p.pattern = re
	}
	if spec.OneOf != nil {
		if len(spec.OneOf) == 0 {
			return nil, errors.New("one_of: list must not be empty")
		}
		p.oneOf = slices.Clone(spec.OneOf)
	}
	if spec.MaxLength != nil {
		if *spec.MaxLength < 0 {
			return nil, fmt.Errorf("max_length must not be negative, got %d", *spec.MaxLength)
		}
		p.maxLength = *spec.MaxLength
	}
	if p.min != nil && p.max != nil && *p.min > *p.max {
		return nil, fmt.Errorf("min %v is greater than max %v", *p.min, *p.max)
	}
	switch {
	case !p.required && !p.stringConstrained() && !p.numberConstrained():
		return nil, fmt.Errorf("field %q: needs at least one of pattern, one_of, min, max, max_length or required", p.field)
	case p.stringConstrained() && p.numberConstrained():
		// No value is both a string and a number, so the predicate could
		// never hold and a deny rule using it would silently never fire.
		return nil, fmt.Errorf("field %q: mixes string constraints (pattern, one_of, max_length) with numeric ones (min, max)", p.field)
	}
	return p, nil
}

// milliseconds converts a millisecond count from the file, refusing values
// that would overflow time.Duration and wrap to a nonsensical deadline.
func milliseconds(ms int64) (time.Duration, error) {
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return 0, fmt.Errorf("%d ms is too large", ms)
	}
	return time.Duration(ms) * time.Millisecond, nil
}
