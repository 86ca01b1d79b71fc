// JSON read as the Rust fraud example's serde_json (1.0, default features)
// reads it into a `serde_json::Value`, with its error messages, so that a
// malformed payment or account value is dead-lettered with the very reason
// the Rust processor gives: `expected value at line 1 column 1`, `EOF while
// parsing a string at line 1 column 12`, ...
//
// JSON.parse accepts more (lone surrogates, any nesting depth, numbers that
// overflow to Infinity), rounds large integers, and words and places its
// errors differently, so this reader replays serde_json's parser instead:
// the same grammar, the same checks in the same order, and the error
// position (line, and column in bytes) computed as serde_json computes it
// for a byte slice.
//
// parse(bytes) returns { error } with serde_json's message, or { fields }:
// a Map from each key of a top-level object to its value (the last one of
// duplicate keys) as { kind: 'str', value: string }, { kind: 'int', value:
// bigint } for what Value::as_i64 accepts, or { kind: 'other' }; any other
// top-level value gives an empty Map (fields.get(name) is undefined, as
// Value::get on a non-object).

const OTHER = Object.freeze({ kind: 'other' });

const EOF_LIST = 'EOF while parsing a list';
const EOF_OBJECT = 'EOF while parsing an object';
const EOF_STRING = 'EOF while parsing a string';
const EOF_VALUE = 'EOF while parsing a value';
const EXPECTED_COLON = 'expected `:`';
const EXPECTED_LIST_COMMA_OR_END = 'expected `,` or `]`';
const EXPECTED_OBJECT_COMMA_OR_END = 'expected `,` or `}`';
const EXPECTED_IDENT = 'expected ident';
const EXPECTED_VALUE = 'expected value';
const INVALID_ESCAPE = 'invalid escape';
const INVALID_NUMBER = 'invalid number';
const NUMBER_OUT_OF_RANGE = 'number out of range';
const INVALID_UNICODE = 'invalid unicode code point';
const CONTROL_CHARACTER = 'control character (\\u0000-\\u001F) found while parsing a string';
const KEY_MUST_BE_A_STRING = 'key must be a string';
const LONE_LEADING_SURROGATE = 'lone leading surrogate in hex escape';
const TRAILING_COMMA = 'trailing comma';
const TRAILING_CHARACTERS = 'trailing characters';
const UNEXPECTED_END_OF_HEX_ESCAPE = 'unexpected end of hex escape';
const RECURSION_LIMIT = 'recursion limit exceeded';

// serde_json's POW10 table: 1e0 ..= 1e308, correctly rounded.
const POW10 = Array.from({ length: 309 }, (_, e) => Number(`1e${e}`));
const U64_MAX_DIV_10 = 1844674407370955161n;
const I64_MAX = 2n ** 63n - 1n;
const I64_MIN_MAGNITUDE = 2n ** 63n;
const I32_MAX = 2147483647;
const I32_MIN = -2147483648;

const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

class Fail {
  constructor(message) {
    this.message = message;
  }
}

const isDigit = (c) => c >= 0x30 && c <= 0x39;

/**
 * A significand with one more decimal digit, or undefined when that
 * overflows u64 (serde_json's `overflow!`). Numbers below 9e14 stay Numbers
 * (exact), larger ones are BigInts.
 */
function withDigit(significand, digit) {
  if (typeof significand === 'number') {
    if (significand < 9e14) return significand * 10 + digit;
    significand = BigInt(significand);
  }
  if (significand >= U64_MAX_DIV_10 && (significand > U64_MAX_DIV_10 || digit > 5)) return undefined;
  return significand * 10n + BigInt(digit);
}

