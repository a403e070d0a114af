package rules

import (
	"errors"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// TestParseErrors covers every class of load error; each must name the
// line, the rule (by id once known, by index before) and the field.
func TestParseErrors(t *testing.T) {
	rule := func(body string) string {
		return "default_action: deny\nrules:\n  - id: r1\n    then: {decision: allow}\n  - id: allow-reads\n" + body
	}
	tests := []struct {
		name  string
		src   string
		line  int
		item  string
		field string
		want  string
	}{
		// document
		{"empty", "", 0, "", "", "empty file"},
		{"not a mapping", "- a\n", 1, "", "", "want a mapping"},
		{"two documents", "rules: []\n---\nrules: []\n", 0, "", "", "more than one YAML document"},
		{"syntax", "rules: [\n", 1, "", "", "did not find expected"},
		{"unknown top field", "default_action: deny\nversion: 2\n", 2, "", "version", "unknown field (want default_action, rules)"},
		{"duplicate top field", "rules: []\nrules: []\n", 2, "", "rules", "defined twice (also line 1)"},
		{"default_action", "default_action: abort\n", 1, "", "default_action", `must be allow or deny, got "abort"`},
		{"rules not a list", "rules: {a: 1}\n", 1, "", "rules", "want a list of rules"},
		{"rule not a mapping", "rules:\n  - allow\n", 2, "rules[0]", "", `want a mapping, got "allow"`},
		{"empty rule", "rules:\n  -\n", 0, "rules[0]", "", "empty rule"},
		// id
		{"id missing", "rules:\n  - then: {decision: allow}\n", 2, "rules[0]", "id", "required"},
		{"id empty", "rules:\n  - id: ''\n    then: {decision: allow}\n", 2, "rules[0]", "id", "empty value"},
		{"id invalid", "rules:\n  - id: 'has space'\n    then: {decision: allow}\n", 2, "rules[0]", "id", "does not match"},
		{"id reserved", "rules:\n  - id: default_action\n    then: {decision: allow}\n", 2, "rules[0]", "id", "reserved"},
		{"id duplicate", rule("    then: {decision: allow}\n  - id: allow-reads\n    then: {decision: deny}\n"), 7, `rule "allow-reads"`, "id", "duplicate id (also rules[1])"},
		{"unknown rule field", rule("    then: {decision: allow}\n    enabled: true\n"), 7, `rule "allow-reads"`, "enabled", "unknown field"},
		{"priority not int", rule("    priority: high\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "priority", "want an integer"},
		{"description list", rule("    description: [a]\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "description", "want a string"},
		// when
		{"when not a mapping", rule("    when: [a]\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when", "want a mapping"},
		{"unknown when field", rule("    when: {tool: x}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.tool", "unknown field"},
		{"target and targets", rule("    when: {target: a, targets: [b]}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.targets", "give target or targets, not both"},
		{"target list", rule("    when: {target: [a]}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.target", "want a string"},
		{"targets empty", rule("    when: {targets: []}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.targets", "empty list"},
		{"targets scalar", rule("    when: {targets: a}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.targets", "want a list"},
		{"target empty", rule("    when: {target: ''}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.target", "empty value"},
		{"target bad glob", rule("    when: {targets: [ok, 'bad\\']}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.targets[1]", "unpaired"},
		{"agent_ids entry empty", rule("    when: {agent_ids: [a, '']}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.agent_ids[1]", "empty value"},
		{"step_kind unknown", rule("    when: {step_kind: tool}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.step_kind", `unknown step kind "tool"`},
		{"effects unknown", rule("    when: {effects: [read_only, readonly]}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.effects", `unknown effect "readonly"`},
		{"alias", rule("    when: {target: &t x, agent_id: *t}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.agent_id", "aliases are not supported"},
		// arguments
		{"arguments empty", rule("    when: {arguments: {}}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.arguments", "empty"},
		{"arguments null", rule("    when:\n      arguments:\n    then: {decision: allow}\n"), 0, `rule "allow-reads"`, "when.arguments", "empty"},
		{"predicate empty map", rule("    when: {arguments: {command: {}}}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.arguments.command", "empty predicate"},
		{"predicate null", rule("    when:\n      arguments:\n        command:\n    then: {decision: allow}\n"), 0, `rule "allow-reads"`, "when.arguments.command", "empty predicate"},
		{"predicate scalar", rule("    when: {arguments: {command: ls}}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.arguments.command", "want a predicate"},
		{"unknown operator", rule("    when: {arguments: {command: {startswith: ls}}}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.arguments.command.startswith", "unknown field (want equals, contains, one_of, regex)"},
		{"bad regex", rule("    when:\n      arguments:\n        command: {regex: \"^(ls\"}\n    then: {decision: allow}\n"), 8, `rule "allow-reads"`, "when.arguments.command", "regex: error parsing regexp: missing closing )"},
		{"regex not string", rule("    when: {arguments: {command: {regex: [a]}}}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.arguments.command", "regex: want a string"},
		{"one_of empty", rule("    when: {arguments: {env: {one_of: []}}}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.arguments.env", "one_of: empty list"},
		{"one_of scalar", rule("    when: {arguments: {env: {one_of: dev}}}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.arguments.env", "one_of: want a list"},
		{"operand alias", rule("    when: {arguments: {env: {equals: {a: &x 1, b: *x}}}}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.arguments.env", "aliases"},
		{"operand inf", rule("    when: {arguments: {n: {equals: .inf}}}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.arguments.n", "equals: line 6: .inf has no JSON form"},
		{"path empty element", rule("    when: {arguments: {a..b: {equals: 1}}}\n    then: {decision: allow}\n"), 6, `rule "allow-reads"`, "when.arguments.a..b", "empty element"},
		// then
		{"then missing", rule("    when: {target: x}\n"), 5, `rule "allow-reads"`, "then", "required"},
		{"then null", rule("    then:\n"), 5, `rule "allow-reads"`, "then", "required"},
		{"decision missing", rule("    then: {reason: x}\n"), 6, `rule "allow-reads"`, "then.decision", "required"},
		{"decision unknown", rule("    then: {decision: permit}\n"), 6, `rule "allow-reads"`, "then.decision", `unknown decision "permit"`},
		{"unknown then field", rule("    then: {decision: allow, log: true}\n"), 6, `rule "allow-reads"`, "then.log", "unknown field"},
		// what is recorded with every step it decides is held to sizes
		{"reason too long", rule("    then: {decision: deny, reason: " + strings.Repeat("r", policy.MaxReasonBytes+1) + "}\n"), 6, `rule "allow-reads"`, "then", "reason is 4097 bytes; at most 4096"},
		{"too many approvers", rule("    then: {decision: require_approval, approval_config: {approvers: [" + strings.Repeat("a,", policy.MaxApprovers) + "a]}}\n"), 6, `rule "allow-reads"`, "then", "approval.approvers lists 101; at most 100"},
		{"approval on allow", rule("    then: {decision: allow, approval_config: {approvers: [a]}}\n"), 6, `rule "allow-reads"`, "then.approval_config", "only applies to decision require_approval"},
		{"approval timeout", rule("    then: {decision: require_approval, approval_config: {timeout: soon}}\n"), 6, `rule "allow-reads"`, "then.approval_config.timeout", "positive Go duration"},
		{"approval unknown field", rule("    then: {decision: require_approval, approval_config: {channel: x}}\n"), 6, `rule "allow-reads"`, "then.approval_config.channel", "unknown field"},
		{"approvers empty", rule("    then: {decision: require_approval, approval_config: {approvers: []}}\n"), 6, `rule "allow-reads"`, "then.approval_config.approvers", "empty list"},
		{"rate limit on deny", rule("    then: {decision: deny, rate_limit: {max_calls: 1, window: 1m}}\n"), 6, `rule "allow-reads"`, "then.rate_limit", "only applies to decisions allow and require_approval"},
		{"rate limit empty", rule("    then:\n      decision: allow\n      rate_limit:\n"), 0, `rule "allow-reads"`, "then.rate_limit", "empty"},
		{"rate limit max_calls", rule("    then:\n      decision: allow\n      rate_limit: {max_calls: 0, window: 1m}\n"), 8, `rule "allow-reads"`, "then.rate_limit.max_calls", "must be > 0"},
		{"rate limit max_calls string", rule("    then:\n      decision: allow\n      rate_limit: {max_calls: '5', window: 1m}\n"), 8, `rule "allow-reads"`, "then.rate_limit.max_calls", "want an integer"},
		{"rate limit window", rule("    then:\n      decision: allow\n      rate_limit:\n        max_calls: 1\n        window: 0s\n"), 10, `rule "allow-reads"`, "then.rate_limit.window", "positive Go duration"},
		{"rate limit window missing", rule("    then:\n      decision: allow\n      rate_limit: {max_calls: 1}\n"), 8, `rule "allow-reads"`, "then.rate_limit.window", "positive Go duration"},
		{"rate limit per", rule("    then:\n      decision: allow\n      rate_limit: {max_calls: 1, window: 1m, per: user}\n"), 8, `rule "allow-reads"`, "then.rate_limit.per", `got "user"`},
		{"rate limit algorithm", rule("    then:\n      decision: allow\n      rate_limit: {max_calls: 1, window: 1m, algorithm: leaky}\n"), 8, `rule "allow-reads"`, "then.rate_limit.algorithm", `got "leaky"`},
		{"rate limit on_limiter_error", rule("    then:\n      decision: allow\n      rate_limit: {max_calls: 1, window: 1m, on_limiter_error: ignore}\n"), 8, `rule "allow-reads"`, "then.rate_limit.on_limiter_error", `got "ignore"`},
		{"rate limit unknown field", rule("    then:\n      decision: allow\n      rate_limit: {max_calls: 1, window: 1m, burst: 2}\n"), 8, `rule "allow-reads"`, "then.rate_limit.burst", "unknown field"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs, err := Parse([]byte(tt.src))
			if err == nil {
				t.Fatalf("parsed %v, want an error", rs.RuleIDs())
			}
			var e *bundle.Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v (%T) is not a *bundle.Error", err, err)
			}
			if e.File != "rules.yaml" {
				t.Errorf("File = %q", e.File)
			}
			if tt.line != 0 && e.Line != tt.line {
				t.Errorf("Line = %d, want %d (%v)", e.Line, tt.line, err)
			}
			if e.Item != tt.item {
				t.Errorf("Item = %q, want %q (%v)", e.Item, tt.item, err)
			}
			if e.Field != tt.field {
				t.Errorf("Field = %q, want %q (%v)", e.Field, tt.field, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

func TestParseErrorMessage(t *testing.T) {
	src := "rules:\n  - id: allow-reads\n    when:\n      arguments:\n        command: {regex: \"^(ls|cat\"}\n    then: {decision: allow}\n"
	_, err := Parse([]byte(src))
	want := "rules.yaml:5: rule \"allow-reads\": when.arguments.command: regex: error parsing regexp: missing closing ): `^(ls|cat`"
	if err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}
}

func TestParseValid(t *testing.T) {
	for _, src := range []string{
		"rules: []\n",
		"default_action: allow\n",
		"default_action:\nrules:\n",
		"rules:\n  - id: all\n    then: {decision: deny}\n",
		"rules:\n  - id: all\n    when: {}\n    then: {decision: deny}\n",
		"rules:\n  - id: all\n    when:\n    then: {decision: deny}\n",
		"rules:\n  - id: x\n    when: {arguments: {a: {equals: null}}}\n    then: {decision: deny}\n",
		"rules:\n  - id: x\n    then: {decision: require_approval, approval_config: {approvers: [a], timeout: 1h, message: m}, rate_limit: {max_calls: 1, window: 1s}}\n",
	} {
		if _, err := Parse([]byte(src)); err != nil {
			t.Errorf("Parse(%q): %v", src, err)
		}
	}
}

// TestParseReportsEveryProblem: one parse reports every problem of the
// file, across rules and within one rule, each with its line, rule and
// field.
func TestParseReportsEveryProblem(t *testing.T) {
	src := `default_action: maybe
rules:
  - id: a
    when: {target: x, effect: loud, colour: red}
    then: {decision: allow, reason: [x]}
  - id: a
    then: {decision: allow}
  - id: b
    priority: high
    then: {decision: deny, approval_config: {timeout: 1h}}
  - id: c
    when: {arguments: {cmd: {regex: "("}, n: {one_of: []}}}
    then: {decision: allow, rate_limit: {max_calls: 1, window: 0s}}
`
	_, err := Parse([]byte(src))
	var es bundle.Errors
	if !errors.As(err, &es) {
		t.Fatalf("Parse = %v, want several problems", err)
	}
	want := []string{
		`rules.yaml:1: default_action: must be allow or deny, got "maybe"`,
		`rules.yaml:4: rule "a": when.colour: unknown field`,
		`rules.yaml:4: rule "a": when.effect: unknown effect "loud"`,
		`rules.yaml:5: rule "a": then.reason: want a string`,
		`rules.yaml:6: rule "a": id: duplicate id (also rules[0])`,
		`rules.yaml:9: rule "b": priority: want an integer`,
		`rules.yaml:10: rule "b": then.approval_config: only applies to decision require_approval`,
		`rules.yaml:12: rule "c": when.arguments.cmd: regex: error parsing regexp`,
		`rules.yaml:12: rule "c": when.arguments.n: one_of: empty list`,
		`rules.yaml:13: rule "c": then.rate_limit.window: must be a positive Go duration`,
	}
	if len(es) != len(want) {
		t.Fatalf("%d problems, want %d:\n%v", len(es), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(es[i].Error(), w) {
			t.Errorf("problem %d = %q, want prefix %q", i, es[i], w)
		}
	}
}
