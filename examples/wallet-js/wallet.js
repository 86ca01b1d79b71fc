// Wallet, in JavaScript: the same processor as examples/wallet (Rust), with
// byte-identical outputs and error messages. It keeps a balance per account
// in the state store `balances` and, for every payment, emits the new
// balance (alias `balances`) and an audit copy of the payment (alias
// `audit`).
//
// Input values are JSON objects {"payment_id": str, "account": str,
// "amount": int}. The Rust wallet parses them with serde_json; JSON.parse
// alone is more lenient (lone surrogates, any nesting depth, numbers that
// overflow to Infinity) and rounds large integers, so parseJson below adds
// serde_json's remaining checks and keeps the amount's source text. The
// fields are then checked in the same order with the same messages.
//
// Built by `onceflow build` (ComponentizeJS) with the onceflow SDK layer
// ./onceflow.js (guest-sdk/js: the batch loop, state and output with the
// Rust SDK's messages).

import { exportProcessor, RecordError } from './onceflow.js';

const I64_MIN = -(2n ** 63n);
const I64_MAX = 2n ** 63n - 1n;

const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
const encoder = new TextEncoder();

// ---------------------------------------------------------------- processing

function invalid(reason) {
  return new RecordError(`invalid payment: ${reason}`);
}

function missing(name) {
  return invalid(`missing field "${name}"`);
}

function processPayment(ctx, record) {
  const raw = record.value;
  const { paymentId, account, amount } = parsePayment(raw);

  // Uint8Arrays, not strings: the import glue copies them without sizing.
  const accountKey = encoder.encode(account);
  const balances = ctx.store('balances');
  const balance = (balances.getI64(accountKey) ?? 0n) + amount;
  if (balance < I64_MIN || balance > I64_MAX) {
    throw invalid(`balance overflow for account "${account}"`);
  }

  // Every check has passed: only now change anything.
  const text = balance.toString();
  balances.put(accountKey, encoder.encode(text));
  const report = `{"account":${JSON.stringify(account)},"balance":${text},"payment_id":${JSON.stringify(paymentId)}}`;
  ctx.emit('balances', accountKey, encoder.encode(report));
  ctx.emit('audit', encoder.encode(paymentId), raw);
}

export const { init, process, punctuate } = exportProcessor(processPayment);

/** Checks a payment, in a fixed order, with fixed messages. */
function parsePayment(raw) {
  if (raw === undefined || raw === null) {
    throw invalid('missing value');
  }
  let text;
  try {
    text = utf8.decode(raw);
  } catch {
    throw invalid('not valid JSON'); // not UTF-8
  }
  let fields;
  try {
    fields = parseJson(text);
  } catch {
    throw invalid('not valid JSON'); // JSON.parse's SyntaxError, or BAD_JSON
  }
  if (typeof fields !== 'object' || fields === null || Array.isArray(fields)) {
    throw invalid('not a JSON object');
  }
  const paymentId = stringField(fields, 'payment_id');
  const account = stringField(fields, 'account');
  // Plain property reads: JSON.parse makes own properties only, and
  // Object.prototype has none of these names.
  const amount = fields.amount;
  if (amount === undefined) {
    throw missing('amount');
  }
  const value = amount instanceof Num ? amount.asI64() : undefined;
  if (value === undefined) {
    throw invalid('field "amount" must be an integer');
  }
  return { paymentId, account, amount: value };
}

function stringField(fields, name) {
  const value = fields[name];
  if (value === undefined) {
    throw missing(name);
  }
  if (typeof value !== 'string') {
    throw invalid(`field "${name}" must be a string`);
  }
  return value;
}

// ---------------------------------------------------------------- JSON, as serde_json reads it
//
// JSON.parse (native, hence cheap in an interpreted engine) refuses a subset
// of what serde_json refuses; the rest is checked here:
// - numbers that overflow f64 (serde_json: "number out of range"; JSON.parse
//   gives Infinity): every number is looked at by the reviver, and one whose
//   value is near the f64 limit is replayed through serde_json's own
//   algorithm, from its source text;
// - unpaired UTF-16 surrogates written as \u escapes (JSON.parse keeps them):
//   when the text has a \u escape, every key and string is checked;
// - nesting deeper than serde_json's recursion limit: walked (on a first,
//   reviver-less parse) when the text is long enough to nest that deep, so
//   that a deeply nested text costs no reviver call per level.
// The reviver also keeps the source text of `amount` numbers, since
// JSON.parse rounds integers beyond 2^53 and cannot tell 1 from 1.0.

/** Thrown on any input serde_json refuses. */
const BAD_JSON = { badJson: true };

/** A JSON number, kept as its source text. */
class Num {
  constructor(text) {
    this.text = text;
  }

  /**
   * serde_json's `Value::as_i64`: an integer literal (no fraction, no
   * exponent) within i64, except `-0`, which serde_json parses as a float.
   */
  asI64() {
    const text = this.text;
    if (!INTEGER.test(text) || text === '-0') {
      return undefined;
    }
    const value = BigInt(text);
    return value >= I64_MIN && value <= I64_MAX ? value : undefined;
  }
}

