/* GGUF reader and dequantization against gguf-py (tools/parity/make_gguf_vectors.py):
 * every supported type bit-identical to gguf.quants.dequantize, metadata read back,
 * unsupported types opened but refused by name on read, and malformed files (every
 * truncation, every single-byte corruption of the header, targeted patches) refused
 * with a message naming the file, never a crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "difflet/gguf.h"
#include "difflet/io.h"
#include "test_util.h"

#define GDIR DATA_DIR "/gguf"

static char g_tmpdir[256];

/* The whole file into a malloc'd buffer. */
static uint8_t *slurp(const char *path, size_t *len) {
    char *d = NULL;
    if (dl_file_read(path, 1 << 20, &d, len) != DL_OK) return NULL;
    return (uint8_t *)d;
}

static void put(const char *path, const void *d, size_t n) {
    FILE *f = fopen(path, "wb");
    DL_ASSERT(f);
    DL_ASSERT(n == 0 || fwrite(d, 1, n, f) == n);
    DL_ASSERT(fclose(f) == 0);
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Open `n` bytes written to a temporary file; the status, the handle freed. */
static dl_status open_bytes(const uint8_t *d, size_t n, const char *name, char *path_out) {
    snprintf(path_out, 512, "%s/%s", g_tmpdir, name);
    put(path_out, d, n);
    dl_gguf *g = NULL;
    dl_status s = dl_gguf_open(&g, path_out);
    if (s == DL_OK) { /* whatever opened must be readable within bounds (ASan checks) */
        for (int i = 0; i < dl_gguf_count(g); i++) {
            const dl_gguf_tensor *t = dl_gguf_at(g, i);
            if (!dl_gguf_type_supported(t->type)) continue;
            float *buf = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *buf);
            DL_ASSERT(buf);
            DL_ASSERT(dl_gguf_read(g, t, buf) == DL_OK);
            free(buf);
        }
        dl_gguf_free(g);
    }
    DL_ASSERT(s == DL_OK || g == NULL);
    return s;
}

/* A patched copy of `base` must be refused with a message naming the file and
 * containing `want`. */
static void expect_bad(const uint8_t *d, size_t n, const char *label, const char *want) {
    char path[512];
    dl_status s = open_bytes(d, n, "bad.gguf", path);
    const char *msg = dl_last_error();
    CHECK(s == DL_ERR_FORMAT, "%s: status %d (%s)", label, (int)s, msg);
    CHECK(s != DL_OK && strstr(msg, "bad.gguf") && strstr(msg, want), "%s: message \"%s\" lacks \"%s\"", label, msg,
          want);
}

static size_t find(const uint8_t *d, size_t n, const char *s) {
    const uint8_t *p = memmem(d, n, s, strlen(s));
    DL_ASSERT(p);
    return (size_t)(p - d);
}

/* ---- parity with gguf-py ----------------------------------------------------------- */

