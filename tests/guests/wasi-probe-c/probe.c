// The wasi-probe test guest (see ../wasi-probe) in C, through wasi-libc:
// preview1 has no sockets, so the probes are the file system, the
// environment and the clock. The record's value names the probe; the result
// is emitted to alias `out`.
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "onceflow.h"

extern char **environ;

static void describe(char *out, size_t size, const char *what, FILE *file) {
    if (!file) {
        snprintf(out, size, "error: %s: %s", what, strerror(errno));
        return;
    }
    char buffer[64];
    size_t n = fread(buffer, 1, sizeof buffer, file);
    fclose(file);
    snprintf(out, size, "read %zu bytes from %s", n, what);
}

static void list(char *out, size_t size, const char *path) {
    DIR *dir = opendir(path);
    if (!dir) {
        snprintf(out, size, "error: %s", strerror(errno));
        return;
    }
    int entries = 0;
    while (readdir(dir)) entries++;
    closedir(dir);
    snprintf(out, size, "%d entries", entries);
}

onceflow_error *onceflow_process(const onceflow_record *record) {
    char name[32] = {0};
    size_t len = record->value.bytes.len < sizeof name - 1 ? record->value.bytes.len : sizeof name - 1;
    memcpy(name, record->value.bytes.ptr, len);
    char result[256];
    if (strcmp(name, "file") == 0) {
        describe(result, sizeof result, "/etc/passwd", fopen("/etc/passwd", "rb"));
    } else if (strcmp(name, "dir") == 0) {
        char root[100], here[100];
        list(root, sizeof root, "/");
        list(here, sizeof here, ".");
        snprintf(result, sizeof result, "/: %s; .: %s", root, here);
    } else if (strcmp(name, "env") == 0) {
        int count = 0;
        for (char **e = environ; e && *e; e++) count++;
        snprintf(result, sizeof result, "env=%d args=0", count);
    } else if (strcmp(name, "clock") == 0) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        snprintf(result, sizeof result, "%lld", (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000);
    } else {
        snprintf(result, sizeof result, "unknown probe");
    }
    onceflow_bytes key = {(const uint8_t *)name, len};
    onceflow_bytes value = onceflow_str(result);
    return onceflow_emit("out", &key, &value);
}
