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
//   their arguments into one allocation and read the result in a few
//   statements; any other argument goes to the generated function, kept
//   under another name. Errors decode as the generated code does.
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

// The fast paths. A string argument that is not a string, a byte argument
// that is not a Uint8Array, or headers go to the generated function.
const FAST = `
// The processor's own Uint8Arrays come from the content global, a different
// realm from these bindings' (whose Uint8Arrays the export glue hands it).
const __OnceflowUint8Array = contentGlobal.Uint8Array;

function __onceflowText(ret) {
  const ptr = dataView($memory).getUint32(ret + 16, true);
  const len = dataView($memory).getUint32(ret + 20, true);
  const text = TEXT_DECODER_UTF8.decode(new Uint8Array($memory.buffer, ptr, len));
  if (len !== 0) $dealloc(ptr, len, 1);
  return text;
}

function __onceflowLimit(ret) {
  return BigInt.asUintN(64, BigInt(dataView($memory).getBigInt64(ret + 16, true)));
}

/** Decodes a state-error result at ret, frees it and throws it. */
function __onceflowStateError(ret) {
  let error;
  switch (dataView($memory).getUint8(ret + 8, true)) {
    case 0: error = { tag: 'unknown-store', val: __onceflowText(ret) }; break;
    case 1: error = { tag: 'too-large', val: __onceflowLimit(ret) }; break;
    case 2: error = { tag: 'read-only', val: __onceflowText(ret) }; break;
    case 3: error = { tag: 'wrong-kind', val: __onceflowText(ret) }; break;
  }
  $dealloc(ret);
  throw new ComponentError(error);
}

/** Decodes an output-error result at ret, frees it and throws it. */
function __onceflowOutputError(ret) {
  let error;
  switch (dataView($memory).getUint8(ret + 8, true)) {
    case 0: error = { tag: 'unknown-alias', val: __onceflowText(ret) }; break;
    case 1: error = { tag: 'too-large', val: __onceflowLimit(ret) }; break;
  }
  $dealloc(ret);
  throw new ComponentError(error);
}

function ${STATE}$get(store, key) {
  if (typeof store !== 'string' || store.length === 0 || !(key instanceof __OnceflowUint8Array || key instanceof Uint8Array)) {
    return __stock_${STATE}$get(store, key);
  }
  const name = TEXT_ENCODER_UTF8.encode(store);
  const nl = name.length;
  const ptr = $realloc(0, 0, 1, nl + key.length);
  const memory = new Uint8Array($memory.buffer);
  memory.set(name, ptr);
  memory.set(key, ptr + nl);
  const ret = $import_onceflow_processor_state_0_2_0$get(ptr, nl, ptr + nl, key.length);
  const view = dataView($memory);
  if (view.getUint8(ret, true)) __onceflowStateError(ret);
  let value;
  if (view.getUint8(ret + 8, true)) {
    const at = view.getUint32(ret + 12, true);
    const len = view.getUint32(ret + 16, true);
    value = new Uint8Array($memory.buffer.slice(at, at + len));
    if (len !== 0) $dealloc(at, len, 1);
  }
  $dealloc(ret);
  return value;
}

function ${STATE}$put(store, key, value) {
  if (
    typeof store !== 'string' || store.length === 0 ||
    !(key instanceof __OnceflowUint8Array || key instanceof Uint8Array) ||
    !(value instanceof __OnceflowUint8Array || value instanceof Uint8Array)
  ) {
    return __stock_${STATE}$put(store, key, value);
  }
  const name = TEXT_ENCODER_UTF8.encode(store);
  const nl = name.length;
  const kl = key.length;
  const ptr = $realloc(0, 0, 1, nl + kl + value.length);
  const memory = new Uint8Array($memory.buffer);
  memory.set(name, ptr);
  memory.set(key, ptr + nl);
  memory.set(value, ptr + nl + kl);
  const ret = $import_onceflow_processor_state_0_2_0$put(ptr, nl, ptr + nl, kl, ptr + nl + kl, value.length);
  if (dataView($memory).getUint8(ret, true)) __onceflowStateError(ret);
  $dealloc(ret);
}

function ${OUTPUT}$emit(alias, key, value, headers) {
  if (
    typeof alias !== 'string' || alias.length === 0 || headers.length !== 0 ||
    !(key === undefined || key === null || key instanceof __OnceflowUint8Array || key instanceof Uint8Array) ||
    !(value === undefined || value === null || value instanceof __OnceflowUint8Array || value instanceof Uint8Array)
  ) {
    return __stock_${OUTPUT}$emit(alias, key, value, headers);
  }
  const name = TEXT_ENCODER_UTF8.encode(alias);
  const nl = name.length;
  const hasKey = key !== undefined && key !== null;
  const hasValue = value !== undefined && value !== null;
  const kl = hasKey ? key.length : 0;
  const vl = hasValue ? value.length : 0;
  const ptr = $realloc(0, 0, 1, nl + kl + vl);
  const memory = new Uint8Array($memory.buffer);
  memory.set(name, ptr);
  if (hasKey) memory.set(key, ptr + nl);
  if (hasValue) memory.set(value, ptr + nl + kl);
  const ret = $import_onceflow_processor_output_0_2_0$emit(
    ptr, nl, hasKey ? 1 : 0, hasKey ? ptr + nl : 0, kl, hasValue ? 1 : 0, hasValue ? ptr + nl + kl : 0, vl, 4, 0,
  );
  if (dataView($memory).getUint8(ret, true)) __onceflowOutputError(ret);
  $dealloc(ret);
}
`;

function withFastPaths(bindings) {
  let out = bindings;
  for (const [fn, params] of [
    [`${STATE}$get`, 'arg0, arg1'],
    [`${STATE}$put`, 'arg0, arg1, arg2'],
    [`${OUTPUT}$emit`, 'arg0, arg1, arg2, arg3'],
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
  return withFastPaths(withOneEncode(withoutDebugLogs(bindings)));
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
