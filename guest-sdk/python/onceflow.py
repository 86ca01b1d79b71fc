"""onceflow: the thin Python SDK layer over the bindings componentize-py
generates from wit/processor.wit (package `wit_world`).

`onceflow build` copies this module next to the processor's sources. A
processor is a function of a `Context` and a `Record`:

    import onceflow

    def process(ctx: onceflow.Context, record: onceflow.Record) -> None:
        count = ctx.store("counts").get_i64(record.key) or 0
        ctx.store("counts").put_i64(record.key, count + 1)
        ctx.emit("counts", record.key, str(count + 1))

    WitWorld = onceflow.export(process)

`export` loops over the batch as the Rust SDK does: `begin-record` for each
record, and a raised `onceflow.Error` (bad data) comes back to the host as
a `process-error` naming the record, so the deployment's error policy
(fail, skip, dead-letter) applies to that record alone. State and output
failures raise `onceflow.Error` with the Rust SDK's messages. Any other
exception is a bug: it is logged at level error with its stack and
reported for the record with the message `processor error: ...`.

Time is stream time (`ctx.stream_time()`), as in the Rust SDK: window
stores (`ctx.window_store(name)`), `TimeWindows.tumbling` / `hopping` to
assign records to windows, `SessionWindows.with_gap` for sessions,
`schedule_punctuation(ms)` from `init`, and a `punctuate(ctx, stream_time)`
function that emits closed windows (`TimeWindows.take_closed`,
`SessionWindows.take_closed`):

    WINDOWS = onceflow.TimeWindows.tumbling(60_000, 10_000)

    def init(config):
        onceflow.schedule_punctuation(WINDOWS.punctuation_interval())

    def punctuate(ctx, stream_time):
        views = ctx.window_store("views")
        WINDOWS.take_closed(views, stream_time, lambda w: ctx.emit("counts", w.key, w.value))

    WitWorld = onceflow.export(process, init=init, punctuate=punctuate)
"""

import gc as _gc
import json as _json
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import wit_world
from componentize_py_types import Err
from wit_world.imports import context as _context
from wit_world.imports import log as _log
from wit_world.imports import output as _output
from wit_world.imports import state as _state
from wit_world.imports import windows as _windows
from wit_world.imports.types import (
    Header,
    Record as _WitRecord,
    OutputError_TooLarge,
    OutputError_UnknownAlias,
    ProcessError,
    StateError_ReadOnly,
    StateError_TooLarge,
    StateError_UnknownStore,
    StateError_WrongKind,
    WindowKey,
)

Bytes = Union[bytes, str]

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1
U64_MAX = 2**64 - 1
# How many windows WindowStore.fetch_all asks the host for at a time.
DEFAULT_WINDOW_PAGE = 256

TRACE = _log.Level.TRACE
DEBUG = _log.Level.DEBUG
INFO = _log.Level.INFO
WARN = _log.Level.WARN
ERROR = _log.Level.ERROR


