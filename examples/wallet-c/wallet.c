// Wallet, in C: the same processor as examples/wallet (Rust), with
// byte-identical outputs and error messages. It keeps a balance per account
// in the state store `balances` and, for every payment, emits the new
// balance (alias `balances`) and an audit copy of the payment (alias
// `audit`).
//
// Input values are JSON objects {"payment_id": str, "account": str,
// "amount": int}, read by payment_json.c exactly as serde_json reads them;
// the fields are then checked in the same order with the same messages.
//
// Built by `onceflow build` (clang + wasi-libc, bindings from `wit-bindgen
// c`) with the onceflow C SDK layer (onceflow.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onceflow.h"
#include "payment_json.h"

static onceflow_error *invalid(const char *reason) {
    return onceflow_error_new("invalid payment: %s", reason);
}

static onceflow_error *missing(const char *name) {
    return onceflow_error_new("invalid payment: missing field \"%s\"", name);
}

// The field as a string, or an error.
static onceflow_error *string_field(const payment_field *field, const char *name) {
    switch (field->kind) {
    case FIELD_ABSENT:
        return missing(name);
    case FIELD_STRING:
        return NULL;
    default:
        return onceflow_error_new("invalid payment: field \"%s\" must be a string", name);
    }
}

// Appends `text` as a JSON string literal, escaped as serde_json does:
// quote, backslash and control characters only (\b \f \n \r \t, else
// \u00XX in lowercase hex).
static size_t json_string(char *out, const char *text, size_t len) {
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    out[n++] = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        switch (c) {
        case '"': out[n++] = '\\'; out[n++] = '"'; break;
        case '\\': out[n++] = '\\'; out[n++] = '\\'; break;
        case '\b': out[n++] = '\\'; out[n++] = 'b'; break;
        case '\f': out[n++] = '\\'; out[n++] = 'f'; break;
        case '\n': out[n++] = '\\'; out[n++] = 'n'; break;
        case '\r': out[n++] = '\\'; out[n++] = 'r'; break;
        case '\t': out[n++] = '\\'; out[n++] = 't'; break;
        default:
            if (c < 0x20) {
                memcpy(out + n, "\\u00", 4);
                n += 4;
                out[n++] = hex[c >> 4];
                out[n++] = hex[c & 0xf];
            } else {
                out[n++] = (char)c;
            }
        }
    }
    out[n++] = '"';
    return n;
}

static onceflow_error *process_payment(const onceflow_record *record, payment_fields *fields) {
    if (!record->value.present) return invalid("missing value");
    switch (payment_parse(record->value.bytes.ptr, record->value.bytes.len, fields)) {
    case PAYMENT_NOT_JSON:
        return invalid("not valid JSON");
    case PAYMENT_NOT_OBJECT:
        return invalid("not a JSON object");
    case PAYMENT_OBJECT:
        break;
    }
    onceflow_error *error;
    if ((error = string_field(&fields->payment_id, "payment_id"))) return error;
    if ((error = string_field(&fields->account, "account"))) return error;
    if (fields->amount.kind == FIELD_ABSENT) return missing("amount");
    if (fields->amount.kind != FIELD_INTEGER) return invalid("field \"amount\" must be an integer");
    int64_t amount = fields->amount.integer;

    onceflow_bytes account = {(const uint8_t *)fields->account.text, fields->account.len};
    int64_t balance = 0;
    bool found;
    if ((error = onceflow_get_i64("balances", account, &balance, &found))) return error;
    if (__builtin_add_overflow(balance, amount, &balance)) {
        // The account may hold any UTF-8, NUL included: not through %s.
        const char *prefix = "invalid payment: balance overflow for account \"";
        size_t prefix_len = strlen(prefix);
        char *message = malloc(prefix_len + account.len + 2);
        if (!message) abort();
        memcpy(message, prefix, prefix_len);
        memcpy(message + prefix_len, account.ptr, account.len);
        memcpy(message + prefix_len + account.len, "\"", 2);
        error = onceflow_error_new("%s", message);
        free(message);
        return error;
    }

    // Every check has passed: only now change anything.
    if ((error = onceflow_put_i64("balances", account, balance))) return error;
    // Each escaped byte takes at most 6 bytes.
    size_t cap = 64 + 6 * (fields->account.len + fields->payment_id.len);
    char *report = malloc(cap);
    if (!report) abort();
    size_t n = 0;
    memcpy(report + n, "{\"account\":", 11);
    n += 11;
    n += json_string(report + n, fields->account.text, fields->account.len);
    n += (size_t)snprintf(report + n, cap - n, ",\"balance\":%lld,\"payment_id\":", (long long)balance);
    n += json_string(report + n, fields->payment_id.text, fields->payment_id.len);
    report[n++] = '}';
    onceflow_bytes report_bytes = {(const uint8_t *)report, n};
    error = onceflow_emit("balances", &account, &report_bytes);
    free(report);
    if (error) return error;
    onceflow_bytes payment_id = {(const uint8_t *)fields->payment_id.text, fields->payment_id.len};
    return onceflow_emit("audit", &payment_id, &record->value.bytes);
}

onceflow_error *onceflow_process(const onceflow_record *record) {
    payment_fields fields = {0};
    onceflow_error *error = process_payment(record, &fields);
    payment_fields_free(&fields);
    return error;
}
