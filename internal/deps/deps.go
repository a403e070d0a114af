// Package deps pins the required dependencies in go.mod while the packages
// that use them are being written. It is removed once each is imported for real.
package deps

import (
	_ "github.com/gorilla/mux"
	_ "github.com/open-policy-agent/opa/v1/ast"
	_ "github.com/open-policy-agent/opa/v1/rego"
	_ "github.com/tetratelabs/wazero"
	_ "github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	_ "go.etcd.io/bbolt"
	_ "go.yaml.in/yaml/v3"
)
