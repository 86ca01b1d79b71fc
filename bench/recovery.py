#!/usr/bin/env python3
"""The recovery benchmark (bench/README.md, "Recovery"): how long a wallet
with a large store takes, from a SIGKILL, to commit output again when it is
restarted on the same machine with the same state directory.

For each state size (100 MB: 1 M accounts; 1 GB: 10 M accounts, about 100
bytes of key and balance each) and each contender:

1. fill: N payments, each opening its own account, processed to the end
   (every audit record visible, read_committed);
2. live: payments at a paced rate go on, new accounts each;
3. SIGKILL the contender mid-run, take the end of the audit topic (with a
   client connected before the kill), restart the contender at once (same
   state directory, same instance id);
4. the recovery time: from the kill to the first audit record written after
   those ends becoming visible (a transaction of the restarted process);
5. a few seconds later the live load stops; once every payment in the input
   topic is processed, stop the contender and count the audit topic: every
   payment exactly once (as many records and distinct payment ids as the
   input topic holds payments).

Contenders: Onceflow (`onceflow run --instance-id`, static membership);
Kafka Streams 4.4 with its state defaults (under exactly-once it wipes a
store after a crash and restores it from the changelog in full) and with
`enable.transactional.statestores=true` (KIP-892: the store is kept and only
the uncommitted tail is redone). Both Kafka Streams runs get
`group.instance.id` (static membership, as Onceflow's `--instance-id`), so
that the figure is the store's, not the group's session timeout.

Run it through `scripts/bench recovery`, which builds what it needs and
starts the broker. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import FULL, REPO, Contender, Harness, fmt, log  # noqa: E402

# 10MB: a smoke run of the harness itself.
SIZES = {"10MB": 100_000, "100MB": 1_000_000, "1GB": 10_000_000}
# Live payments while the contender is killed and restarted: a paced load
# that runs until the restarted contender has committed output for
# AFTER_RECOVERY_SECONDS (at most LIVE_MAX_SECONDS).
LIVE_RATE = 2_000
LIVE_MAX_SECONDS = 1_200
AFTER_RECOVERY_SECONDS = 5
# Live processing before the kill.
BEFORE_KILL_SECONDS = 8
# Live payments are numbered from here (accounts and payment ids apart from
# the fill's).
LIVE_FIRST = 1_000_000_000


def contenders() -> list[Contender]:
    wallet = REPO / "examples/wallet/onceflow.toml"
    wallet_wasm = REPO / "examples/wallet/target/onceflow/wallet.wasm"
    eos = "exactly_once_v2"
    static = "group.instance.id=bench-recovery"
    return [
        Contender("of-wallet-eos", "Onceflow wallet", "onceflow", "wallet", eos, 100, wallet, wallet_wasm),
        Contender(
            "ks-wallet-eos",
            "Kafka Streams wallet (state defaults)",
            "kstreams",
            "wallet",
            eos,
            env={"KSTREAMS_PROPS": static},
        ),
        Contender(
            "ks-wallet-eos-kip892",
            "Kafka Streams wallet (enable.transactional.statestores, KIP-892)",
            "kstreams",
            "wallet",
            eos,
            env={"KSTREAMS_PROPS": f"{static},enable.transactional.statestores=true"},
        ),
    ]


def restored_records(log_path: Path) -> int | None:
    """Onceflow: the changelog records its restart replayed (its `restoring
    store` lines)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return None
    found = re.findall(r"restoring store \S+: up to (\d+) changelog records", text)
    return sum(int(n) for n in found) if found else 0