/** The length of the longest valid UTF-8 prefix (Rust's Utf8Error::valid_up_to). */
function validUpTo(b) {
  let i = 0;
  while (i < b.length) {
    const c = b[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    let more;
    let lo = 0x80;
    let hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) more = 1;
    else if (c >= 0xe0 && c <= 0xef) {
      more = 2;
      if (c === 0xe0) lo = 0xa0;
      if (c === 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      more = 3;
      if (c === 0xf0) lo = 0x90;
      if (c === 0xf4) hi = 0x8f;
    } else return i;
    if (i + 1 >= b.length || b[i + 1] < lo || b[i + 1] > hi) return i;
    for (let k = 2; k <= more; k++) {
      if (i + k >= b.length || b[i + k] < 0x80 || b[i + k] > 0xbf) return i;
    }
    i += more + 1;
  }
  return i;
}

/** A code point (not a surrogate) as UTF-8 bytes, appended to `out` (an array). */
function pushUtf8(out, n) {
  if (n < 0x80) out.push(n);
  else if (n < 0x800) out.push(0xc0 | (n >> 6), 0x80 | (n & 0x3f));
  else if (n < 0x10000) out.push(0xe0 | (n >> 12), 0x80 | ((n >> 6) & 0x3f), 0x80 | (n & 0x3f));
  else out.push(0xf0 | (n >> 18), 0x80 | ((n >> 12) & 0x3f), 0x80 | ((n >> 6) & 0x3f), 0x80 | (n & 0x3f));
}

function hexValue(c) {
  if (c >= 0x30 && c <= 0x39) return c - 0x30;
  if (c >= 0x61 && c <= 0x66) return c - 0x61 + 10;
  if (c >= 0x41 && c <= 0x46) return c - 0x41 + 10;
  return -1;
}

class Reader {
  constructor(bytes) {
    this.s = bytes;
    this.n = bytes.length;
    this.i = 0;
    this.remainingDepth = 128;
  }

  // -- positions, as SliceRead::position_of_index

  /** A failure at `index` (its column pulled back by `back`, not below 0). */
  at(index, message, back = 0) {
    let startOfLine = 0;
    let line = 1;
    for (let k = 0; k < index; k++) {
      if (this.s[k] === 0x0a) {
        line++;
        startOfLine = k + 1;
      }
    }
    const column = Math.max(0, index - startOfLine - back);
    return new Fail(`${message} at line ${line} column ${column}`);
  }

  error(message) {
    return this.at(this.i, message);
  }

  peekError(message) {
    return this.at(Math.min(this.n, this.i + 1), message);
  }

  peekOrNull() {
    return this.i < this.n ? this.s[this.i] : 0;
  }

  /** The next byte after whitespace, or -1 at the end. */
  whitespace() {
    const s = this.s;
    let i = this.i;
    while (i < this.n) {
      const c = s[i];
      if (c !== 0x20 && c !== 0x0a && c !== 0x09 && c !== 0x0d) {
        this.i = i;
        return c;
      }
      i++;
    }
    this.i = i;
    return -1;
  }

  // -- values

  top() {
    let fields;
    if (this.whitespace() === 0x7b) {
      this.enter();
      this.i++;
      fields = this.object(true);
      this.leave();
    } else {
      this.value(false);
      fields = new Map();
    }
    if (this.whitespace() !== -1) throw this.peekError(TRAILING_CHARACTERS);
    return fields;
  }

  /** A value; with `keep`, a string or integer's summary. */
  value(keep) {
    const c = this.whitespace();
    if (c === -1) throw this.peekError(EOF_VALUE);
    if (c === 0x6e) {
      this.i++;
      this.ident('ull');
    } else if (c === 0x74) {
      this.i++;
      this.ident('rue');
    } else if (c === 0x66) {
      this.i++;
      this.ident('alse');
    } else if (c === 0x2d) {
      this.i++;
      return this.integer(false);
    } else if (isDigit(c)) {
      return this.integer(true);
    } else if (c === 0x22) {
      this.i++;
      const text = this.string();
      return keep ? { kind: 'str', value: text } : OTHER;
    } else if (c === 0x5b) {
      this.enter();
      this.i++;
      this.array();
      this.leave();
    } else if (c === 0x7b) {
      this.enter();
      this.i++;
      this.object(false);
      this.leave();
    } else {
      throw this.peekError(EXPECTED_VALUE);
    }
    return OTHER;
  }

  enter() {
    if (--this.remainingDepth === 0) throw this.peekError(RECURSION_LIMIT);
  }

  /** Past the closing bracket or brace. */
  leave() {
    this.remainingDepth++;
    this.i++;
  }

  ident(rest) {
    for (let k = 0; k < rest.length; k++) {
      if (this.i >= this.n) throw this.error(EOF_VALUE);
      const c = this.s[this.i++];
      if (c !== rest.charCodeAt(k)) throw this.error(EXPECTED_IDENT);
    }
  }

  /** The elements, up to (not past) the closing bracket. */
  array() {
    let first = true;
    for (;;) {
      let c = this.whitespace();
      if (c === -1) throw this.peekError(EOF_LIST);
      if (c === 0x5d) return;
      if (first) {
        first = false;
      } else if (c === 0x2c) {
        this.i++;
        c = this.whitespace();
        if (c === 0x5d) throw this.peekError(TRAILING_COMMA);
        if (c === -1) throw this.peekError(EOF_VALUE);
      } else {
        throw this.peekError(EXPECTED_LIST_COMMA_OR_END);
      }
      this.value(false);
    }
  }

  /**
   * The members, up to (not past) the closing brace; with `keep`, their
   * values' summaries by key.
   */
  object(keep) {
    const fields = new Map();
    let first = true;
    for (;;) {
      let c = this.whitespace();
      if (c === -1) throw this.peekError(EOF_OBJECT);
      if (c === 0x7d) return fields;
      if (first) {
        first = false;
        if (c !== 0x22) throw this.peekError(KEY_MUST_BE_A_STRING);
      } else if (c === 0x2c) {
        this.i++;
        c = this.whitespace();
        if (c === 0x7d) throw this.peekError(TRAILING_COMMA);
        if (c === -1) throw this.peekError(EOF_VALUE);
        if (c !== 0x22) throw this.peekError(KEY_MUST_BE_A_STRING);
      } else {
        throw this.peekError(EXPECTED_OBJECT_COMMA_OR_END);
      }
      this.i++; // "
      const key = this.string();
      c = this.whitespace();
      if (c === -1) throw this.peekError(EOF_OBJECT);
      if (c !== 0x3a) throw this.peekError(EXPECTED_COLON);
      this.i++;
      const value = this.value(keep);
      if (keep) fields.set(key, value); // a duplicate key replaces the earlier value
    }
  }

  // -- strings

  /** A string's text, the opening quote read. */
  string() {
    const s = this.s;
    const n = this.n;
    let pieces; // with escapes: the text's bytes so far (numbers)
    let start = this.i;
    for (;;) {
      let j = this.i;
      while (j < n) {
        const c = s[j];
        if (c === 0x22 || c === 0x5c || c < 0x20) break;
        j++;
      }
      if (j === n) {
        this.i = n;
        throw this.error(EOF_STRING);
      }
      const c = s[j];
      if (c === 0x22) {
        let bytes = s.subarray(start, j);
        if (pieces !== undefined) {
          for (const b of bytes) pieces.push(b);
          bytes = Uint8Array.from(pieces);
        }
        this.i = j + 1;
        try {
          return utf8.decode(bytes);
        } catch {
          // serde_json points back from the closing quote by the invalid
          // tail's length (in the decoded text).
          throw this.at(this.i, INVALID_UNICODE, bytes.length - validUpTo(bytes));
        }
      }
      if (c === 0x5c) {
        if (pieces === undefined) pieces = [];
        for (let k = start; k < j; k++) pieces.push(s[k]);
        this.i = j + 1;
        this.escape(pieces);
        start = this.i;
      } else {
        this.i = j + 1;
        throw this.error(CONTROL_CHARACTER);
      }
    }
  }

  escape(out) {
    if (this.i >= this.n) throw this.error(EOF_STRING);
    const c = this.s[this.i++];
    switch (c) {
      case 0x22:
      case 0x5c:
      case 0x2f:
        out.push(c);
        break;
      case 0x62:
        out.push(0x08);
        break;
      case 0x66:
        out.push(0x0c);
        break;
      case 0x6e:
        out.push(0x0a);
        break;
      case 0x72:
        out.push(0x0d);
        break;
      case 0x74:
        out.push(0x09);
        break;
      case 0x75:
        this.unicodeEscape(out);
        break;
      default:
        throw this.error(INVALID_ESCAPE);
    }
  }

  hex4() {
    if (this.n - this.i < 4) {
      this.i = this.n;
      throw this.error(EOF_STRING);
    }
    let value = 0;
    let valid = true;
    for (let k = 0; k < 4; k++) {
      const v = hexValue(this.s[this.i + k]);
      if (v < 0) valid = false;
      value = value * 16 + v;
    }
    this.i += 4;
    if (!valid) throw this.error(INVALID_ESCAPE);
    return value;
  }

  unicodeEscape(out) {
    const n = this.hex4();
    if (n >= 0xdc00 && n <= 0xdfff) throw this.error(LONE_LEADING_SURROGATE);
    if (n < 0xd800 || n > 0xdbff) {
      pushUtf8(out, n);
      return;
    }
    for (const expected of [0x5c, 0x75]) {
      if (this.i >= this.n) throw this.error(EOF_STRING);
      if (this.s[this.i++] !== expected) throw this.error(UNEXPECTED_END_OF_HEX_ESCAPE);
    }
    const n2 = this.hex4();
    if (n2 < 0xdc00 || n2 > 0xdfff) throw this.error(LONE_LEADING_SURROGATE);
    pushUtf8(out, 0x10000 + ((n - 0xd800) << 10) + (n2 - 0xdc00));
  }

  // -- numbers

  /** A number (its sign read): an 'int' when Value::as_i64 accepts it, else OTHER. */
  integer(positive) {
    if (this.i >= this.n) throw this.error(EOF_VALUE);
    const c = this.s[this.i++];
    if (c === 0x30) {
      if (isDigit(this.peekOrNull())) throw this.peekError(INVALID_NUMBER);
      return this.number(positive, 0);
    }
    if (!isDigit(c)) throw this.error(INVALID_NUMBER);
    let significand = c - 0x30;
    for (;;) {
      const d = this.peekOrNull();
      if (!isDigit(d)) return this.number(positive, significand);
      const next = withDigit(significand, d - 0x30);
      if (next === undefined) {
        this.longInteger(significand);
        return OTHER;
      }
      this.i++;
      significand = next;
    }
  }

  number(positive, significand) {
    const c = this.peekOrNull();
    if (c === 0x2e) {
      this.decimal(significand, 0);
      return OTHER;
    }
    if (c === 0x65 || c === 0x45) {
      this.exponent(significand, 0);
      return OTHER;
    }
    const magnitude = BigInt(significand);
    if (positive) return magnitude <= I64_MAX ? { kind: 'int', value: magnitude } : OTHER;
    // serde_json makes -0 and anything below i64::MIN a float.
    return magnitude >= 1n && magnitude <= I64_MIN_MAGNITUDE ? { kind: 'int', value: -magnitude } : OTHER;
  }

  longInteger(significand) {
    let exponent = 0;
    for (;;) {
      const c = this.peekOrNull();
      if (isDigit(c)) {
        this.i++;
        exponent++;
      } else if (c === 0x2e) {
        return this.decimal(significand, exponent);
      } else {
        return this.exponentOrParts(significand, exponent);
      }
    }
  }

  decimal(significand, exponentBefore) {
    this.i++; // .
    let after = 0;
    for (;;) {
      const c = this.peekOrNull();
      if (!isDigit(c)) break;
      const next = withDigit(significand, c - 0x30);
      if (next === undefined) {
        // Further digits are ignored.
        while (isDigit(this.peekOrNull())) this.i++;
        return this.exponentOrParts(significand, exponentBefore + after);
      }
      this.i++;
      significand = next;
      after--;
    }
    if (after === 0) throw this.peekError(this.i < this.n ? INVALID_NUMBER : EOF_VALUE);
    return this.exponentOrParts(significand, exponentBefore + after);
  }

  exponentOrParts(significand, exponent) {
    const c = this.peekOrNull();
    if (c === 0x65 || c === 0x45) return this.exponent(significand, exponent);
    return this.fromParts(significand, exponent);
  }

  exponent(significand, starting) {
    this.i++; // e or E
    let positive = true;
    const sign = this.peekOrNull();
    if (sign === 0x2b) {
      this.i++;
    } else if (sign === 0x2d) {
      this.i++;
      positive = false;
    }
    if (this.i >= this.n) throw this.error(EOF_VALUE);
    const c = this.s[this.i++];
    if (!isDigit(c)) throw this.error(INVALID_NUMBER);
    let exp = c - 0x30;
    for (;;) {
      const d = this.peekOrNull();
      if (!isDigit(d)) break;
      this.i++;
      const digit = d - 0x30;
      if (exp >= 214748364 && (exp > 214748364 || digit > 7)) {
        // The exponent overflows i32: an error for a positive one (but 0
        // stays 0), else the number is 0.
        if (Number(significand) !== 0 && positive) throw this.error(NUMBER_OUT_OF_RANGE);
        while (isDigit(this.peekOrNull())) this.i++;
        return;
      }
      exp = exp * 10 + digit;
    }
    const final = positive ? starting + exp : starting - exp;
    this.fromParts(significand, Math.max(I32_MIN, Math.min(I32_MAX, final)));
  }

  /**
   * serde_json's f64_from_parts, as far as it can fail: only a non-negative
   * exponent can overflow.
   */
  fromParts(significand, exponent) {
    const f = Number(significand);
    if (exponent < 0 || f === 0) return;
    if (exponent > 308 || !Number.isFinite(f * POW10[exponent])) throw this.error(NUMBER_OUT_OF_RANGE);
  }
}

/** { error } or { fields }: see the top of this file. */
export function parse(bytes) {
  try {
    return { fields: new Reader(bytes).top() };
  } catch (e) {
    if (e instanceof Fail) return { error: e.message };
    throw e;
  }
}
