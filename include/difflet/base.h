/* difflet base layer: status codes, logging, arena, hashing, files, timers, CPU
 * features and the thread runner. Everything above this layer reports failures
 * through dl_status plus a per-thread message (dl_last_error), and bugs through
 * DL_ASSERT. Library code never exits the process. */
#ifndef DIFFLET_BASE_H
#define DIFFLET_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ------------------------------------------------------------------ */

typedef enum {
    DL_OK = 0,
    DL_ERR_INVALID,     /* bad argument or bad input data */
    DL_ERR_IO,          /* file system or socket failure */
    DL_ERR_NOMEM,       /* allocation failed */
    DL_ERR_FORMAT,      /* malformed file (header, JSON, checkpoint) */
    DL_ERR_UNSUPPORTED, /* valid request that this build or CPU cannot serve */
    DL_ERR_BACKEND,     /* oneDNN or another library returned an error */
    DL_ERR_CANCELLED,   /* the caller asked to stop (a request cancelled or timed out) */
    DL_ERR_PREEMPTED,   /* a resumable request stopped at a step boundary to continue elsewhere (DDiT) */
} dl_status;

/* Short name of a status ("invalid argument", ...). Never NULL. */
const char *dl_status_str(dl_status s);

/* Record a message for the calling thread and return `s`, so errors read as
 *   return dl_fail(DL_ERR_IO, "open %s: %s", path, strerror(errno)); */
