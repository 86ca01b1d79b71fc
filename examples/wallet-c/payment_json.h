// A JSON reader that accepts exactly what serde_json accepts (see
// payment_json.c) and keeps, of a top-level object, the last values of the
// three fields a payment has.
#ifndef WALLET_PAYMENT_JSON_H
#define WALLET_PAYMENT_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    FIELD_ABSENT = 0,
    FIELD_STRING,
    FIELD_INTEGER,  // a number serde_json's Value::as_i64 accepts
    FIELD_OTHER,    // any other JSON value
} field_kind;

typedef struct {
    field_kind kind;
    char *text;      // FIELD_STRING: the decoded UTF-8 text (malloc'd)
    size_t len;
    int64_t integer; // FIELD_INTEGER
} payment_field;

typedef enum {
    PAYMENT_OBJECT = 0, // fields filled in
    PAYMENT_NOT_JSON,
    PAYMENT_NOT_OBJECT,
} payment_parse_result;

typedef struct {
    payment_field payment_id;
    payment_field account;
    payment_field amount;
} payment_fields;

payment_parse_result payment_parse(const uint8_t *text, size_t len, payment_fields *out);
void payment_fields_free(payment_fields *fields);

#endif
