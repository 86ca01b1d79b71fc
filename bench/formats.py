#!/usr/bin/env python3
"""The formats benchmark (`scripts/bench formats`): the wallet on JSON payments against the same wallet component on
Avro and on Protobuf payments (docs/formats.md), on one broker with a real schema registry (scripts/registry), under exactly_once_v2.

For each round and format: fresh topics, the same N payments produced before the host starts (bench-tool produce
--kind payments; Avro: each valid payment in the registry's wire format), `onceflow run` started, and bench-tool await
measures input records/s as the group commits them and the host's CPU seconds over that window; then the run is
checked exact (`onceflow verify`, with the registry for Avro). The rounds alternate JSON and Avro; the median is
reported. Writes bench/results/<date>-formats.{md,json}.

Environment: ONCEFLOW_BIN, ONCEFLOW_BENCH_TOOL (set by scripts/bench). Arguments: --payments N (default 200000),
--partitions P (default 2), --rounds R (default 3), --formats (default json,avro,protobuf; Kafka Streams runs json
and avro: no Protobuf twin).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("ONCEFLOW_CACHE", Path.home() / ".cache/onceflow"))
REGISTRY_PORT = int(os.environ.get("ONCEFLOW_BENCH_REGISTRY_PORT", "18781"))
REGISTRY_DIR = CACHE / "registry-bench"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def registry(*args: str) -> str:
    env = dict(os.environ, ONCEFLOW_REGISTRY_PORT=str(REGISTRY_PORT), ONCEFLOW_REGISTRY_DIR=str(REGISTRY_DIR))
    out = subprocess.run([str(ROOT / "scripts/registry"), *args], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"scripts/registry {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout.strip()


def register(url: str, subject: str, schema: str, kind: str = "AVRO") -> int:
    body = json.dumps({"schema": schema, "schemaType": kind}).encode()
    req = urllib.request.Request(
        f"{url}/subjects/{subject}/versions",
        data=body,
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)["id"]


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.onceflow = os.environ["ONCEFLOW_BIN"]
        self.tool_bin = os.environ["ONCEFLOW_BENCH_TOOL"]
        self.bootstrap = args.bootstrap_servers
        self.work = Path(tempfile.mkdtemp(prefix="onceflow-formats-"))
        self.run_id = time.strftime("%H%M%S")
        self.url = ""
        self.kstreams_cp = ""

    def tool(self, *argv: str, timeout: float = 1200) -> dict:
        out = subprocess.run(
            [self.tool_bin, "--bootstrap-servers", self.bootstrap, *argv], capture_output=True, text=True, timeout=timeout
        )
        if out.returncode != 0:
            raise RuntimeError(f"bench-tool {argv[0]}: {out.stderr.strip()[:2000]}")
        return json.loads(out.stdout)

    def manifest(self, fmt: str, name: str, t: dict) -> Path:
        """The wallet example's component with this run's topics; Avro: the formats of examples/wallet-avro."""
        d = self.work / name
        (d / "schemas").mkdir(parents=True)
        component = ROOT / "examples/wallet/target/onceflow/wallet.wasm"
        if fmt in ("avro", "protobuf"):
            ext = "avsc" if fmt == "avro" else "proto"
            for f in (f"payment.{ext}", f"balance.{ext}"):
                shutil.copy(ROOT / "examples/wallet-avro/schemas" / f, d / "schemas" / f)
            inputs = f'[{{ topic = "{t["payments"]}", format = "{fmt}", schema = "schemas/payment.{ext}" }}]'
            balances = f'{{ topic = "{t["balances"]}", format = "{fmt}", schema = "schemas/balance.{ext}" }}'
            audit = f'{{ topic = "{t["audit"]}", format = "{fmt}", schema = "schemas/payment.{ext}" }}'
        else:
            inputs = json.dumps([t["payments"]])
            balances = json.dumps(t["balances"])
            audit = json.dumps(t["audit"])
        (d / "onceflow.toml").write_text(
            f"""name = "{name}"
tenant = "bench"
inputs = {inputs}
stores = ["balances"]

[build]
language = "rust"
component = "{component}"

[outputs]
balances = {balances}
audit = {audit}

[processing]
guarantee = "exactly_once_v2"
commit-interval-ms = 100
replay-window-hours = {self.args.replay_window_hours}

