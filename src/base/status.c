/* Status codes, the per-thread error message, assertions and levelled logging. */
#include "difflet/base.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static _Thread_local char g_err[1024];

const char *dl_status_str(dl_status s) {
    switch (s) {
    case DL_OK: return "ok";
    case DL_ERR_INVALID: return "invalid argument";
    case DL_ERR_IO: return "I/O error";
    case DL_ERR_NOMEM: return "out of memory";
    case DL_ERR_FORMAT: return "malformed input";
    case DL_ERR_UNSUPPORTED: return "unsupported";
    case DL_ERR_BACKEND: return "backend error";
    case DL_ERR_CANCELLED: return "cancelled";
    case DL_ERR_PREEMPTED: return "preempted";
    }
    return "unknown status";
}

dl_status dl_fail(dl_status s, const char *fmt, ...) {
    /* formatted apart first: an argument may be dl_last_error() itself (a message
       wrapping the one before it) */
    char msg[sizeof g_err];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(g_err, msg, sizeof g_err);
    return s;
}

const char *dl_last_error(void) { return g_err; }

void dl_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "difflet: assertion failed: %s (%s:%d)\n", expr, file, line);
    fflush(stderr);
    abort();
}

/* -1 = not read yet; the level is read from the environment on first use. */
static atomic_int g_level = -1; /* read by every thread that logs; set once from DIFFLET_LOG (any thread may race to it: same value) */

static int parse_level(const char *s) {
    if (!s || !*s) return DL_LOG_INFO;
    if (!strcasecmp(s, "debug")) return DL_LOG_DEBUG;
    if (!strcasecmp(s, "info")) return DL_LOG_INFO;
    if (!strcasecmp(s, "warn") || !strcasecmp(s, "warning")) return DL_LOG_WARN;
    if (!strcasecmp(s, "error")) return DL_LOG_ERROR;
    fprintf(stderr, "difflet: DIFFLET_LOG=%s is not one of debug|info|warn|error; using info\n", s);
    return DL_LOG_INFO;
}

dl_log_level dl_log_get_level(void) {
    int l = atomic_load_explicit(&g_level, memory_order_relaxed);
    if (l < 0) {
        l = parse_level(getenv("DIFFLET_LOG"));
        atomic_store_explicit(&g_level, l, memory_order_relaxed);
    }
    return (dl_log_level)l;
}

void dl_log_set_level(dl_log_level l) { atomic_store_explicit(&g_level, (int)l, memory_order_relaxed); }

void dl_log(dl_log_level l, const char *fmt, ...) {
    static const char *names[] = {"debug", "info", "warn", "error"};
    if ((int)l < (int)dl_log_get_level()) return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    /* One fprintf per line keeps lines from different threads whole. */
    fprintf(stderr, "%02d:%02d:%02d.%03ld %-5s %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, names[l], msg);
}
