// serde_json.h: JSON read as the Rust fraud example's serde_json (1.0,
// default features) reads it into a serde_json::Value, with its error
// messages, so that a malformed payment or account value is dead-lettered
// with the very reason the Rust processor gives: `expected value at line 1
// column 1`, `EOF while parsing a string at line 1 column 12`, ...
//
// The reader replays serde_json's parser: the same grammar (UTF-8 only,
// strings without raw control characters and with paired surrogates,
// numbers whose f64 value must not overflow, at most 127 levels of
// nesting), the same checks in the same order, and the error position
// (line, and column in bytes) computed as serde_json computes it for a byte
// slice.
#ifndef FRAUD_SERDE_JSON_H
#define FRAUD_SERDE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// What a top-level field holds, as far as the fraud check cares: a string,
// an integer Value::as_i64 accepts, or anything else.
typedef enum { SJ_OTHER, SJ_STRING, SJ_INTEGER } sj_kind;

typedef struct {
    uint8_t *key; // UTF-8, not NUL-terminated
    size_t key_len;
    sj_kind kind;
    uint8_t *text; // SJ_STRING: UTF-8, not NUL-terminated
    size_t text_len;
    int64_t integer; // SJ_INTEGER
} sj_field;

// A parsed document: the fields of a top-level object (the last of
// duplicate keys winning; none for any other top-level value, as
// Value::get on a non-object), or serde_json's message.
typedef struct {
    sj_field *fields;
    size_t len, cap;
    char message[192]; // when sj_parse failed: NUL-terminated
} sj_document;

// Reads a whole JSON text as serde_json::from_slice::<Value> does; false
// with doc->message on failure. Free the document with sj_free either way.
bool sj_parse(const uint8_t *data, size_t len, sj_document *doc);
// The field called `name`, or NULL.
const sj_field *sj_get(const sj_document *doc, const char *name);
void sj_free(sj_document *doc);

#endif
