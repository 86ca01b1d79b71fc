// Page views, in C: the same processor as examples/pageviews (Rust), with
// byte-identical outputs and dead letters. It counts views per page in
// tumbling one-minute windows with a ten-second grace and emits each
// window's count once, when stream time passes its end plus the grace
// (Kafka Streams' suppress(untilWindowCloses)).
//
// Input: key = the page, the record's timestamp = when it was viewed; the
// value is not read. Output `counts`: key = the page, value =
// {"page":"/home","start":1700000040000,"end":1700000100000,"count":3}. A
// view whose window had closed is reported late; the manifest dead-letters
// it.
//
// Built by `onceflow build` (clang + wasi-libc, bindings from `wit-bindgen
// c`) with the onceflow C SDK layer (onceflow.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onceflow.h"

static const char STORE[] = "views";
static onceflow_time_windows windows;

// Appends `text` as a JSON string: quotes, backslashes and control
// characters escaped, nothing else. `out` has room for 6 * len + 2 bytes.
static size_t json_string(char *out, onceflow_bytes text) {
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    out[n++] = '"';
    for (size_t i = 0; i < text.len; i++) {
        uint8_t c = text.ptr[i];
        if (c == '"' || c == '\\') {
            out[n++] = '\\';
            out[n++] = (char)c;
        } else if (c < 0x20) {
            memcpy(out + n, "\\u00", 4);
            n += 4;
            out[n++] = hex[c >> 4];
            out[n++] = hex[c & 0xf];
        } else {
            out[n++] = (char)c;
        }
    }
    out[n++] = '"';
    return n;
}

onceflow_error *onceflow_init(size_t n, const onceflow_config_entry *config) {
    windows = onceflow_tumbling(60 * 1000, 10 * 1000);
    // Every 10 s of stream time: each point where a window closes.
    return onceflow_schedule_punctuation(onceflow_punctuation_interval(&windows));
}

onceflow_error *onceflow_process(const onceflow_record *record) {
    onceflow_bytes page;
    onceflow_error *error = onceflow_record_key_str(record, &page);
    if (error) return error;

    int64_t now;
    bool known = onceflow_stream_time(&now);
    int64_t starts[1]; // tumbling: one window per view
    size_t n = onceflow_open_windows(&windows, record->timestamp, known ? &now : NULL, starts, 1);
    if (n == 0) {
        // The page may hold NULs: the message is built as bytes.
        char *message = malloc(page.len + 128);
        if (!message) abort();
        size_t len = (size_t)sprintf(message, "view of ");
        memcpy(message + len, page.ptr, page.len);
        len += page.len;
        len += (size_t)sprintf(message + len, " at %lld arrived after its window closed (stream time %lld)",
                               (long long)record->timestamp, (long long)(known ? now : record->timestamp));
        onceflow_report_late_bytes((onceflow_bytes){(const uint8_t *)message, len});
        free(message);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        int64_t count = 0;
        bool found;
        if ((error = onceflow_window_get_i64(STORE, page, starts[i], &count, &found))) return error;
        if ((error = onceflow_window_put_i64(STORE, page, starts[i], count + 1))) return error;
    }
    return NULL;
}

static onceflow_error *emit_count(const onceflow_window *window, void *context) {
    if (!onceflow_utf8_valid(window->key)) return onceflow_error_new("a stored page is not UTF-8");
    if (!onceflow_utf8_valid(window->value)) return onceflow_error_new("a stored count is not UTF-8");
    char *value = malloc(6 * window->key.len + window->value.len + 128);
    if (!value) abort();
    size_t len = (size_t)sprintf(value, "{\"page\":");
    len += json_string(value + len, window->key);
    len += (size_t)sprintf(value + len, ",\"start\":%lld,\"end\":%lld,\"count\":", (long long)window->start,
                           (long long)onceflow_window_end(&windows, window->start));
    memcpy(value + len, window->value.ptr, window->value.len);
    len += window->value.len;
    value[len++] = '}';
    onceflow_bytes bytes = {(const uint8_t *)value, len};
    onceflow_error *error = onceflow_emit("counts", &window->key, &bytes);
    free(value);
    return error;
}

onceflow_error *onceflow_punctuate(int64_t stream_time) {
    return onceflow_take_closed(&windows, STORE, stream_time, emit_count, NULL, NULL);
}
