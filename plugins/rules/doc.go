// Package rules is Wicket's native policy engine: ordered YAML rules that
// match a step by target, agent, kind, declared effect and argument
// predicates, and answer with a decision.
//
// # Basics
//
//	eng := rules.New()                // engine "rules"
//	ev, err := eng.Compile(ctx, b)    // b: a *bundle.Bundle with engine: rules
//	d, err := ev.Evaluate(ctx, in)    // nil: no rule matched
//	d = policy.ApplyDefault(d, b.DefaultAction(), in.Step.Kind)
//
// The inline form (the body of POST /v0/policies/{agent_id}) is parsed with
// [Parse]; [RuleSet.DefaultAction] and [RuleSet.Evaluator] serve it.
//
// # Format
//
// rules.yaml:
//
//	default_action: deny            # allow | deny; empty: deny
//	rules:
//	  - id: allow-reads             # required, unique, ^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$
//	    priority: 10                # integer, default 0; lowest first; ties keep file order
//	    description: reads are safe # optional, ignored
//	    when:                       # optional; absent or {} matches every step
//	      target: "fs.read*"        # glob (see bundle.Glob), or targets: [globs]
//	      agent_id: researcher      # exact, or agent_ids: [..]
//	      step_kind: tool_call      # tool_call | llm_call | local, or step_kinds: [..]
//	      effect: read_only         # read_only | local_mutation | remote_mutation |
//	                                # destructive, or effects: [..]
//	      arguments:                # predicates on step.args, by dotted path
//	        command: {regex: "^(ls|cat) "}
//	        repo: {equals: "acme/web"}
//	        labels: {contains: "urgent"}
//	        env: {one_of: [dev, staging]}
//	        files.0.path: {regex: "^/tmp/"}
//	    then:
//	      decision: allow           # allow | deny | require_approval | abort
//	      reason: "..."             # optional
//	      approval_config:          # require_approval only
//	        approvers: [alice]
//	        timeout: 30m
//	        message: "..."
//	      rate_limit:               # allow and require_approval only
//	        max_calls: 10
//	        window: 1m
//	        per: execution          # execution | agent | tenant
//	        algorithm: sliding      # sliding | fixed
//	        on_limiter_error: fail_closed
//
// # Matching
//
// Rules are tried in priority order (lowest first, ties in file order) and
// the first whose when holds answers: its then becomes the decision, with
// rule_id set to the rule's id. When no rule matches, the evaluator answers
// nil and the host applies the default action (policy.ApplyDefault, which
// always allows an unmatched local step).
//
// Every condition of a when must hold. A singular field (target) and its
// plural (targets) are alternatives: give one. A list matches when any of its
// entries does. A rule with an effect condition never matches a step that
// declared no effect.
//
// An arguments entry is a dotted path into step.args: "a.b.0.c" reads key a,
// then key b, then element 0 of an array (or key "0" of an object), then key
// c. Keys containing "." cannot be addressed. A predicate holds only if the
// path exists, and then every operator given must hold:
//
//   - equals: the value equals the operand: same JSON type and value;
//     numbers compare by exact value (1 equals 1.0), objects by keys and
//     values, arrays element by element;
//   - contains: for a string value, the operand is a substring (the operand
//     must then be a string); for an array, one element equals the operand;
//     any other value never contains anything;
//   - one_of: the value equals one of the listed operands;
//   - regex: the value is a string that the RE2 expression (Go regexp
//     syntax) matches somewhere; anchor with ^ and $ to match the whole
//     string. A non-string value never matches.
//
// Operands are YAML values converted to JSON as bundle.JSONFromYAML does.
//
// # Errors
//
// Loading is strict, and every problem is a load error (a *bundle.Error)
// naming the line, the rule and the field; every problem of the file is
// reported at once (a bundle.Errors when there are several), each rule and
// field checked even when an earlier one failed: unknown fields, duplicate keys,
// duplicate rule ids, missing id or then.decision, unknown decisions, kinds
// or effects, invalid globs, regexes (compiled once, at load) and
// durations, an empty predicate ({}, no operator, an empty arguments or an
// empty list), approval_config on a decision other than require_approval,
// rate_limit on deny or abort, YAML aliases and merge keys.
//
// # Performance
//
// Everything is compiled at load. Evaluate reads arguments straight from the
// canonical JSON bytes of step.args without decoding them and allocates
// only the returned decision; see BenchmarkRulesEvaluate.
package rules
