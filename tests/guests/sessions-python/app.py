"""Test guest, in Python: the same processor as tests/guests/sessions
(Rust). Clicks counted per user and session with the SDK's SessionWindows
(a session ends after 5 s without a click; 10 s of grace), each session
emitted once when it closes, late clicks reported. Output `sessions`: key =
user, value = "<start> <end> <count>".
"""

import re

import onceflow

SESSIONS = onceflow.SessionWindows.with_gap(5_000, 10_000)
STORE = "sessions"
_DECIMAL = re.compile(rb"\+?[0-9]+")


def count(data):
    """A count stored as decimal text (0 if it is not one)."""
    return int(data) if _DECIMAL.fullmatch(data) else 0


def init(config):
    # At every advance of stream time: each session is emitted at the
    # record that closes it.
    onceflow.schedule_punctuation(1)


def process(ctx, record):
    user = record.key_str()
    session = SESSIONS.record(
        ctx.window_store(STORE),
        record.key,
        record.timestamp,
        ctx.stream_time(),
        lambda a, b: str(count(a) + count(b)),
        lambda old: str((0 if old is None else count(old)) + 1),
    )
    if session is None:
        ctx.report_late(f"click of {user} at {record.timestamp} after its session closed")


def punctuate(ctx, stream_time):
    SESSIONS.take_closed(
        ctx.window_store(STORE),
        stream_time,
        lambda s: ctx.emit("sessions", s.key, f"{s.start} {s.end} {count(s.value)}"),
    )


WitWorld = onceflow.export(process, init=init, punctuate=punctuate)
