"""Wallet, in Python: the same processor as examples/wallet (Rust), with
byte-identical outputs and error messages. It keeps a balance per account in
the state store `balances` and, for every payment, emits the new balance
(alias `balances`) and an audit copy of the payment (alias `audit`).

Input values are JSON objects {"payment_id": str, "account": str, "amount":
int}. The Rust wallet parses them with serde_json; Python's json module is
more lenient (NaN and Infinity, lone surrogates, numbers that overflow to
inf) and stops at a different nesting depth, so `parse_json` below adds
serde_json's remaining checks. The fields are then checked in the same order
with the same messages.

Built by `onceflow build` (componentize-py) with the onceflow SDK layer
(onceflow.py: the batch loop, state and output with the Rust SDK's
messages).
"""

import json
import re

import onceflow

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1


def invalid(reason):
    return onceflow.Error(f"invalid payment: {reason}")


def missing(name):
    return invalid(f'missing field "{name}"')


def process(ctx, record):
    raw = record.value
    payment_id, account, amount = parse_payment(raw)

    balances = ctx.store("balances")
    balance = (balances.get_i64(account) or 0) + amount
    if not I64_MIN <= balance <= I64_MAX:
        raise invalid(f'balance overflow for account "{account}"')

    # Every check has passed: only now change anything.
    balances.put_i64(account, balance)
    report = (
        f'{{"account":{json_string(account)},"balance":{balance},'
        f'"payment_id":{json_string(payment_id)}}}'
    )
    ctx.emit("balances", account, report)
    ctx.emit("audit", payment_id, raw)


WitWorld = onceflow.export(process)


def parse_payment(raw):
    """Checks a payment, in a fixed order, with fixed messages."""
    if raw is None:
        raise invalid("missing value")
    try:
        fields = parse_json(raw)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError, ours
        raise invalid("not valid JSON") from None
    if type(fields) is not dict:
        raise invalid("not a JSON object")
    payment_id = string_field(fields, "payment_id")
    account = string_field(fields, "account")
    if "amount" not in fields:
        raise missing("amount")
    amount = fields["amount"]
    # parse_json gives int only for integers within i64 (bool is not int here).
    if type(amount) is not int:
        raise invalid('field "amount" must be an integer')
    return payment_id, account, amount


def string_field(fields, name):
    if name not in fields:
        raise missing(name)
    value = fields[name]
    if type(value) is not str:
        raise invalid(f'field "{name}" must be a string')
    return value


def json_string(text):
    """`text` as a JSON string literal, escaped as serde_json does: `"`, `\\`,
    \\b \\f \\n \\r \\t, other control characters as \\u00xx, nothing else."""
    # What json.dumps(text, ensure_ascii=False) returns, without building a
    # JSONEncoder per call.
    return _encode_string(text)


_encode_string = json.encoder.encode_basestring


# ------------------------------------------------------------------ JSON, as serde_json reads it
#
# json (the C scanner) refuses a subset of what serde_json refuses, apart
# from NaN, Infinity and -Infinity, which it accepts (refused through
# parse_constant). The rest is checked here:
# - numbers that overflow f64 (serde_json: "number out of range"; json gives
#   inf): every number goes through parse_int / parse_float, which replay
#   serde_json's algorithm where it matters;
# - unpaired UTF-16 surrogates written as \u escapes (json keeps them as lone
#   surrogates): when the text has a \u escape, the parsed value is encoded
#   back to UTF-8, which fails on a surrogate;
# - nesting deeper than serde_json's recursion limit: scanned when the text
#   has enough brackets to nest that deep.
# Integers come back as int only within i64 (serde_json's as_i64); every
# other number comes back as a float.


class BadJson(ValueError):
    """Input serde_json refuses."""


# serde_json's recursion limit: 128 levels, the 128th of which is refused.
MAX_DEPTH = 127
POW10 = [float(f"1e{k}") for k in range(309)]
U64_MAX = 2**64 - 1
I32_MAX = 2**31 - 1
I32_MIN = -(2**31)
_NOT_I64 = 0.5
_DIGITS = frozenset("0123456789")