def measure(h: Harness, c: Contender, size: str, accounts: int) -> dict:
    run = f"{size.lower()}"
    prefix = f"rec-{c.key}-{run}-{h.run_id}"
    input_topic = f"{prefix}-payments"
    out = h.topics(prefix, "wallet")
    h.tool("create-topics", f"{input_topic}:{h.profile.partitions}")
    h.create(out)
    t0 = time.time()
    filled = h.tool("produce", "--topic", input_topic, "--kind", "fill", "--count", str(accounts), timeout=3600)
    log(f"  {accounts:,} fill payments produced in {time.time() - t0:.0f}s")

    proc = h.start(c, input_topic, out, run)
    restarted = None
    live = None
    watcher = None
    try:
        t0 = time.time()
        fill = h.tool(
            "await", "--topics", out["out1"], "--expect", str(filled["expected_outputs"]),
            "--timeout-secs", str(max(900, accounts // 5_000)), "--pid", str(proc.pid),
            timeout=max(900, accounts // 5_000) + 60,
        )
        fill_seconds = time.time() - t0
        log(f"  filled: {accounts:,} accounts in {fill_seconds:.0f}s ({fill['throughput']:,.0f} records/s), rss {fill['peak_rss_bytes']}")

        live = subprocess.Popen(
            [str(h.bench_tool), "produce", "--topic", input_topic, "--kind", "fill",
             "--first", str(LIVE_FIRST), "--count", str(LIVE_RATE * LIVE_MAX_SECONDS), "--rate", str(LIVE_RATE)],
            env=h.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        # The clock, connected before the kill (bench-tool first-new).
        watcher = subprocess.Popen(
            [str(h.bench_tool), "first-new", "--topics", out["out1"]],
            env=h.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert watcher.stdin is not None and watcher.stdout is not None
        if not json.loads(watcher.stdout.readline() or "{}").get("armed"):
            raise RuntimeError(f"first-new did not start: {watcher.stderr.read() if watcher.stderr else ''}")
        time.sleep(BEFORE_KILL_SECONDS)
        if proc.poll() is not None:
            raise RuntimeError(f"{c.key} exited before the kill (log: {proc.log_path})")  # type: ignore[attr-defined]
        killed_at_ms = int(time.time() * 1000)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        watcher.stdin.write(f"{killed_at_ms}\n")
        watcher.stdin.flush()
        if not json.loads(watcher.stdout.readline() or "{}").get("ready"):
            raise RuntimeError(f"first-new failed: {watcher.stderr.read() if watcher.stderr else ''}")
        restarted = h.start(c, input_topic, out, run, log_suffix="-restarted")
        restarted_after_ms = int(time.time() * 1000) - killed_at_ms
        first, err = watcher.communicate(timeout=960)
        if watcher.returncode != 0:
            raise RuntimeError(f"first-new failed: {err.strip()[:2000]}")
        recovery = json.loads(first)
        log(f"  recovery: {recovery['recovery_ms']:,} ms from the kill to the first new committed output")

        time.sleep(AFTER_RECOVERY_SECONDS)
        if live.poll() is not None:
            raise RuntimeError(f"the live producer stopped early: {live.stderr.read() if live.stderr else ''}")
        # SIGKILL: what it sent is in the topic (acks=all), what it had
        # not sent yet is not a payment; the input topic says which.
        live.kill()
        live.wait()
        total = h.tool("count", "--topic", input_topic, timeout=1800)["records"]
        h.tool(
            "await", "--topics", out["out1"], "--expect", str(total),
            "--timeout-secs", "900", "--pid", str(restarted.pid), timeout=960,
        )
    finally:
        if live is not None and live.poll() is None:
            live.kill()
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
        for p in (proc, restarted):
            if p is not None:
                h.stop(p)
    counted = h.tool("count", "--topic", out["out1"], timeout=1800)
    exact = counted["records"] == total and counted["distinct_keys"] == total
    log(f"  audit: {counted['records']:,} records, {counted['distinct_keys']:,} payment ids, {total:,} payments: {'exact' if exact else 'NOT EXACT'}")
    result = {
        "contender": c.key,
        "label": c.label,
        "size": size,
        "accounts": accounts,
        "fill_seconds": fill_seconds,
        "fill_throughput": fill["throughput"],
        "fill_peak_rss_bytes": fill["peak_rss_bytes"],
        "recovery_ms": recovery["recovery_ms"],
        # From the kill: the end offsets taken, the restart issued.
        "sampled_after_kill_ms": recovery["sampled_after_kill_ms"],
        "restarted_after_kill_ms": restarted_after_ms,
        "payments": total,
        "audit_records": counted["records"],
        "audit_distinct": counted["distinct_keys"],
        "exact": exact,
        "log": str(restarted.log_path) if restarted is not None else None,  # type: ignore[attr-defined]
    }
    if c.system == "onceflow" and restarted is not None:
        result["restored_records"] = restored_records(Path(restarted.log_path))  # type: ignore[attr-defined]
    # Free the broker's disk for the next run (the 1 GB runs write ~8 GB).
    h.tool("delete-topics", input_topic, *out.values())
    return result


def report(results: list[dict], context: str) -> str:
    lines = [
        f"# Recovery benchmark, {time.strftime('%Y-%m-%d')}",
        "",
        context,
        "",
        f"Wallet, one worker, exactly_once_v2, 100 ms commits; SIGKILL after {BEFORE_KILL_SECONDS} s of live load "
        f"({LIVE_RATE:,} payments/s), restart at once on the same state directory. Recovery: from the kill to the first "
        "audit record written after it becoming visible (read_committed). `scripts/bench recovery`; bench/recovery.py.",
        "",
        "| contender | state | accounts | fill records/s | recovery ms | restart issued (ms after kill) | changelog records restored | audit exact |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['label']} | {r['size']} | {r['accounts']:,} | – | FAILED: {r['error']} | | | |")
            continue
        lines.append(
            f"| {r['label']} | {r['size']} | {r['accounts']:,} | {fmt(r['fill_throughput'])} | **{r['recovery_ms']:,}** | "
            f"{r['restarted_after_kill_ms']} | "
            f"{fmt(r.get('restored_records'))} | {'yes' if r['exact'] else 'NO'} ({r['audit_records']:,} records, "
            f"{r['audit_distinct']:,} ids, {r['payments']:,} payments) |"
        )
    by = {(r["contender"], r["size"]): r for r in results if "error" not in r}
    of_big, of_small = by.get(("of-wallet-eos", "1GB")), by.get(("of-wallet-eos", "100MB"))
    lines += ["", "| target (issue 12, item 3) | figure | holds |", "|---|---|---|"]
    if of_big:
        ok = of_big["recovery_ms"] <= 2000
        lines.append(f"| Onceflow ≤ 2 s at 1 GB | {of_big['recovery_ms']:,} ms | {'yes' if ok else '**no**'} |")
    if of_big and of_small:
        ratio = of_big["recovery_ms"] / max(of_small["recovery_ms"], 1)
        lines.append(f"| 1 GB within 20% of 100 MB | {ratio:.2f}x ({of_small['recovery_ms']:,} ms at 100 MB) | {'yes' if ratio <= 1.2 else '**no**'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--onceflow", required=True)
    parser.add_argument("--bench-tool", required=True)
    parser.add_argument("--kstreams-classpath", required=True)
    parser.add_argument("--sizes", default="100MB,1GB", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--only", help="comma-separated contender keys")
    parser.add_argument("--results", default=str(REPO / "bench/results"))
    parser.add_argument("--context", default="")
    args = parser.parse_args()
    args.raw_pipe = ""  # not used here
    sizes = args.sizes.split(",")
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"unknown size(s) {unknown}; choose from {list(SIZES)}")
    h = Harness(args, FULL)
    plan = contenders()
    if args.only:
        plan = [c for c in plan if c.key in set(args.only.split(","))]
    log(f"recovery benchmark; work dir {h.work}")
    results = []
    for size in sizes:
        for c in plan:
            log(f"{c.key}, {size} ({SIZES[size]:,} accounts)")
            try:
                results.append(measure(h, c, size, SIZES[size]))
            except Exception as e:  # a failed contender must not sink the rest
                log(f"  FAILED: {e}")
                results.append({"contender": c.key, "label": c.label, "size": size, "accounts": SIZES[size], "error": str(e)[:500]})
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{time.strftime('%Y-%m-%d')}-recovery"
    (out / f"{stem}.json").write_text(json.dumps({"context": args.context, "results": results}, indent=2) + "\n")
    text = report(results, args.context)
    (out / f"{stem}.md").write_text(text)
    print(text)
    log(f"wrote {out / stem}.md and .json")
    return 0 if all("error" not in r and r["exact"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
