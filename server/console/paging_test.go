package console_test

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/console"
	"github.com/wicket-run/wicket/server/wire"
)

var stepRow = regexp.MustCompile(`<tr data-step="([0-9a-f]+)"`)

// TestExecutionStepsPaged: an execution with more steps than a page of the
// API shows them a page at a time, with links to the next page and back to
// the first, and its live fragment keeps the page it was loaded with.
// (The page showed the API's first page only: the execution's first 1000
// steps, and never its latest.)
func TestExecutionStepsPaged(t *testing.T) {
	defer console.SetPages(1000, 5000, 3)()
	env := start(t)
	const n = 7
	a := testkit.NewAgent("bot", "bot-secret-0123456789", env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		for i := range n {
			if _, err := r.Step(ctx, "tool_call", "t", map[string]any{"i": i}, testkit.StepOpts{}, func() (any, error) { return i, nil }); err != nil {
				return nil, err
			}
		}
		return "done", nil
	})
	defer a.Close()
	env.RegisterAgent(a, "")
	id := env.CreateExecution("bot", nil)
	if e := env.WaitTerminal(id, 30*time.Second); e.Status != kernel.ExecCompleted {
		t.Fatalf("execution %s", e.Status)
	}
	var all wire.StepList
	if _, err := env.Admin("GET", "/v0/executions/"+id+"/steps", nil, &all); err != nil || len(all.Steps) != n {
		t.Fatalf("steps: %v, %d of %d", err, len(all.Steps), n)
	}

	b := newBrowser(t, env.URL)
	b.signIn(testkit.AdminKey)
	link := regexp.MustCompile(`id="steps-(first|next)"`)
	href := func(page, which string) string {
		m := regexp.MustCompile(`<a href="([^"]+)" id="steps-` + which + `"`).FindStringSubmatch(page)
		if m == nil {
			return ""
		}
		return html.UnescapeString(m[1])
	}
	var seen []string
	path := "/ui/executions/" + id
	for pages := 0; path != ""; pages++ {
		if pages > n {
			t.Fatal("the pages never end")
		}
		resp, page := b.do("GET", path, nil, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d\n%s", path, resp.StatusCode, page)
		}
		rows := stepRow.FindAllStringSubmatch(page, -1)
		if len(rows) == 0 || len(rows) > 3 {
			t.Fatalf("%s shows %d steps, want 1 to 3 (the page size)", path, len(rows))
		}
		for _, r := range rows {
			seen = append(seen, r[1])
		}
		if first := href(page, "first"); (pages > 0) != (first == "/ui/executions/"+id) {
			t.Fatalf("page %d: link to the first page %q", pages, first)
		}
		// The live fragment shows the same page.
		live := regexp.MustCompile(`data-live="([^"]+)"`).FindStringSubmatch(page)
		if live == nil {
			t.Fatalf("no live fragment link on %s", path)
		}
		_, frag := b.do("GET", html.UnescapeString(live[1]), nil, nil)
		if got := stepRow.FindAllStringSubmatch(frag, -1); fmt.Sprint(got) != fmt.Sprint(rows) {
			t.Fatalf("the live fragment of %s shows other steps:\n%v\nagainst\n%v", path, got, rows)
		}
		if pages == 0 && len(link.FindAllString(page, -1)) != 1 {
			t.Fatalf("the first page has no next link, or a first link:\n%s", page)
		}
		path = href(page, "next")
	}
	if len(seen) != n {
		t.Fatalf("the pages showed %d steps, want %d", len(seen), n)
	}
	for i, s := range all.Steps {
		if seen[i] != s.ID {
			t.Fatalf("step %d on the pages is %s, want %s (seq order, each once)", i, seen[i], s.ID)
		}
	}
}

// TestApprovalsPagePending: every pending approval is listed, however
// many pages of the API they take, up to the console's most; past it the
// page says some are not shown. (It read the API's first page only.)
func TestApprovalsPagePending(t *testing.T) {
	env := start(t)
	policy := "default_action: allow\nrules:\n  - id: gate\n    priority: 1\n    when: {target: x}\n    then: {decision: require_approval}\n"
	a := testkit.NewAgent("bot", "bot-secret-0123456789", env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		_, err := r.Step(ctx, "tool_call", "x", map[string]any{}, testkit.StepOpts{}, func() (any, error) { return nil, nil })
		return nil, err
	})
	defer a.Close()
	env.RegisterAgent(a, "")
	if _, err := env.Admin("POST", "/v0/policies/bot", map[string]any{"bundle": policy}, nil); err != nil {
		t.Fatal(err)
	}
	const n = 5
	ids := map[string]bool{}
	for range n {
		id := env.CreateExecution("bot", nil)
		env.WaitStatus(id, 30*time.Second, func(s kernel.ExecStatus) bool { return s == kernel.ExecBlocked })
		ids[id] = true
	}
	b := newBrowser(t, env.URL)
	b.signIn(testkit.AdminKey)
	pendingShown := func(page string) int {
		pending := page[strings.Index(page, `id="pending-h"`):strings.Index(page, `id="decided-h"`)]
		shown := 0
		for id := range ids {
			if strings.Contains(pending, id) {
				shown++
			}
		}
		return shown
	}

	restore := console.SetPages(2, 100, 1000)
	_, page := b.do("GET", "/ui/approvals", nil, nil)
	restore()
	if got := pendingShown(page); got != n || strings.Contains(page, `id="more-pending"`) {
		t.Fatalf("pages of 2: %d of %d pending approvals shown (note of more: %v)", got, n, strings.Contains(page, `id="more-pending"`))
	}

	restore = console.SetPages(2, 4, 1000)
	_, page = b.do("GET", "/ui/approvals", nil, nil)
	restore()
	if got := pendingShown(page); got != 4 || !strings.Contains(page, `id="more-pending"`) {
		t.Fatalf("at most 4: %d shown, note of more: %v", got, strings.Contains(page, `id="more-pending"`))
	}
}
