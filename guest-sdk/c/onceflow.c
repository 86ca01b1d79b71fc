// The onceflow C SDK layer: the world's exports over onceflow_process, and
// the imports with the Rust SDK's error messages. See onceflow.h.
#include "onceflow.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct onceflow_error {
    char *message; // malloc'd, NUL-terminated
    size_t len;    // its length: NULs included for onceflow_error_from_bytes
};

// The index of the record onceflow_process is working on; -1 outside it.
static int64_t current_index = -1;

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
    error->len = strlen(error->message);
    return error;
}

onceflow_error *onceflow_error_from_bytes(onceflow_bytes message) {
    onceflow_error *error = checked_malloc(sizeof *error);
    error->message = checked_malloc(message.len + 1);
    if (message.len) memcpy(error->message, message.ptr, message.len);
    error->message[message.len] = 0;
    error->len = message.len;
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

bool onceflow_utf8_valid(onceflow_bytes text) {
    const uint8_t *p = text.ptr, *end = text.ptr + text.len;
    while (p < end) {
        uint8_t c = *p++;
        if (c < 0x80) continue;
        size_t more;
        uint8_t lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) {
            more = 1;
        } else if (c >= 0xe0 && c <= 0xef) {
            more = 2;
            if (c == 0xe0) lo = 0xa0; // no overlong forms
            if (c == 0xed) hi = 0x9f; // no surrogates
        } else if (c >= 0xf0 && c <= 0xf4) {
            more = 3;
            if (c == 0xf0) lo = 0x90;
            if (c == 0xf4) hi = 0x8f; // nothing above U+10FFFF
        } else {
            return false;
        }
        if ((size_t)(end - p) < more || p[0] < lo || p[0] > hi) return false;
        for (size_t i = 1; i < more; i++) {
            if (p[i] < 0x80 || p[i] > 0xbf) return false;
        }
        p += more;
    }
    return true;
}

static onceflow_error *record_text(const onceflow_optional_bytes *data, const char *what, onceflow_bytes *text) {
    if (!data->present) return onceflow_error_new("record has no %s", what);
    if (!onceflow_utf8_valid(data->bytes)) return onceflow_error_new("record %s is not UTF-8 text", what);
    *text = data->bytes;
    return NULL;
}

onceflow_error *onceflow_record_key_str(const onceflow_record *record, onceflow_bytes *text) {
    return record_text(&record->key, "key", text);
}

onceflow_error *onceflow_record_value_str(const onceflow_record *record, onceflow_bytes *text) {
    return record_text(&record->value, "value", text);
}

static processor_string_t wit_string(const char *text) {
    return (processor_string_t){(uint8_t *)text, strlen(text)};
}

static processor_list_u8_t wit_bytes(onceflow_bytes bytes) {
    return (processor_list_u8_t){(uint8_t *)bytes.ptr, bytes.len};
}

