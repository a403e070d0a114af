package policytest

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Report is the outcome of a run over several bundles.
type Report struct {
	Bundles []*BundleResult `json:"bundles"`
	Passed  int             `json:"passed"`
	Failed  int             `json:"failed"`
	Skipped int             `json:"skipped"`
	// Duration is the time of the whole run.
	Duration time.Duration `json:"duration_ns"`
}

// Add counts a bundle's result in.
func (r *Report) Add(b *BundleResult) {
	r.Bundles = append(r.Bundles, b)
	p, f, s := b.Counts()
	r.Passed += p
	r.Failed += f
	r.Skipped += s
}

// OK reports whether nothing failed.
func (r *Report) OK() bool { return r.Failed == 0 }

// Summary is "N passed, N failed", with ", N skipped" when some were.
func (r *Report) Summary() string {
	s := fmt.Sprintf("%d passed, %d failed", r.Passed, r.Failed)
	if r.Skipped > 0 {
		s += fmt.Sprintf(", %d skipped", r.Skipped)
	}
	return s
}

// WriteText writes one bundle's block in the style of go test: a
// "--- FAIL: bundle/case (0.00s)" paragraph per failing test (every test
// with verbose), the coverage, then "ok" or "FAIL", the bundle's name and
// path and its time.
func WriteText(w io.Writer, b *BundleResult, verbose bool) error {
	var sb strings.Builder
	for _, t := range b.Tests {
		if t.Status != Fail && !verbose {
			continue
		}
		fmt.Fprintf(&sb, "--- %s: %s (%.2fs)\n", strings.ToUpper(t.Status), t.Name, t.Duration.Seconds())
		if t.Status != Fail {
			continue
		}
		loc := ""
		if t.File != "" {
			loc = t.File
			if t.Line > 0 {
				loc += ":" + strconv.Itoa(t.Line)
			}
			loc += ": "
		}
		fmt.Fprintf(&sb, "    %s%s\n", loc, t.Message)
		for _, d := range t.Details {
			fmt.Fprintf(&sb, "        %s\n", d)
		}
	}
	if c := b.Coverage; c != nil && (len(c.Unreached) > 0 || verbose) {
		fmt.Fprintf(&sb, "    coverage: %.1f%% of %s (%d of %d)\n", c.Percent, coverageUnit(c.Kind), c.Reached, c.Total)
		for _, u := range c.Unreached {
			fmt.Fprintf(&sb, "        not reached: %s\n", u)
		}
	}
	status := "ok  "
	if b.Status == Fail {
		status = "FAIL"
	}
	fmt.Fprintf(&sb, "%s\t%s\t%s\t%.3fs", status, b.Name, b.Path, b.Duration.Seconds())
	switch {
	case b.Empty:
		sb.WriteString("\t[no tests]")
	case len(b.Tests) == 0:
		sb.WriteString("\t[no tests to run]")
	}
	if len(b.Targets) > 1 || (len(b.Targets) == 1 && b.Targets[0] != b.Engine) {
		sb.WriteString("\t[" + strings.Join(b.Targets, "+") + "]")
	}
	if c := b.Coverage; c != nil {
		fmt.Fprintf(&sb, "\tcoverage: %.1f%% of %s", c.Percent, coverageUnit(c.Kind))
	}
	sb.WriteByte('\n')
	_, err := io.WriteString(w, sb.String())
	return err
}

// WriteJSON writes the report as one indented JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// JUnit XML, in the shape CI systems read (Jenkins, GitLab, GitHub
// test-reporter actions): one testsuite per bundle, one testcase per test.
type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Errors   int          `xml:"errors,attr"`
	Skipped  int          `xml:"skipped,attr"`
	Time     string       `xml:"time,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name       string          `xml:"name,attr"`
	Tests      int             `xml:"tests,attr"`
	Failures   int             `xml:"failures,attr"`
	Errors     int             `xml:"errors,attr"`
	Skipped    int             `xml:"skipped,attr"`
	Time       string          `xml:"time,attr"`
	File       string          `xml:"file,attr,omitempty"`
	Properties []junitProperty `xml:"properties>property,omitempty"`
	Cases      []junitCase     `xml:"testcase"`
}

type junitProperty struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	File      string        `xml:"file,attr,omitempty"`
	Line      int           `xml:"line,attr,omitempty"`
	Time      string        `xml:"time,attr"`
	Failure   *junitFailure `xml:"failure,omitempty"`
	Error     *junitFailure `xml:"error,omitempty"`
	Skipped   *junitSkipped `xml:"skipped,omitempty"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",chardata"`
}

type junitSkipped struct {
	Message string `xml:"message,attr,omitempty"`
}

// WriteJUnit writes the report as JUnit XML: a testsuite per bundle (named
// by its path, with its name, engine, revision and digest as properties),
// a testcase per test (classname the bundle's name), and for a failure
// its message and the expected and actual answers: an <error> for a test
// that did not evaluate to an answer (TestResult.Errored), a <failure> for
// the others. Counts are the report's: tests = passed + failed + skipped,
// failures + errors = failed.
func (r *Report) WriteJUnit(w io.Writer) error {
	doc := junitSuites{Name: "wicket policy test", Tests: r.Passed + r.Failed + r.Skipped, Failures: r.Failed, Skipped: r.Skipped, Time: seconds(r.Duration)}
	for _, b := range r.Bundles {
		p, f, s := b.Counts()
		e := 0
		for _, t := range b.Tests {
			if t.Status == Fail && t.Errored {
				e++
			}
		}
		doc.Failures -= e
		doc.Errors += e
		suite := junitSuite{Name: b.Path, Tests: p + f + s, Failures: f - e, Errors: e, Skipped: s, Time: seconds(b.Duration), File: b.Path}
		for _, kv := range [][2]string{{"bundle", b.Name}, {"engine", b.Engine}, {"revision", b.Revision}, {"sha256", b.Digest}, {"targets", strings.Join(b.Targets, ",")}} {
			if kv[1] != "" {
				suite.Properties = append(suite.Properties, junitProperty{Name: kv[0], Value: kv[1]})
			}
		}
		if c := b.Coverage; c != nil {
			suite.Properties = append(suite.Properties, junitProperty{Name: "coverage", Value: fmt.Sprintf("%.1f%% of %s", c.Percent, coverageUnit(c.Kind))})
		}
		for _, t := range b.Tests {
			jc := junitCase{Name: t.Case, Classname: b.Name, File: t.File, Line: t.Line, Time: seconds(t.Duration)}
			switch t.Status {
			case Fail:
				f := &junitFailure{Message: t.Message, Type: t.Kind, Text: strings.Join(t.Details, "\n")}
				if t.Errored {
					jc.Error = f
				} else {
					jc.Failure = f
				}
			case Skip:
				jc.Skipped = &junitSkipped{Message: "todo"}
			}
			suite.Cases = append(suite.Cases, jc)
		}
		doc.Suites = append(doc.Suites, suite)
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

func seconds(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 3, 64) }