class Error(Exception):
    """A record the processor rejects: the message goes to the dead-letter
    topic and the logs."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def _key_str(self) -> str:
    """The key as UTF-8 text; `Error` (the Rust SDK's message) when it
    is null or not UTF-8."""
    return _record_text(self.key, "key")


def _value_str(self) -> str:
    """The value as UTF-8 text; `Error` when it is absent (a tombstone)
    or not UTF-8."""
    return _record_text(self.value, "value")


def _value_json(self):
    """The value parsed as JSON (what the host hands over for inputs of
    format `json` or `avro`: docs/formats.md); `Error` when it is absent or
    not JSON."""
    text = _record_text(self.value, "value")
    try:
        return _json.loads(text)
    except ValueError as e:
        raise Error(f"record value is not the expected JSON: {e}") from None


# One input record: the bindings' own class (the WIT `record`: topic,
# partition, offset, timestamp, key, value, headers, with `bytes` for keys and
# values), with the two methods above. The SDK hands the processor the
# records as the bindings made them, rather than copying each into a class of
# its own (a Python call per record, in an interpreter).
Record = _WitRecord
Record.key_str = _key_str
Record.value_str = _value_str
Record.value_json = _value_json


def _record_text(data: Optional[bytes], what: str) -> str:
    if data is None:
        raise Error(f"record has no {what}")
    try:
        return data.decode("utf-8")  # strict, as Rust's str::from_utf8
    except UnicodeDecodeError:
        raise Error(f"record {what} is not UTF-8 text") from None


def _bytes(data: Bytes) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def _escape_ascii(data: bytes) -> str:
    """Rust's `<[u8]>::escape_ascii`, for messages identical to the Rust SDK's."""
    out = []
    for b in data:
        if b == 0x09:
            out.append("\\t")
        elif b == 0x0A:
            out.append("\\n")
        elif b == 0x0D:
            out.append("\\r")
        elif b == 0x22:
            out.append('\\"')
        elif b == 0x27:
            out.append("\\'")
        elif b == 0x5C:
            out.append("\\\\")
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    return "".join(out)


def _state_error(err: Err) -> Exception:
    """The `Error` (the Rust SDK's message) for a state import's error;
    other errors as they are."""
    e = err.value
    if isinstance(e, StateError_UnknownStore):
        return Error(f'unknown state store "{e.value}": declare it under stores in onceflow.toml')
    if isinstance(e, StateError_TooLarge):
        return Error(f"state key or value too large: the host accepts at most {e.value} bytes")
    if isinstance(e, StateError_ReadOnly):
        return Error(
            f'"{e.value}" is a table: the host writes it from its topic, '
            "a processor only reads it"
        )
    if isinstance(e, StateError_WrongKind):
        return Error(
            f'"{e.value}" is of the other kind: use ctx.window_store for a store under '
            "window-stores in onceflow.toml, ctx.store for one under stores"
        )
    return err


def _state_call(call):
    try:
        return call()
    except Err as err:
        raise _state_error(err) from None


def _parse_i64(value: bytes) -> Optional[int]:
    """Rust's i64::from_str: an optional sign, then ASCII digits only."""
    digits = value[1:] if value[:1] in (b"+", b"-") else value
    # bytes.isdigit: not empty, ASCII 0-9 only (int() alone would also take
    # spaces and underscores).
    if digits.isdigit():
        number = int(value)
        if I64_MIN <= number <= I64_MAX:
            return number
    return None


def _i64(value: int, what: str) -> int:
    if not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not I64_MIN <= value <= I64_MAX:
        raise ValueError(f"{what} {value} is outside the 64-bit integer range")
    return value


class Store:
    """A state store declared in the manifest's `stores`."""

    def __init__(self, name: str):
        self.name = name

    def get(self, key: Bytes) -> Optional[bytes]:
        # try/except rather than _state_call: no lambda on the per-record path.
        try:
            return _state.get(self.name, _bytes(key))
        except Err as err:
            raise _state_error(err) from None

    def get_i64(self, key: Bytes) -> Optional[int]:
        """The value as an integer in decimal text (as `put_i64` writes it)."""
        # get's work inline: in an interpreter every call counts.
        key = key if type(key) is bytes else _bytes(key)
        try:
            value = _state.get(self.name, key)
        except Err as err:
            raise _state_error(err) from None
        if value is None:
            return None
        number = _parse_i64(value)
        if number is not None:
            return number
        raise Error(
            f'state store "{self.name}": the value of key "{_escape_ascii(key)}" '
            "is not a decimal integer"
        )

    def put(self, key: Bytes, value: Bytes) -> None:
        try:
            _state.put(self.name, _bytes(key), _bytes(value))
        except Err as err:
            raise _state_error(err) from None

    def put_i64(self, key: Bytes, value: int) -> None:
        try:
            _state.put(
                self.name, key if type(key) is bytes else _bytes(key), str(value).encode("utf-8")
            )
        except Err as err:
            raise _state_error(err) from None

    def delete(self, key: Bytes) -> None:
        _state_call(lambda: _state.delete(self.name, _bytes(key)))

    def scan_prefix(self, prefix: Bytes, page: int = 256) -> Iterable[Tuple[bytes, bytes]]:
        """(key, value) pairs whose key starts with `prefix`, in key order."""
        prefix = _bytes(prefix)
        after = None
        while True:
            entries = _state_call(lambda: _state.scan_prefix(self.name, prefix, after, page))
            for entry in entries:
                yield entry.key, entry.value
            if len(entries) < page:
                return
            after = entries[-1].key


@dataclass
class Window:
    """A window of a window store: its key, its start (ms since the Unix
    epoch) and its value."""

    key: bytes
    start: int
    value: bytes


class WindowStore:
    """A window store declared under `[window-stores.NAME]` in the manifest:
    a value per key and window start. A window whose start is at or before
    `stream time - retention` has expired: reads no longer see it and writes
    to it are ignored."""

    def __init__(self, name: str):
        self.name = name

    def get(self, key: Bytes, start: int) -> Optional[bytes]:
        """The value of the window of `key` starting at `start`."""
        start = _i64(start, "start")
        return _state_call(lambda: _windows.get(self.name, _bytes(key), start))

    def get_i64(self, key: Bytes, start: int) -> Optional[int]:
        """The value of a window as an integer in decimal text (as `put_i64`
        writes it)."""
        key = _bytes(key)
        value = self.get(key, start)
        if value is None:
            return None
        number = _parse_i64(value)
        if number is not None:
            return number
        raise Error(
            f'window store "{self.name}": the window of key "{_escape_ascii(key)}" '
            f"at {start} is not an integer"
        )

    def put(self, key: Bytes, start: int, value: Bytes) -> None:
        """Sets the value of the window of `key` starting at `start`."""
        start = _i64(start, "start")
        _state_call(lambda: _windows.put(self.name, _bytes(key), start, _bytes(value)))

    def put_i64(self, key: Bytes, start: int, value: int) -> None:
        """Sets a window's value to `value` in decimal text."""
        self.put(key, start, str(_i64(value, "value")))

    def delete(self, key: Bytes, start: int) -> None:
        """Removes the window of `key` starting at `start`."""
        start = _i64(start, "start")
        _state_call(lambda: _windows.delete(self.name, _bytes(key), start))

    def fetch(self, key: Bytes, earliest: int, latest: int) -> List[Window]:
        """The windows of `key` whose start is in [earliest, latest], by start."""
        earliest = _i64(earliest, "earliest")
        latest = _i64(latest, "latest")
        entries = _state_call(lambda: _windows.fetch(self.name, _bytes(key), earliest, latest))
        return [Window(e.key, e.start, e.value) for e in entries]

    def fetch_all(self, earliest: int, latest: int) -> Iterator[Window]:
        """The windows of every key whose start is in [earliest, latest], in
        (key, start) order, fetched from the host DEFAULT_WINDOW_PAGE at a
        time."""
        earliest = _i64(earliest, "earliest")
        latest = _i64(latest, "latest")
        after = None
        while True:
            page = _state_call(
                lambda: _windows.fetch_all(
                    self.name, earliest, latest, after, DEFAULT_WINDOW_PAGE
                )
            )
            for e in page:
                yield Window(e.key, e.start, e.value)
            if len(page) < DEFAULT_WINDOW_PAGE:
                return
            after = WindowKey(key=page[-1].key, start=page[-1].start)


def _saturate(x: int) -> int:
    return I64_MAX if x > I64_MAX else I64_MIN if x < I64_MIN else x


def _wrap(x: int) -> int:
    """x as Rust's wrapping i64 arithmetic leaves it."""
    return (x + 2**63) % 2**64 - 2**63


def _duration_ms(value: int, what: str) -> int:
    """A duration in ms (a non-negative int), saturating at the i64 maximum."""
    if not isinstance(value, int):
        raise TypeError(f"{what} must be an int (ms), not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{what} must not be negative (got {value})")
    return min(value, I64_MAX)


def _length(value: int, what: str) -> int:
    """A window length in ms: at least 1."""
    return _duration_ms(value, what) or 1


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


class TimeWindows:
    """Fixed-size windows aligned to the epoch, as Kafka Streams'
    TimeWindows: tumbling (advance = size) or hopping (advance < size), with
    a grace period. A window [start, start + size) is open until stream time
    reaches start + size + grace; a record all of whose windows have closed
    is late. Times are ints, ms."""

    __slots__ = ("size_ms", "advance_ms", "grace_ms")

    def __init__(self, size_ms: int, advance_ms: int, grace_ms: int):
        self.size_ms = size_ms
        self.advance_ms = advance_ms
        self.grace_ms = grace_ms

    @classmethod
    def tumbling(cls, size_ms: int, grace_ms: int) -> "TimeWindows":
        """Windows of `size_ms` one after the other (0 counts as 1 ms)."""
        size = _length(size_ms, "size_ms")
        return cls(size, size, _duration_ms(grace_ms, "grace_ms"))

    @classmethod
    def hopping(cls, size_ms: int, advance_ms: int, grace_ms: int) -> "TimeWindows":
        """Windows of `size_ms` starting every `advance_ms` (at most
        `size_ms`)."""
        size = _length(size_ms, "size_ms")
        advance = min(_length(advance_ms, "advance_ms"), size)
        return cls(size, advance, _duration_ms(grace_ms, "grace_ms"))

    def __repr__(self) -> str:
        return (
            f"TimeWindows(size_ms={self.size_ms}, advance_ms={self.advance_ms}, "
            f"grace_ms={self.grace_ms})"
        )

    def __eq__(self, other) -> bool:
        return isinstance(other, TimeWindows) and (
            self.size_ms,
            self.advance_ms,
            self.grace_ms,
        ) == (other.size_ms, other.advance_ms, other.grace_ms)

    def end(self, start: int) -> int:
        """The end (exclusive) of the window starting at `start`."""
        return _saturate(start + self.size_ms)

    def windows_for(self, timestamp: int) -> List[int]:
        """The starts of the windows that contain `timestamp`, ascending
        (Kafka Streams' windowsFor: no window starts before the epoch)."""
        # Wrapping, as the Rust SDK's i64 arithmetic.
        first = max(_wrap(timestamp - self.size_ms + self.advance_ms), 0)
        first -= first % self.advance_ms
        return list(range(first, timestamp + 1, self.advance_ms))

    def is_closed(self, start: int, stream_time: int) -> bool:
        """Whether the window starting at `start` has closed at
        `stream_time`."""
        return _saturate(self.end(start) + self.grace_ms) <= stream_time

    def open_windows(self, timestamp: int, stream_time: Optional[int]) -> List[int]:
        """The windows containing `timestamp` still open at `stream_time`
        (all of them when it is None, before the first record): empty means
        the record is late."""
        starts = self.windows_for(timestamp)
        if stream_time is None:
            return starts
        return [start for start in starts if not self.is_closed(start, stream_time)]

    def punctuation_interval(self) -> int:
        """The stream-time punctuation interval, ms, that falls on every
        point where one of these windows closes (end + grace of each), so
        that take_closed in punctuate emits each window at the record that
        closes it."""
        offset = _wrap(self.size_ms + self.grace_ms) % self.advance_ms
        return max(_gcd(self.advance_ms, offset), 1)

    def take_closed(
        self, store: WindowStore, stream_time: int, each: Callable[[Window], None]
    ) -> int:
        """Every window of `store` closed at `stream_time`: calls `each` on
        it, then deletes it (emit final). Returns how many there were."""
        latest = _saturate(_saturate(stream_time - self.grace_ms) - self.size_ms)
        closed = list(store.fetch_all(I64_MIN, latest))
        for window in closed:
            each(window)
            store.delete(window.key, window.start)
        return len(closed)


@dataclass
class Session:
    """A session of a SessionWindows store: its key, the first and last
    record's times (ms) and the aggregate."""

    key: bytes
    start: int
    end: int
    value: bytes


def _decode_session(window: Window) -> Optional[Session]:
    """A window of a session store as a session: its value is the session's
    end (8 bytes, big-endian) followed by the aggregate; None when shorter."""
    if len(window.value) < 8:
        return None
    end = int.from_bytes(window.value[:8], "big", signed=True)
    return Session(window.key, window.start, end, window.value[8:])


class SessionWindows:
    """Session windows, as Kafka Streams' SessionWindows and the Rust SDK's
    `SessionWindows`: a key's records closer than `gap` to each other form
    one session [start, end] (the first and last record's times), and a
    record bridging two sessions merges them. A record is late when its
    merged session ends before stream_time - gap - grace (Kafka Streams'
    rule); a session is closed, and emitted, once stream time passes
    end + 2 * gap + grace, when no record the rule accepts can touch it any
    more (docs/time.md). Sessions live in a window store under their
    start; the value is the session's end (8 bytes, big-endian) followed by
    the aggregate, as in every SDK. Times are ints, ms."""

    __slots__ = ("gap_ms", "grace_ms")

    def __init__(self, gap_ms: int, grace_ms: int):
        self.gap_ms = gap_ms
        self.grace_ms = grace_ms

    @classmethod
    def with_gap(cls, gap_ms: int, grace_ms: int) -> "SessionWindows":
        """Sessions split by `gap_ms` of inactivity, with `grace_ms` for
        records out of order."""
        return cls(_duration_ms(gap_ms, "gap_ms"), _duration_ms(grace_ms, "grace_ms"))

    def __repr__(self) -> str:
        return f"SessionWindows(gap_ms={self.gap_ms}, grace_ms={self.grace_ms})"

    def __eq__(self, other) -> bool:
        return isinstance(other, SessionWindows) and (self.gap_ms, self.grace_ms) == (
            other.gap_ms,
            other.grace_ms,
        )

    def is_late(self, end: int, stream_time: int) -> bool:
        """Whether a record is late at `stream_time` when its session
        (merged with the sessions it touches) ends at `end`:
        end < stream_time - gap - grace."""
        return _saturate(_saturate(end + self.gap_ms) + self.grace_ms) < stream_time

    def is_closed(self, end: int, stream_time: int) -> bool:
        """Whether a session ending at `end` is closed at `stream_time`: no
        record `is_late` accepts can touch it any more,
        stream_time > end + 2 * gap + grace."""
        reach = _saturate(_saturate(end + self.gap_ms) + self.gap_ms)
        return _saturate(reach + self.grace_ms) < stream_time

    def record(
        self,
        store: WindowStore,
        key: Bytes,
        timestamp: int,
        stream_time: Optional[int],
        merge: Callable[[bytes, bytes], Bytes],
        add: Callable[[Optional[bytes]], Bytes],
    ) -> Optional[Session]:
        """Adds a record of `key` at `timestamp` to `store`: merges the
        sessions it touches into one (their aggregates folded with
        `merge(a, b)`, oldest first) and adds the record with
        `add(aggregate)` (None: a new session); both return the new
        aggregate. Returns the session, or None when the record is late
        (report it with `ctx.report_late`). `stream_time` None: before the
        first record, nothing is late."""
        key = _bytes(key)
        timestamp = _i64(timestamp, "timestamp")
        touching = []
        for window in store.fetch(key, I64_MIN, _saturate(timestamp + self.gap_ms)):
            session = _decode_session(window)
            if session is not None and _saturate(session.end + self.gap_ms) >= timestamp:
                touching.append(session)
        start = min([timestamp] + [s.start for s in touching])
        end = max([timestamp] + [s.end for s in touching])
        if stream_time is not None and self.is_late(end, stream_time):
            return None
        folded: Optional[bytes] = None
        for s in touching:
            folded = s.value if folded is None else _bytes(merge(folded, s.value))
            store.delete(key, s.start)
        value = _bytes(add(folded))
        store.put(key, start, end.to_bytes(8, "big", signed=True) + value)
        return Session(key, start, end, value)

    def take_closed(
        self, store: WindowStore, stream_time: int, each: Callable[[Session], None]
    ) -> int:
        """Every session of `store` closed at `stream_time`: calls `each` on
        it, then deletes it (emit final). Returns how many there were."""
        latest = _saturate(_saturate(_saturate(stream_time - self.grace_ms) - self.gap_ms) - self.gap_ms)
        closed = []
        for window in store.fetch_all(I64_MIN, latest):
            session = _decode_session(window)
            if session is not None and self.is_closed(session.end, stream_time):
                closed.append(session)
        for session in closed:
            each(session)
            store.delete(session.key, session.start)
        return len(closed)


def schedule_punctuation(interval_ms: int) -> None:
    """Asks the host to call the processor's `punctuate(ctx, stream_time)`
    whenever the task's stream time reaches a multiple of `interval_ms` (and
    once at the task's first record). Only `init` may call it (it raises
    `Error` anywhere else); 0 cancels."""
    if not isinstance(interval_ms, int) or not 0 <= interval_ms <= U64_MAX:
        raise ValueError(f"interval_ms must be an int in 0..2**64-1 (got {interval_ms!r})")
    try:
        _context.schedule_punctuation(interval_ms)
    except Err as err:
        raise Error(str(err.value)) from None


class Context:
    """What a processor may do while processing one record (or
    punctuating)."""

    def __init__(self, config: dict):
        self.config = config
        # The record's index in its batch; None in punctuate.
        self.index: Optional[int] = None

    def store(self, name: str) -> Store:
        return Store(name)

    def window_store(self, name: str) -> WindowStore:
        """The window store called `name`, declared under [window-stores]
        in the manifest."""
        return WindowStore(name)

    def stream_time(self) -> Optional[int]:
        """The task's stream time, ms: the largest record timestamp it has
        seen, counting this record (in punctuate, the time it was called
        for); None before the task's first record."""
        return _context.stream_time()

    def report_late(self, message: str) -> None:
        """Reports this record as late (its window had closed): leave no
        other mark for it and return normally; the host counts and drops it
        or hands it to the error policy with `message`, as the manifest's
        [time] late-records says. Outside process it does nothing."""
        if self.index is not None:
            _context.late_record(self.index, str(message))

    def emit(
        self,
        alias: str,
        key: Optional[Bytes],
        value: Optional[Bytes],
        headers: Sequence[Tuple[str, bytes]] = (),
    ) -> None:
        """Emits a record to the topic the manifest maps `alias` to."""
        try:
            _output.emit(
                alias,
                key if key is None or type(key) is bytes else _bytes(key),
                value if value is None or type(value) is bytes else _bytes(value),
                [Header(key=k, value=_bytes(v)) for k, v in headers] if headers else [],
            )
        except Err as err:
            e = err.value
            if isinstance(e, OutputError_UnknownAlias):
                raise Error(
                    f'unknown output alias "{e.value}": declare it under [outputs] in onceflow.toml'
                ) from None
            if isinstance(e, OutputError_TooLarge):
                raise Error(
                    f"output record too large: the host accepts at most {e.value} bytes"
                ) from None
            raise

    def log(self, level, message: str) -> None:
        _log.write(level, message)


def _stack(error: BaseException) -> str:
    # The traceback module would add ~1 MB to the component.
    lines = ["Traceback (most recent call last):"]
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        lines.append(f'  File "{code.co_filename}", line {tb.tb_lineno}, in {code.co_name}')
        tb = tb.tb_next
    return "\n".join(lines)


def _bug(error: BaseException) -> str:
    """The message of an unexpected exception, logged with its stack."""
    message = f"processor error: {type(error).__name__}: {error}"
    _log.write(ERROR, f"{message}\n{_stack(error)}")
    return message


def export(
    process: Callable[[Context, Record], None],
    init: Optional[Callable[[dict], None]] = None,
    punctuate: Optional[Callable[[Context, int], None]] = None,
):
    """The `WitWorld` class componentize-py expects, running `process` for
    every record of a batch, `init(config)` once per instance and
    `punctuate(ctx, stream_time)` at every scheduled punctuation (without
    it, punctuate does nothing)."""

    # `export` runs while the build snapshots the imported processor: freezing
    # here moves every object of the snapshot out of the cycle collector's
    # reach (reference counting still frees them; only a cycle among them
    # would stay). Otherwise each new instance's first collections walk the
    # whole heap image, and so copy it page by page: ~2 ms per instance, and
    # the host makes one at every start and after every trap
    # (docs/languages.md).
    _gc.freeze()

    class WitWorld(wit_world.WitWorld):
        config: dict = {}

        def init(self, config):
            WitWorld.config = dict(config)
            if init is not None:
                try:
                    init(WitWorld.config)
                except Error as error:
                    raise Err(error.message) from None

        def process(self, batch):
            ctx = Context(WitWorld.config)
            for index, r in enumerate(batch):
                _context.begin_record(index)
                ctx.index = index
                try:
                    process(ctx, r)
                except Error as error:
                    raise Err(ProcessError(record_index=index, message=error.message)) from None
                except Exception as error:
                    message = _bug(error)
                    raise Err(ProcessError(record_index=index, message=message)) from None

        def punctuate(self, stream_time):
            if punctuate is None:
                return
            ctx = Context(WitWorld.config)
            try:
                punctuate(ctx, stream_time)
            except Error as error:
                raise Err(ProcessError(record_index=None, message=error.message)) from None
            except Exception as error:
                message = _bug(error)
                raise Err(ProcessError(record_index=None, message=message)) from None

    return WitWorld
