package bundle

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

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
// across the bundle. Every problem of every file is reported ([Join]).
func (b *Bundle) TestCases() ([]TestCase, error) {
	return parseTestFiles(b.Files)
}

func parseTestFiles(files map[string][]byte) ([]TestCase, error) {
	var paths []string
	for p := range files {
		if IsTestFile(p) {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	var all []TestCase
	var errs []error
	seen := make(map[string]string)
	for _, p := range paths {
		cases, err := ParseTestFile(p, files[p])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, c := range cases {
			if other, dup := seen[c.Name]; dup {
				errs = append(errs, &Error{File: p, Line: c.SourceLine, Item: fmt.Sprintf("case %q", c.Name), Field: "name", Err: fmt.Errorf("duplicate name (also in %s)", other)})
				continue
			}
			seen[c.Name] = p
		}
		all = append(all, cases...)
	}
	if err := Join(errs...); err != nil {
		return nil, err
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
// An entry of the list with a table key is a table: one case per row,
// each row the template with the row's values set at the columns' field
// paths (a row may also be a mapping, merged onto the template). A row
// with a name column is named "TABLE/NAME", one without "TABLE[i]":
//
//	cases:
//	  - table: reads
//	    template: {step: {kind: tool_call, effect: read_only}, expect: {decision: allow}}
//	    columns: [name, step.target, expect.rule_id]
//	    rows:
//	      - [search, search, allow-listed-tools]
//	      - [fs.read, fs.read, allow-listed-tools]
//	      - {name: rm, step: {target: rm}, expect: {decision: deny}}
//
// YAML values become JSON as [JSONFromYAML] describes, then decode with the
// JSON field names of TestCase; unknown fields are errors. A case needs a
// name, a step with a known kind and a target, and an expected decision.
// Every problem of the file is reported, each with its line ([Join]).
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

	p := &caseParser{file: name, names: make(map[string]string)}
	for i, n := range list.Content {
		item := fmt.Sprintf("cases[%d]", i)
		if mappingValue(n, "table") != nil {
			p.table(item, n)
			continue
		}
		raw, err := JSONFromYAML(n)
		if err != nil {
			p.fail(n, item, "", err)
			continue
		}
		p.add(item, n, raw)
	}
	if err := Join(p.errs...); err != nil {
		return nil, err
	}
	return p.cases, nil
}

// caseParser collects the cases and the problems of one test file.
type caseParser struct {
	file  string
	cases []TestCase
	names map[string]string // case name → item that first used it
	errs  []error
}

// fail records a problem of item at node n. An *Error from JSONFromYAML
// keeps its own line; a field is looked up below n for its line.
func (p *caseParser) fail(n *yaml.Node, item, field string, err error) {
	line := n.Line
	var e *Error
	if errors.As(err, &e) && e.File == "" {
		if e.Line > 0 {
			line = e.Line
		}
		if e.Field != "" {
			field = e.Field
		}
		err = e.Err
	}
	if field != "" && n.Kind == yaml.MappingNode {
		if l := FieldLine(n, field); l > 0 {
			line = l
		}
	}
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Item: item, Field: field, Err: err})
}

// add decodes one case from its JSON and checks it; n is its node (a row's,
// for a table) for lines.
func (p *caseParser) add(item string, n *yaml.Node, raw []byte) {
	jd := json.NewDecoder(bytes.NewReader(raw))
	jd.UseNumber()
	jd.DisallowUnknownFields()
	var tc TestCase
	if err := jd.Decode(&tc); err != nil {
		p.fail(n, item, "", errors.New(strings.TrimPrefix(err.Error(), "json: ")))
		return
	}
	if tc.Name == "" {
		p.fail(n, item, "name", errors.New("required"))
		return
	}
	if err := checkText(tc.Name, 256); err != nil {
		p.fail(n, item, "name", err)
		return
	}
	named := fmt.Sprintf("case %q", tc.Name)
	if other, dup := p.names[tc.Name]; dup {
		p.fail(n, named, "name", fmt.Errorf("duplicate name (also %s)", other))
		return
	}
	p.names[tc.Name] = item
	if err := checkCase(&tc); err != nil {
		p.fail(n, named, "", err)
		return
	}
	tc.SourceFile, tc.SourceLine = p.file, n.Line
	p.cases = append(p.cases, tc)
}

// table expands a table entry into cases.
func (p *caseParser) table(item string, n *yaml.Node) {
	if n.Kind != yaml.MappingNode {
		p.fail(n, item, "", errors.New("want a mapping"))
		return
	}
	var name string
	var template map[string]any
	var columns []string
	var rows *yaml.Node
	ok := true
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch k.Value {
		case "table":
			if v.Kind != yaml.ScalarNode || v.Value == "" || v.ShortTag() == "!!null" {
				p.fail(v, item, "table", errors.New("want the table's name"))
				ok = false
			} else if err := checkText(v.Value, 200); err != nil {
				p.fail(v, item, "table", err)
				ok = false
			}
			name = v.Value
		case "template":
			obj, err := yamlObject(v)
			if err != nil {
				p.fail(v, item, "template", err)
				ok = false
			}
			template = obj
		case "columns":
			if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
				p.fail(v, item, "columns", errors.New("want a list of field paths (name, step.target, expect.decision, ...)"))
				ok = false
				continue
			}
			for j, c := range v.Content {
				if c.Kind != yaml.ScalarNode || !validFieldPath(c.Value) {
					p.fail(c, item, fmt.Sprintf("columns[%d]", j), fmt.Errorf("%q is not a field path like step.target", c.Value))
					ok = false
				}
				columns = append(columns, c.Value)
			}
		case "rows":
			if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
				p.fail(v, item, "rows", errors.New("want a non-empty list of rows"))
				ok = false
			}
			rows = v
		default:
			p.fail(k, item, k.Value, errors.New("unknown field (want table, template, columns, rows)"))
			ok = false
		}
	}
	if rows == nil && ok {
		p.fail(n, item, "rows", errors.New("required"))
		ok = false
	}
	if !ok {
		return
	}
	item = fmt.Sprintf("table %q", name)
	for i, row := range rows.Content {
		rowItem := fmt.Sprintf("%s rows[%d]", item, i)
		obj := deepCopyJSON(template)
		if obj == nil {
			obj = map[string]any{}
		}
		switch row.Kind {
		case yaml.SequenceNode:
			if len(columns) == 0 {
				p.fail(row, rowItem, "", errors.New("a row given as a list needs the table's columns (or write the row as a mapping)"))
				continue
			}
			if len(row.Content) != len(columns) {
				p.fail(row, rowItem, "", fmt.Errorf("%d values for %d columns", len(row.Content), len(columns)))
				continue
			}
			bad := false
			for j, cell := range row.Content {
				v, err := yamlValue(cell)
				if err == nil {
					err = setPath(obj, columns[j], v)
				}
				if err != nil {
					p.fail(cell, rowItem, columns[j], err)
					bad = true
				}
			}
			if bad {
				continue
			}
		case yaml.MappingNode:
			v, err := yamlObject(row)
			if err != nil {
				p.fail(row, rowItem, "", err)
				continue
			}
			mergeJSON(obj, v)
		default:
			p.fail(row, rowItem, "", fmt.Errorf("want a list of %d values (columns) or a mapping", len(columns)))
			continue
		}
		if rn, ok := obj["name"].(string); ok && rn != "" {
			obj["name"] = name + "/" + rn
		} else {
			obj["name"] = fmt.Sprintf("%s[%d]", name, i)
		}
		raw, err := json.Marshal(obj)
		if err != nil {
			p.fail(row, rowItem, "", err)
			continue
		}
		p.add(rowItem, row, raw)
	}
}

