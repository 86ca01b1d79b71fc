#!/usr/bin/env python3
"""Writes a conformance input for the wallet processors (JSON Lines for
`onceflow test`): valid payments mixed with every malformed kind we know of,
so that a wallet written in another language can be diffed against the Rust
one. Deterministic: the same seed gives the same file.

    python3 gen_input.py [--lines 2000] [--seed 1] [--fuzz N] [--big] > input.jsonl
"""

import argparse
import base64
import json
import random

ACCOUNTS = [
    "alice", "bob", "carol", "zoë", "日本", "💰", 'quo"te', "back\\slash",
    "new\nline", "tab\t", "ctl\x01\x1f", "del\x7f", "sep\u2028", "slash/",
    "", " ", "a" * 300,
]

# Amount texts, exactly as they appear in the JSON value.
GOOD_AMOUNTS = ["0", "1", "-1", "100", "-30", "250", "9007199254740993",
                "-9007199254740993", "123456789012345678"]
EDGE_AMOUNTS = [
    "9223372036854775807", "-9223372036854775808", "9223372036854775806",
    "9223372036854775808", "-9223372036854775809", "18446744073709551615",
    "18446744073709551616", "99999999999999999999999", "-0", "0.0", "-0.0",
    "1.5", "1.0", "1e30", "1E2", "1e+2", "1e-2", "-1e0", "1e-400", "0e999999999999",
    "1e-99999999999", "2.5e-308", "1.7976931348623157e308", "1.7976931348623158e308",
    "1.7976931348623159e308", "1.79769313486231581e308", "17976931348623157e292",
    "0.17976931348623157e309", "179769313486231570" + "0" * 291,
    "179769313486231580" + "0" * 291, "1" + "0" * 308, "1" + "0" * 309,
    "1" + "0" * 400, "18446744073709551619.5", "184467440737095516199.5e10",
    "0." + "0" * 400 + "1", "1" * 30 + "." + "1" * 30 + "e280",
    "1" * 30 + "." + "1" * 30 + "e300", '"N/A"', '"100"', "null", "true",
    "false", "[]", "{}", "[1]", '{"v":1}',
]
# Amount texts that make the whole value invalid JSON for serde_json.
BAD_AMOUNTS = [
    "1e400", "2e308", "1e99999999999", "-1e400", "1" + "0" * 330, "01", "+1",
    ".5", "5.", "1e", "1e+", "-", "--1", "0x10", "NaN", "Infinity", "-Infinity",
    "1_000", "１", "٣", "1٣", "1.٣", "1e٣", "٣1", "1\u00a0",
]


def jstr(text):
    """A JSON string literal with non-ASCII escaped (as \\uXXXX)."""
    return json.dumps(text)


def jstr_raw(text):
    """A JSON string literal with non-ASCII left as is."""
    return json.dumps(text, ensure_ascii=False)


def payment(pid, account, amount, style=0, extra=""):
    enc = jstr if style % 2 else jstr_raw
    fields = [f'"payment_id":{enc(pid)}', f'"account":{enc(account)}', f'"amount":{amount}']
    if style % 3 == 1:
        fields.reverse()
    if extra:
        fields.insert(style % (len(fields) + 1), extra)
    sep = ", " if style % 4 == 2 else ","
    body = "{" + sep.join(fields) + "}"
    if style % 5 == 3:
        body = " \t\r\n" + body.replace(":", " : ") + "\n "
    return body


def nested(depth, inner="1"):
    return "[" * depth + inner + "]" * depth


def nested_obj(depth):
    return '{"a":' * depth + "1" + "}" * depth


