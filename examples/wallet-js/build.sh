#!/usr/bin/env bash
# Builds target/onceflow/wallet-js.wasm from wallet.js with ComponentizeJS
# (SpiderMonkey/StarlingMonkey embedded in the component), against the
# `processor` world of wit/processor.wit, with every WASI feature of the
# engine disabled: the component imports only onceflow:processor.
#
# The toolchain is installed once into the cache, not globally:
#   $ONCEFLOW_TOOLCHAINS/js   (default ~/.cache/onceflow/toolchains/js)
#
# Usage: ./build.sh [--aot]
#   --aot   weval ahead-of-time compilation (needs a weval binary: the npm
#           package downloads one from GitHub at build time; set WEVAL_BIN to
#           a local binary, e.g. from `cargo install weval --version 0.5.0`).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
toolchains=${ONCEFLOW_TOOLCHAINS:-$HOME/.cache/onceflow/toolchains}
prefix=$toolchains/js
version=0.23.0
cli=$prefix/node_modules/@bytecodealliance/componentize-js/src/cli.js
out=$here/target/onceflow/wallet-js.wasm

aot=()
if [ "${1:-}" = "--aot" ]; then
    aot=(--aot)
    if [ -n "${WEVAL_BIN:-}" ]; then
        aot+=(--weval-bin "$WEVAL_BIN")
    fi
elif [ $# -gt 0 ]; then
    echo "usage: $0 [--aot]" >&2
    exit 2
fi

command -v node >/dev/null || { echo "build.sh: node (>= 18) is required" >&2; exit 1; }
installed=$(node -p "require('$prefix/node_modules/@bytecodealliance/componentize-js/package.json').version" 2>/dev/null || true)
if [ "$installed" != "$version" ]; then
    echo "installing @bytecodealliance/componentize-js@$version into $prefix" >&2
    mkdir -p "$prefix"
    [ -f "$prefix/package.json" ] || echo '{"name":"onceflow-js-toolchain","private":true}' > "$prefix/package.json"
    npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error \
        "@bytecodealliance/componentize-js@$version"
fi

mkdir -p "$(dirname "$out")"
node "$cli" "$here/wallet.js" \
    --wit "$repo/wit" --world-name processor \
    --disable stdio random clocks http fetch-event \
    "${aot[@]}" \
    --out "$out"
echo "built $out ($(wc -c < "$out") bytes)" >&2
