#!/usr/bin/env bash
# Diffs wallets written in other languages against the Rust wallet
# (examples/wallet) with `onceflow test`: on examples/wallet/sample.jsonl and
# on inputs from gen_input.py, at several batch sizes and partition counts.
# Outputs must be byte-identical.
#
# Usage: check.sh MANIFEST...        e.g.
#   examples/wallet-js/conformance/check.sh examples/wallet-js examples/wallet-python
#
# Needs the onceflow CLI ($ONCEFLOW, default ~/.cache/onceflow/target/debug/onceflow,
# else `onceflow` on PATH) and every wallet's component, built with `onceflow build <dir>` (tests/offline/languages.rs runs
# the same comparison in CI).
#
# The `--big` input has payments of 0.6-1 MiB (over the host's 1 MiB state
# and output limits). The Rust wallet itself needs more than its manifest's
# 10 M fuel for those, so that input runs every wallet, the reference
# included, with fuel-per-record = 200 M and memory-mb = 128.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
onceflow=${ONCEFLOW:-$HOME/.cache/onceflow/target/debug/onceflow}
[ -x "$onceflow" ] || onceflow=onceflow
[ $# -gt 0 ] || { echo "usage: $0 MANIFEST..." >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A manifest copy with an absolute component path and, optionally, raised limits.
copy_manifest() { # manifest out [big]
    local manifest=$1 out=$2 big=${3:-}
    [ -d "$manifest" ] && manifest=$manifest/onceflow.toml
    local dir component
    dir=$(cd "$(dirname "$manifest")" && pwd)
    component=$(sed -n 's/^component *= *"\([^"]*\)".*/\1/p' "$manifest")
    sed -e "s#^component *=.*#component = \"$dir/$component\"#" "$manifest" > "$out"
    if [ -n "$big" ]; then
        sed -i -e 's/^fuel-per-record *=.*/fuel-per-record = 200000000/' \
            -e 's/^memory-mb *=.*/memory-mb = 128/' "$out"
    fi
}

python3 "$here/gen_input.py" --lines 2000 --seed 1 > "$work/mixed.jsonl"
python3 "$here/gen_input.py" --lines 2100 --seed 7 --big > "$work/big.jsonl"
cp "$repo/examples/wallet/sample.jsonl" "$work/sample.jsonl"

failures=0
checks=0
for input in sample mixed big; do
    big=
    [ "$input" = big ] && big=1
    copy_manifest "$repo/examples/wallet" "$work/reference.toml" "$big"
    for batch in 100 7 1; do
        for partitions in 1 3; do
            args=(--input "$work/$input.jsonl" --batch-size "$batch" --partitions "$partitions")
            "$onceflow" test "$work/reference.toml" "${args[@]}" > "$work/expected" 2>/dev/null
            for manifest in "$@"; do
                copy_manifest "$manifest" "$work/candidate.toml" "$big"
                checks=$((checks + 1))
                label="$manifest $input batch=$batch partitions=$partitions"
                if "$onceflow" test "$work/candidate.toml" "${args[@]}" > "$work/actual" 2>"$work/stderr" &&
                    cmp -s "$work/expected" "$work/actual"; then
                    echo "identical  $label ($(wc -l < "$work/actual") output lines)"
                else
                    failures=$((failures + 1))
                    echo "DIFFERENT  $label"
                    diff "$work/expected" "$work/actual" | cut -c1-200 | head -10 || true
                    tail -3 "$work/stderr"
                fi
            done
        done
    done
done
echo "$((checks - failures)) passed, $failures failed"
[ "$failures" -eq 0 ]
