// serde_json's reader for the fraud example: see serde_json.h. Every
// function returns false once the reader has failed (the message is in the
// document), true otherwise.
#include "serde_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EOF_LIST "EOF while parsing a list"
#define EOF_OBJECT "EOF while parsing an object"
#define EOF_STRING "EOF while parsing a string"
#define EOF_VALUE "EOF while parsing a value"
#define EXPECTED_COLON "expected `:`"
#define EXPECTED_LIST_COMMA_OR_END "expected `,` or `]`"
#define EXPECTED_OBJECT_COMMA_OR_END "expected `,` or `}`"
#define EXPECTED_IDENT "expected ident"
#define EXPECTED_VALUE "expected value"
#define INVALID_ESCAPE "invalid escape"
#define INVALID_NUMBER "invalid number"
#define NUMBER_OUT_OF_RANGE "number out of range"
#define INVALID_UNICODE "invalid unicode code point"
#define CONTROL_CHARACTER "control character (\\u0000-\\u001F) found while parsing a string"
#define KEY_MUST_BE_A_STRING "key must be a string"
#define LONE_LEADING_SURROGATE "lone leading surrogate in hex escape"
#define TRAILING_COMMA "trailing comma"
#define TRAILING_CHARACTERS "trailing characters"
#define UNEXPECTED_END_OF_HEX_ESCAPE "unexpected end of hex escape"
#define RECURSION_LIMIT "recursion limit exceeded"

#define U64_MAX_DIV_10 (UINT64_MAX / 10)
#define U64_MAX_MOD_10 (UINT64_MAX % 10)
#define I32_MAX_DIV_10 (INT32_MAX / 10)
#define I32_MAX_MOD_10 (INT32_MAX % 10)

#define TRY(call)                                                                                                \
    do {                                                                                                         \
        if (!(call)) return false;                                                                               \
    } while (0)

typedef struct {
    const uint8_t *s;
    size_t n, i;
    int remaining_depth;
    uint8_t *scratch; // a string's decoded bytes
    size_t scratch_len, scratch_cap;
    sj_document *doc;
} reader;

// A value's summary: kind and, for an integer, its value.
typedef struct {
    sj_kind kind;
    int64_t integer;
} summary;

static void *checked_realloc(void *p, size_t size) {
    p = realloc(p, size ? size : 1);
    if (!p) abort(); // out of the instance's memory: trap, the host retries
    return p;
}

