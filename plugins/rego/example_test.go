package rego_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/rego"
)

// Compile a bundle once, then evaluate steps against it.
func Example() {
	b := &bundle.Bundle{
		Manifest: bundle.Manifest{Name: "shell-guard", Revision: "1", Engine: "rego", Entrypoint: "data.wicket.decision"},
		Files: map[string][]byte{"policy.rego": []byte(`package wicket

decision := {"decision": "deny", "reason": "recursive delete", "rule_id": "no-rm-rf"} if {
	input.step.target == "shell.exec"
	regex.match(` + "`rm\\s+-rf`" + `, input.step.args.command)
} else := {"decision": "allow", "rule_id": "allow-list"} if {
	input.step.target in data.allowed
}
`)},
		Data: json.RawMessage(`{"allowed": ["shell.exec", "fs.read"]}`),
	}

	ev, err := rego.New().Compile(context.Background(), b)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ev.Close()

	for _, s := range []policy.Step{
		{Kind: policy.KindToolCall, Target: "shell.exec", Args: json.RawMessage(`{"command": "ls -l"}`)},
		{Kind: policy.KindToolCall, Target: "shell.exec", Args: json.RawMessage(`{"command": "rm -rf /"}`)},
		{Kind: policy.KindToolCall, Target: "net.fetch", Args: json.RawMessage(`{}`)},
	} {
		d, err := ev.Evaluate(context.Background(), &policy.Input{Tenant: "acme", Step: s})
		switch {
		case err != nil:
			fmt.Println("error:", err)
		case d == nil:
			fmt.Printf("%s: no match\n", s.Target)
		default:
			fmt.Printf("%s: %s (%s)\n", s.Target, d.Action, d.RuleID)
		}
	}

	// A policy that reaches the network is refused at compile time.
	b.Files["policy.rego"] = []byte("package wicket\n\ndecision := http.send({\"method\": \"GET\", \"url\": \"https://example.com\"}).body\n")
	_, err = rego.New().Compile(context.Background(), b)
	fmt.Println(err)

	// Output:
	// shell.exec: allow (allow-list)
	// shell.exec: deny (no-rm-rf)
	// net.fetch: no match
	// rego: compile bundle "shell-guard" rev 1: policy.rego:3: rego_type_error: builtin http.send is not allowed in wicket policies: it reaches the network
}