const INTEGER = /^-?[0-9]+$/;
// serde_json's recursion limit: 128 levels, the 128th of which is refused.
const MAX_DEPTH = 127;
const POW10 = Array.from({ length: 309 }, (_, k) => Number(`1e${k}`));
const U64_MAX_DIV_10 = 1844674407370955161n;
const U64_MAX_MOD_10 = 5n;
const I32_MAX = 2147483647;
const I32_MIN = -2147483648;

function revive(key, value, context) {
  if (typeof value === 'number') {
    // serde_json's result is within 1e-15 of the exact value, so only
    // numbers near 1.8e308 can be out of range for it.
    if (!(value < 1e300 && value > -1e300)) {
      checkNumberRange(context.source);
    }
    return key === 'amount' ? new Num(context.source) : value;
  }
  return value;
}

function reviveEscaped(key, value, context) {
  if (!key.isWellFormed() || (typeof value === 'string' && !value.isWellFormed())) {
    throw BAD_JSON; // a lone surrogate
  }
  return revive(key, value, context);
}

/**
 * Parses a whole JSON text as serde_json would. Numbers under a key `amount`
 * come back as Num; throws BAD_JSON (or a SyntaxError) where serde_json
 * fails.
 */
function parseJson(text) {
  // MAX_DEPTH + 1 levels take twice as many brackets.
  if (text.length >= 2 * (MAX_DEPTH + 1)) {
    const plain = JSON.parse(text);
    if (isContainer(plain) && tooDeep(plain, 1)) {
      throw BAD_JSON;
    }
  }
  return JSON.parse(text, text.includes('\\u') ? reviveEscaped : revive);
}

/** Whether `value`, a container at nesting level `depth`, nests too deep. */
function tooDeep(value, depth) {
  if (depth > MAX_DEPTH) {
    return true;
  }
  if (Array.isArray(value)) {
    for (const item of value) {
      if (isContainer(item) && tooDeep(item, depth + 1)) return true;
    }
  } else {
    for (const key in value) {
      const item = value[key];
      if (isContainer(item) && tooDeep(item, depth + 1)) return true;
    }
  }
  return false;
}

function isContainer(value) {
  return typeof value === 'object' && value !== null && !(value instanceof Num);
}

/**
 * serde_json (without `float_roundtrip`) refuses a number whose value
 * overflows f64 ("number out of range"). This replays its digit loop
 * (significand kept as a u64, later digits counted into the exponent) and its
 * `f64_from_parts`, so that the same numbers are refused. `text` is a
 * syntactically valid JSON number.
 */
function checkNumberRange(text) {
  let i = text.charCodeAt(0) === 0x2d ? 1 : 0;
  const digit = () => {
    const c = text.charCodeAt(i);
    return c >= 0x30 && c <= 0x39 ? c - 0x30 : -1;
  };
  const overflows = (significand, d) =>
    significand >= U64_MAX_DIV_10 &&
    (significand > U64_MAX_DIV_10 || BigInt(d) > U64_MAX_MOD_10);

  const fromParts = (significand, exponent) => {
    if (exponent < 0 || significand === 0n) return;
    if (exponent > 308 || !Number.isFinite(Number(significand) * POW10[exponent])) {
      throw BAD_JSON;
    }
  };
  const exponentPart = (significand, startingExponent) => {
    i++; // e or E
    let positive = true;
    if (text[i] === '+') i++;
    else if (text[i] === '-') { positive = false; i++; }
    let exp = digit();
    i++;
    for (let d = digit(); d >= 0; d = digit()) {
      i++;
      if (exp >= 214748364 && (exp > 214748364 || d > 7)) {
        // The exponent overflows i32.
        if (significand !== 0n && positive) throw BAD_JSON;
        return;
      }
      exp = exp * 10 + d;
    }
    const total = positive ? startingExponent + exp : startingExponent - exp;
    fromParts(significand, Math.min(I32_MAX, Math.max(I32_MIN, total)));
  };
  const decimalPart = (significand, exponentBefore) => {
    i++; // .
    let after = 0;
    for (let d = digit(); d >= 0; d = digit()) {
      if (overflows(significand, d)) {
        // Further digits are ignored.
        while (digit() >= 0) i++;
        const exponent = exponentBefore + after;
        if (i < text.length) exponentPart(significand, exponent);
        else fromParts(significand, exponent);
        return;
      }
      i++;
      significand = significand * 10n + BigInt(d);
      after--;
    }
    if (i < text.length) exponentPart(significand, exponentBefore + after);
    else fromParts(significand, exponentBefore + after);
  };

  let significand = BigInt(digit());
  i++;
  if (significand !== 0n) {
    for (let d = digit(); d >= 0; d = digit()) {
      if (overflows(significand, d)) {
        // A long integer: the remaining integer digits only scale it.
        let exponent = 0;
        while (digit() >= 0) { i++; exponent++; }
        const c = text[i];
        if (c === '.') decimalPart(significand, exponent);
        else if (c === 'e' || c === 'E') exponentPart(significand, exponent);
        else fromParts(significand, exponent);
        return;
      }
      i++;
      significand = significand * 10n + BigInt(d);
    }
  }
  const c = text[i];
  if (c === '.') decimalPart(significand, 0);
  else if (c === 'e' || c === 'E') exponentPart(significand, 0);
  // else an integer that fits a u64: always in range
}
