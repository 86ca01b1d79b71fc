"""Page views, in Python: the same processor as examples/pageviews (Rust),
with byte-identical outputs and dead letters. It counts views per page in
tumbling one-minute windows with a ten-second grace and emits each window's
count once, when stream time passes its end plus the grace (Kafka Streams'
suppress(untilWindowCloses)).

Input: key = the page, the record's timestamp = when it was viewed; the
value is not read. Output `counts`: key = the page, value =
{"page":"/home","start":1700000040000,"end":1700000100000,"count":3}. A view
whose window had closed is reported late; the manifest dead-letters it.

Built by `onceflow build` (componentize-py) with the onceflow SDK layer
(onceflow.py, guest-sdk/python).
"""

import onceflow

WINDOWS = onceflow.TimeWindows.tumbling(60_000, 10_000)
STORE = "views"

# A JSON string's escapes: quote, backslash and control characters.
_JSON_ESCAPES = {ord('"'): '\\"', ord("\\"): "\\\\"}
_JSON_ESCAPES.update({c: f"\\u{c:04x}" for c in range(0x20)})


def json_string(text):
    """`text` as a JSON string, quoted and escaped."""
    return '"' + text.translate(_JSON_ESCAPES) + '"'


def decode(data, what):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise onceflow.Error(f"a stored {what} is not UTF-8") from None


def init(config):
    # Every 10 s of stream time: each point where a window closes.
    onceflow.schedule_punctuation(WINDOWS.punctuation_interval())


def process(ctx, record):
    page = record.key_str()
    views = ctx.window_store(STORE)
    now = ctx.stream_time()
    starts = WINDOWS.open_windows(record.timestamp, now)
    if not starts:
        ctx.report_late(
            f"view of {page} at {record.timestamp} arrived after its window closed "
            f"(stream time {record.timestamp if now is None else now})"
        )
        return
    for start in starts:
        views.put_i64(record.key, start, (views.get_i64(record.key, start) or 0) + 1)


def punctuate(ctx, stream_time):
    views = ctx.window_store(STORE)

    def emit(window):
        page = decode(window.key, "page")
        count = decode(window.value, "count")
        value = (
            f'{{"page":{json_string(page)},"start":{window.start},'
            f'"end":{WINDOWS.end(window.start)},"count":{count}}}'
        )
        ctx.emit("counts", window.key, value)

    WINDOWS.take_closed(views, stream_time, emit)


WitWorld = onceflow.export(process, init=init, punctuate=punctuate)