// serde_json's POW10 table: 1e0 ..= 1e308 (literals, correctly rounded).
static const double pow10_table[309] = {
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9,
    1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19,
    1e20, 1e21, 1e22, 1e23, 1e24, 1e25, 1e26, 1e27, 1e28, 1e29,
    1e30, 1e31, 1e32, 1e33, 1e34, 1e35, 1e36, 1e37, 1e38, 1e39,
    1e40, 1e41, 1e42, 1e43, 1e44, 1e45, 1e46, 1e47, 1e48, 1e49,
    1e50, 1e51, 1e52, 1e53, 1e54, 1e55, 1e56, 1e57, 1e58, 1e59,
    1e60, 1e61, 1e62, 1e63, 1e64, 1e65, 1e66, 1e67, 1e68, 1e69,
    1e70, 1e71, 1e72, 1e73, 1e74, 1e75, 1e76, 1e77, 1e78, 1e79,
    1e80, 1e81, 1e82, 1e83, 1e84, 1e85, 1e86, 1e87, 1e88, 1e89,
    1e90, 1e91, 1e92, 1e93, 1e94, 1e95, 1e96, 1e97, 1e98, 1e99,
    1e100, 1e101, 1e102, 1e103, 1e104, 1e105, 1e106, 1e107, 1e108, 1e109,
    1e110, 1e111, 1e112, 1e113, 1e114, 1e115, 1e116, 1e117, 1e118, 1e119,
    1e120, 1e121, 1e122, 1e123, 1e124, 1e125, 1e126, 1e127, 1e128, 1e129,
    1e130, 1e131, 1e132, 1e133, 1e134, 1e135, 1e136, 1e137, 1e138, 1e139,
    1e140, 1e141, 1e142, 1e143, 1e144, 1e145, 1e146, 1e147, 1e148, 1e149,
    1e150, 1e151, 1e152, 1e153, 1e154, 1e155, 1e156, 1e157, 1e158, 1e159,
    1e160, 1e161, 1e162, 1e163, 1e164, 1e165, 1e166, 1e167, 1e168, 1e169,
    1e170, 1e171, 1e172, 1e173, 1e174, 1e175, 1e176, 1e177, 1e178, 1e179,
    1e180, 1e181, 1e182, 1e183, 1e184, 1e185, 1e186, 1e187, 1e188, 1e189,
    1e190, 1e191, 1e192, 1e193, 1e194, 1e195, 1e196, 1e197, 1e198, 1e199,
    1e200, 1e201, 1e202, 1e203, 1e204, 1e205, 1e206, 1e207, 1e208, 1e209,
    1e210, 1e211, 1e212, 1e213, 1e214, 1e215, 1e216, 1e217, 1e218, 1e219,
    1e220, 1e221, 1e222, 1e223, 1e224, 1e225, 1e226, 1e227, 1e228, 1e229,
    1e230, 1e231, 1e232, 1e233, 1e234, 1e235, 1e236, 1e237, 1e238, 1e239,
    1e240, 1e241, 1e242, 1e243, 1e244, 1e245, 1e246, 1e247, 1e248, 1e249,
    1e250, 1e251, 1e252, 1e253, 1e254, 1e255, 1e256, 1e257, 1e258, 1e259,
    1e260, 1e261, 1e262, 1e263, 1e264, 1e265, 1e266, 1e267, 1e268, 1e269,
    1e270, 1e271, 1e272, 1e273, 1e274, 1e275, 1e276, 1e277, 1e278, 1e279,
    1e280, 1e281, 1e282, 1e283, 1e284, 1e285, 1e286, 1e287, 1e288, 1e289,
    1e290, 1e291, 1e292, 1e293, 1e294, 1e295, 1e296, 1e297, 1e298, 1e299,
    1e300, 1e301, 1e302, 1e303, 1e304, 1e305, 1e306, 1e307, 1e308,
};

// Fails at `index`, the column pulled back by `back` (not below 0), as
// SliceRead::position_of_index places it.
static bool fail_at(reader *r, size_t index, const char *message, size_t back) {
    size_t start_of_line = 0, line = 1;
    for (size_t k = 0; k < index; k++) {
        if (r->s[k] == '\n') {
            line++;
            start_of_line = k + 1;
        }
    }
    size_t column = index - start_of_line;
    column = column > back ? column - back : 0;
    snprintf(r->doc->message, sizeof r->doc->message, "%s at line %zu column %zu", message, line, column);
    return false;
}

static bool fail(reader *r, const char *message) { return fail_at(r, r->i, message, 0); }

static bool peek_fail(reader *r, const char *message) {
    return fail_at(r, r->i + 1 < r->n ? r->i + 1 : r->n, message, 0);
}

static uint8_t peek_or_null(const reader *r) { return r->i < r->n ? r->s[r->i] : 0; }

static bool is_digit(int c) { return c >= '0' && c <= '9'; }

// Skips whitespace; the next byte, or -1 at the end.
static int whitespace(reader *r) {
    while (r->i < r->n) {
        uint8_t c = r->s[r->i];
        if (c != ' ' && c != '\n' && c != '\t' && c != '\r') return c;
        r->i++;
    }
    return -1;
}

static bool value(reader *r, bool keep, summary *out, uint8_t **text, size_t *text_len);
static bool object(reader *r, bool keep);

static bool enter(reader *r) {
    if (--r->remaining_depth == 0) return peek_fail(r, RECURSION_LIMIT);
    return true;
}

// Steps past the closing bracket or brace.
static void leave(reader *r) {
    r->remaining_depth++;
    r->i++;
}

static bool ident(reader *r, const char *rest) {
    for (; *rest; rest++) {
        if (r->i >= r->n) return fail(r, EOF_VALUE);
        if (r->s[r->i++] != (uint8_t)*rest) return fail(r, EXPECTED_IDENT);
    }
    return true;
}

