package rules

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// Name is the engine's name, as written in bundle.yaml's engine field.
const Name = bundle.EngineRules

// Engine compiles rules bundles. It has no state; the zero value is ready to
// use, and one Engine serves any number of bundles concurrently.
type Engine struct{}

// New returns the rules engine.
func New() *Engine { return &Engine{} }

// Name returns "rules".
func (*Engine) Name() string { return Name }

// Compile parses and validates the bundle's rules.yaml and returns its
// evaluator.
//
// # Errors
//
// The bundle's engine must be rules and rules.yaml must be present; any
// problem in rules.yaml is a *[bundle.Error] naming the line, rule and field
// (see [Parse]).
func (e *Engine) Compile(ctx context.Context, b *bundle.Bundle) (policy.Evaluator, error) {
	if b == nil {
		return nil, errors.New("rules: compile: nil bundle")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("rules: compile bundle %q: %w", b.Manifest.Name, err)
	}
	if b.Manifest.Engine != Name {
		return nil, fmt.Errorf("rules: compile bundle %q: engine is %q, not %q", b.Manifest.Name, b.Manifest.Engine, Name)
	}
	src, ok := b.Files[bundle.RulesFile]
	if !ok {
		return nil, &bundle.Error{File: bundle.RulesFile, Err: fmt.Errorf("%w: missing: the rules engine needs it", bundle.ErrMissingFile)}
	}
	rs, err := parse(bundle.RulesFile, src)
	if err != nil {
		return nil, err
	}
	return rs.Evaluator(), nil
}

// RuleSet is a parsed, validated rules.yaml: its default_action and its rules
// in evaluation order. It is immutable and safe for concurrent use.
type RuleSet struct {
	defaultAction policy.Action
	rules         []*rule
}

// maxMemo is how many distinct argument paths an evaluation remembers the
// lookup of, so that rules testing the same argument scan the args once.
const maxMemo = 16

// memo holds the lookups of one evaluation, by argPred.slot.
type memo struct {
	start, end [maxMemo]int32
	state      [maxMemo]uint8 // 0 not looked up, 1 found, 2 missing
}

// Parse parses and validates src in the rules.yaml format (see the package
// documentation). It is the inline-policy form of the engine; errors name
// the file as rules.yaml.
//
// # Errors
//
// Every error is a *[bundle.Error] whose File is rules.yaml, whose Line is
// the line of the offending node, whose Item names the rule (`rule "id"`,
// or `rules[i]` before the id is known) and whose Field is the dotted path of
// the field, for example:
//
//	rules.yaml:7: rule "allow-reads": when.arguments.command: regex: error parsing regexp: missing closing ): `^(ls`
func Parse(src []byte) (*RuleSet, error) {
	return parse(bundle.RulesFile, src)
}

// DefaultAction returns the rule set's default_action, deny when it does not
// set one. Apply it with policy.ApplyDefault, which also allows an unmatched
// local step whatever it says. For a bundle, use [bundle.Bundle.DefaultAction],
// which gives bundle.yaml's default_action precedence.
func (rs *RuleSet) DefaultAction() policy.Action {
	if rs.defaultAction == "" {
		return policy.Deny
	}
	return rs.defaultAction
}

// RuleIDs returns the rule ids in evaluation order.
func (rs *RuleSet) RuleIDs() []string {
	ids := make([]string, len(rs.rules))
	for i, r := range rs.rules {
		ids[i] = r.id
	}
	return ids
}

// Evaluator returns an evaluator for the rule set.
func (rs *RuleSet) Evaluator() policy.Evaluator { return &evaluator{rs: rs} }

// Evaluate returns the decision of the first rule, in evaluation order, whose
// when matches in, or nil when none does. It is deterministic, safe for
// concurrent use, and allocates only the returned decision (plus the
// unescaped copy of an argument string that contains JSON escapes, when a
// contains or regex predicate reads it).
//
// The returned decision is a fresh copy, but its Approval and RateLimit
// point to values shared by every evaluation: do not modify them.
func (rs *RuleSet) Evaluate(in *policy.Input) *policy.Answer {
	km, em := kindBit(in.Step.Kind), effectBit(in.Step.Effect)
	var m memo
	for _, r := range rs.rules {
		if r.match(in, km, em, &m) {
			d := r.decision
			return &d
		}
	}
	return nil
}

type evaluator struct{ rs *RuleSet }

var _ policy.Evaluator = (*evaluator)(nil)

// Evaluate implements policy.Evaluator (see [RuleSet.Evaluate]).
func (e *evaluator) Evaluate(ctx context.Context, in *policy.Input) (*policy.Answer, error) {
	if in == nil {
		return nil, errors.New("rules: evaluate: nil input")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("rules: evaluate: %w", err)
	}
	return e.rs.Evaluate(in), nil
}

// Close implements policy.Evaluator; a rules evaluator holds no resources.
func (e *evaluator) Close() error { return nil }

// rule is one compiled rule.
type rule struct {
	id       string
	priority int
	index    int // position in the file, for stable ordering

	kinds   uint8 // bit set of kindBit; 0 = any
	effects uint8 // bit set of effectBit; 0 = any
	agents  []string
	targets []*bundle.Glob
	args    []argPred

	decision policy.Answer
}

