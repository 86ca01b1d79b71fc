#!/usr/bin/env python3
"""Payments and account updates for the fraud conformance check: `onceflow
test` input (JSON Lines; records of the topic `accounts` update the table,
records of `payments` are joined with it, in file order) on which every
fraud port must print exactly what the Rust one prints.

Accounts: updates of ~40 accounts (and of accounts whose names need JSON
escaping or are not UTF-8), with active, blocked and other statuses,
limits of every shape (negative, i64 bounds, floats, strings, missing),
tombstones, keyless updates (ignored), and malformed values: invalid JSON of
every kind serde_json names (its message and position end up in the dead
letter of the next payment on that account), invalid UTF-8, multi-line
values. Payments: mostly valid, on known and unknown accounts, under and
over the limit, with payment ids and payer names that need escaping
(quotes, backslashes, control characters, \\u escapes, surrogate pairs,
U+2028, DEL, non-ASCII); and payments every port must reject the same way:
no key, keys that are not UTF-8, tombstones, invalid JSON, missing fields,
fields of the wrong type, amounts that are not i64 integers (1.5, 1e3, -0,
2^63, "100", 1e400), and randomly mutated payments. Deterministic for a
given --seed.

    gen_input.py [--lines N] [--seed S] > fraud.jsonl
"""

import argparse
import base64
import json
import random

BASE = 1_700_000_000_000

SPECIAL_ACCOUNTS = [
    'quo"te',
    "back\\slash",
    "tab\there",
    "new\nline",
    "nul\u0000byte",
    "unit\u001fsep",
    "del\u007f",
    "zo\u00eb",
    "\u65e5\u672c",
    "\U0001F4B0",
    "\ufeffbom",
    "sep\u2028",
    "",
]

# Keys every port must reject as not UTF-8 text (as Rust's from_utf8 does).
BAD_KEYS = [b"\xff", b"lone\xed\xa0\x80", b"over\xc0\xaf", b"cut\xe2\x82"]

# Texts (JSON string contents, unescaped) that need escaping in an alert.
ESCAPING = [
    'p"1', "p\\2", "p\n3", "p\t\r\b\f", "p\u0000\u0001\u001f", "p\u007f",
    "p\u2028\u2029", "caf\u00e9", "\U0001F600", "</script>", "'single'",
]

# Limit texts as they appear in an account value.
LIMITS = [
    "0", "1", "100", "200", "500", "1000", "-5", "9223372036854775807",
    "-9223372036854775808", "9223372036854775808", "1.5", "1e3", "-0", "1000.0",
    '"1000"', "null", "true", "[1000]", "1e400",
]
STATUSES = ['"active"', '"blocked"', '"frozen"', '"Blocked"', '""', "1", "null",
            '["blocked"]', '"bl\\u006fcked"']
# Amount texts as they appear in a payment value.
AMOUNTS = [
    "0", "1", "50", "150", "199", "200", "201", "250", "999", "1000", "1001",
    "-1", "-100", "9223372036854775807", "-9223372036854775808",
]
BAD_AMOUNTS = [
    "1.5", "1e3", "1E2", "-0", "0.0", "1000.0", "9223372036854775808",
    "-9223372036854775809", "18446744073709551616", '"100"', "null", "true",
    "[1]", "{}", "1e-400",
]
# Amounts that make the whole payment invalid JSON for serde_json.
INVALID_AMOUNTS = [
    "1e400", "01", "+1", ".5", "5.", "1e", "-", "--1", "0x10", "NaN",
    "Infinity", "1_000", "1" + "0" * 330, "1e99999999999",
]


def jstr(text, rng):
    """A JSON string literal for `text`, escaped one way or another."""
    if rng.random() < 0.5:
        return json.dumps(text, ensure_ascii=False)
    return json.dumps(text)  # non-ASCII as \\u escapes, surrogate pairs


def payment_text(pid, payer, amount, rng):
    fields = [f'"payment_id":{jstr(pid, rng)}', f'"account":{jstr(payer, rng)}',
              f'"amount":{amount}']
    if rng.random() < 0.2:
        rng.shuffle(fields)
    if rng.random() < 0.1:
        fields.insert(rng.randrange(len(fields) + 1),
                      rng.choice(['"note":"x"', '"n":{"a":[1,{"b":null}]}', '"f":1.25e3',
                                  '"amount":"dup"', '"u":"\\u00e9\\ud83d\\ude00"']))
    sep = rng.choice([",", ", ", ",\n", " ,\r\n\t"])
    body = "{" + sep.join(fields) + "}"
    if rng.random() < 0.1:
        body = rng.choice([" ", "\n", "\t\r\n"]) + body + rng.choice(["", " ", "\n"])
    return body


