package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// MaxRules caps the number of rules in one rule set.
const MaxRules = 10000

// reservedID is the rule_id policy.ApplyDefault gives its answers; no rule
// may take it.
const reservedID = "default_action"

// parser holds the context of one parse for error messages.
type parser struct {
	file string
	item string // `rule "id"` or `rules[i]` while a rule is parsed
}

func (p *parser) errf(n *yaml.Node, field, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &bundle.Error{File: p.file, Line: line, Item: p.item, Field: field, Err: fmt.Errorf(format, args...)}
}

func (p *parser) wrap(n *yaml.Node, field string, err error) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &bundle.Error{File: p.file, Line: line, Item: p.item, Field: field, Err: err}
}

// kv is one key/value pair of a mapping.
type kv struct {
	key string
	k   *yaml.Node
	v   *yaml.Node
}

// fields returns the pairs of mapping n after checking that n is a mapping
// (null counts as empty), that every key is one of allowed and appears once,
// and that no value is an alias. Pairs with a problem are left out and the
// problems returned together ([bundle.Join]), so that a caller can go on
// with the good pairs and report everything.
func (p *parser) fields(n *yaml.Node, field string, allowed ...string) ([]kv, error) {
	if isNull(n) {
		return nil, nil
	}
	if n.Kind == yaml.AliasNode {
		return nil, p.errf(n, field, "YAML aliases are not supported")
	}
	if n.Kind != yaml.MappingNode {
		return nil, p.errf(n, field, "want a mapping, got %s", describe(n))
	}
	out := make([]kv, 0, len(n.Content)/2)
	seen := make(map[string]int, len(n.Content)/2)
	var errs []error
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!merge" {
			errs = append(errs, p.errf(k, field, "keys must be plain strings"))
			continue
		}
		sub := join(field, k.Value)
		if allowed != nil && !containsString(allowed, k.Value) {
			errs = append(errs, p.errf(k, sub, "unknown field (want %s)", strings.Join(allowed, ", ")))
			continue
		}
		if line, dup := seen[k.Value]; dup {
			errs = append(errs, p.errf(k, sub, "defined twice (also line %d)", line))
			continue
		}
		seen[k.Value] = k.Line
		if v.Kind == yaml.AliasNode {
			errs = append(errs, p.errf(v, sub, "YAML aliases are not supported"))
			continue
		}
		out = append(out, kv{key: k.Value, k: k, v: v})
	}
	return out, bundle.Join(errs...)
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		if isNull(n) {
			return "null"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "a document"
}

// str reads a scalar as a string; null reads as "".
func (p *parser) str(n *yaml.Node, field string) (string, error) {
	if isNull(n) {
		return "", nil
	}
	if n.Kind != yaml.ScalarNode {
		return "", p.errf(n, field, "want a string, got %s", describe(n))
	}
	return n.Value, nil
}

// nonEmpty reads a scalar as a non-empty string.
func (p *parser) nonEmpty(n *yaml.Node, field string) (string, error) {
	s, err := p.str(n, field)
	if err == nil && s == "" {
		err = p.errf(n, field, "empty value")
	}
	return s, err
}

// strList reads a non-empty list of non-empty strings.
func (p *parser) strList(n *yaml.Node, field string) ([]string, error) {
	if n.Kind != yaml.SequenceNode {
		return nil, p.errf(n, field, "want a list, got %s", describe(n))
	}
	if len(n.Content) == 0 {
		return nil, p.errf(n, field, "empty list (remove the field to match everything)")
	}
	out := make([]string, len(n.Content))
	for i, e := range n.Content {
		s, err := p.nonEmpty(e, fmt.Sprintf("%s[%d]", field, i))
		if err != nil {
			return nil, err
		}
		out[i] = s
	}
	return out, nil
}

// one reads the value of a field that has a singular and a plural form
// (target/targets): the singular takes one string, the plural a list.
func (p *parser) one(f kv, field string, plural bool) ([]string, error) {
	if plural {
		return p.strList(f.v, field)
	}
	s, err := p.nonEmpty(f.v, field)
	if err != nil {
		return nil, err
	}
	return []string{s}, nil
}

