package rego

import (
	"fmt"
	"math"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/wicket-run/wicket/kernel/policy"
)

// Keys of the input document (docs/policy.md), built once.
var (
	inTenant      = ast.StringTerm("tenant")
	inAgentID     = ast.StringTerm("agent_id")
	inExecutionID = ast.StringTerm("execution_id")
	inStep        = ast.StringTerm("step")
	inExecution   = ast.StringTerm("execution")

	inKind        = ast.StringTerm("kind")
	inTarget      = ast.StringTerm("target")
	inArgs        = ast.StringTerm("args")
	inArgsHash    = ast.StringTerm("args_hash")
	inIdempotency = ast.StringTerm("idempotency")
	inEffect      = ast.StringTerm("effect")
	inOccurrence  = ast.StringTerm("occurrence")

	inStatus    = ast.StringTerm("status")
	inLabels    = ast.StringTerm("labels")
	inTotals    = ast.StringTerm("totals")
	inCreatedAt = ast.StringTerm("created_at")

	inSteps    = ast.StringTerm("steps")
	inLLMCalls = ast.StringTerm("llm_calls")
	inTokens   = ast.StringTerm("tokens")
	inCostUSD  = ast.StringTerm("cost_usd")
)

// inputValue builds the OPA value of in directly, without a JSON round trip
// of the whole document. The result equals what encoding/json would produce
// for in (nil labels and empty args become null; created_at is RFC 3339 with
// nanoseconds); TestInputValueMatchesJSON holds the two together.
func inputValue(in *policy.Input) (ast.Value, error) {
	args, err := jsonTerm(in.Step.Args)
	if err != nil {
		return nil, fmt.Errorf("step.args: %w", err)
	}
	cost := in.Execution.Totals.CostUSD
	if math.IsNaN(cost) || math.IsInf(cost, 0) {
		return nil, fmt.Errorf("execution.totals.cost_usd is %v, want a finite number", cost)
	}

	step := ast.NewObjectWithCapacity(7)
	step.Insert(inKind, ast.InternedTerm(in.Step.Kind))
	step.Insert(inTarget, ast.InternedTerm(in.Step.Target))
	step.Insert(inArgs, args)
	step.Insert(inArgsHash, ast.InternedTerm(in.Step.ArgsHash))
	step.Insert(inIdempotency, ast.InternedTerm(in.Step.Idempotency))
	step.Insert(inEffect, ast.InternedTerm(in.Step.Effect))
	step.Insert(inOccurrence, ast.InternedTerm(in.Step.Occurrence))

	labels := ast.InternedNullTerm
	if in.Execution.Labels != nil {
		lo := ast.NewObjectWithCapacity(len(in.Execution.Labels))
		for k, v := range in.Execution.Labels {
			lo.Insert(ast.InternedTerm(k), ast.InternedTerm(v))
		}
		labels = ast.NewTerm(lo)
	}

	totals := ast.NewObjectWithCapacity(4)
	totals.Insert(inSteps, ast.InternedTerm(in.Execution.Totals.Steps))
	totals.Insert(inLLMCalls, ast.InternedTerm(in.Execution.Totals.LLMCalls))
	totals.Insert(inTokens, ast.InternedTerm(in.Execution.Totals.Tokens))
	totals.Insert(inCostUSD, ast.FloatNumberTerm(cost))

	exec := ast.NewObjectWithCapacity(4)
	exec.Insert(inStatus, ast.InternedTerm(in.Execution.Status))
	exec.Insert(inLabels, labels)
	exec.Insert(inTotals, ast.NewTerm(totals))
	exec.Insert(inCreatedAt, ast.StringTerm(in.Execution.CreatedAt.Format(time.RFC3339Nano)))

	doc := ast.NewObjectWithCapacity(5)
	doc.Insert(inTenant, ast.InternedTerm(in.Tenant))
	doc.Insert(inAgentID, ast.InternedTerm(in.AgentID))
	doc.Insert(inExecutionID, ast.InternedTerm(in.ExecutionID))
	doc.Insert(inStep, ast.NewTerm(step))
	doc.Insert(inExecution, ast.NewTerm(exec))
	return doc, nil
}
