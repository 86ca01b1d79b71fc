// Types of onceflow.js, the JavaScript SDK layer (for TypeScript processors).
// The record and error types come from the declarations `onceflow build`
// generates from wit/processor.wit.
import type { Record as WitRecord, ProcessError } from 'onceflow:processor/types@0.2.0';

export type Record = WitRecord;
export type Bytes = Uint8Array | string;
export type Level = 'trace' | 'debug' | 'info' | 'warn' | 'error';
/** A time or duration in ms; BigInt or integer Number. */
export type Millis = bigint | number;

export class RecordError extends Error {
  constructor(message: string);
}

export function bytes(data: Bytes): Uint8Array;
export function escapeAscii(data: Uint8Array): string;
/** The bytes as UTF-8 text (strict, a BOM kept, as Rust's str::from_utf8); undefined if not UTF-8. */
export function decodeUtf8(data: Uint8Array): string | undefined;
/** The key as UTF-8 text; throws a RecordError ("record has no key", "record key is not UTF-8 text"). */
export function keyStr(record: Record): string;
/** The value as UTF-8 text; throws a RecordError ("record has no value", "record value is not UTF-8 text"). */
export function valueStr(record: Record): string;
/** The value parsed as JSON (inputs of format `json` or `avro`: docs/formats.md); throws a RecordError when absent or not JSON. */
export function valueJson(record: Record): any;

declare global {
  // The engine provides the Encoding API; `--lib es2022` does not declare it.
  interface TextDecodeOptions {
    stream?: boolean;
  }
  interface TextDecoderOptions {
    fatal?: boolean;
    ignoreBOM?: boolean;
  }
  class TextDecoder {
    constructor(label?: string, options?: TextDecoderOptions);
    readonly encoding: string;
    readonly fatal: boolean;
    readonly ignoreBOM: boolean;
    decode(input?: Uint8Array | ArrayBuffer, options?: TextDecodeOptions): string;
  }
  class TextEncoder {
    constructor();
    readonly encoding: string;
    encode(input?: string): Uint8Array;
  }
}

export class Store {
  constructor(name: string);
  readonly name: string;
  get(key: Bytes): Uint8Array | undefined;
  getI64(key: Bytes): bigint | undefined;
  put(key: Bytes, value: Bytes): void;
  putI64(key: Bytes, value: bigint | number): void;
  delete(key: Bytes): void;
  scanPrefix(prefix: Bytes, page?: number): Generator<[Uint8Array, Uint8Array]>;
}

/** A window of a window store. */
export interface Window {
  key: Uint8Array;
  /** The window's start, ms since the epoch. */
  start: bigint;
  value: Uint8Array;
}

/** How many windows WindowStore.fetchAll asks the host for at a time. */
export const DEFAULT_WINDOW_PAGE: number;

/** A window store declared under [window-stores.NAME] in the manifest. */
export class WindowStore {
  constructor(name: string);
  readonly name: string;
  get(key: Bytes, start: Millis): Uint8Array | undefined;
  getI64(key: Bytes, start: Millis): bigint | undefined;
  put(key: Bytes, start: Millis, value: Bytes): void;
  putI64(key: Bytes, start: Millis, value: bigint | number): void;
  delete(key: Bytes, start: Millis): void;
  /** The windows of `key` whose start is in [earliest, latest], by start. */
  fetch(key: Bytes, earliest: Millis, latest: Millis): Array<Window>;
  /** The windows of every key whose start is in [earliest, latest], in (key, start) order. */
  fetchAll(earliest: Millis, latest: Millis): Generator<Window>;
}

