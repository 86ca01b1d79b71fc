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
"""

from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence, Tuple, Union

import wit_world
from componentize_py_types import Err
from wit_world.imports import context as _context
from wit_world.imports import log as _log
from wit_world.imports import output as _output
from wit_world.imports import state as _state
from wit_world.imports.types import (
    Header,
    OutputError_TooLarge,
    OutputError_UnknownAlias,
    ProcessError,
    StateError_TooLarge,
    StateError_UnknownStore,
)

Bytes = Union[bytes, str]

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


@dataclass
class Record:
    """One input record (the WIT `record`, with `bytes` for keys and values)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: Optional[bytes]
    value: Optional[bytes]
    headers: Sequence[Header]


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


def _state_call(call):
    try:
        return call()
    except Err as err:
        e = err.value
        if isinstance(e, StateError_UnknownStore):
            raise Error(
                f'unknown state store "{e.value}": declare it under stores in onceflow.toml'
            ) from None
        if isinstance(e, StateError_TooLarge):
            raise Error(
                f"state key or value too large: the host accepts at most {e.value} bytes"
            ) from None
        raise


class Store:
    """A state store declared in the manifest's `stores`."""

    def __init__(self, name: str):
        self.name = name

    def get(self, key: Bytes) -> Optional[bytes]:
        return _state_call(lambda: _state.get(self.name, _bytes(key)))

    def get_i64(self, key: Bytes) -> Optional[int]:
        """The value as an integer in decimal text (as `put_i64` writes it)."""
        key = _bytes(key)
        value = self.get(key)
        if value is None:
            return None
        # Rust's i64::from_str: an optional sign, then ASCII digits only.
        text = value.decode("ascii", errors="replace")
        digits = text[1:] if text[:1] in ("+", "-") else text
        if digits and all("0" <= c <= "9" for c in digits):
            number = int(text)
            if -(2**63) <= number < 2**63:
                return number
        raise Error(
            f'state store "{self.name}": the value of key "{_escape_ascii(key)}" '
            "is not a decimal integer"
        )

    def put(self, key: Bytes, value: Bytes) -> None:
        _state_call(lambda: _state.put(self.name, _bytes(key), _bytes(value)))

    def put_i64(self, key: Bytes, value: int) -> None:
        self.put(key, str(value))

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


class Context:
    """What a processor may do while processing one record."""

    def __init__(self, config: dict):
        self.config = config

    def store(self, name: str) -> Store:
        return Store(name)

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
                None if key is None else _bytes(key),
                None if value is None else _bytes(value),
                [Header(key=k, value=_bytes(v)) for k, v in headers],
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


def export(
    process: Callable[[Context, Record], None],
    init: Optional[Callable[[dict], None]] = None,
):
    """The `WitWorld` class componentize-py expects, running `process` for
    every record of a batch."""

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
                record = Record(
                    r.topic, r.partition, r.offset, r.timestamp, r.key, r.value, r.headers
                )
                try:
                    process(ctx, record)
                except Error as error:
                    raise Err(ProcessError(record_index=index, message=error.message)) from None
                except Exception as error:
                    message = f"processor error: {type(error).__name__}: {error}"
                    _log.write(ERROR, f"{message}\n{_stack(error)}")
                    raise Err(ProcessError(record_index=index, message=message)) from None

        def punctuate(self, stream_time):
            # Not called by the host yet.
            pass

    return WitWorld
