// Command decisions-wasm is the e2e test policy (one target per decision)
// written with the Go SDK; e2e/policy_test.go builds it with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath -o policy.wasm .
package main

import "github.com/wicket-run/wicket/policy-sdk/go/policy"

func init() { policy.Handle(decide) }

func decide(in *policy.Input) *policy.Decision {
	switch in.Step.Target {
	case "read":
		return policy.Allow("").WithRule("read")
	case "delete":
		return policy.Deny("deletes are denied").WithRule("no-delete")
	case "limited":
		return policy.Allow("").WithRule("limited").WithRateLimit(policy.RateLimit{MaxCalls: 2, Window: "1h", Per: policy.PerExecution})
	case "deploy":
		return policy.RequireApproval("deploys need a human").WithRule("deploy").
			WithApproval(policy.Approval{Approvers: []string{"alice"}, Timeout: "10m", Message: "deploy?"})
	case "deploy-fast":
		return policy.RequireApproval("").WithRule("deploy-fast").WithApproval(policy.Approval{Timeout: "300ms"})
	case "nuke":
		return policy.Abort("never").WithRule("nuke")
	}
	return nil
}

func main() {}
