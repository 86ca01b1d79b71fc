// onceflow.js: the thin JavaScript SDK layer over the bindings
// ComponentizeJS generates from wit/processor.wit. `onceflow build` writes it
// next to the processor's module.
//
//   import { exportProcessor, RecordError } from './onceflow.js';
//
//   function count(ctx, record) {
//     if (record.key === undefined) throw new RecordError('record has no key');
//     const counts = ctx.store('counts');
//     const n = (counts.getI64(record.key) ?? 0n) + 1n;
//     counts.putI64(record.key, n);
//     ctx.emit('counts', record.key, n.toString());
//   }
//
//   export const { init, process, punctuate } = exportProcessor(count);
//
// The batch loop is the Rust SDK's: `begin-record` before each record; a
// thrown RecordError (bad data) comes back to the host as a `process-error`
// naming the record, so the deployment's error policy (fail, skip,
// dead-letter) applies to that record alone. State and output failures
// throw RecordError with the Rust SDK's messages. Any other exception is a
// bug: it is logged at level error with its stack and reported for the
// record as `processor error: ...`. Keys and values are Uint8Array (strings
// are encoded as UTF-8); 64-bit integers are BigInt.
//
// Time is stream time (ctx.streamTime()), as in the Rust SDK: window stores
// (ctx.windowStore(name)), TimeWindows.tumbling / hopping to assign records
// to windows, SessionWindows.withGap for sessions, schedulePunctuation(ms)
// from init, and a punctuate(ctx, streamTime) function that emits closed
// windows (TimeWindows#takeClosed, SessionWindows#takeClosed):
//
//   const WINDOWS = TimeWindows.tumbling(60_000, 10_000);
//   export const { init, process, punctuate } = exportProcessor({
//     init: () => schedulePunctuation(WINDOWS.punctuationInterval()),
//     process(ctx, record) { ... ctx.windowStore('views').putI64(page, start, n) ... },
//     punctuate(ctx, streamTime) {
//       WINDOWS.takeClosed(ctx.windowStore('views'), streamTime, (w) => ctx.emit('counts', w.key, w.value));
//     },
//   });

import {
  get as stateGet,
  put as statePut,
  delete as stateDelete,
  scanPrefix as stateScanPrefix,
} from 'onceflow:processor/state@0.2.0';
import {
  get as windowGet,
  put as windowPut,
  delete as windowDelete,
  fetch as windowFetch,
  fetchAll as windowFetchAll,
} from 'onceflow:processor/windows@0.2.0';
import { emit as outputEmit } from 'onceflow:processor/output@0.2.0';
import { write as logWrite } from 'onceflow:processor/log@0.2.0';
import {
  beginRecord,
  streamTime as contextStreamTime,
  schedulePunctuation as contextSchedulePunctuation,
  lateRecord,
} from 'onceflow:processor/context@0.2.0';

const encoder = new TextEncoder();
const I64_MIN = -(2n ** 63n);
const I64_MAX = 2n ** 63n - 1n;
const U64_MAX = 2n ** 64n - 1n;
const NO_HEADERS = [];
/** How many windows WindowStore.fetchAll asks the host for at a time. */
export const DEFAULT_WINDOW_PAGE = 256;

/** A record the processor rejects: the message goes to the dead-letter topic. */
export class RecordError extends Error {
  constructor(message) {
    super(message);
    this.name = 'RecordError';
  }
}

/** `text` (a string) as UTF-8 bytes; Uint8Array as is. */
export function bytes(data) {
  return typeof data === 'string' ? encoder.encode(data) : data;
}

/** Rust's `<[u8]>::escape_ascii`, for messages identical to the Rust SDK's. */
export function escapeAscii(data) {
  let out = '';
  for (const b of data) {
    if (b === 0x09) out += '\\t';
    else if (b === 0x0a) out += '\\n';
    else if (b === 0x0d) out += '\\r';
    else if (b === 0x22) out += '\\"';
    else if (b === 0x27) out += "\\'";
    else if (b === 0x5c) out += '\\\\';
    else if (b >= 0x20 && b < 0x7f) out += String.fromCharCode(b);
    else out += '\\x' + b.toString(16).padStart(2, '0');
  }
  return out;
}

const utf8Decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/**
 * The bytes as UTF-8 text, strictly (a BOM is kept), as Rust's
 * `str::from_utf8`; undefined when they are not UTF-8.
 */