dl_status dl_fail(dl_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The last message recorded by dl_fail on this thread ("" if none). */
const char *dl_last_error(void);

/* Bugs, not input errors: print file, line and the expression, then abort. */
#define DL_ASSERT(x)                                                   \
    do {                                                               \
        if (!(x)) dl_assert_fail(#x, __FILE__, __LINE__);              \
    } while (0)
void dl_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

/* ---- logging ----------------------------------------------------------------- */

typedef enum { DL_LOG_DEBUG = 0, DL_LOG_INFO, DL_LOG_WARN, DL_LOG_ERROR } dl_log_level;

/* Level from DIFFLET_LOG=debug|info|warn|error (default info), read once. */
dl_log_level dl_log_get_level(void);
void dl_log_set_level(dl_log_level l);
void dl_log(dl_log_level l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define DL_DEBUG(...) dl_log(DL_LOG_DEBUG, __VA_ARGS__)
#define DL_INFO(...) dl_log(DL_LOG_INFO, __VA_ARGS__)
#define DL_WARN(...) dl_log(DL_LOG_WARN, __VA_ARGS__)
#define DL_ERROR(...) dl_log(DL_LOG_ERROR, __VA_ARGS__)

/* ---- arena ------------------------------------------------------------------- */

/* One 64-byte aligned block, sliced by bump allocation. Used where sizes are
 * planned up front: the hot loop never calls malloc. */
typedef struct dl_arena dl_arena;

dl_status dl_arena_new(dl_arena **out, size_t capacity);
void dl_arena_free(dl_arena *a);
/* 64-byte aligned slice, or NULL (with dl_last_error set) when the arena is full. */
void *dl_arena_alloc(dl_arena *a, size_t bytes);
size_t dl_arena_used(const dl_arena *a);
size_t dl_arena_capacity(const dl_arena *a);
/* Forget every slice (the memory is kept). */
void dl_arena_reset(dl_arena *a);

#define DL_ALIGN 64
static inline size_t dl_align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* 64-byte aligned malloc/free for buffers that outlive an arena. */
void *dl_aligned_alloc(size_t bytes);
void dl_aligned_free(void *p);

/* ---- hashing ----------------------------------------------------------------- */

/* 64-bit XXH3 of a buffer; stable across runs and machines. */
uint64_t dl_hash64(const void *data, size_t len, uint64_t seed);
/* Streaming form for large files and multi-part keys. */
typedef struct dl_hasher dl_hasher;
dl_hasher *dl_hasher_new(uint64_t seed);
void dl_hasher_update(dl_hasher *h, const void *data, size_t len);
uint64_t dl_hasher_digest(const dl_hasher *h);
void dl_hasher_free(dl_hasher *h);

/* ---- string map ---------------------------------------------------------------- */

/* String (bytes + length) -> int32, open addressing on XXH3; keys are copied. For
 * vocabularies and merge ranks: built once, then read-only (safe to share). */
typedef struct dl_strmap dl_strmap;
dl_strmap *dl_strmap_new(size_t expected);
void dl_strmap_free(dl_strmap *m);
/* Insert or overwrite. DL_ERR_NOMEM on allocation failure. */
dl_status dl_strmap_put(dl_strmap *m, const char *key, size_t len, int32_t value);
/* 1 and *value when present, else 0. */
int dl_strmap_get(const dl_strmap *m, const char *key, size_t len, int32_t *value);
size_t dl_strmap_count(const dl_strmap *m);
/* fn(ctx, key, len, value) for every entry, in no particular order. */
void dl_strmap_foreach(const dl_strmap *m, void (*fn)(void *ctx, const char *key, size_t len, int32_t value), void *ctx);

/* ---- files ------------------------------------------------------------------- */

/* Whole file into a malloc'd, NUL-terminated buffer (caller frees). `max_bytes`
 * bounds what is accepted: larger files fail instead of exhausting memory. */
dl_status dl_file_read(const char *path, size_t max_bytes, char **data, size_t *len);

/* NULL when text is one JSON value in RFC 8259's strict grammar (whitespace
 * around it, nothing else), else what is wrong, with *at its byte offset. Also
 * refused: a \u0000 escape, nesting deeper than 64. */
const char *dl_json_strict_check(const char *text, size_t len, size_t *at);

/* Standard padded base64 (RFC 4648): encode to a malloc'd NUL-terminated string
 * (NULL when out of memory); decode strictly (no whitespace), *out malloc'd. */
char *dl_b64_encode(const uint8_t *data, size_t n);
dl_status dl_b64_decode(const char *s, size_t n, uint8_t **out, size_t *len);
/* Write `len` bytes to `path` atomically: temp file in the same directory, fsync,
 * rename. A crash leaves either the old file or the new one, never a mix. */
dl_status dl_file_write_atomic(const char *path, const void *data, size_t len);
int dl_file_exists(const char *path);
/* mkdir -p (mode 0755); an existing directory is fine. */
dl_status dl_mkdir_p(const char *path);
/* Remove a file or a directory tree (symbolic links are removed, never followed);
 * what cannot be removed stays, silently. */
void dl_rm_rf(const char *path);

/* The same, streamed: open a temporary file beside `path`, write pieces, then
 * commit (fsync, rename, fsync the directory) or abort (unlink). */
typedef struct {
    int fd;
    char *tmp, *path;
} dl_atomic_file;
dl_status dl_atomic_open(dl_atomic_file *f, const char *path);
dl_status dl_atomic_write(dl_atomic_file *f, const void *data, size_t len);
dl_status dl_atomic_commit(dl_atomic_file *f);
void dl_atomic_abort(dl_atomic_file *f);

/* A read-only shared mapping of a whole file. Several processes mapping the same
 * file share its pages. */
typedef struct {
    const uint8_t *data;
    size_t len;
} dl_mmap;
dl_status dl_mmap_open(dl_mmap *m, const char *path);
void dl_mmap_close(dl_mmap *m);

/* ---- time -------------------------------------------------------------------- */

/* Monotonic seconds (CLOCK_MONOTONIC), for intervals only. */
double dl_now(void);

/* ---- CPU features and kernel selection --------------------------------------- */

typedef enum {
    DL_ISA_REF = 0,    /* plain C references (forced by DIFFLET_KERNELS=ref) */
    DL_ISA_AVX2,       /* AVX2 + FMA + F16C */
    DL_ISA_AVX512,     /* AVX-512 F/BW/VL/DQ */
    DL_ISA_AVX512_BF16 /* the above plus AVX512_BF16 (vdpbf16ps, vcvtneps2bf16) */
} dl_isa;

typedef struct {
    int avx2_fma;    /* AVX2 + FMA + F16C, with OS support for YMM state */
    int avx512f;     /* AVX-512 F+BW+VL+DQ, with OS support for ZMM state */
    int avx512_bf16; /* AVX512_BF16 */
    int amx_bf16;    /* AMX-TILE + AMX-BF16 with OS support for tile state (use still needs
                        the per-process XTILEDATA permission) */
    int amx_int8;    /* AMX-TILE + AMX-INT8, likewise */
    int vnni;        /* AVX512_VNNI (with AVX-512) or AVX-VNNI: int8 dot products without 16-bit saturation */
} dl_cpu_features;

const dl_cpu_features *dl_cpu(void);
/* The CPU's brand string (CPUID), e.g. "AMD EPYC 9R14 96-Core Processor". */
const char *dl_cpu_model(void);
/* The kernel path in use: best the CPU supports, lowered by DIFFLET_KERNELS=
 * ref|avx2|avx512 (never raised above what the CPU has). Read once. */
dl_isa dl_kernel_isa(void);
const char *dl_isa_name(dl_isa isa);
/* Override for tests and benchmarks (clamped to what the CPU supports). */
void dl_set_kernel_isa(dl_isa isa);

/* ---- threads ----------------------------------------------------------------- */

/* Threads used by difflet's kernels and by oneDNN (one OpenMP pool serves both).
 * Default: OMP_NUM_THREADS or the number of cores. */
int dl_threads(void);
void dl_set_threads(int n);

/* Run fn(ctx, ith, nth) on every thread of the pool and wait for all. Kernels split
 * their work by (ith, nth); nth is fixed for one call. */
typedef void (*dl_task_fn)(void *ctx, int ith, int nth);
void dl_parallel(dl_task_fn fn, void *ctx);

/* The half-open share [*begin, *end) of n items that thread ith of nth takes. */
static inline void dl_split(int64_t n, int ith, int nth, int64_t *begin, int64_t *end) {
    int64_t per = n / nth, rem = n % nth;
    *begin = ith * per + (ith < rem ? ith : rem);
    *end = *begin + per + (ith < rem ? 1 : 0);
}

#ifdef __cplusplus
}
#endif
#endif
