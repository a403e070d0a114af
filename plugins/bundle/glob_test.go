package bundle

import "testing"

func TestGlob(t *testing.T) {
	tests := []struct {
		pattern, s string
		want       bool
	}{
		{"fs.read", "fs.read", true},
		{"fs.read", "fs.read_file", false},
		{"fs.read", "FS.READ", false},
		{"fs.read*", "fs.read", true},
		{"fs.read*", "fs.read_file", true},
		{"fs.read*", "fs.write", false},
		{"*", "", true},
		{"*", "anything/at.all", true},
		{"**", "x", true},
		{"*.create_issue", "github.create_issue", true},
		{"*.create_issue", "github.create_issues", false},
		{"*issue*", "github.create_issue_comment", true},
		{"*issue*", "github.create_pr", false},
		{"github.*", "github.create_issue", true},
		{"github.*", "gitlab.create_issue", false},
		{"fs/*", "fs/a/b", true}, // no path semantics: * crosses '/'
		{"fs/*", "fsx/a", false},
		{"gpt-?", "gpt-4", true},
		{"gpt-?", "gpt-4o", false},
		{"gpt-?", "gpt-", false},
		{"?", "é", true}, // one character, not one byte
		{"??", "é", false},
		{"a*b*c", "abc", true},
		{"a*b*c", "aXbYc", true},
		{"a*b*c", "aXbYcZ", false},
		{"a*b*c", "acb", false},
		{"a*b?d", "abbbcd", true},
		{"*a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false},
		{"*a?", "xxab", true},
		{`\*`, "*", true},
		{`\*`, "x", false},
		{`a\?b`, "a?b", true},
		{`a\?b`, "axb", false},
		{`a\\b`, `a\b`, true},
		{`fs.\*.read*`, "fs.*.read_all", true},
		{"[abc]", "[abc]", true}, // brackets are literals
	}
	for _, tt := range tests {
		g, err := CompileGlob(tt.pattern)
		if err != nil {
			t.Errorf("CompileGlob(%q): %v", tt.pattern, err)
			continue
		}
		if got := g.Match(tt.s); got != tt.want {
			t.Errorf("Glob(%q).Match(%q) = %v, want %v", tt.pattern, tt.s, got, tt.want)
		}
		if got := MatchGlob(tt.pattern, tt.s); got != tt.want {
			t.Errorf("MatchGlob(%q, %q) = %v, want %v", tt.pattern, tt.s, got, tt.want)
		}
		if g.String() != tt.pattern {
			t.Errorf("String() = %q, want %q", g.String(), tt.pattern)
		}
	}
}

func TestGlobInvalid(t *testing.T) {
	for _, p := range []string{"", `abc\`, "\xff*"} {
		if _, err := CompileGlob(p); err == nil {
			t.Errorf("CompileGlob(%q) succeeded, want an error", p)
		}
		if MatchGlob(p, p) {
			t.Errorf("MatchGlob(%q) matched", p)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("MustCompileGlob did not panic")
		}
	}()
	MustCompileGlob("")
}

func TestGlobMatchDoesNotAllocate(t *testing.T) {
	g := MustCompileGlob("gith?b.*_is*e")
	if n := testing.AllocsPerRun(100, func() { g.Match("github.create_issue") }); n != 0 {
		t.Errorf("Match allocates %v times", n)
	}
}

func FuzzGlob(f *testing.F) {
	f.Add("a*b?c", "axxbyc")
	f.Add(`\*x*`, "*xy")
	f.Fuzz(func(t *testing.T, pattern, s string) {
		g, err := CompileGlob(pattern)
		if err != nil {
			return
		}
		got := g.Match(s)
		if g.kind != globGeneral {
			// The fast paths must agree with the general matcher.
			if want := matchTokens(mustTokens(t, pattern), s); got != want {
				t.Fatalf("Glob(%q).Match(%q): fast path %v, general %v", pattern, s, got, want)
			}
		}
	})
}

func mustTokens(t *testing.T, pattern string) []globToken {
	g := &Glob{}
	*g = *MustCompileGlob(pattern)
	if g.toks != nil {
		return g.toks
	}
	// Rebuild the general form of a fast-path pattern.
	var toks []globToken
	lit := ""
	for i := 0; i < len(pattern); i++ {
		switch c := pattern[i]; c {
		case '\\':
			i++
			lit += string(pattern[i])
		case '*', '?':
			if lit != "" {
				toks = append(toks, globToken{op: 'l', lit: lit})
				lit = ""
			}
			if c == '*' && len(toks) > 0 && toks[len(toks)-1].op == '*' {
				continue
			}
			toks = append(toks, globToken{op: c})
		default:
			lit += string(c)
		}
	}
	if lit != "" {
		toks = append(toks, globToken{op: 'l', lit: lit})
	}
	return toks
}