export function decodeUtf8(data) {
  try {
    return utf8Decoder.decode(data);
  } catch {
    return undefined;
  }
}

function recordText(data, what) {
  if (data === undefined) throw new RecordError(`record has no ${what}`);
  const text = decodeUtf8(data);
  if (text === undefined) throw new RecordError(`record ${what} is not UTF-8 text`);
  return text;
}

/** The record's key as UTF-8 text; a RecordError (the Rust SDK's message) when it is null or not UTF-8. */
export function keyStr(record) {
  return recordText(record.key, 'key');
}

/** The record's value as UTF-8 text; a RecordError when it is absent (a tombstone) or not UTF-8. */
export function valueStr(record) {
  return recordText(record.value, 'value');
}

/**
 * The record's value parsed as JSON (what the host hands over for inputs of
 * format `json` or `avro`: docs/formats.md); a RecordError when it is absent
 * or not JSON.
 */
export function valueJson(record) {
  const text = valueStr(record);
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new RecordError(`record value is not the expected JSON: ${e.message}`);
  }
}

/** An integer (BigInt or Number) as a BigInt within i64; a RangeError otherwise. */
function i64(value, what) {
  const n = BigInt(value);
  if (n < I64_MIN || n > I64_MAX) throw new RangeError(`${what} ${n} is outside the 64-bit integer range`);
  return n;
}

const DECIMAL_I64 = /^[+-]?[0-9]+$/;

/** Rust's i64::from_str on bytes: an optional sign, then ASCII digits only. */
function parseI64(value) {
  // Decoded natively (not UTF-8: not digits either, as for Rust).
  let text;
  try {
    text = utf8Decoder.decode(value);
  } catch {
    return undefined;
  }
  if (DECIMAL_I64.test(text)) {
    const n = BigInt(text[0] === '+' ? text.slice(1) : text);
    if (n >= I64_MIN && n <= I64_MAX) return n;
  }
  return undefined;
}

function payloadOf(error) {
  return error !== null && typeof error === 'object' && 'payload' in error ? error.payload : error;
}

/** The RecordError (the Rust SDK's message) for a state import's error; other errors as they are. */
function stateError(error) {
  const e = payloadOf(error);
  switch (e && e.tag) {
    case 'unknown-store':
      return new RecordError(`unknown state store "${e.val}": declare it under stores in onceflow.toml`);
    case 'too-large':
      return new RecordError(`state key or value too large: the host accepts at most ${e.val} bytes`);
    case 'read-only':
      return new RecordError(`"${e.val}" is a table: the host writes it from its topic, a processor only reads it`);
    case 'wrong-kind':
      return new RecordError(
        `"${e.val}" is of the other kind: use ctx.window_store for a store under ` +
          'window-stores in onceflow.toml, ctx.store for one under stores',
      );
    default:
      return error;
  }
}

function stateCall(call) {
  try {
    return call();
  } catch (error) {
    throw stateError(error);
  }
}

/** A state store declared in the manifest's `stores`. */
export class Store {
  constructor(name) {
    this.name = name;
  }

  /** The value of `key`, or undefined. */
  get(key) {
    // try/catch rather than stateCall: no closure on the per-record path.
    try {
      return stateGet(this.name, bytes(key)) ?? undefined;
    } catch (error) {
      throw stateError(error);
    }
  }

  /** The value as a BigInt stored in decimal text (as putI64 writes it), or undefined. */
  getI64(key) {
    // get's work inline: in an interpreter every call counts.
    const k = typeof key === 'string' ? encoder.encode(key) : key;
    let value;
    try {
      value = stateGet(this.name, k);
    } catch (error) {
      throw stateError(error);
    }
    if (value === undefined || value === null) return undefined;
    const n = parseI64(value);
    if (n !== undefined) return n;
    throw new RecordError(
      `state store "${this.name}": the value of key "${escapeAscii(k)}" is not a decimal integer`,
    );
  }

  put(key, value) {
    try {
      statePut(
        this.name,
        typeof key === 'string' ? encoder.encode(key) : key,
        typeof value === 'string' ? encoder.encode(value) : value,
      );
    } catch (error) {
      throw stateError(error);
    }
  }

  /** Sets `key` to a BigInt (or integer Number) written as decimal text. */
  putI64(key, value) {
    this.put(key, BigInt(value).toString());
  }

  delete(key) {
    stateCall(() => stateDelete(this.name, bytes(key)));
  }

