"""The wasi-probe test guest (see ../wasi-probe) in Python: componentize-py
links CPython against 25 WASI interfaces, wasi:sockets and wasi:filesystem
among them; this guest tries them and reports what happened. The record's
value names the probe, its key carries the port for `tcp`; the result is
emitted to alias `out`."""

import encodings.idna  # noqa: F401 - socket host names go through it
import json
import os
import socket
import sys
import time

import onceflow


def tcp(port):
    # A numeric address: no name lookup, straight to wasi:sockets/tcp.
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(1)
        s.connect(("127.0.0.1", int(port)))
        return f"connected to 127.0.0.1:{port} from {s.getsockname()}"
    except Exception as e:  # noqa: BLE001 - every failure is the answer
        return f"error: connect to 127.0.0.1:{port}: {type(e).__name__}: {e}"


def udp():
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        sent = s.sendto(b"probe", s.getsockname())
        return f"bound, sent {sent} bytes"
    except Exception as e:  # noqa: BLE001
        return f"error: udp: {type(e).__name__}: {e}"


def dns():
    try:
        return f"resolved localhost to {socket.getaddrinfo('localhost', 80)}"
    except Exception as e:  # noqa: BLE001
        return f"error: resolve localhost: {type(e).__name__}: {e}"


def file():
    try:
        with open("/etc/passwd", "rb") as f:
            return f"read {len(f.read())} bytes from /etc/passwd"
    except Exception as e:  # noqa: BLE001
        return f"error: read /etc/passwd: {type(e).__name__}: {e}"


def listing(path):
    try:
        return f"{len(os.listdir(path))} entries {os.listdir(path)}"
    except Exception as e:  # noqa: BLE001
        return f"error: {type(e).__name__}: {e}"


def probe(name, key):
    if name == "tcp":
        return tcp(key)
    if name == "udp":
        return udp()
    if name == "dns":
        return dns()
    if name == "file":
        return file()
    if name == "dir":
        return f"/: {listing('/')}; .: {listing('.')}"
    if name == "env":
        return f"env={len(os.environ)} args={len(sys.argv)}"
    if name == "clock":
        return str(time.time_ns() // 1_000_000)
    if name == "random":
        return os.urandom(16).hex()
    if name == "stdout":
        print("probe stdout line", flush=True)
        print("probe stderr line", file=sys.stderr, flush=True)
        return "printed"
    return "unknown probe"


def process(ctx, record):
    name = (record.value or b"").decode("utf-8", errors="replace")
    if name.startswith("{") or name == "not json":
        # The SDK's JSON reader (docs/languages.md), not a probe of WASI.
        try:
            result = json.dumps(record.value_json(), sort_keys=True, separators=(",", ":"))
        except onceflow.Error as e:
            result = f"error: {e.message}"
        ctx.emit("out", "json", result)
        return
    key = (record.key or b"").decode("utf-8", errors="replace")
    ctx.emit("out", name, probe(name, key))


WitWorld = onceflow.export(process)
