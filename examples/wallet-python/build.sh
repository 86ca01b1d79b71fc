#!/usr/bin/env bash
# Builds target/onceflow/wallet-python.wasm from src/app.py with componentize-py
# (CPython embedded in the component), against the `processor` world of
# wit/processor.wit. componentize-py generates the Python bindings (package
# `wit_world`) from the WIT; a copy is written to target/bindings for editors
# and type checkers.
#
# The toolchain is installed once into a virtualenv in the cache, not
# globally: $ONCEFLOW_TOOLCHAINS/python/venv (default
# ~/.cache/onceflow/toolchains/python/venv).
#
# Usage: ./build.sh [--stub-wasi]
#   --stub-wasi   replace every WASI import with a trapping stub: the
#                 component then imports only onceflow:processor. The wallet
#                 makes no WASI call at run time, but an uncaught exception's
#                 traceback (written to stderr) then traps without reaching
#                 the host log.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
toolchains=${ONCEFLOW_TOOLCHAINS:-$HOME/.cache/onceflow/toolchains}
venv=$toolchains/python/venv
version=0.25.1
out=$here/target/onceflow/wallet-python.wasm

stub=()
if [ "${1:-}" = "--stub-wasi" ]; then
    stub=(--stub-wasi)
elif [ $# -gt 0 ]; then
    echo "usage: $0 [--stub-wasi]" >&2
    exit 2
fi

installed=$("$venv/bin/componentize-py" --version 2>/dev/null || true)
if [ "$installed" != "componentize-py $version" ]; then
    echo "installing componentize-py==$version into $venv" >&2
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "componentize-py==$version"
fi

cd "$here"
rm -rf target/bindings target/python-src
"$venv/bin/componentize-py" -d "$repo/wit" -w processor bindings target/bindings >/dev/null
# componentize-py bundles the whole --python-path directory and leaves a
# __pycache__ in it: work on a copy under target/.
mkdir -p target/python-src "$(dirname "$out")"
cp src/*.py target/python-src/
"$venv/bin/componentize-py" -d "$repo/wit" -w processor componentize \
    "${stub[@]}" --python-path target/python-src app -o "$out"
echo "built $out ($(wc -c < "$out") bytes)" >&2
