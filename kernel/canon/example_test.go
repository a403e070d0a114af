package canon_test

import (
	"errors"
	"fmt"

	"github.com/wicket-run/wicket/kernel/canon"
)

func ExampleCanonical() {
	out, err := canon.Canonical([]byte(`{ "b": [1.0, 1e2], "a": "<\u00e9>", "é": -0 }`))
	if err != nil {
		panic(err)
	}
	fmt.Println(string(out))

	_, err = canon.Canonical([]byte(`{"a": 1, "\u0061": 2}`))
	fmt.Println(err)
	fmt.Println(errors.Is(err, canon.ErrDuplicateKey))
	// Output:
	// {"a":"\u003cé\u003e","b":[1.0,1e2],"é":-0}
	// canon: duplicate object key "a" at byte offset 9
	// true
}

func ExampleStepID() {
	_, argsHash, err := canon.ArgsHash([]byte(`{"query": "wicket", "max_results": 5}`))
	if err != nil {
		panic(err)
	}
	fmt.Println(argsHash)
	fmt.Println(canon.StepID("0190a5f2-7c3e-7b4a-9d2e-1f2a3b4c5d6e", "tool_call", "web_search", argsHash, 0))
	// Output:
	// e3c8f7f4e4677f460ef2d998d2a06f3271f38ebda9ed062524e0f0029e391568
	// ebb590ea1db6cf953a88b8f7b2071e85824fe045e0ab927f9630f7806bd8edd8
}
