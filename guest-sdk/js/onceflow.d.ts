// Types of onceflow.js, the JavaScript SDK layer (for TypeScript processors).
// The record and error types come from the declarations `onceflow build`
// generates from wit/processor.wit.
import type { Record as WitRecord, ProcessError } from 'onceflow:processor/types@0.1.0';

export type Record = WitRecord;
export type Bytes = Uint8Array | string;
export type Level = 'trace' | 'debug' | 'info' | 'warn' | 'error';

export class RecordError extends Error {
  constructor(message: string);
}

export function bytes(data: Bytes): Uint8Array;
export function escapeAscii(data: Uint8Array): string;

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

export class Context {
  readonly config: Map<string, string>;
  store(name: string): Store;
  emit(alias: string, key: Bytes | undefined, value: Bytes | undefined, headers?: Array<[string, Bytes]>): void;
  log(level: Level, message: string): void;
}

export interface Exports {
  init(config: Array<[string, string]>): void;
  /** Throws a ProcessError naming the failed record. */
  process(batch: Array<Record>): void;
  punctuate(streamTime: bigint): void;
}

export type { ProcessError };

export function exportProcessor(
  processRecord: (ctx: Context, record: Record) => void,
  initProcessor?: (config: Map<string, string>) => void,
): Exports;
