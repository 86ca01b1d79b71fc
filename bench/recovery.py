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


def prepare(h: Harness, prefix: str, accounts: int) -> tuple[str, dict[str, str], dict]:
    """This run's topics, and the fill payments in the input topic."""
    input_topic = f"{prefix}-payments"
    out = h.topics(prefix, "wallet")
    h.tool("create-topics", f"{input_topic}:{h.profile.partitions}")
    h.create(out)
    t0 = time.time()
    filled = h.tool("produce", "--topic", input_topic, "--kind", "fill", "--count", str(accounts), timeout=3600)
    log(f"  {accounts:,} fill payments produced in {time.time() - t0:.0f}s")
    return input_topic, out, filled


def await_fill(h: Harness, out: dict[str, str], filled: dict, accounts: int, pid: int) -> tuple[float, dict]:
    """Waits until every fill payment's audit record is visible."""
    t0 = time.time()
    wait = max(900, accounts // 5_000)
    fill = h.tool(
        "await", "--topics", out["out1"], "--expect", str(filled["expected_outputs"]),
        "--timeout-secs", str(wait), "--pid", str(pid), timeout=wait + 60,
    )
    return time.time() - t0, fill


def start_live(h: Harness, input_topic: str) -> subprocess.Popen:
    """Live payments at LIVE_RATE, new accounts each, until killed."""
    return subprocess.Popen(
        [str(h.bench_tool), "produce", "--topic", input_topic, "--kind", "fill",
         "--first", str(LIVE_FIRST), "--count", str(LIVE_RATE * LIVE_MAX_SECONDS), "--rate", str(LIVE_RATE)],
        env=h.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


class FirstNew:
    """`bench-tool first-new`: the clock, connected before the kill."""

    def __init__(self, h: Harness, topic: str, every_partition: bool = False):
        argv = [str(h.bench_tool), "first-new", "--topics", topic] + (["--every-partition"] if every_partition else [])
        self.proc = subprocess.Popen(
            argv, env=h.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.expect("armed", "first-new did not start")

    def expect(self, key: str, what: str) -> None:
        assert self.proc.stdout is not None
        if not json.loads(self.proc.stdout.readline() or "{}").get(key):
            raise RuntimeError(f"{what}: {self.proc.stderr.read() if self.proc.stderr else ''}")

    def killed(self, at_ms: int) -> None:
        """Tells it the kill time (once the process is dead); it takes the ends."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{at_ms}\n")
        self.proc.stdin.flush()
        self.expect("ready", "first-new failed")

    def result(self) -> dict:
        first, err = self.proc.communicate(timeout=960)
        if self.proc.returncode != 0:
            raise RuntimeError(f"first-new failed: {err.strip()[:2000]}")
        return json.loads(first)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


def end_live(h: Harness, live: subprocess.Popen, input_topic: str, out: dict[str, str], pid: int) -> int:
    """Stops the live load and waits until every payment in the input topic
    has its audit record; returns the payments. SIGKILL: what the producer
    sent is in the topic (acks=all), what it had not sent yet is not a
    payment; the input topic says which."""
    if live.poll() is not None:
        raise RuntimeError(f"the live producer stopped early: {live.stderr.read() if live.stderr else ''}")
    live.kill()
    live.wait()
    total = h.tool("count", "--topic", input_topic, timeout=1800)["records"]
    h.tool("await", "--topics", out["out1"], "--expect", str(total), "--timeout-secs", "900", "--pid", str(pid), timeout=960)
    return total


def audit(h: Harness, out: dict[str, str], total: int) -> dict:
    """Counts the audit topic: every payment exactly once?"""
    counted = h.tool("count", "--topic", out["out1"], timeout=1800)
    exact = counted["records"] == total and counted["distinct_keys"] == total
    log(f"  audit: {counted['records']:,} records, {counted['distinct_keys']:,} payment ids, {total:,} payments: {'exact' if exact else 'NOT EXACT'}")
    return {"payments": total, "audit_records": counted["records"], "audit_distinct": counted["distinct_keys"], "exact": exact}


def measure(h: Harness, c: Contender, size: str, accounts: int, kills: int) -> dict:
    """One fill, then `kills` rounds of: live load for BEFORE_KILL_SECONDS,
    SIGKILL, restart, the recovery time. The figure is the median of the
    rounds (one restart's time swings by half a second: results/
    2026-12-05-recovery.md)."""
    run = f"{size.lower()}"
    input_topic, out, filled = prepare(h, f"rec-{c.key}-{run}-{h.run_id}", accounts)
    proc = h.start(c, input_topic, out, run)
    procs = [proc]
    live = None
    watcher = None
    rounds: list[dict] = []
    try:
        fill_seconds, fill = await_fill(h, out, filled, accounts, proc.pid)
        log(f"  filled: {accounts:,} accounts in {fill_seconds:.0f}s ({fill['throughput']:,.0f} records/s), rss {fill['peak_rss_bytes']}")
        live = start_live(h, input_topic)
        for kill in range(1, kills + 1):
            watcher = FirstNew(h, out["out1"])
            time.sleep(BEFORE_KILL_SECONDS if kill == 1 else AFTER_RECOVERY_SECONDS)
            if proc.poll() is not None:
                raise RuntimeError(f"{c.key} exited before kill {kill} (log: {proc.log_path})")  # type: ignore[attr-defined]
            killed_at_ms = int(time.time() * 1000)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            watcher.killed(killed_at_ms)
            proc = h.start(c, input_topic, out, run, log_suffix=f"-restarted-{kill}")
            procs.append(proc)
            restarted_after_ms = int(time.time() * 1000) - killed_at_ms
            recovery = watcher.result()
            watcher = None
            log(f"  kill {kill}/{kills}: {recovery['recovery_ms']:,} ms from the kill to the first new committed output")
            rounds.append({
                "recovery_ms": recovery["recovery_ms"],
                # From the kill: the end offsets taken, the restart issued.
                "sampled_after_kill_ms": recovery["sampled_after_kill_ms"],
                "restarted_after_kill_ms": restarted_after_ms,
                "log": str(proc.log_path),  # type: ignore[attr-defined]
            })
        time.sleep(AFTER_RECOVERY_SECONDS)
        total = end_live(h, live, input_topic, out, proc.pid)
    finally:
        if live is not None and live.poll() is None:
            live.kill()
        if watcher is not None:
            watcher.close()
        for p in procs:
            h.stop(p)
    by_time = sorted(rounds, key=lambda r: r["recovery_ms"])
    median = by_time[(len(by_time) - 1) // 2]
    result = {
        "contender": c.key,
        "label": c.label,
        "size": size,
        "accounts": accounts,
        "fill_seconds": fill_seconds,
        "fill_throughput": fill["throughput"],
        "fill_peak_rss_bytes": fill["peak_rss_bytes"],
        # The median round's figures; every round's in `rounds`.
        "recovery_ms": median["recovery_ms"],
        "recovery_runs_ms": [r["recovery_ms"] for r in rounds],
        "sampled_after_kill_ms": median["sampled_after_kill_ms"],
        "restarted_after_kill_ms": median["restarted_after_kill_ms"],
        "rounds": rounds,
        **audit(h, out, total),
        "log": median["log"],
    }
    if c.system == "onceflow":
        result["restored_records"] = restored_records(Path(median["log"]))
    # Free the broker's disk for the next run (the 1 GB runs write ~8 GB).
    h.tool("delete-topics", input_topic, *out.values())
    return result


# Failover: the killed host's session (the time any consumer group takes to
# notice a dead member), so that the figure is not mostly the default 10 s.
FAILOVER_SESSION_MS = 2_000


def log_figures(log_path: Path, pattern: str) -> list[int]:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return []
    return [int(n) for n in re.findall(pattern, text)]


def measure_failover(h: Harness, c: Contender, size: str, accounts: int, standbys: int) -> dict:
    """Two Onceflow hosts share the deployment (`standby-replicas =
    standbys`); one is SIGKILLed and not restarted. The time: from the kill
    to every partition of the balances topic having new output again (the
    survivor's own partitions go on at once; the dead host's, once the group
    gave them to the survivor and it restored them)."""
    run = f"fo{standbys}-{size.lower()}"
    input_topic, out, filled = prepare(h, f"rec-{run}-{h.run_id}", accounts)
    extra = ["--session-timeout-ms", str(FAILOVER_SESSION_MS)]
    hosts = [
        h.start(c, input_topic, out, run, log_suffix=f"-{i}", instance=i, extra=extra, standbys=standbys)
        for i in ("i0", "i1")
    ]
    victim, survivor = hosts
    survivor_log = Path(survivor.log_path)  # type: ignore[attr-defined]
    live = None
    watcher = None
    try:
        fill_seconds, fill = await_fill(h, out, filled, accounts, survivor.pid)
        log(f"  filled: {accounts:,} accounts in {fill_seconds:.0f}s ({fill['throughput']:,.0f} records/s) on two hosts")
        live = start_live(h, input_topic)
        logs_at_live = [Path(p.log_path).stat().st_size for p in hosts]  # type: ignore[attr-defined]
        watcher = FirstNew(h, out["out0"], every_partition=True)
        time.sleep(BEFORE_KILL_SECONDS)
        for p in hosts:
            if p.poll() is not None:
                raise RuntimeError(f"a host exited before the kill (log: {p.log_path})")  # type: ignore[attr-defined]
        standby_before = max(log_figures(survivor_log, r"standby_records=(\d+)") or [0])
        # The survivor's log from here on: its takeover.
        survivor_log_at = survivor_log.stat().st_size
        disturbed = lost_partitions(hosts, logs_at_live)
        killed_at_ms = int(time.time() * 1000)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        watcher.killed(killed_at_ms)
        recovery = watcher.result()
        log(f"  failover: {recovery['recovery_ms']:,} ms from the kill to output again on every partition")
        if disturbed:
            log(f"  not a failover figure: {disturbed}")
        time.sleep(AFTER_RECOVERY_SECONDS)
        total = end_live(h, live, input_topic, out, survivor.pid)
    finally:
        if live is not None and live.poll() is None:
            live.kill()
        if watcher is not None:
            watcher.close()
        for p in hosts:
            h.stop(p)
    takeover_log = h.work / f"{survivor_log.stem}-takeover.log"
    with open(survivor_log, "rb") as f:
        f.seek(survivor_log_at)
        takeover_log.write_bytes(f.read())
    result = {
        "contender": f"of-wallet-eos-failover-{standbys}",
        "label": f"Onceflow wallet, 2 hosts, standby-replicas = {standbys}",
        "size": size,
        "accounts": accounts,
        "standbys": standbys,
        "session_timeout_ms": FAILOVER_SESSION_MS,
        "fill_seconds": fill_seconds,
        "fill_throughput": fill["throughput"],
        "recovery_ms": recovery["recovery_ms"],
        "per_partition_ms": recovery.get("per_partition_ms"),
        "sampled_after_kill_ms": recovery["sampled_after_kill_ms"],
        "standby_records_before_kill": standby_before,
        # The survivor's restores after the kill: the takeover.
        "restored_records": sum(log_figures(takeover_log, r"restored (\d+) changelog records")),
        "fenced_ms": log_figures(takeover_log, r"fenced a departed instance's worker .*? ms=(\d+)"),
        **audit(h, out, total),
        "log": str(survivor_log),
    }
    if disturbed:
        result["disturbed"] = disturbed
    h.tool("delete-topics", input_topic, *out.values())
    return result


def lost_partitions(hosts: list, logs_at: list[int]) -> str | None:
    """Whether a host lost its partitions during the live load before the
    kill (its session expired: a heartbeat unanswered for the 2 s session on
    this busy machine). The group was then rebalancing at the kill, and the
    time measured is not a failover's (one run measured 1,023 ms, less than
    the session)."""
    for p, at in zip(hosts, logs_at):
        with open(p.log_path, "rb") as f:  # type: ignore[attr-defined]
            f.seek(at)
            text = f.read().decode(errors="replace")
        if "lost=true" in text:
            return f"{Path(p.log_path).name} lost its partitions before the kill (session expired); run it again"  # type: ignore[attr-defined]
    return None


# Rebalances: how long after a host joins (or leaves) the committed output
# of each partition is watched for its longest gap.
JOIN_WINDOW_SECONDS = 30
LEAVE_WINDOW_SECONDS = 60


def pauses(h: Harness, topic: str, seconds: int, event) -> dict:
    """Arms `bench-tool pauses` on `topic`, calls `event()` (which returns
    the event's time in ms), and returns the pauses it measured."""
    watcher = subprocess.Popen(
        [str(h.bench_tool), "pauses", "--topics", topic, "--seconds", str(seconds)],
        env=h.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert watcher.stdin is not None and watcher.stdout is not None
        if not json.loads(watcher.stdout.readline() or "{}").get("armed"):
            raise RuntimeError(f"pauses did not start: {watcher.stderr.read() if watcher.stderr else ''}")
        time.sleep(3)  # the baseline
        at_ms = event()
        out, err = watcher.communicate(f"{at_ms}\n", timeout=seconds + 60)
        if watcher.returncode != 0:
            raise RuntimeError(f"pauses failed: {err.strip()[:2000]}")
        return json.loads(out)
    finally:
        if watcher.poll() is None:
            watcher.kill()


def measure_rebalance(h: Harness, c: Contender, protocol: str) -> dict:
    """Two hosts run the wallet (100,000 accounts of state) under live load;
    a third joins, then leaves (SIGTERM: a clean stop). Per event, the
    longest gap in each partition's committed output after it."""
    run = f"rb-{protocol}"
    accounts = 100_000
    input_topic, out, filled = prepare(h, f"rec-{run}-{h.run_id}", accounts)
    extra = ["--group-protocol", protocol]
    hosts = [h.start(c, input_topic, out, run, log_suffix=f"-{i}", instance=i, extra=extra) for i in ("i0", "i1")]
    live = None
    result: dict = {"contender": f"of-wallet-eos-rebalance-{protocol}", "protocol": protocol}
    try:
        await_fill(h, out, filled, accounts, hosts[0].pid)
        live = start_live(h, input_topic)
        time.sleep(BEFORE_KILL_SECONDS)

        def join() -> int:
            at = int(time.time() * 1000)
            hosts.append(h.start(c, input_topic, out, run, log_suffix="-i2", instance="i2", extra=extra))
            return at

        result["join"] = pauses(h, out["out0"], JOIN_WINDOW_SECONDS, join)
        log(f"  {protocol}: a host joins: longest pause {result['join']['max_pause_ms']:,} ms (baseline {result['join']['baseline_max_gap_ms']} ms)")

        def leave() -> int:
            at = int(time.time() * 1000)
            hosts[2].send_signal(signal.SIGTERM)
            return at

        result["leave"] = pauses(h, out["out0"], LEAVE_WINDOW_SECONDS, leave)
        log(f"  {protocol}: a host leaves: longest pause {result['leave']['max_pause_ms']:,} ms (baseline {result['leave']['baseline_max_gap_ms']} ms)")
        total = end_live(h, live, input_topic, out, hosts[0].pid)
    finally:
        if live is not None and live.poll() is None:
            live.kill()
        for p in hosts:
            h.stop(p)
    result.update(audit(h, out, total))
    h.tool("delete-topics", input_topic, *out.values())
    return result


def rebalance_report(results: list[dict]) -> list[str]:
    lines = [
        "",
        "## Rebalances",
        "",
        f"Two hosts run the wallet (100,000 accounts) under {LIVE_RATE:,} payments/s; a third starts (join), then "
        "is stopped with SIGTERM (leave). Per event, the longest time any partition of the balances topic went "
        f"without new committed output, within {JOIN_WINDOW_SECONDS} s (join) or {LEAVE_WINDOW_SECONDS} s (leave) "
        "of it; the baseline is the longest gap in the 3 s before (commits every 100 ms).",
        "",
        "| group protocol | join: longest pause ms | join: median partition ms | leave: longest pause ms | leave: median partition ms | baseline ms | audit exact |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]

    def median(r: dict) -> int:
        values = sorted(p["pause_ms"] for p in r["per_partition"])
        return values[len(values) // 2] if values else 0

    for r in results:
        if "error" in r:
            lines.append(f"| {r['protocol']} | FAILED: {r['error']} | | | | | |")
            continue
        lines.append(
            f"| {r['protocol']} | **{r['join']['max_pause_ms']:,}** | {median(r['join']):,} | "
            f"**{r['leave']['max_pause_ms']:,}** | {median(r['leave']):,} | "
            f"{max(r['join']['baseline_max_gap_ms'], r['leave']['baseline_max_gap_ms'])} | "
            f"{'yes' if r['exact'] else 'NO'} ({r['audit_records']:,} records, {r['payments']:,} payments) |"
        )
    return lines


def failover_report(results: list[dict]) -> list[str]:
    lines = [
        "",
        "## Failover to another host",
        "",
        f"Two `onceflow run` hosts (instances i0, i1) share the deployment, `--session-timeout-ms {FAILOVER_SESSION_MS}`; "
        f"after {BEFORE_KILL_SECONDS} s of live load one is SIGKILLed and not restarted. Time: from the kill to every "
        "partition of the balances topic having new committed output (the dead host's partitions move to the survivor "
        "once its session expires).",
        "",
        "| standby-replicas | state | accounts | failover ms | standby records before the kill | changelog records restored by the survivor | fence ms | audit exact |",
        "|---:|---|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r.get('standbys')} | {r['size']} | {r['accounts']:,} | FAILED: {r['error']} | | | | |")
            continue
        figure = f"**{r['recovery_ms']:,}**"
        if r.get("disturbed"):
            figure = f"({r['recovery_ms']:,}: not a failover, {r['disturbed']})"
        lines.append(
            f"| {r['standbys']} | {r['size']} | {r['accounts']:,} | {figure} | {fmt(r['standby_records_before_kill'])} | "
            f"{fmt(r.get('restored_records'))} | {', '.join(map(str, r['fenced_ms'])) or '–'} | "
            f"{'yes' if r['exact'] else 'NO'} ({r['audit_records']:,} records, {r['payments']:,} payments) |"
        )
    with_standby = [
        r for r in results if "error" not in r and not r.get("disturbed") and r["standbys"] >= 1 and r["size"] == "1GB"
    ]
    if with_standby:
        ok = all(r["recovery_ms"] <= 3000 for r in with_standby)
        figures = ", ".join(f"{r['recovery_ms']:,} ms" for r in with_standby)
        lines += ["", "| target (issue 12, item 4) | figure | holds |", "|---|---|---|",
                  f"| ≤ 3 s with a standby at 1 GB | {figures} | {'yes' if ok else '**no**'} |"]
    return lines


def report(results: list[dict], context: str, kills: int) -> str:
    lines = [
        f"# Recovery benchmark, {time.strftime('%Y-%m-%d')}",
        "",
        context,
        "",
        f"Wallet, one worker, exactly_once_v2, 100 ms commits; SIGKILL after {BEFORE_KILL_SECONDS} s of live load "
        f"({LIVE_RATE:,} payments/s), restart at once on the same state directory; {kills} kills per fill, "
        f"{AFTER_RECOVERY_SECONDS} s of live load after each recovery, and the median reported (restart issued and "
        "restored records: the median kill's). Recovery: from the kill to the first "
        "audit record written after it becoming visible (read_committed). `scripts/bench recovery`; bench/recovery.py.",
        "",
        "| contender | state | accounts | fill records/s | recovery ms (median) | every kill (ms) | restart issued (ms after kill) | changelog records restored | audit exact |",
        "|---|---|---:|---:|---:|---|---:|---:|---|",
    ]
    failovers = [r for r in results if "standbys" in r]
    rebalances = [r for r in results if "protocol" in r]
    results = [r for r in results if "standbys" not in r and "protocol" not in r]
    if not results:
        # Only failovers or rebalances: no restart table.
        lines = lines[:4]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['label']} | {r['size']} | {r['accounts']:,} | – | FAILED: {r['error']} | | | | |")
            continue
        runs = ", ".join(f"{ms:,}" for ms in r.get("recovery_runs_ms", [r["recovery_ms"]]))
        lines.append(
            f"| {r['label']} | {r['size']} | {r['accounts']:,} | {fmt(r['fill_throughput'])} | **{r['recovery_ms']:,}** | "
            f"{runs} | {r['restarted_after_kill_ms']} | "
            f"{fmt(r.get('restored_records'))} | {'yes' if r['exact'] else 'NO'} ({r['audit_records']:,} records, "
            f"{r['audit_distinct']:,} ids, {r['payments']:,} payments) |"
        )
    by = {(r["contender"], r["size"]): r for r in results if "error" not in r}
    of_big, of_small = by.get(("of-wallet-eos", "1GB")), by.get(("of-wallet-eos", "100MB"))
    if results:
        lines += ["", "| target (issue 12, item 3) | figure | holds |", "|---|---|---|"]
    if of_big:
        ok = of_big["recovery_ms"] <= 2000
        lines.append(f"| Onceflow ≤ 2 s at 1 GB | {of_big['recovery_ms']:,} ms | {'yes' if ok else '**no**'} |")
    if of_big and of_small:
        ratio = of_big["recovery_ms"] / max(of_small["recovery_ms"], 1)
        lines.append(f"| 1 GB within 20% of 100 MB | {ratio:.2f}x ({of_small['recovery_ms']:,} ms at 100 MB) | {'yes' if ratio <= 1.2 else '**no**'} |")
    if failovers:
        lines += failover_report(failovers)
    if rebalances:
        lines += rebalance_report(rebalances)
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--onceflow", required=True)
    parser.add_argument("--bench-tool", required=True)
    parser.add_argument("--kstreams-classpath", required=True)
    parser.add_argument("--sizes", default="100MB,1GB", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--only", help="comma-separated contender keys")
    parser.add_argument(
        "--failover",
        help="comma-separated standby-replicas counts (e.g. 0,1): also measure failover to a second host with each",
    )
    parser.add_argument(
        "--rebalance",
        help="comma-separated group protocols (classic,consumer): also measure the pauses when a host joins and leaves",
    )
    parser.add_argument(
        "--kills",
        type=int,
        default=3,
        help="restart runs: kills (and restarts) per fill; the median is reported (default 3)",
    )
    parser.add_argument("--results", default=str(REPO / "bench/results"))
    parser.add_argument("--context", default="")
    args = parser.parse_args()
    if args.kills < 1:
        parser.error("--kills must be 1 or more")
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
                results.append(measure(h, c, size, SIZES[size], args.kills))
            except Exception as e:  # a failed contender must not sink the rest
                log(f"  FAILED: {e}")
                results.append({"contender": c.key, "label": c.label, "size": size, "accounts": SIZES[size], "error": str(e)[:500]})
    onceflow = next((c for c in contenders() if c.key == "of-wallet-eos"), None)
    for size in sizes if args.failover else []:
        for standbys in [int(n) for n in args.failover.split(",")]:
            log(f"failover, standby-replicas = {standbys}, {size} ({SIZES[size]:,} accounts)")
            try:
                results.append(measure_failover(h, onceflow, size, SIZES[size], standbys))
            except Exception as e:
                log(f"  FAILED: {e}")
                results.append({"contender": f"of-wallet-eos-failover-{standbys}", "label": "failover", "size": size,
                                "accounts": SIZES[size], "standbys": standbys, "error": str(e)[:500]})
    for protocol in args.rebalance.split(",") if args.rebalance else []:
        log(f"rebalances, group.protocol={protocol}")
        try:
            results.append(measure_rebalance(h, onceflow, protocol))
        except Exception as e:
            log(f"  FAILED: {e}")
            results.append({"contender": f"of-wallet-eos-rebalance-{protocol}", "protocol": protocol, "error": str(e)[:500]})
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{time.strftime('%Y-%m-%d')}-recovery"
    (out / f"{stem}.json").write_text(json.dumps({"context": args.context, "kills": args.kills, "results": results}, indent=2) + "\n")
    text = report(results, args.context, args.kills)
    (out / f"{stem}.md").write_text(text)
    print(text)
    log(f"wrote {out / stem}.md and .json")
    return 0 if all("error" not in r and r["exact"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
