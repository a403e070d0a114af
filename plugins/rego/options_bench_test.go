package rego

import (
	"context"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	opa "github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/open-policy-agent/opa/v1/util"

	"github.com/wicket-run/wicket/internal/cpubench"
)

// prepareVariant prepares benchPolicy like Compile does, except that
// astStore=false keeps data.json as Go maps (OPA's default store), which
// OPA converts to AST values on every read.
func prepareVariant(b *testing.B, astStore bool) opa.PreparedEvalQuery {
	b.Helper()
	e := New()
	bn := benchBundle()
	mods, err := e.parse(bn)
	if err != nil {
		b.Fatal(err)
	}
	c := ast.NewCompiler().WithCapabilities(e.caps).WithDefaultRegoVersion(ast.RegoV1)
	if c.Compile(mods); c.Failed() {
		b.Fatal(c.Errors)
	}
	var data map[string]any
	if err := util.UnmarshalJSON(bn.Data, &data); err != nil {
		b.Fatal(err)
	}
	store := inmem.NewFromObject(data)
	if astStore {
		store = inmem.NewFromObjectWithOpts(data, inmem.OptReturnASTValuesOnRead(true))
	}
	pq, err := opa.New(
		opa.Compiler(c),
		opa.Store(store),
		opa.ParsedQuery(ast.NewBody(ast.NewExpr(ast.NewTerm(ast.MustParseRef(DefaultEntrypoint))))),
		opa.GenerateJSON(decisionGenerator(DefaultEntrypoint)),
	).PrepareForEval(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	return pq
}

// BenchmarkEvalOptions measures the choices Evaluate makes, one at a time,
// on the allow-list path of benchPolicy: "tuned" is what Evaluate does; each
// other variant undoes one choice; "opa-defaults" undoes them all.
func BenchmarkEvalOptions(b *testing.B) {
	in := benchInputs()[0].in
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour) // cancellable, like the kernel's
	defer cancel()
	astStore := prepareVariant(b, true)
	mapStore := prepareVariant(b, false)

	direct := func() opa.EvalOption {
		v, err := inputValue(in)
		if err != nil {
			b.Fatal(err)
		}
		return opa.EvalParsedInput(v)
	}
	eval := func(pq opa.PreparedEvalQuery, input opa.EvalOption, tuneMetrics, tuneCancel bool) {
		opts := []opa.EvalOption{input}
		if tuneMetrics {
			opts = append(opts, opa.EvalMetrics(noMetrics))
		}
		stop := func() bool { return false }
		if tuneCancel {
			c := topdown.NewCancel()
			stop = context.AfterFunc(ctx, c.Cancel)
			opts = append(opts, opa.EvalExternalCancel(c))
		}
		rs, err := pq.Eval(ctx, opts...)
		stop()
		if err != nil || len(rs) != 1 {
			b.Fatalf("got %v, %v", rs, err)
		}
	}
	variants := []struct {
		name string
		run  func()
	}{
		{"tuned", func() { eval(astStore, direct(), true, true) }},
		{"map-store", func() { eval(mapStore, direct(), true, true) }},
		{"struct-input", func() { eval(astStore, opa.EvalInput(in), true, true) }},
		{"default-metrics", func() { eval(astStore, direct(), false, true) }},
		{"goroutine-cancel", func() { eval(astStore, direct(), true, false) }},
		{"opa-defaults", func() { eval(mapStore, opa.EvalInput(in), false, false) }},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			cpubench.Report(b)
			for b.Loop() {
				v.run()
			}
		})
	}
}
