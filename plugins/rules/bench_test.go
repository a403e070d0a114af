package rules

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/kernel/policy"
)

// benchRuleSet is 20 realistic rules; only the last one matches
// github.create_issue with the bench args.
func benchRuleSet(t testing.TB) *RuleSet {
	t.Helper()
	var b strings.Builder
	b.WriteString("default_action: deny\nrules:\n")
	for i := 0; i < 19; i++ {
		switch i % 4 {
		case 0:
			fmt.Fprintf(&b, "  - id: r%d\n    when: {target: \"fs.read%d*\", effect: read_only}\n    then: {decision: allow}\n", i, i)
		case 1:
			fmt.Fprintf(&b, "  - id: r%d\n    when:\n      target: shell.exec\n      arguments:\n        command: {regex: \"^(ls|cat%d) \"}\n    then: {decision: allow}\n", i, i)
		case 2:
			fmt.Fprintf(&b, "  - id: r%d\n    when:\n      targets: [\"github.*\", \"gitlab.*\"]\n      agent_ids: [bot%d]\n    then: {decision: require_approval}\n", i, i)
		case 3:
			fmt.Fprintf(&b, "  - id: r%d\n    when:\n      target: \"github.*\"\n      arguments:\n        repo: {one_of: [acme/x%d, acme/y%d]}\n    then: {decision: deny}\n", i, i, i)
		}
	}
	b.WriteString(`  - id: last
    when:
      target: "github.create_*"
      step_kind: tool_call
      arguments:
        repo: {equals: acme/web}
        labels: {contains: urgent}
        body: {regex: "(?i)outage"}
    then: {decision: allow, reason: urgent}
`)
	rs, err := Parse([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.rules) != 20 {
		t.Fatalf("%d rules", len(rs.rules))
	}
	return rs
}

func benchInput(t testing.TB, target string) *policy.Input {
	return input(t, "tool_call", target, `{"repo":"acme/web","title":"Site down","body":"Full outage since 09:00, see logs","labels":["bug","urgent"],"assignees":["alice"],"meta":{"source":"pager","severity":1}}`)
}

// BenchmarkRulesEvaluate: 20 rules, the match at the last rule, and no
// match at all (every rule tried).
func BenchmarkRulesEvaluate(b *testing.B) {
	rs := benchRuleSet(b)
	for _, bc := range []struct{ name, target, want string }{
		{"match-last", "github.create_issue", "last"},
		{"no-match", "email.send", "<none>"},
		{"no-match-github", "github.delete_repo", "<none>"},
	} {
		in := benchInput(b, bc.target)
		if got := ruleID(rs.Evaluate(in)); got != bc.want {
			b.Fatalf("%s: got %s, want %s", bc.name, got, bc.want)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				rs.Evaluate(in)
			}
		})
	}
}

// BenchmarkArgLookup weighs the raw-bytes scanner against what it saves:
// decoding the step's args with encoding/json and walking the result, which
// is what a predicate would otherwise cost per evaluation.
func BenchmarkArgLookup(b *testing.B) {
	args := benchInput(b, "github.create_issue").Step.Args
	p, err := parsePath("meta.severity")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("scan", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, ok := lookup(args, p); !ok {
				b.Fatal("not found")
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			dec := json.NewDecoder(bytes.NewReader(args))
			dec.UseNumber()
			var v any
			if err := dec.Decode(&v); err != nil {
				b.Fatal(err)
			}
			if _, ok := v.(map[string]any)["meta"].(map[string]any)["severity"]; !ok {
				b.Fatal("not found")
			}
		}
	})
}
