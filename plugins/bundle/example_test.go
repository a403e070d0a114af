package bundle_test

import (
	"bytes"
	"fmt"

	"github.com/wicket-run/wicket/plugins/bundle"
)

func ExampleLoadFiles() {
	b, err := bundle.LoadFiles(map[string][]byte{
		"bundle.yaml": []byte("name: guard\nrevision: \"1\"\nengine: rules\n"),
		"rules.yaml":  []byte("default_action: allow\nrules: []\n"),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(b.Manifest.Name, b.Manifest.Engine, b.DefaultAction(), len(b.Digest))

	// The reproducible archive loads back to the same digest.
	gz, _ := b.TarGz()
	b2, _ := bundle.LoadTarGz(bytes.NewReader(gz))
	fmt.Println(b2.Digest == b.Digest)

	// A broken bundle is refused whole, naming the file and the field.
	_, err = bundle.LoadFiles(map[string][]byte{
		"bundle.yaml": []byte("name: guard\nengine: rules\nrate_limits:\n  - {id: gh, max_calls: 5, window: soon}\n"),
		"rules.yaml":  []byte("rules: []\n"),
	})
	fmt.Println(err)
	// Output:
	// guard rules allow 64
	// true
	// bundle.yaml:4: rate_limits[0].window: must be a positive Go duration (e.g. 1m), got "soon"
}

func ExampleCompileGlob() {
	g, _ := bundle.CompileGlob("github.*")
	fmt.Println(g.Match("github.create_issue"), g.Match("gitlab.create_issue"))
	fmt.Println(bundle.MatchGlob("fs/*", "fs/a/b"), bundle.MatchGlob("gpt-?", "gpt-4o"))
	// Output:
	// true false
	// true false
}
