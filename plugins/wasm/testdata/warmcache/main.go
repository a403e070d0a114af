// Command warmcache compiles a policy module into a wazero disk cache, so
// that tests run under -race (where wazero's compiler is ~10x slower) load
// machine code compiled by a normal build instead of compiling it again.
//
//	go run ./testdata/warmcache CACHE_DIR POLICY.wasm
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/wasm"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: warmcache CACHE_DIR POLICY.wasm")
		os.Exit(2)
	}
	bin, err := os.ReadFile(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	e := wasm.New(wasm.Config{CacheDir: os.Args[1]})
	defer e.Close()
	b := &bundle.Bundle{
		Manifest: bundle.Manifest{Name: "warm", Revision: "1", Engine: bundle.EngineWasm},
		Files:    map[string][]byte{wasm.PolicyFile: bin},
	}
	ev, err := e.Compile(context.Background(), b)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_ = ev.Close()
}
