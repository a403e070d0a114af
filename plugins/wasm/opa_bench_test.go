package wasm

import (
	"context"
	"encoding/json"
	"testing"

	opa "github.com/open-policy-agent/opa/v1/rego"

	"github.com/wicket-run/wicket/internal/cpubench"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/rego"
)

// BenchmarkOPACorpus times one evaluation of each corpus policy (testdata/opa)
// in OPA's own evaluator (topdown: the rego package, prepared query, the
// input as decoded JSON), Wicket's Rego engine and Wicket's wasm engine
// running the policy built by OPA's compiler, cycling through the same
// generated inputs. Compare the engines within one run:
//
//	go test -run '^$' -bench BenchmarkOPACorpus ./plugins/wasm/
func BenchmarkOPACorpus(b *testing.B) {
	inputs := corpusInputs(300)
	docs := make([]any, len(inputs))
	for i, in := range inputs {
		raw, err := json.Marshal(in)
		if err != nil {
			b.Fatal(err)
		}
		if err := json.Unmarshal(raw, &docs[i]); err != nil {
			b.Fatal(err)
		}
	}
	e := newEngine(b, Config{})
	ctx := context.Background()
	for _, p := range loadCorpus(b) {
		b.Run(p.name+"/opa-topdown", func(b *testing.B) {
			pq := p.topdown(b)
			b.ReportAllocs()
			cpubench.Report(b)
			i := 0
			for b.Loop() {
				if _, err := pq.Eval(ctx, opa.EvalInput(docs[i%len(docs)])); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
		b.Run(p.name+"/wicket-rego", func(b *testing.B) {
			ev, err := rego.New().Compile(ctx, p.regoBundle())
			if err != nil {
				b.Fatal(err)
			}
			defer ev.Close()
			benchEvaluator(b, ev, inputs)
		})
		b.Run(p.name+"/wicket-wasm", func(b *testing.B) {
			benchEvaluator(b, compile(b, e, p.wasmBundle()), inputs)
		})
	}
}

func benchEvaluator(b *testing.B, ev policy.Evaluator, inputs []*policy.Input) {
	ctx := context.Background()
	b.ReportAllocs()
	cpubench.Report(b)
	i := 0
	for b.Loop() {
		_, _ = ev.Evaluate(ctx, inputs[i%len(inputs)])
		i++
	}
}