func (p *parser) integer(n *yaml.Node, field string) (int, error) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		return 0, p.errf(n, field, "want an integer, got %s", describe(n))
	}
	var i int
	if err := n.Decode(&i); err != nil {
		return 0, p.errf(n, field, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	return i, nil
}

// parse is Parse with a file name for errors.
func parse(file string, src []byte) (rs *RuleSet, err error) {
	p := &parser{file: file}
	dec := yaml.NewDecoder(bytes.NewReader(src))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, p.errf(nil, "", "empty file (want a mapping with default_action and rules)")
		}
		line, msg := bundle.SplitYAMLLine(strings.TrimPrefix(err.Error(), "yaml: "))
		return nil, &bundle.Error{File: file, Line: line, Err: errors.New(msg)}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, p.errf(nil, "", "more than one YAML document")
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		return nil, p.errf(root, "", "want a mapping with default_action and rules, got %s", describe(root))
	}
	top, err := p.fields(root, "", "default_action", "rules")
	errs := []error{err}
	rs = &RuleSet{}
	for _, f := range top {
		switch f.key {
		case "default_action":
			s, err := p.str(f.v, "default_action")
			if err != nil {
				errs = append(errs, err)
				continue
			}
			switch a := policy.Action(s); a {
			case "", policy.Allow, policy.Deny:
				rs.defaultAction = a
			default:
				errs = append(errs, p.errf(f.v, "default_action", "must be allow or deny, got %q", s))
			}
		case "rules":
			if isNull(f.v) {
				continue
			}
			if f.v.Kind != yaml.SequenceNode {
				errs = append(errs, p.errf(f.v, "rules", "want a list of rules, got %s", describe(f.v)))
				continue
			}
			if len(f.v.Content) > MaxRules {
				errs = append(errs, p.errf(f.v, "rules", "more than %d rules", MaxRules))
				continue
			}
			ids := make(map[string]int, len(f.v.Content))
			for i, n := range f.v.Content {
				r, err := p.rule(i, n)
				if r != nil && r.id != "" {
					if j, dup := ids[r.id]; dup {
						errs = append(errs, p.errf(n, "id", "duplicate id (also rules[%d])", j))
					} else {
						ids[r.id] = i
					}
				}
				if err != nil {
					errs = append(errs, err)
					continue
				}
				rs.rules = append(rs.rules, r)
			}
			p.item = ""
		}
	}
	if err := bundle.Join(errs...); err != nil {
		return nil, err
	}
	sort.SliceStable(rs.rules, func(i, j int) bool { return rs.rules[i].priority < rs.rules[j].priority })
	// Give the first maxMemo distinct argument paths a memo slot.
	slots := make(map[string]int)
	for _, r := range rs.rules {
		for i := range r.args {
			a := &r.args[i]
			key := pathKey(a.path)
			slot, ok := slots[key]
			if !ok && len(slots) < maxMemo {
				slot, ok = len(slots), true
				slots[key] = slot
			}
			a.slot = -1
			if ok {
				a.slot = slot
			}
		}
	}
	return rs, nil
}

