package console

import (
	"bytes"
	"embed"
	"encoding/json"
	"html"
	"html/template"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// pages are the page templates, each parsed with the layout.
var pages = parsePages()

func parsePages() map[string]*template.Template {
	funcs := template.FuncMap{
		"json":     foldJSON,
		"pretty":   prettyJSON,
		"short":    short,
		"time":     fmtTime,
		"timeLeft": func(t time.Time) string { return timeLeft(time.Now(), t) },
		"contains": contains,
		"join":     strings.Join,
		"payload":  payloadSummary,
		"ms":       func(ns int64) string { return strconv.FormatFloat(float64(ns)/1e6, 'f', 3, 64) + " ms" },
		"dur": func(a time.Time, b *time.Time) string {
			if b == nil {
				return ""
			}
			return b.Sub(a).Round(time.Millisecond).String()
		},
		"limit": func(v any) string {
			switch x := v.(type) {
			case int64:
				if x == 0 {
					return "no limit"
				}
				return strconv.FormatInt(x, 10)
			case float64:
				if x == 0 {
					return "no limit"
				}
				return strconv.FormatFloat(x, 'f', -1, 64)
			case string:
				if x == "" {
					return "no limit"
				}
				return x
			}
			return ""
		},
		"usd": func(f float64) string { return strconv.FormatFloat(f, 'f', 4, 64) },
	}
	out := map[string]*template.Template{}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		panic(err)
	}
	for _, n := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if name == "layout" {
			continue
		}
		files := []string{"templates/layout.html", "templates/live.html"}
		if name != "live" {
			files = append(files, n)
		}
		t := template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, files...))
		out[name] = t
	}
	return out
}

// render writes a page: the named template within the layout (the "live"
// fragment alone), with what every page needs.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, q *req, data map[string]any) {
	t, ok := pages[name]
	if !ok {
		http.Error(w, "no template "+name, http.StatusInternalServerError)
		return
	}
	if data == nil {
		data = map[string]any{}
	}
	if q != nil && q.who.Role != "" {
		data["Who"] = q.who
		data["Nav"] = q.nav()
		data["CSRF"] = q.s.csrf
		data["Link"] = q.link
		data["Tenant"] = q.who.Tenant
		data["AdminTenant"] = q.r.URL.Query().Get("tenant")
		data["MayTenants"] = q.may(routeTenants)
	} else {
		data["Link"] = func(p string) string { return p }
	}
	data["Page"] = name
	var b bytes.Buffer
	exec := "layout.html"
	if name == "live" {
		exec = "live"
	}
	if err := t.ExecuteTemplate(&b, exec, data); err != nil {
		c.log.Error("console: render", "page", name, "err", err)
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	if h.Get("Cache-Control") == "" {
		h.Set("Cache-Control", "no-store")
	}
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// staticHandler serves the embedded stylesheet and script.
func staticHandler() http.Handler {
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err)
	}
	fsrv := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		fsrv.ServeHTTP(w, r)
	})
}

func fmtTime(t any) string {
	switch x := t.(type) {
	case time.Time:
		if x.IsZero() {
			return ""
		}
		return x.UTC().Format("2006-01-02 15:04:05Z")
	case *time.Time:
		if x == nil || x.IsZero() {
			return ""
		}
		return x.UTC().Format("2006-01-02 15:04:05Z")
	}
	return ""
}

// short truncates s to n characters with an ellipsis.
func short(n int, s string) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}

// payloadSummary is an event's payload in one line (the timeline's).
func payloadSummary(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return short(300, string(raw))
	}
	return short(300, b.String())
}

// foldLen is the length (in characters, quotes included) above which a
// JSON string is folded.
const foldLen = 120

// foldJSON renders a JSON value indented, every value exact, with strings
// longer than foldLen folded into a <details> that shows their start and
// length and opens to the whole value.
func foldJSON(raw json.RawMessage) template.HTML {
	if len(raw) == 0 {
		return template.HTML(`<span class="muted">(none)</span>`)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b strings.Builder
	if err := foldValue(dec, &b, 0); err != nil {
		return template.HTML(html.EscapeString(string(raw)))
	}
	return template.HTML(b.String())
}

func foldValue(dec *json.Decoder, b *strings.Builder, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	ind := func(d int) { b.WriteString("\n" + strings.Repeat("  ", d)) }
	switch v := tok.(type) {
	case json.Delim:
		open, close := string(v), "]"
		if v == '{' {
			close = "}"
		}
		b.WriteString(open)
		n := 0
		for dec.More() {
			if n > 0 {
				b.WriteString(",")
			}
			ind(depth + 1)
			if v == '{' {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				ks, _ := k.(string)
				b.WriteString(`<span class="k">` + html.EscapeString(jsonString(ks)) + `</span>: `)
			}
			if err := foldValue(dec, b, depth+1); err != nil {
				return err
			}
			n++
		}
		if _, err := dec.Token(); err != nil {
			return err
		}
		if n > 0 {
			ind(depth)
		}
		b.WriteString(close)
	case string:
		s := jsonString(v)
		if utf8.RuneCountInString(s) > foldLen {
			b.WriteString(`<details class="fold"><summary>` + html.EscapeString(short(60, s)) +
				` <span class="muted">(` + strconv.Itoa(utf8.RuneCountInString(v)) + ` characters, expand)</span></summary>` +
				html.EscapeString(s) + `</details>`)
		} else {
			b.WriteString(html.EscapeString(s))
		}
	case json.Number:
		b.WriteString(html.EscapeString(v.String()))
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case nil:
		b.WriteString("null")
	}
	return nil
}

// jsonString is s as a JSON string, as written (no \u003c for <: the
// page escapes it as HTML).
func jsonString(s string) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}