// argPred is one entry of when.arguments: operators that must all hold for
// the value at path.
type argPred struct {
	path []pathSeg
	slot int // memo slot, or -1
	ops  []op
}

// value returns the raw value at the predicate's path, using and filling
// the evaluation's memo.
func (p *argPred) value(args []byte, m *memo) ([]byte, bool) {
	if p.slot < 0 || len(args) > math.MaxInt32 {
		s, e, ok := lookup(args, p.path)
		return args[s:e], ok
	}
	switch m.state[p.slot] {
	case 1:
		return args[m.start[p.slot]:m.end[p.slot]], true
	case 2:
		return nil, false
	}
	s, e, ok := lookup(args, p.path)
	if !ok {
		m.state[p.slot] = 2
		return nil, false
	}
	m.state[p.slot], m.start[p.slot], m.end[p.slot] = 1, int32(s), int32(e)
	return args[s:e], true
}

type opKind uint8

const (
	opEquals opKind = iota
	opContains
	opOneOf
	opRegex
)

type op struct {
	kind opKind
	val  *value   // equals, contains
	set  []*value // one_of
	re   *regexp.Regexp
}

func kindBit(k string) uint8 {
	switch k {
	case policy.KindToolCall:
		return 1
	case policy.KindLLMCall:
		return 2
	case policy.KindLocal:
		return 4
	}
	return 0
}

func effectBit(e string) uint8 {
	switch e {
	case policy.EffectReadOnly:
		return 1
	case policy.EffectLocalMutation:
		return 2
	case policy.EffectRemoteMutation:
		return 4
	case policy.EffectDestructive:
		return 8
	}
	return 0
}

func (r *rule) match(in *policy.Input, km, em uint8, m *memo) bool {
	if r.kinds != 0 && r.kinds&km == 0 {
		return false
	}
	if r.effects != 0 && r.effects&em == 0 {
		return false
	}
	if r.agents != nil && !containsString(r.agents, in.AgentID) {
		return false
	}
	if r.targets != nil {
		hit := false
		for _, g := range r.targets {
			if g.Match(in.Step.Target) {
				hit = true
				break
			}
		}
		if !hit {
			return false
		}
	}
	for i := range r.args {
		p := &r.args[i]
		raw, ok := p.value(in.Step.Args, m)
		if !ok {
			return false
		}
		for j := range p.ops {
			if !p.ops[j].holds(raw) {
				return false
			}
		}
	}
	return true
}

func containsString(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// holds reports whether the operator holds for the raw JSON value raw.
func (o *op) holds(raw []byte) bool {
	switch o.kind {
	case opEquals:
		return equal(raw, o.val)
	case opOneOf:
		for _, v := range o.set {
			if equal(raw, v) {
				return true
			}
		}
		return false
	case opContains:
		switch raw[0] {
		case '"':
			if o.val.kind != kString {
				return false
			}
			body, esc, ok := stringBody(raw)
			if !ok {
				return false
			}
			if esc {
				body = unescape(body)
			}
			return bytes.Contains(body, o.val.bs)
		case '[':
			it := newIter(raw, 0)
			for {
				_, _, vs, ve, ok := it.next()
				if !ok {
					return false
				}
				if equal(raw[vs:ve], o.val) {
					return true
				}
			}
		}
		return false
	case opRegex:
		body, esc, ok := stringBody(raw)
		if !ok {
			return false
		}
		if esc {
			body = unescape(body)
		}
		return o.re.Match(body)
	}
	return false
}

// DeniesOutright reports whether the rule set denies (or aborts) a step
// like in whatever its arguments: the first rule that could match it,
// looking at everything but the arguments, denies with no condition on
// them, or every rule that could match denies and nothing else would
// (def, the default action when no rule matches; "" for a bundle whose
// default does not apply, a guard). A rule with argument conditions that
// does not deny makes the answer false: some arguments may reach it. It
// is what `wicket mcp-proxy --hide-denied` asks.
func (rs *RuleSet) DeniesOutright(in *policy.Input, def policy.Action) bool {
	km, em := kindBit(in.Step.Kind), effectBit(in.Step.Effect)
	for _, r := range rs.rules {
		if !r.matchStatic(in, km, em) {
			continue
		}
		denies := r.decision.Action.Rank() >= policy.Deny.Rank()
		if !denies {
			return false
		}
		if len(r.args) == 0 {
			return true
		}
	}
	if def == "" {
		return false
	}
	return policy.ApplyDefault(nil, def, in.Step.Kind).Action.Rank() >= policy.Deny.Rank()
}

// DeniesOutright implements the host's static check (see
// [RuleSet.DeniesOutright]).
func (e *evaluator) DeniesOutright(in *policy.Input, def policy.Action) bool {
	return e.rs.DeniesOutright(in, def)
}

// matchStatic is match without the argument predicates.
func (r *rule) matchStatic(in *policy.Input, km, em uint8) bool {
	if r.kinds != 0 && r.kinds&km == 0 {
		return false
	}
	if r.effects != 0 && r.effects&em == 0 {
		return false
	}
	if r.agents != nil && !containsString(r.agents, in.AgentID) {
		return false
	}
	if r.targets != nil {
		for _, g := range r.targets {
			if g.Match(in.Step.Target) {
				return true
			}
		}
		return false
	}
	return true
}
