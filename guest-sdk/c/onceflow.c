// The onceflow C SDK layer: the world's exports over onceflow_process, and
// the imports with the Rust SDK's error messages. See onceflow.h.
#include "onceflow.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct onceflow_error {
    char *message; // malloc'd, NUL-terminated
};

static void *checked_malloc(size_t size) {
    void *p = malloc(size ? size : 1);
    if (!p) abort(); // out of the instance's memory: trap, the host retries
    return p;
}

static char *vformat(const char *format, va_list args) {
    va_list copy;
    va_copy(copy, args);
    int len = vsnprintf(NULL, 0, format, copy);
    va_end(copy);
    if (len < 0) len = 0;
    char *text = checked_malloc((size_t)len + 1);
    vsnprintf(text, (size_t)len + 1, format, args);
    return text;
}

onceflow_error *onceflow_error_new(const char *format, ...) {
    onceflow_error *error = checked_malloc(sizeof *error);
    va_list args;
    va_start(args, format);
    error->message = vformat(format, args);
    va_end(args);
    return error;
}

const char *onceflow_error_message(const onceflow_error *error) { return error->message; }

void onceflow_error_free(onceflow_error *error) {
    if (!error) return;
    free(error->message);
    free(error);
}

onceflow_bytes onceflow_str(const char *text) {
    return (onceflow_bytes){(const uint8_t *)text, strlen(text)};
}

static processor_string_t wit_string(const char *text) {
    return (processor_string_t){(uint8_t *)text, strlen(text)};
}

static processor_list_u8_t wit_bytes(onceflow_bytes bytes) {
    return (processor_list_u8_t){(uint8_t *)bytes.ptr, bytes.len};
}

static onceflow_error *state_error(onceflow_processor_state_state_error_t *e) {
    onceflow_error *error;
    if (e->tag == ONCEFLOW_PROCESSOR_TYPES_STATE_ERROR_UNKNOWN_STORE) {
        error = onceflow_error_new(
            "unknown state store \"%.*s\": declare it under stores in onceflow.toml",
            (int)e->val.unknown_store.len, (const char *)e->val.unknown_store.ptr);
    } else {
        error = onceflow_error_new(
            "state key or value too large: the host accepts at most %llu bytes",
            (unsigned long long)e->val.too_large);
    }
    onceflow_processor_state_state_error_free(e);
    return error;
}

onceflow_error *onceflow_get(const char *store, onceflow_bytes key, onceflow_bytes *value, bool *found) {
    processor_string_t wit_store = wit_string(store);
    processor_list_u8_t wit_key = wit_bytes(key);
    processor_option_list_u8_t ret;
    onceflow_processor_state_state_error_t err;
    if (!onceflow_processor_state_get(&wit_store, &wit_key, &ret, &err)) return state_error(&err);
    *found = ret.is_some;
    // The bindings allocated the value with malloc (cabi_realloc): hand it over.
    *value = ret.is_some ? (onceflow_bytes){ret.val.ptr, ret.val.len} : (onceflow_bytes){NULL, 0};
    return NULL;
}

void onceflow_bytes_free(onceflow_bytes *bytes) {
    free((void *)bytes->ptr);
    bytes->ptr = NULL;
    bytes->len = 0;
}

char *onceflow_escape_ascii(onceflow_bytes bytes) {
    char *out = checked_malloc(bytes.len * 4 + 1);
    size_t n = 0;
    for (size_t i = 0; i < bytes.len; i++) {
        uint8_t b = bytes.ptr[i];
        switch (b) {
        case '\t': out[n++] = '\\'; out[n++] = 't'; break;
        case '\n': out[n++] = '\\'; out[n++] = 'n'; break;
        case '\r': out[n++] = '\\'; out[n++] = 'r'; break;
        case '"': case '\'': case '\\': out[n++] = '\\'; out[n++] = (char)b; break;
        default:
            if (b >= 0x20 && b < 0x7f) {
                out[n++] = (char)b;
            } else {
                n += (size_t)snprintf(out + n, 5, "\\x%02x", b);
            }
        }
    }
    out[n] = 0;
    return out;
}

onceflow_error *onceflow_get_i64(const char *store, onceflow_bytes key, int64_t *value, bool *found) {
    onceflow_bytes bytes;
    onceflow_error *error = onceflow_get(store, key, &bytes, found);
    if (error || !*found) return error;
    // Rust's i64::from_str: an optional sign, then one or more ASCII digits.
    size_t i = 0;
    bool negative = false;
    if (bytes.len > 0 && (bytes.ptr[0] == '+' || bytes.ptr[0] == '-')) {
        negative = bytes.ptr[0] == '-';
        i = 1;
    }
    bool ok = i < bytes.len;
    uint64_t magnitude = 0;
    for (; ok && i < bytes.len; i++) {
        uint8_t c = bytes.ptr[i];
        if (c < '0' || c > '9' || magnitude > (UINT64_MAX - (c - '0')) / 10) {
            ok = false;
            break;
        }
        magnitude = magnitude * 10 + (c - '0');
    }
    if (ok && !negative && magnitude > (uint64_t)INT64_MAX) ok = false;
    if (ok && negative && magnitude > (uint64_t)INT64_MAX + 1) ok = false;
    onceflow_bytes_free(&bytes);
    if (!ok) {
        *found = false;
        char *escaped = onceflow_escape_ascii(key);
        error = onceflow_error_new(
            "state store \"%s\": the value of key \"%s\" is not a decimal integer", store, escaped);
        free(escaped);
        return error;
    }
    *value = negative ? (int64_t)(0 - magnitude) : (int64_t)magnitude;
    return NULL;
}

