// Runs ComponentizeJS for `onceflow build` with leaner import glue.
//
// ComponentizeJS generates the JavaScript that lowers every import call into
// the component's memory (jco's bindgen). Inside WebAssembly there is no JIT,
// so that glue runs in SpiderMonkey's interpreter, and for the calls a
// processor makes on every record it cost more than the processor's own work
// (docs/languages.md, "Why JavaScript is slow"): an emit of a key and a value
// burned ~310 k fuel, a state get ~200 k. This script changes the generated
// bindings before ComponentizeJS pre-initializes them:
//
// - the `_debugLog(...)` statements are removed (each built an object and
//   probed `process.env.JCO_DEBUG`, which a component never has);
// - a string argument is encoded with one `TextEncoder.encode` instead of a
//   per-character sizing loop before `encodeInto` (same bytes, lone
//   surrogates included: both write U+FFFD);
// - `state.get`, `state.put` and `output.emit`, when their byte arguments are
//   Uint8Arrays (what the SDK layer passes) and emit has no headers, copy all
//   their arguments into one area, reused for the export call's later import
//   calls, and read the result in a few statements; any other argument goes
//   to the generated function, kept under another name. Errors decode as the
//   generated code does;
// - the export's batch of records is lifted by one function reading typed-
//   array views of the memory, instead of the generated code's DataView
//   calls per field.
//
// What each operation costs in the interpreter, and so why these shapes, is
// in docs/languages.md ("Why JavaScript is slow, and what helps").
//
// The patterns below are those of the pinned componentize-js release
// (COMPONENTIZE_JS_VERSION in js.rs); if one is not found the build fails
// with a message saying so, rather than silently shipping the slow glue.
//
// Usage: node js_glue.mjs <request.json>, the request holding
// { componentize, source, wit, out, aot, wevalBin }.

