// JSON as serde_json reads it, so that the C wallet rejects exactly the
// records the Rust wallet rejects:
// - UTF-8 only (a BOM is an error); whitespace is space, \t, \n, \r;
// - strings: no raw control characters, the usual escapes, \u escapes
//   whose surrogates must pair up;
// - numbers: JSON's grammar (no leading zeros), and a number whose value
//   overflows f64 is an error ("number out of range"): serde_json's digit
//   loop and f64_from_parts are replayed below;
// - at most 127 levels of nesting (serde_json's recursion limit refuses the
//   128th);
// - duplicate keys: the last one wins (serde_json's map insert).
// An integer is what Value::as_i64 accepts: no fraction or exponent, within
// i64, and not -0 (a float for serde_json).
#include "payment_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 127

typedef struct {
    const uint8_t *s;
    size_t n;
    size_t i;
    int depth;
    bool failed;
} reader;

typedef struct {
    char *data;
    size_t len, cap;
} buffer;

static void buf_push(buffer *b, const char *bytes, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 32;
        while (cap < b->len + n + 1) cap *= 2;
        char *data = realloc(b->data, cap);
        if (!data) abort();
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, bytes, n);
    b->len += n;
    b->data[b->len] = 0;
}

static void buf_push_code_point(buffer *b, uint32_t c) {
    char out[4];
    size_t n;
    if (c < 0x80) { out[0] = (char)c; n = 1; }
    else if (c < 0x800) { out[0] = (char)(0xC0 | (c >> 6)); out[1] = (char)(0x80 | (c & 0x3F)); n = 2; }
    else if (c < 0x10000) {
        out[0] = (char)(0xE0 | (c >> 12)); out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F)); n = 3;
    } else {
        out[0] = (char)(0xF0 | (c >> 18)); out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((c >> 6) & 0x3F)); out[3] = (char)(0x80 | (c & 0x3F)); n = 4;
    }
    buf_push(b, out, n);
}

static bool fail(reader *r) {
    r->failed = true;
    return false;
}

static int peek(reader *r) { return r->i < r->n ? r->s[r->i] : -1; }

static void skip_ws(reader *r) {
    while (r->i < r->n) {
        uint8_t c = r->s[r->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        r->i++;
    }
}

// Length of the well-formed UTF-8 sequence at s[0..n), or 0.
static size_t utf8_sequence(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uint32_t min;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; min = 0x80; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; min = 0x800; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; min = 0x10000; cp = c & 0x07; }
    else return 0;
    if (n < len) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

static int hex_digit(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool read_hex4(reader *r, uint32_t *out) {
    if (r->i + 4 > r->n) return fail(r);
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        int d = hex_digit(r->s[r->i + k]);
        if (d < 0) return fail(r);
        v = (v << 4) | (uint32_t)d;
    }
    r->i += 4;
    *out = v;
    return true;
}

// A string; the opening quote is at r->i. Decoded into `out` if not NULL.
static bool read_string(reader *r, buffer *out) {
    r->i++;
    for (;;) {
        if (r->i >= r->n) return fail(r);
        uint8_t c = r->s[r->i];
        if (c == '"') { r->i++; return true; }
        if (c < 0x20) return fail(r);
        if (c == '\\') {
            r->i++;
            int e = peek(r);
            r->i++;
            char simple = 0;
            switch (e) {
            case '"': simple = '"'; break;
            case '\\': simple = '\\'; break;
            case '/': simple = '/'; break;
            case 'b': simple = '\b'; break;
            case 'f': simple = '\f'; break;
            case 'n': simple = '\n'; break;
            case 'r': simple = '\r'; break;
            case 't': simple = '\t'; break;
            case 'u': {
                uint32_t cp;
                if (!read_hex4(r, &cp)) return false;
                if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(r); // lone trailing surrogate
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    uint32_t low;
                    if (r->i + 2 > r->n || r->s[r->i] != '\\' || r->s[r->i + 1] != 'u') return fail(r);
                    r->i += 2;
                    if (!read_hex4(r, &low)) return false;
                    if (low < 0xDC00 || low > 0xDFFF) return fail(r);
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                }
                if (out) buf_push_code_point(out, cp);
                continue;
            }
            default:
                return fail(r);
            }
            if (out) buf_push(out, &simple, 1);
            continue;
        }
        size_t len = utf8_sequence(r->s + r->i, r->n - r->i);
        if (len == 0) return fail(r);
        if (out) buf_push(out, (const char *)r->s + r->i, len);
        r->i += len;
    }
}

