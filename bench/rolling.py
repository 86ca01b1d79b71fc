#!/usr/bin/env python3
"""The rolling-upgrade drill (issue 43, item 3; docs/operations.md, "Rolling
upgrades"): a fleet of three hosts carrying `--deployments` wallets under a
steady load, every host restarted one after another, `--passes` times, and
every deployment exact at the end.

One local broker; three `onceflow host` processes (h1, h2, h3: their own
state directories, admin APIs and logs) sharing one tenant. Each deployment
is the wallet (`examples/wallet`, exactly_once_v2, 100 ms commits,
`standby-replicas = 1`) on its own `--partitions`-partition topics
(`density.wNNNN.payments`, `.balances`, `.audit`, `.payments.dlq`), so every
deployment runs on every host and every restart moves some of its
partitions.

1. Start the hosts (on `--old-onceflow` when given: the upgrade drill, old
   and new hosts side by side until the first pass ends), deploy the
   wallets through h1, wait until every partition of every deployment is
   claimed by a host.
2. Arm the measure: one `bench-tool stalls` over every deployment's group
   and input, polling committed offsets and input ends every 250 ms. A
   partition's stall is the time its input waited with its committed
   offset standing still: its time without an owner, plus the new owner's
   restore and first commit.
3. The load: one `bench-tool produce --rate R` per deployment, for the whole
   drill.
4. Each pass, each host in turn: SIGTERM (the drain: it hands its partitions
   over and exits; the drain's length and exit code are recorded), down
   `--down-seconds`, started again on `--onceflow` (the new binary), then
   wait until every partition is claimed again and `--settle-seconds`.
5. Stop the load, wait until every deployment's audit topic holds one
   record per payment in its input, stop the measure; then exactness per
   deployment: audit records = input payments = distinct payment ids
   (`bench-tool count`, read_committed).

Results: bench/results/<date>-rolling[-suffix].{md,json}. Run it through
`scripts/drill --rolling-upgrade` (or `scripts/bench rolling`), which
starts the broker and builds the host unless ONCEFLOW_BIN names one.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import REPO, log  # noqa: E402
from density import TENANT, Density, Failure, check_host_arguments, host_arguments, percentiles  # noqa: E402

HOSTS = ("h1", "h2", "h3")


class Host:
    """One `onceflow host` process, restarted in place."""

    def __init__(self, name: str, work: Path):
        self.name = name
        self.state = work / f"state-{name}"
        self.log = work / f"{name}.log"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.binary = ""

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class Rolling(Density):
    def __init__(self, args: argparse.Namespace):
        super().__init__(args)
        self.hosts = [Host(n, self.work) for n in HOSTS]
        self.server = self.hosts[0].server

    # ---- hosts ----------------------------------------------------------

    def check_host(self) -> None:
        for h in self.hosts:
            if h.proc is not None and h.proc.poll() is not None:
                raise Failure(f"host {h.name} exited with code {h.proc.returncode}; its last log lines:\n{h.tail()}")

    def host_tail(self, lines: int = 20) -> str:
        return "\n".join(f"--- {h.name}\n{h.tail(lines)}" for h in self.hosts)

    def launch(self, h: Host, binary: str) -> None:
        argv = [
            binary, "host",
            "--tenants", str(self.work / "tenants.toml"),
            "--listen", f"127.0.0.1:{h.port}",
            "--bootstrap-servers", self.args.bootstrap_servers,
            "--state-dir", str(h.state),
            "--host-id", h.name,
            *self.args.host_arg,
        ]
        with h.log.open("a") as out:
            out.write(f"==== rolling.py: starting {binary}\n")
        h.proc = subprocess.Popen(argv, env=self.env, stdout=h.log.open("a"), stderr=subprocess.STDOUT,
                                  start_new_session=True)
        h.binary = binary
        deadline = time.time() + 90
        while True:
            self.check_host()
            try:
                with urllib.request.urlopen(f"{h.server}/healthz", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.time() > deadline:
                raise Failure(f"host {h.name} did not serve /healthz within 90 s:\n{h.tail()}")
            time.sleep(0.3)

    def drain(self, h: Host) -> dict:
        """SIGTERM and wait for the exit: the drain's length and outcome."""
        assert h.proc is not None
        proc, h.proc = h.proc, None
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=self.args.drain_wait)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
        seconds = round(time.time() - t0, 2)
        drained = re.findall(r"host drained.* ms=(\d+)", h.log.read_text(errors="replace"))
        return {"exit_code": code, "seconds": seconds, "binary": h.binary,
                "logged_drain_ms": int(drained[-1]) if drained else None}

    def claims(self) -> dict[str, list[int]]:
        """Per deployment, the partitions the hosts' statuses claim (any
        host's API answers for the fleet)."""
        for h in self.hosts:
            if h.proc is None:
                continue
            try:
                request = urllib.request.Request(f"{h.server}/v1/deployments",
                                                 headers={"Authorization": f"Bearer {self.token}"})
                with urllib.request.urlopen(request, timeout=30) as r:
                    listed = json.loads(r.read())["deployments"]
            except (urllib.error.URLError, OSError):
                continue
            return {d["name"]: sorted(p for s in d.get("hosts", []) for p in s.get("partitions", []))
                    for d in listed}
        return {}

    def await_claimed(self, what: str, timeout: float) -> float:
        """Waits until every partition of every deployment is claimed
        exactly once; the seconds it took."""
        want = list(range(self.args.partitions))
        t0 = time.time()
        while True:
            self.check_host()
            claims = self.claims()
            bad = [n for n in (self.name(i) for i in self.sent) if claims.get(n) != want]
            if not bad:
                return round(time.time() - t0, 1)
            if time.time() - t0 > timeout:
                raise Failure(f"{what}: {len(bad)} deployments not fully claimed after {timeout:.0f} s "
                              f"(e.g. {bad[:5]}: {[claims.get(n) for n in bad[:5]]})\n{self.host_tail()}")
            time.sleep(1)

    # ---- the drill ------------------------------------------------------

    def manifest(self, i: int) -> Path:
        path = super().manifest(i)
        text = path.read_text()
        text = text.replace("commit-interval-ms = 100\n",
                            f"commit-interval-ms = {self.args.commit_interval_ms}\nstandby-replicas = 1\n")
        path.write_text(text)
        return path

    def setup(self) -> None:
        a = self.args
        try:
            held = self.tool("count", "--topic", "_onceflow.deployments", "--timeout-secs", "30", timeout=60)
        except Failure as e:
            if "has no partitions" not in str(e):
                raise
            held = {"records": 0}  # no registry topic yet: a fresh broker
        if held["records"]:
            raise Failure("the broker already holds a deployment registry: the drill needs a fresh one "
                          "(scripts/kafka down --purge)")
        n = a.deployments
        (self.work / "tenants.toml").write_text(
            f'[[tenant]]\nname = "{TENANT}"\ntoken-sha256 = "{self.hash_token()}"\ntopic-prefix = "{TENANT}."\n'
            f"[tenant.quotas]\ndeployments = {n}\nworker-threads = {n}\n"
            f"guest-memory-mb = {64 * n * a.partitions}\nhost-held-mb = {max(1024, 256 * n)}\n"
        )
        first = a.old_onceflow or a.onceflow
        for h in self.hosts:
            self.launch(h, first)
        log(f"hosts up on {first}: {', '.join(h.server for h in self.hosts)}")
        ids = list(range(1, n + 1))
        for k in range(0, n, 100):
            batch = ids[k : k + 100]
            self.tool("create-topics", *(f"{self.topic(i, t)}:{a.partitions}" for i in batch
                                         for t in ("payments", "balances", "audit", "payments.dlq")))
        t0 = time.time()
        for i in ids:
            out = subprocess.run(
                [a.onceflow, "deploy", str(self.manifest(i)), "--server", self.hosts[0].server,
                 "--token", self.token, "--output", "json"],
                env=self.env, capture_output=True, text=True, timeout=a.deploy_timeout,
            )
            if out.returncode != 0:
                raise Failure(f"onceflow deploy {self.name(i)} failed: {out.stderr.strip()[-2000:]}")
            self.sent[i] = 0
        log(f"{n} deployed in {time.time() - t0:.0f} s; waiting until every partition is claimed")
        self.await_claimed("after the deploys", 300)

    def run_drill(self) -> dict:
        a = self.args
        # Kept as the drill goes: a failed run reports the restarts it made.
        self.raw = raw = {"args": {k: v for k, v in vars(a).items() if k != "context"}, "context": a.context,
                          "restarts": []}
        started = time.time()
        self.setup()
        pairs = ",".join(f"{TENANT}.{self.name(i)}={self.topic(i, 'payments')}" for i in self.sent)
        stalls = subprocess.Popen([a.bench_tool, "stalls", "--pairs", pairs], env=self.env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.children.add(stalls)
        if stalls.stdout is None or "armed" not in stalls.stdout.readline():
            raise Failure(f"bench-tool stalls did not arm: {stalls.stderr.read() if stalls.stderr else ''}")
        log(f"load: {a.rate} payments/s to each of {len(self.sent)} deployments")
        load = subprocess.Popen([a.bench_tool, "produce-many", "--rate", str(a.rate), "--topics",
                                 ",".join(self.topic(i, "payments") for i in self.sent)],
                                env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        self.children.add(load)
        if load.stdout is None or "armed" not in load.stdout.readline():
            raise Failure(f"bench-tool produce-many did not start: {load.stderr.read() if load.stderr else ''}")
        time.sleep(a.settle_seconds)
        restarts = raw["restarts"]
        for p in range(a.passes):
            for h in self.hosts:
                t0 = time.time()
                log(f"pass {p + 1}: draining {h.name} ({h.binary})")
                drain = self.drain(h)
                log(f"pass {p + 1}: {h.name} exited {drain['exit_code']} after {drain['seconds']} s")
                time.sleep(a.down_seconds)
                self.launch(h, a.onceflow)
                claimed = self.await_claimed(f"pass {p + 1}, after {h.name}'s restart", 300)
                restarts.append({"pass": p + 1, "host": h.name, "drain": drain, "to": a.onceflow,
                                 "claimed_after_start_s": claimed, "at_ms": int(t0 * 1000),
                                 "seconds": round(time.time() - t0, 1)})
                log(f"pass {p + 1}: {h.name} back on {a.onceflow}, every partition claimed {claimed} s after its "
                    f"start")
                time.sleep(a.settle_seconds)
        # communicate() closes stdin: the load flushes and answers.
        sent, err = load.communicate(timeout=180)
        self.children.discard(load)
        if load.returncode != 0:
            raise Failure(f"bench-tool produce-many failed: {err.strip()[-2000:]}")
        log(f"load stopped ({json.loads(sent)}); waiting for every deployment to catch up")
        inputs = self.count_inputs()
        deadline = time.time() + 300
        while True:
            audits = {i: c["records"] for i, c in self.count_all(sorted(self.sent)).items()}
            behind = [i for i in self.sent if audits[i] < inputs[i]["records"]]
            if not behind or time.time() > deadline:
                break
            time.sleep(5)
        out, err = stalls.communicate(timeout=60)
        self.children.discard(stalls)
        measured = json.loads(out)
        exact = self.exact_against(inputs)
        raw.update({
            "restarts": restarts,
            "stalls": measured,
            "exactness": exact,
            "logs": self.log_findings(),
            "ownerless": self.ownerless(),
            "seconds": round(time.time() - started, 1),
        })
        return raw

    def count_inputs(self) -> dict[int, dict]:
        import concurrent.futures

        def count(i: int) -> tuple[int, dict]:
            return i, self.tool("count", "--topic", self.topic(i, "payments"), "--timeout-secs", "120", timeout=180)

        with concurrent.futures.ThreadPoolExecutor(self.args.parallel) as pool:
            return dict(pool.map(count, sorted(self.sent)))

    def exact_against(self, inputs: dict[int, dict]) -> dict:
        counted = self.count_all(sorted(self.sent))
        wrong = [
            f"{self.name(i)}: {c['records']} audit records, {c['distinct_keys']} payment ids, "
            f"{inputs[i]['records']} payments ({inputs[i]['distinct_keys']} ids)"
            + (f"; its audit topic is stable only up to {c['open_transactions']} (an open or hanging "
               "transaction: see `kafka-transactions.sh describe-producers`)" if c.get("open_transactions") else "")
            for i, c in counted.items()
            if not (c["records"] == c["distinct_keys"] == inputs[i]["records"] == inputs[i]["distinct_keys"])
        ]
        return {"deployments": len(counted), "payments": sum(v["records"] for v in inputs.values()),
                "audit_records": sum(c["records"] for c in counted.values()), "exact": not wrong, "not_exact": wrong}

    def ownerless(self) -> dict:
        """From the hosts' logs (the new binary's, whose lines name their
        deployment): for each time a partition's task closed on a host, the
        time until a host next finished restoring it, ready to process: the
        partition's time without an owner at work."""
        line = re.compile(r"^(\S+Z)\s+INFO deployment\{name=([^}]+)\}: (task closed \(partition revoked\)|restored \d+ "
                          r"changelog records).*? partition=(\d+)(.*)$")
        events = []
        for h in self.hosts:
            for l in h.log.read_text(errors="replace").splitlines():
                m = line.match(l)
                if not m or (m.group(3).startswith("restored") and "finished=true" not in m.group(5)):
                    continue
                t = time.mktime(time.strptime(m.group(1)[:19], "%Y-%m-%dT%H:%M:%S")) + float("0." + m.group(1)[20:-1])
                events.append((t, h.name, m.group(2), int(m.group(4)), "closed" if m.group(3).startswith("task") else "ready"))
        events.sort()
        gaps = []
        open_since: dict[tuple[str, int], float] = {}
        for t, _host, dep, p, kind in events:
            if kind == "closed":
                open_since.setdefault((dep, p), t)
            elif (dep, p) in open_since:
                gaps.append((t - open_since.pop((dep, p))) * 1000)
        return {"handovers": len(gaps), "ms": percentiles(gaps) if gaps else None,
                "never_reopened": len(open_since)}

    def log_findings(self) -> dict:
        text = "".join(h.log.read_text(errors="replace") for h in self.hosts)
        restores = [int(m) for m in re.findall(r"restored \d+ changelog records .*? ms=(\d+) finished=true", text)]
        return {
            "standby_takeovers": text.count("taking over the partition's standby stores"),
            "restores": len(restores),
            "restore_ms": percentiles([float(r) for r in restores]) if restores else None,
            "handovers": text.count("handing the partitions over: leaving the group"),
            "warnings": len(re.findall(r"^\S+\s+WARN ", text, re.M)),
            "errors": len(re.findall(r"^\S+\s+ERROR ", text, re.M)),
        }

    def stop_all(self) -> None:
        for p in list(self.children):
            if p.poll() is None:
                p.kill()
        for h in self.hosts:
            if h.proc is not None and h.proc.poll() is None:
                h.proc.send_signal(signal.SIGTERM)
                try:
                    h.proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    h.proc.kill()


def report(raw: dict) -> str:
    a = raw["args"]
    lines = [
        f"# Rolling upgrade: {len(HOSTS)} hosts, {a['deployments']} deployments, {a['passes']} passes",
        "",
        raw.get("context", ""),
        "",
        f"Each deployment: the wallet, exactly_once_v2, {a['partitions']} partition(s), "
        f"{a.get('commit_interval_ms')} ms commits, standby-replicas 1, "
        f"{a['rate']} payments/s. Old binary: {a['old_onceflow'] or '(none: every host on the new one)'}; "
        f"new: {a['onceflow']}.",
        "",
        "| pass | host | from | drain, s | exit | drain logged, ms | all claimed after start, s |",
        "|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in raw.get("restarts", []):
        d = r["drain"]
        lines.append(f"| {r['pass']} | {r['host']} | {Path(d['binary']).name} | {d['seconds']} | {d['exit_code']} | "
                     f"{d['logged_drain_ms'] if d['logged_drain_ms'] is not None else '–'} | "
                     f"{r['claimed_after_start_s']} |")
    s = raw.get("stalls", {})
    e = raw.get("exactness", {})
    lg = raw.get("logs", {})
    lines += [
        "",
        f"- Longest stall of any partition (its input waiting, its committed offset still): "
        f"**{s.get('max_stall_ms')} ms** over {s.get('partitions')} partitions ({s.get('polls')} polls); "
        f"stalls over 2 s: {len(s.get('stalls_over_report_ms', []))}.",
        f"- Without an owner at work (host logs: from a partition's task closing on one host to a host having "
        f"restored it; lines of the new binary only): {(raw.get('ownerless') or {}).get('handovers')} moves, ms: "
        f"{(raw.get('ownerless') or {}).get('ms')}.",
        f"- Exact: **{e.get('exact')}**: {e.get('deployments')} deployments, {e.get('payments')} payments, "
        f"{e.get('audit_records')} audit records. {'; '.join(e.get('not_exact', [])[:10])}",
        f"- Host logs: {lg.get('handovers')} workers handed their partitions over; {lg.get('standby_takeovers')} "
        f"standby takeovers; {lg.get('restores')} restores (ms: {lg.get('restore_ms')}); "
        f"{lg.get('warnings')} warnings, {lg.get('errors')} errors.",
        f"- {raw.get('seconds', 0) / 60:.1f} minutes.",
    ]
    if raw.get("failed"):
        lines += ["", f"**Failed:** {raw['failed']}"]
    worst = s.get("worst", [])[:10]
    if worst:
        lines += ["", "Worst partitions: " + ", ".join(f"{w['group']}[{w['partition']}] {w['longest_stall_ms']} ms"
                                                   for w in worst)]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    host_arguments(ap)
    ap.add_argument("--old-onceflow", default="", help="the binary the hosts start on (the upgrade's old version)")
    ap.add_argument("--deployments", type=int, default=50)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--rate", type=int, default=10, help="payments/s to each deployment")
    ap.add_argument("--commit-interval-ms", type=int, default=1000,
                    help="the wallets' commit interval (100: 500 transactions/s for 50 deployments, more than one "
                         "broker on this 2-core machine keeps up with beside three hosts)")
    ap.add_argument("--down-seconds", type=float, default=3)
    ap.add_argument("--settle-seconds", type=float, default=10)
    ap.add_argument("--drain-wait", type=float, default=120, help="s to wait for a host's exit after SIGTERM")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--deploy-timeout", type=int, default=180)
    ap.add_argument("--results", default=str(REPO / "bench/results"))
    ap.add_argument("--context", default="")
    ap.add_argument("--suffix", default="")
    ap.add_argument("--host-arg", action="append", default=[], metavar="ARG")
    # Density's constructor reads these.
    ap.set_defaults(stages=[1], hibernate_after=0)
    args = ap.parse_args()
    check_host_arguments(ap, args)
    if args.old_onceflow and not Path(args.old_onceflow).is_file():
        ap.error(f"--old-onceflow {args.old_onceflow} does not exist")

    def terminate(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        drill = Rolling(args)
    except Failure as e:
        log(f"FAILED: {e}")
        return 1
    raw: dict = {"args": {k: v for k, v in vars(args).items() if k != "context"}, "context": args.context}
    try:
        raw = drill.run_drill()
        raw["failed"] = None
    except Failure as e:
        log(f"FAILED: {e}")
        raw = getattr(drill, "raw", raw)
        raw["failed"] = str(e)
    finally:
        drill.stop_all()
    if raw.get("failed") and "logs" not in raw:
        # What the hosts logged up to the failure, from their complete logs.
        try:
            raw["logs"] = drill.log_findings()
            raw["ownerless"] = drill.ownerless()
        except Exception as e:  # noqa: BLE001 - the report must still be written
            log(f"cannot read the host logs: {e}")
    stem = f"{time.strftime('%Y-%m-%d')}-rolling{('-' + args.suffix) if args.suffix else ''}"
    out = Path(args.results)
    (out / f"{stem}.json").write_text(json.dumps(raw, indent=2) + "\n")
    (out / f"{stem}.md").write_text(report(raw))
    log(f"wrote {out / stem}.md and .json")
    print(report(raw))
    return 0 if raw.get("failed") is None and raw.get("exactness", {}).get("exact") else 1


if __name__ == "__main__":
    sys.exit(main())