[errors]
policy = "dead-letter"
dead-letter-topic = "{t["dlq"]}"
"""
        )
        return d / "onceflow.toml"

    def run(self, system: str, fmt: str, round_: int) -> dict:
        tag = "of" if system == "onceflow" else "ks"
        name = f"fmt-{tag}-{fmt}-{round_}-{self.run_id}"
        t = {k: f"{name}-{k}" for k in ("payments", "balances", "audit")}
        t["dlq"] = f"{name}-dlq"
        p = self.args.partitions
        self.tool("create-topics", f"{t['payments']}:{p}", f"{t['balances']}:{p}", f"{t['audit']}:{p}", f"{t['dlq']}:1")
        produce = ["produce", "--topic", t["payments"], "--kind", "payments", "--count", str(self.args.payments)]
        if fmt == "avro":
            schema = (ROOT / "examples/wallet-avro/schemas/payment.avsc").read_text()
            produce += ["--avro-schema-id", str(register(self.url, f"{t['payments']}-value", schema))]
        if fmt == "protobuf":
            schema = (ROOT / "examples/wallet-avro/schemas/payment.proto").read_text()
            produce += ["--proto-schema-id", str(register(self.url, f"{t['payments']}-value", schema, "PROTOBUF"))]
        produced = self.tool(*produce)
        registry_args = ["--schema-registry", self.url] if fmt != "json" else []
        log_file = open(self.work / f"{name}.log", "w")
        if system == "onceflow":
            manifest = self.manifest(fmt, name, t)
            group = f"bench.{name}"
            argv = [
                self.onceflow, "run", str(manifest), "--bootstrap-servers", self.bootstrap,
                "--state-dir", str(manifest.parent / "state"), "--instance-id", "i0",
                "--report-interval-ms", "2000", *registry_args,
            ]
        else:
            # bench/kstreams-wallet: KStreamsWallet (JSON) and KStreamsAvroWallet
            # (Apicurio's Avro serde, bench/kstreams-avro.md).
            group = name
            main_class = "KStreamsAvroWallet" if fmt == "avro" else "KStreamsWallet"
            argv = [
                "java", "-Xms256m", "-Xmx1g", "-cp", self.kstreams_cp, f"dev.onceflow.bench.{main_class}",
                self.bootstrap, name, t["payments"], t["balances"], t["audit"], t["dlq"],
                "exactly_once_v2", "100", str(self.work / name / "ks-state"),
                *([self.url] if fmt == "avro" else []),
            ]
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            measured = self.tool(
                "await", "--topics", t["audit"], "--expect", str(produced["expected_outputs"]),
                "--pid", str(proc.pid), "--timeout-secs", "900",
                "--input-topic", t["payments"], "--group", group,
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        verify = subprocess.run(
            [
                self.onceflow, "verify", "--bootstrap-servers", self.bootstrap, "--input", t["payments"],
                "--echo", t["audit"], "--totals", t["balances"], "--dead-letter", t["dlq"], "--output", "json",
                *registry_args,
            ],
            capture_output=True, text=True,
        )
        report = json.loads(verify.stdout) if verify.stdout.strip() else {}
        exact = verify.returncode == 0 and not report.get("findings")
        if not exact:
            raise RuntimeError(f"{name} is not exact: {verify.stdout[:2000]} {verify.stderr[:2000]}")
        self.tool("delete-topics", *t.values())
        cpu = measured.get("cpu_seconds") or 0.0
        counted = measured.get("counted") or 0
        result = {
            "system": system,
            "format": fmt,
            "round": round_,
            "payments": self.args.payments,
            "invalid": produced.get("invalid"),
            "records_per_s": measured["throughput"],
            "cpu_seconds": cpu,
            "cpu_us_per_record": cpu / counted * 1e6 if counted else None,
            "counted": counted,
            "peak_rss_bytes": measured.get("peak_rss_bytes"),
            "exact": exact,
            "verify": {k: report.get(k) for k in ("inputs", "valid", "invalid", "echo_records", "dead_letters")},
        }
        log(
            f"  {system} {fmt} round {round_ + 1}: {result['records_per_s']:,.0f} records/s, "
            f"{result['cpu_us_per_record'] or 0:.1f} CPU µs/record, exact"
        )
        return result


def median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[(len(s) - 1) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap-servers", required=True)
    ap.add_argument("--context", default="")
    ap.add_argument("--payments", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-kstreams", action="store_true", help="only Onceflow (no Kafka Streams twins)")
    ap.add_argument("--formats", default="json,avro,protobuf", help="of json, avro, protobuf (JSON is the baseline)")
    ap.add_argument(
        "--replay-window-hours",
        type=int,
        default=168,
        help="the manifest's processing.replay-window-hours (0: no replay records; docs/replay.md)",
    )
    ap.add_argument("--out", default=str(ROOT / "bench/results" / f"{time.strftime('%Y-%m-%d')}-formats"))
    args = ap.parse_args()
    b = Bench(args)
    formats = [f for f in args.formats.split(",") if f]
    if "json" not in formats or not set(formats) <= {"json", "avro", "protobuf"}:
        ap.error("--formats: json (the baseline) and any of avro, protobuf")
    systems = ["onceflow"] if args.no_kstreams else ["onceflow", "kstreams"]
    if "kstreams" in systems:
        log("== building the Kafka Streams twins (bench/kstreams-wallet, Maven)")
        twin = ROOT / "bench/kstreams-wallet"
        subprocess.run(
            ["mvn", "-q", "-B", "-Dstyle.color=never", "compile", "dependency:copy-dependencies"],
            cwd=twin, check=True, stdout=subprocess.DEVNULL,
        )
        b.kstreams_cp = f"{twin}/target/classes:{twin}/target/lib/*"
    log(f"== starting the schema registry on 127.0.0.1:{REGISTRY_PORT} ({REGISTRY_DIR})")
    b.url = registry("up")
    try:
        results = []
        for r in range(args.rounds):
            for system in systems:
                for fmt in formats:
                    if system == "kstreams" and fmt == "protobuf":
                        continue
                    results.append(b.run(system, fmt, r))
    finally:
        registry("down", "--purge")
    summary = {}
    for system in systems:
        for fmt in formats:
            rs = [x for x in results if x["format"] == fmt and x["system"] == system]
            if not rs:
                continue
            summary[f"{system}-{fmt}"] = {
                "records_per_s": median([x["records_per_s"] for x in rs]),
                "cpu_us_per_record": median([x["cpu_us_per_record"] for x in rs]),
            }
    out = Path(args.out)
    out.with_suffix(".json").write_text(
        json.dumps({"context": args.context, "args": vars(args), "summary": summary, "runs": results}, indent=2) + "\n"
    )
    lines = [
        "# Formats: the wallet on JSON against the wallet on Avro and Protobuf",
        "",
        f"{args.context}",
        "",
        f"`scripts/bench formats --payments {args.payments} --partitions {args.partitions} --rounds {args.rounds}`: "
        "the same wallet component (examples/wallet), exactly_once_v2, commit interval 100 ms, the payments produced "
        "before the host starts; Avro: the host decodes each payment from the registry's wire format (schema fetched "
        "once from Apicurio Registry, scripts/registry) and writes balances and audit copies in Avro "
        "(examples/wallet-avro's schemas); Protobuf the same with payment.proto and balance.proto. Input records/s as the group commits them; CPU of the `onceflow run` "
        "process over the same window. Median of the rounds; every run checked exact by `onceflow verify`.",
        "",
        (
            "Kafka Streams 4.4 runs the twins of bench/kstreams-wallet on the same topics' shape: KStreamsWallet (JSON) "
            "and KStreamsAvroWallet (Apicurio's Avro serde for Kafka 3.1.7, `apicurio-registry-avro-serde-kafka`, "
            "against the same registry; bench/kstreams-avro.md), one stream thread, the same commit interval; its CPU "
            "is the JVM's; it has no Protobuf twin."
            if "kstreams" in systems
            else "Onceflow only (--no-kstreams): the Kafka Streams twins' figures are in bench/results/2026-12-07-formats.md."
        ),
        "",
        "| system | format | input records/s | CPU µs per record | / JSON records/s | / JSON CPU |",
        "|---|---|---:|---:|---:|---:|",
    ]
    names = {"json": "JSON", "avro": "Avro", "protobuf": "Protobuf"}
    for system in systems:
        j = summary[f"{system}-json"]
        for fmt in formats:
            s = summary.get(f"{system}-{fmt}")
            if s is None:
                continue
            ratio = (
                f"{s['records_per_s'] / j['records_per_s']:.2f} | {s['cpu_us_per_record'] / j['cpu_us_per_record']:.2f}"
                if fmt != "json"
                else " | "
            )
            lines.append(
                f"| {'Onceflow' if system == 'onceflow' else 'Kafka Streams'} | {names[fmt]} | "
                f"{s['records_per_s']:,.0f} | {s['cpu_us_per_record']:.1f} | {ratio} |"
            )
    lines += [
        "",
        "Every run:",
        "",
        "| system | format | round | records/s | CPU µs/record | exact |",
        "|---|---|---:|---:|---:|---|",
    ]
    for x in results:
        lines.append(
            f"| {x['system']} | {x['format']} | {x['round'] + 1} | {x['records_per_s']:,.0f} | {x['cpu_us_per_record']:.1f} | "
            f"{'yes' if x['exact'] else 'no'} ({x['verify']['valid']} valid, {x['verify']['dead_letters']} dead letters) |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
