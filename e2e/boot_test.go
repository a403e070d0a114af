package e2e

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/internal/webhook"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/bbolt"
)

// hangingStartWasm is a Wicket-ABI module whose start-up never ends:
//
//	(module
//	  (memory (export "memory") 1)
//	  (func (export "wicket_alloc") (param i32) (result i32) i32.const 1024)
//	  (func (export "wicket_evaluate") (param i32 i32) (result i64) i64.const 0)
//	  (func (export "_initialize") (loop br 0) unreachable))
//
// (plugins/wasm's loopingStart, encoded.)
func hangingStartWasm(t testing.TB) []byte {
	b, err := hex.DecodeString("0061736d0100000001150460017f017f60027f7f017e60000060027f7f017f0304030001020503010001073904066d656d6f727902000c7769636b65745f616c6c6f6300000f7769636b65745f6576616c7561746500010b5f696e697469616c697a6500020a150305004180080b040042000b080003400c000b000b")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// storeBundle writes a bundle record straight into a stopped kernel's store,
// as an older kernel with looser ceilings (or a time bomb that behaved at
// upload) would have left it.
func storeBundle(t *testing.T, dir, tenant, name string, archive []byte) {
	t.Helper()
	st, err := bbolt.Open(filepath.Join(dir, "wicket.db"), bbolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	err = st.Update(context.Background(), func(tx kernel.Tx) error {
		return tx.PutBundle(&kernel.BundleRecord{Tenant: tenant, Name: name, Revision: "bomb", Digest: strings.Repeat("0", 64),
			Engine: "wasm", Archive: archive, UpdatedAt: time.Now()})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// storeDelete removes a bundle record from a stopped kernel's store.
func storeDelete(t *testing.T, dir, tenant, name string) {
	t.Helper()
	st, err := bbolt.Open(filepath.Join(dir, "wicket.db"), bbolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Update(context.Background(), func(tx kernel.Tx) error { return tx.DeleteBundle(tenant, name) }); err != nil {
		t.Fatal(err)
	}
}

// evalDecision dry-runs a step for an agent and returns the decision.
func evalDecision(t *testing.T, base, agent string) (decision, rule, reason string) {
	t.Helper()
	var res struct {
		Decision, RuleID, Reason string
	}
	_, err := testkit.Bearer(base, testkit.AdminKey, "POST", "/v0/policy/eval",
		map[string]any{"agent_id": agent, "step": map[string]any{"kind": "tool_call", "target": "shell.exec"}}, &struct {
			Decision *string `json:"decision"`
			RuleID   *string `json:"rule_id"`
			Reason   *string `json:"reason"`
		}{&res.Decision, &res.RuleID, &res.Reason})
	if err != nil {
		t.Fatalf("eval %s: %v", agent, err)
	}
	return res.Decision, res.RuleID, res.Reason
}

// TestBootSkipsHangingBundles: a real `wicket serve` whose store holds two
// bundles that cannot start — one whose _initialize loops forever, one that
// also asks for an 87600h timeout (stored by a kernel without ceilings) —
// boots and serves within 15 s (the start-up deadline is 2 s); each is
// reported by a warning naming it, agents bound to them are denied with
// engine_error saying why, and the other agents' bundles work.
func TestBootSkipsHangingBundles(t *testing.T) {
	dir, addr := t.TempDir(), freeAddr(t)
	p := startServe(t, dir, addr)
	mod := cWasm(t)
	for _, name := range []string{"hang", "bomb", "good"} {
		if _, err := uploadArchive(p.url, "default", name, wasmArchive(t, "name: "+name+"\nengine: wasm\ndefault_action: allow\n", mod)); err != nil {
			t.Fatal(err)
		}
		if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/agents", map[string]any{
			"id": name + "-bot", "webhook_url": "http://127.0.0.1:9/hook", "secret": "boot-test-secret-0123456789", "bundle": name}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if d, _, _ := evalDecision(t, p.url, "hang-bot"); d != "allow" {
		t.Fatalf("before the restart: %s", d)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Wait()

	hang := hangingStartWasm(t)
	storeBundle(t, dir, "default", "hang", wasmArchive(t, "name: hang\nrevision: bomb\nengine: wasm\nsandbox: {timeout: 1s}\n", hang))
	storeBundle(t, dir, "default", "bomb", wasmArchive(t, "name: bomb\nrevision: bomb\nengine: wasm\nsandbox: {timeout: 87600h}\n", hang))

	p = startServe(t, dir, addr)
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	t.Logf("booted in %s with two hanging bundles", p.boot.Round(time.Millisecond))
	if p.boot > 15*time.Second {
		t.Errorf("boot took %s, want under 15s", p.boot)
	}
	resp, err := http.Get(p.url + "/v0/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v", err)
	}
	resp.Body.Close()
	log := p.stderr.String()
	for _, want := range []string{
		`bundle=hang revision=bomb err="bundle \"hang\" rev bomb: wasm: instantiate: timed out after 2s"`,
		`bundle=bomb revision=bomb err="bundle.yaml: sandbox.timeout: 87600h0m0s exceeds the kernel's ceiling of 2s (serve --sandbox-max-timeout)"`,
	} {
		if !strings.Contains(log, "stored bundle skipped") || !strings.Contains(log, want) {
			t.Errorf("kernel log lacks a warning with %s:\n%s", want, log)
		}
	}
	for _, c := range []struct{ agent, reason string }{
		{"hang-bot", `bundle "hang" did not load at boot (fail closed): bundle "hang" rev bomb: wasm: instantiate: timed out after 2s`},
		{"bomb-bot", `bundle "bomb" did not load at boot (fail closed): bundle.yaml: sandbox.timeout: 87600h0m0s exceeds`},
	} {
		d, rule, reason := evalDecision(t, p.url, c.agent)
		if d != "deny" || rule != "engine_error" || !strings.HasPrefix(reason, c.reason) {
			t.Errorf("%s: %s %s %q, want deny engine_error %q", c.agent, d, rule, reason, c.reason)
		}
	}
	if d, _, _ := evalDecision(t, p.url, "good-bot"); d != "allow" {
		t.Errorf("good-bot: %s, want allow", d)
	}
	// Replacing the bundle brings its agents back.
	if _, err := uploadArchive(p.url, "default", "hang", wasmArchive(t, "name: hang\nrevision: \"2\"\nengine: wasm\ndefault_action: allow\n", mod)); err != nil {
		t.Fatal(err)
	}
	if d, _, _ := evalDecision(t, p.url, "hang-bot"); d != "allow" {
		t.Errorf("hang-bot after the upload: %s", d)
	}
}

// stuckLoader is a bundle loader whose Compile for the bundle "stuck"
// ignores its context and returns only when release is closed, and fails
// for "broken"; it records what the kernel tells it.
type stuckLoader struct {
	release chan struct{}

	mu                         sync.Mutex
	active, discarded, refused []string
}

func (l *stuckLoader) Compile(ctx context.Context, tenant string, src kernel.BundleSource) (*kernel.CompiledBundle, error) {
	name := string(src.Archive)
	switch name {
	case "stuck":
		<-l.release
	case "broken":
		return nil, errors.New("rules.yaml:1: broken")
	}
	return &kernel.CompiledBundle{Ref: kernel.DefaultBundleRef, Archive: src.Archive, Handle: name}, nil
}

func (l *stuckLoader) note(list *[]string, s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	*list = append(*list, s)
}

func (l *stuckLoader) Activate(_ string, cb *kernel.CompiledBundle) {
	l.note(&l.active, cb.Handle.(string))
}
func (l *stuckLoader) Discard(cb *kernel.CompiledBundle) { l.note(&l.discarded, cb.Handle.(string)) }
func (l *stuckLoader) Failed(_, name string, err error)  { l.note(&l.refused, name+": "+err.Error()) }
func (l *stuckLoader) Remove(string, string)             {}
func (l *stuckLoader) RulesBundle(string, []byte) (kernel.BundleSource, error) {
	return kernel.BundleSource{}, errors.New("not used")
}

func (l *stuckLoader) lists() (active, discarded, refused []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.active...), append([]string(nil), l.discarded...), append([]string(nil), l.refused...)
}

// TestLoadBundlesDeadline: LoadBundles does not wait for a loader that
// ignores its context past Config.BundleLoadTimeout: the stuck bundle is
// reported (warning and Failed), the others load, and when the stuck
// compile finally returns its result is discarded, never activated.
func TestLoadBundlesDeadline(t *testing.T) {
	dir := t.TempDir()
	st, err := bbolt.Open(filepath.Join(dir, "wicket.db"), bbolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	names := []string{"a", "stuck", "broken", "b", "c"}
	err = st.Update(context.Background(), func(tx kernel.Tx) error {
		for _, n := range names {
			if err := tx.PutBundle(&kernel.BundleRecord{Tenant: "default", Name: n, Engine: "rules", Archive: []byte(n)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	l := &stuckLoader{release: make(chan struct{})}
	defer close(l.release)
	k, err := kernel.New(st, webhook.New(), nil, l, kernel.Config{BundleLoadTimeout: 200 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- k.LoadBundles(context.Background()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("LoadBundles waited for a stuck bundle")
	}
	active, _, refused := l.lists()
	if len(active) != 3 {
		t.Errorf("active %v, want a, b, c", active)
	}
	want := []string{"broken: rules.yaml:1: broken", "stuck: did not load within 200ms"}
	if len(refused) != 2 || !(refused[0] == want[0] && refused[1] == want[1] || refused[0] == want[1] && refused[1] == want[0]) {
		t.Errorf("failed %q, want %q", refused, want)
	}
	for _, n := range []string{"bundle=stuck", "bundle=broken"} {
		if !strings.Contains(logs.String(), n) || !bytes.Contains([]byte(logs.String()), []byte("level=WARN msg=\"stored bundle skipped")) {
			t.Errorf("no warning naming %s in %s", n, logs.String())
		}
	}
	l.release <- struct{}{}
	deadline := time.Now().Add(10 * time.Second)
	for {
		active, discarded, _ := l.lists()
		if len(discarded) == 1 && discarded[0] == "stuck" && len(active) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("late result: active %v, discarded %v; want stuck discarded", active, discarded)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// budgetLoader is a bundle loader under which every bundle of tenant evil
// but its guard compiles until its context ends (as a Rego bundle that
// takes minutes to compile would); it records the order of evil's
// compilations and what the kernel tells it.
type budgetLoader struct {
	mu                    sync.Mutex
	evil, active, refused []string
}

func (l *budgetLoader) Compile(ctx context.Context, tenant string, src kernel.BundleSource) (*kernel.CompiledBundle, error) {
	name := string(src.Archive)
	if tenant == "evil" {
		l.mu.Lock()
		l.evil = append(l.evil, name)
		l.mu.Unlock()
		if name != "zz-guard" {
			<-ctx.Done()
			return nil, ctx.Err()
		}
	}
	return &kernel.CompiledBundle{Ref: kernel.DefaultBundleRef, Archive: src.Archive, Handle: tenant + "/" + name}, nil
}

func (l *budgetLoader) Activate(_ string, cb *kernel.CompiledBundle) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.active = append(l.active, cb.Handle.(string))
}
func (l *budgetLoader) Discard(*kernel.CompiledBundle) {}
func (l *budgetLoader) Failed(tenant, name string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refused = append(l.refused, tenant+"/"+name+": "+err.Error())
}
func (l *budgetLoader) Remove(string, string) {}
func (l *budgetLoader) RulesBundle(string, []byte) (kernel.BundleSource, error) {
	return kernel.BundleSource{}, errors.New("not used")
}

// TestLoadBundlesTenantBudget: one tenant's stored bundles cannot hold the
// boot up for long however many there are. Each compiles under
// --bundle-load-timeout, but a tenant-admin may store 1000 bundles that
// each compile for nearly that long (a Rego bundle of 12,000 rules
// compiles in about 9 s and is admitted at upload), which held every
// tenant's boot for 1000 × 10 s / GOMAXPROCS (over an hour on 2 cores).
// Past Config.BundleLoadTenantBudget of compile time, the tenant's other
// bundles are skipped (fail closed, named in the warning and to its
// agents); its admin-owned bundles (its guards) compile first; the other
// tenants' bundles all load.
func TestLoadBundlesTenantBudget(t *testing.T) {
	dir := t.TempDir()
	st, err := bbolt.Open(filepath.Join(dir, "wicket.db"), bbolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const evil = 40
	err = st.Update(context.Background(), func(tx kernel.Tx) error {
		for i := range evil {
			n := fmt.Sprintf("b%02d", i)
			if err := tx.PutBundle(&kernel.BundleRecord{Tenant: "evil", Name: n, Engine: "rego", Owner: kernel.BundleOwnerTenant, Archive: []byte(n)}); err != nil {
				return err
			}
		}
		if err := tx.PutBundle(&kernel.BundleRecord{Tenant: "evil", Name: "zz-guard", Engine: "rules", Owner: kernel.BundleOwnerAdmin, Archive: []byte("zz-guard")}); err != nil {
			return err
		}
		for _, n := range []string{"a", "b", "c"} {
			if err := tx.PutBundle(&kernel.BundleRecord{Tenant: "good", Name: n, Engine: "rules", Owner: kernel.BundleOwnerTenant, Archive: []byte(n)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	l := &budgetLoader{}
	const timeout, budget = 100 * time.Millisecond, 300 * time.Millisecond
	k, err := kernel.New(st, webhook.New(), nil, l, kernel.Config{BundleLoadTimeout: timeout, BundleLoadTenantBudget: budget,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.LoadBundles(context.Background()); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// The budget is checked before each compilation starts: at most
	// budget/timeout of them end within it, and GOMAXPROCS more may be
	// under way when it is spent.
	if most := int(budget/timeout) + runtime.GOMAXPROCS(0) + 1; len(l.evil) > most || len(l.evil) >= evil {
		t.Errorf("evil's bundles were compiled %d times, want at most %d of its %d", len(l.evil), most, evil+1)
	}
	// The admin-owned bundle goes first: its name sorts it after the 40
	// others, whose compile time spends the budget, so it is active only
	// because it was started before them. (Which of the first
	// GOMAXPROCS started compilations reaches the loader first is the
	// scheduler's: the order of l.evil is not asserted.)
	if !slices.Contains(l.evil, "zz-guard") {
		t.Errorf("evil's admin-owned bundle was never compiled (compilations %v)", l.evil)
	}
	slices.Sort(l.active)
	if want := []string{"evil/zz-guard", "good/a", "good/b", "good/c"}; !slices.Equal(l.active, want) {
		t.Errorf("active %v, want %v", l.active, want)
	}
	spent := 0
	for _, r := range l.refused {
		if strings.Contains(r, "tenant evil's bundles spent the boot budget of 300ms (serve --bundle-load-tenant-budget)") {
			spent++
		} else if !strings.HasSuffix(r, "did not load within 100ms") {
			t.Errorf("unexpected refusal %q", r)
		}
	}
	if len(l.refused) != evil || spent != evil-(len(l.evil)-1) {
		t.Errorf("%d refusals (%d for the budget), want %d (%d for the budget): %q", len(l.refused), spent, evil, evil-(len(l.evil)-1), l.refused)
	}
	if !strings.Contains(logs.String(), "serve --bundle-load-tenant-budget") {
		t.Errorf("the log does not name the budget:\n%s", logs.String())
	}
}

// TestBootTenantBudgetServe: a real `wicket serve` (GOMAXPROCS=2) whose
// store holds 20 bundles of one tenant that each hang at start-up until
// the 2 s instantiation deadline boots in well under the 20 s they would
// take one after another two at a time: with --bundle-load-tenant-budget
// 3s the tenant's bundles past the budget are skipped, its agents bound
// to them are denied saying so, and another tenant's bundle serves.
func TestBootTenantBudgetServe(t *testing.T) {
	t.Setenv("GOMAXPROCS", "2")
	dir, addr := t.TempDir(), freeAddr(t)
	p := startServe(t, dir, addr)
	keys := tenantAdmins(t, p.url, "evil", "good")
	if _, err := testkit.Bearer(p.url, keys["good"], "PUT", "/v0/bundles/ok", map[string]any{"engine": "rules",
		"files": map[string]string{"rules.yaml": "default_action: allow\n"}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := testkit.Bearer(p.url, keys["good"], "POST", "/v0/agents", map[string]any{
		"id": "bot", "webhook_url": "http://127.0.0.1:9/hook", "secret": "boot-test-secret-0123456789", "bundle": "ok"}, nil); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Wait()
	hang := hangingStartWasm(t)
	const n = 20
	for i := range n {
		name := fmt.Sprintf("b%02d", i)
		storeBundle(t, dir, "evil", name, wasmArchive(t, "name: "+name+"\nrevision: bomb\nengine: wasm\n", hang))
	}

	p = startServe(t, dir, addr, "--bundle-load-tenant-budget", "3s")
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	t.Logf("booted in %s with %d bundles of one tenant hanging 2 s each", p.boot.Round(time.Millisecond), n)
	if p.boot > 12*time.Second {
		t.Errorf("boot took %s, want under 12s", p.boot)
	}
	for i := range n {
		if _, err := testkit.Bearer(p.url, keys["evil"], "POST", "/v0/agents", map[string]any{"id": fmt.Sprintf("bot-b%02d", i),
			"webhook_url": "http://127.0.0.1:9/hook", "secret": "boot-test-secret-0123456789", "bundle": fmt.Sprintf("b%02d", i)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	eval := func(key, agent string) (decision, rule, reason string) {
		var res struct {
			Decision string `json:"decision"`
			RuleID   string `json:"rule_id"`
			Reason   string `json:"reason"`
		}
		if _, err := testkit.Bearer(p.url, key, "POST", "/v0/policy/eval",
			map[string]any{"agent_id": agent, "step": map[string]any{"kind": "tool_call", "target": "shell.exec"}}, &res); err != nil {
			t.Fatalf("eval %s: %v", agent, err)
		}
		return res.Decision, res.RuleID, res.Reason
	}
	if d, _, _ := eval(keys["good"], "bot"); d != "allow" {
		t.Errorf("good's bot: %s, want allow", d)
	}
	budget := 0
	for i := range n {
		d, rule, reason := eval(keys["evil"], fmt.Sprintf("bot-b%02d", i))
		if d != "deny" || rule != "engine_error" {
			t.Errorf("bot-b%02d: %s %s %q, want deny engine_error", i, d, rule, reason)
		}
		if strings.Contains(reason, "spent the boot budget of 3s (serve --bundle-load-tenant-budget)") {
			budget++
		}
	}
	if budget == 0 {
		t.Errorf("no agent of evil denied for the budget:\n%s", p.stderr.String())
	}
}
