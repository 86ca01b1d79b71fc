// onceflow.h: the thin C SDK layer over the bindings `wit-bindgen c`
// generates from wit/processor.wit (processor.h). `onceflow build` writes it
// next to the bindings and compiles it with the processor's sources.
//
// A processor defines one function:
//
//     #include "onceflow.h"
//
//     onceflow_error *onceflow_process(const onceflow_record *record) {
//         int64_t count = 0;
//         bool found;
//         onceflow_error *error = onceflow_get_i64("counts", record->key, &count, &found);
//         if (error) return error;
//         ...
//         return onceflow_emit("counts", &record->key, &value);
//     }
//
// and may define `onceflow_error *onceflow_init(size_t n, const
// onceflow_config_entry *config)` to read the manifest's [config] table, and
// `onceflow_error *onceflow_punctuate(int64_t stream_time)` to act as stream
// time passes (see "Time and windows" below).
//
// The batch loop is the Rust SDK's: `begin-record` before each record, and
// an error returned for a record comes back to the host as a
// `process-error` naming it, so the deployment's error policy (fail, skip,
// dead-letter) applies to that record alone. State and output failures are
// errors with the Rust SDK's messages. Memory: the record is valid during
// the call; bytes returned by onceflow_get are the caller's to free with
// onceflow_bytes_free.
#ifndef ONCEFLOW_H
#define ONCEFLOW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "processor.h"