static onceflow_error *state_error(onceflow_processor_types_state_error_t *e) {
    onceflow_error *error;
    switch (e->tag) {
    case ONCEFLOW_PROCESSOR_TYPES_STATE_ERROR_UNKNOWN_STORE:
        error = onceflow_error_new(
            "unknown state store \"%.*s\": declare it under stores in onceflow.toml",
            (int)e->val.unknown_store.len, (const char *)e->val.unknown_store.ptr);
        break;
    case ONCEFLOW_PROCESSOR_TYPES_STATE_ERROR_TOO_LARGE:
        error = onceflow_error_new(
            "state key or value too large: the host accepts at most %llu bytes",
            (unsigned long long)e->val.too_large);
        break;
    case ONCEFLOW_PROCESSOR_TYPES_STATE_ERROR_READ_ONLY:
        error = onceflow_error_new(
            "\"%.*s\" is a table: the host writes it from its topic, a processor only reads it",
            (int)e->val.read_only.len, (const char *)e->val.read_only.ptr);
        break;
    case ONCEFLOW_PROCESSOR_TYPES_STATE_ERROR_WRONG_KIND:
        error = onceflow_error_new(
            "\"%.*s\" is of the other kind: use ctx.window_store for a store under window-stores "
            "in onceflow.toml, ctx.store for one under stores",
            (int)e->val.wrong_kind.len, (const char *)e->val.wrong_kind.ptr);
        break;
    default:
        error = onceflow_error_new("state error %d", (int)e->tag);
    }
    onceflow_processor_types_state_error_free(e);
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

// The bindings' cabi_realloc hands out no memory for an empty list (its
// pointer is the alignment): only a non-empty one was malloc'd.
static void free_list(const void *ptr, size_t len) {
    if (len > 0) free((void *)ptr);
}

void onceflow_bytes_free(onceflow_bytes *bytes) {
    free_list(bytes->ptr, bytes->len);
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

// Rust's i64::from_str: an optional sign, then one or more ASCII digits.
static bool parse_i64(onceflow_bytes bytes, int64_t *value) {
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
    if (ok) *value = negative ? (int64_t)(0 - magnitude) : (int64_t)magnitude;
    return ok;
}

onceflow_error *onceflow_get_i64(const char *store, onceflow_bytes key, int64_t *value, bool *found) {
    onceflow_bytes bytes;
    onceflow_error *error = onceflow_get(store, key, &bytes, found);
    if (error || !*found) return error;
    bool ok = parse_i64(bytes, value);
    onceflow_bytes_free(&bytes);
    if (!ok) {
        *found = false;
        char *escaped = onceflow_escape_ascii(key);
        error = onceflow_error_new(
            "state store \"%s\": the value of key \"%s\" is not a decimal integer", store, escaped);
        free(escaped);
        return error;
    }
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

// ---------------------------------------------------------------- time and windows

bool onceflow_stream_time(int64_t *stream_time) {
    int64_t now;
    if (!onceflow_processor_context_stream_time(&now)) return false;
    *stream_time = now;
    return true;
}

onceflow_error *onceflow_schedule_punctuation(uint64_t interval_ms) {
    processor_string_t err;
    if (onceflow_processor_context_schedule_punctuation(interval_ms, &err)) return NULL;
    onceflow_error *error = onceflow_error_new("%.*s", (int)err.len, (const char *)err.ptr);
    processor_string_free(&err);
    return error;
}

void onceflow_report_late_bytes(onceflow_bytes message) {
    if (current_index < 0) return;
    processor_string_t text = {(uint8_t *)message.ptr, message.len};
    onceflow_processor_context_late_record((uint32_t)current_index, &text);
}

void onceflow_report_late(const char *format, ...) {
    if (current_index < 0) return;
    va_list args;
    va_start(args, format);
    char *text = vformat(format, args);
    va_end(args);
    onceflow_report_late_bytes(onceflow_str(text));
    free(text);
}

onceflow_error *onceflow_window_get(const char *store, onceflow_bytes key, int64_t start,
                                    onceflow_bytes *value, bool *found) {
    processor_string_t wit_store = wit_string(store);
    processor_list_u8_t wit_key = wit_bytes(key);
    processor_option_list_u8_t ret;
    onceflow_processor_windows_state_error_t err;
    if (!onceflow_processor_windows_get(&wit_store, &wit_key, start, &ret, &err)) return state_error(&err);
    *found = ret.is_some;
    *value = ret.is_some ? (onceflow_bytes){ret.val.ptr, ret.val.len} : (onceflow_bytes){NULL, 0};
    return NULL;
}

onceflow_error *onceflow_window_get_i64(const char *store, onceflow_bytes key, int64_t start,
                                        int64_t *value, bool *found) {
    onceflow_bytes bytes;
    onceflow_error *error = onceflow_window_get(store, key, start, &bytes, found);
    if (error || !*found) return error;
    bool ok = parse_i64(bytes, value);
    onceflow_bytes_free(&bytes);
    if (!ok) {
        *found = false;
        char *escaped = onceflow_escape_ascii(key);
        error = onceflow_error_new("window store \"%s\": the window of key \"%s\" at %lld is not an integer",
                                   store, escaped, (long long)start);
        free(escaped);
        return error;
    }
    return NULL;
}

onceflow_error *onceflow_window_put(const char *store, onceflow_bytes key, int64_t start, onceflow_bytes value) {
    processor_string_t wit_store = wit_string(store);
    processor_list_u8_t wit_key = wit_bytes(key), wit_value = wit_bytes(value);
    onceflow_processor_windows_state_error_t err;
    if (!onceflow_processor_windows_put(&wit_store, &wit_key, start, &wit_value, &err)) return state_error(&err);
    return NULL;
}

onceflow_error *onceflow_window_put_i64(const char *store, onceflow_bytes key, int64_t start, int64_t value) {
    char text[24];
    int len = snprintf(text, sizeof text, "%lld", (long long)value);
    return onceflow_window_put(store, key, start, (onceflow_bytes){(const uint8_t *)text, (size_t)len});
}

onceflow_error *onceflow_window_delete(const char *store, onceflow_bytes key, int64_t start) {
    processor_string_t wit_store = wit_string(store);
    processor_list_u8_t wit_key = wit_bytes(key);
    onceflow_processor_windows_state_error_t err;
    if (!onceflow_processor_windows_delete(&wit_store, &wit_key, start, &err)) return state_error(&err);
    return NULL;
}

static onceflow_window window_of(const onceflow_processor_types_window_entry_t *e) {
    return (onceflow_window){{e->key.ptr, e->key.len}, e->start, {e->value.ptr, e->value.len}};
}

onceflow_error *onceflow_window_fetch(const char *store, onceflow_bytes key, int64_t earliest, int64_t latest,
                                      onceflow_windows *windows) {
    processor_string_t wit_store = wit_string(store);
    processor_list_u8_t wit_key = wit_bytes(key);
    onceflow_processor_windows_list_window_entry_t ret;
    onceflow_processor_windows_state_error_t err;
    *windows = (onceflow_windows){NULL, 0};
    if (!onceflow_processor_windows_fetch(&wit_store, &wit_key, earliest, latest, &ret, &err)) {
        return state_error(&err);
    }
    // The bindings allocated the keys and values with malloc: hand them over.
    windows->ptr = checked_malloc(ret.len * sizeof *windows->ptr);
    windows->len = ret.len;
    for (size_t i = 0; i < ret.len; i++) windows->ptr[i] = window_of(&ret.ptr[i]);
    free_list(ret.ptr, ret.len);
    return NULL;
}

void onceflow_windows_free(onceflow_windows *windows) {
    for (size_t i = 0; i < windows->len; i++) {
        free_list(windows->ptr[i].key.ptr, windows->ptr[i].key.len);
        free_list(windows->ptr[i].value.ptr, windows->ptr[i].value.len);
    }
    free(windows->ptr);
    windows->ptr = NULL;
    windows->len = 0;
}

// One page of windows of every key in [earliest, latest], after `after`
// (NULL: from the first); the page is the caller's.
static onceflow_error *fetch_page(const char *store, int64_t earliest, int64_t latest,
                                  const onceflow_processor_types_window_entry_t *after,
                                  onceflow_processor_windows_list_window_entry_t *page) {
    processor_string_t wit_store = wit_string(store);
    onceflow_processor_windows_window_key_t after_key;
    if (after) after_key = (onceflow_processor_windows_window_key_t){after->key, after->start};
    onceflow_processor_windows_state_error_t err;
    if (!onceflow_processor_windows_fetch_all(&wit_store, earliest, latest, after ? &after_key : NULL,
                                              ONCEFLOW_WINDOW_PAGE, page, &err)) {
        *page = (onceflow_processor_windows_list_window_entry_t){NULL, 0};
        return state_error(&err);
    }
    return NULL;
}

onceflow_error *onceflow_window_fetch_all(const char *store, int64_t earliest, int64_t latest,
                                          onceflow_window_visitor visit, void *context) {
    onceflow_processor_windows_list_window_entry_t previous = {NULL, 0}, page;
    bool first = true;
    for (;;) {
        onceflow_error *error =
            fetch_page(store, earliest, latest, first ? NULL : &previous.ptr[previous.len - 1], &page);
        onceflow_processor_windows_list_window_entry_free(&previous);
        first = false;
        if (error) return error;
        for (size_t i = 0; i < page.len; i++) {
            onceflow_window window = window_of(&page.ptr[i]);
            if ((error = visit(&window, context))) {
                onceflow_processor_windows_list_window_entry_free(&page);
                return error;
            }
        }
        if (page.len < ONCEFLOW_WINDOW_PAGE) {
            onceflow_processor_windows_list_window_entry_free(&page);
            return NULL;
        }
        previous = page;
    }
}

static uint64_t duration_ms(uint64_t ms) { return ms > (uint64_t)INT64_MAX ? (uint64_t)INT64_MAX : ms; }

static int64_t window_length(uint64_t ms) { return ms == 0 ? 1 : (int64_t)duration_ms(ms); }

onceflow_time_windows onceflow_tumbling(uint64_t size_ms, uint64_t grace_ms) {
    int64_t size = window_length(size_ms);
    return (onceflow_time_windows){size, size, (int64_t)duration_ms(grace_ms)};
}

onceflow_time_windows onceflow_hopping(uint64_t size_ms, uint64_t advance_ms, uint64_t grace_ms) {
    int64_t size = window_length(size_ms), advance = window_length(advance_ms);
    return (onceflow_time_windows){size, advance < size ? advance : size, (int64_t)duration_ms(grace_ms)};
}

static int64_t saturating_add(int64_t a, int64_t b) {
    int64_t sum;
    if (!__builtin_add_overflow(a, b, &sum)) return sum;
    return b > 0 ? INT64_MAX : INT64_MIN;
}

static int64_t saturating_sub(int64_t a, int64_t b) {
    int64_t difference;
    if (!__builtin_sub_overflow(a, b, &difference)) return difference;
    return b < 0 ? INT64_MAX : INT64_MIN;
}

// Two's complement wrapping, as the Rust SDK's i64 arithmetic.
static int64_t wrapping(uint64_t bits) { return (int64_t)bits; }

int64_t onceflow_window_end(const onceflow_time_windows *w, int64_t start) {
    return saturating_add(start, w->size_ms);
}

size_t onceflow_windows_for(const onceflow_time_windows *w, int64_t timestamp, int64_t *starts, size_t capacity) {
    int64_t first = wrapping((uint64_t)timestamp - (uint64_t)w->size_ms + (uint64_t)w->advance_ms);
    if (first < 0) first = 0;
    first -= first % w->advance_ms;
    size_t n = 0;
    for (int64_t start = first; start <= timestamp; start += w->advance_ms) {
        if (n < capacity) starts[n] = start;
        n++;
        if (start > INT64_MAX - w->advance_ms) break;
    }
    return n;
}

bool onceflow_window_is_closed(const onceflow_time_windows *w, int64_t start, int64_t stream_time) {
    return saturating_add(onceflow_window_end(w, start), w->grace_ms) <= stream_time;
}

size_t onceflow_open_windows(const onceflow_time_windows *w, int64_t timestamp, const int64_t *stream_time,
                             int64_t *starts, size_t capacity) {
    int64_t first = wrapping((uint64_t)timestamp - (uint64_t)w->size_ms + (uint64_t)w->advance_ms);
    if (first < 0) first = 0;
    first -= first % w->advance_ms;
    size_t n = 0;
    for (int64_t start = first; start <= timestamp; start += w->advance_ms) {
        if (!stream_time || !onceflow_window_is_closed(w, start, *stream_time)) {
            if (n < capacity) starts[n] = start;
            n++;
        }
        if (start > INT64_MAX - w->advance_ms) break;
    }
    return n;
}

uint64_t onceflow_punctuation_interval(const onceflow_time_windows *w) {
    int64_t offset = wrapping((uint64_t)w->size_ms + (uint64_t)w->grace_ms) % w->advance_ms;
    if (offset < 0) offset += w->advance_ms;
    int64_t a = w->advance_ms, b = offset;
    while (b != 0) {
        int64_t r = a % b;
        a = b;
        b = r;
    }
    return a > 1 ? (uint64_t)a : 1;
}

onceflow_error *onceflow_take_closed(const onceflow_time_windows *w, const char *store, int64_t stream_time,
                                     onceflow_window_visitor each, void *context, uint64_t *count) {
    int64_t latest = saturating_sub(saturating_sub(stream_time, w->grace_ms), w->size_ms);
    // Every closed window first, then each one emitted and deleted.
    onceflow_processor_windows_list_window_entry_t *pages = NULL;
    size_t n_pages = 0;
    onceflow_error *error = NULL;
    for (;;) {
        const onceflow_processor_types_window_entry_t *after = NULL;
        if (n_pages > 0) after = &pages[n_pages - 1].ptr[pages[n_pages - 1].len - 1];
        onceflow_processor_windows_list_window_entry_t page;
        if ((error = fetch_page(store, INT64_MIN, latest, after, &page))) break;
        pages = realloc(pages, (n_pages + 1) * sizeof *pages);
        if (!pages) abort();
        pages[n_pages++] = page;
        if (page.len < ONCEFLOW_WINDOW_PAGE) break;
    }
    uint64_t taken = 0;
    for (size_t p = 0; !error && p < n_pages; p++) {
        for (size_t i = 0; !error && i < pages[p].len; i++) {
            onceflow_window window = window_of(&pages[p].ptr[i]);
            if (!(error = each(&window, context))) error = onceflow_window_delete(store, window.key, window.start);
            taken++;
        }
    }
    for (size_t p = 0; p < n_pages; p++) onceflow_processor_windows_list_window_entry_free(&pages[p]);
    free(pages);
    if (count) *count = error ? 0 : taken;
    return error;
}

onceflow_session_windows onceflow_session_windows_with_gap(uint64_t gap_ms, uint64_t grace_ms) {
    return (onceflow_session_windows){(int64_t)duration_ms(gap_ms), (int64_t)duration_ms(grace_ms)};
}

bool onceflow_session_is_late(const onceflow_session_windows *w, int64_t end, int64_t stream_time) {
    return saturating_add(saturating_add(end, w->gap_ms), w->grace_ms) < stream_time;
}

bool onceflow_session_is_closed(const onceflow_session_windows *w, int64_t end, int64_t stream_time) {
    int64_t reach = saturating_add(saturating_add(end, w->gap_ms), w->gap_ms);
    return saturating_add(reach, w->grace_ms) < stream_time;
}

// A window of a session store as a session (its key and value point into
// the window): false when the value is shorter than the 8 bytes of the end.
static bool decode_session(const onceflow_window *window, onceflow_session *session) {
    if (window->value.len < 8) return false;
    uint64_t end = 0;
    for (int i = 0; i < 8; i++) end = end << 8 | window->value.ptr[i];
    *session = (onceflow_session){window->key, window->start, (int64_t)end,
                                  {window->value.ptr + 8, window->value.len - 8}};
    return true;
}

onceflow_error *onceflow_session_record(const onceflow_session_windows *w, const char *store,
                                        onceflow_bytes key, int64_t timestamp, const int64_t *stream_time,
                                        onceflow_session_merge merge, onceflow_session_add add, void *context,
                                        onceflow_session *session, bool *recorded) {
    *recorded = false;
    onceflow_windows windows;
    onceflow_error *error =
        onceflow_window_fetch(store, key, INT64_MIN, saturating_add(timestamp, w->gap_ms), &windows);
    if (error) return error;
    // The sessions the record touches, in start order, in place.
    size_t n = 0;
    int64_t start = timestamp, end = timestamp;
    onceflow_session *touching = checked_malloc(windows.len * sizeof *touching);
    for (size_t i = 0; i < windows.len; i++) {
        onceflow_session s;
        if (!decode_session(&windows.ptr[i], &s) || saturating_add(s.end, w->gap_ms) < timestamp) continue;
        touching[n++] = s;
        if (s.start < start) start = s.start;
        if (s.end > end) end = s.end;
    }
    if (!stream_time || !onceflow_session_is_late(w, end, *stream_time)) {
        onceflow_bytes folded = {NULL, 0};
        bool owned = false; // folded was malloc'd by merge
        for (size_t i = 0; !error && i < n; i++) {
            if (i == 0) {
                folded = touching[i].value;
            } else {
                onceflow_bytes merged = merge(folded, touching[i].value, context);
                if (owned) free((void *)folded.ptr);
                folded = merged;
                owned = true;
            }
            error = onceflow_window_delete(store, key, touching[i].start);
        }
        if (!error) {
            onceflow_bytes value = add(n > 0 ? &folded : NULL, context);
            uint8_t *stored = checked_malloc(8 + value.len);
            for (int i = 0; i < 8; i++) stored[i] = (uint8_t)((uint64_t)end >> (56 - 8 * i));
            if (value.len) memcpy(stored + 8, value.ptr, value.len);
            error = onceflow_window_put(store, key, start, (onceflow_bytes){stored, 8 + value.len});
            free(stored);
            if (!error) *recorded = true;
            if (!error && session) {
                *session = (onceflow_session){key, start, end, value};
            } else {
                free((void *)value.ptr);
            }
        }
        if (owned) free((void *)folded.ptr);
    }
    free(touching);
    onceflow_windows_free(&windows);
    return error;
}

void onceflow_session_free(onceflow_session *session) {
    free((void *)session->value.ptr);
    session->value = (onceflow_bytes){NULL, 0};
}

// The closed sessions onceflow_session_take_closed collects: copies.
typedef struct {
    const onceflow_session_windows *windows;
    int64_t stream_time;
    onceflow_session *ptr;
    size_t len, cap;
} closed_sessions;

static onceflow_bytes copy_bytes(onceflow_bytes bytes) {
    uint8_t *copy = checked_malloc(bytes.len);
    if (bytes.len) memcpy(copy, bytes.ptr, bytes.len);
    return (onceflow_bytes){copy, bytes.len};
}

static onceflow_error *collect_closed(const onceflow_window *window, void *context) {
    closed_sessions *closed = context;
    onceflow_session s;
    if (!decode_session(window, &s) || !onceflow_session_is_closed(closed->windows, s.end, closed->stream_time)) {
        return NULL;
    }
    if (closed->len == closed->cap) {
        closed->cap = closed->cap * 2 + 16;
        closed->ptr = realloc(closed->ptr, closed->cap * sizeof *closed->ptr);
        if (!closed->ptr) abort();
    }
    closed->ptr[closed->len++] = (onceflow_session){copy_bytes(s.key), s.start, s.end, copy_bytes(s.value)};
    return NULL;
}

onceflow_error *onceflow_session_take_closed(const onceflow_session_windows *w, const char *store,
                                             int64_t stream_time, onceflow_session_visitor each, void *context,
                                             uint64_t *count) {
    int64_t latest = saturating_sub(saturating_sub(saturating_sub(stream_time, w->grace_ms), w->gap_ms), w->gap_ms);
    closed_sessions closed = {w, stream_time, NULL, 0, 0};
    onceflow_error *error = onceflow_window_fetch_all(store, INT64_MIN, latest, collect_closed, &closed);
    for (size_t i = 0; !error && i < closed.len; i++) {
        if (!(error = each(&closed.ptr[i], context))) {
            error = onceflow_window_delete(store, closed.ptr[i].key, closed.ptr[i].start);
        }
    }
    for (size_t i = 0; i < closed.len; i++) {
        free((void *)closed.ptr[i].key.ptr);
        free((void *)closed.ptr[i].value.ptr);
    }
    free(closed.ptr);
    if (count) *count = error ? 0 : closed.len;
    return error;
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
            err->len = error->len;
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
        current_index = (int64_t)index;
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
        current_index = -1;
        free(headers);
        if (error) {
            err->record_index.is_some = true;
            err->record_index.val = (uint32_t)index;
            err->message.ptr = (uint8_t *)error->message;
            err->message.len = error->len;
            free(error);
            ok = false;
            break;
        }
    }
    processor_list_record_free(batch);
    return ok;
}

bool exports_processor_punctuate(int64_t stream_time, processor_process_error_t *err) {
    if (!onceflow_punctuate) return true;
    current_index = -1;
    onceflow_error *error = onceflow_punctuate(stream_time);
    if (!error) return true;
    err->record_index.is_some = false;
    // The message's memory goes to the bindings (freed after return).
    err->message.ptr = (uint8_t *)error->message;
    err->message.len = error->len;
    free(error);
    return false;
}
