#!/usr/bin/env bash
# bench/registry/startup.sh [RUNS] — start and stop scripts/registry RUNS times (default 5); for each run print the
# seconds until the Confluent API answered (as `up` logs them), the JVM's RSS and CPU seconds right after, and RSS
# and CPU after one pass of verify.sh. Uses the registry's usual env (ONCEFLOW_REGISTRY_VERSION, ..._JVM_OPTS, ...).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
reg="$root/scripts/registry"
runs=${1:-5}
hz=$(getconf CLK_TCK)
cpu() { awk -v hz="$hz" '{printf "%.1f", ($14 + $15) / hz}' "/proc/$1/stat"; }
rss() { awk '/^VmRSS/{printf "%d", $2 / 1024}' "/proc/$1/status"; }
"$reg" down >/dev/null 2>&1 || true
printf 'run  ready_s  rss_MiB  cpu_s  | after verify.sh: rss_MiB  cpu_s\n'
for ((i = 1; i <= runs; i++)); do
  out=$("$reg" up 2>&1 >/dev/null)
  ready=$(sed -n 's/.*ready in \([0-9.]*\)s.*/\1/p' <<<"$out")
  pid=$("$reg" status | sed -n 's/^running: pid \([0-9]*\),.*/\1/p')
  r1=$(rss "$pid") c1=$(cpu "$pid")
  "$root/bench/registry/verify.sh" "$("$reg" url)" >/dev/null
  printf '%3d  %7s  %7s  %5s  | %24s  %5s\n' "$i" "$ready" "$r1" "$c1" "$(rss "$pid")" "$(cpu "$pid")"
  "$reg" down >/dev/null 2>&1
done
