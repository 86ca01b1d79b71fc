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
// onceflow_config_entry *config)` to read the manifest's [config] table.
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
const char *onceflow_error_message(const onceflow_error *error);
void onceflow_error_free(onceflow_error *error);

// Defined by the processor.
onceflow_error *onceflow_process(const onceflow_record *record);
// Optionally defined by the processor.
onceflow_error *onceflow_init(size_t n, const onceflow_config_entry *config)
    __attribute__((weak));

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

#ifdef __cplusplus
}
#endif

#endif
