package rego

import (
	"context"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/util"
	opa "github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/topdown"
)

func prepVariant(b *testing.B, astStore bool) opa.PreparedEvalQuery {
	e := New()
	bn := benchBundle()
	mods, err := e.parse(bn.Files)
	if err != nil { b.Fatal(err) }
	c := ast.NewCompiler().WithCapabilities(e.caps).WithDefaultRegoVersion(ast.RegoV1)
	c.Compile(mods)
	if c.Failed() { b.Fatal(c.Errors) }
	var x map[string]any
	if err := util.UnmarshalJSON(bn.Data, &x); err != nil { b.Fatal(err) }
	st := inmem.NewFromObject(x)
	if astStore { st = inmem.NewFromObjectWithOpts(x, inmem.OptReturnASTValuesOnRead(true)) }
	ref := ast.MustParseRef(DefaultEntrypoint)
	pq, err := opa.New(opa.Compiler(c), opa.Store(st), opa.ParsedQuery(ast.NewBody(ast.NewExpr(ast.NewTerm(ref)))),
		opa.StrictBuiltinErrors(true), opa.GenerateJSON(generateDecision)).PrepareForEval(context.Background())
	if err != nil { b.Fatal(err) }
	return pq
}

func BenchmarkAblation(b *testing.B) {
	in := benchInputs()[0].in
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	pqAST := prepVariant(b, true)
	pqMap := prepVariant(b, false)
	run := func(name string, pq opa.PreparedEvalQuery, f func() []opa.EvalOption) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			reportCPU(b)
			for b.Loop() {
				rs, err := pq.Eval(ctx, f()...)
				if err != nil || len(rs) != 1 { b.Fatal(err) }
			}
		})
	}
	best := func() []opa.EvalOption {
		v, _ := inputValue(in)
		c := topdown.NewCancel()
		stop := context.AfterFunc(ctx, c.Cancel)
		defer stop()
		return []opa.EvalOption{opa.EvalParsedInput(v), opa.EvalMetrics(noMetrics), opa.EvalExternalCancel(c)}
	}
	run("all-tuned", pqAST, best)
	run("plain-store", pqMap, best)
	run("struct-input", pqAST, func() []opa.EvalOption {
		c := topdown.NewCancel()
		return []opa.EvalOption{opa.EvalInput(in), opa.EvalMetrics(noMetrics), opa.EvalExternalCancel(c)}
	})
	run("default-metrics", pqAST, func() []opa.EvalOption {
		v, _ := inputValue(in)
		c := topdown.NewCancel()
		return []opa.EvalOption{opa.EvalParsedInput(v), opa.EvalExternalCancel(c)}
	})
	run("goroutine-cancel", pqAST, func() []opa.EvalOption {
		v, _ := inputValue(in)
		return []opa.EvalOption{opa.EvalParsedInput(v), opa.EvalMetrics(noMetrics)}
	})
	run("all-default", pqMap, func() []opa.EvalOption {
		return []opa.EvalOption{opa.EvalInput(in)}
	})
}
