package bundle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/wicket-run/wicket/kernel/canon"
	"github.com/wicket-run/wicket/kernel/policy"
)

// TestsDir is the directory of a bundle's test files.
const TestsDir = "tests/"

// Defaults [TestCase.Input] fills in for fields a case leaves empty.
const (
	DefaultTestTenant      = "default"
	DefaultTestExecutionID = "00000000-0000-7000-8000-000000000000"
	DefaultTestStatus      = "running"
)

// IsTestFile reports whether the bundle path p is a test file: a .yaml or
// .yml file anywhere under tests/.
func IsTestFile(p string) bool {
	return strings.HasPrefix(p, TestsDir) && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml"))
}

// TestCases parses every test file of the bundle (see [IsTestFile]) in path
// order and returns their cases in file order. Case names must be unique
// across the bundle.
func (b *Bundle) TestCases() ([]TestCase, error) {
	var paths []string
	for p := range b.Files {
		if IsTestFile(p) {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	var all []TestCase
	seen := make(map[string]string)
	for _, p := range paths {
		cases, err := ParseTestFile(p, b.Files[p])
		if err != nil {
			return nil, err
		}
		for _, c := range cases {
			if other, dup := seen[c.Name]; dup {
				return nil, &Error{File: p, Item: fmt.Sprintf("case %q", c.Name), Field: "name", Err: fmt.Errorf("duplicate name (also in %s)", other)}
			}
			seen[c.Name] = p
		}
		all = append(all, cases...)
	}
	return all, nil
}

// ParseTestFile parses one test file, named name within its bundle (used in
// errors and as each case's SourceFile). The file holds a mapping with a
// single key, cases, whose value is a list of [TestCase]:
//
//	cases:
//	  - name: reads are allowed
//	    agent_id: researcher
//	    step: {kind: tool_call, target: fs.read, args: {path: /tmp/x}, effect: read_only}
//	    execution: {labels: {team: web}, totals: {steps: 3}}
//	    expect: {decision: allow, rule_id: allow-reads}
//
// YAML values become JSON as [JSONFromYAML] describes, then decode with the
// JSON field names of TestCase; unknown fields are errors. A case needs a
// name, a step with a known kind and a target, and an expected decision.
func ParseTestFile(name string, src []byte) ([]TestCase, error) {
	fileErr := func(line int, item, field string, err error) error {
		return &Error{File: name, Line: line, Item: item, Field: field, Err: err}
	}
	dec := yaml.NewDecoder(bytes.NewReader(src))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fileErr(0, "", "", errors.New("empty test file (want a mapping with cases: [...])"))
		}
		line, msg := SplitYAMLLine(yamlReason(err))
		return nil, fileErr(line, "", "", errors.New(msg))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fileErr(0, "", "", errors.New("more than one YAML document"))
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		return nil, fileErr(root.Line, "", "", errors.New("want a mapping with cases: [...]"))
	}
	var list *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Value != "cases" {
			return nil, fileErr(k.Line, "", k.Value, errors.New("unknown field (want cases)"))
		}
		if list != nil {
			return nil, fileErr(k.Line, "", "cases", errors.New("defined twice"))
		}
		list = v
	}
	if list == nil {
		return nil, fileErr(root.Line, "", "cases", errors.New("required"))
	}
	if list.Kind != yaml.SequenceNode {
		if list.ShortTag() == "!!null" {
			return nil, nil
		}
		return nil, fileErr(list.Line, "", "cases", errors.New("want a list of test cases"))
	}

	cases := make([]TestCase, 0, len(list.Content))
	names := make(map[string]int, len(list.Content))
	for i, n := range list.Content {
		item := fmt.Sprintf("cases[%d]", i)
		raw, err := JSONFromYAML(n)
		if err != nil {
			var e *Error
			if errors.As(err, &e) {
				return nil, fileErr(e.Line, item, "", e.Err)
			}
			return nil, fileErr(n.Line, item, "", err)
		}
		jd := json.NewDecoder(bytes.NewReader(raw))
		jd.UseNumber()
		jd.DisallowUnknownFields()
		var tc TestCase
		if err := jd.Decode(&tc); err != nil {
			return nil, fileErr(n.Line, item, "", errors.New(strings.TrimPrefix(err.Error(), "json: ")))
		}
		if tc.Name == "" {
			return nil, fileErr(n.Line, item, "name", errors.New("required"))
		}
		if err := checkText(tc.Name, 256); err != nil {
			return nil, fileErr(n.Line, item, "name", err)
		}
		item = fmt.Sprintf("case %q", tc.Name)
		if j, dup := names[tc.Name]; dup {
			return nil, fileErr(n.Line, item, "name", fmt.Errorf("duplicate name (also cases[%d])", j))
		}
		names[tc.Name] = i
		if err := checkCase(&tc); err != nil {
			var e *Error
			if errors.As(err, &e) {
				return nil, fileErr(n.Line, item, e.Field, e.Err)
			}
			return nil, fileErr(n.Line, item, "", err)
		}
		tc.SourceFile = name
		cases = append(cases, tc)
	}
	return cases, nil
}

