# Sourced by the project's scripts: where builds and caches live.
# A persistent target directory outside the checkout, so a fresh clone on the
# same machine reuses what it built (wasmtime takes ~20 minutes from nothing).
export ONCEFLOW_CACHE="${ONCEFLOW_CACHE:-$HOME/.cache/onceflow}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ONCEFLOW_CACHE/target}"
# Guests (wasm) build in their own target directory: tests build them while
# the host's target directory is locked by `cargo test`.
export ONCEFLOW_GUEST_TARGET_DIR="${ONCEFLOW_GUEST_TARGET_DIR:-$ONCEFLOW_CACHE/guest-target}"
# Compiled components (wasmtime) are cached here too.
export ONCEFLOW_CACHE_DIR="${ONCEFLOW_CACHE_DIR:-$ONCEFLOW_CACHE}"