// ---------------------------------------------------------------- strings

static void scratch_push(reader *r, const uint8_t *bytes, size_t len) {
    if (len == 0) return;
    if (r->scratch_len + len > r->scratch_cap) {
        r->scratch_cap = (r->scratch_len + len) * 2 + 16;
        r->scratch = checked_realloc(r->scratch, r->scratch_cap);
    }
    memcpy(r->scratch + r->scratch_len, bytes, len);
    r->scratch_len += len;
}

static void push_code_point(reader *r, uint32_t n) {
    uint8_t b[4];
    size_t len;
    if (n < 0x80) {
        b[0] = (uint8_t)n;
        len = 1;
    } else if (n < 0x800) {
        b[0] = (uint8_t)(0xc0 | (n >> 6));
        b[1] = (uint8_t)(0x80 | (n & 0x3f));
        len = 2;
    } else if (n < 0x10000) {
        b[0] = (uint8_t)(0xe0 | (n >> 12));
        b[1] = (uint8_t)(0x80 | ((n >> 6) & 0x3f));
        b[2] = (uint8_t)(0x80 | (n & 0x3f));
        len = 3;
    } else {
        b[0] = (uint8_t)(0xf0 | (n >> 18));
        b[1] = (uint8_t)(0x80 | ((n >> 12) & 0x3f));
        b[2] = (uint8_t)(0x80 | ((n >> 6) & 0x3f));
        b[3] = (uint8_t)(0x80 | (n & 0x3f));
        len = 4;
    }
    scratch_push(r, b, len);
}

// The length of the longest valid UTF-8 prefix (Rust's
// Utf8Error::valid_up_to): no overlong forms, no surrogates, nothing above
// U+10FFFF.
static size_t valid_up_to(const uint8_t *p, size_t len) {
    size_t i = 0;
    while (i < len) {
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t more;
        uint8_t lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) {
            more = 1;
        } else if (c >= 0xe0 && c <= 0xef) {
            more = 2;
            if (c == 0xe0) lo = 0xa0;
            if (c == 0xed) hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            more = 3;
            if (c == 0xf0) lo = 0x90;
            if (c == 0xf4) hi = 0x8f;
        } else {
            return i;
        }
        if (i + 1 >= len || p[i + 1] < lo || p[i + 1] > hi) return i;
        for (size_t k = 2; k <= more; k++) {
            if (i + k >= len || p[i + k] < 0x80 || p[i + k] > 0xbf) return i;
        }
        i += more + 1;
    }
    return i;
}