// ---------------------------------------------------------------- numbers

// serde_json's table: 1e0 to 1e308, as literals (correctly rounded by the
// compiler; computing them at run time with strtod costs millions of fuel).
static const double POW10[309] = {
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22, 1e23, 1e24, 1e25, 1e26, 1e27, 1e28, 1e29, 1e30, 1e31,
    1e32, 1e33, 1e34, 1e35, 1e36, 1e37, 1e38, 1e39, 1e40, 1e41, 1e42, 1e43, 1e44, 1e45, 1e46,
    1e47, 1e48, 1e49, 1e50, 1e51, 1e52, 1e53, 1e54, 1e55, 1e56, 1e57, 1e58, 1e59, 1e60, 1e61,
    1e62, 1e63, 1e64, 1e65, 1e66, 1e67, 1e68, 1e69, 1e70, 1e71, 1e72, 1e73, 1e74, 1e75, 1e76,
    1e77, 1e78, 1e79, 1e80, 1e81, 1e82, 1e83, 1e84, 1e85, 1e86, 1e87, 1e88, 1e89, 1e90, 1e91,
    1e92, 1e93, 1e94, 1e95, 1e96, 1e97, 1e98, 1e99, 1e100, 1e101, 1e102, 1e103, 1e104, 1e105,
    1e106, 1e107, 1e108, 1e109, 1e110, 1e111, 1e112, 1e113, 1e114, 1e115, 1e116, 1e117, 1e118,
    1e119, 1e120, 1e121, 1e122, 1e123, 1e124, 1e125, 1e126, 1e127, 1e128, 1e129, 1e130, 1e131,
    1e132, 1e133, 1e134, 1e135, 1e136, 1e137, 1e138, 1e139, 1e140, 1e141, 1e142, 1e143, 1e144,
    1e145, 1e146, 1e147, 1e148, 1e149, 1e150, 1e151, 1e152, 1e153, 1e154, 1e155, 1e156, 1e157,
    1e158, 1e159, 1e160, 1e161, 1e162, 1e163, 1e164, 1e165, 1e166, 1e167, 1e168, 1e169, 1e170,
    1e171, 1e172, 1e173, 1e174, 1e175, 1e176, 1e177, 1e178, 1e179, 1e180, 1e181, 1e182, 1e183,
    1e184, 1e185, 1e186, 1e187, 1e188, 1e189, 1e190, 1e191, 1e192, 1e193, 1e194, 1e195, 1e196,
    1e197, 1e198, 1e199, 1e200, 1e201, 1e202, 1e203, 1e204, 1e205, 1e206, 1e207, 1e208, 1e209,
    1e210, 1e211, 1e212, 1e213, 1e214, 1e215, 1e216, 1e217, 1e218, 1e219, 1e220, 1e221, 1e222,
    1e223, 1e224, 1e225, 1e226, 1e227, 1e228, 1e229, 1e230, 1e231, 1e232, 1e233, 1e234, 1e235,
    1e236, 1e237, 1e238, 1e239, 1e240, 1e241, 1e242, 1e243, 1e244, 1e245, 1e246, 1e247, 1e248,
    1e249, 1e250, 1e251, 1e252, 1e253, 1e254, 1e255, 1e256, 1e257, 1e258, 1e259, 1e260, 1e261,
    1e262, 1e263, 1e264, 1e265, 1e266, 1e267, 1e268, 1e269, 1e270, 1e271, 1e272, 1e273, 1e274,
    1e275, 1e276, 1e277, 1e278, 1e279, 1e280, 1e281, 1e282, 1e283, 1e284, 1e285, 1e286, 1e287,
    1e288, 1e289, 1e290, 1e291, 1e292, 1e293, 1e294, 1e295, 1e296, 1e297, 1e298, 1e299, 1e300,
    1e301, 1e302, 1e303, 1e304, 1e305, 1e306, 1e307, 1e308
};

#define U64_MAX_DIV_10 1844674407370955161ULL
#define U64_MAX_MOD_10 5

