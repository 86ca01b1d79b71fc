// See onceflow.toml. Each record's value is a command; the record's key (when
// it has one) is used as bytes the export glue made (the bindings' realm),
// and strings go through the SDK's TextEncoder (the processor's realm).

import { exportProcessor, RecordError, valueJson } from './onceflow.js';

const decoder = new TextDecoder();
const text = (bytes) => (bytes === undefined ? '(none)' : decoder.decode(bytes));

const SIZES = [10, 3000, 40000, 70000, 100];
// Arguments in the glue's reused area, and past its 64 KiB largest.
const IN_AREA = new Uint8Array(10000).fill(97);
const PAST_AREA = new Uint8Array(70000).fill(98);
const pattern = (size) => 'abcdefghijklmnopqrstuvwxyz'.repeat(Math.ceil(size / 26)).slice(0, size);

function run(ctx, record) {
  const kv = ctx.store('kv');
  const command = text(record.value);
  if (command.startsWith('{') || command === 'not json') {
    // The SDK's JSON reader (docs/languages.md).
    let result;
    try {
      result = JSON.stringify(valueJson(record));
    } catch (e) {
      if (!(e instanceof RecordError)) throw e;
      result = `error: ${e.message}`;
    }
    ctx.emit('out', 'json', result);
    return;
  }
  switch (command) {
    case 'strings': // processor-realm Uint8Arrays (SDK-encoded strings)
      kv.put('s', 'string value');
      ctx.emit('out', 's', kv.get('s'));
      return;
    case 'record-bytes': // the record's own key and value (bindings realm)
      kv.put(record.key, record.value);
      ctx.emit('out', record.key, kv.get(record.key));
      return;
    case 'empty': // empty key and value
      kv.put(new Uint8Array(0), new Uint8Array(0));
      ctx.emit('out', new Uint8Array(0), kv.get(new Uint8Array(0)));
      return;
    case 'missing': // get of an absent key, emit without key or value
      ctx.emit('out', undefined, kv.get('absent') === undefined ? 'absent' : 'present');
      ctx.emit('out', 'tombstone', undefined);
      return;
    case 'array': // plain arrays of numbers: the generated functions
      kv.put([97, 114], [49, 50]);
      ctx.emit('out', [97, 114], kv.get([97, 114]));
      return;
    case 'headers': // emit with headers: the generated function
      ctx.emit('out', 'h', 'with headers', [['h1', 'v1'], ['h2', new Uint8Array([118, 50])]]);
      return;
    case 'large': { // a value past the host's limit: too-large, its u64 decoded
      kv.put('big', new Uint8Array(1024 * 1024 + 1));
      return;
    }
    case 'record-fields': { // what the export glue lifted: every field, headers too
      const headers = record.headers.map((h) => `${h.key}=${text(h.value)}`).join(',');
      const fields = `${record.topic}|${record.partition}|${record.offset}|${record.timestamp}|${text(record.key)}|${headers}`;
      ctx.emit('out', 'fields', fields);
      return;
    }
    case 'sizes': { // arguments past the glue's reused area, and past its largest
      for (const size of SIZES) kv.put(`size-${size}`, pattern(size));
      for (const size of SIZES) {
        const back = kv.get(`size-${size}`);
        ctx.emit('out', `size-${size}`, `${back.length} ${text(back) === pattern(size)}`);
      }
      ctx.emit('out', 'emitted-70000', kv.get('size-70000'));
      return;
    }
    case 'area': // no output: see js_glue_argument_areas_do_not_outlive_their_export_call
      kv.put('area', IN_AREA);
      kv.put('area', PAST_AREA);
      return;
    case 'unknown-store-get':
      ctx.store('nope').get('k');
      return;
    case 'unknown-store-put':
      ctx.store('nope').put('k', 'v');
      return;
    case 'unknown-alias':
      ctx.emit('nope', 'k', 'v');
      return;
    case 'after-errors': // the store still reads what this call wrote
      ctx.emit('out', 's', kv.get('s'));
      return;
    default:
      throw new RecordError(`unknown command ${command}`);
  }
}

export const { init, process, punctuate } = exportProcessor(run);