// validFieldPath accepts dotted paths of non-empty names: step.args.path.
func validFieldPath(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for _, part := range strings.Split(s, ".") {
		if part == "" || strings.ContainsAny(part, " \t\n[]") {
			return false
		}
	}
	return true
}

// yamlValue converts a YAML value to a JSON value (numbers as json.Number).
func yamlValue(n *yaml.Node) (any, error) {
	raw, err := JSONFromYAML(n)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// yamlObject converts a YAML mapping to a JSON object; null is an empty one.
func yamlObject(n *yaml.Node) (map[string]any, error) {
	v, err := yamlValue(n)
	if err != nil {
		return nil, err
	}
	switch o := v.(type) {
	case nil:
		return map[string]any{}, nil
	case map[string]any:
		return o, nil
	}
	return nil, errors.New("want a mapping")
}

// setPath sets the dotted path p of obj to v, making the objects on the way.
func setPath(obj map[string]any, p string, v any) error {
	parts := strings.Split(p, ".")
	for i, part := range parts[:len(parts)-1] {
		next, ok := obj[part]
		if !ok || next == nil {
			m := map[string]any{}
			obj[part] = m
			obj = m
			continue
		}
		m, ok := next.(map[string]any)
		if !ok {
			return fmt.Errorf("%s is not a mapping in the template", strings.Join(parts[:i+1], "."))
		}
		obj = m
	}
	obj[parts[len(parts)-1]] = v
	return nil
}

// mergeJSON merges src into dst: objects merge key by key, anything else
// replaces.
func mergeJSON(dst, src map[string]any) {
	for k, v := range src {
		if sv, ok := v.(map[string]any); ok {
			if dv, ok := dst[k].(map[string]any); ok {
				mergeJSON(dv, sv)
				continue
			}
		}
		dst[k] = v
	}
}

// deepCopyJSON copies a JSON object.
func deepCopyJSON(o map[string]any) map[string]any {
	if o == nil {
		return nil
	}
	out := make(map[string]any, len(o))
	for k, v := range o {
		out[k] = deepCopyValue(v)
	}
	return out
}

func deepCopyValue(v any) any {
	switch t := v.(type) {
	case map[string]any:
		return deepCopyJSON(t)
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = deepCopyValue(e)
		}
		return out
	}
	return v
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
	if tc.Expect.ReasonMatches != "" {
		if _, err := regexp.Compile(tc.Expect.ReasonMatches); err != nil {
			return &Error{Field: "expect.reason_matches", Err: err}
		}
	}
	if tc.Expect.Approval != nil && tc.Expect.Decision != policy.RequireApproval {
		return &Error{Field: "expect.approval", Err: fmt.Errorf("only a require_approval answer carries approval settings (expect.decision is %s)", tc.Expect.Decision)}
	}
	if _, _, err := tc.Step.canonicalArgs(); err != nil {
		return &Error{Field: "step.args", Err: err}
	}
	return nil
}

