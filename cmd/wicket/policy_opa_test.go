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