static void test_types(void) {
    dl_gguf *g = NULL;
    dl_checkpoint *ref = NULL;
    dl_status s = dl_gguf_open(&g, GDIR "/types.gguf");
    CHECK(s == DL_OK, "open types.gguf: %s", dl_last_error());
    s = dl_ckpt_open(&ref, GDIR "/vectors.safetensors", NULL);
    CHECK(s == DL_OK, "open vectors: %s", dl_last_error());
    if (!g || !ref) {
        dl_gguf_free(g), dl_ckpt_free(ref);
        return;
    }
    CHECK(dl_gguf_count(g) == dl_ckpt_count(ref) && dl_gguf_count(g) == 19, "%d tensors, %d vectors",
          dl_gguf_count(g), dl_ckpt_count(ref));
    static const struct {
        const char *name;
        uint32_t type;
    } want_types[] = {{"f32", DL_GGUF_F32},   {"f16", DL_GGUF_F16},   {"bf16", DL_GGUF_BF16},
                      {"q8_0", DL_GGUF_Q8_0}, {"q4_0", DL_GGUF_Q4_0}, {"q4_1", DL_GGUF_Q4_1},
                      {"q5_0", DL_GGUF_Q5_0}, {"q5_1", DL_GGUF_Q5_1}, {"q4_k", DL_GGUF_Q4_K},
                      {"q5_k", DL_GGUF_Q5_K}, {"q6_k", DL_GGUF_Q6_K}, {"q5_1.raw", DL_GGUF_Q5_1}};
    for (size_t i = 0; i < sizeof want_types / sizeof want_types[0]; i++) {
        const dl_gguf_tensor *t = dl_gguf_find(g, want_types[i].name);
        CHECK(t && t->type == want_types[i].type, "tensor %s: type %s", want_types[i].name,
              t ? dl_gguf_type_name(t->type) : "(missing)");
    }
    int exact = 0;
    for (int i = 0; i < dl_gguf_count(g); i++) {
        const dl_gguf_tensor *t = dl_gguf_at(g, i);
        const dl_st_tensor *r = dl_ckpt_find(ref, t->name);
        CHECK(r && r->dtype == DL_ST_F32, "no f32 vector for `%s`", t->name);
        if (!r) continue;
        int same = r->ndim == t->ndim && r->numel == t->numel;
        for (int d = 0; same && d < t->ndim; d++) same = r->shape[d] == t->shape[d];
        CHECK(same, "`%s`: shape differs from gguf-py's (ndim %d vs %d)", t->name, t->ndim, r->ndim);
        CHECK(((uintptr_t)t->data & 31) == 0, "`%s`: data not 32-byte aligned", t->name);
        CHECK(t->nbytes == (size_t)(t->numel / dl_gguf_block_elems(t->type)) * dl_gguf_block_bytes(t->type),
              "`%s`: nbytes %zu", t->name, t->nbytes);
        if (!same) continue;
        float *out = malloc((size_t)t->numel * sizeof *out);
        DL_ASSERT(out);
        s = dl_gguf_read(g, t, out);
        CHECK(s == DL_OK, "read `%s`: %s", t->name, dl_last_error());
        int64_t bad = -1;
        for (int64_t j = 0; j < t->numel && bad < 0; j++)
            if (memcmp(out + j, r->data + 4 * j, 4)) bad = j;
        if (bad >= 0) {
            float w;
            memcpy(&w, r->data + 4 * bad, 4);
            CHECK(0, "`%s` (%s): element %lld is %.9g, gguf-py gives %.9g", t->name, dl_gguf_type_name(t->type),
                  (long long)bad, out[bad], w);
        } else {
            exact++;
        }
        /* a block-aligned slice from the middle gives the same values */
        int64_t blk = dl_gguf_block_elems(t->type), nb = t->numel / blk;
        if (nb >= 3) {
            float *part = malloc((size_t)blk * sizeof *part);
            DL_ASSERT(part);
            s = dl_gguf_dequant(t->type, t->data + dl_gguf_block_bytes(t->type), blk, part);
            CHECK(s == DL_OK && !memcmp(part, out + blk, (size_t)blk * 4), "`%s`: block 1 alone differs", t->name);
            free(part);
        }
        free(out);
    }
    CHECK(exact == 19, "%d of 19 tensors bit-identical to gguf-py", exact);
    /* the references are not trivial (a test that cannot fail is a defect) */
    const dl_st_tensor *r = dl_ckpt_find(ref, "q6_k");
    float mx = 0;
    for (int64_t j = 0; r && j < r->numel; j++) {
        float v;
        memcpy(&v, r->data + 4 * j, 4);
        mx = v > mx ? v : -v > mx ? -v : mx;
    }
    CHECK(mx > 0, "q6_k reference is all zeros");

    const dl_gguf_tensor *t = dl_gguf_find(g, "f32.1d");
    CHECK(t && t->ndim == 1 && t->shape[0] == 37, "f32.1d shape");
    t = dl_gguf_find(g, "f32.3d");
    CHECK(t && t->ndim == 3 && t->shape[0] == 2 && t->shape[1] == 3 && t->shape[2] == 5, "f32.3d shape");
    t = dl_gguf_find(g, "q4_k.3d");
    CHECK(t && t->ndim == 3 && t->shape[0] == 2 && t->shape[1] == 2 && t->shape[2] == 256 && t->nbytes == 4 * 144,
          "q4_k.3d shape");
    CHECK(dl_gguf_find(g, "nope") == NULL && dl_gguf_find(g, "") == NULL, "find of a missing tensor");
    t = dl_gguf_find(g, "q8_0");
    if (t) {
        float buf[64];
        CHECK(dl_gguf_dequant(t->type, t->data, 16, buf) == DL_ERR_INVALID && strstr(dl_last_error(), "block"),
              "dequant of a partial block: %s", dl_last_error());
    }

    /* metadata */
    const char *arch = dl_gguf_get_str(g, "general.architecture");
    CHECK(arch && !strcmp(arch, "difflet-test"), "general.architecture = %s", arch ? arch : "(null)");
    const char *nm = dl_gguf_get_str(g, "general.name");
    CHECK(nm && !strcmp(nm, "difflet gguf test"), "general.name = %s", nm ? nm : "(null)");
    const char *uni = dl_gguf_get_str(g, "test.unicode");
    CHECK(uni && !strcmp(uni, "Gr\xc3\xbc\xc3\x9f" "e, \xe4\xb8\x96\xe7\x95\x8c"), "test.unicode = %s",
          uni ? uni : "(null)");
    CHECK(dl_gguf_get_str(g, "test.u32") == NULL && dl_gguf_get_str(g, "test.strings") == NULL &&
              dl_gguf_get_str(g, "missing.key") == NULL,
          "get_str of a non-string or missing key");
    CHECK(!strcmp(dl_gguf_path(g), GDIR "/types.gguf"), "path");
    dl_gguf_free(g);
    dl_ckpt_free(ref);
}

