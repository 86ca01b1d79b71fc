#!/usr/bin/env python3
"""Page views for the pageviews conformance check: `onceflow test` input
(JSON Lines) on which every pageviews port must print exactly what the Rust
one prints.

Many pages (and pages whose names need JSON escaping: quotes, backslashes,
control characters, NUL, a BOM, non-ASCII, the empty page), views mostly
moving forward in time, some out of order within the grace, some late
(dead-lettered), jumps of several windows, one jump far into the future
that closes everything of its partition, a burst of views of --burst
distinct pages within one second (so that more windows close at once than
one page of `fetch-all` holds), and records every port must reject
the same way: no key, keys that are not UTF-8, no timestamp (0), negative
timestamps. Deterministic for a given --seed.

    gen_input.py [--lines N] [--seed S] [--pages P] [--burst B] > views.jsonl
"""

import argparse
import base64
import json
import random

BASE = 1_700_000_040_000  # a minute boundary

SPECIAL_PAGES = [
    '/a"quote',
    "/back\\slash",
    "/tab\there",
    "/new\nline",
    "/nul\u0000byte",
    "/unit\u001fsep",
    "/del\u007f",
    "/caf\u00e9",
    "/\u65e5\u672c",
    "/emoji\U0001F600",
    "\ufeff/bom",
    "",
    "/</script>",
]

# Keys every port must reject as not UTF-8 text (as Rust's from_utf8 does).
BAD_KEYS = [
    b"\xff",
    b"/lone\xed\xa0\x80surrogate",
    b"/overlong\xc0\xaf",
    b"/beyond\xf4\x90\x80\x80",
    b"/truncated\xe2\x82",
    b"\x80",
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pages", type=int, default=300)
    parser.add_argument("--burst", type=int, default=300)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    pages = [f"/page-{i}" for i in range(args.pages)] + SPECIAL_PAGES
    now = BASE
    jump_at = int(args.lines * 0.97)
    burst_at = args.lines // 3
    burst = range(burst_at, burst_at + args.burst) if args.burst * 2 <= args.lines else range(0)
    for n in range(args.lines):
        line = {"topic": "pageviews"}
        if n in burst:
            line["key"] = f"/burst-{n - burst_at}"
            line["value"] = "{}"
            line["timestamp"] = now + (n - burst_at) % 1000
            print(json.dumps(line, ensure_ascii=False))
            continue
        r = rng.random()
        if r < 0.01:
            pass  # no key: "record has no key"
        elif r < 0.02:
            line["key_base64"] = base64.b64encode(rng.choice(BAD_KEYS)).decode()
        elif r < 0.08:
            line["key"] = rng.choice(SPECIAL_PAGES)
        else:
            # A few pages are much more popular than the rest.
            line["key"] = pages[min(int(rng.paretovariate(1.2)) - 1, len(pages) - 1)] if rng.random() < 0.5 else rng.choice(pages)
        if rng.random() < 0.9:
            line["value"] = json.dumps({"user": f"u{rng.randrange(10_000)}"})
        else:
            line["value"] = None  # a tombstone: its value is not read
        t = rng.random()
        if n == jump_at:
            # Far in the future (year 2286): everything of its partition
            # closes. Not beyond ~1.8e13 ms: the sandbox's wall clock reads
            # the record's timestamp, and WASI preview1 cannot represent a
            # later one (Go's runtime dies on it when it collects garbage).
            at = 10_000_000_000_000
        elif t < 0.005:
            at = None  # no timestamp: 0, late once the stream is under way
        elif t < 0.01:
            at = -rng.randrange(1, 100_000)  # before the epoch: in no window
        elif t < 0.80:
            now += rng.randrange(4_000)
            at = now
        elif t < 0.95:
            at = now - rng.randrange(15_000)  # out of order: within the grace, or late
        elif t < 0.98:
            at = now - 60_000 - rng.randrange(60_000)  # late
        elif t < 0.99:
            at = now - now % 60_000  # exactly on a window boundary
        else:
            now += 150_000 + rng.randrange(200_000)  # several windows later
            at = now
        if at is not None:
            line["timestamp"] = at
        print(json.dumps(line, ensure_ascii=False))


if __name__ == "__main__":
    main()
