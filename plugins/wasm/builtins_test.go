package wasm

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	opa "github.com/open-policy-agent/opa/v1/rego"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/rego"
)

// builtinInput is the input document of the builtin samples: plain values
// and PEM material made afresh (both engines see the same).
func builtinInput(t *testing.T) []byte {
	t.Helper()
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(42),
		Subject:      pkix.Name{CommonName: "wicket-test"},
		NotBefore:    time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC),
		NotAfter:     time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &ecKey.PublicKey, ecKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(ecKey)
	if err != nil {
		t.Fatal(err)
	}
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "wicket-csr"}}, ecKey)
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	pemOf := func(typ string, b []byte) string { return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b})) }

	b64 := base64.RawURLEncoding.EncodeToString
	claims := b64([]byte(`{"sub":"agent","aud":"wicket"}`))
	hsHead := b64([]byte(`{"alg":"HS256","typ":"JWT"}`))
	mac := hmac.New(sha256.New, []byte("secret"))
	mac.Write([]byte(hsHead + "." + claims))
	jwtHS := hsHead + "." + claims + "." + b64(mac.Sum(nil))
	esHead := b64([]byte(`{"alg":"ES256","typ":"JWT"}`))
	digest := sha256.Sum256([]byte(esHead + "." + claims))
	r, s, err := ecdsa.Sign(rand.Reader, ecKey, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	jwtES := esHead + "." + claims + "." + b64(sig)

	doc := map[string]any{
		"s": "hello", "n": 5, "neg": -3, "bad": "x", "ip": "10.1.2.3",
		"obj":    map[string]any{"a": 1, "b": []any{1, 2}},
		"arr":    []any{3, 1, 2},
		"words":  []any{"x", "y"},
		"ts":     "2026-11-29T08:10:09.123456789+01:00",
		"cert":   pemOf("CERTIFICATE", der),
		"key":    pemOf("PRIVATE KEY", keyDER),
		"csr":    pemOf("CERTIFICATE REQUEST", csrDER),
		"rsa":    pemOf("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsaKey)),
		"jwt_hs": jwtHS, "jwt_es": jwtES,
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// evalOPAValue evaluates the OPA module behind ev on input and returns its
// result as an OPA value (opa_eval's value output keeps sets as sets), or
// nil when undefined.
func evalOPAValue(t *testing.T, ev *evaluator, input []byte) ast.Value {
	t.Helper()
	ctx := context.Background()
	inst, err := ev.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.release(inst)
	o := inst.(*opaInstance)
	ctx = context.WithValue(ctx, instanceKey{}, o)
	ctx = o.hb.Evaluation(ctx, o.out.stdout)
	end := uint64(o.baseHeap) + uint64(len(input))
	if end > uint64(o.mem.Size()) {
		if _, ok := o.mem.Grow(uint32((end - uint64(o.mem.Size()) + 65535) / 65536)); !ok {
			t.Fatal("grow memory")
		}
	}
	o.mem.Write(o.baseHeap, input)
	addr, err := o.call(ctx, "opa_eval", o.fn.eval, 0, uint64(o.entrypoint), uint64(o.dataAddr), uint64(o.baseHeap), uint64(len(input)), end, 1)
	if err != nil {
		t.Fatalf("opa_eval: %v", err)
	}
	out, err := o.cString(addr)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ast.ParseTerm(string(out))
	if err != nil {
		t.Fatalf("result %q: %v", out, err)
	}
	set, ok := rs.Value.(ast.Set)
	if !ok || set.Len() > 1 {
		t.Fatalf("result set %s", rs)
	}
	if set.Len() == 0 {
		return nil
	}
	return set.Slice()[0].Value.(ast.Object).Get(ast.StringTerm("result")).Value
}

// evalTopdown evaluates query with OPA's own evaluator (the rego package,
// prepared query, builtin errors undefined as by default) and returns the
// result as an OPA value, or nil when undefined.
func evalTopdown(t *testing.T, module, query string, input []byte, opts ...func(*opa.Rego)) ast.Value {
	t.Helper()
	var x any
	if err := json.Unmarshal(input, &x); err != nil {
		t.Fatal(err)
	}
	in, err := ast.InterfaceToValue(x)
	if err != nil {
		t.Fatal(err)
	}
	opts = append(opts, opa.Module("policy.rego", module), opa.Query(query),
		opa.GenerateJSON(func(t *ast.Term, _ *opa.EvalContext) (any, error) { return t.Value, nil }))
	pq, err := opa.New(opts...).PrepareForEval(context.Background())
	if err != nil {
		t.Fatalf("prepare %s: %v", query, err)
	}
	rs, err := pq.Eval(context.Background(), opa.EvalParsedInput(in))
	if err != nil {
		t.Fatalf("topdown %s: %v", query, err)
	}
	if len(rs) == 0 {
		return nil
	}
	return rs[0].Expressions[0].Value.(ast.Value)
}

// TestOPABuiltinTable walks OPA's whole builtin table: every builtin a
// policy can call is either refused by both engines with a message naming
// it (the forbidden list), or runs in OPA-compiled wasm — inside the module
// or through the host's OPA implementations — and agrees with OPA's
// topdown on every sample call, undefined included.
func TestOPABuiltinTable(t *testing.T) {
	var (
		src, v0   strings.Builder       // Rego v1 and, for deprecated builtins, v0
		what      = map[string]string{} // rule → "builtin: expression"
		forbidden []string
	)
	src.WriteString("package t\n\n")
	v0.WriteString("package t0\n\n")
	for i, b := range ast.CapabilitiesForThisVersion().Builtins {
		if why, ok := builtinsCompiledAway[b.Name]; ok {
			t.Logf("%s: not called at evaluation: %s", b.Name, why)
			continue
		}
		if rego.Forbidden(b.Name, nil) != "" {
			forbidden = append(forbidden, b.Name)
			continue
		}
		samples := builtinSamples[b.Name]
		if len(samples) == 0 {
			t.Errorf("builtin %s: no sample call in builtinSamples", b.Name)
		}
		for j, expr := range samples {
			rule := fmt.Sprintf("c%03d_%d", i, j)
			if b.Deprecated { // not callable in Rego v1
				fmt.Fprintf(&v0, "%s = x { x := %s }\n", rule, expr)
			} else {
				fmt.Fprintf(&src, "%s := %s\n", rule, expr)
			}
			what[rule] = b.Name + ": " + expr
		}
	}
	for name := range builtinSamples {
		if _, ok := ast.BuiltinMap[name]; !ok {
			t.Errorf("builtinSamples names %s, which is not an OPA builtin", name)
		}
	}

	input := builtinInput(t)
	e := newEngine(t, Config{})
	got, want := ast.NewObject(), ast.NewObject()
	var host []string
	for _, m := range []struct {
		pkg, src string
		version  ast.RegoVersion
	}{{"t", src.String(), ast.RegoV1}, {"t0", v0.String(), ast.RegoV0}} {
		mod, err := buildRegoVersion(m.src, false, m.version, m.pkg)
		if err != nil {
			t.Fatalf("build the samples of package %s to wasm: %v", m.pkg, err)
		}
		ev := compile(t, e, opaBundle(mod, m.pkg, ""))
		inst, err := ev.acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range inst.(*opaInstance).builtins {
			if b.name != "" {
				host = append(host, b.name)
			}
		}
		ev.release(inst)
		g, ok := evalOPAValue(t, ev, input).(ast.Object)
		if !ok {
			t.Fatalf("wasm: package %s is not an object", m.pkg)
		}
		w, ok := evalTopdown(t, m.src, "data."+m.pkg, input, opa.SetRegoVersion(m.version)).(ast.Object)
		if !ok {
			t.Fatalf("topdown: package %s is not an object", m.pkg)
		}
		got, _ = got.Merge(g)
		want, _ = want.Merge(w)
	}
	slices.Sort(host)
	t.Logf("%d sample calls; the modules call %d builtins on the host: %s", len(what), len(host), strings.Join(host, ", "))
	if len(host) < 90 {
		t.Errorf("only %d host builtins: the samples no longer reach what OPA leaves to the host", len(host))
	}
	rules := make([]string, 0, len(what))
	for r := range what {
		rules = append(rules, r)
	}
	slices.Sort(rules)
	defined, known := 0, 0
	for _, r := range rules {
		k := ast.StringTerm(r)
		g, w := got.Get(k), want.Get(k)
		switch {
		case g == nil && w == nil:
		case g == nil || w == nil:
			t.Errorf("%s: wasm %v, topdown %v", what[r], g, w)
		case g.Value.Compare(w.Value) != 0:
			if why, ok := builtinDifferences[strings.SplitN(what[r], ": ", 2)[1]]; ok {
				t.Logf("known difference of OPA's wasm: %s: wasm %v, topdown %v: %s", what[r], g, w, why)
				known++
				continue
			}
			t.Errorf("%s:\n  wasm    %v\n  topdown %v", what[r], g, w)
		default:
			defined++
		}
	}
	if known != len(builtinDifferences) {
		t.Errorf("%d known differences seen, %d listed: OPA changed; update builtinDifferences and docs/policy.md", known, len(builtinDifferences))
	}
	t.Logf("%d of %d sample calls defined and equal, %d known differences", defined, len(rules), known)

	testForbiddenBuiltins(t, forbidden)
}

// forbiddenSamples calls each builtin of the forbidden list.
var forbiddenSamples = map[string]string{
	"http.send":              `http.send({"method": "GET", "url": "http://example.invalid/"})`,
	"net.lookup_ip_addr":     `net.lookup_ip_addr("example.invalid")`,
	"opa.runtime":            `opa.runtime()`,
	"time.now_ns":            `time.now_ns()`,
	"rand.intn":              `rand.intn("k", 10)`,
	"uuid.rfc4122":           `uuid.rfc4122("k")`,
	"io.jwt.decode_verify":   `io.jwt.decode_verify(input.s, {"secret": "x"})`,
	"io.jwt.encode_sign":     `io.jwt.encode_sign({"alg": "HS256"}, {}, {"kty": "oct", "k": "eA"})`,
	"io.jwt.encode_sign_raw": `io.jwt.encode_sign_raw("{\"alg\":\"HS256\"}", "{}", "{\"kty\":\"oct\",\"k\":\"eA\"}")`,
	"json.match_schema":      `json.match_schema({}, {})`,
	"json.verify_schema":     `json.verify_schema({})`,

	"crypto.x509.parse_and_verify_certificates":              `crypto.x509.parse_and_verify_certificates(input.s)`,
	"crypto.x509.parse_and_verify_certificates_with_options": `crypto.x509.parse_and_verify_certificates_with_options(input.s, {})`,
}

// testForbiddenBuiltins checks that a module calling each forbidden
// builtin is refused by the wasm host with a message naming every one of
// them, and that the Rego engine refuses the same policy naming the same
// builtins.
func testForbiddenBuiltins(t *testing.T, names []string) {
	slices.Sort(names)
	var src strings.Builder
	src.WriteString("package f\n\n")
	var eps []string
	for i, n := range names {
		call, ok := forbiddenSamples[n]
		if !ok {
			t.Errorf("forbidden builtin %s: no sample call in forbiddenSamples", n)
			continue
		}
		fmt.Fprintf(&src, "x%d := %s\n", i, call)
		eps = append(eps, fmt.Sprintf("f/x%d", i))
	}
	mod, err := buildRego(src.String(), eps...)
	if err != nil {
		t.Fatalf("build the forbidden calls to wasm: %v", err)
	}
	_, werr := newEngine(t, Config{}).Compile(context.Background(), opaBundle(mod, "f/x0", ""))
	for i, n := range names {
		want := "builtin " + n + " is not allowed in wicket policies: "
		if werr == nil || !strings.Contains(werr.Error(), want) {
			t.Errorf("wasm: %s: error %v does not contain %q", n, werr, want)
		}
		// One bundle per builtin: OPA's compiler stops after 10 errors.
		rb := &bundle.Bundle{
			Manifest: bundle.Manifest{Name: "f", Revision: "1", Engine: bundle.EngineRego, Entrypoint: fmt.Sprintf("data.f.x%d", i)},
			Files:    map[string][]byte{"policy.rego": fmt.Appendf(nil, "package f\n\nx%d := %s\n", i, forbiddenSamples[n])},
		}
		_, rerr := rego.New().Compile(context.Background(), rb)
		if rerr == nil || !strings.Contains(rerr.Error(), want) {
			t.Errorf("rego: %s: error %v does not contain %q", n, rerr, want)
		}
	}
	t.Logf("%d forbidden builtins refused by both engines: %s", len(names), strings.Join(names, ", "))
}

// TestOPAGrantedBuiltins runs the builtins a grant lifts the ban on: the
// clock for time.now_ns, randomness for rand.intn and uuid.rfc4122, which
// answer the same within one evaluation, as in OPA.
func TestOPAGrantedBuiltins(t *testing.T) {
	const src = `package g

now := time.now_ns()

same_rand if rand.intn("k", 1000000) == rand.intn("k", 1000000)

same_uuid if uuid.rfc4122("k") == uuid.rfc4122("k")

decision := {"decision": "allow", "reason": sprintf("%d %s", [rand.intn("k", 100), uuid.rfc4122("k")])}
`
	mod, err := buildRego(src, "g/now", "g/same_rand", "g/same_uuid", "g/decision")
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, Config{})
	b := opaBundle(mod, "g/now", "")
	if _, err := e.Compile(context.Background(), b); err == nil || !strings.Contains(err.Error(), "builtin time.now_ns is not allowed in wicket policies: it reads the wall clock") ||
		!strings.Contains(err.Error(), "the sandbox grant clock allows it") || !strings.Contains(err.Error(), "builtin rand.intn is not allowed") {
		t.Fatalf("ungranted: %v", err)
	}
	b.Manifest.Sandbox.Grants = []string{GrantClock}
	if _, err := e.Compile(context.Background(), b); err == nil || strings.Contains(err.Error(), "time.now_ns") || !strings.Contains(err.Error(), "builtin uuid.rfc4122 is not allowed") {
		t.Fatalf("clock only: %v", err)
	}
	b.Manifest.Sandbox.Grants = []string{GrantClock, GrantRandom}
	ev := compile(t, e, b)
	before := time.Now().UnixNano()
	now := evalOPAValue(t, ev, []byte(`{}`))
	after := time.Now().UnixNano()
	n, err := strconv.ParseInt(now.String(), 10, 64)
	if err != nil || n < before || n > after {
		t.Fatalf("time.now_ns = %v, want within [%d, %d]", now, before, after)
	}
	for _, ep := range []string{"g/same_rand", "g/same_uuid"} {
		b := opaBundle(mod, ep, "")
		b.Manifest.Sandbox.Grants = []string{GrantClock, GrantRandom}
		if v := evalOPAValue(t, compile(t, e, b), []byte(`{}`)); v == nil || v.Compare(ast.Boolean(true)) != 0 {
			t.Errorf("%s = %v, want true", ep, v)
		}
	}
	b = opaBundle(mod, "g/decision", "")
	b.Manifest.Sandbox.Grants = []string{GrantRandom, GrantClock}
	wantDecision(t, compile(t, e, b), smallInput(), policy.Allow, "")
}

// TestOPAPrint runs print statements compiled into the module: they call
// the host's internal.print, whose output reaches the bundle's stdout (the
// log, with the stdout grant).
func TestOPAPrint(t *testing.T) {
	var out bytes.Buffer
	mod, err := buildRegoWith(`package p

decision := {"decision": "allow"} if {
	print("target", input.step.target, {"n": 1})
}
`, true, "p/decision")
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, Config{Logger: slog.New(slog.NewTextHandler(&out, nil))})
	b := opaBundle(mod, "p/decision", "")
	b.Manifest.Sandbox.Grants = []string{GrantStdout}
	wantDecision(t, compile(t, e, b), input("tool_call", "fs.read", "", nil), policy.Allow, "")
	if !strings.Contains(out.String(), `target fs.read {\"n\": 1}`) {
		t.Fatalf("log = %q, want the printed line", out.String())
	}
}

// TestOPAHostBuiltinAmplification calls host builtins whose output could be
// far larger than their arguments: each is refused before it runs (the
// kernel's Go heap is not the module's capped memory), while an ordinary
// call of the same builtin works.
func TestOPAHostBuiltinAmplification(t *testing.T) {
	cases := []struct{ name, bomb, fine string }{
		{"numbers.range_step", `numbers.range_step(0, 1000000000000, 1)`, `numbers.range_step(0, 10, 2)`},
		{"net.cidr_expand", `net.cidr_expand("10.0.0.0/4")`, `net.cidr_expand("10.0.0.0/30")`},
		{"net.cidr_expand", `net.cidr_expand("2001:db8::/64")`, `net.cidr_expand("2001:db8::/126")`},
		// Go's fmt honours widths up to 10^6: twenty such verbs make 20 MB.
		{"sprintf", `sprintf(concat("", ["%999999d" | some _ in numbers.range(1, 20)]), numbers.range(1, 20))`, `sprintf("%5d", [1])`},
		{"sprintf", `sprintf(concat("", ["%*d" | some _ in numbers.range(1, 20)]), [999999 | some _ in numbers.range(1, 40)])`, `sprintf("%*d", [3, 1])`},
		{"regex.replace", `regex.replace(concat("", ["aaaaaaaaaa" | some _ in numbers.range(1, 500)]), "", concat("", ["bbbbbbbbbb" | some _ in numbers.range(1, 500)]))`, `regex.replace("abc", "b", "X")`},
		{"strings.render_template", `strings.render_template("{{range .a}}{{range $.a}}{{range $.a}}{{range $.a}}xxxxxxxx{{end}}{{end}}{{end}}{{end}}", {"a": numbers.range(1, 200)})`, `strings.render_template("{{range .a}}{{.}},{{end}}", {"a": [1, 2]})`},
		// Few loops, each printing 20 KB: measured by rendering, stopped at the budget.
		{"strings.render_template", `strings.render_template("{{range .a}}{{$.s}}{{end}}", {"a": numbers.range(1, 1000), "s": concat("", ["x" | some _ in numbers.range(1, 20000)])})`, `count(strings.render_template("{{range .a}}{{$.s}}{{end}}", {"a": numbers.range(1, 10), "s": concat("", ["x" | some _ in numbers.range(1, 20000)])}))`},
		{"strings.render_template", `strings.render_template("{{define \"x\"}}{{template \"x\" .}}{{end}}{{template \"x\" .}}", {})`, `strings.render_template("{{.n}}", {"n": 1})`},
		{"graph.reachable_paths", `graph.reachable_paths({x: [y | some y in numbers.range(1, 40); y > x] | some x in numbers.range(1, 40)}, {1})`, `graph.reachable_paths({"a": ["b"], "b": []}, {"a"})`},
	}
	e := newEngine(t, Config{})
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := fmt.Sprintf("package a\n\nbomb := {\"decision\": \"allow\", \"reason\": sprintf(\"%%v\", [%s])}\n\nfine := {\"decision\": \"allow\", \"reason\": sprintf(\"%%v\", [%s])}\n", c.bomb, c.fine)
			mod, err := buildRego(src, "a/bomb", "a/fine")
			if err != nil {
				t.Fatalf("case %d: %v", i, err)
			}
			wantDecision(t, compile(t, e, opaBundle(mod, "a/fine", "")), smallInput(), policy.Allow, "")
			start := time.Now()
			err = wantError(t, compile(t, e, opaBundle(mod, "a/bomb", "")), smallInput(), "wasm: opa abort: "+c.name+": ")
			if !strings.Contains(err.Error(), "over the sandbox's 16 MiB for one builtin call") && !strings.Contains(err.Error(), "no size bound in the sandbox") {
				t.Errorf("error %q does not say the sandbox refused the size", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("refused after %s", d)
			}
		})
	}
}