/** Tumbling or hopping windows aligned to the epoch, with a grace period (Kafka Streams' TimeWindows). */
export class TimeWindows {
  private constructor();
  static tumbling(sizeMs: Millis, graceMs: Millis): TimeWindows;
  static hopping(sizeMs: Millis, advanceMs: Millis, graceMs: Millis): TimeWindows;
  readonly sizeMs: bigint;
  readonly advanceMs: bigint;
  readonly graceMs: bigint;
  /** The end (exclusive) of the window starting at `start`. */
  end(start: Millis): bigint;
  /** The starts of the windows containing `timestamp`, ascending (none before the epoch). */
  windowsFor(timestamp: Millis): Array<bigint>;
  /** Whether the window starting at `start` has closed at `streamTime`. */
  isClosed(start: Millis, streamTime: Millis): boolean;
  /** The windows containing `timestamp` still open at `streamTime`: empty means late. */
  openWindows(timestamp: Millis, streamTime: Millis | undefined): Array<bigint>;
  /** The punctuation interval (ms) that falls on every point where a window closes. */
  punctuationInterval(): bigint;
  /** Calls `each` on every window of `store` closed at `streamTime`, then deletes it; returns how many. */
  takeClosed(store: WindowStore, streamTime: Millis, each: (window: Window) => void): number;
}

/** A session of a SessionWindows store: key, first and last record times, aggregate. */
export interface Session {
  key: Uint8Array;
  /** The first record's time, ms. */
  start: bigint;
  /** The last record's time, ms. */
  end: bigint;
  value: Uint8Array;
}

/**
 * Session windows (Kafka Streams' SessionWindows): records of a key closer
 * than the gap form one session; a record whose merged session ends before
 * streamTime - gap - grace is late; a session closes once stream time
 * passes end + 2 * gap + grace. Stored under their start, the value being
 * the end (8 bytes, big-endian) then the aggregate.
 */
export class SessionWindows {
  private constructor();
  static withGap(gapMs: Millis, graceMs: Millis): SessionWindows;
  readonly gapMs: bigint;
  readonly graceMs: bigint;
  /** Whether a record whose merged session ends at `end` is late at `streamTime`. */
  isLate(end: Millis, streamTime: Millis): boolean;
  /** Whether a session ending at `end` is closed at `streamTime` (streamTime > end + 2 * gap + grace). */
  isClosed(end: Millis, streamTime: Millis): boolean;
  /**
   * Adds a record to the sessions it touches (merged with `merge`, oldest
   * first; `add` folds the record in, undefined: a new session); undefined
   * when the record is late.
   */
  record(
    store: WindowStore,
    key: Bytes,
    timestamp: Millis,
    streamTime: Millis | undefined,
    merge: (a: Uint8Array, b: Uint8Array) => Bytes,
    add: (aggregate: Uint8Array | undefined) => Bytes,
  ): Session | undefined;
  /** Calls `each` on every session of `store` closed at `streamTime`, then deletes it; returns how many. */
  takeClosed(store: WindowStore, streamTime: Millis, each: (session: Session) => void): number;
}

/** Asks the host to call punctuate as stream time passes multiples of `intervalMs`; only from init. */
export function schedulePunctuation(intervalMs: Millis): void;

export class Context {
  readonly config: Map<string, string>;
  /** The record's index in its batch; undefined in punctuate. */
  readonly index: number | undefined;
  store(name: string): Store;
  windowStore(name: string): WindowStore;
  /** The task's stream time, ms; undefined before its first record. */
  streamTime(): bigint | undefined;
  /** Reports this record as late (its window had closed); nothing outside process. */
  reportLate(message: string): void;
  emit(alias: string, key: Bytes | undefined, value: Bytes | undefined, headers?: Array<[string, Bytes]>): void;
  log(level: Level, message: string): void;
}

export interface Exports {
  init(config: Array<[string, string]>): void;
  /** Throws a ProcessError naming the failed record. */
  process(batch: Array<Record>): void;
  /** Throws a ProcessError without a record index. */
  punctuate(streamTime: bigint): void;
}

export type { ProcessError };

export type ProcessFn = (ctx: Context, record: Record) => void;
export type InitFn = (config: Map<string, string>) => void;
export type PunctuateFn = (ctx: Context, streamTime: bigint) => void;

export function exportProcessor(
  processRecord: ProcessFn,
  initProcessor?: InitFn,
  punctuateProcessor?: PunctuateFn,
): Exports;
export function exportProcessor(processor: {
  process: ProcessFn;
  init?: InitFn;
  punctuate?: PunctuateFn;
}): Exports;