func (p *parser) rule(i int, n *yaml.Node) (*rule, error) {
	p.item = fmt.Sprintf("rules[%d]", i)
	// Name the rule by its id as early as possible, so that every error,
	// even about an unknown field, carries it.
	if n.Kind == yaml.MappingNode {
		for j := 0; j+1 < len(n.Content); j += 2 {
			if k, v := n.Content[j], n.Content[j+1]; k.Value == "id" && v.Kind == yaml.ScalarNode && bundle.ValidID(v.Value) && v.Value != reservedID {
				p.item = fmt.Sprintf("rule %q", v.Value)
				break
			}
		}
	}
	fs, err := p.fields(n, "", "id", "priority", "description", "when", "then")
	if isNull(n) {
		return nil, p.errf(n, "", "empty rule")
	}
	if n.Kind != yaml.MappingNode {
		return nil, err
	}
	errs := []error{err}
	r := &rule{index: i, line: n.Line}
	idGiven := false
	for _, f := range fs {
		if f.key != "id" {
			continue
		}
		idGiven = true
		id, err := p.nonEmpty(f.v, "id")
		switch {
		case err != nil:
			errs = append(errs, err)
		case !bundle.ValidID(id):
			errs = append(errs, p.errf(f.v, "id", "%q does not match ^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$", id))
		case id == reservedID:
			errs = append(errs, p.errf(f.v, "id", "%q is reserved for the default action", id))
		default:
			r.id = id
		}
	}
	if !idGiven {
		errs = append(errs, p.errf(n, "id", "required"))
	}
	var then *yaml.Node
	for _, f := range fs {
		switch f.key {
		case "priority":
			if r.priority, err = p.integer(f.v, "priority"); err != nil {
				errs = append(errs, err)
			}
		case "description":
			if _, err := p.str(f.v, "description"); err != nil {
				errs = append(errs, err)
			}
		case "when":
			errs = append(errs, p.when(r, f.v))
		case "then":
			then = f.v
		}
	}
	if then == nil || isNull(then) {
		errs = append(errs, p.errf(n, "then", "required (at least then.decision)"))
	} else {
		errs = append(errs, p.then(r, then))
	}
	return r, bundle.Join(errs...)
}

func (p *parser) when(r *rule, n *yaml.Node) error {
	fs, err := p.fields(n, "when",
		"target", "targets", "agent_id", "agent_ids", "step_kind", "step_kinds", "effect", "effects", "arguments")
	errs := []error{err}
	other := map[string]string{
		"target": "targets", "targets": "target", "agent_id": "agent_ids", "agent_ids": "agent_id",
		"step_kind": "step_kinds", "step_kinds": "step_kind", "effect": "effects", "effects": "effect",
	}
	has := make(map[string]bool, len(fs))
	for _, f := range fs {
		if o := other[f.key]; o != "" && has[o] {
			errs = append(errs, p.errf(f.k, "when."+f.key, "give %s or %s, not both", o, f.key))
		}
		has[f.key] = true
	}
	for _, f := range fs {
		field := "when." + f.key
		switch f.key {
		case "target", "targets":
			pats, err := p.one(f, field, f.key == "targets")
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for j, pat := range pats {
				g, err := bundle.CompileGlob(pat)
				if err != nil {
					sub := field
					if f.key == "targets" {
						sub = fmt.Sprintf("%s[%d]", field, j)
					}
					errs = append(errs, p.errf(f.v, sub, "%q: %w", pat, err))
					continue
				}
				r.targets = append(r.targets, g)
			}
		case "agent_id", "agent_ids":
			if r.agents, err = p.one(f, field, f.key == "agent_ids"); err != nil {
				errs = append(errs, err)
			}
		case "step_kind", "step_kinds":
			ks, err := p.one(f, field, f.key == "step_kinds")
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for _, k := range ks {
				b := kindBit(k)
				if b == 0 {
					errs = append(errs, p.errf(f.v, field, "unknown step kind %q (want tool_call, llm_call or local)", k))
					continue
				}
				r.kinds |= b
			}
		case "effect", "effects":
			es, err := p.one(f, field, f.key == "effects")
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for _, e := range es {
				b := effectBit(e)
				if b == 0 {
					errs = append(errs, p.errf(f.v, field, "unknown effect %q (want read_only, local_mutation, remote_mutation or destructive)", e))
					continue
				}
				r.effects |= b
			}
		case "arguments":
			errs = append(errs, p.arguments(r, f.v))
		}
	}
	return bundle.Join(errs...)
}