static void test_type_table(void) {
    CHECK(!strcmp(dl_gguf_type_name(DL_GGUF_Q8_0), "Q8_0") && !strcmp(dl_gguf_type_name(17), "IQ2_XS") &&
              !strcmp(dl_gguf_type_name(30), "BF16") && !strcmp(dl_gguf_type_name(99), "type 99"),
          "type names");
    CHECK(dl_gguf_block_elems(DL_GGUF_F16) == 1 && dl_gguf_block_elems(DL_GGUF_Q4_0) == 32 &&
              dl_gguf_block_elems(DL_GGUF_Q6_K) == 256 && dl_gguf_block_elems(99) == 0,
          "block elems");
    CHECK(dl_gguf_block_bytes(DL_GGUF_Q8_0) == 34 && dl_gguf_block_bytes(DL_GGUF_Q4_K) == 144 &&
              dl_gguf_block_bytes(DL_GGUF_Q5_K) == 176 && dl_gguf_block_bytes(DL_GGUF_Q6_K) == 210 &&
              dl_gguf_block_bytes(DL_GGUF_Q5_1) == 24 && dl_gguf_block_bytes(99) == 0,
          "block bytes");
    static const uint32_t yes[] = {0, 1, 30, 8, 2, 3, 6, 7, 12, 13, 14};
    static const uint32_t no[] = {9, 10, 11, 15, 16, 17, 20, 23, 24, 28, 34, 39, 99};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) CHECK(dl_gguf_type_supported(yes[i]), "type %u", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) CHECK(!dl_gguf_type_supported(no[i]), "type %u", no[i]);
    uint8_t blk[256] = {0};
    float out[256];
    CHECK(dl_gguf_dequant(DL_GGUF_Q2_K, blk, 256, out) == DL_ERR_UNSUPPORTED && strstr(dl_last_error(), "Q2_K") &&
              strstr(dl_last_error(), "supported: F32"),
          "dequant Q2_K: %s", dl_last_error());
}

static void test_unsupported(void) {
    dl_gguf *g = NULL;
    dl_status s = dl_gguf_open(&g, GDIR "/unsupported.gguf");
    CHECK(s == DL_OK, "open unsupported.gguf: %s", dl_last_error());
    if (!g) return;
    CHECK(dl_gguf_count(g) == 3, "count %d", dl_gguf_count(g));
    float buf[256];
    const dl_gguf_tensor *t = dl_gguf_find(g, "iq2_xs");
    CHECK(t && t->type == 17 && t->ndim == 2 && t->shape[1] == 256, "iq2_xs info");
    if (t) {
        s = dl_gguf_read(g, t, buf);
        CHECK(s == DL_ERR_UNSUPPORTED && strstr(dl_last_error(), "unsupported.gguf") &&
                  strstr(dl_last_error(), "tensor `iq2_xs` is of GGUF type IQ2_XS, which difflet cannot read") &&
                  strstr(dl_last_error(), "supported: F32, F16, BF16, Q8_0"),
              "read iq2_xs: %s", dl_last_error());
    }
    t = dl_gguf_find(g, "q2_k");
    if (t) {
        s = dl_gguf_read(g, t, buf);
        CHECK(s == DL_ERR_UNSUPPORTED && strstr(dl_last_error(), "type Q2_K"), "read q2_k: %s", dl_last_error());
    }
    t = dl_gguf_find(g, "ok");
    CHECK(t && dl_gguf_read(g, t, buf) == DL_OK && buf[0] == 1.0f && buf[3] == 1.0f, "read ok");
    dl_gguf_free(g);
}

/* ---- malformed files --------------------------------------------------------------- */

/* Offset of the tensor info of `name` (at its u64 name length) in small.gguf. */
static size_t tensor_info(const uint8_t *d, size_t n, const char *name) {
    char pat[16] = {0};
    pat[0] = (char)strlen(name); /* u64 length, little-endian, then the bytes */
    memcpy(pat + 8, name, strlen(name));
    const uint8_t *p = memmem(d, n, pat, 8 + strlen(name));
    DL_ASSERT(p);
    return (size_t)(p - d);
}