def account_text(limit, status, rng):
    fields = [f'"limit":{limit}', f'"status":{status}']
    if rng.random() < 0.3:
        fields.reverse()
    if rng.random() < 0.1:
        fields.append('"note":{"since":"2024","tags":["a","b"]}')
    sep = rng.choice([",", ", ", ",\n  "])
    return "{" + sep.join(fields) + "}"


def malformed_payments(pid, payer):
    p = json.dumps(pid)
    a = json.dumps(payer)
    return [
        "", " ", "N/A", "{", "}", "[]", "[1,2,3]", "1", '"str"', "null", "true",
        "{}", "{,}", "{\n\n", '{"payment_id"', '{"payment_id":', '{"payment_id" 1}',
        f'{{"payment_id":{p},"account":{a},"amount":1,}}',
        f'{{"payment_id":{p},"account":{a},"amount":1}}x',
        f'{{"payment_id":{p},"account":{a},"amount":1}}\n{{}}',
        f'\f{{"payment_id":{p},"account":{a},"amount":1}}',
        f"{{'payment_id':{p}}}",
        f'{{payment_id:{p}}}',
        f'{{"payment_id":{p} "account":{a}}}',
        f'{{"payment_id":{p},"account":{a},"amount":tru}}',
        f'{{"payment_id":{p},"account":{a},"amount":nul}}',
        f'{{"payment_id":{p},"account":{a},"amount":[1,]}}',
        f'{{"payment_id":{p},"account":{a},"amount":1,"x":[1 2]}}',
        f'{{"payment_id":{p},"account":{a}}}',
        f'{{"payment_id":{p},"amount":5}}',
        f'{{"account":{a},"amount":5}}',
        f'{{"payment_id":1,"account":{a},"amount":5}}',
        f'{{"payment_id":{p},"account":null,"amount":1}}',
        f'{{"payment_id":{p},"account":["a"],"amount":1}}',
        f'{{"payment_id":{p},"account":{a},"amount":1,"amount":"x"}}',
        f'{{"payment_id":{p},"account":{a},"\\u0061mount":5}}',
        f'{{"payment_id":{p},"account":"\\ud800","amount":1}}',
        f'{{"payment_id":{p},"account":"\\udc00","amount":1}}',
        f'{{"payment_id":{p},"account":"\\ud800\\u0041","amount":1}}',
        f'{{"payment_id":{p},"account":"\\ud800x","amount":1}}',
        f'{{"payment_id":{p},"account":"\\u12","amount":1}}',
        f'{{"payment_id":{p},"account":"\\u12G4","amount":1}}',
        f'{{"payment_id":{p},"account":"\\x41","amount":1}}',
        f'{{"payment_id":{p},"account":"raw\x01ctl","amount":1}}',
        f'{{"payment_id":{p},"account":"unterminated,"amount":1}}',
        f'{{"payment_id":{p},"account":"a\\',
        '{"payment_id":"p","account":"a","amount":1,"n":' + "[" * 127 + "]" * 127 + "}",
        '{"payment_id":"p","account":"a","amount":1,"n":' + "[" * 126 + "]" * 126 + "}",
        "[" * 200,
        f'{{"payment_id":{p},\n "account":{a},\n "amount": 1e400}}',
        f'{{\n  "payment_id": {p},\n  "account": {a},\n  "amount": 01\n}}',
    ]


BINARY_PAYMENTS = [
    b"\xff\xfe",
    b'{"payment_id":"p","account":"\xff","amount":1}',
    b'{"payment_id":"p","account":"\xc0\x80","amount":1}',
    b'{"payment_id":"p","account":"\xed\xa0\x80","amount":1}',
    b'{"payment_id":"p","account":"ok\xe6\x97","amount":1}',
    b'{"payment_id":"p\\n\xe6\x97x","account":"a","amount":1}',
    b'{"payment_id":"p","account":"ok","amount":1}\xff',
    b'\xef\xbb\xbf{"payment_id":"p","account":"bom","amount":1}',
    b'{"payment_id":"p\xc3\xa9","account":"caf\xc3\xa9","amount":1}',
]

MALFORMED_ACCOUNTS = [
    "", "not json", "{", '{"limit":100', '{"limit":100,}', '{"limit":100 "status":"active"}',
    '{"limit":1e400,"status":"active"}', '{"limit":100,"status":"act\\ive"}',
    '{"limit":100,\n"status":"active",\n}', '{"limit":100,"status":"active"}}',
    "[1000]", '"blocked"', "1000", "null", '{"status":"blocked"}', '{"limit":100}',
]
BINARY_ACCOUNTS = [b'{"limit":100,"status":"\xff"}', b"\xc3(", b'{"limit":100,"status":"active"}\x00']