import { readFile, rm, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { pathToFileURL } from 'node:url';

const request = JSON.parse(await readFile(process.argv[2], 'utf8'));

function fail(what) {
  throw new Error(
    `the bindings of componentize-js changed (${what}): host/src/build/js_glue.mjs must follow the pinned version`,
  );
}

/** Replaces the one occurrence of `from` in `text`. */
function replaceOnce(text, from, to, what) {
  const at = text.indexOf(from);
  if (at < 0 || text.indexOf(from, at + from.length) >= 0) fail(what);
  return text.slice(0, at) + to + text.slice(at + from.length);
}

function withoutDebugLogs(bindings) {
  let removed = 0;
  const out = bindings.replace(/^[ \t]*_debugLog\([\s\S]*?\);[ \t]*$/gm, () => {
    removed++;
    return '';
  });
  if (removed === 0 || /_debugLog\(/.test(out.replace(/const _debugLog = /, ''))) fail('_debugLog calls');
  return out;
}

function withOneEncode(bindings) {
  const head = 'function _utf8AllocateAndEncode(s, realloc, memory) {';
  const start = bindings.indexOf(head);
  if (start < 0) fail('_utf8AllocateAndEncode');
  const end = bindings.indexOf('\n}\n', start);
  if (end < 0) fail('the end of _utf8AllocateAndEncode');
  return (
    bindings.slice(0, start) +
    `function _utf8AllocateAndEncode(s, realloc, memory) {
  if (typeof s !== 'string') {
    throw new TypeError('expected a string, received [' + typeof s + ']');
  }
  if (s.length === 0) { return { ptr: 1, len: 0 }; }
  const bytes = TEXT_ENCODER_UTF8.encode(s);
  const ptr = realloc(0, 0, 1, bytes.length);
  new Uint8Array(memory.buffer, ptr, bytes.length).set(bytes);
  return { ptr, len: bytes.length };
}` +
    bindings.slice(end + 2)
  );
}

const STATE = 'import_onceflow_processor_state_0_2_0';
const OUTPUT = 'import_onceflow_processor_output_0_2_0';
const CONTEXT = 'import_onceflow_processor_context_0_2_0';

// The fast paths, in one closure. In SpiderMonkey's interpreter (a component
// has no JIT) a top-level name of the bindings script is looked up by name
// at every use, and the generated `dataView($memory)` is a call and two such
// lookups: each cost several thousand fuel. Inside the closure the same
// values are closure slots. A string argument that is not a string, a byte
// argument that is not a Uint8Array, or headers go to the generated function.
const FAST = `
const [
  ${STATE}$get,
  ${STATE}$put,
  ${OUTPUT}$emit,
  ${CONTEXT}$beginRecord,
  __onceflowLiftRecords,
  __onceflowNewCall,
] = (() => {
  const memory = $memory;
  const realloc = $realloc;
  const dealloc = $dealloc;
  const rawGet = $import_onceflow_processor_state_0_2_0$get;
  const rawPut = $import_onceflow_processor_state_0_2_0$put;
  const rawEmit = $import_onceflow_processor_output_0_2_0$emit;
  const rawBeginRecord = $import_onceflow_processor_context_0_2_0$beginRecord;
  const stockGet = __stock_${STATE}$get;
  const stockPut = __stock_${STATE}$put;
  const stockEmit = __stock_${OUTPUT}$emit;
  const encoder = TEXT_ENCODER_UTF8;
  const decoder = TEXT_DECODER_UTF8;
  const Bytes = Uint8Array;
  // The processor's own Uint8Arrays come from the content global, a different
  // realm from these bindings' (whose Uint8Arrays the export glue hands it).
  const ContentBytes = contentGlobal.Uint8Array;
  const Failure = ComponentError;

  // Views of the memory by byte, 32-bit and 64-bit word (every field the
  // fast paths read is aligned to its size): an element read is cheaper in
  // the interpreter than a DataView call (a property lookup and a native
  // call). fresh() renews them after anything that may have grown the
  // memory (a realloc): its buffer is then another.
  let buffer;
  let u8;
  let u32;
  let i64;

  function fresh() {
    const now = memory.buffer;
    if (now !== buffer) {
      buffer = now;
      u8 = new Bytes(now);
      u32 = new Uint32Array(now, 0, now.byteLength >>> 2);
      i64 = new BigInt64Array(now, 0, now.byteLength >>> 3);
    }
  }

  // The arguments of an import call go into one area, reused by the next
  // call: ComponentizeJS's realloc, reached from JavaScript, costs more than
  // the rest of an import call, and what it allocates lives until the export
  // call returns (its post-call frees it; tests/offline/languages.rs,
  // js_glue_argument_areas_do_not_outlive_their_export_call, fails if a
  // componentize-js release stops doing so). So the area is taken afresh in
  // every export call (newCall), grows by doubling, and arguments larger than
  // AREA_MAX get an allocation of their own.
  const AREA_MAX = 65536;
  let area = 0;
  let areaSize = 0;

  function newCall() {
    area = 0;
    areaSize = 0;
  }

  /** Where an import call's size bytes of arguments go. */
  function argumentsArea(size) {
    if (size <= areaSize) return area;
    if (size > AREA_MAX) return realloc(0, 0, 1, size);
    let want = 1024;
    while (want < size) want *= 2;
    area = realloc(0, 0, 1, want);
    areaSize = want;
    return area;
  }

  function isBytes(value) {
    return value instanceof ContentBytes || value instanceof Bytes;
  }

  // The error paths below run after fresh(), as the fast paths call them.
  function text(ret) {
    const ptr = u32[(ret + 16) >>> 2];
    const len = u32[(ret + 20) >>> 2];
    const out = decoder.decode(u8.subarray(ptr, ptr + len));
    if (len !== 0) dealloc(ptr, len, 1);
    return out;
  }

  function limit(ret) {
    return BigInt.asUintN(64, i64[(ret + 16) >>> 3]);
  }

  /** Decodes a state-error result at ret, frees it and throws it. */
  function stateError(ret) {
    let error;
    switch (u8[ret + 8]) {
      case 0: error = { tag: 'unknown-store', val: text(ret) }; break;
      case 1: error = { tag: 'too-large', val: limit(ret) }; break;
      case 2: error = { tag: 'read-only', val: text(ret) }; break;
      case 3: error = { tag: 'wrong-kind', val: text(ret) }; break;
    }
    dealloc(ret);
    throw new Failure(error);
  }

  /** Decodes an output-error result at ret, frees it and throws it. */
  function outputError(ret) {
    let error;
    switch (u8[ret + 8]) {
      case 0: error = { tag: 'unknown-alias', val: text(ret) }; break;
      case 1: error = { tag: 'too-large', val: limit(ret) }; break;
    }
    dealloc(ret);
    throw new Failure(error);
  }

  function get(store, key) {
    if (typeof store !== 'string' || store.length === 0 || !isBytes(key)) {
      return stockGet(store, key);
    }
    const name = encoder.encode(store);
    const nl = name.length;
    const ptr = argumentsArea(nl + key.length);
    fresh();
    u8.set(name, ptr);
    u8.set(key, ptr + nl);
    const ret = rawGet(ptr, nl, ptr + nl, key.length);
    fresh();
    if (u8[ret] !== 0) stateError(ret);
    let value;
    if (u8[ret + 8] !== 0) {
      const at = u32[(ret + 12) >>> 2];
      const len = u32[(ret + 16) >>> 2];
      value = u8.slice(at, at + len);
      if (len !== 0) dealloc(at, len, 1);
    }
    dealloc(ret);
    return value;
  }

  function put(store, key, value) {
    if (typeof store !== 'string' || store.length === 0 || !isBytes(key) || !isBytes(value)) {
      return stockPut(store, key, value);
    }
    const name = encoder.encode(store);
    const nl = name.length;
    const kl = key.length;
    const ptr = argumentsArea(nl + kl + value.length);
    fresh();
    u8.set(name, ptr);
    u8.set(key, ptr + nl);
    u8.set(value, ptr + nl + kl);
    const ret = rawPut(ptr, nl, ptr + nl, kl, ptr + nl + kl, value.length);
    fresh();
    if (u8[ret] !== 0) stateError(ret);
    dealloc(ret);
  }

  function emit(alias, key, value, headers) {
    const hasKey = key !== undefined && key !== null;
    const hasValue = value !== undefined && value !== null;
    if (
      typeof alias !== 'string' || alias.length === 0 || headers.length !== 0 ||
      (hasKey && !isBytes(key)) || (hasValue && !isBytes(value))
    ) {
      return stockEmit(alias, key, value, headers);
    }
    const name = encoder.encode(alias);
    const nl = name.length;
    const kl = hasKey ? key.length : 0;
    const vl = hasValue ? value.length : 0;
    const ptr = argumentsArea(nl + kl + vl);
    fresh();
    u8.set(name, ptr);
    if (hasKey) u8.set(key, ptr + nl);
    if (hasValue) u8.set(value, ptr + nl + kl);
    const ret = rawEmit(
      ptr, nl, hasKey ? 1 : 0, hasKey ? ptr + nl : 0, kl, hasValue ? 1 : 0, hasValue ? ptr + nl + kl : 0, vl, 4, 0,
    );
    fresh();
    if (u8[ret] !== 0) outputError(ret);
    dealloc(ret);
  }

  function beginRecord(index) {
    rawBeginRecord(index >>> 0);
  }

  /**
   * The export's list<record> (64 bytes each, every field aligned) at base,
   * as the generated glue lifts it: the same objects, every list freed.
   * Typed-array elements rather than DataView calls (each call is a property
   * lookup and a native call in the interpreter). Freeing never grows the
   * memory, so one set of views serves the whole batch.
   */
  function liftRecords(base, len) {
    if (base % 8 !== 0) throw new TypeError('list pointer [' + base + '] is not aligned to 8');
    fresh();
    const records = [];
    for (let i = 0; i < len; i++) {
      const at = base + i * 64;
      const w = at >>> 2;
      const topicPtr = u32[w];
      const topicLen = u32[w + 1];
      const topic = decoder.decode(u8.subarray(topicPtr, topicPtr + topicLen));
      if (topicLen !== 0) dealloc(topicPtr, topicLen, 1);
      // Key and value inline, not through a helper: a call costs 2-3 k fuel.
      let key;
      if (u8[at + 32] !== 0) {
        const ptr = u32[w + 9];
        const keyLen = u32[w + 10];
        key = u8.slice(ptr, ptr + keyLen);
        if (keyLen !== 0) dealloc(ptr, keyLen, 1);
      }
      let value;
      if (u8[at + 44] !== 0) {
        const ptr = u32[w + 12];
        const valueLen = u32[w + 13];
        value = u8.slice(ptr, ptr + valueLen);
        if (valueLen !== 0) dealloc(ptr, valueLen, 1);
      }
      const headerCount = u32[w + 15];
      const headers = [];
      if (headerCount !== 0) {
        const headerBase = u32[w + 14];
        if (headerBase % 4 !== 0) throw new TypeError('list pointer [' + headerBase + '] is not aligned to 4');
        for (let h = 0; h < headerCount; h++) {
          const hw = (headerBase >>> 2) + h * 4;
          const namePtr = u32[hw];
          const nameLen = u32[hw + 1];
          const name = decoder.decode(u8.subarray(namePtr, namePtr + nameLen));
          if (nameLen !== 0) dealloc(namePtr, nameLen, 1);
          const valuePtr = u32[hw + 2];
          const valueLen = u32[hw + 3];
          const headerValue = u8.slice(valuePtr, valuePtr + valueLen);
          if (valueLen !== 0) dealloc(valuePtr, valueLen, 1);
          headers.push({ key: name, value: headerValue });
        }
        dealloc(headerBase, headerCount * 16, 4);
      }
      records.push({
        topic,
        partition: u32[w + 2] | 0,
        offset: i64[(at >>> 3) + 2],
        timestamp: i64[(at >>> 3) + 3],
        key,
        value,
        headers,
      });
    }
    if (len !== 0) dealloc(base, len * 64, 8);
    return records;
  }

  return [get, put, emit, beginRecord, liftRecords, newCall];
})();
`;

// The generated export glue's lifting of process's batch, replaced by a call
// to __onceflowLiftRecords. Its text pins the record layout liftRecords reads.
const LIFT_HEAD = `  var len8 = arg1;
  var base8 = arg0;
  if (base8 % 8 !== 0) throw new TypeError(\`list pointer [\${base8}] is not aligned to 8\`);
  var result8 = [];
  for (let i = 0; i < len8; i++) {
    const base = base8 + i * 64;
    var ptr0 = dataView($memory).getUint32(base + 0, true);
    var len0 = dataView($memory).getUint32(base + 4, true);
    var result0 = TEXT_DECODER_UTF8.decode(new Uint8Array($memory.buffer, ptr0, len0));
    if (len0 !== 0) $dealloc(ptr0, len0, 1);
    let variant2;
    if (dataView($memory).getUint8(base + 32, true)) {
      var ptr1 = dataView($memory).getUint32(base + 36, true);
      var len1 = dataView($memory).getUint32(base + 40, true);
`;
const LIFT_LAYOUT = [
  `    if (dataView($memory).getUint8(base + 44, true)) {
      var ptr3 = dataView($memory).getUint32(base + 48, true);
      var len3 = dataView($memory).getUint32(base + 52, true);`,
  `    var len7 = dataView($memory).getUint32(base + 60, true);
    var base7 = dataView($memory).getUint32(base + 56, true);`,
  `      const base = base7 + i * 16;
      var ptr5 = dataView($memory).getUint32(base + 0, true);
      var len5 = dataView($memory).getUint32(base + 4, true);`,
  `      var ptr6 = dataView($memory).getUint32(base + 8, true);
      var len6 = dataView($memory).getUint32(base + 12, true);`,
  `      result7.push({
        key: result5,
        value: result6,
      });`,
  `    result8.push({
      topic: result0,
      partition: dataView($memory).getInt32(base + 8, true),
      offset: dataView($memory).getBigInt64(base + 16, true),
      timestamp: dataView($memory).getBigInt64(base + 24, true),
      key: variant2,
      value: variant4,
      headers: result7,
    });`,
];
const LIFT_TAIL = '  if (len8 !== 0) $dealloc(base8, len8 * 64, 8);\n';

function withFastLift(bindings) {
  const head = 'async function export_process(arg0, arg1, arg2) {\n';
  const at = bindings.indexOf(head);
  if (at < 0 || !bindings.startsWith(LIFT_HEAD, at + head.length)) fail('the lifting of process');
  const end = bindings.indexOf(LIFT_TAIL, at);
  if (end < 0) fail('the end of the lifting of process');
  const lifting = bindings.slice(at + head.length, end + LIFT_TAIL.length);
  for (const layout of LIFT_LAYOUT) {
    if (!lifting.includes(layout)) fail('the record layout of process');
  }
  return (
    bindings.slice(0, at + head.length) +
    '  var result8 = __onceflowLiftRecords(arg0, arg1);\n' +
    bindings.slice(end + LIFT_TAIL.length)
  );
}

// Every export call starts with a fresh argument area (FAST's newCall).
function withNewCalls(bindings) {
  let exports = 0;
  const out = bindings.replace(/^async function export_\w+\([^)]*\) \{\n/gm, (head) => {
    exports++;
    return head + '  __onceflowNewCall();\n';
  });
  if (exports !== 3) fail(`the export functions (${exports} found, init, process and punctuate expected)`);
  return out;
}

function withFastPaths(bindings) {
  let out = bindings;
  for (const [fn, params] of [
    [`${STATE}$get`, 'arg0, arg1'],
    [`${STATE}$put`, 'arg0, arg1, arg2'],
    [`${OUTPUT}$emit`, 'arg0, arg1, arg2, arg3'],
    [`${CONTEXT}$beginRecord`, 'arg0'],
  ]) {
    out = replaceOnce(out, `\nfunction ${fn}(${params}) {`, `\nfunction __stock_${fn}(${params}) {`, fn);
  }
  // The generated results these fast paths read: a state get's option at
  // ret+8 with its list at ret+12/16; errors' variant at ret+8.
  for (const layout of [
    `  if (dataView($memory).getUint8(ret + 0, true)) {\n    let variant7;\n    switch (dataView($memory).getUint8(ret + 8, true)) {`,
    `      var ptr2 = dataView($memory).getUint32(ret + 12, true);\n      var len2 = dataView($memory).getUint32(ret + 16, true);`,
  ]) {
    if (!out.includes(layout)) fail('the result layout of state.get');
  }
  const anchor = '\nclass ComponentError extends Error {';
  const at = out.indexOf(anchor);
  if (at < 0) fail('ComponentError');
  const end = out.indexOf('\n}\n', at);
  if (end < 0) fail('the end of ComponentError');
  return out.slice(0, end + 3) + FAST + out.slice(end + 3);
}

function patch(bindings) {
  return withNewCalls(withFastLift(withFastPaths(withOneEncode(withoutDebugLogs(bindings)))));
}

// componentize() offers no hook between generating the bindings and
// pre-initializing them: a copy of its module, beside it (for its relative
// imports), gets one.
const original = await readFile(request.componentize, 'utf8');
const hooked = replaceOnce(
  original,
  "  const inputWasmPath = join(workDir, 'in.wasm');",
  "  jsBindings = globalThis.__onceflowPatchBindings(jsBindings);\n  const inputWasmPath = join(workDir, 'in.wasm');",
  'the point where componentize() writes its bindings',
);
const copy = join(dirname(request.componentize), `componentize-onceflow-${process.pid}.js`);
await writeFile(copy, hooked);
globalThis.__onceflowPatchBindings = patch;
let componentize;
try {
  ({ componentize } = await import(pathToFileURL(copy).href));
} finally {
  await rm(copy, { force: true });
}
const { component } = await componentize({
  sourcePath: request.source,
  witPath: request.wit,
  worldName: 'processor',
  disableFeatures: ['stdio', 'random', 'clocks', 'http', 'fetch-event'],
  enableAot: Boolean(request.wevalBin),
  wevalBin: request.wevalBin || undefined,
});
await writeFile(request.out, component);
