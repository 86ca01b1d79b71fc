#!/usr/bin/env python3
"""The query benchmark (bench/README.md, "Queries"; issue 43, item 2): how
long `GET /v1/deployments/{name}/state/{store}?key=` takes when the owners'
local stores answer it, beside the changelog scan that answered every query
before (`source=changelog`), at a given state size.

One host, one local broker, one wallet (`examples/wallet`,
exactly_once_v2) on a `--partitions` input. The fill: N payments (`--kind
fill`), payment i opening account i (about 100 bytes of state per account:
`--accounts 1000000` is about 100 MB, 10000000 about 1 GB), processed to the
end (every audit record visible). Then, one after another over one HTTP
connection per query (as a client would):

1. `--queries` key queries of random accounts from the owners' stores
   (routed: on one host, its own stores answer every partition);
2. `--scans` key queries of random accounts with `source=changelog`;

each timed from send to the whole answer, each answer checked against the
other path's for the accounts both asked (the same committed balance).
Results: bench/results/<date>-query[-suffix].{md,json}.

Run it through `scripts/bench query`, which starts the broker (and builds
the host unless ONCEFLOW_BIN names one). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import REPO, log  # noqa: E402
from density import (  # noqa: E402
    TENANT,
    Density,
    Failure,
    check_host_arguments,
    host_arguments,
    percentiles,
    proc_status,
)

MASK = (1 << 64) - 1


def mix(i: int) -> int:
    """splitmix64, as bench-tool's `mix` (raw-pipe/src/lib.rs)."""
    z = (i + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def fill_account(i: int) -> str:
    """Account i of `--kind fill`, as bench-tool's `fill_account`."""
    pad = "".join(f"{mix((i * 8 + k) & MASK):016x}" for k in range(5))
    return f"acct-{i:010d}-{pad}"


class QueryBench(Density):
    def __init__(self, args: argparse.Namespace):
        # The tenant's quotas are sized by the largest stage: room for a
        # few partitions' guest memory (64 MB each).
        args.stages = [16]
        args.hibernate_after = 0
        super().__init__(args)
        shutil.rmtree(self.work, ignore_errors=True)
        self.work = self.work.with_name(self.work.name.replace("density", "query"))
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "manifests").mkdir(exist_ok=True)
        self.host_log = self.work / "host.log"

    def timed_get(self, path: str) -> tuple[float, dict | None, str]:
        """One GET: seconds, the answer (None on an error) and the error."""
        request = urllib.request.Request(
            f"{self.server}{path}", headers={"Authorization": f"Bearer {self.token}"}
        )
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=600) as r:
                body = r.read()
            return time.perf_counter() - t0, json.loads(body), ""
        except urllib.error.HTTPError as e:
            return time.perf_counter() - t0, None, f"{e.code}: {e.read()[:300]!r}"

    def run(self) -> dict:
        a = self.args
        started = time.time()
        raw: dict = {"accounts": a.accounts, "partitions": a.partitions, "failed": None}
        try:
            self.start_host()
            i = 1
            self.tool("create-topics", f"{self.topic(i, 'payments')}:{a.partitions}")
            self.tool("create-topics", *(f"{self.topic(i, t)}:{a.partitions}"
                                         for t in ("balances", "audit", "payments.dlq")))
            manifest = self.manifest(i)
            out = subprocess.run(
                [a.onceflow, "deploy", str(manifest), "--server", self.server, "--token", self.token,
                 "--output", "json"], env=self.env, capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                raise Failure(f"deploy failed: {out.stderr[-2000:]}")
            log(f"fill: {a.accounts:,} payments, each opening its account")
            t0 = time.time()
            self.tool("produce", "--topic", self.topic(i, "payments"), "--kind", "fill",
                      "--count", str(a.accounts), timeout=7200)
            produced_s = time.time() - t0
            fill = self.tool("await", "--topics", self.topic(i, "audit"), "--expect", str(a.accounts),
                             "--timeout-secs", str(a.fill_timeout), "--pid", str(self.host.pid),
                             timeout=a.fill_timeout + 60)
            raw["fill_seconds"] = round(time.time() - t0, 1)
            raw["produce_seconds"] = round(produced_s, 1)
            state = sum(f.stat().st_size for f in (self.work / "state").rglob("*") if f.is_file())
            raw["state_dir_mb"] = round(state / 2**20, 1)
            raw["host_rss_mb"] = round(proc_status(self.host.pid)["rss_kb"] / 1024, 1)
            log(f"filled in {raw['fill_seconds']} s; state directory {raw['state_dir_mb']} MB")
            rng = random.Random(a.seed)
            name = self.name(i)

            def path(account: str, source: str | None) -> str:
                q = {"key": account, **({"source": source} if source else {})}
                return f"/v1/deployments/{name}/state/balances?{urllib.parse.urlencode(q)}"

            routed, answers, errors = [], {}, []
            for _ in range(a.queries):
                account = fill_account(rng.randrange(a.accounts))
                secs, body, err = self.timed_get(path(account, None))
                if body is None:
                    errors.append(err)
                    continue
                routed.append(secs * 1000)
                answers[account] = [v.get("value") for v in body["values"]]
            log(f"{len(routed)} routed queries: p50 {percentiles(routed)['p50']:.1f} ms, "
                f"p99 {percentiles(routed)['p99']:.1f} ms")
            scans, mismatches = [], []
            for account in list(answers)[: a.scans]:
                secs, body, err = self.timed_get(path(account, "changelog"))
                if body is None:
                    errors.append(err)
                    continue
                scans.append(secs * 1000)
                scanned = [v.get("value") for v in body["values"]]
                if scanned != answers[account]:
                    mismatches.append({"account": account, "stores": answers[account], "changelog": scanned})
                log(f"changelog scan {len(scans)}: {secs * 1000:,.0f} ms")
            raw.update(
                routed_ms=percentiles(routed),
                scan_ms=percentiles(scans),
                errors=errors[:10],
                error_count=len(errors),
                mismatches=mismatches,
                fill=fill,
            )
        except Failure as e:
            raw["failed"] = str(e)
            log(f"FAILED: {e}")
        finally:
            self.stop_host()
        raw["seconds"] = round(time.time() - started, 1)
        self.write(raw)
        return raw

    def write(self, raw: dict) -> None:
        date = time.strftime("%Y-%m-%d")
        stem = f"{date}-query" + (f"-{self.args.suffix}" if self.args.suffix else "")
        out = Path(self.args.results)
        (out / f"{stem}.json").write_text(json.dumps(raw, indent=2) + "\n")
        r, s = raw.get("routed_ms", {}), raw.get("scan_ms", {})

        def ms(v):
            return "–" if v is None else f"{v:,.1f}"

        lines = [
            f"# Queries, {time.strftime('%Y-%m-%d %H:%M')}",
            "",
            f"One `onceflow host`, one local broker, a wallet on a {raw['partitions']}-partition input filled with "
            f"{raw['accounts']:,} accounts (`scripts/bench query`, bench/query.py). {self.args.context}",
            "",
            "| path | queries | p50, ms | p99, ms | max, ms |",
            "|---|---:|---:|---:|---:|",
            f"| owners' stores (routed) | {r.get('samples', 0)} | {ms(r.get('p50'))} | {ms(r.get('p99'))} | {ms(r.get('max'))} |",
            f"| changelog scan (`source=changelog`) | {s.get('samples', 0)} | {ms(s.get('p50'))} | {ms(s.get('p99'))} | {ms(s.get('max'))} |",
            "",
            f"- State directory after the fill: {raw.get('state_dir_mb', '–')} MB (RocksDB, all partitions); "
            f"host RSS {raw.get('host_rss_mb', '–')} MB; the fill took {raw.get('fill_seconds', '–')} s.",
            f"- Answers compared on {s.get('samples', 0)} accounts: {len(raw.get('mismatches', []))} differ; "
            f"{raw.get('error_count', 0)} queries failed.",
        ]
        if raw.get("failed"):
            lines += ["", "**Failed:**", "", "```", raw["failed"], "```"]
        lines.append(f"- The run took {raw['seconds'] / 60:.1f} minutes.")
        (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
        self.paths = (out / f"{stem}.md", out / f"{stem}.json")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    host_arguments(ap)
    ap.add_argument("--accounts", type=int, default=1_000_000,
                    help="accounts filled (1000000: about 100 MB of state; 10000000: about 1 GB)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--queries", type=int, default=500, help="routed key queries")
    ap.add_argument("--scans", type=int, default=5, help="changelog-scan key queries")
    ap.add_argument("--seed", type=int, default=43)
    ap.add_argument("--fill-timeout", type=int, default=7200)
    ap.add_argument("--results", default=str(REPO / "bench/results"))
    ap.add_argument("--context", default="")
    ap.add_argument("--suffix", default="")
    ap.add_argument("--host-arg", action="append", default=[], metavar="ARG")
    args = ap.parse_args()
    check_host_arguments(ap, args)

    def terminate(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        run = QueryBench(args)
    except Failure as e:
        log(f"FAILED: {e}")
        return 1
    raw = run.run()
    log(f"wrote {run.paths[0]} and {run.paths[1]} ({raw['seconds'] / 60:.1f} minutes; tenant {TENANT})")
    return 0 if raw["failed"] is None and not raw.get("mismatches") and not raw.get("error_count") else 1


if __name__ == "__main__":
    sys.exit(main())
