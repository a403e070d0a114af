#!/bin/sh
# build.sh rebuilds the stock bundles' derived files from their sources:
#
#   - <name>/{rules,rego,wasm}/tests/cases.yaml, copied from <name>/tests/cases.yaml;
#   - <name>/wasm/policy.wasm, built from <name>/wasm/src with the command
#     below, which is reproducible: the same Go release gives the same bytes
#     on any machine, in any directory, at any commit.
#
# Run it from anywhere: sh bundles/build.sh (or go generate ./bundles).
# bundles_test.go fails when a copy or a policy.wasm differs from what this
# script produces, and checks that the build command below is the one it uses.
set -eu
cd "$(dirname "$0")"
for dir in */; do
	name=${dir%/}
	[ -f "$name/tests/cases.yaml" ] || continue
	for form in rules rego wasm; do
		mkdir -p "$name/$form/tests"
		cp "$name/tests/cases.yaml" "$name/$form/tests/cases.yaml"
	done
	echo "building $name/wasm/policy.wasm" >&2
	(
		cd "$name/wasm/src"
		GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 GOFLAGS= GOWORK=off go build -buildmode=c-shared -trimpath -buildvcs=false -ldflags=-buildid= -o ../policy.wasm .
	)
done
