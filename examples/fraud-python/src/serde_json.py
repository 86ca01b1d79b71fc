"""JSON read as the Rust fraud example's serde_json (1.0, default features)
reads it into a `serde_json::Value`, with its error messages, so that a
malformed payment or account value is dead-lettered with the very reason the
Rust processor gives: `expected value at line 1 column 1`, `EOF while
parsing a string at line 1 column 12`, ...

Python's json module accepts more (NaN, lone surrogates, numbers that
overflow to inf, any nesting depth) and words and places its errors
differently, so this reader replays serde_json's parser instead: the same
grammar, the same checks in the same order, and the error position (line,
and column in bytes) computed as serde_json computes it for a byte slice.

parse(data) returns (error, fields): error is None or serde_json's message;
fields maps each key of a top-level object to its value (the last one of
duplicate keys) as ("str", text), ("int", n) for what Value::as_i64
accepts, or ("other", None); any other top-level value gives {} (so that
fields.get(name) is None, as Value::get on a non-object).
"""

import math
import re

OTHER = ("other", None)

_ESCAPED = re.compile(rb'["\\\x00-\x1f]')
_SIMPLE_ESCAPES = {
    0x22: b'"',
    0x5C: b"\\",
    0x2F: b"/",
    0x62: b"\x08",
    0x66: b"\x0c",
    0x6E: b"\n",
    0x72: b"\r",
    0x74: b"\t",
}
_HEX = {c: int(chr(c), 16) for c in b"0123456789abcdefABCDEF"}
# serde_json's POW10 table: 1e0 ..= 1e308, correctly rounded.
_POW10 = [float(f"1e{e}") for e in range(309)]
_U64_MAX_DIV_10, _U64_MAX_MOD_10 = divmod(2**64 - 1, 10)
_I32_MAX = 2**31 - 1
_I32_MIN = -(2**31)
_I64_MAX = 2**63 - 1

EOF_LIST = "EOF while parsing a list"
EOF_OBJECT = "EOF while parsing an object"
EOF_STRING = "EOF while parsing a string"
EOF_VALUE = "EOF while parsing a value"
EXPECTED_COLON = "expected `:`"
EXPECTED_LIST_COMMA_OR_END = "expected `,` or `]`"
EXPECTED_OBJECT_COMMA_OR_END = "expected `,` or `}`"
EXPECTED_IDENT = "expected ident"
EXPECTED_VALUE = "expected value"
INVALID_ESCAPE = "invalid escape"
INVALID_NUMBER = "invalid number"
NUMBER_OUT_OF_RANGE = "number out of range"
INVALID_UNICODE = "invalid unicode code point"
CONTROL_CHARACTER = "control character (\\u0000-\\u001F) found while parsing a string"
KEY_MUST_BE_A_STRING = "key must be a string"
LONE_LEADING_SURROGATE = "lone leading surrogate in hex escape"
TRAILING_COMMA = "trailing comma"
TRAILING_CHARACTERS = "trailing characters"
UNEXPECTED_END_OF_HEX_ESCAPE = "unexpected end of hex escape"
RECURSION_LIMIT = "recursion limit exceeded"


