package archtest

import (
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// root is the module root, relative to this package.
const root = "../.."

// markdownFiles returns every .md file of the repository (outside .git and
// testdata), relative to root, with forward slashes.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "node_modules", "wicket-data":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk: %v", err)
	}
	if len(out) == 0 {
		t.Fatal("no markdown files found")
	}
	return out
}

var (
	// inlineLink matches [text](target) and ![alt](target); the target ends
	// at whitespace (an optional "title" follows) or the closing parenthesis.
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// refLink matches a reference definition: [label]: target
	refLink   = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)`)
	codeSpan  = regexp.MustCompile("`+[^`]*`+")
	headingRE = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
)

// mdLink is one link of a markdown file.
type mdLink struct {
	line   int
	target string
}

// parseMarkdown returns a file's links (outside code) and the anchors its
// headings define.
func parseMarkdown(src string) (links []mdLink, anchors map[string]bool) {
	anchors = map[string]bool{}
	seen := map[string]int{}
	fence := ""
	for i, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		if m := headingRE.FindStringSubmatch(line); m != nil {
			slug := slugify(m[1])
			if n := seen[slug]; n > 0 {
				anchors[slug+"-"+itoa(n)] = true
			} else {
				anchors[slug] = true
			}
			seen[slug]++
		}
		text := codeSpan.ReplaceAllString(line, "")
		for _, m := range inlineLink.FindAllStringSubmatch(text, -1) {
			links = append(links, mdLink{line: i + 1, target: m[1]})
		}
		if m := refLink.FindStringSubmatch(text); m != nil {
			links = append(links, mdLink{line: i + 1, target: m[1]})
		}
	}
	return links, anchors
}

// slugify turns a heading into its anchor the way GitHub does: lower case,
// markup and punctuation dropped, spaces turned into hyphens.
func slugify(h string) string {
	h = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(h, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func itoa(n int) string {
	const digits = "0123456789"
	if n < 10 {
		return digits[n : n+1]
	}
	return itoa(n/10) + digits[n%10:n%10+1]
}

// TestMarkdownLinks checks every relative link of every markdown file: the
// file or directory it names exists in the repository, and an anchor into a
// markdown file names one of its headings.
func TestMarkdownLinks(t *testing.T) {
	files := markdownFiles(t)
	anchorsOf := map[string]map[string]bool{}
	linksOf := map[string][]mdLink{}
	for _, f := range files {
		src, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		linksOf[f], anchorsOf[f] = parseMarkdown(string(src))
	}
	checked := 0
	for _, f := range files {
		for _, l := range linksOf[f] {
			u, err := url.Parse(l.target)
			if err != nil {
				t.Errorf("%s:%d: unparsable link %q: %v", f, l.line, l.target, err)
				continue
			}
			if u.Scheme != "" || strings.HasPrefix(l.target, "//") {
				continue // absolute URLs are not checked (no network in tests)
			}
			target := f
			if u.Path != "" {
				target = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(f), u.Path)))
				if strings.HasPrefix(target, "../") || target == ".." {
					t.Errorf("%s:%d: link %q leaves the repository", f, l.line, l.target)
					continue
				}
				if _, err := os.Stat(filepath.Join(root, target)); err != nil {
					t.Errorf("%s:%d: broken link %q: %s does not exist", f, l.line, l.target, target)
					continue
				}
			}
			checked++
			if u.Fragment == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			anchors, ok := anchorsOf[target]
			if !ok {
				continue
			}
			if !anchors[u.Fragment] {
				t.Errorf("%s:%d: broken link %q: %s has no heading #%s", f, l.line, l.target, target, u.Fragment)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: the parser is broken")
	}
}

// TestDocsIndex keeps docs/README.md, the index of the contract, complete:
// every page under docs/ is linked from it.
func TestDocsIndex(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(root, "docs", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	links, _ := parseMarkdown(string(src))
	linked := map[string]bool{}
	for _, l := range links {
		if u, err := url.Parse(l.target); err == nil && u.Scheme == "" && u.Path != "" {
			linked[filepath.ToSlash(filepath.Clean(filepath.Join("docs", u.Path)))] = true
		}
	}
	pages := 0
	for _, f := range markdownFiles(t) {
		if !strings.HasPrefix(f, "docs/") || f == "docs/README.md" {
			continue
		}
		pages++
		if !linked[f] {
			t.Errorf("docs/README.md does not link %s: add it to the index", f)
		}
	}
	if pages == 0 {
		t.Fatal("no pages under docs/")
	}
}

// TestParseMarkdown pins the parser on the cases that matter: links in code
// are not links, headings become GitHub anchors, and a broken link is seen.
func TestParseMarkdown(t *testing.T) {
	src := "# Protocol (`/v0`)\n" +
		"## Errors\n## Errors\n" +
		"See [a](a.md#errors) and ![img](img.png \"t\").\n" +
		"Not `[code](x.md)`.\n" +
		"```\n[fenced](y.md)\n```\n" +
		"[ref]: ref.md\n"
	links, anchors := parseMarkdown(src)
	var got []string
	for _, l := range links {
		got = append(got, l.target)
	}
	if want := "a.md#errors img.png ref.md"; strings.Join(got, " ") != want {
		t.Errorf("links = %q, want %q", strings.Join(got, " "), want)
	}
	for _, a := range []string{"protocol-v0", "errors", "errors-1"} {
		if !anchors[a] {
			t.Errorf("anchor %q missing from %v", a, anchors)
		}
	}
}

// TestSelfContained keeps the repository standing alone: nothing may point
// at documents outside it.
func TestSelfContained(t *testing.T) {
	// The patterns are spelled with character classes so that this file
	// does not match them itself: a plain grep for them over the whole
	// tree, this file included, finds nothing.
	bad := regexp.MustCompile(`\.\.[/]shared|shared[/]SPEC|SPEC[.]md|SPEC[ ]§`)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == ".git" || d.Name() == "wicket-data" {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(p) {
		case ".go", ".md", ".yaml", ".yml", ".json", ".c", ".h", ".rego", ".sh":
		default:
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(src), "\n") {
			if bad.MatchString(line) {
				t.Errorf("%s:%d: points outside the repository: %s", p, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
