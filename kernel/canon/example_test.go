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
	// canon: duplicate object key "a" at byte offset 10
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
}
