package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	opabundle "github.com/open-policy-agent/opa/v1/bundle"
	opa "github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
)

const opaAuthzDir = "../../plugins/bundle/testdata/opa-authz"

// TestPolicyEvalOPABundle runs `wicket policy eval` and `inspect` on an OPA
// bundle as OPA's writer packs it (no bundle.yaml; .manifest; data from
// agents/data.json and tools/data.yaml) and compares with OPA's topdown.
func TestPolicyEvalOPABundle(t *testing.T) {
	ob, err := opabundle.NewCustomReader(opabundle.NewDirectoryLoader(opaAuthzDir)).Read()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := opabundle.NewWriter(&buf).UseModulePath(true).Write(ob); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	archive := filepath.Join(dir, "authz.tar.gz")
	if err := os.WriteFile(archive, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := []func(*opa.Rego){opa.Query("data.wicket.decision"), opa.Store(inmem.NewFromObject(ob.Data))}
	for _, m := range ob.Modules {
		opts = append(opts, opa.ParsedModule(m.Parsed))
	}
	pq, err := opa.New(opts...).PrepareForEval(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	inputs := []string{
		`{"agent_id": "researcher", "step": {"kind": "tool_call", "target": "fs.read", "args": {}}}`,
		`{"agent_id": "researcher", "step": {"kind": "tool_call", "target": "shell.exec", "args": {"command": "rm -rf /"}}}`,
		`{"agent_id": "writer", "step": {"kind": "tool_call", "target": "fs.read", "args": {}}}`,
		`{"agent_id": "nobody", "step": {"kind": "tool_call", "target": "fs.read", "args": {}}}`,
	}
	for _, path := range []string{archive, opaAuthzDir} {
		for i, in := range inputs {
			f := filepath.Join(dir, "in.json")
			if err := os.WriteFile(f, []byte(in), 0o644); err != nil {
				t.Fatal(err)
			}
			out, errOut, err := runCmd(t, ctx, "policy", "eval", "--bundle", path, "--input", f)
			if err != nil {
				t.Fatalf("%s input %d: %v\n%s", path, i, err, errOut)
			}
			var res struct {
				Decision struct {
					Decision string `json:"decision"`
					RuleID   string `json:"rule_id"`
				} `json:"decision"`
				Bundle struct {
					Revision string `json:"revision"`
				} `json:"bundle"`
			}
			if err := json.Unmarshal([]byte(out), &res); err != nil {
				t.Fatalf("%s: %v", out, err)
			}
			var v any
			_ = json.Unmarshal([]byte(in), &v)
			rs, err := pq.Eval(ctx, opa.EvalInput(v))
			if err != nil || len(rs) != 1 {
				t.Fatalf("topdown: %v", err)
			}
			want := rs[0].Expressions[0].Value.(map[string]any)
			if res.Decision.Decision != want["decision"] || res.Decision.RuleID != want["rule_id"] || res.Bundle.Revision != "2026-12-01.1" {
				t.Errorf("%s input %d: wicket %+v, OPA %v", path, i, res, want)
			}
		}
	}
	out, _, err := runCmd(t, ctx, "policy", "inspect", archive)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"name:           authz", "revision:       2026-12-01.1", "engine:         rego", "roots:          wicket, lib, agents, tools", "signature:      none"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect lacks %q:\n%s", want, out)
		}
	}
	out, _, err = runCmd(t, ctx, "policy", "inspect", opaAuthzDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"agents/data.json → data.agents", "tools/data.yaml → data.tools"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect lacks %q:\n%s", want, out)
		}
	}
}