func checkCase(tc *TestCase) error {
	switch {
	case tc.Step.Kind == "":
		return &Error{Field: "step.kind", Err: errors.New("required (tool_call, llm_call or local)")}
	case !validKind(tc.Step.Kind):
		return &Error{Field: "step.kind", Err: fmt.Errorf("unknown step kind %q (want tool_call, llm_call or local)", tc.Step.Kind)}
	case tc.Step.Target == "":
		return &Error{Field: "step.target", Err: errors.New("required")}
	case tc.Step.Occurrence < 0:
		return &Error{Field: "step.occurrence", Err: errors.New("must be >= 0")}
	case tc.Expect.Decision == "":
		return &Error{Field: "expect.decision", Err: errors.New("required (allow, deny, require_approval or abort)")}
	case !tc.Expect.Decision.Valid():
		return &Error{Field: "expect.decision", Err: fmt.Errorf("unknown decision %q (want allow, deny, require_approval or abort)", tc.Expect.Decision)}
	}
	if _, _, err := tc.Step.canonicalArgs(); err != nil {
		return &Error{Field: "step.args", Err: err}
	}
	return nil
}

// Input builds the policy input document for the case (docs/policy.md).
//
// Args become canonical JSON (kernel/canon) and args_hash is its SHA-256, as
// the kernel computes them for a submitted step; absent args are {}. Empty
// fields take defaults: tenant [DefaultTestTenant], execution_id
// [DefaultTestExecutionID], execution status [DefaultTestStatus] and empty
// labels. Nothing else is invented: an empty agent_id, idempotency or effect
// stays empty.
func (tc TestCase) Input() (*policy.Input, error) {
	if !validKind(tc.Step.Kind) {
		return nil, fmt.Errorf("case %q: step.kind: unknown step kind %q", tc.Name, tc.Step.Kind)
	}
	canonical, hash, err := tc.Step.canonicalArgs()
	if err != nil {
		return nil, fmt.Errorf("case %q: step.args: %w", tc.Name, err)
	}
	in := &policy.Input{
		Tenant:      tc.Tenant,
		AgentID:     tc.AgentID,
		ExecutionID: tc.ExecutionID,
		Step: policy.Step{
			Kind:        tc.Step.Kind,
			Target:      tc.Step.Target,
			Args:        canonical,
			ArgsHash:    hash,
			Idempotency: tc.Step.Idempotency,
			Effect:      tc.Step.Effect,
			Occurrence:  tc.Step.Occurrence,
		},
	}
	if in.Tenant == "" {
		in.Tenant = DefaultTestTenant
	}
	if in.ExecutionID == "" {
		in.ExecutionID = DefaultTestExecutionID
	}
	if tc.Execution != nil {
		in.Execution = *tc.Execution
		// Copy the labels so that the input never aliases the case.
		labels := make(map[string]string, len(tc.Execution.Labels))
		for k, v := range tc.Execution.Labels {
			labels[k] = v
		}
		in.Execution.Labels = labels
	}
	if in.Execution.Status == "" {
		in.Execution.Status = DefaultTestStatus
	}
	if in.Execution.Labels == nil {
		in.Execution.Labels = map[string]string{}
	}
	return in, nil
}

// canonicalArgs returns the canonical JSON of the args and its hash.
func (s TestStep) canonicalArgs() ([]byte, string, error) {
	raw, err := argsJSON(s.Args)
	if err != nil {
		return nil, "", err
	}
	return canon.ArgsHash(raw)
}

// argsJSON encodes test-case args as JSON; nil is {}.
func argsJSON(args any) ([]byte, error) {
	switch a := args.(type) {
	case nil:
		return []byte("{}"), nil
	case json.RawMessage:
		return a, nil
	}
	v, err := jsonable(args, 0)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// jsonable converts map[any]any (as yaml.v3 decodes mappings with non-string
// keys) into map[string]any so that encoding/json accepts the value.
func jsonable(v any, depth int) (any, error) {
	if depth > maxYAMLDepth {
		return nil, fmt.Errorf("nesting deeper than %d", maxYAMLDepth)
	}
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			c, err := jsonable(e, depth+1)
			if err != nil {
				return nil, err
			}
			out[k] = c
		}
		return out, nil
	case map[any]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			ks := fmt.Sprint(k)
			if _, dup := out[ks]; dup {
				return nil, fmt.Errorf("key %q appears twice", ks)
			}
			c, err := jsonable(e, depth+1)
			if err != nil {
				return nil, err
			}
			out[ks] = c
		}
		return out, nil
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			c, err := jsonable(e, depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	}
	return v, nil
}
