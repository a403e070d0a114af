#!/usr/bin/env bash
# build.sh POLICY.c OUT.wasm: build a freestanding Wicket wasm policy with
# clang and wasm-ld (Debian: apt-get install -y clang lld). The output is
# deterministic for a given clang version and input.
set -euo pipefail
if [ $# -ne 2 ]; then
	echo "usage: $0 POLICY.c OUT.wasm" >&2
	exit 2
fi
sdk="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CLANG="${CLANG:-clang}"
exec "$CLANG" --target=wasm32 -O2 -nostdlib -ffreestanding -fno-builtin \
	-Wall -Wextra -Werror \
	-I "$sdk" \
	-Wl,--no-entry -Wl,--strip-all -Wl,-z,stack-size=65536 \
	-Wl,--export=wicket_alloc -Wl,--export=wicket_evaluate -Wl,--export=wicket_abi_version \
	-o "$2" "$1" "$sdk/wicket_policy.c"