func (p *parser) arguments(r *rule, n *yaml.Node) error {
	const field = "when.arguments"
	fs, err := p.fields(n, field) // keys are argument paths: any
	if err != nil {
		return err
	}
	if len(fs) == 0 {
		return p.errf(n, field, "empty (give at least one argument predicate, or remove arguments)")
	}
	var errs []error
	for _, f := range fs {
		sub := field + "." + f.key
		path, err := parsePath(f.key)
		if err != nil {
			errs = append(errs, p.errf(f.k, sub, "%w", err))
			continue
		}
		if isNull(f.v) {
			errs = append(errs, p.errf(f.v, sub, "empty predicate: give equals, contains, one_of or regex"))
			continue
		}
		if f.v.Kind != yaml.MappingNode {
			errs = append(errs, p.errf(f.v, sub, "want a predicate (equals, contains, one_of or regex), got %s", describe(f.v)))
			continue
		}
		ops, err := p.fields(f.v, sub, "equals", "contains", "one_of", "regex")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if len(ops) == 0 {
			errs = append(errs, p.errf(f.v, sub, "empty predicate: give equals, contains, one_of or regex"))
			continue
		}
		pred := argPred{path: path}
		for _, o := range ops {
			compiled, err := p.operator(o)
			if err != nil {
				errs = append(errs, p.wrap(o.v, sub, fmt.Errorf("%s: %w", o.key, err)))
				continue
			}
			pred.ops = append(pred.ops, compiled)
		}
		r.args = append(r.args, pred)
	}
	return bundle.Join(errs...)
}

// operator compiles one operator; its errors are bare reasons that the
// caller prefixes with the operator's name.
func (p *parser) operator(o kv) (op, error) {
	switch o.key {
	case "regex":
		if o.v.Kind != yaml.ScalarNode || isNull(o.v) {
			return op{}, fmt.Errorf("want a string, got %s", describe(o.v))
		}
		re, err := regexp.Compile(o.v.Value)
		if err != nil {
			return op{}, err
		}
		return op{kind: opRegex, re: re}, nil
	case "one_of":
		if o.v.Kind != yaml.SequenceNode {
			return op{}, fmt.Errorf("want a list, got %s", describe(o.v))
		}
		if len(o.v.Content) == 0 {
			return op{}, errors.New("empty list matches nothing")
		}
		out := op{kind: opOneOf}
		for _, e := range o.v.Content {
			v, err := operand(e)
			if err != nil {
				return op{}, err
			}
			out.set = append(out.set, v)
		}
		return out, nil
	default: // equals, contains
		v, err := operand(o.v)
		if err != nil {
			return op{}, err
		}
		k := opEquals
		if o.key == "contains" {
			k = opContains
		}
		return op{kind: k, val: v}, nil
	}
}

// operand converts a YAML operand to a value, as bundle.JSONFromYAML maps
// YAML to JSON.
func operand(n *yaml.Node) (*value, error) {
	raw, err := bundle.JSONFromYAML(n)
	if err != nil {
		var be *bundle.Error
		if errors.As(err, &be) {
			return nil, fmt.Errorf("line %d: %w", be.Line, be.Err)
		}
		return nil, err
	}
	return parseValue(raw)
}

// pathKey identifies a parsed path.
func pathKey(p []pathSeg) string {
	var b strings.Builder
	for _, s := range p {
		b.WriteString(strconv.Itoa(len(s.key)))
		b.WriteByte(':')
		b.WriteString(s.key)
	}
	return b.String()
}

// parsePath splits a dotted argument path ("a.b.0.c").
func parsePath(s string) ([]pathSeg, error) {
	if s == "" {
		return nil, errors.New("empty argument path")
	}
	parts := strings.Split(s, ".")
	out := make([]pathSeg, len(parts))
	for i, part := range parts {
		if part == "" {
			return nil, fmt.Errorf("empty element in argument path %q", s)
		}
		out[i] = pathSeg{key: part, idx: -1}
		if len(part) <= 9 && (part == "0" || part[0] != '0') {
			if n, err := strconv.Atoi(part); err == nil && n >= 0 && part[0] != '+' {
				out[i].idx = n
			}
		}
	}
	return out, nil
}

