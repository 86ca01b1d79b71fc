#!/usr/bin/env python3
"""The sink benchmark (bench/README.md, "Sink"): records per second into
PostgreSQL, `onceflow sink postgres` against a plain at-least-once batch
insert (`bench-tool pg-insert`: insert a batch, then commit the offsets), on
the same topic and the same machine.

The input: N payments (`bench-tool produce --kind fill`: JSON objects
`{"payment_id", "account", "amount"}`, each its own account) on 6
partitions. Each contender writes them into its own table of three columns
(no index: the baseline's table and the sink's alike), in batches of up to
5,000 records. The sink runs two ways: `identity = "payment_id"` (a marker
per event id: duplicates upstream are caught) and the default `position`
identity (no marker since issue 42: the positions are its check). Throughput is measured from outside, by
counting the table's rows every 250 ms: from the first row to the last.
Afterwards each table must hold every payment exactly once.

Run it through `scripts/bench sink`, which builds what it needs and starts
the broker; PostgreSQL is the bench's own (`scripts/postgres` on port
25450, a fresh cluster for each contender). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import REPO, log  # noqa: E402

PG_PORT = "25450"  # below the ephemeral ports (32768-60999)


def psql(sql: str) -> str:
    out = subprocess.run(
        [str(REPO / "scripts/postgres"), "psql", "-qtA", "-c", sql],
        env=dict(os.environ, ONCEFLOW_POSTGRES_PORT=PG_PORT),
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def pg(*args: str) -> str:
    out = subprocess.run(
        [str(REPO / "scripts/postgres"), *args],
        env=dict(os.environ, ONCEFLOW_POSTGRES_PORT=PG_PORT),
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def tool(args, *argv: str, env: dict | None = None, timeout: float = 900) -> dict:
    out = subprocess.run(
        [args.bench_tool, *argv],
        env=env or dict(os.environ, ONCEFLOW_BOOTSTRAP=args.bootstrap_servers),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(f"bench-tool {argv[0]} failed: {out.stderr.strip()[:2000]}")
    return json.loads(out.stdout)


def watch(table: str, n: int, proc: subprocess.Popen, timeout: float = 1800) -> dict:
    """Counts rows until n; the rate from the first row to the last."""
    start = time.time()
    first = None
    while True:
        have = int(psql(f"SELECT count(*) FROM {table}"))
        now = time.time()
        if have > 0 and first is None:
            first = (now, have)
        if have >= n:
            break
        if proc.poll() is not None:
            raise RuntimeError(f"the contender exited ({proc.returncode}) with {have} of {n} rows")
        if now - start > timeout:
            raise RuntimeError(f"{have} of {n} rows after {timeout} s")
        time.sleep(0.25)
    t0, c0 = first
    seconds = max(now - t0, 1e-3)
    return {"rows": have, "seconds": round(seconds, 2), "records_per_s": round((n - c0) / seconds)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap-servers", required=True)
    ap.add_argument("--onceflow", required=True)
    ap.add_argument("--bench-tool", required=True)
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--results", default=str(REPO / "bench/results"))
    ap.add_argument("--profile", default="dev")
    args = ap.parse_args()

    try:
        return run(args)
    finally:
        pg("down", "--purge")


def run(args) -> int:
    run_id = time.strftime("%Y%m%d%H%M%S")
    topic = f"bench-sink-{run_id}"
    n = args.records
    tool(args, "create-topics", f"{topic}:6", f"{topic}.dlq:1")
    log(f"producing {n:,} payments to {topic}")
    tool(args, "produce", "--topic", topic, "--kind", "fill", "--count", str(n))
    work = Path(f"/tmp/onceflow-bench-sink-{run_id}")
    work.mkdir(parents=True)
    results = {}
    for key, label in [
        ("naive", "plain at-least-once batch insert (bench-tool pg-insert)"),
        ("sink-payment-id", "onceflow sink postgres, identity = payment_id"),
        ("sink-position", "onceflow sink postgres, identity = position"),
    ]:
        # Each contender on a fresh cluster: the markers of the one before
        # would slow the next one's inserts.
        pg("down", "--purge")
        pg("up")
        password = Path(pg("password-file")).read_text().strip()
        url = pg("url")
        env = dict(os.environ, PGPASSWORD=password, ONCEFLOW_BOOTSTRAP=args.bootstrap_servers, ONCEFLOW_LOG="info")
        table = f"bench_{key.replace('-', '_')}_{run_id}"
        psql(f"CREATE TABLE {table} (payment_id text NOT NULL, account text NOT NULL, amount bigint NOT NULL)")
        logf = open(work / f"{key}.log", "w")
        if key == "naive":
            cmd = [
                args.bench_tool, "pg-insert", "--topic", topic, "--group", f"naive-{run_id}",
                "--connection", url, "--table", table, "--count", str(n),
            ]
        else:
            identity = 'identity = "payment_id"' if key == "sink-payment-id" else ""
            config = work / f"{key}.toml"
            config.write_text(
                f'name = "bench-{key}-{run_id}"\n'
                f'dead-letter-topic = "{topic}.dlq"\n'
                f'[postgres]\nconnection = "{url}"\n'
                f'[[routes]]\ntopic = "{topic}"\nmode = "insert"\ntable = "{table}"\n'
                f'columns = ["payment_id", "account", "amount"]\n{identity}\n'
            )
            cmd = [args.onceflow, "sink", "postgres", str(config), "--instance-id", "bench"]
        log(f"{key}: {label}")
        proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT)
        try:
            r = watch(table, n, proc)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        distinct = int(psql(f"SELECT count(DISTINCT payment_id) FROM {table}"))
        rows = int(psql(f"SELECT count(*) FROM {table}"))
        r["exact"] = rows == n and distinct == n
        r["label"] = label
        results[key] = r
        log(f"  {r['records_per_s']:,} records/s ({rows:,} rows, {distinct:,} distinct, exact: {r['exact']})")
        psql(f"DROP TABLE {table}")
    tool(args, "delete-topics", topic, f"{topic}.dlq")

    day = time.strftime("%Y-%m-%d")
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    raw = {"records": n, "profile": args.profile, "results": results}
    (out / f"{day}-sink.json").write_text(json.dumps(raw, indent=2) + "\n")
    base = results["naive"]["records_per_s"]
    lines = [
        f"# Sink benchmark, {day} ({args.profile} profile)",
        "",
        f"{n:,} payments (6 partitions) into a three-column PostgreSQL 15 table, batches of up to 5,000; "
        "broker, PostgreSQL (a fresh cluster per contender) and the contender on one 2-core machine "
        "(`scripts/bench sink`, bench/sink.py). Records/s from the first row to the last, counted from outside.",
        "",
        "| contender | records/s | vs the plain insert | rows | exactly once |",
        "|---|---:|---:|---:|---|",
    ]
    for key, r in results.items():
        lines.append(
            f"| {r['label']} | {r['records_per_s']:,} | {r['records_per_s'] / base:.2f} | {r['rows']:,} | "
            f"{'yes' if r['exact'] else 'no'} |"
        )
    (out / f"{day}-sink.md").write_text("\n".join(lines) + "\n")
    log(f"wrote {out / (day + '-sink.md')}")
    return 0 if all(r["exact"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