FUZZ_TOKENS = [
    "1e400", "-0", "1.5", "\\ud800", "\\udc00", "\\ud83d\\ude00", "\\u", "[", "]", "{", "}",
    ",", ":", '"', "\\", " ", "\n", "\x01", "9223372036854775808", "null", "true", "\u00e9",
    "\U0001F4B0", "e", ".", "-", '"amount":', '"limit":', "\ufeff",
]


def mutate(text, rng):
    data = text.encode()
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(len(data) + 1)
        op = rng.random()
        if op < 0.4:
            data = data[:at] + rng.choice(FUZZ_TOKENS).encode() + data[at:]
        elif op < 0.7:
            data = data[:at] + data[at + rng.randrange(1, 4):]
        elif op < 0.95:
            data = data[:at] + bytes([rng.randrange(0x20, 0x7F)]) + data[at + 1:]
        else:
            data = data[:at] + bytes([rng.randrange(256)]) + data[at + 1:]
    return data


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    accounts = [f"acct-{i}" for i in range(40)] + SPECIAL_ACCOUNTS
    now = BASE
    lines = []

    def add(topic, key, value):
        nonlocal now
        now += rng.randrange(1, 2000)
        line = {"topic": topic}
        if isinstance(key, bytes):
            line["key_base64"] = base64.b64encode(key).decode()
        elif key is not None:
            line["key"] = key
        if isinstance(value, bytes):
            try:
                line["value"] = value.decode("utf-8")
            except UnicodeDecodeError:
                line["value_base64"] = base64.b64encode(value).decode()
        else:
            line["value"] = value
        line["timestamp"] = now
        lines.append(json.dumps(line, ensure_ascii=False))

    def account_update(key):
        r = rng.random()
        if r < 0.06:
            value = None  # a tombstone: the account leaves the table
        elif r < 0.11:
            value = rng.choice(MALFORMED_ACCOUNTS + BINARY_ACCOUNTS)
        elif r < 0.2:
            value = account_text(rng.choice(LIMITS), rng.choice(STATUSES), rng)
        else:
            status = '"blocked"' if rng.random() < 0.2 else '"active"'
            value = account_text(rng.choice(["100", "200", "500", "1000"]), status, rng)
        add("accounts", key, value)

    def payment(key):
        payer = key if isinstance(key, str) and rng.random() < 0.8 else rng.choice(accounts)
        pid = f"p{len(lines)}"
        if rng.random() < 0.15:
            pid += rng.choice(ESCAPING)
        if rng.random() < 0.05:
            payer += rng.choice(ESCAPING)
        r = rng.random()
        if r < 0.75:
            amount = rng.choice(AMOUNTS)
        elif r < 0.9:
            amount = rng.choice(BAD_AMOUNTS)
        else:
            amount = rng.choice(INVALID_AMOUNTS)
        add("payments", key, payment_text(pid, payer, amount, rng))

    # The table first (every account, some twice), then a mix.
    for key in accounts:
        account_update(key)
    for key in BAD_KEYS:
        add("accounts", key, account_text("100", '"blocked"', rng))
    add("accounts", None, account_text("1", '"blocked"', rng))  # no key: ignored
    # Every fixed case once, on accounts in the table.
    for value in malformed_payments("m1", "acct-1") + BINARY_PAYMENTS:
        add("payments", rng.choice(accounts[:40]), value)
    for key in accounts:
        payment(key)
    while len(lines) < args.lines:
        r = rng.random()
        key = rng.choice(accounts) if rng.random() < 0.9 else f"unknown-{rng.randrange(20)}"
        if r < 0.2:
            account_update(key)
        elif r < 0.8:
            payment(key)
        elif r < 0.83:
            add("payments", None, payment_text("p", "x", "1", rng))  # no key
        elif r < 0.86:
            add("payments", rng.choice(BAD_KEYS), payment_text("p", "x", "1", rng))
        elif r < 0.89:
            add("payments", key, None)  # a tombstone: no value
        elif r < 0.92:
            add("payments", key, rng.choice(malformed_payments(f"m{len(lines)}", key)))
        elif r < 0.97:
            seed = payment_text(f"f{len(lines)}", key, rng.choice(AMOUNTS), rng)
            add("payments", key, mutate(seed, rng))
        else:
            seed = account_text(rng.choice(LIMITS), rng.choice(STATUSES), rng)
            add("accounts", key, mutate(seed, rng))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
