#!/usr/bin/env bash
# Diffs fraud ports in other languages against the Rust fraud
# (examples/fraud) with `onceflow test`: on examples/fraud/sample.jsonl and
# on inputs from gen_input.py, at several batch sizes and partition counts.
# Alerts and dead letters (serde_json's messages included) must be
# byte-identical.
#
# Usage: check.sh MANIFEST...        e.g.
#   examples/fraud-js/conformance/check.sh examples/fraud-{js,python,go,c}
#
# Needs the onceflow CLI ($ONCEFLOW, default ~/.cache/onceflow/target/debug/onceflow,
# else `onceflow` on PATH) and every port's component, built with `onceflow
# build <dir>` (tests/offline/languages.rs runs the same comparison in CI).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
onceflow=${ONCEFLOW:-$HOME/.cache/onceflow/target/debug/onceflow}
[ -x "$onceflow" ] || onceflow=onceflow
[ $# -gt 0 ] || { echo "usage: $0 MANIFEST..." >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A manifest copy with an absolute component path.
copy_manifest() { # manifest out
    local manifest=$1 out=$2
    [ -d "$manifest" ] && manifest=$manifest/onceflow.toml
    local dir component
    dir=$(cd "$(dirname "$manifest")" && pwd)
    component=$(sed -n 's/^component *= *"\([^"]*\)".*/\1/p' "$manifest")
    sed -e "s#^component *=.*#component = \"$dir/$component\"#" "$manifest" > "$out"
}

python3 "$here/gen_input.py" --lines 2000 --seed 1 > "$work/fraud.jsonl"
python3 "$here/gen_input.py" --lines 10000 --seed 2 > "$work/many.jsonl"
cp "$repo/examples/fraud/sample.jsonl" "$work/sample.jsonl"
copy_manifest "$repo/examples/fraud" "$work/reference.toml"

failures=0
checks=0
for input in sample fraud many; do
    for batch in 100 7 1; do
        for partitions in 1 3; do
            args=(--input "$work/$input.jsonl" --batch-size "$batch" --partitions "$partitions")
            "$onceflow" test "$work/reference.toml" "${args[@]}" > "$work/expected" 2>/dev/null
            for manifest in "$@"; do
                copy_manifest "$manifest" "$work/candidate.toml"
                checks=$((checks + 1))
                label="$manifest $input batch=$batch partitions=$partitions"
                if "$onceflow" test "$work/candidate.toml" "${args[@]}" > "$work/actual" 2>"$work/stderr" &&
                    cmp -s "$work/expected" "$work/actual"; then
                    echo "identical  $label ($(wc -l < "$work/actual") lines)"
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
