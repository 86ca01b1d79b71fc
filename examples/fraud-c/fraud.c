// Payments joined with an accounts table, in C: the same processor as
// examples/fraud (Rust), with byte-identical alerts and dead letters. A
// payment over its account's limit, or on a blocked account, raises an
// alert (Kafka Streams' payments.join(accounts, joiner).filter(alert !=
// null)).
//
// The table `accounts` is the compacted topic of the same name,
// co-partitioned with the payments: the host keeps each task's partition of
// it in a read-only store, read here with the ordinary onceflow_get. A
// payment whose account is not in the table raises nothing (an inner join).
//
// Input: key = account, value = {"payment_id":"p1","account":"alice",
// "amount":250}. Table: key = account, value = {"limit":200,
// "status":"active"}. Output `alerts`: key = account, value =
// {"payment_id":"p1","account":"alice","amount":250,"limit":200,
// "reason":"over-limit"} (`reason` is `blocked` before `over-limit`). A
// malformed payment or account value is dead-lettered with the reason,
// serde_json's own words included (serde_json.c).
//
// Built by `onceflow build` (clang + wasi-libc, bindings from `wit-bindgen
// c`) with the onceflow C SDK layer (onceflow.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onceflow.h"
#include "serde_json.h"

// A growing byte buffer: messages and the alert, which may hold NULs.
typedef struct {
    char *ptr;
    size_t len, cap;
} buffer;

static void append(buffer *b, const void *bytes, size_t len) {
    if (b->len + len > b->cap) {
        b->cap = (b->len + len) * 2 + 64;
        b->ptr = realloc(b->ptr, b->cap);
        if (!b->ptr) abort();
    }
    if (len) memcpy(b->ptr + b->len, bytes, len);
    b->len += len;
}

static void append_str(buffer *b, const char *text) { append(b, text, strlen(text)); }

static void append_i64(buffer *b, int64_t n) {
    char text[24];
    append(b, text, (size_t)snprintf(text, sizeof text, "%lld", (long long)n));
}

// Appends `text` as serde_json writes a string (Value::from(text)): quote,
// backslash, \b \f \n \r \t, other control characters as \u00xx;
// everything else as is.
static void append_json_string(buffer *b, const uint8_t *text, size_t len) {
    static const char hex[] = "0123456789abcdef";
    append(b, "\"", 1);
    for (size_t i = 0; i < len; i++) {
        uint8_t c = text[i];
        const char *escape = NULL;
        switch (c) {
        case '"': escape = "\\\""; break;
        case '\\': escape = "\\\\"; break;
        case '\b': escape = "\\b"; break;
        case '\f': escape = "\\f"; break;
        case '\n': escape = "\\n"; break;
        case '\r': escape = "\\r"; break;
        case '\t': escape = "\\t"; break;
        }
        if (escape) {
            append_str(b, escape);
        } else if (c < 0x20) {
            char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 0xf]};
            append(b, u, sizeof u);
        } else {
            append(b, &c, 1);
        }
    }
    append(b, "\"", 1);
}

// An error "<what>: <message>" (the account name in `what` may hold NULs).
static onceflow_error *failure(onceflow_bytes what, const char *message) {
    buffer b = {0};
    append(&b, what.ptr, what.len);
    append_str(&b, ": ");
    append_str(&b, message);
    onceflow_error *error = onceflow_error_from_bytes((onceflow_bytes){(const uint8_t *)b.ptr, b.len});
    free(b.ptr);
    return error;
}

static onceflow_error *integer(const sj_document *doc, const char *field, onceflow_bytes what, int64_t *out) {
    const sj_field *value = sj_get(doc, field);
    if (!value || value->kind != SJ_INTEGER) {
        char message[64];
        snprintf(message, sizeof message, "field \"%s\" must be an integer", field);
        return failure(what, message);
    }
    *out = value->integer;
    return NULL;
}

static onceflow_error *text(const sj_document *doc, const char *field, onceflow_bytes what,
                            const sj_field **out) {
    const sj_field *value = sj_get(doc, field);
    if (!value || value->kind != SJ_STRING) {
        char message[64];
        snprintf(message, sizeof message, "field \"%s\" must be a string", field);
        return failure(what, message);
    }
    *out = value;
    return NULL;
}

// Checks the payment against its account; the documents are the caller's.
static onceflow_error *join(onceflow_bytes account, sj_document *payment, sj_document *settings) {
    const onceflow_bytes payment_what = onceflow_str("payment");
    const sj_field *payment_id, *payer;
    int64_t amount, limit;
    onceflow_error *error;
    if ((error = text(payment, "payment_id", payment_what, &payment_id))) return error;
    if ((error = text(payment, "account", payment_what, &payer))) return error;
    if ((error = integer(payment, "amount", payment_what, &amount))) return error;

    onceflow_bytes stored;
    bool found;
    if ((error = onceflow_get("accounts", account, &stored, &found)) || !found) return error;
    buffer what = {0};
    append_str(&what, "account ");
    append(&what, account.ptr, account.len);
    onceflow_bytes what_bytes = {(const uint8_t *)what.ptr, what.len};
    bool parsed = sj_parse(stored.ptr, stored.len, settings);
    onceflow_bytes_free(&stored);
    const sj_field *status;
    if (!parsed) {
        buffer message = {0};
        append_str(&message, "its table value is not JSON: ");
        append_str(&message, settings->message);
        append(&message, "", 1);
        error = failure(what_bytes, message.ptr);
        free(message.ptr);
    } else if (!(error = integer(settings, "limit", what_bytes, &limit)) &&
               !(error = text(settings, "status", what_bytes, &status))) {
        const char *reason = NULL;
        if (status->text_len == 7 && memcmp(status->text, "blocked", 7) == 0) {
            reason = "blocked";
        } else if (amount > limit) {
            reason = "over-limit";
        }
        if (reason) {
            buffer alert = {0};
            append_str(&alert, "{\"payment_id\":");
            append_json_string(&alert, payment_id->text, payment_id->text_len);
            append_str(&alert, ",\"account\":");
            append_json_string(&alert, payer->text, payer->text_len);
            append_str(&alert, ",\"amount\":");
            append_i64(&alert, amount);
            append_str(&alert, ",\"limit\":");
            append_i64(&alert, limit);
            append_str(&alert, ",\"reason\":\"");
            append_str(&alert, reason);
            append_str(&alert, "\"}");
            onceflow_bytes value = {(const uint8_t *)alert.ptr, alert.len};
            error = onceflow_emit("alerts", &account, &value);
            free(alert.ptr);
        }
    }
    free(what.ptr);
    return error;
}

onceflow_error *onceflow_process(const onceflow_record *record) {
    onceflow_bytes account;
    onceflow_error *error = onceflow_record_key_str(record, &account);
    if (error) return error;
    if (!record->value.present) return onceflow_error_new("record has no value");
    sj_document payment, settings = {0};
    if (!sj_parse(record->value.bytes.ptr, record->value.bytes.len, &payment)) {
        error = onceflow_error_new("record value is not the expected JSON: %s", payment.message);
    } else {
        error = join(account, &payment, &settings);
    }
    sj_free(&payment);
    sj_free(&settings);
    return error;
}
