package rego

import (
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/cover"

	"github.com/wicket-run/wicket/plugins/bundle"
)

// Coverage records which lines of a bundle's Rego its evaluations reach,
// with OPA's own coverage tracer (github.com/open-policy-agent/opa/v1/cover,
// what `opa test --coverage` uses). Give it to an engine with
// [Engine.WithCoverage]; it is safe for concurrent use.
type Coverage struct {
	c *cover.Cover
}

// NewCoverage returns an empty coverage record.
func NewCoverage() *Coverage { return &Coverage{c: cover.New()} }

// WithCoverage returns an engine like e whose evaluators, and whose Rego
// unit tests ([Engine.RunTests]), record the lines they reach in c. The
// engine is otherwise the same (capabilities, builtin-error rule); tracing
// makes evaluation slower, so keep it for tests.
func (e *Engine) WithCoverage(c *Coverage) *Engine {
	cp := *e
	cp.cov = c
	return &cp
}

// CoverageReport is the coverage of a bundle's policy files (tests/ and
// *_test.rego left out), as OPA computes it: a line counts when it holds a
// rule head or an expression.
type CoverageReport struct {
	// Files are the policy files, by path.
	Files []FileCoverage `json:"files"`
	// Covered and NotCovered count lines over every file.
	Covered    int `json:"covered_lines"`
	NotCovered int `json:"not_covered_lines"`
	// Percent is Covered out of Covered+NotCovered (100 when there is no
	// line to cover).
	Percent float64 `json:"percent"`
}

// FileCoverage is the coverage of one file.
type FileCoverage struct {
	File       string  `json:"file"`
	Covered    int     `json:"covered_lines"`
	NotCovered int     `json:"not_covered_lines"`
	Percent    float64 `json:"percent"`
	// Unreached are the line ranges no evaluation reached, in order.
	Unreached []LineRange `json:"not_covered,omitempty"`
}

// LineRange is the lines Start to End, inclusive.
type LineRange struct {
	Start int `json:"start"`
	End   int `json:"end"`
}

// String is "12" or "12-14".
func (r LineRange) String() string {
	if r.Start == r.End {
		return fmt.Sprint(r.Start)
	}
	return fmt.Sprintf("%d-%d", r.Start, r.End)
}

// Report computes the coverage of b's policy files from what was recorded.
func (c *Coverage) Report(b *bundle.Bundle) (*CoverageReport, error) {
	modules := make(map[string]*ast.Module)
	for name, src := range b.Files {
		if path.Ext(name) != ".rego" || strings.HasPrefix(name, bundle.TestsDir) || IsRegoTestFile(name) {
			continue
		}
		m, err := ast.ParseModuleWithOpts(name, string(src), ast.ParserOptions{RegoVersion: b.RegoVersion(name), ProcessAnnotation: true})
		if err != nil {
			return nil, fmt.Errorf("coverage: %w", err)
		}
		modules[name] = m
	}
	rep := c.c.Report(modules)
	out := &CoverageReport{Covered: rep.CoveredLines, NotCovered: rep.NotCoveredLines, Percent: rep.Coverage}
	if out.Covered+out.NotCovered == 0 {
		out.Percent = 100
	}
	for name := range modules {
		fr := rep.Files[name]
		fc := FileCoverage{File: name, Percent: 100}
		if fr != nil {
			fc.Covered, fc.NotCovered = fr.CoveredLines, fr.NotCoveredLines
			if fc.Covered+fc.NotCovered > 0 {
				fc.Percent = fr.Coverage
			}
			for _, r := range fr.NotCovered {
				fc.Unreached = append(fc.Unreached, LineRange{Start: r.Start.Row, End: r.End.Row})
			}
		}
		out.Files = append(out.Files, fc)
	}
	sort.Slice(out.Files, func(i, j int) bool { return out.Files[i].File < out.Files[j].File })
	return out, nil
}