static int hex_value(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool hex4(reader *r, uint32_t *out) {
    if (r->n - r->i < 4) {
        r->i = r->n;
        return fail(r, EOF_STRING);
    }
    int value = 0;
    bool valid = true;
    for (int k = 0; k < 4; k++) {
        int v = hex_value(r->s[r->i + (size_t)k]);
        if (v < 0) valid = false;
        value = value * 16 + v;
    }
    r->i += 4;
    if (!valid) return fail(r, INVALID_ESCAPE);
    *out = (uint32_t)value;
    return true;
}

static bool unicode_escape(reader *r) {
    uint32_t n, n2;
    TRY(hex4(r, &n));
    if (n >= 0xdc00 && n <= 0xdfff) return fail(r, LONE_LEADING_SURROGATE);
    if (n < 0xd800 || n > 0xdbff) {
        push_code_point(r, n);
        return true;
    }
    for (const char *expected = "\\u"; *expected; expected++) {
        if (r->i >= r->n) return fail(r, EOF_STRING);
        if (r->s[r->i++] != (uint8_t)*expected) return fail(r, UNEXPECTED_END_OF_HEX_ESCAPE);
    }
    TRY(hex4(r, &n2));
    if (n2 < 0xdc00 || n2 > 0xdfff) return fail(r, LONE_LEADING_SURROGATE);
    push_code_point(r, 0x10000 + ((n - 0xd800) << 10) + (n2 - 0xdc00));
    return true;
}

static bool escape(reader *r) {
    if (r->i >= r->n) return fail(r, EOF_STRING);
    uint8_t c = r->s[r->i++], b;
    switch (c) {
    case '"': case '\\': case '/': b = c; break;
    case 'b': b = '\b'; break;
    case 'f': b = '\f'; break;
    case 'n': b = '\n'; break;
    case 'r': b = '\r'; break;
    case 't': b = '\t'; break;
    case 'u': return unicode_escape(r);
    default: return fail(r, INVALID_ESCAPE);
    }
    scratch_push(r, &b, 1);
    return true;
}

// A string, the opening quote read: its text in r->scratch.
static bool string(reader *r) {
    r->scratch_len = 0;
    size_t start = r->i;
    for (;;) {
        size_t j = r->i;
        while (j < r->n && r->s[j] != '"' && r->s[j] != '\\' && r->s[j] >= 0x20) j++;
        if (j == r->n) {
            r->i = j;
            return fail(r, EOF_STRING);
        }
        if (r->s[j] == '"') {
            scratch_push(r, r->s + start, j - start);
            r->i = j + 1;
            size_t valid = valid_up_to(r->scratch, r->scratch_len);
            // serde_json points back from the closing quote by the invalid
            // tail's length (in the decoded text).
            if (valid < r->scratch_len) return fail_at(r, r->i, INVALID_UNICODE, r->scratch_len - valid);
            return true;
        }
        if (r->s[j] == '\\') {
            scratch_push(r, r->s + start, j - start);
            r->i = j + 1;
            TRY(escape(r));
            start = r->i;
        } else {
            r->i = j + 1;
            return fail(r, CONTROL_CHARACTER);
        }
    }
}

static uint8_t *scratch_copy(const reader *r) {
    uint8_t *copy = checked_realloc(NULL, r->scratch_len);
    if (r->scratch_len) memcpy(copy, r->scratch, r->scratch_len);
    return copy;
}

// ---------------------------------------------------------------- numbers

static bool overflows(uint64_t significand, int digit) {
    return significand >= U64_MAX_DIV_10 && (significand > U64_MAX_DIV_10 || (uint64_t)digit > U64_MAX_MOD_10);
}

// serde_json's f64_from_parts, as far as it can fail: only a non-negative
// exponent can overflow.
static bool from_parts(reader *r, uint64_t significand, int32_t exponent) {
    if (exponent < 0 || significand == 0) return true;
    if (exponent > 308 || isinf((double)significand * pow10_table[exponent])) return fail(r, NUMBER_OUT_OF_RANGE);
    return true;
}

static bool exponent_part(reader *r, uint64_t significand, int32_t starting) {
    r->i++; // e or E
    bool positive = true;
    if (peek_or_null(r) == '+') {
        r->i++;
    } else if (peek_or_null(r) == '-') {
        r->i++;
        positive = false;
    }
    if (r->i >= r->n) return fail(r, EOF_VALUE);
    uint8_t c = r->s[r->i++];
    if (!is_digit(c)) return fail(r, INVALID_NUMBER);
    int32_t exp = c - '0';
    while (is_digit(peek_or_null(r))) {
        int digit = peek_or_null(r) - '0';
        r->i++;
        if (exp >= I32_MAX_DIV_10 && (exp > I32_MAX_DIV_10 || digit > I32_MAX_MOD_10)) {
            // The exponent overflows i32: an error for a positive one (but 0
            // stays 0), else the number is 0.
            if (significand != 0 && positive) return fail(r, NUMBER_OUT_OF_RANGE);
            while (is_digit(peek_or_null(r))) r->i++;
            return true;
        }
        exp = exp * 10 + digit;
    }
    int64_t final = positive ? (int64_t)starting + exp : (int64_t)starting - exp;
    if (final > INT32_MAX) final = INT32_MAX;
    if (final < INT32_MIN) final = INT32_MIN;
    return from_parts(r, significand, (int32_t)final);
}

static bool exponent_or_parts(reader *r, uint64_t significand, int32_t exponent) {
    uint8_t c = peek_or_null(r);
    if (c == 'e' || c == 'E') return exponent_part(r, significand, exponent);
    return from_parts(r, significand, exponent);
}

static bool decimal(reader *r, uint64_t significand, int32_t exponent_before) {
    r->i++; // .
    int32_t after = 0;
    while (is_digit(peek_or_null(r))) {
        int digit = peek_or_null(r) - '0';
        if (overflows(significand, digit)) {
            // Further digits are ignored.
            while (is_digit(peek_or_null(r))) r->i++;
            return exponent_or_parts(r, significand, exponent_before + after);
        }
        r->i++;
        significand = significand * 10 + (uint64_t)digit;
        after--;
    }
    if (after == 0) return peek_fail(r, r->i < r->n ? INVALID_NUMBER : EOF_VALUE);
    return exponent_or_parts(r, significand, exponent_before + after);
}

static bool long_integer(reader *r, uint64_t significand) {
    int32_t exponent = 0;
    for (;;) {
        uint8_t c = peek_or_null(r);
        if (is_digit(c)) {
            r->i++;
            exponent++;
        } else if (c == '.') {
            return decimal(r, significand, exponent);
        } else {
            return exponent_or_parts(r, significand, exponent);
        }
    }
}

static bool number(reader *r, bool positive, uint64_t significand, summary *out) {
    uint8_t c = peek_or_null(r);
    out->kind = SJ_OTHER;
    if (c == '.') return decimal(r, significand, 0);
    if (c == 'e' || c == 'E') return exponent_part(r, significand, 0);
    if (positive && significand <= (uint64_t)INT64_MAX) {
        out->kind = SJ_INTEGER;
        out->integer = (int64_t)significand;
    } else if (!positive && significand >= 1 && significand <= (uint64_t)INT64_MAX + 1) {
        // serde_json makes -0 and anything below i64::MIN a float.
        out->kind = SJ_INTEGER;
        out->integer = (int64_t)(0 - significand);
    }
    return true;
}

// A number, its sign read.
static bool integer(reader *r, bool positive, summary *out) {
    out->kind = SJ_OTHER;
    if (r->i >= r->n) return fail(r, EOF_VALUE);
    uint8_t c = r->s[r->i++];
    if (c == '0') {
        if (is_digit(peek_or_null(r))) return peek_fail(r, INVALID_NUMBER);
        return number(r, positive, 0, out);
    }
    if (!is_digit(c)) return fail(r, INVALID_NUMBER);
    uint64_t significand = (uint64_t)(c - '0');
    for (;;) {
        uint8_t d = peek_or_null(r);
        if (!is_digit(d)) return number(r, positive, significand, out);
        if (overflows(significand, d - '0')) return long_integer(r, significand);
        r->i++;
        significand = significand * 10 + (uint64_t)(d - '0');
    }
}

// ---------------------------------------------------------------- values

// The elements, up to (not past) the closing bracket.
static bool array(reader *r) {
    for (bool first = true;; first = false) {
        int c = whitespace(r);
        if (c == -1) return peek_fail(r, EOF_LIST);
        if (c == ']') return true;
        if (!first) {
            if (c != ',') return peek_fail(r, EXPECTED_LIST_COMMA_OR_END);
            r->i++;
            c = whitespace(r);
            if (c == ']') return peek_fail(r, TRAILING_COMMA);
            if (c == -1) return peek_fail(r, EOF_VALUE);
        }
        summary ignored;
        TRY(value(r, false, &ignored, NULL, NULL));
    }
}

static void set_field(sj_document *doc, uint8_t *key, size_t key_len, summary s, uint8_t *text, size_t text_len) {
    sj_field *field = NULL;
    for (size_t k = 0; k < doc->len; k++) {
        if (doc->fields[k].key_len == key_len && memcmp(doc->fields[k].key, key, key_len) == 0) {
            // A duplicate key replaces the earlier value.
            field = &doc->fields[k];
            free(field->key);
            free(field->text);
            break;
        }
    }
    if (!field) {
        if (doc->len == doc->cap) {
            doc->cap = doc->cap * 2 + 4;
            doc->fields = checked_realloc(doc->fields, doc->cap * sizeof *doc->fields);
        }
        field = &doc->fields[doc->len++];
    }
    *field = (sj_field){key, key_len, s.kind, text, text_len, s.integer};
}

// The members, up to (not past) the closing brace; with `keep`, their
// values' summaries in the document.
static bool object(reader *r, bool keep) {
    for (bool first = true;; first = false) {
        int c = whitespace(r);
        if (c == -1) return peek_fail(r, EOF_OBJECT);
        if (c == '}') return true;
        if (first) {
            if (c != '"') return peek_fail(r, KEY_MUST_BE_A_STRING);
        } else if (c == ',') {
            r->i++;
            c = whitespace(r);
            if (c == '}') return peek_fail(r, TRAILING_COMMA);
            if (c == -1) return peek_fail(r, EOF_VALUE);
            if (c != '"') return peek_fail(r, KEY_MUST_BE_A_STRING);
        } else {
            return peek_fail(r, EXPECTED_OBJECT_COMMA_OR_END);
        }
        r->i++; // "
        TRY(string(r));
        uint8_t *key = NULL;
        size_t key_len = r->scratch_len;
        if (keep) key = scratch_copy(r);
        c = whitespace(r);
        bool ok = true;
        if (c == -1) {
            ok = peek_fail(r, EOF_OBJECT);
        } else if (c != ':') {
            ok = peek_fail(r, EXPECTED_COLON);
        } else {
            r->i++;
        }
        summary s = {SJ_OTHER, 0};
        uint8_t *text = NULL;
        size_t text_len = 0;
        if (ok) ok = value(r, keep, &s, keep ? &text : NULL, &text_len);
        if (!ok) {
            free(key);
            free(text);
            return false;
        }
        if (keep) set_field(r->doc, key, key_len, s, text, text_len);
    }
}

// A value; with `keep`, a string or integer's summary (a string's text, a
// copy, in *text).
static bool value(reader *r, bool keep, summary *out, uint8_t **text, size_t *text_len) {
    out->kind = SJ_OTHER;
    int c = whitespace(r);
    switch (c) {
    case -1: return peek_fail(r, EOF_VALUE);
    case 'n': r->i++; return ident(r, "ull");
    case 't': r->i++; return ident(r, "rue");
    case 'f': r->i++; return ident(r, "alse");
    case '-': r->i++; return integer(r, false, out);
    case '"':
        r->i++;
        TRY(string(r));
        if (keep && text) {
            out->kind = SJ_STRING;
            *text = scratch_copy(r);
            *text_len = r->scratch_len;
        }
        return true;
    case '[':
        TRY(enter(r));
        r->i++;
        TRY(array(r));
        leave(r);
        return true;
    case '{':
        TRY(enter(r));
        r->i++;
        TRY(object(r, false));
        leave(r);
        return true;
    default:
        if (is_digit(c)) return integer(r, true, out);
        return peek_fail(r, EXPECTED_VALUE);
    }
}

static bool top(reader *r) {
    if (whitespace(r) == '{') {
        TRY(enter(r));
        r->i++;
        TRY(object(r, true));
        leave(r);
    } else {
        summary ignored;
        TRY(value(r, false, &ignored, NULL, NULL));
    }
    if (whitespace(r) != -1) return peek_fail(r, TRAILING_CHARACTERS);
    return true;
}

bool sj_parse(const uint8_t *data, size_t len, sj_document *doc) {
    *doc = (sj_document){NULL, 0, 0, {0}};
    reader r = {data, len, 0, 128, NULL, 0, 0, doc};
    bool ok = top(&r);
    free(r.scratch);
    return ok;
}

const sj_field *sj_get(const sj_document *doc, const char *name) {
    size_t len = strlen(name);
    for (size_t k = 0; k < doc->len; k++) {
        if (doc->fields[k].key_len == len && memcmp(doc->fields[k].key, name, len) == 0) return &doc->fields[k];
    }
    return NULL;
}

void sj_free(sj_document *doc) {
    for (size_t k = 0; k < doc->len; k++) {
        free(doc->fields[k].key);
        free(doc->fields[k].text);
    }
    free(doc->fields);
    doc->fields = NULL;
    doc->len = doc->cap = 0;
}