static bool overflows(uint64_t significand, int digit) {
    return significand >= U64_MAX_DIV_10 &&
           (significand > U64_MAX_DIV_10 || digit > U64_MAX_MOD_10);
}

// serde_json's f64_from_parts, as far as it can fail: only a non-negative
// exponent can overflow.
static bool from_parts(reader *r, uint64_t significand, int32_t exponent) {
    if (exponent < 0 || significand == 0) return true;
    if (exponent > 308) return fail(r);
    if (isinf((double)significand * POW10[exponent])) return fail(r);
    return true;
}

static int digit_at(reader *r) {
    int c = peek(r);
    return c >= '0' && c <= '9' ? c - '0' : -1;
}

static bool read_exponent(reader *r, uint64_t significand, int32_t starting) {
    r->i++; // e or E
    bool positive = true;
    if (peek(r) == '+') r->i++;
    else if (peek(r) == '-') { positive = false; r->i++; }
    int d = digit_at(r);
    if (d < 0) return fail(r);
    r->i++;
    int32_t exp = d;
    while ((d = digit_at(r)) >= 0) {
        r->i++;
        if (exp >= 214748364 && (exp > 214748364 || d > 7)) {
            // The exponent overflows i32: serde_json skips the remaining
            // digits and fails only for a positive exponent.
            while (digit_at(r) >= 0) r->i++;
            if (significand != 0 && positive) return fail(r);
            return true;
        }
        exp = exp * 10 + d;
    }
    int64_t total = positive ? (int64_t)starting + exp : (int64_t)starting - exp;
    if (total > INT32_MAX) total = INT32_MAX;
    if (total < INT32_MIN) total = INT32_MIN;
    return from_parts(r, significand, (int32_t)total);
}

static bool read_fraction_or_exponent(reader *r, uint64_t significand, int32_t exponent);

static bool read_decimal(reader *r, uint64_t significand, int32_t exponent_before) {
    r->i++; // .
    int32_t after = 0;
    int d = digit_at(r);
    if (d < 0) return fail(r);
    while ((d = digit_at(r)) >= 0) {
        if (overflows(significand, d)) {
            // Further digits are ignored.
            while (digit_at(r) >= 0) r->i++;
            break;
        }
        r->i++;
        significand = significand * 10 + (uint64_t)d;
        after--;
    }
    int c = peek(r);
    if (c == 'e' || c == 'E') return read_exponent(r, significand, exponent_before + after);
    return from_parts(r, significand, exponent_before + after);
}

static bool read_fraction_or_exponent(reader *r, uint64_t significand, int32_t exponent) {
    int c = peek(r);
    if (c == '.') return read_decimal(r, significand, exponent);
    if (c == 'e' || c == 'E') return read_exponent(r, significand, exponent);
    return from_parts(r, significand, exponent);
}

// A number; sets *is_integer and *integer when it is one as_i64 accepts.
static bool read_number(reader *r, bool *is_integer, int64_t *integer) {
    *is_integer = false;
    bool negative = false;
    if (peek(r) == '-') { negative = true; r->i++; }
    int d = digit_at(r);
    if (d < 0) return fail(r);
    r->i++;
    uint64_t significand = (uint64_t)d;
    if (d == 0) {
        if (digit_at(r) >= 0) return fail(r); // leading zero
    } else {
        while ((d = digit_at(r)) >= 0) {
            if (overflows(significand, d)) {
                // A long integer: the remaining integer digits only scale it.
                int32_t exponent = 0;
                while (digit_at(r) >= 0) { r->i++; exponent++; }
                return read_fraction_or_exponent(r, significand, exponent);
            }
            r->i++;
            significand = significand * 10 + (uint64_t)d;
        }
    }
    int c = peek(r);
    if (c == '.' || c == 'e' || c == 'E') return read_fraction_or_exponent(r, significand, 0);
    if (!negative) {
        if (significand <= (uint64_t)INT64_MAX) { *is_integer = true; *integer = (int64_t)significand; }
    } else if (significand >= 1 && significand <= (uint64_t)INT64_MAX + 1) {
        *is_integer = true;
        *integer = (int64_t)(0 - significand);
    }
    return true;
}

// ---------------------------------------------------------------- values

static bool read_literal(reader *r, const char *word) {
    size_t len = strlen(word);
    if (r->i + len > r->n || memcmp(r->s + r->i, word, len) != 0) return fail(r);
    r->i += len;
    return true;
}