  /** [key, value] pairs whose key starts with `prefix`, in key order. */
  *scanPrefix(prefix, page = 256) {
    const p = bytes(prefix);
    let after;
    for (;;) {
      const entries = stateCall(() => stateScanPrefix(this.name, p, after, page));
      for (const e of entries) yield [e.key, e.value];
      if (entries.length < page) return;
      after = entries[entries.length - 1].key;
    }
  }
}

// ComponentizeJS 0.23 traps (`unreachable`) on any negative s64 argument to
// an import (bytecodealliance/ComponentizeJS#343). A window start handed to
// the host is therefore never negative: a negative start is refused with an
// error, and fetch bounds are clamped to 0, which changes nothing as no
// window with a negative start can have been written (windowsFor never
// returns one: no window starts before the epoch).
const NEGATIVE_S64 =
  'ComponentizeJS cannot pass a negative 64-bit integer to the host (bytecodealliance/ComponentizeJS#343)';

/**
 * A window store declared under `[window-stores.NAME]` in the manifest: a
 * value per key and window start (ms since the epoch, a BigInt). A window
 * whose start is at or before `stream time - retention` has expired: reads
 * no longer see it and writes to it are ignored. Windows are
 * `{ key: Uint8Array, start: bigint, value: Uint8Array }`.
 */
export class WindowStore {
  constructor(name) {
    this.name = name;
  }

  /** `start` as a BigInt the host can be given. */
  #start(start) {
    const s = i64(start, 'start');
    if (s < 0n) {
      throw new RecordError(`window store "${this.name}": window start ${s} is negative: ${NEGATIVE_S64}`);
    }
    return s;
  }

  /** The value of the window of `key` starting at `start`, or undefined. */
  get(key, start) {
    const s = this.#start(start);
    return stateCall(() => windowGet(this.name, bytes(key), s)) ?? undefined;
  }

  /** The value of a window as a BigInt in decimal text (as putI64 writes it), or undefined. */
  getI64(key, start) {
    const k = bytes(key);
    const s = this.#start(start);
    const value = this.get(k, s);
    if (value === undefined) return undefined;
    const n = parseI64(value);
    if (n !== undefined) return n;
    throw new RecordError(
      `window store "${this.name}": the window of key "${escapeAscii(k)}" at ${s} is not an integer`,
    );
  }

  /** Sets the value of the window of `key` starting at `start`. */
  put(key, start, value) {
    const s = this.#start(start);
    stateCall(() => windowPut(this.name, bytes(key), s, bytes(value)));
  }

  /** Sets a window's value to a BigInt (or integer Number) in decimal text. */
  putI64(key, start, value) {
    this.put(key, start, BigInt(value).toString());
  }

  /** Removes the window of `key` starting at `start`. */
  delete(key, start) {
    const s = this.#start(start);
    stateCall(() => windowDelete(this.name, bytes(key), s));
  }

  /** The windows of `key` whose start is in [earliest, latest], by start. */
  fetch(key, earliest, latest) {
    const from = i64(earliest, 'earliest');
    const to = i64(latest, 'latest');
    if (to < 0n) return [];
    return stateCall(() => windowFetch(this.name, bytes(key), from < 0n ? 0n : from, to));
  }

  /**
   * The windows of every key whose start is in [earliest, latest], in
   * (key, start) order, fetched from the host DEFAULT_WINDOW_PAGE at a time.
   */
  *fetchAll(earliest, latest) {
    let from = i64(earliest, 'earliest');
    const to = i64(latest, 'latest');
    if (to < 0n) return;
    if (from < 0n) from = 0n;
    let after;
    for (;;) {
      const page = stateCall(() => windowFetchAll(this.name, from, to, after, DEFAULT_WINDOW_PAGE));
      yield* page;
      if (page.length < DEFAULT_WINDOW_PAGE) return;
      const last = page[page.length - 1];
      after = { key: last.key, start: last.start };
    }
  }
}

/** x within i64, saturating. */
function saturate(x) {
  return x > I64_MAX ? I64_MAX : x < I64_MIN ? I64_MIN : x;
}

/** A duration in ms (a non-negative integer), saturating at the i64 maximum. */
function durationMs(value, what) {
  const n = BigInt(value);
  if (n < 0n) throw new RangeError(`${what} must not be negative (got ${n})`);
  return n > I64_MAX ? I64_MAX : n;
}