// Input builds the policy input document for the case (docs/policy.md).
//
// The document is the one the kernel evaluates for the same step submitted
// by an agent. Args become canonical JSON (kernel/canon) and args_hash is
// its SHA-256, as the kernel computes them for a submitted step; absent
// args are null, as the kernel records a step submitted without args. An
// absent idempotency is the kernel's default for the kind
// ([policy.DefaultIdempotency]). Other empty fields take defaults: tenant
// [DefaultTestTenant], execution_id [DefaultTestExecutionID], execution
// status [DefaultTestStatus] and empty labels ({}). Nothing else is
// invented: an empty agent_id or effect stays empty.
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
			Idempotency: cmp.Or(tc.Step.Idempotency, policy.DefaultIdempotency(tc.Step.Kind)),
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
		return []byte("null"), nil
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

// Mismatch is one expectation of a test case that an answer does not meet.
type Mismatch struct {
	// Field is the expectation's field: decision, rule_id, reason,
	// reason_matches, approval.approvers, rate_limit.window, rate_limits...
	Field string `json:"field"`
	// Want and Got are the expected and the actual value, as text.
	Want string `json:"want"`
	Got  string `json:"got"`
}

// Check compares an answer with the expectation: d is the answer after
// default_action (policy.ApplyDefault), rateLimits the ids of the rate
// limits the step would be counted against. It returns nil when every
// expectation that is given holds.
func (x TestExpect) Check(d *policy.Answer, rateLimits []string) []Mismatch {
	var out []Mismatch
	miss := func(field, want, got string) { out = append(out, Mismatch{Field: field, Want: want, Got: got}) }
	if d == nil {
		d = &policy.Answer{}
	}
	if d.Action != x.Decision {
		miss("decision", string(x.Decision), string(d.Action))
	}
	if x.RuleID != "" && d.RuleID != x.RuleID {
		miss("rule_id", x.RuleID, d.RuleID)
	}
	if x.Reason != "" && d.Reason != x.Reason {
		miss("reason", strconv.Quote(x.Reason), strconv.Quote(d.Reason))
	}
	if x.ReasonMatches != "" {
		if re, err := regexp.Compile(x.ReasonMatches); err != nil || !re.MatchString(d.Reason) {
			miss("reason_matches", "/"+x.ReasonMatches+"/", strconv.Quote(d.Reason))
		}
	}
	if a := x.Approval; a != nil {
		if got := d.Approval; got == nil {
			miss("approval", "approval settings", "none")
		} else {
			if a.Approvers != nil && !sameSet(a.Approvers, got.Approvers) {
				miss("approval.approvers", listText(a.Approvers), listText(got.Approvers))
			}
			if a.Timeout != "" && !sameDuration(a.Timeout, got.Timeout) {
				miss("approval.timeout", a.Timeout, got.Timeout)
			}
			if a.Message != "" && a.Message != got.Message {
				miss("approval.message", strconv.Quote(a.Message), strconv.Quote(got.Message))
			}
		}
	}
	if rl := x.RateLimit; rl != nil {
		got := d.RateLimit
		switch {
		case got == nil:
			miss("rate_limit", "a rate limit", "none")
		default:
			if rl.MaxCalls != 0 && rl.MaxCalls != got.MaxCalls {
				miss("rate_limit.max_calls", strconv.Itoa(rl.MaxCalls), strconv.Itoa(got.MaxCalls))
			}
			if rl.Window != "" && !sameDuration(rl.Window, got.Window) {
				miss("rate_limit.window", rl.Window, got.Window)
			}
			if rl.Per != "" && rl.Per != orDefault(got.Per, policy.PerExecution) {
				miss("rate_limit.per", rl.Per, orDefault(got.Per, policy.PerExecution))
			}
			if rl.Algorithm != "" && rl.Algorithm != orDefault(got.Algorithm, "sliding") {
				miss("rate_limit.algorithm", rl.Algorithm, orDefault(got.Algorithm, "sliding"))
			}
			if rl.OnLimiterError != "" && rl.OnLimiterError != orDefault(got.OnLimiterError, "fail_closed") {
				miss("rate_limit.on_limiter_error", rl.OnLimiterError, orDefault(got.OnLimiterError, "fail_closed"))
			}
		}
	}
	if x.RateLimits != nil && !sameSet(*x.RateLimits, rateLimits) {
		miss("rate_limits", listText(*x.RateLimits), listText(rateLimits))
	}
	return out
}

// sameSet reports whether a and b hold the same strings, ignoring order
// and repeats.
func sameSet(a, b []string) bool {
	as, bs := slices.Clone(a), slices.Clone(b)
	slices.Sort(as)
	slices.Sort(bs)
	return slices.Equal(slices.Compact(as), slices.Compact(bs))
}

// sameDuration compares two Go durations by value ("1h" is "60m"), or as
// text when either does not parse.
func sameDuration(a, b string) bool {
	da, errA := time.ParseDuration(a)
	db, errB := time.ParseDuration(b)
	if errA != nil || errB != nil {
		return a == b
	}
	return da == db
}

func listText(l []string) string {
	if len(l) == 0 {
		return "[]"
	}
	return "[" + strings.Join(l, ", ") + "]"
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