// tarGzFiles packs files with OPA's "/" entry names.
func tarGzFiles(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for p, c := range files {
		if err := tw.WriteHeader(&tar.Header{Name: "/" + p, Mode: 0o644, Size: int64(len(c)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(c)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestPolicyTestRegoUnitTests: `wicket policy test` runs *_test.rego with
// OPA's test runner beside tests/*.yaml and counts both.
func TestPolicyTestRegoUnitTests(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	write := func(name string, files map[string]string) string {
		p := filepath.Join(dir, name+".tar.gz")
		if err := os.WriteFile(p, tarGzFiles(t, files), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	policy := "package wicket\n\ndecision := {\"decision\": \"deny\", \"rule_id\": \"no-shell\"} if input.step.target == \"shell\"\n"
	onlyRego := write("only-rego", map[string]string{
		"policy.rego": policy,
		"policy_test.rego": `package wicket_test

import data.wicket

test_shell_denied if wicket.decision.rule_id == "no-shell" with input as {"step": {"target": "shell"}}

test_read_unmatched if not wicket.decision with input as {"step": {"target": "read"}}

todo_test_later if false
`,
	})
	out, _, err := runCmd(t, ctx, "policy", "test", onlyRego)
	if err != nil || !strings.Contains(out, "2 passed, 0 failed, 1 skipped") {
		t.Fatalf("only Rego tests: %v\n%s", err, out)
	}

	both := write("both", map[string]string{
		"bundle.yaml": "default_action: allow\n",
		"policy.rego": policy,
		"tests/cases.yaml": `cases:
  - {name: shell, step: {kind: tool_call, target: shell}, expect: {decision: deny, rule_id: no-shell}}
  - {name: read, step: {kind: tool_call, target: read}, expect: {decision: allow}}
`,
		"policy_test.rego": `package wicket_test

import data.wicket

test_shell_denied if wicket.decision.decision == "deny" with input as {"step": {"target": "shell"}}

test_wrong if {
	print("decision was", wicket.decision)
	wicket.decision.decision == "allow" with input as {"step": {"target": "shell"}}
}

test_error if 1 / 0 == 1
`,
	})
	out, _, err = runCmd(t, ctx, "policy", "test", both)
	if err == nil {
		t.Fatalf("a failing Rego test must fail the command:\n%s", out)
	}
	for _, want := range []string{"3 passed, 2 failed", "FAIL both/data.wicket_test.test_wrong (policy_test.rego:7)", "FAIL both/data.wicket_test.test_error (policy_test.rego:12): test rule is false or undefined"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	forbidden := write("forbidden", map[string]string{
		"policy.rego":      policy,
		"policy_test.rego": "package wicket_test\n\ntest_net if http.send({\"method\": \"get\", \"url\": \"http://127.0.0.1/\"}).status_code == 200\n",
	})
	if _, _, err := runCmd(t, ctx, "policy", "test", forbidden); err == nil || !strings.Contains(err.Error(), "http.send") {
		t.Fatalf("a test calling a forbidden builtin: %v", err)
	}
}

// TestPolicyBuildSigned: build --signing-key writes OPA's .signatures.json;
// inspect reports it unverified without a key, verified with the right
// one, and refuses the bundle with another.
func TestPolicyBuildSigned(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	secret := filepath.Join(dir, "hmac")
	if err := os.WriteFile(secret, []byte("a-shared-secret-0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("another-secret-0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "authz.tar.gz")
	o, _, err := runCmd(t, ctx, "policy", "build", opaAuthzDir, "-o", out, "--signing-key", secret, "--signing-alg", "HS256")
	if err != nil || !strings.Contains(o, "signed HS256 kid default") {
		t.Fatalf("build: %v\n%s", err, o)
	}
	o, _, err = runCmd(t, ctx, "policy", "inspect", out)
	if err != nil || !strings.Contains(o, "signature:      unverified") {
		t.Fatalf("inspect without a key: %v\n%s", err, o)
	}
	o, _, err = runCmd(t, ctx, "policy", "inspect", "--verification-key", secret, "--verification-alg", "HS256", out)
	if err != nil || !strings.Contains(o, "signature:      verified (6 files)") {
		t.Fatalf("inspect with the key: %v\n%s", err, o)
	}
	if _, _, err = runCmd(t, ctx, "policy", "inspect", "--verification-key", other, "--verification-alg", "HS256", out); err == nil || !strings.Contains(err.Error(), ".signatures.json") {
		t.Fatalf("inspect with another key: %v", err)
	}
	if _, _, err = runCmd(t, ctx, "policy", "test", "--verification-key", secret, "--verification-alg", "HS256", out); err != nil {
		t.Fatalf("test a signed bundle: %v", err)
	}
}