/** A window length in ms: at least 1. */
function windowLength(value, what) {
  const n = durationMs(value, what);
  return n === 0n ? 1n : n;
}

function gcd(a, b) {
  while (b !== 0n) [a, b] = [b, a % b];
  return a;
}

/**
 * Fixed-size windows aligned to the epoch, as Kafka Streams' TimeWindows:
 * tumbling (advance = size) or hopping (advance < size), with a grace
 * period. A window [start, start + size) is open until stream time reaches
 * start + size + grace; a record all of whose windows have closed is late.
 * Times are BigInt ms (Numbers are accepted).
 */
export class TimeWindows {
  constructor(sizeMs, advanceMs, graceMs) {
    this.sizeMs = sizeMs;
    this.advanceMs = advanceMs;
    this.graceMs = graceMs;
    Object.freeze(this);
  }

  /** Windows of `sizeMs` one after the other (0 counts as 1 ms). */
  static tumbling(sizeMs, graceMs) {
    const size = windowLength(sizeMs, 'sizeMs');
    return new TimeWindows(size, size, durationMs(graceMs, 'graceMs'));
  }

  /** Windows of `sizeMs` starting every `advanceMs` (at most `sizeMs`). */
  static hopping(sizeMs, advanceMs, graceMs) {
    const size = windowLength(sizeMs, 'sizeMs');
    const advance = windowLength(advanceMs, 'advanceMs');
    return new TimeWindows(size, advance < size ? advance : size, durationMs(graceMs, 'graceMs'));
  }

  /** The end (exclusive) of the window starting at `start`. */
  end(start) {
    return saturate(BigInt(start) + this.sizeMs);
  }

  /**
   * The starts of the windows that contain `timestamp`, ascending (Kafka
   * Streams' windowsFor: no window starts before the epoch).
   */
  windowsFor(timestamp) {
    const ts = BigInt(timestamp);
    // Wrapping, as the Rust SDK's i64 arithmetic.
    let first = BigInt.asIntN(64, ts - this.sizeMs + this.advanceMs);
    if (first < 0n) first = 0n;
    first -= first % this.advanceMs;
    const starts = [];
    for (let start = first; start <= ts; start += this.advanceMs) starts.push(start);
    return starts;
  }

  /** Whether the window starting at `start` has closed at `streamTime`. */
  isClosed(start, streamTime) {
    return saturate(this.end(start) + this.graceMs) <= BigInt(streamTime);
  }

  /**
   * The windows containing `timestamp` still open at `streamTime` (all of
   * them when it is undefined, before the first record): empty means the
   * record is late.
   */
  openWindows(timestamp, streamTime) {
    const starts = this.windowsFor(timestamp);
    if (streamTime === undefined || streamTime === null) return starts;
    return starts.filter((start) => !this.isClosed(start, streamTime));
  }

  /**
   * The stream-time punctuation interval, ms (a BigInt), that falls on every
   * point where one of these windows closes (end + grace of each), so that
   * takeClosed in punctuate emits each window at the record that closes it.
   */
  punctuationInterval() {
    const a = this.advanceMs;
    const offset = ((BigInt.asIntN(64, this.sizeMs + this.graceMs) % a) + a) % a;
    const every = gcd(a, offset);
    return every > 1n ? every : 1n;
  }

  /**
   * Every window of `store` (a WindowStore) closed at `streamTime`: calls
   * `each(window)` on it, then deletes it (emit final). Returns how many
   * there were.
   */
  takeClosed(store, streamTime, each) {
    const latest = saturate(saturate(BigInt(streamTime) - this.graceMs) - this.sizeMs);
    const closed = [...store.fetchAll(I64_MIN, latest)];
    for (const window of closed) {
      each(window);
      store.delete(window.key, window.start);
    }
    return closed.length;
  }
}

/** The later of two BigInts. */
const later = (a, b) => (a > b ? a : b);
/** The earlier of two BigInts. */
const earlier = (a, b) => (a < b ? a : b);

/**
 * A window of a session store as a session: its value is the session's end
 * (8 bytes, big-endian) followed by the aggregate; undefined when shorter.
 */
function decodeSession(window) {
  const value = window.value;
  if (value.length < 8) return undefined;
  const end = new DataView(value.buffer, value.byteOffset, 8).getBigInt64(0);
  return { key: window.key, start: window.start, end, value: value.subarray(8) };
}

