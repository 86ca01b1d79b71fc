// Test guest, in C: the same processor as tests/guests/sessions (Rust).
// Clicks counted per user and session with the SDK's session windows (a
// session ends after 5 s without a click; 10 s of grace), each session
// emitted once when it closes, late clicks reported. Output `sessions`:
// key = user, value = "<start> <end> <count>".
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onceflow.h"

static const char STORE[] = "sessions";
static onceflow_session_windows sessions;

// A count stored as decimal text (0 if it is not one).
static uint64_t count(onceflow_bytes value) {
    size_t i = value.len > 0 && value.ptr[0] == '+' ? 1 : 0;
    if (i == value.len) return 0;
    uint64_t n = 0;
    for (; i < value.len; i++) {
        uint8_t c = value.ptr[i];
        if (c < '0' || c > '9' || n > (UINT64_MAX - (c - '0')) / 10) return 0;
        n = n * 10 + (c - '0');
    }
    return n;
}

// n as decimal text, malloc'd: the SDK frees it.
static onceflow_bytes decimal(uint64_t n) {
    char *text = malloc(24);
    if (!text) abort();
    int len = snprintf(text, 24, "%llu", (unsigned long long)n);
    return (onceflow_bytes){(const uint8_t *)text, (size_t)len};
}

static onceflow_bytes merge(onceflow_bytes a, onceflow_bytes b, void *context) {
    return decimal(count(a) + count(b));
}

static onceflow_bytes add(const onceflow_bytes *old, void *context) {
    return decimal((old ? count(*old) : 0) + 1);
}

onceflow_error *onceflow_init(size_t n, const onceflow_config_entry *config) {
    sessions = onceflow_session_windows_with_gap(5000, 10000);
    // At every advance of stream time: each session is emitted at the
    // record that closes it.
    return onceflow_schedule_punctuation(1);
}

onceflow_error *onceflow_process(const onceflow_record *record) {
    onceflow_bytes user;
    onceflow_error *error = onceflow_record_key_str(record, &user);
    if (error) return error;
    int64_t now;
    bool known = onceflow_stream_time(&now), recorded;
    error = onceflow_session_record(&sessions, STORE, user, record->timestamp, known ? &now : NULL, merge, add, NULL,
                                    NULL, &recorded);
    if (error) return error;
    if (!recorded) {
        // The user may hold NULs: the message is built as bytes.
        char *message = malloc(user.len + 96);
        if (!message) abort();
        size_t len = (size_t)sprintf(message, "click of ");
        memcpy(message + len, user.ptr, user.len);
        len += user.len;
        len += (size_t)sprintf(message + len, " at %lld after its session closed", (long long)record->timestamp);
        onceflow_report_late_bytes((onceflow_bytes){(const uint8_t *)message, len});
        free(message);
    }
    return NULL;
}

static onceflow_error *emit_session(const onceflow_session *s, void *context) {
    char value[80];
    int len = snprintf(value, sizeof value, "%lld %lld %llu", (long long)s->start, (long long)s->end,
                       (unsigned long long)count(s->value));
    onceflow_bytes bytes = {(const uint8_t *)value, (size_t)len};
    return onceflow_emit("sessions", &s->key, &bytes);
}

onceflow_error *onceflow_punctuate(int64_t stream_time) {
    return onceflow_session_take_closed(&sessions, STORE, stream_time, emit_session, NULL, NULL);
}