class _Fail(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.message = message


def _is_digit(c):
    return 0x30 <= c <= 0x39


class _Reader:
    def __init__(self, data):
        self.s = bytes(data)
        self.n = len(self.s)
        self.i = 0
        self.remaining_depth = 128

    # -- positions, as SliceRead::position_of_index

    def _at(self, index, message):
        start_of_line = self.s.rfind(b"\n", 0, index) + 1
        line = 1 + self.s.count(b"\n", 0, start_of_line)
        return _Fail(f"{message} at line {line} column {index - start_of_line}")

    def error(self, message):
        return self._at(self.i, message)

    def peek_error(self, message):
        return self._at(min(self.n, self.i + 1), message)

    def peek_or_null(self):
        return self.s[self.i] if self.i < self.n else 0

    def whitespace(self):
        """The next byte after whitespace, or None at the end."""
        s, i, n = self.s, self.i, self.n
        while i < n and s[i] in b" \n\t\r":
            i += 1
        self.i = i
        return s[i] if i < n else None

    # -- values

    def top(self):
        if self.whitespace() == 0x7B:  # {
            self.enter()
            self.i += 1
            fields = self.object(True)
            self.leave_object()
        else:
            self.value(False)
            fields = {}
        if self.whitespace() is not None:
            raise self.peek_error(TRAILING_CHARACTERS)
        return fields

    def value(self, keep):
        """A value; with `keep`, a string or integer's summary."""
        c = self.whitespace()
        if c is None:
            raise self.peek_error(EOF_VALUE)
        if c == 0x6E:  # n
            self.i += 1
            self.ident(b"ull")
        elif c == 0x74:  # t
            self.i += 1
            self.ident(b"rue")
        elif c == 0x66:  # f
            self.i += 1
            self.ident(b"alse")
        elif c == 0x2D:  # -
            self.i += 1
            return self.integer(False)
        elif _is_digit(c):
            return self.integer(True)
        elif c == 0x22:  # "
            self.i += 1
            text = self.string()
            return ("str", text) if keep else OTHER
        elif c == 0x5B:  # [
            self.enter()
            self.i += 1
            self.array()
            self.remaining_depth += 1
            self.i += 1  # ]
        elif c == 0x7B:  # {
            self.enter()
            self.i += 1
            self.object(False)
            self.leave_object()
        else:
            raise self.peek_error(EXPECTED_VALUE)
        return OTHER

    def enter(self):
        self.remaining_depth -= 1
        if self.remaining_depth == 0:
            raise self.peek_error(RECURSION_LIMIT)

    def leave_object(self):
        self.remaining_depth += 1
        self.i += 1  # }

    def ident(self, rest):
        for expected in rest:
            if self.i >= self.n:
                raise self.error(EOF_VALUE)
            c = self.s[self.i]
            self.i += 1
            if c != expected:
                raise self.error(EXPECTED_IDENT)

    def array(self):
        """The elements, up to (not past) the closing bracket."""
        first = True
        while True:
            c = self.whitespace()
            if c is None:
                raise self.peek_error(EOF_LIST)
            if c == 0x5D:  # ]
                return
            if first:
                first = False
            elif c == 0x2C:  # ,
                self.i += 1
                c = self.whitespace()
                if c == 0x5D:
                    raise self.peek_error(TRAILING_COMMA)
                if c is None:
                    raise self.peek_error(EOF_VALUE)
            else:
                raise self.peek_error(EXPECTED_LIST_COMMA_OR_END)
            self.value(False)

    def object(self, keep):
        """The members, up to (not past) the closing brace; with `keep`,
        their values' summaries by key."""
        fields = {}
        first = True
        while True:
            c = self.whitespace()
            if c is None:
                raise self.peek_error(EOF_OBJECT)
            if c == 0x7D:  # }
                return fields
            if first:
                first = False
                if c != 0x22:
                    raise self.peek_error(KEY_MUST_BE_A_STRING)
            elif c == 0x2C:  # ,
                self.i += 1
                c = self.whitespace()
                if c == 0x7D:
                    raise self.peek_error(TRAILING_COMMA)
                if c is None:
                    raise self.peek_error(EOF_VALUE)
                if c != 0x22:
                    raise self.peek_error(KEY_MUST_BE_A_STRING)
            else:
                raise self.peek_error(EXPECTED_OBJECT_COMMA_OR_END)
            self.i += 1  # "
            key = self.string()
            c = self.whitespace()
            if c is None:
                raise self.peek_error(EOF_OBJECT)
            if c != 0x3A:  # :
                raise self.peek_error(EXPECTED_COLON)
            self.i += 1
            value = self.value(keep)
            if keep:
                fields[key] = value  # a duplicate key replaces the earlier value

    # -- strings

    def string(self):
        """A string's text, the opening quote read."""
        s, n = self.s, self.n
        out = bytearray()
        start = self.i
        while True:
            m = _ESCAPED.search(s, self.i)
            if m is None:
                self.i = n
                raise self.error(EOF_STRING)
            j = m.start()
            c = s[j]
            if c == 0x22:
                out += s[start:j]
                self.i = j + 1
                try:
                    return out.decode("utf-8")  # strict, as str::from_utf8
                except UnicodeDecodeError as e:
                    valid_up_to = e.start
                # serde_json points back from the closing quote by the
                # invalid tail's length (in the decoded text).
                start_of_line = s.rfind(b"\n", 0, self.i) + 1
                line = 1 + s.count(b"\n", 0, start_of_line)
                column = max(0, self.i - start_of_line - (len(out) - valid_up_to))
                raise _Fail(f"{INVALID_UNICODE} at line {line} column {column}")
            if c == 0x5C:
                out += s[start:j]
                self.i = j + 1
                self.escape(out)
                start = self.i
            else:
                self.i = j + 1
                raise self.error(CONTROL_CHARACTER)

    def escape(self, out):
        if self.i >= self.n:
            raise self.error(EOF_STRING)
        c = self.s[self.i]
        self.i += 1
        simple = _SIMPLE_ESCAPES.get(c)
        if simple is not None:
            out += simple
        elif c == 0x75:  # u
            self.unicode_escape(out)
        else:
            raise self.error(INVALID_ESCAPE)

    def hex4(self):
        if self.n - self.i < 4:
            self.i = self.n
            raise self.error(EOF_STRING)
        digits = self.s[self.i : self.i + 4]
        self.i += 4
        value = 0
        for d in digits:
            v = _HEX.get(d)
            if v is None:
                raise self.error(INVALID_ESCAPE)
            value = value * 16 + v
        return value

    def unicode_escape(self, out):
        n = self.hex4()
        if 0xDC00 <= n <= 0xDFFF:
            raise self.error(LONE_LEADING_SURROGATE)
        if not 0xD800 <= n <= 0xDBFF:
            out += chr(n).encode("utf-8")
            return
        for expected in (0x5C, 0x75):  # \ u
            if self.i >= self.n:
                raise self.error(EOF_STRING)
            c = self.s[self.i]
            self.i += 1
            if c != expected:
                raise self.error(UNEXPECTED_END_OF_HEX_ESCAPE)
        n2 = self.hex4()
        if not 0xDC00 <= n2 <= 0xDFFF:
            raise self.error(LONE_LEADING_SURROGATE)
        out += chr(0x10000 + ((n - 0xD800) << 10) + (n2 - 0xDC00)).encode("utf-8")

    # -- numbers

    def integer(self, positive):
        """A number (its sign read): ("int", n) when Value::as_i64 accepts
        it, else OTHER."""
        if self.i >= self.n:
            raise self.error(EOF_VALUE)
        c = self.s[self.i]
        self.i += 1
        if c == 0x30:  # 0
            if _is_digit(self.peek_or_null()):
                raise self.peek_error(INVALID_NUMBER)
            return self.number(positive, 0)
        if not _is_digit(c):
            raise self.error(INVALID_NUMBER)
        significand = c - 0x30
        while True:
            c = self.peek_or_null()
            if not _is_digit(c):
                return self.number(positive, significand)
            digit = c - 0x30
            if significand >= _U64_MAX_DIV_10 and (
                significand > _U64_MAX_DIV_10 or digit > _U64_MAX_MOD_10
            ):
                self.long_integer(significand)
                return OTHER
            self.i += 1
            significand = significand * 10 + digit

    def number(self, positive, significand):
        c = self.peek_or_null()
        if c == 0x2E:  # .
            self.decimal(significand, 0)
            return OTHER
        if c in (0x65, 0x45):  # e E
            self.exponent(significand, 0)
            return OTHER
        if positive:
            return ("int", significand) if significand <= _I64_MAX else OTHER
        # serde_json makes -0 and anything below i64::MIN a float.
        return ("int", -significand) if 1 <= significand <= 2**63 else OTHER

    def long_integer(self, significand):
        exponent = 0
        while True:
            c = self.peek_or_null()
            if _is_digit(c):
                self.i += 1
                exponent += 1
            elif c == 0x2E:
                return self.decimal(significand, exponent)
            elif c in (0x65, 0x45):
                return self.exponent(significand, exponent)
            else:
                return self.from_parts(significand, exponent)

    def decimal(self, significand, exponent_before):
        self.i += 1  # .
        after = 0
        while True:
            c = self.peek_or_null()
            if not _is_digit(c):
                break
            digit = c - 0x30
            if significand >= _U64_MAX_DIV_10 and (
                significand > _U64_MAX_DIV_10 or digit > _U64_MAX_MOD_10
            ):
                # Further digits are ignored.
                while _is_digit(self.peek_or_null()):
                    self.i += 1
                return self.exponent_or_parts(significand, exponent_before + after)
            self.i += 1
            significand = significand * 10 + digit
            after -= 1
        if after == 0:
            raise self.peek_error(INVALID_NUMBER if self.i < self.n else EOF_VALUE)
        return self.exponent_or_parts(significand, exponent_before + after)

    def exponent_or_parts(self, significand, exponent):
        if self.peek_or_null() in (0x65, 0x45):
            return self.exponent(significand, exponent)
        return self.from_parts(significand, exponent)

    def exponent(self, significand, starting):
        self.i += 1  # e or E
        positive = True
        c = self.peek_or_null()
        if c == 0x2B:  # +
            self.i += 1
        elif c == 0x2D:  # -
            self.i += 1
            positive = False
        if self.i >= self.n:
            raise self.error(EOF_VALUE)
        c = self.s[self.i]
        self.i += 1
        if not _is_digit(c):
            raise self.error(INVALID_NUMBER)
        exp = c - 0x30
        while True:
            c = self.peek_or_null()
            if not _is_digit(c):
                break
            self.i += 1
            digit = c - 0x30
            if exp >= _I32_MAX // 10 and (exp > _I32_MAX // 10 or digit > _I32_MAX % 10):
                # The exponent overflows i32: an error for a positive one
                # (but 0 stays 0), else the number is 0.
                if significand != 0 and positive:
                    raise self.error(NUMBER_OUT_OF_RANGE)
                while _is_digit(self.peek_or_null()):
                    self.i += 1
                return
            exp = exp * 10 + digit
        final = starting + exp if positive else starting - exp
        self.from_parts(significand, max(_I32_MIN, min(_I32_MAX, final)))

    def from_parts(self, significand, exponent):
        """serde_json's f64_from_parts, as far as it can fail: only a
        non-negative exponent can overflow."""
        if exponent < 0 or significand == 0:
            return
        if exponent > 308 or math.isinf(float(significand) * _POW10[exponent]):
            raise self.error(NUMBER_OUT_OF_RANGE)


def parse(data):
    """(error, fields): see the module's documentation."""
    try:
        return None, _Reader(data).top()
    except _Fail as failure:
        return failure.message, None
