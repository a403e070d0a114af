package console

import (
	"encoding/json"
	"html"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// TestSSEFilter: event lines go, the rest passes whole, however the
// writes split the lines.
func TestSSEFilter(t *testing.T) {
	in := "id: 1\nevent: step.proposed\ndata: {\"seq\":1}\n\n: heartbeat\n\nevent: step.delta\ndata: {\"x\":2}\n\n"
	want := "id: 1\ndata: {\"seq\":1}\n\n: heartbeat\n\ndata: {\"x\":2}\n\n"
	for _, n := range []int{1, 2, 3, 7, len(in)} {
		rec := httptest.NewRecorder()
		f := &sseFilter{ResponseWriter: rec}
		for i := 0; i < len(in); i += n {
			j := min(i+n, len(in))
			if w, err := f.Write([]byte(in[i:j])); err != nil || w != j-i {
				t.Fatalf("write: %d %v", w, err)
			}
		}
		if got := rec.Body.String(); got != want {
			t.Errorf("chunks of %d: %q, want %q", n, got, want)
		}
	}
}

var tagRE = regexp.MustCompile(`<[^>]+>`)

// TestFoldJSON: the folded rendering, markup removed and unescaped, is the
// value itself (indented), whatever its shape; long strings are folded.
func TestFoldJSON(t *testing.T) {
	long := strings.Repeat("ab<c>", 40)
	for _, raw := range []string{
		`{"a":1,"b":[true,null,{"c":"d"}],"e":{},"f":[]}`,
		`"` + long + `"`,
		`{"z":"` + long + `","y":[1.5e10,-2]}`,
		`[]`, `null`, `"\u2028 é"`,
	} {
		out := string(foldJSON(json.RawMessage(raw)))
		text := regexp.MustCompile(`<summary>.*?</summary>`).ReplaceAllString(out, "")
		text = tagRE.ReplaceAllString(text, "")
		text = html.UnescapeString(text)
		var got, want any
		if err := json.Unmarshal([]byte(text), &got); err != nil {
			t.Fatalf("%s: rendering is not the value: %v\n%s", raw, err, text)
		}
		_ = json.Unmarshal([]byte(raw), &want)
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		if string(g) != string(w) {
			t.Errorf("rendering of %s reads back as %s", w, g)
		}
		if strings.Contains(raw, long) != strings.Contains(out, `<details class="fold">`) {
			t.Errorf("%s: folding wrong:\n%s", raw, out)
		}
		if strings.Contains(out, "<c>") {
			t.Errorf("unescaped markup in %s", out)
		}
	}
}