/** A session's stored value: its end (8 bytes, big-endian), then the aggregate. */
function encodeSession(end, aggregate) {
  const out = new Uint8Array(8 + aggregate.length);
  new DataView(out.buffer).setBigInt64(0, end);
  out.set(aggregate, 8);
  return out;
}

/**
 * Session windows, as Kafka Streams' SessionWindows and the Rust SDK's
 * `SessionWindows`: a key's records closer than `gap` to each other form one
 * session [start, end] (the first and last record's times), and a record
 * bridging two sessions merges them. A record is late when its merged
 * session ends before streamTime - gap - grace (Kafka Streams' rule); a
 * session is closed, and emitted, once stream time passes end + 2 * gap +
 * grace, when no record the rule accepts can touch it any more
 * (docs/time.md). Sessions live in a WindowStore under their start; the
 * value is the session's end (8 bytes, big-endian) followed by the aggregate,
 * as in every SDK. Sessions are `{ key: Uint8Array, start: bigint, end:
 * bigint, value: Uint8Array }`. Times are BigInt ms (Numbers are accepted).
 */
export class SessionWindows {
  constructor(gapMs, graceMs) {
    this.gapMs = gapMs;
    this.graceMs = graceMs;
    Object.freeze(this);
  }

  /** Sessions split by `gapMs` of inactivity, with `graceMs` for records out of order. */
  static withGap(gapMs, graceMs) {
    return new SessionWindows(durationMs(gapMs, 'gapMs'), durationMs(graceMs, 'graceMs'));
  }

  /**
   * Whether a record is late at `streamTime` when its session (merged with
   * the sessions it touches) ends at `end`: end < streamTime - gap - grace.
   */
  isLate(end, streamTime) {
    return saturate(saturate(BigInt(end) + this.gapMs) + this.graceMs) < BigInt(streamTime);
  }

  /**
   * Whether a session ending at `end` is closed at `streamTime`: no record
   * isLate accepts can touch it any more, streamTime > end + 2 * gap + grace.
   */
  isClosed(end, streamTime) {
    const reach = saturate(saturate(BigInt(end) + this.gapMs) + this.gapMs);
    return saturate(reach + this.graceMs) < BigInt(streamTime);
  }

  /**
   * Adds a record of `key` at `timestamp` to `store` (a WindowStore): merges
   * the sessions it touches into one (their aggregates folded with
   * `merge(a, b)`, oldest first) and adds the record with `add(aggregate)`
   * (undefined: a new session); both return the new aggregate (bytes or a
   * string). Returns the session, or undefined when the record is late
   * (report it with ctx.reportLate). `streamTime` undefined: before the
   * first record, nothing is late.
   */
  record(store, key, timestamp, streamTime, merge, add) {
    const k = bytes(key);
    const ts = i64(timestamp, 'timestamp');
    const touching = [];
    for (const window of store.fetch(k, I64_MIN, saturate(ts + this.gapMs))) {
      const session = decodeSession(window);
      if (session !== undefined && saturate(session.end + this.gapMs) >= ts) touching.push(session);
    }
    let start = ts;
    let end = ts;
    for (const s of touching) {
      start = earlier(start, s.start);
      end = later(end, s.end);
    }
    if (streamTime !== undefined && streamTime !== null && this.isLate(end, streamTime)) return undefined;
    let folded;
    for (const s of touching) {
      folded = folded === undefined ? s.value : bytes(merge(folded, s.value));
      store.delete(k, s.start);
    }
    const value = bytes(add(folded));
    store.put(k, start, encodeSession(end, value));
    return { key: k, start, end, value };
  }

  /**
   * Every session of `store` closed at `streamTime`: calls `each(session)`
   * on it, then deletes it (emit final). Returns how many there were.
   */
  takeClosed(store, streamTime, each) {
    const now = BigInt(streamTime);
    const latest = saturate(saturate(saturate(now - this.graceMs) - this.gapMs) - this.gapMs);
    const closed = [];
    for (const window of store.fetchAll(I64_MIN, latest)) {
      const session = decodeSession(window);
      if (session !== undefined && this.isClosed(session.end, now)) closed.push(session);
    }
    for (const session of closed) {
      each(session);
      store.delete(session.key, session.start);
    }
    return closed.length;
  }
}

/**
 * Asks the host to call the processor's `punctuate(ctx, streamTime)`
 * whenever the task's stream time reaches a multiple of `intervalMs` (and
 * once at the task's first record). Only `init` may call it (it throws a
 * RecordError anywhere else); 0 cancels.
 */