#ifdef __cplusplus
extern "C" {
#endif

// A byte string (not NUL-terminated).
typedef struct {
    const uint8_t *ptr;
    size_t len;
} onceflow_bytes;

// Bytes of a NUL-terminated C string.
onceflow_bytes onceflow_str(const char *text);

// An optional byte string: a null key, a tombstone.
typedef struct {
    bool present;
    onceflow_bytes bytes;
} onceflow_optional_bytes;

typedef struct {
    onceflow_bytes key; // UTF-8
    onceflow_bytes value;
} onceflow_header;

// One input record.
typedef struct {
    onceflow_bytes topic;
    int32_t partition;
    int64_t offset;
    int64_t timestamp;
    onceflow_optional_bytes key;
    onceflow_optional_bytes value;
    const onceflow_header *headers;
    size_t header_count;
} onceflow_record;

typedef struct {
    onceflow_bytes key;
    onceflow_bytes value;
} onceflow_config_entry;

// A failure: a record the processor rejects (the message goes to the
// dead-letter topic and the logs). NULL means success.
typedef struct onceflow_error onceflow_error;

// A new error with a printf-style message.
onceflow_error *onceflow_error_new(const char *format, ...)
    __attribute__((format(printf, 1, 2)));
// A new error whose message is `message`, which may hold NULs (a key in
// it, say): the host gets every byte; onceflow_error_message's C string
// stops at the first NUL.
onceflow_error *onceflow_error_from_bytes(onceflow_bytes message);
const char *onceflow_error_message(const onceflow_error *error);
void onceflow_error_free(onceflow_error *error);

// Defined by the processor.
onceflow_error *onceflow_process(const onceflow_record *record);
// Optionally defined by the processor.
onceflow_error *onceflow_init(size_t n, const onceflow_config_entry *config)
    __attribute__((weak));

// Whether `text` is UTF-8 as Rust's str::from_utf8 accepts it (no overlong
// forms, no surrogates, nothing above U+10FFFF).
bool onceflow_utf8_valid(onceflow_bytes text);
// The record's key (value) as UTF-8 text in `*text`, or an error with the
// Rust SDK's message when it is null (a tombstone) or not UTF-8.
onceflow_error *onceflow_record_key_str(const onceflow_record *record, onceflow_bytes *text);
onceflow_error *onceflow_record_value_str(const onceflow_record *record, onceflow_bytes *text);

// State. `*value` receives a copy that the caller frees with
// onceflow_bytes_free; `*found` says whether the key is present.
onceflow_error *onceflow_get(const char *store, onceflow_bytes key, onceflow_bytes *value, bool *found);
// The value as an integer in decimal text (as onceflow_put_i64 writes it).
onceflow_error *onceflow_get_i64(const char *store, onceflow_bytes key, int64_t *value, bool *found);
onceflow_error *onceflow_put(const char *store, onceflow_bytes key, onceflow_bytes value);
onceflow_error *onceflow_put_i64(const char *store, onceflow_bytes key, int64_t value);
onceflow_error *onceflow_delete(const char *store, onceflow_bytes key);
void onceflow_bytes_free(onceflow_bytes *bytes);

// Output: key or value NULL for a null key or a tombstone.
onceflow_error *onceflow_emit(const char *alias, const onceflow_bytes *key, const onceflow_bytes *value);

typedef enum {
    ONCEFLOW_TRACE = ONCEFLOW_PROCESSOR_LOG_LEVEL_TRACE,
    ONCEFLOW_DEBUG = ONCEFLOW_PROCESSOR_LOG_LEVEL_DEBUG,
    ONCEFLOW_INFO = ONCEFLOW_PROCESSOR_LOG_LEVEL_INFO,
    ONCEFLOW_WARN = ONCEFLOW_PROCESSOR_LOG_LEVEL_WARN,
    ONCEFLOW_ERROR = ONCEFLOW_PROCESSOR_LOG_LEVEL_ERROR,
} onceflow_level;

void onceflow_log(onceflow_level level, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

// Rust's `<[u8]>::escape_ascii` into a new NUL-terminated string (free it).
char *onceflow_escape_ascii(onceflow_bytes bytes);

// ------------------------------------------------------------ time and windows
//
// Time is stream time, as in the Rust SDK: the largest record timestamp
// the task has seen. Window stores keep a value per key and window start;
// onceflow_tumbling / onceflow_hopping assign records to windows, and
// onceflow_session_windows_with_gap to sessions (onceflow_session_record,
// onceflow_session_take_closed);
// onceflow_schedule_punctuation (from onceflow_init) makes the host call
// onceflow_punctuate as stream time passes, where onceflow_take_closed
// emits the closed windows:
//
//     static onceflow_time_windows windows;
//
//     onceflow_error *onceflow_init(size_t n, const onceflow_config_entry *config) {
//         windows = onceflow_tumbling(60000, 10000);
//         return onceflow_schedule_punctuation(onceflow_punctuation_interval(&windows));
//     }
//
//     static onceflow_error *emit(const onceflow_window *w, void *context) {
//         return onceflow_emit("counts", &w->key, &w->value);
//     }
//
//     onceflow_error *onceflow_punctuate(int64_t stream_time) {
//         return onceflow_take_closed(&windows, "views", stream_time, emit, NULL, NULL);
//     }

// Optionally defined by the processor: called when the task's stream time
// reaches a point scheduled with onceflow_schedule_punctuation, right after
// the record that carried it there and in the same transaction. An error
// stops the deployment (no record is to blame). Without it, punctuate does
// nothing.
onceflow_error *onceflow_punctuate(int64_t stream_time) __attribute__((weak));

// The task's stream time, ms: the largest record timestamp it has seen,
// counting the current record (in onceflow_punctuate, the time it was
// called for). False (and *stream_time untouched) before the task's first
// record.
bool onceflow_stream_time(int64_t *stream_time);

// Asks the host to call onceflow_punctuate whenever the task's stream time
// reaches a multiple of `interval_ms` (and once at the task's first
// record). Only onceflow_init may call it (an error anywhere else); 0
// cancels.
onceflow_error *onceflow_schedule_punctuation(uint64_t interval_ms);

// Reports the current record as late (its window had closed): leave no
// other mark for it and return NULL from onceflow_process; the host counts
// and drops it or hands it to the error policy with the message, as the
// manifest's [time] late-records says. Outside onceflow_process it does
// nothing. The _bytes form takes a message that may hold NULs.
void onceflow_report_late(const char *format, ...) __attribute__((format(printf, 1, 2)));
void onceflow_report_late_bytes(onceflow_bytes message);

// A window of a window store: its key, its start (ms since the Unix epoch)
// and its value.
typedef struct {
    onceflow_bytes key;
    int64_t start;
    onceflow_bytes value;
} onceflow_window;

// Windows the caller owns: free them with onceflow_windows_free.
typedef struct {
    onceflow_window *ptr;
    size_t len;
} onceflow_windows;

void onceflow_windows_free(onceflow_windows *windows);

// Called for each window of a scan, with the `context` given to the scan;
// the window is valid during the call. A non-NULL error stops the scan.
typedef onceflow_error *(*onceflow_window_visitor)(const onceflow_window *window, void *context);

// How many windows onceflow_window_fetch_all asks the host for at a time.
#define ONCEFLOW_WINDOW_PAGE 256

// Window stores, declared under [window-stores.NAME] in the manifest. A
// window whose start is at or before `stream time - retention` has expired:
// reads no longer see it and writes to it are ignored. `*value` receives a
// copy that the caller frees with onceflow_bytes_free.
onceflow_error *onceflow_window_get(const char *store, onceflow_bytes key, int64_t start,
                                    onceflow_bytes *value, bool *found);
// The value as an integer in decimal text (as onceflow_window_put_i64 writes it).
onceflow_error *onceflow_window_get_i64(const char *store, onceflow_bytes key, int64_t start,
                                        int64_t *value, bool *found);
onceflow_error *onceflow_window_put(const char *store, onceflow_bytes key, int64_t start, onceflow_bytes value);
onceflow_error *onceflow_window_put_i64(const char *store, onceflow_bytes key, int64_t start, int64_t value);
onceflow_error *onceflow_window_delete(const char *store, onceflow_bytes key, int64_t start);
// The windows of `key` whose start is in [earliest, latest], by start.
onceflow_error *onceflow_window_fetch(const char *store, onceflow_bytes key, int64_t earliest, int64_t latest,
                                      onceflow_windows *windows);
// Calls `visit` on every window of every key whose start is in [earliest,
// latest], in (key, start) order, fetching ONCEFLOW_WINDOW_PAGE at a time.
onceflow_error *onceflow_window_fetch_all(const char *store, int64_t earliest, int64_t latest,
                                          onceflow_window_visitor visit, void *context);

// Fixed-size windows aligned to the epoch, as Kafka Streams' TimeWindows:
// tumbling (advance = size) or hopping (advance < size), with a grace
// period. A window [start, start + size) is open until stream time reaches
// start + size + grace; a record all of whose windows have closed is late.
// Make one with onceflow_tumbling or onceflow_hopping.
typedef struct {
    int64_t size_ms;
    int64_t advance_ms;
    int64_t grace_ms;
} onceflow_time_windows;

// Windows of `size_ms` one after the other (0 counts as 1 ms).
onceflow_time_windows onceflow_tumbling(uint64_t size_ms, uint64_t grace_ms);
// Windows of `size_ms` starting every `advance_ms` (at most `size_ms`).
onceflow_time_windows onceflow_hopping(uint64_t size_ms, uint64_t advance_ms, uint64_t grace_ms);
// The end (exclusive) of the window starting at `start`.
int64_t onceflow_window_end(const onceflow_time_windows *windows, int64_t start);
// Writes the starts of the windows that contain `timestamp`, ascending
// (Kafka Streams' windowsFor: no window starts before the epoch), into
// `starts` (at most `capacity` of them) and returns how many there are
// (which may be more than `capacity`: at most size / advance + 1).
size_t onceflow_windows_for(const onceflow_time_windows *windows, int64_t timestamp, int64_t *starts,
                            size_t capacity);
// Whether the window starting at `start` has closed at `stream_time`.
bool onceflow_window_is_closed(const onceflow_time_windows *windows, int64_t start, int64_t stream_time);
// As onceflow_windows_for, only the windows still open at *stream_time
// (all of them when it is NULL, before the first record): 0 means the
// record is late.
size_t onceflow_open_windows(const onceflow_time_windows *windows, int64_t timestamp, const int64_t *stream_time,
                             int64_t *starts, size_t capacity);
// The stream-time punctuation interval, ms, that falls on every point where
// one of these windows closes (end + grace of each), so that
// onceflow_take_closed in onceflow_punctuate emits each window at the record
// that closes it.
uint64_t onceflow_punctuation_interval(const onceflow_time_windows *windows);
// Calls `each` on every window of `store` closed at `stream_time`, then
// deletes it (emit final); `*count` (if not NULL) receives how many there
// were.
onceflow_error *onceflow_take_closed(const onceflow_time_windows *windows, const char *store, int64_t stream_time,
                                     onceflow_window_visitor each, void *context, uint64_t *count);

// Session windows, as Kafka Streams' SessionWindows and the Rust SDK's
// SessionWindows: a key's records closer than `gap` to each other form one
// session [start, end] (the first and last record's times), and a record
// bridging two sessions merges them. A record is late when its merged
// session ends before stream_time - gap - grace (Kafka Streams' rule); a
// session is closed, and emitted, once stream time passes end + 2 * gap +
// grace, when no record the rule accepts can touch it any more
// (docs/time.md). Sessions live in a window store under their start; the
// value is the session's end (8 bytes, big-endian) followed by the
// aggregate, as in every SDK. Make one with onceflow_session_windows_with_gap.
typedef struct {
    int64_t gap_ms;
    int64_t grace_ms;
} onceflow_session_windows;

// A session: its key, the first and last record's times (ms), the
// aggregate.
typedef struct {
    onceflow_bytes key;
    int64_t start;
    int64_t end;
    onceflow_bytes value;
} onceflow_session;

// The new aggregate of two merged sessions (`a` the older), and the
// aggregate with a record added (`aggregate` NULL: a new session). Return
// bytes allocated with malloc (NULL if empty): the SDK frees them.
typedef onceflow_bytes (*onceflow_session_merge)(onceflow_bytes a, onceflow_bytes b, void *context);
typedef onceflow_bytes (*onceflow_session_add)(const onceflow_bytes *aggregate, void *context);
// Called for each closed session with the `context` given; the session is
// valid during the call. A non-NULL error stops the scan.
typedef onceflow_error *(*onceflow_session_visitor)(const onceflow_session *session, void *context);

// Sessions split by `gap_ms` of inactivity, with `grace_ms` for records out
// of order.
onceflow_session_windows onceflow_session_windows_with_gap(uint64_t gap_ms, uint64_t grace_ms);
// Whether a record is late at `stream_time` when its session (merged with
// the sessions it touches) ends at `end`: end < stream_time - gap - grace.
bool onceflow_session_is_late(const onceflow_session_windows *windows, int64_t end, int64_t stream_time);
// Whether a session ending at `end` is closed at `stream_time`: no record
// onceflow_session_is_late accepts can touch it any more, stream_time >
// end + 2 * gap + grace.
bool onceflow_session_is_closed(const onceflow_session_windows *windows, int64_t end, int64_t stream_time);
// Adds a record of `key` at `timestamp` to `store`: merges the sessions it
// touches into one (their aggregates folded with `merge`, oldest first)
// and adds the record with `add`. `*recorded` is false when the record is
// late (report it with onceflow_report_late) at *stream_time (NULL
// before the first record: nothing is late). If `session` is not NULL it
// receives the session (its key is `key`; free its value with
// onceflow_session_free).
onceflow_error *onceflow_session_record(const onceflow_session_windows *windows, const char *store,
                                        onceflow_bytes key, int64_t timestamp, const int64_t *stream_time,
                                        onceflow_session_merge merge, onceflow_session_add add, void *context,
                                        onceflow_session *session, bool *recorded);
// Frees a session's value from onceflow_session_record.
void onceflow_session_free(onceflow_session *session);
// Calls `each` on every session of `store` closed at `stream_time`, then
// deletes it (emit final); `*count` (if not NULL) receives how many there
// were.
onceflow_error *onceflow_session_take_closed(const onceflow_session_windows *windows, const char *store,
                                             int64_t stream_time, onceflow_session_visitor each, void *context,
                                             uint64_t *count);

#ifdef __cplusplus
}
#endif

#endif