def malformed(pid, account):
    """(value text or bytes or None, key) pairs of malformed payments."""
    acc = jstr(account)
    p = jstr(pid)
    cases = [
        None,  # tombstone
        "", " ", "not json at all", "{", "}", "[1,2,3]", "1", '"str"', "null", "true",
        "[]", "{}", "{,}", f'{{"payment_id":{p},"account":{acc},"amount":1,}}',
        f'{{"payment_id":{p},"account":{acc},"amount":1}}x',
        f'{{"payment_id":{p},"account":{acc},"amount":1}}{{}}',
        f'{{"payment_id":{p},"account":{acc},"amount":1}} \n\t\r',
        f'\f{{"payment_id":{p},"account":{acc},"amount":1}}',
        f'\u00a0{{"payment_id":{p},"account":{acc},"amount":1}}',
        f"{{'payment_id':{p},'account':{acc},'amount':1}}",
        f'{{payment_id:{p},"account":{acc},"amount":1}}',
        f'{{"payment_id":{p} "account":{acc},"amount":1}}',
        f'{{"payment_id":{p},"account":{acc},"amount":1 /* c */}}',
        f'{{"payment_id":{p},"account":{acc},"amount":tru}}',
        f'{{"payment_id":{p},"account":{acc},"amount":True}}',
        f'{{"payment_id":{p},"account":{acc},"amount":nul}}',
        f'{{"payment_id":{p},"account":{acc},"amount":[1,]}}',
        f'{{"payment_id":{p},"account":{acc},"amount":1,"x":[1 2]}}',
        f'{{"payment_id":{p},"account":{acc}}}',
        f'{{"payment_id":{p},"amount":5}}',
        f'{{"account":{acc},"amount":5}}',
        f'{{"payment_id":1,"account":{acc},"amount":5}}',
        f'{{"payment_id":null,"amount":5}}',
        f'{{"payment_id":{p},"account":null,"amount":1}}',
        f'{{"payment_id":{p},"account":["a"],"amount":1}}',
        f'{{"payment_id":{p},"account":{{"name":"a"}},"amount":1}}',
        f'{{"payment_id":{p},"account":false,"amount":1}}',
        f'{{"payment_id":{p},"account":7,"amount":1}}',
        f'{{"payment_id":{{}},"account":7}}',
        f'{{"PAYMENT_ID":{p},"account":{acc},"amount":1}}',
        f'{{"payment_id ":{p},"account":{acc},"amount":1}}',
        # duplicate keys: the last one wins
        f'{{"payment_id":1,"payment_id":{p},"account":{acc},"amount":"x","amount":3}}',
        f'{{"payment_id":{p},"account":{acc},"amount":3,"amount":"x"}}',
        f'{{"payment_id":{p},"account":{acc},"account":null,"amount":3}}',
        # field names: escaped, nested, special
        f'{{"payment_id":{p},"account":{acc},"\\u0061mount":5}}',
        f'{{"\\u0070ayment_id":{p},"acc\\u006funt":{acc},"amount":6}}',
        f'{{"__proto__":{{"amount":1}},"payment_id":{p},"account":{acc}}}',
        f'{{"payment_id":{p},"account":{acc},"constructor":1,"toString":2,"amount":7}}',
        f'{{"n":{{"amount":2}},"payment_id":{p},"account":{acc}}}',
        f'{{"payment_id":{p},"account":{acc},"amount":1,"n":{{"amount":1e400}}}}',
        f'{{"payment_id":{p},"account":{acc},"amount":1,"n":{{"amount":1.5}}}}',
        '"\\ud800"', '"ok"', "1e400", "-0", "-", "1.5", '"\\u00e9"',
        # escapes and surrogates
        f'{{"payment_id":{p},"account":"\\ud800","amount":1}}',
        f'{{"payment_id":{p},"account":"\\udc00","amount":1}}',
        f'{{"payment_id":{p},"account":"\\ud800\\u0041","amount":1}}',
        f'{{"payment_id":{p},"account":"\\udc00\\ud800","amount":1}}',
        f'{{"payment_id":{p},"account":"\\ud800\\ud800\\udc00","amount":1}}',
        f'{{"payment_id":{p},"account":"\\ud800x","amount":1}}',
        f'{{"payment_id":{p},"account":"\\ud800\\n","amount":1}}',
        f'{{"payment_id":{p},"account":"\\ud83d\\udcb0","amount":1}}',
        f'{{"payment_id":{p},"account":"\\uD83D\\uDCB0\\u00E9\\u0000","amount":1}}',
        f'{{"payment_id":{p},"account":"a","amount":1,"\\udfff":0}}',
        f'{{"payment_id":{p},"account":"a","amount":1,"x":["\\ud800"]}}',
        f'{{"payment_id":{p},"account":"\\u12","amount":1}}',
        f'{{"payment_id":{p},"account":"\\u12G4","amount":1}}',
        f'{{"payment_id":{p},"account":"\\x41","amount":1}}',
        f'{{"payment_id":{p},"account":"\\a","amount":1}}',
        f'{{"payment_id":{p},"account":"\\\'","amount":1}}',
        f'{{"payment_id":{p},"account":"\\/\\b\\f\\n\\r\\t\\"\\\\","amount":1}}',
        f'{{"payment_id":{p},"account":"raw\x01ctl","amount":1}}',
        f'{{"payment_id":{p},"account":"raw\ttab","amount":1}}',
        f'{{"payment_id":{p},"account":"raw\x7fdel","amount":1}}',
        f'{{"payment_id":{p},"account":"unterminated,"amount":1}}',
        f'{{"payment_id":{p},"account":"a\\',
        # nesting: serde_json refuses the 128th level
        f'{{"payment_id":{p},"account":{acc},"amount":1,"n":{nested(126)}}}',
        f'{{"payment_id":{p},"account":{acc},"amount":1,"n":{nested(127)}}}',
        f'{{"payment_id":{p},"account":{acc},"amount":1,"n":{nested_obj(126)}}}',
        f'{{"payment_id":{p},"account":{acc},"amount":1,"n":{nested_obj(127)}}}',
        f'{{"payment_id":{p},"account":{acc},"amount":1,"n":{nested(126, "{}")}}}',
        f'{{"payment_id":{p},"account":{acc},"amount":1,"n":{nested(200)}}}',
        nested(127), nested(128), nested(3000),
        # numbers elsewhere in the document
        f'{{"payment_id":{p},"account":{acc},"amount":1,"fee":1e400}}',
        f'{{"payment_id":{p},"account":{acc},"amount":1,"fee":[1.5,-0,1e308,1e-999]}}',
        f'{{"payment_id":{p},"account":{acc},"amount":1,"fee":{{"x":2e308}}}}',
        f'{{"payment_id":{p},"account":{acc},"amount":1,"fee":01}}',
        f'{{"payment_id":{p},"account":{acc},"amount":1,"meta":{{"a":[true,false,null,{{}},[]],"b":"\\u00e9"}}}}',
    ]
    return cases


