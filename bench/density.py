#!/usr/bin/env python3
"""The density benchmark (bench/README.md, "Density"; issue 43, "Measure
first"): what one `onceflow host` costs per deployment, and how deploys and
latency hold up, as deployments are added to it in stages.

One host, one local broker, one tenant whose quotas admit every stage. Each
deployment is the wallet (`examples/wallet`, exactly_once_v2, 100 ms
commits) on its own 1-partition topics (`density.wNNNN.payments`,
`.balances`, `.audit`, `.payments.dlq`; the host creates its changelog).
First the empty host is measured (the baseline); then, for each stage (the
number of deployments on the host after it: `--stages 10,50,100,250,500`,
`--quick` 10,25):

1. deploy the stage's new deployments one after another with `onceflow
   deploy`; just before each deploy starts, its primer (one payment) is
   sent to its input. **Deploy latency**: from the primer's arrival at the
   broker (~0.1 s before the deploy command starts: the producer's
   acknowledgement and exit) to its audit record being visible to a
   read_committed reader (one `bench-tool await` over the stage's audit
   topics, armed before the first deploy): the deployment was admitted,
   started, joined its group, restored, processed and committed. Its first
   commit is the honest "running": the host's `running` status is set when
   the component is loaded, before the group join, and published every
   2 s;
2. 5 s to settle, then the host's RSS (VmRSS), OS threads, open descriptors
   and broker connections (its ESTABLISHED TCP sockets to the broker port,
   from /proc/<pid>/net/tcp{,6} and its fd inodes); the broker's RSS and
   client connections (its ESTABLISHED sockets on the client port);
3. **idle CPU**: the host's utime+stime over a 20 s window with nothing
   sent (% of one core), then the snapshot again;
4. **produce-to-committed-output**: a trickle of 20 payments to every
   deployment's input (each deployment's in one burst, `--parallel`
   producers at once), measured by one read_committed `bench-tool await`
   over every audit topic, per record: from its arrival at the broker to
   its audit record being visible. A deployment's 20 records go out in one
   batch and commit in one transaction, so the distribution over records
   is that over deployments (each weighed 20).

Latencies count from a record's arrival, not its send: the input topics
stamp records with LogAppendTime, which the host carries to the outputs.
A bench-tool producer takes ~0.5 s (connection, producer id) before its
first record leaves, and records stamped at send would count that.

After the last stage, the **restart** (issue 43, item 4; `--no-restart`
skips it): the host is stopped with SIGTERM (it drains) and started again on
the same registry and state directory; reported: the drain, how long the new
start read the control topics (its log line; the status topic's end says
how many status records the fleet wrote), the time until the admin API
answers and until every deployment is `running` again, then one more
trickle through all of them.

At the end every deployment's audit topic is counted (`bench-tool count`):
exactly one record per payment it was sent (the primer and a trickle per
stage since it was deployed), every payment id once. The "per deployment"
columns are (stage - baseline) / deployments.

Run it through `scripts/bench density`, which starts the broker (and builds
the host unless ONCEFLOW_BIN names one). Standard library only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import REPO, fmt, log  # noqa: E402

TENANT = "density"
STAGES = "10,50,100,250,500"
QUICK_STAGES = "10,25"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Seconds between the last deploy of a stage (or the last trickle record)
# and the verdict that some deployment did not come up (or not output).
SETTLE_SECONDS = 5


class Failure(Exception):
    """A wait that ended without what it waited for: the message names it."""


def percentiles(values: list[float]) -> dict:
    """p50, p99 and max (nearest rank, as bench-tool's)."""
    if not values:
        return {"p50": None, "p99": None, "max": None, "samples": 0}
    s = sorted(values)

    def rank(q: float) -> float:
        return s[min(len(s), max(1, math.ceil(q * len(s)))) - 1]

    return {"p50": rank(0.50), "p99": rank(0.99), "max": s[-1], "samples": len(s)}


# ---- /proc ---------------------------------------------------------------


def proc_status(pid: int) -> dict:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return {"rss_kb": int(fields["VmRSS"].split()[0]), "threads": int(fields["Threads"])}


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    rest = stat[stat.rfind(")") + 2 :].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def socket_inodes(pid: int) -> tuple[int, set[int]]:
    """The process's open descriptors, and the inodes of its sockets."""
    fds, inodes = 0, set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        fds += 1
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return fds, inodes


def established(pid: int, inodes: set[int], port: int, side: str) -> int:
    """ESTABLISHED TCP sockets of `inodes` whose `side` ("local" or
    "remote") port is `port`."""
    n = 0
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "01" or int(f[9]) not in inodes:
                continue
            address = f[1] if side == "local" else f[2]
            if int(address.rsplit(":", 1)[1], 16) == port:
                n += 1
    return n


def thread_kinds(pid: int) -> dict[str, int]:
    """The process's threads by name, digits folded (`rdk:broker1` and
    `rdk:broker2` are one kind), most first."""
    kinds: dict[str, int] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            name = re.sub(r"\d+", "N", Path(f"/proc/{pid}/task/{task}/comm").read_text().strip())
        except OSError:
            continue  # ended meanwhile
        kinds[name] = kinds.get(name, 0) + 1
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def snapshot(host_pid: int, broker_pid: int, broker_port: int) -> dict:
    status = proc_status(host_pid)
    fds, inodes = socket_inodes(host_pid)
    _, broker_inodes = socket_inodes(broker_pid)
    return {
        "rss_mb": round(status["rss_kb"] / 1024, 1),
        "threads": status["threads"],
        "fds": fds,
        "broker_connections": established(host_pid, inodes, broker_port, "remote"),
        "broker_rss_mb": round(proc_status(broker_pid)["rss_kb"] / 1024, 1),
        "broker_client_connections": established(broker_pid, broker_inodes, broker_port, "local"),
        "thread_kinds": thread_kinds(host_pid),
    }


# ---- the run ---------------------------------------------------------------


class Density:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.run_id = time.strftime("%Y%m%d%H%M%S")
        self.work = Path(f"/tmp/onceflow-bench-density-{self.run_id}")
        (self.work / "manifests").mkdir(parents=True)
        self.env = dict(os.environ, ONCEFLOW_BOOTSTRAP=args.bootstrap_servers, RUST_BACKTRACE="0")
        self.token = secrets.token_hex(16)
        self.broker_port = int(args.bootstrap_servers.split(",")[0].rsplit(":", 1)[1])
        pid_file = Path(args.kafka_dir) / "node-1/pid"
        try:
            self.broker_pid = int(pid_file.read_text().strip())
            proc_status(self.broker_pid)
        except (OSError, ValueError) as e:
            raise Failure(f"no running broker found through {pid_file} ({e}): start it with scripts/kafka up") from e
        self.host: subprocess.Popen | None = None
        self.host_log = self.work / "host.log"
        self.children: set[subprocess.Popen] = set()
        # Deployment index -> payments sent to it so far.
        self.sent: dict[int, int] = {}
        self.rounds = 0
        self.raw: dict = {}

    # ---- helpers --------------------------------------------------------

    @staticmethod
    def name(i: int) -> str:
        return f"w{i:04d}"

    def topic(self, i: int, what: str) -> str:
        return f"{TENANT}.{self.name(i)}.{what}"

    def tool(self, *argv: str, timeout: float = 300) -> dict:
        try:
            out = subprocess.run(
                [self.args.bench_tool, *argv], env=self.env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as e:
            said = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            raise Failure(
                f"bench-tool {argv[0]} gave no answer within {timeout:.0f} s (is the broker overloaded?)"
                + (f": {said.strip()[-2000:]}" if said.strip() else "")
            ) from None
        if out.returncode != 0:
            raise Failure(f"bench-tool {argv[0]} failed: {out.stderr.strip()[-2000:]}")
        return json.loads(out.stdout)

    def spawn(self, argv: list[str]) -> subprocess.Popen:
        p = subprocess.Popen(argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.children.add(p)
        return p

    def finish(self, p: subprocess.Popen, what: str, timeout: float) -> dict:
        """Waits for a spawned bench-tool (at most `timeout` s) and parses
        its answer."""
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise Failure(f"{what}: no answer within {timeout:.0f} s") from None
        finally:
            self.children.discard(p)
        if p.returncode != 0:
            raise Failure(f"{what}: {err.strip()[-2000:]}")
        return json.loads(out)

    def host_tail(self, lines: int = 20) -> str:
        try:
            text = self.host_log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no host log)"
        return "\n".join(text[-lines:])

    def check_host(self) -> None:
        assert self.host is not None
        if self.host.poll() is not None:
            raise Failure(f"the host (pid {self.host.pid}) exited with code {self.host.returncode}; "
                          f"its last log lines:\n{self.host_tail()}")

    def outwait(self, watcher: subprocess.Popen, timeout: float) -> bool:
        """Waits up to `timeout` s for `watcher` to end, the host alive all
        along; True if it ended, else it is killed and False."""
        deadline = time.time() + timeout
        while watcher.poll() is None and time.time() < deadline:
            self.check_host()
            time.sleep(0.5)
        if watcher.poll() is not None:
            return True
        watcher.kill()
        self.children.discard(watcher)
        return False

    def api(self, path: str) -> dict:
        request = urllib.request.Request(
            f"{self.server}{path}", headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read())

    def statuses(self) -> dict[str, dict]:
        return {d["name"]: d for d in self.api("/v1/deployments")["deployments"]}

    # ---- phases ---------------------------------------------------------

    def start_host(self, fresh: bool = True) -> None:
        """Starts the host (`fresh`: on a broker with no registry yet) and
        waits for its admin API."""
        # A host runs every deployment in the registry: a broker that has one
        # already would measure those too.
        try:
            held = self.tool("count", "--topic", "_onceflow.deployments", "--timeout-secs", "30", timeout=60)
        except Failure as e:
            if "has no partitions" not in str(e):
                raise
            held = {"records": 0}  # no registry topic yet: a fresh broker
        if held["records"] and fresh:
            raise Failure(f"the broker at {self.args.bootstrap_servers} already holds a deployment registry "
                          f"({held['records']} records): the benchmark needs a fresh one (scripts/kafka down --purge)")
        most = max(self.args.stages)
        (self.work / "tenants.toml").write_text(
            f'[[tenant]]\nname = "{TENANT}"\n'
            f'token-sha256 = "{self.hash_token()}"\n'
            f'topic-prefix = "{TENANT}."\n'
            "[tenant.quotas]\n"
            f"deployments = {most}\n"
            f"worker-threads = {most}\n"
            # Each wallet: 1 input partition x limits.memory-mb = 64.
            f"guest-memory-mb = {64 * most}\n"
            f"host-held-mb = {max(1024, 256 * most)}\n"
        )
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.server = f"http://127.0.0.1:{port}"
        argv = [
            self.args.onceflow, "host",
            "--tenants", str(self.work / "tenants.toml"),
            "--listen", f"127.0.0.1:{port}",
            "--bootstrap-servers", self.args.bootstrap_servers,
            "--state-dir", str(self.work / "state"),
            "--host-id", "density",
            f"--hibernate-after-secs={self.args.hibernate_after}",
            *self.args.host_arg,
        ]
        log(f"starting the host: {' '.join(argv)} (log: {self.host_log})")
        self.host = subprocess.Popen(
            argv, env=self.env, stdout=self.host_log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.time() + 90
        while True:
            self.check_host()
            try:
                self.api("/v1/deployments")
                break
            except (urllib.error.URLError, OSError):
                if time.time() > deadline:
                    raise Failure(f"the host's admin API ({self.server}) did not answer within 90 s; "
                                  f"its last log lines:\n{self.host_tail()}") from None
                time.sleep(0.5)
        log(f"host up: pid {self.host.pid}, admin API {self.server}")

    def hash_token(self) -> str:
        out = subprocess.run(
            [self.args.onceflow, "hash-token"], input=self.token, capture_output=True, text=True, check=True
        )
        return out.stdout.strip()

    def stop_host(self) -> None:
        if self.host is None or self.host.poll() is not None:
            return
        log(f"stopping the host (pid {self.host.pid}, SIGTERM)")
        self.host.send_signal(signal.SIGTERM)
        try:
            self.host.wait(timeout=120)
        except subprocess.TimeoutExpired:
            log(f"the host did not stop within 120 s of SIGTERM: SIGKILL (pid {self.host.pid})")
            self.host.kill()
            self.host.wait()

    def control_read(self) -> dict:
        """The host's log line of its start that read the control topics:
        how long it took and where their ends were (`ms`, `deployments`,
        `statuses`, `grants`)."""
        for line in self.host_log.read_text(errors="replace").splitlines():
            if "read the control topics" in line:
                return {k: int(v) for k, v in re.findall(r"\b(ms|deployments|statuses|grants)=(\d+)", line)}
        return {}

    def restart(self, deployed: int) -> dict:
        """Issue 43, item 4: the host stopped (SIGTERM: it drains) and
        started again on the same registry and state directory: the drain,
        the new start's read of the control topics (its log line), the time
        until the admin API answers and until every deployment is running
        again; then a trickle through all of them."""
        assert self.host is not None
        first = self.control_read()
        log(f"restart: stopping the host with {deployed} deployments (SIGTERM: it drains)")
        t0 = time.time()
        self.stop_host()
        drain_s, code = time.time() - t0, self.host.returncode
        self.host_log = self.work / "host-restarted.log"
        t1 = time.time()
        self.start_host(fresh=False)
        api_s = time.time() - t1
        deadline = t1 + self.args.start_timeout
        running = 0
        while time.time() < deadline:
            self.check_host()
            running = sum(1 for d in self.statuses().values() if d["status"] == "running")
            if running >= deployed:
                break
            time.sleep(1)
        back_s = time.time() - t1
        if running < deployed:
            raise Failure(f"restart: {running} of {deployed} deployments running {back_s:.0f} s after the "
                          f"start; the host's last log lines:\n{self.host_tail()}")
        read = self.control_read()
        log(f"restart: drained in {drain_s:.1f} s (exit {code}); the control topics read in {read.get('ms')} ms; "
            f"API after {api_s:.1f} s; {deployed} running after {back_s:.1f} s")
        figures = self.raw["restart"] = {
            "deployments": deployed,
            "drain_s": round(drain_s, 1),
            "exit_code": code,
            "first_start_read": first,
            "control_read": read,
            "api_s": round(api_s, 1),
            "all_running_s": round(back_s, 1),
        }
        self.write()  # kept if the trickle fails
        time.sleep(SETTLE_SECONDS)
        figures["produce_to_output"] = self.trickle("restart")
        return figures

    def hibernating(self) -> int:
        """Deployments whose host says they hibernate."""
        return sum(
            1 for d in self.statuses().values()
            if any(h.get("hibernating") for h in d.get("hosts", []))
        )

    def await_hibernation(self, deployed: int) -> dict:
        """With hibernation on, waits until every deployment hibernates (the
        idle state measured); how long that took and how many did."""
        after = self.args.hibernate_after
        started = time.time()
        deadline = started + after + 120
        asleep = self.hibernating()
        while asleep < deployed and time.time() < deadline:
            self.check_host()
            time.sleep(1)
            asleep = self.hibernating()
        waited = round(time.time() - started, 1)
        log(f"{asleep} of {deployed} deployments hibernating after {waited} s")
        return {"hibernating": asleep, "hibernation_wait_s": waited}

    def measure(self, label: str, deployed: int = 0) -> dict:
        """The snapshot, the idle window, the snapshot again (with
        hibernation on, once every deployment hibernates)."""
        assert self.host is not None
        time.sleep(SETTLE_SECONDS)
        asleep = self.await_hibernation(deployed) if self.args.hibernate_after and deployed else {}
        self.check_host()
        before = snapshot(self.host.pid, self.broker_pid, self.broker_port)
        log(f"{label}: idle for {self.args.idle_seconds} s (CPU)")
        c0, b0, t0 = cpu_seconds(self.host.pid), cpu_seconds(self.broker_pid), time.time()
        time.sleep(self.args.idle_seconds)
        c1, b1, t1 = cpu_seconds(self.host.pid), cpu_seconds(self.broker_pid), time.time()
        self.check_host()
        after = snapshot(self.host.pid, self.broker_pid, self.broker_port)
        return {
            "before_idle": before,
            "after_idle": after,
            "idle_cpu_pct": round(100 * (c1 - c0) / (t1 - t0), 2),
            "broker_idle_cpu_pct": round(100 * (b1 - b0) / (t1 - t0), 2),
            **asleep,
        }

    def manifest(self, i: int) -> Path:
        path = self.work / "manifests" / f"{self.name(i)}.toml"
        path.write_text(
            f'name = "{self.name(i)}"\ntenant = "{TENANT}"\n'
            f'inputs = ["{self.topic(i, "payments")}"]\nstores = ["balances"]\n\n'
            f'[build]\nlanguage = "rust"\nsource = "{REPO / "examples/wallet"}"\n'
            f'component = "{self.args.wallet}"\n\n'
            f'[outputs]\nbalances = "{self.topic(i, "balances")}"\naudit = "{self.topic(i, "audit")}"\n\n'
            '[processing]\nguarantee = "exactly_once_v2"\ncommit-interval-ms = 100\nworker-threads = 1\n\n'
            f'[errors]\npolicy = "dead-letter"\ndead-letter-topic = "{self.topic(i, "payments.dlq")}"\n\n'
            "[limits]\nmemory-mb = 64\nfuel-per-record = 10000000\ntimeout-ms = 5000\n"
        )
        return path

    def deploy_stage(self, stage: int, first: int, last: int) -> dict:
        """Deploys [first, last] one after another; each deploy's latency is
        its primer's, from send to its audit record visible."""
        new = list(range(first, last + 1))
        # Inputs stamp records with their arrival (LogAppendTime), which the
        # host carries to the outputs: latencies count from there, not from
        # a bench-tool producer's start (its connection and producer id take
        # ~0.5 s before the first record leaves).
        for k in range(0, len(new), 100):
            batch = new[k : k + 100]
            self.tool("create-topics", *(f"{self.topic(i, 'payments')}:1" for i in batch),
                      "--config", "message.timestamp.type=LogAppendTime")
            self.tool("create-topics", *(f"{self.topic(i, t)}:1" for i in batch
                                         for t in ("balances", "audit", "payments.dlq")))
        manifests = {i: self.manifest(i) for i in new}
        started_ms = int(time.time() * 1000)
        watcher = self.spawn([
            self.args.bench_tool, "await", "--topics", ",".join(self.topic(i, "audit") for i in new),
            "--expect", str(len(new)), "--latency-from-ms", str(started_ms - 1),
            "--timeout-secs", str(int(self.args.start_timeout + 10 * len(new) + 60)),
            "--pid", str(self.host.pid),
        ])
        time.sleep(2)  # armed: its reader is at the (empty) audit topics
        cli = []
        last_progress = time.time()
        for n, i in enumerate(new, 1):
            self.check_host()
            # The primer lands (its arrival is its timestamp) as its producer
            # finishes, ~0.1 s before the deploy starts.
            self.tool("produce", "--topic", self.topic(i, "payments"), "--kind", "fill", "--count", "1", timeout=60)
            t0 = time.time()
            try:
                out = subprocess.run(
                    [self.args.onceflow, "deploy", str(manifests[i]), "--server", self.server,
                     "--token", self.token, "--output", "json"],
                    env=self.env, capture_output=True, text=True, timeout=self.args.deploy_timeout,
                )
            except subprocess.TimeoutExpired:
                raise Failure(f"onceflow deploy {self.name(i)} did not return within {self.args.deploy_timeout} s; "
                              f"the host's last log lines:\n{self.host_tail()}") from None
            cli.append(time.time() - t0)
            if out.returncode != 0:
                raise Failure(f"onceflow deploy {self.name(i)} failed ({out.returncode}): "
                              f"{out.stderr.strip()[-2000:]}\nthe host's last log lines:\n{self.host_tail()}")
            self.sent[i] = 1
            if n == len(new) or time.time() - last_progress >= 10:
                log(f"stage {stage}: {n} of {len(new)} deployed ({first - 1 + n} on the host), "
                    f"deploy command p50 {percentiles(cli)['p50']:.2f} s")
                last_progress = time.time()
        log(f"stage {stage}: waiting for every new deployment's first commit "
            f"(at most {self.args.start_timeout} s)")
        if not self.outwait(watcher, self.args.start_timeout):
            try:
                st = self.statuses()
                down = [f"{self.name(i)}: {st.get(self.name(i), {}).get('status', 'not listed')}" for i in new
                        if st.get(self.name(i), {}).get("status") != "running"]
            except (urllib.error.URLError, OSError) as e:
                down = [f"(list failed: {e})"]
            raise Failure(
                f"stage {stage}: not every new deployment committed its primer within {self.args.start_timeout} s "
                f"of the last deploy; not running per `list`: {', '.join(down[:40]) or 'none'}; "
                f"the host's last log lines:\n{self.host_tail()}"
            )
        result = self.finish(watcher, f"stage {stage}: awaiting the primers' audit records", 10)
        if result["latency_samples"] != len(new):
            raise Failure(f"stage {stage}: {result['latency_samples']} primer outputs timed, {len(new)} expected")
        return {
            "new": len(new),
            "seconds": round(time.time() - started_ms / 1000, 1),
            "latency_s": {k: (None if result[f"latency_{k}_ms"] is None else result[f"latency_{k}_ms"] / 1000)
                          for k in ("p50", "p99", "max")},
            "cli_s": {k: (round(v, 2) if isinstance(v, float) else v) for k, v in percentiles(cli).items()},
        }

    def trickle(self, stage: int) -> dict:
        """`trickle` payments to every deployment; per record, send to
        visible audit record."""
        deployed = sorted(self.sent)
        expect = sum(self.sent.values()) + self.args.trickle * len(deployed)
        first = 1 + self.args.trickle * self.rounds
        started_ms = int(time.time() * 1000)
        watcher = self.spawn([
            self.args.bench_tool, "await", "--topics", ",".join(self.topic(i, "audit") for i in deployed),
            "--expect", str(expect), "--latency-from-ms", str(started_ms),
            "--timeout-secs", str(int(self.args.output_timeout + len(deployed) + 120)),
            "--pid", str(self.host.pid),
        ])
        time.sleep(3 + len(deployed) / 100)  # armed: its reader has read what is there
        log(f"stage {stage}: {self.args.trickle} payments to each of {len(deployed)} deployments "
            f"({self.args.parallel} producers at once)")

        def send(i: int) -> dict:
            return self.tool("produce", "--topic", self.topic(i, "payments"), "--kind", "fill",
                             "--first", str(first), "--count", str(self.args.trickle), timeout=120)

        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(self.args.parallel) as pool:
            for _ in pool.map(send, deployed):
                pass
        sending = time.time() - t0
        for i in deployed:
            self.sent[i] += self.args.trickle
        self.rounds += 1
        if not self.outwait(watcher, self.args.output_timeout):
            short = [f"{self.name(i)} {c} of {self.sent[i]}" for i, c in self.counts(deployed).items()
                     if c != self.sent[i]]
            raise Failure(
                f"stage {stage}: the trickle's audit records were not all visible {self.args.output_timeout} s "
                f"after the last was sent; deployments short (audit records of payments): "
                f"{', '.join(short[:40]) or 'none (the reader was slow)'}; the host's last log lines:\n{self.host_tail()}"
            )
        result = self.finish(watcher, f"stage {stage}: awaiting the trickle's audit records", 10)
        expected = self.args.trickle * len(deployed)
        if result["latency_samples"] != expected:
            raise Failure(f"stage {stage}: {result['latency_samples']} trickle outputs timed, {expected} expected "
                          f"({result['seen']} audit records seen in all)")
        return {
            "records": expected,
            "sending_seconds": round(sending, 1),
            "latency_ms": {k: result[f"latency_{k}_ms"] for k in ("p50", "p99", "max")},
        }

    def counts(self, deployed: list[int]) -> dict[int, int]:
        return {i: r["records"] for i, r in self.count_all(deployed).items()}

    def count_all(self, deployed: list[int]) -> dict[int, dict]:
        def count(i: int) -> tuple[int, dict]:
            return i, self.tool("count", "--topic", self.topic(i, "audit"), "--timeout-secs", "120", timeout=180)

        with concurrent.futures.ThreadPoolExecutor(self.args.parallel) as pool:
            return dict(pool.map(count, deployed))

    def exactness(self) -> dict:
        deployed = sorted(self.sent)
        log(f"counting the audit topic of each of {len(deployed)} deployments (read_committed)")
        counted = self.count_all(deployed)
        wrong = [
            f"{self.name(i)}: {c['records']} records, {c['distinct_keys']} payment ids, {self.sent[i]} payments"
            for i, c in counted.items()
            if not (c["records"] == c["distinct_keys"] == self.sent[i])
        ]
        return {
            "deployments": len(deployed),
            "payments": sum(self.sent.values()),
            "audit_records": sum(c["records"] for c in counted.values()),
            "exact": not wrong,
            "not_exact": wrong,
        }

    def host_log_findings(self) -> dict:
        lines = []
        for path in sorted(self.work.glob("host*.log")):  # the first start's and the restart's
            lines += path.read_text(errors="replace").splitlines()
        if not lines:
            return {}
        found: dict[str, dict[str, int]] = {"WARN": {}, "ERROR": {}}
        for line in lines:
            m = re.match(r"\S+\s+(WARN|ERROR)\s+(.*)", line)
            if m:
                # One entry per message shape: numbers and names vary.
                shape = re.sub(r"\d+", "N", m.group(2))[:200]
                found[m.group(1)][shape] = found[m.group(1)].get(shape, 0) + 1
        return {
            "lines": len(lines),
            "warnings": sum(found["WARN"].values()),
            "errors": sum(found["ERROR"].values()),
            "kinds": {level: sorted(((n, s) for s, n in shapes.items()), reverse=True)[:10]
                      for level, shapes in found.items()},
        }

    def run(self) -> dict:
        t_start = time.time()
        raw = self.raw = {
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "context": self.args.context,
            "host_args": self.args.host_arg,
            "stages_asked": self.args.stages,
            "trickle": self.args.trickle,
            "idle_seconds": self.args.idle_seconds,
            "hibernate_after": self.args.hibernate_after,
            "onceflow": self.args.onceflow,
            "work": str(self.work),
            "stages": [],
            "failed": None,
        }
        try:
            self.start_host()
            log("the empty host: baseline")
            raw["baseline"] = self.measure("baseline")
            self.write()
            done = 0
            for stage, target in enumerate(self.args.stages, 1):
                log(f"stage {stage} of {len(self.args.stages)}: {done} -> {target} deployments")
                deploy = self.deploy_stage(stage, done + 1, target)
                done = target
                figures = self.measure(f"stage {stage}", target)
                control = self.control_latencies()
                output = self.trickle(stage)
                row = {"deployments": target, "deploy": deploy, **figures, "control_ms": control,
                       "produce_to_output": output}
                raw["stages"].append(row)
                self.write()
                h = figures["after_idle"]
                log(f"stage {stage}: {target} deployments, RSS {h['rss_mb']:.0f} MB, {h['threads']} threads, "
                    f"{h['fds']} descriptors, {h['broker_connections']} broker connections, idle CPU "
                    f"{figures['idle_cpu_pct']:.1f}%, deploy p50 {deploy['latency_s']['p50']:.2f} s, "
                    f"produce-to-output p50 {output['latency_ms']['p50']} ms")
            if self.args.restart and self.args.stages:
                raw["restart"] = self.restart(self.args.stages[-1])
                self.write()
            raw["exactness"] = self.exactness()
            log(f"exactly once: {'yes' if raw['exactness']['exact'] else 'NO'} "
                f"({raw['exactness']['audit_records']:,} audit records of {raw['exactness']['payments']:,} payments)")
        except Failure as e:
            raw["failed"] = str(e)
            log(f"FAILED: {e}")
        finally:
            for p in list(self.children):
                if p.poll() is None:
                    p.kill()
            try:
                if self.host is not None and self.host.poll() is None:
                    raw["statuses"] = {s: n for s, n in self.status_counts().items()}
            except (urllib.error.URLError, OSError):
                pass
            self.stop_host()
            raw["host_log"] = self.host_log_findings()
            raw["seconds"] = round(time.time() - t_start)
            self.write()
        return raw

    def control_latencies(self, rounds: int = 5) -> dict:
        """The control plane at this size (issue 43, item 4): `list`,
        `describe` of the first deployment and `usage` of the last minute,
        each asked `rounds` times of the admin API; ms, p50 and max."""
        def timed(path: str) -> float:
            t0 = time.perf_counter()
            self.api(path)
            return (time.perf_counter() - t0) * 1000
        since = int(time.time() * 1000) - 60_000
        out = {}
        for what, path in (("list", "/v1/deployments"), ("describe", f"/v1/deployments/{self.name(1)}"),
                           ("usage", f"/v1/usage?since_ms={since}")):
            samples = [timed(path) for _ in range(rounds)]
            p = percentiles(samples)
            out[what] = {"p50": round(p["p50"], 1), "max": round(p["max"], 1)}
        return out

    def status_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for d in self.statuses().values():
            counts[d["status"]] = counts.get(d["status"], 0) + 1
        return counts

    # ---- the report -----------------------------------------------------

    def write(self) -> None:
        day = time.strftime("%Y-%m-%d")
        out = Path(self.args.results)
        out.mkdir(parents=True, exist_ok=True)
        stem = f"{day}-density{'-quick' if self.args.quick else ''}{'-' + self.args.suffix if self.args.suffix else ''}"
        (out / f"{stem}.json").write_text(json.dumps(self.raw, indent=2) + "\n")
        (out / f"{stem}.md").write_text(report(self.raw))
        self.paths = (out / f"{stem}.md", out / f"{stem}.json")


def report(raw: dict) -> str:
    lines = [
        f"# Density, {raw['date']}",
        "",
        f"One `onceflow host`, one local broker, wallets (exactly_once_v2, 100 ms commits) each on its own "
        f"1-partition topics, deployed in stages (`scripts/bench density`, bench/density.py). {raw['context']}"
        + (f" Host arguments: `{' '.join(raw['host_args'])}`." if raw.get("host_args") else ""),
        "",
        "Host columns: VmRSS, OS threads, open descriptors, ESTABLISHED TCP connections to the broker; "
        "\"per dep.\" is (stage - empty host) / deployments. Idle CPU: the host's utime+stime over "
        f"{raw['idle_seconds']} s with nothing sent"
        + (f", once every deployment hibernated (`--hibernate-after-secs={raw['hibernate_after']}`)"
           if raw.get("hibernate_after") else ", no hibernation (`--hibernate-after-secs=0`)")
        + ". Deploy: from `onceflow deploy` starting (its primer payment "
        "landed ~0.1 s before) to the primer's audit record visible read_committed (the first commit). "
        f"Produce-to-output: {raw['trickle']} payments to every deployment after the stage (each deployment's in "
        "one burst), per record, from its arrival at the broker (LogAppendTime) to its audit record visible "
        "read_committed. Broker: its RSS / its ESTABLISHED client connections.",
        "",
        "| deployments | host RSS, MB | per dep., MB | threads | per dep. | descriptors | per dep. | "
        "broker connections | per dep. | idle CPU, % of a core | deploy p50 / p99 / max, s | "
        "produce-to-output p50 / p99 / max, ms | broker RSS, MB / connections |",
        "|" + "---:|" * 13,
    ]
    base = raw.get("baseline")
    if base:
        b = base["after_idle"]
        lines.append(
            f"| 0 (empty host) | {b['rss_mb']:,.0f} | – | {b['threads']} | – | {b['fds']} | – | "
            f"{b['broker_connections']} | – | {base['idle_cpu_pct']:.1f} | – | – | "
            f"{b['broker_rss_mb']:,.0f} / {b['broker_client_connections']} |"
        )
    for s in raw["stages"]:
        h, n = s["after_idle"], s["deployments"]
        b = base["after_idle"]
        d, o = s["deploy"]["latency_s"], s["produce_to_output"]["latency_ms"]
        lines.append(
            f"| {n} | {h['rss_mb']:,.0f} | {(h['rss_mb'] - b['rss_mb']) / n:.2f} | {h['threads']} | "
            f"{(h['threads'] - b['threads']) / n:.1f} | {h['fds']} | {(h['fds'] - b['fds']) / n:.1f} | "
            f"{h['broker_connections']} | {(h['broker_connections'] - b['broker_connections']) / n:.1f} | "
            f"{s['idle_cpu_pct']:.1f} | {fmt(d['p50'], '.2f')} / {fmt(d['p99'], '.2f')} / {fmt(d['max'], '.2f')} | "
            f"{fmt(o['p50'], ',')} / {fmt(o['p99'], ',')} / {fmt(o['max'], ',')} | "
            f"{h['broker_rss_mb']:,.0f} / {h['broker_client_connections']} |"
        )
    lines.append("")
    for s in raw["stages"]:
        d = s["deploy"]
        lines.append(
            f"- {s['deployments']} deployments: {d['new']} deployed in {d['seconds']:.0f} s "
            f"(`onceflow deploy` itself p50 {fmt(d['cli_s']['p50'], '.2f')} s, max {fmt(d['cli_s']['max'], '.2f')} s); "
            + (f"{s['hibernating']} of {s['deployments']} hibernating {s['hibernation_wait_s']:.0f} s after the "
               "stage (the trickle wakes them); " if "hibernating" in s else "")
            + f"the trickle sent in {s['produce_to_output']['sending_seconds']:.0f} s; broker idle CPU "
            f"{s['broker_idle_cpu_pct']:.1f}%; host RSS before the idle window {s['before_idle']['rss_mb']:,.0f} MB"
            + ("; " + ", ".join(f"`{k}` p50 {v['p50']:,.0f} ms (max {v['max']:,.0f})"
                                for k, v in s["control_ms"].items()) if s.get("control_ms") else "")
            + "."
        )
    if raw["stages"] and base:
        last, b = raw["stages"][-1], base["after_idle"]
        n, kinds = last["deployments"], last["after_idle"].get("thread_kinds", {})
        per = sorted(((c - b.get("thread_kinds", {}).get(k, 0)) / n, k) for k, c in kinds.items())[::-1]
        named = ", ".join(f"`{k}` {v:.1f}" for v, k in per if v > 0.05)
        if named:
            lines.append(f"- The host's threads per deployment at {n}, by name: {named}.")
    r = raw.get("restart")
    if r:
        read, first = r["control_read"], r.get("first_start_read", {})
        out = r.get("produce_to_output")
        lines.append(
            f"- Restart at {r['deployments']} (issue 43, item 4): SIGTERM drained the host in {r['drain_s']:.1f} s "
            f"(exit {r['exit_code']}); the new start read the control topics in {fmt(read.get('ms'), ',')} ms "
            f"(their ends: deployments {fmt(read.get('deployments'), ',')}, statuses {fmt(read.get('statuses'), ',')}, "
            f"grants {fmt(read.get('grants'), ',')}; the first start read them in {fmt(first.get('ms'), ',')} ms); "
            f"the admin API answered {r['api_s']:.1f} s after the start, every deployment was running after "
            f"{r['all_running_s']:.1f} s"
            + (f"; then {out['records']:,} payments, produce-to-output p50 / p99 / max "
               f"{fmt(out['latency_ms']['p50'], ',')} / {fmt(out['latency_ms']['p99'], ',')} / "
               f"{fmt(out['latency_ms']['max'], ',')} ms." if out else "; the trickle after it did not finish.")
        )
    ex = raw.get("exactness")
    if ex:
        lines.append(
            f"- Exactly once: {'every' if ex['exact'] else 'NOT every'} deployment's audit topic holds each payment "
            f"sent to it once ({ex['audit_records']:,} audit records, {ex['payments']:,} payments, "
            f"{ex['deployments']} deployments)" + ("." if ex["exact"] else f": {'; '.join(ex['not_exact'][:20])}.")
        )
    hl = raw.get("host_log")
    if hl:
        kinds = "; ".join(f"{n}x {level} {shape}" for level in ("ERROR", "WARN")
                          for n, shape in hl["kinds"].get(level, [])[:3])
        lines.append(f"- Host log: {hl['lines']:,} lines, {hl['warnings']} warnings, {hl['errors']} errors"
                     + (f" ({kinds})." if kinds else "."))
    if raw.get("failed"):
        lines += ["", "**Failed:**", "", "```", raw["failed"], "```"]
    if raw.get("seconds") is not None:
        lines.append(f"- The run took {raw['seconds'] / 60:.1f} minutes.")
    return "\n".join(lines) + "\n"


def host_arguments(ap: argparse.ArgumentParser) -> None:
    """The arguments every one-host benchmark takes (density, query): the
    broker, the binaries, the wallet's component, the broker's run dir."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", Path.home() / ".cache/onceflow/target")) / "debug"
    ap.add_argument("--bootstrap-servers", required=True)
    ap.add_argument("--onceflow", default=os.environ.get("ONCEFLOW_BIN", str(target / "onceflow")),
                    help="the host binary (default: ONCEFLOW_BIN, else the dev build)")
    ap.add_argument("--bench-tool", default=os.environ.get("ONCEFLOW_BENCH_TOOL", str(target / "bench-tool")),
                    help="bench-tool (default: ONCEFLOW_BENCH_TOOL, else the dev build)")
    ap.add_argument("--wallet", default=str(REPO / "examples/wallet/target/onceflow/wallet.wasm"),
                    help="the wallet's component (`onceflow build examples/wallet`)")
    ap.add_argument("--kafka-dir", default=os.environ.get("ONCEFLOW_KAFKA_DIR", ""),
                    help="scripts/kafka's run dir (the broker's pid; default: ONCEFLOW_KAFKA_DIR)")


def check_host_arguments(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.kafka_dir:
        ap.error("--kafka-dir (or ONCEFLOW_KAFKA_DIR) is needed: the broker's pid is in its node-1/pid")
    for what, path in (("the host (--onceflow, ONCEFLOW_BIN)", args.onceflow),
                       ("bench-tool (--bench-tool, ONCEFLOW_BENCH_TOOL)", args.bench_tool),
                       ("the wallet's component (--wallet)", args.wallet)):
        if not Path(path).is_file():
            ap.error(f"{what}: {path} does not exist")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    host_arguments(ap)
    ap.add_argument("--stages", default=None, help=f"deployments on the host after each stage (default {STAGES})")
    ap.add_argument("--quick", action="store_true", help=f"stages {QUICK_STAGES}")
    ap.add_argument("--trickle", type=int, default=20, help="payments to each deployment after each stage")
    ap.add_argument("--idle-seconds", type=int, default=20)
    ap.add_argument("--no-restart", dest="restart", action="store_false",
                    help="skip the restart after the last stage (drain, re-read of the control topics, back up)")
    ap.add_argument("--hibernate-after", type=int, default=10, metavar="S",
                    help="the host's --hibernate-after-secs; the idle window is measured once every deployment "
                         "hibernates (0: never, the host as before hibernation; default 10)")
    ap.add_argument("--parallel", type=int, default=4, help="bench-tool producers (and counters) at once")
    ap.add_argument("--deploy-timeout", type=int, default=180, help="s for one `onceflow deploy` to return")
    ap.add_argument("--start-timeout", type=int, default=300,
                    help="s after a stage's last deploy for every new deployment's first commit")
    ap.add_argument("--output-timeout", type=int, default=180,
                    help="s after the last trickle payment is sent for every audit record")
    ap.add_argument("--results", default=str(REPO / "bench/results"))
    ap.add_argument("--context", default="")
    ap.add_argument("--suffix", default="", help="added to the results' file names (an experiment's name)")
    ap.add_argument("--host-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for `onceflow host` (repeatable; e.g. --host-arg=-Xfetch.wait.max.ms=500 "
                         "to measure a librdkafka setting); written into the report")
    args = ap.parse_args()
    spec = args.stages or (QUICK_STAGES if args.quick else STAGES)
    try:
        args.stages = [int(s) for s in spec.split(",")]
    except ValueError:
        ap.error(f"--stages {spec!r}: expected increasing numbers, e.g. {STAGES}")
    if any(b <= a for a, b in zip([0] + args.stages, args.stages)):
        ap.error(f"--stages {spec!r}: expected increasing numbers above 0, e.g. {STAGES}")
    check_host_arguments(ap, args)

    def terminate(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        run = Density(args)
    except Failure as e:
        log(f"FAILED: {e}")
        return 1
    raw = run.run()
    log(f"wrote {run.paths[0]} and {run.paths[1]} ({raw['seconds'] / 60:.1f} minutes)")
    ok = raw["failed"] is None and raw.get("exactness", {}).get("exact", False)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