export function schedulePunctuation(intervalMs) {
  const ms = BigInt(intervalMs);
  if (ms < 0n || ms > U64_MAX) throw new RangeError(`intervalMs ${ms} is outside 0..2^64-1`);
  try {
    contextSchedulePunctuation(ms);
  } catch (error) {
    throw new RecordError(String(payloadOf(error)));
  }
}

/** What a processor may do while processing one record (or punctuating). */
export class Context {
  constructor(config) {
    this.config = config;
    /** The record's index in its batch; undefined in punctuate. */
    this.index = undefined;
  }

  store(name) {
    return new Store(name);
  }

  /** The window store called `name`, declared under [window-stores] in the manifest. */
  windowStore(name) {
    return new WindowStore(name);
  }

  /**
   * The task's stream time (a BigInt, ms): the largest record timestamp it
   * has seen, counting this record (in punctuate, the time it was called
   * for); undefined before the task's first record.
   */
  streamTime() {
    return contextStreamTime() ?? undefined;
  }

  /**
   * Reports this record as late (its window had closed): leave no other mark
   * for it and return normally; the host counts and drops it or hands it to
   * the error policy with `message`, as the manifest's [time] late-records
   * says. Outside process it does nothing.
   */
  reportLate(message) {
    if (this.index !== undefined) lateRecord(this.index, String(message));
  }

  /** Emits to the topic the manifest maps `alias` to; undefined key/value = null/tombstone. */
  emit(alias, key, value, headers = NO_HEADERS) {
    try {
      // bytes() inline: in an interpreter every call counts.
      outputEmit(
        alias,
        typeof key === 'string' ? encoder.encode(key) : key,
        typeof value === 'string' ? encoder.encode(value) : value,
        headers.length === 0 ? NO_HEADERS : headers.map(([k, v]) => ({ key: k, value: bytes(v) })),
      );
    } catch (error) {
      const e = payloadOf(error);
      if (e && e.tag === 'unknown-alias') {
        throw new RecordError(`unknown output alias "${e.val}": declare it under [outputs] in onceflow.toml`);
      }
      if (e && e.tag === 'too-large') {
        throw new RecordError(`output record too large: the host accepts at most ${e.val} bytes`);
      }
      throw error;
    }
  }

  /** level: 'trace' | 'debug' | 'info' | 'warn' | 'error'. */
  log(level, message) {
    logWrite(level, message);
  }
}

/** The message of an unexpected exception, logged with its stack. */
function bug(error) {
  const message = `processor error: ${String(error)}`;
  logWrite('error', error instanceof Error ? `${message}\n${error.stack}` : message);
  return message;
}

/**
 * The world's exports (`init`, `process`, `punctuate`) running
 * `processRecord(ctx, record)` for every record of a batch,
 * `initProcessor(config)` once per instance and `punctuateProcessor(ctx,
 * streamTime)` at every scheduled punctuation. Also callable with one object:
 * `exportProcessor({ init, process, punctuate })`. Without a punctuate
 * function, punctuate does nothing.
 */
export function exportProcessor(processRecord, initProcessor, punctuateProcessor) {
  if (typeof processRecord === 'object' && processRecord !== null) {
    ({ process: processRecord, init: initProcessor, punctuate: punctuateProcessor } = processRecord);
  }
  let config = new Map();
  return {
    init(pairs) {
      config = new Map(pairs);
      if (!initProcessor) return;
      try {
        initProcessor(config);
      } catch (error) {
        throw error instanceof RecordError ? error.message : bug(error);
      }
    },
    process(batch) {
      const ctx = new Context(config);
      for (let index = 0; index < batch.length; index++) {
        beginRecord(index);
        ctx.index = index;
        try {
          processRecord(ctx, batch[index]);
        } catch (error) {
          if (error instanceof RecordError) {
            throw { recordIndex: index, message: error.message };
          }
          throw { recordIndex: index, message: bug(error) };
        }
      }
    },
    punctuate(streamTime) {
      if (!punctuateProcessor) return;
      const ctx = new Context(config);
      try {
        punctuateProcessor(ctx, streamTime);
      } catch (error) {
        if (error instanceof RecordError) {
          throw { recordIndex: undefined, message: error.message };
        }
        throw { recordIndex: undefined, message: bug(error) };
      }
    },
  };
}