BINARY = [
    b"\xff\xfe",
    b'{"payment_id":"p","account":"\xff","amount":1}',
    b'{"payment_id":"p","account":"\xc0\x80","amount":1}',
    b'{"payment_id":"p","account":"\xed\xa0\x80","amount":1}',
    b'{"payment_id":"p","account":"\xf4\x90\x80\x80","amount":1}',
    b'{"payment_id":"p","account":"\xe6\x97","amount":1}',
    b'{"payment_id":"p","account":"ok","amount":1}\xff',
    b'\xef\xbb\xbf{"payment_id":"p","account":"bom","amount":1}',
    b'{"payment_id":"p\xc3\xa9","account":"caf\xc3\xa9","amount":1}',
    b'{"payment_id":"p","account":"\xf0\x9f\x92\xb0","amount":2}',
    b'{"payment_id":"p","account":"nul\x00","amount":1}',
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fuzz", type=int, default=0, metavar="N",
                        help="add N randomly mutated payments")
    parser.add_argument("--big", action="store_true",
                        help="add records over the host's 1 MiB state/output limits")
    args = parser.parse_args()
    rng = random.Random(args.seed)

    lines = []

    def add(key, value):
        line = {"topic": "payments"}
        if key is not None:
            line["key"] = key
        if isinstance(value, bytes):
            line["value_base64"] = base64.b64encode(value).decode()
        else:
            line["value"] = value
        lines.append(json.dumps(line))

    # Every fixed case once, in order, then a random mix.
    n = 0
    for account in ACCOUNTS:
        n += 1
        add(account, payment(f"p{n}", account, "5", style=n))
    for amount in GOOD_AMOUNTS + EDGE_AMOUNTS + BAD_AMOUNTS:
        n += 1
        add("edge", payment(f"p{n}", "edge", amount, style=n))
    for value in malformed(f"m{n}", "mal"):
        n += 1
        add("mal", value)
    for value in BINARY:
        n += 1
        add("bin", value)
    # Drive one account to the edges of i64, then over them.
    for amount in ["9223372036854775000", "807", "1", "-9223372036854775807",
                   "-9223372036854775807", "-1", "-2", "5"]:
        n += 1
        add("limit", payment(f"p{n}", "limit", amount, style=n))
    if args.big:
        n += 1
        add("big", payment(f"p{n}", "x" * (1 << 20 | 1), "1"))  # state key too large
        n += 1
        add("big", payment(f"p{n}", "y" * 600_000, "1"))  # output record too large
        n += 1
        add("big", payment("q" * 600_000, "z", "1"))  # audit record too large

    if args.fuzz:
        tokens = ["1e400", "-0", "1.5", "\\ud800", "\\udc00", "\\ud83d\\ude00", "[", "]", "{",
                  "}", ",", ":", '"', "\\", "\\u00", " ", "\n", "\x01", "9223372036854775808",
                  "null", "true", "é", "💰", "\x7f", "1" * 25, "e", ".", "-", "amount", "account",
                  "payment_id", '"amount":', '"account":"', "\ufeff", "\u2028"]
        seeds = [payment(f"f{k}", rng.choice(ACCOUNTS), rng.choice(GOOD_AMOUNTS + EDGE_AMOUNTS),
                         style=k) for k in range(50)]
        for k in range(args.fuzz):
            text = rng.choice(seeds)
            for _ in range(rng.randrange(1, 4)):
                at = rng.randrange(len(text) + 1)
                op = rng.random()
                if op < 0.4:
                    text = text[:at] + rng.choice(tokens) + text[at:]
                elif op < 0.7:
                    text = text[:at] + text[at + rng.randrange(1, 4):]
                else:
                    text = text[:at] + chr(rng.randrange(0x20, 0x7f)) + text[at + 1:]
            if rng.random() < 0.1:
                data = bytearray(text.encode())
                data[rng.randrange(len(data))] = rng.randrange(256)
                add("fuzz", bytes(data))
            else:
                add("fuzz", text)

    all_cases = malformed("mix", "mal") + BINARY
    amounts = GOOD_AMOUNTS * 6 + EDGE_AMOUNTS + BAD_AMOUNTS
    while len(lines) < args.lines:
        n += 1
        roll = rng.random()
        account = rng.choice(ACCOUNTS)
        if roll < 0.6:
            add(account, payment(f"r{n}", account, rng.choice(GOOD_AMOUNTS), style=rng.randrange(60)))
        elif roll < 0.8:
            add(account, payment(f"r{n}", account, rng.choice(amounts), style=rng.randrange(60)))
        elif roll < 0.95:
            add(account, rng.choice(all_cases))
        else:
            extra = rng.choice(['"note":"x"', '"n":{"a":[1,{"b":null}]}', '"f":1.25e3',
                                '"u":"\\u00e9\\ud83d\\ude00"', '"e":""'])
            add(account, payment(f"r{n}", account, rng.choice(GOOD_AMOUNTS),
                                 style=rng.randrange(60), extra=extra))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
