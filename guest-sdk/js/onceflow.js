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

import {
  get as stateGet,
  put as statePut,
  delete as stateDelete,
  scanPrefix as stateScanPrefix,
} from 'onceflow:processor/state@0.1.0';
import { emit as outputEmit } from 'onceflow:processor/output@0.1.0';
import { write as logWrite } from 'onceflow:processor/log@0.1.0';
import { beginRecord } from 'onceflow:processor/context@0.1.0';

const encoder = new TextEncoder();
const I64_MIN = -(2n ** 63n);
const I64_MAX = 2n ** 63n - 1n;
const NO_HEADERS = [];

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

function payloadOf(error) {
  return error !== null && typeof error === 'object' && 'payload' in error ? error.payload : error;
}

function stateCall(call) {
  try {
    return call();
  } catch (error) {
    const e = payloadOf(error);
    if (e && e.tag === 'unknown-store') {
      throw new RecordError(`unknown state store "${e.val}": declare it under stores in onceflow.toml`);
    }
    if (e && e.tag === 'too-large') {
      throw new RecordError(`state key or value too large: the host accepts at most ${e.val} bytes`);
    }
    throw error;
  }
}

/** A state store declared in the manifest's `stores`. */
export class Store {
  constructor(name) {
    this.name = name;
  }

  /** The value of `key`, or undefined. */
  get(key) {
    return stateCall(() => stateGet(this.name, bytes(key))) ?? undefined;
  }

  /** The value as a BigInt stored in decimal text (as putI64 writes it), or undefined. */
  getI64(key) {
    const k = bytes(key);
    const value = this.get(k);
    if (value === undefined) return undefined;
    let text = '';
    for (const b of value) text += String.fromCharCode(b);
    // Rust's i64::from_str: an optional sign, then ASCII digits only.
    if (/^[+-]?[0-9]+$/.test(text)) {
      const n = BigInt(text[0] === '+' ? text.slice(1) : text);
      if (n >= I64_MIN && n <= I64_MAX) return n;
    }
    throw new RecordError(
      `state store "${this.name}": the value of key "${escapeAscii(k)}" is not a decimal integer`,
    );
  }

  put(key, value) {
    stateCall(() => statePut(this.name, bytes(key), bytes(value)));
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

/** What a processor may do while processing one record. */
export class Context {
  constructor(config) {
    this.config = config;
  }

  store(name) {
    return new Store(name);
  }

  /** Emits to the topic the manifest maps `alias` to; undefined key/value = null/tombstone. */
  emit(alias, key, value, headers = NO_HEADERS) {
    try {
      outputEmit(
        alias,
        key === undefined ? undefined : bytes(key),
        value === undefined ? undefined : bytes(value),
        headers.map(([k, v]) => ({ key: k, value: bytes(v) })),
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

/**
 * The world's exports (`init`, `process`, `punctuate`) running
 * `processRecord(ctx, record)` for every record of a batch.
 */
export function exportProcessor(processRecord, initProcessor) {
  let config = new Map();
  return {
    init(pairs) {
      config = new Map(pairs);
      if (initProcessor) initProcessor(config);
    },
    process(batch) {
      const ctx = new Context(config);
      for (let index = 0; index < batch.length; index++) {
        beginRecord(index);
        try {
          processRecord(ctx, batch[index]);
        } catch (error) {
          if (error instanceof RecordError) {
            throw { recordIndex: index, message: error.message };
          }
          const message = `processor error: ${String(error)}`;
          logWrite('error', error instanceof Error ? `${message}\n${error.stack}` : message);
          throw { recordIndex: index, message };
        }
      }
    },
    punctuate(_streamTime) {
      // Not called by the host yet.
    },
  };
}