static bool read_value(reader *r, payment_field *capture);

static bool read_array(reader *r) {
    if (++r->depth > MAX_DEPTH) return fail(r);
    r->i++; // [
    skip_ws(r);
    if (peek(r) == ']') { r->i++; r->depth--; return true; }
    for (;;) {
        if (!read_value(r, NULL)) return false;
        skip_ws(r);
        int c = peek(r);
        r->i++;
        if (c == ']') break;
        if (c != ',') return fail(r);
        skip_ws(r);
    }
    r->depth--;
    return true;
}

// An object; at the top level (fields != NULL) the payment's fields are kept.
static bool read_object(reader *r, payment_fields *fields) {
    if (++r->depth > MAX_DEPTH) return fail(r);
    r->i++; // {
    skip_ws(r);
    if (peek(r) == '}') { r->i++; r->depth--; return true; }
    buffer key = {0};
    for (;;) {
        if (peek(r) != '"') { free(key.data); return fail(r); }
        key.len = 0;
        if (!read_string(r, fields ? &key : NULL)) { free(key.data); return false; }
        skip_ws(r);
        if (peek(r) != ':') { free(key.data); return fail(r); }
        r->i++;
        skip_ws(r);
        payment_field *capture = NULL;
        if (fields && key.data) {
            if (key.len == 10 && memcmp(key.data, "payment_id", 10) == 0) capture = &fields->payment_id;
            else if (key.len == 7 && memcmp(key.data, "account", 7) == 0) capture = &fields->account;
            else if (key.len == 6 && memcmp(key.data, "amount", 6) == 0) capture = &fields->amount;
        }
        if (capture) {
            // A duplicate key replaces the earlier value.
            free(capture->text);
            memset(capture, 0, sizeof *capture);
        }
        if (!read_value(r, capture)) { free(key.data); return false; }
        skip_ws(r);
        int c = peek(r);
        r->i++;
        if (c == '}') break;
        if (c != ',') { free(key.data); return fail(r); }
        skip_ws(r);
    }
    free(key.data);
    r->depth--;
    return true;
}

static bool read_value(reader *r, payment_field *capture) {
    int c = peek(r);
    switch (c) {
    case '"': {
        if (!capture) return read_string(r, NULL);
        buffer text = {0};
        buf_push(&text, "", 0);
        if (!read_string(r, &text)) { free(text.data); return false; }
        capture->kind = FIELD_STRING;
        capture->text = text.data;
        capture->len = text.len;
        return true;
    }
    case '{':
        if (capture) capture->kind = FIELD_OTHER;
        return read_object(r, NULL);
    case '[':
        if (capture) capture->kind = FIELD_OTHER;
        return read_array(r);
    case 't':
        if (capture) capture->kind = FIELD_OTHER;
        return read_literal(r, "true");
    case 'f':
        if (capture) capture->kind = FIELD_OTHER;
        return read_literal(r, "false");
    case 'n':
        if (capture) capture->kind = FIELD_OTHER;
        return read_literal(r, "null");
    default: {
        if (c != '-' && (c < '0' || c > '9')) return fail(r);
        bool is_integer;
        int64_t integer = 0;
        if (!read_number(r, &is_integer, &integer)) return false;
        if (capture) {
            capture->kind = is_integer ? FIELD_INTEGER : FIELD_OTHER;
            capture->integer = integer;
        }
        return true;
    }
    }
}

payment_parse_result payment_parse(const uint8_t *text, size_t len, payment_fields *out) {
    memset(out, 0, sizeof *out);
    reader r = {.s = text, .n = len};
    skip_ws(&r);
    bool is_object = peek(&r) == '{';
    bool ok = is_object ? read_object(&r, out) : read_value(&r, NULL);
    if (ok) {
        skip_ws(&r);
        ok = r.i == r.n; // trailing characters
    }
    if (!ok) {
        payment_fields_free(out);
        return PAYMENT_NOT_JSON;
    }
    return is_object ? PAYMENT_OBJECT : PAYMENT_NOT_OBJECT;
}

void payment_fields_free(payment_fields *fields) {
    free(fields->payment_id.text);
    free(fields->account.text);
    free(fields->amount.text);
    memset(fields, 0, sizeof *fields);
}