func (p *parser) then(r *rule, n *yaml.Node) error {
	fs, err := p.fields(n, "then", "decision", "reason", "approval_config", "rate_limit")
	errs := []error{err}
	d := policy.Answer{RuleID: r.id}
	var approval, limit *yaml.Node
	decisionGiven := false
	for _, f := range fs {
		switch f.key {
		case "decision":
			decisionGiven = true
			s, err := p.nonEmpty(f.v, "then.decision")
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if a := policy.Action(s); a.Valid() {
				d.Action = a
			} else {
				errs = append(errs, p.errf(f.v, "then.decision", "unknown decision %q (want allow, deny, require_approval or abort)", s))
			}
		case "reason":
			if d.Reason, err = p.str(f.v, "then.reason"); err != nil {
				errs = append(errs, err)
			}
		case "approval_config":
			approval = f.k
			if d.Approval, err = p.approval(f.v); err != nil {
				errs = append(errs, err)
			}
		case "rate_limit":
			limit = f.k
			if d.RateLimit, err = p.rateLimit(f.v); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if !decisionGiven {
		errs = append(errs, p.errf(n, "then.decision", "required (allow, deny, require_approval or abort)"))
	}
	if d.Action != "" {
		if approval != nil && d.Action != policy.RequireApproval {
			errs = append(errs, p.errf(approval, "then.approval_config", "only applies to decision require_approval (decision is %s)", d.Action))
		}
		if limit != nil && d.Action != policy.Allow && d.Action != policy.RequireApproval {
			errs = append(errs, p.errf(limit, "then.rate_limit", "only applies to decisions allow and require_approval (decision is %s)", d.Action))
		}
	}
	if d.Action.Valid() {
		// The sizes an engine's answer is held to (recorded with every step).
		if err := d.Validate(); err != nil {
			errs = append(errs, p.errf(n, "then", "%v", err))
		}
	}
	r.decision = d
	return bundle.Join(errs...)
}

func (p *parser) approval(n *yaml.Node) (*policy.Approval, error) {
	const field = "then.approval_config"
	fs, err := p.fields(n, field, "approvers", "timeout", "message")
	errs := []error{err}
	a := &policy.Approval{}
	for _, f := range fs {
		sub := field + "." + f.key
		switch f.key {
		case "approvers":
			if a.Approvers, err = p.strList(f.v, sub); err != nil {
				errs = append(errs, err)
			}
		case "timeout":
			if a.Timeout, err = p.nonEmpty(f.v, sub); err != nil {
				errs = append(errs, err)
			} else if d, err := time.ParseDuration(a.Timeout); err != nil || d <= 0 {
				errs = append(errs, p.errf(f.v, sub, "must be a positive Go duration (e.g. 30m), got %q", a.Timeout))
			}
		case "message":
			if a.Message, err = p.str(f.v, sub); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := bundle.Join(errs...); err != nil {
		return nil, err
	}
	return a, nil
}

func (p *parser) rateLimit(n *yaml.Node) (*policy.RateLimit, error) {
	const field = "then.rate_limit"
	if isNull(n) {
		return nil, p.errf(n, field, "empty (give at least max_calls and window)")
	}
	fs, err := p.fields(n, field, "max_calls", "window", "per", "algorithm", "on_limiter_error")
	errs := []error{err}
	rl := &policy.RateLimit{}
	lines := make(map[string]*yaml.Node, len(fs))
	for _, f := range fs {
		sub := field + "." + f.key
		lines[f.key] = f.v
		switch f.key {
		case "max_calls":
			rl.MaxCalls, err = p.integer(f.v, sub)
		case "window":
			rl.Window, err = p.str(f.v, sub)
		case "per":
			rl.Per, err = p.str(f.v, sub)
		case "algorithm":
			rl.Algorithm, err = p.str(f.v, sub)
		case "on_limiter_error":
			rl.OnLimiterError, err = p.str(f.v, sub)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := bundle.Join(errs...); err != nil {
		return nil, err
	}
	if err := bundle.ValidateRateLimit(*rl); err != nil {
		var be *bundle.Error
		if errors.As(err, &be) {
			at := lines[be.Field]
			if at == nil {
				at = n
			}
			return nil, p.wrap(at, field+"."+be.Field, be.Err)
		}
		return nil, p.wrap(n, field, err)
	}
	return rl, nil
}