def _parse_int(text):
    if len(text) <= 18:
        # Up to 17 digits: within i64. serde_json parses -0 as a float.
        return _NOT_I64 if text == "-0" else int(text)
    check_number_range(text)  # a long integer may overflow f64
    value = int(text)  # at most ~330 digits here, well below int()'s limit
    return value if I64_MIN <= value <= I64_MAX else _NOT_I64


def _parse_float(text):
    check_number_range(text)
    return _NOT_I64


def _parse_constant(name):
    raise BadJson(name)  # NaN, Infinity, -Infinity


_decoder = json.JSONDecoder(
    parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant
)
_scan_once = _decoder.scan_once
_BRACKETS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


def parse_json(raw):
    """Parses a whole JSON text (bytes) as serde_json would. Raises
    ValueError where serde_json fails."""
    text = raw.decode("utf-8")  # strict, as Rust's from_utf8
    if len(text) >= 2 * (MAX_DEPTH + 1) and text.count("[") + text.count("{") > MAX_DEPTH:
        check_depth(text)
    # The scanner itself when the text is one value with nothing around it;
    # decode (two Python calls and two regular expressions more) otherwise,
    # which also raises the error for text that is not JSON.
    try:
        value, end = _scan_once(text, 0)
    except StopIteration:
        end = -1
    if end != len(text):
        value = _decoder.decode(text)
    if "\\u" in text:
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise BadJson("lone surrogate") from None
    return value


def check_depth(text):
    """Refuses nesting beyond MAX_DEPTH. Exact for valid JSON, which is all
    that matters: an invalid text is refused either way."""
    depth = 0
    for match in _BRACKETS.finditer(text):
        token = match.group()
        if token == "[" or token == "{":
            depth += 1
            if depth > MAX_DEPTH:
                raise BadJson("recursion limit exceeded")
        elif token == "]" or token == "}":
            depth -= 1


def check_number_range(text):
    """serde_json (without `float_roundtrip`) refuses a number whose value
    overflows f64 ("number out of range"). This replays its digit loop
    (significand kept as a u64, later digits counted into the exponent) and
    its `f64_from_parts`, so that the same numbers are refused. `text` is a
    syntactically valid JSON number."""
    n = len(text)
    i = 1 if text[0] == "-" else 0

    def overflows(significand, digit):
        return significand * 10 + digit > U64_MAX

    def from_parts(significand, exponent):
        if exponent < 0 or significand == 0:
            return
        if exponent > 308 or float(significand) * POW10[exponent] == float("inf"):
            raise BadJson("number out of range")

    def exponent_part(i, significand, starting_exponent):
        i += 1  # e or E
        positive = True
        if text[i] == "+":
            i += 1
        elif text[i] == "-":
            positive = False
            i += 1
        exp = int(text[i])
        i += 1
        while i < n:
            digit = int(text[i])
            i += 1
            if exp * 10 + digit > I32_MAX:
                if significand != 0 and positive:
                    raise BadJson("number out of range")
                return
            exp = exp * 10 + digit
        total = starting_exponent + exp if positive else starting_exponent - exp
        from_parts(significand, min(I32_MAX, max(I32_MIN, total)))

    def decimal_part(i, significand, exponent_before):
        i += 1  # .
        after = 0
        while i < n and text[i] in _DIGITS:
            digit = int(text[i])
            if overflows(significand, digit):
                # Further digits are ignored.
                while i < n and text[i] in _DIGITS:
                    i += 1
                break
            i += 1
            significand = significand * 10 + digit
            after -= 1
        if i < n:
            exponent_part(i, significand, exponent_before + after)
        else:
            from_parts(significand, exponent_before + after)

    significand = int(text[i])
    i += 1
    if significand != 0:
        while i < n and text[i] in _DIGITS:
            digit = int(text[i])
            if overflows(significand, digit):
                # A long integer: the remaining integer digits only scale it.
                start = i
                while i < n and text[i] in _DIGITS:
                    i += 1
                exponent = i - start
                if i < n and text[i] == ".":
                    decimal_part(i, significand, exponent)
                elif i < n:
                    exponent_part(i, significand, exponent)
                else:
                    from_parts(significand, exponent)
                return
            i += 1
            significand = significand * 10 + digit
    if i < n and text[i] == ".":
        decimal_part(i, significand, 0)
    elif i < n:
        exponent_part(i, significand, 0)
