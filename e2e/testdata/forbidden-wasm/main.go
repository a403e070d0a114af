// Command forbidden-wasm imports a host function no sandbox grants; the
// kernel must refuse the bundle at upload (e2e/hostile_test.go).
package main

import "github.com/wicket-run/wicket/policy-sdk/go/policy"

//go:wasmimport env http_get
func httpGet(ptr, n uint32) uint32

func init() { policy.Handle(decide) }

func decide(in *policy.Input) *policy.Decision {
	if in.Step.Target == "fetch" {
		httpGet(0, 0)
	}
	return nil
}

func main() {}
