"""Payments joined with an accounts table, in Python: the same processor as
examples/fraud (Rust), with byte-identical alerts and dead letters. A
payment over its account's limit, or on a blocked account, raises an alert
(Kafka Streams' payments.join(accounts, joiner).filter(alert != null)).

The table `accounts` is the compacted topic of the same name, co-partitioned
with the payments: the host keeps each task's partition of it in a
read-only store, read here with the ordinary `get`. A payment whose account
is not in the table raises nothing (an inner join).

Input: key = account, value = {"payment_id":"p1","account":"alice",
"amount":250}. Table: key = account, value = {"limit":200,
"status":"active"}. Output `alerts`: key = account, value =
{"payment_id":"p1","account":"alice","amount":250,"limit":200,
"reason":"over-limit"} (`reason` is `blocked` before `over-limit`). A
malformed payment or account value is dead-lettered with the reason,
serde_json's own words included (serde_json.py).

Built by `onceflow build` (componentize-py) with the onceflow SDK layer
(onceflow.py, guest-sdk/python).
"""

import onceflow
import serde_json

# serde_json's escapes in a JSON string: quote, backslash, \b \f \n \r \t,
# other control characters as \u00xx.
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in range(0x20)}
_JSON_ESCAPES.update(
    {
        ord('"'): '\\"',
        ord("\\"): "\\\\",
        0x08: "\\b",
        0x0C: "\\f",
        ord("\n"): "\\n",
        ord("\r"): "\\r",
        ord("\t"): "\\t",
    }
)


def json_string(text):
    """`text` as serde_json writes a string (Value::from(text))."""
    return '"' + text.translate(_JSON_ESCAPES) + '"'


def integer(fields, field, what):
    value = fields.get(field)
    if value is None or value[0] != "int":
        raise onceflow.Error(f'{what}: field "{field}" must be an integer')
    return value[1]


def text(fields, field, what):
    value = fields.get(field)
    if value is None or value[0] != "str":
        raise onceflow.Error(f'{what}: field "{field}" must be a string')
    return value[1]


def process(ctx, record):
    account = record.key_str()
    if record.value is None:
        raise onceflow.Error("record has no value")
    error, payment = serde_json.parse(record.value)
    if error is not None:
        raise onceflow.Error(f"record value is not the expected JSON: {error}")
    payment_id = text(payment, "payment_id", "payment")
    payer = text(payment, "account", "payment")
    amount = integer(payment, "amount", "payment")

    stored = ctx.store("accounts").get(record.key)
    if stored is None:
        return
    what = f"account {account}"
    error, settings = serde_json.parse(stored)
    if error is not None:
        raise onceflow.Error(f"{what}: its table value is not JSON: {error}")
    limit = integer(settings, "limit", what)
    status = text(settings, "status", what)
    if status == "blocked":
        reason = "blocked"
    elif amount > limit:
        reason = "over-limit"
    else:
        return
    alert = (
        f'{{"payment_id":{json_string(payment_id)},"account":{json_string(payer)},'
        f'"amount":{amount},"limit":{limit},"reason":"{reason}"}}'
    )
    ctx.emit("alerts", record.key, alert)


WitWorld = onceflow.export(process)
