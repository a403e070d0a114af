// Command hostile-wasm is a misbehaving policy for e2e/hostile_test.go: by
// target it loops forever, allocates without bound, or panics; "fine" is
// allowed, so the test can show the kernel still serves evaluations.
package main

import "github.com/wicket-run/wicket/policy-sdk/go/policy"

func init() { policy.Handle(decide) }

var sink [][]byte

func decide(in *policy.Input) *policy.Decision {
	switch in.Step.Target {
	case "loop":
		n := 0
		for {
			n++
		}
	case "bomb":
		for {
			sink = append(sink, make([]byte, 1<<20))
		}
	case "panic":
		panic("policy bug")
	}
	return policy.Allow("fine").WithRule("fine")
}

func main() {}