static void test_malformed(void) {
    size_t n;
    uint8_t *base = slurp(GDIR "/small.gguf", &n), *d = malloc(n ? n : 1);
    CHECK(base && d, "read small.gguf");
    if (!base || !d) {
        free(base), free(d);
        return;
    }
    char path[512];
    dl_gguf *g = NULL;
    CHECK(dl_gguf_open(&g, GDIR "/small.gguf") == DL_OK, "open small.gguf: %s", dl_last_error());
    size_t data_end = 0; /* where the last tensor's bytes end: shorter files must fail */
    if (g) {
        CHECK(dl_gguf_count(g) == 2, "small: %d tensors", dl_gguf_count(g));
        for (int i = 0; i < dl_gguf_count(g); i++) {
            const dl_gguf_tensor *t = dl_gguf_at(g, i);
            CHECK(((uintptr_t)t->data & 63) == 0, "`%s` not 64-byte aligned (general.alignment 64)", t->name);
            const uint8_t *p = memmem(base, n, t->data, t->nbytes);
            DL_ASSERT(p);
            if ((size_t)(p - base) + t->nbytes > data_end) data_end = (size_t)(p - base) + t->nbytes;
        }
        const dl_gguf_tensor *t = dl_gguf_find(g, "t.a");
        float v[6];
        CHECK(t && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && dl_gguf_read(g, t, v) == DL_OK &&
                  v[5] == 5.0f,
              "t.a");
        dl_gguf_free(g);
    }

    /* every truncation: refused (with the file named) before the data ends, fine after */
    int trunc_ok = 1;
    for (size_t len = 0; len < n; len++) {
        dl_status s = open_bytes(base, len, "trunc.gguf", path);
        int want_ok = len >= data_end;
        if ((s == DL_OK) != want_ok || (!want_ok && !strstr(dl_last_error(), "trunc.gguf"))) {
            CHECK(0, "truncated to %zu of %zu bytes: status %d (%s)", len, n, (int)s, dl_last_error());
            trunc_ok = 0;
            break;
        }
    }
    CHECK(trunc_ok && data_end > 900, "every truncation (data ends at %zu)", data_end);

    /* every single-byte corruption of the header and tensor infos: no crash, no read
     * outside the file (open_bytes reads what opened; ASan builds check) */
    int opened = 0, refused = 0;
    for (size_t i = 0; i < 960 && i < n; i++)
        for (int v = 0; v < 3; v++) {
            memcpy(d, base, n);
            d[i] = v == 0 ? 0x00 : v == 1 ? 0xff : (uint8_t)(base[i] ^ 0x01);
            dl_status s = open_bytes(d, n, "flip.gguf", path);
            if (s == DL_OK) opened++;
            else refused++;
        }
    CHECK(refused > 0 && opened > 0, "byte corruptions: %d refused, %d opened", refused, opened);

#define RESET() memcpy(d, base, n)
    RESET(), d[0] = 'X';
    expect_bad(d, n, "magic", "not a GGUF file");
    RESET(), put32(d + 4, 1);
    expect_bad(d, n, "version 1", "GGUF version 1");
    RESET(), put32(d + 4, 4);
    expect_bad(d, n, "version 4", "version 4 is not supported");
    RESET(), put32(d + 4, 0x03000000u);
    expect_bad(d, n, "big-endian", "big-endian");
    RESET(), put32(d + 4, 2);
    CHECK(open_bytes(d, n, "v2.gguf", path) == DL_OK, "version 2 opens: %s", dl_last_error());
    RESET(), put64(d + 8, 1ull << 40);
    expect_bad(d, n, "tensor count", "more than its");
    RESET(), put64(d + 16, UINT64_MAX);
    expect_bad(d, n, "kv count", "more than its");

    size_t al = find(base, n, "general.alignment") + strlen("general.alignment"); /* u32 type, u32 value */
    RESET(), put32(d + al + 4, 48);
    expect_bad(d, n, "alignment 48", "general.alignment is 48, must be a power of two");
    RESET(), put32(d + al + 4, 0);
    expect_bad(d, n, "alignment 0", "power of two");
    RESET(), put32(d + al, 5);
    expect_bad(d, n, "alignment type", "must be uint32");

    size_t u8 = find(base, n, "test.u8") + 7; /* u32 type, u8 value */
    RESET(), put32(d + u8, 13);
    expect_bad(d, n, "value type 13", "`test.u8` has unknown value type 13");
    RESET(), memcpy(d + u8 - 7, "test.i8", 7);
    expect_bad(d, n, "duplicate key", "metadata key `test.i8` appears twice");
    RESET(), d[u8 - 2] = 0;
    expect_bad(d, n, "NUL in key", "NUL");
    size_t ints = find(base, n, "test.ints") + 9; /* u32 ARRAY, u32 element type, u64 count */
    RESET(), put32(d + ints + 4, 13);
    expect_bad(d, n, "array element type", "array of unknown value type 13");
    RESET(), put64(d + ints + 8, 1ull << 62);
    expect_bad(d, n, "array count", "truncated");
    size_t strs = find(base, n, "test.strings") + 12;
    RESET(), put64(d + strs + 8, 1ull << 62);
    expect_bad(d, n, "string array count", "truncated");
    size_t name = find(base, n, "general.name") + 12; /* u32 STRING, u64 length */
    RESET(), put64(d + name + 4, UINT64_MAX);
    expect_bad(d, n, "string length", "truncated");

    size_t tb = tensor_info(base, n, "t.b") + 8 + 3; /* u32 n_dims, u64 ne[2], u32 type, u64 offset */
    RESET(), put32(d + tb, 0);
    expect_bad(d, n, "0 dims", "`t.b` has 0 dimensions");
    RESET(), put32(d + tb, 5);
    expect_bad(d, n, "5 dims", "`t.b` has 5 dimensions");
    RESET(), put64(d + tb + 4, 16);
    expect_bad(d, n, "ne0 not a block multiple", "not a multiple of its 32-element block");
    RESET(), put64(d + tb + 4, 1ull << 40), put64(d + tb + 12, 1ull << 40);
    expect_bad(d, n, "ne overflow", "overflows");
    RESET(), put64(d + tb + 12, 1ull << 30);
    expect_bad(d, n, "ne too large", "more than the");
    RESET(), put32(d + tb + 20, 99);
    expect_bad(d, n, "type 99", "unknown GGUF type 99");
    RESET(), put64(d + tb + 24, 65);
    expect_bad(d, n, "misaligned offset", "not a multiple of the alignment 64");
    RESET(), put64(d + tb + 24, 1ull << 40);
    expect_bad(d, n, "offset past the end", "spans data bytes");
    RESET(), put64(d + tb + 24, 0);
    expect_bad(d, n, "overlap", "overlap");
    RESET(), d[tb - 1] = 'a';
    expect_bad(d, n, "duplicate tensor", "tensor `t.a` appears twice");
#undef RESET
    free(base), free(d);
}