onceflow_error *onceflow_put(const char *store, onceflow_bytes key, onceflow_bytes value) {
    processor_string_t wit_store = wit_string(store);
    processor_list_u8_t wit_key = wit_bytes(key), wit_value = wit_bytes(value);
    onceflow_processor_state_state_error_t err;
    if (!onceflow_processor_state_put(&wit_store, &wit_key, &wit_value, &err)) return state_error(&err);
    return NULL;
}

onceflow_error *onceflow_put_i64(const char *store, onceflow_bytes key, int64_t value) {
    char text[24];
    int len = snprintf(text, sizeof text, "%lld", (long long)value);
    return onceflow_put(store, key, (onceflow_bytes){(const uint8_t *)text, (size_t)len});
}

onceflow_error *onceflow_delete(const char *store, onceflow_bytes key) {
    processor_string_t wit_store = wit_string(store);
    processor_list_u8_t wit_key = wit_bytes(key);
    onceflow_processor_state_state_error_t err;
    if (!onceflow_processor_state_delete(&wit_store, &wit_key, &err)) return state_error(&err);
    return NULL;
}

onceflow_error *onceflow_emit(const char *alias, const onceflow_bytes *key, const onceflow_bytes *value) {
    processor_string_t wit_alias = wit_string(alias);
    processor_list_u8_t wit_key, wit_value;
    if (key) wit_key = wit_bytes(*key);
    if (value) wit_value = wit_bytes(*value);
    onceflow_processor_output_list_header_t headers = {NULL, 0};
    onceflow_processor_output_output_error_t err;
    if (onceflow_processor_output_emit(&wit_alias, key ? &wit_key : NULL, value ? &wit_value : NULL, &headers, &err)) {
        return NULL;
    }
    onceflow_error *error;
    if (err.tag == ONCEFLOW_PROCESSOR_TYPES_OUTPUT_ERROR_UNKNOWN_ALIAS) {
        error = onceflow_error_new(
            "unknown output alias \"%.*s\": declare it under [outputs] in onceflow.toml",
            (int)err.val.unknown_alias.len, (const char *)err.val.unknown_alias.ptr);
    } else {
        error = onceflow_error_new("output record too large: the host accepts at most %llu bytes",
                                   (unsigned long long)err.val.too_large);
    }
    onceflow_processor_output_output_error_free(&err);
    return error;
}

void onceflow_log(onceflow_level level, const char *format, ...) {
    va_list args;
    va_start(args, format);
    char *text = vformat(format, args);
    va_end(args);
    processor_string_t message = wit_string(text);
    onceflow_processor_log_write((onceflow_processor_log_level_t)level, &message);
    free(text);
}

static onceflow_bytes from_wit_string(processor_string_t s) {
    return (onceflow_bytes){s.ptr, s.len};
}

static onceflow_optional_bytes from_wit_option(processor_option_list_u8_t o) {
    return (onceflow_optional_bytes){o.is_some, {o.val.ptr, o.is_some ? o.val.len : 0}};
}

// ---------------------------------------------------------------- exports

bool exports_processor_init(processor_list_tuple2_string_string_t *config, processor_string_t *err) {
    bool ok = true;
    if (onceflow_init) {
        onceflow_config_entry *entries = checked_malloc(config->len * sizeof *entries);
        for (size_t i = 0; i < config->len; i++) {
            entries[i].key = from_wit_string(config->ptr[i].f0);
            entries[i].value = from_wit_string(config->ptr[i].f1);
        }
        onceflow_error *error = onceflow_init(config->len, entries);
        free(entries);
        if (error) {
            // The message's memory goes to the bindings (freed after return).
            err->ptr = (uint8_t *)error->message;
            err->len = strlen(error->message);
            free(error);
            ok = false;
        }
    }
    processor_list_tuple2_string_string_free(config);
    return ok;
}

bool exports_processor_process(processor_list_record_t *batch, processor_process_error_t *err) {
    bool ok = true;
    for (size_t index = 0; index < batch->len; index++) {
        onceflow_processor_context_begin_record((uint32_t)index);
        processor_record_t *r = &batch->ptr[index];
        onceflow_header *headers = checked_malloc(r->headers.len * sizeof *headers);
        for (size_t h = 0; h < r->headers.len; h++) {
            headers[h].key = from_wit_string(r->headers.ptr[h].key);
            headers[h].value = (onceflow_bytes){r->headers.ptr[h].value.ptr, r->headers.ptr[h].value.len};
        }
        onceflow_record record = {
            .topic = from_wit_string(r->topic),
            .partition = r->partition,
            .offset = r->offset,
            .timestamp = r->timestamp,
            .key = from_wit_option(r->key),
            .value = from_wit_option(r->value),
            .headers = headers,
            .header_count = r->headers.len,
        };
        onceflow_error *error = onceflow_process(&record);
        free(headers);
        if (error) {
            err->record_index.is_some = true;
            err->record_index.val = (uint32_t)index;
            err->message.ptr = (uint8_t *)error->message;
            err->message.len = strlen(error->message);
            free(error);
            ok = false;
            break;
        }
    }
    processor_list_record_free(batch);
    return ok;
}

bool exports_processor_punctuate(int64_t stream_time, processor_process_error_t *err) {
    // The host does not call it yet.
    return true;
}