/* Hand-built files: no tensors at all, and arrays nested past the limit. */
static void test_synthetic(void) {
    uint8_t b[4096] = {0};
    char path[512];
    memcpy(b, "GGUF", 4), put32(b + 4, 3), put64(b + 8, 0), put64(b + 16, 0);
    CHECK(open_bytes(b, 24, "empty.gguf", path) == DL_OK, "empty file opens: %s", dl_last_error());

    for (int depth = 15; depth <= 40; depth += 25) { /* key "k": depth arrays of one array, then an empty u8 array */
        size_t o = 24;
        put64(b + 16, 1);
        put64(b + o, 1), b[o + 8] = 'k', o += 9;
        put32(b + o, 9), o += 4;
        for (int i = 0; i < depth; i++) put32(b + o, 9), put64(b + o + 4, 1), o += 12;
        put32(b + o, 0), put64(b + o + 4, 0), o += 12;
        dl_status s = open_bytes(b, o, "nested.gguf", path);
        if (depth < 16) CHECK(s == DL_OK, "depth %d: %s", depth, dl_last_error());
        else CHECK(s == DL_ERR_FORMAT && strstr(dl_last_error(), "deeper than"), "depth %d: %s", depth, dl_last_error());
    }
    dl_gguf *g = NULL;
    CHECK(dl_gguf_open(&g, GDIR "/does-not-exist.gguf") != DL_OK && g == NULL &&
              strstr(dl_last_error(), "does-not-exist.gguf"),
          "missing file: %s", dl_last_error());
}

int main(void) {
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/difflet-gguf-XXXXXX");
    DL_ASSERT(mkdtemp(g_tmpdir));
    test_type_table();
    test_types();
    test_unsupported();
    test_malformed();
    test_synthetic();
    static const char *names[] = {"bad.gguf", "trunc.gguf", "flip.gguf", "v2.gguf", "empty.gguf", "nested.gguf"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", g_tmpdir, names[i]);
        unlink(p);
    }
    rmdir(g_tmpdir);
    return test_done("test_gguf");
}
