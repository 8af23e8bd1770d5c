/* gguf: reader (mmap + validated header) and dequantization of ggml block types.
 *
 * File layout (all little-endian; versions 2 and 3 share it, 3 only added
 * big-endian files, which are refused here):
 *   u32 magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv x { string key, u32 value_type, value },
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims] (innermost first),
 *                 u32 ggml_type, u64 offset (from the data section) },
 *   padding to general.alignment (u32 metadata, default 32), the data section.
 * A string is u64 length + bytes (no NUL). A value is one of 13 types; an array is
 * u32 element type + u64 count + elements, and may nest.
 *
 * Validation: every read is bounds-checked against the mapping (a truncated file is
 * an error, never a read past the end); counts are bounded by the bytes left before
 * anything is allocated; nested arrays by depth; names and keys must be unique; a
 * tensor has 1..4 dims whose product fits int64, ne[0] a multiple of its type's
 * block, a known type, an offset that is a multiple of the alignment, and bytes
 * inside the data section, not overlapping another tensor's.
 *
 * Dequantization follows the block layouts of ggml (read from gguf-py's quants.py)
 * and computes in f32 exactly as gguf-py does (each product and sum rounded to f32
 * in the same order, f16 scales widened exactly), so results are bit-identical to
 * gguf.quants.dequantize. That relies on no FMA contraction: C11 mode (-std=c11,
 * no GNU extensions) makes GCC default to -ffp-contract=off. */
#include "difflet/gguf.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/kernels.h" /* dl_f16_to_f32 */

/* ---- types --------------------------------------------------------------------------- */

#define QK_K 256

static const struct {
    uint32_t id;
    const char *name;
    int64_t blk;   /* elements per block */
    size_t bytes;  /* bytes per block */
    int supported; /* dl_gguf_dequant handles it */
} k_types[] = {
    {0, "F32", 1, 4, 1},
    {1, "F16", 1, 2, 1},
    {2, "Q4_0", 32, 2 + 16, 1},
    {3, "Q4_1", 32, 2 + 2 + 16, 1},
    {6, "Q5_0", 32, 2 + 4 + 16, 1},
    {7, "Q5_1", 32, 2 + 2 + 4 + 16, 1},
    {8, "Q8_0", 32, 2 + 32, 1},
    {9, "Q8_1", 32, 4 + 4 + 32, 0},
    {10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4, 0},
    {11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12, 0},
    {12, "Q4_K", QK_K, 2 + 2 + QK_K / 2 + 12, 1},
    {13, "Q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12, 1},
    {14, "Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16, 1},
    {15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8, 0},
    {16, "IQ2_XXS", QK_K, 2 + QK_K / 4, 0},
    {17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32, 0},
    {18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8, 0},
    {19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16, 0},
    {20, "IQ4_NL", 32, 2 + 16, 0},
    {21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4, 0},
    {22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16, 0},
    {23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64, 0},
    {24, "I8", 1, 1, 0},
    {25, "I16", 1, 2, 0},
    {26, "I32", 1, 4, 0},
    {27, "I64", 1, 8, 0},
    {28, "F64", 1, 8, 0},
    {29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32, 0},
    {30, "BF16", 1, 2, 1},
    {34, "TQ1_0", QK_K, 2 + 4 * 13, 0},
    {35, "TQ2_0", QK_K, 2 + 64, 0},
    {39, "MXFP4", 32, 1 + 16, 0},
    {40, "NVFP4", 64, 4 + 32, 0},
    {41, "Q1_0", 128, 2 + 16, 0},
};
#define N_TYPES ((int)(sizeof k_types / sizeof k_types[0]))
#define SUPPORTED_LIST "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K"

static int type_index(uint32_t type) {
    for (int i = 0; i < N_TYPES; i++)
        if (k_types[i].id == type) return i;
    return -1;
}

const char *dl_gguf_type_name(uint32_t type) {
    static _Thread_local char buf[24];
    int i = type_index(type);
    if (i >= 0) return k_types[i].name;
    snprintf(buf, sizeof buf, "type %u", type);
    return buf;
}

int dl_gguf_type_supported(uint32_t type) {
    int i = type_index(type);
    return i >= 0 && k_types[i].supported;
}

int64_t dl_gguf_block_elems(uint32_t type) {
    int i = type_index(type);
    return i >= 0 ? k_types[i].blk : 0;
}

size_t dl_gguf_block_bytes(uint32_t type) {
    int i = type_index(type);
    return i >= 0 ? k_types[i].bytes : 0;
}

/* ---- the handle ---------------------------------------------------------------------- */

typedef struct {
    char *key;
    uint32_t type;
    char *str; /* the value when type is STRING (NUL-terminated copy), else NULL */
} kv_entry;

struct dl_gguf {
    char *path;
    dl_mmap map;
    uint32_t version, alignment;
    dl_gguf_tensor *t; /* file order */
    uint64_t *offs;    /* each tensor's offset in the data section (while parsing) */
    int n, cap;
    const dl_gguf_tensor **by_name; /* sorted by name */
    kv_entry *kv; /* sorted by key */
    int nkv, kvcap;
};

enum { V_U8, V_I8, V_U16, V_I16, V_U32, V_I32, V_F32, V_BOOL, V_STRING, V_ARRAY, V_U64, V_I64, V_F64, V_COUNT };
#define MAX_ARRAY_DEPTH 16

/* Bytes of a scalar value type; 0 for STRING, ARRAY and unknown types. */
static size_t scalar_size(uint32_t vt) {
    static const uint8_t sz[V_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return vt < V_COUNT ? sz[vt] : 0;
}

/* A bounds-checked cursor over the mapping. */
typedef struct {
    const uint8_t *p;
    size_t len, off;
    const char *shown; /* the file, for messages */
} cursor;

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }
static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static size_t left(const cursor *c) { return c->len - c->off; }
static int skip(cursor *c, uint64_t n) {
    if (n > left(c)) return 0;
    c->off += (size_t)n;
    return 1;
}
static int rd32(cursor *c, uint32_t *v) {
    if (left(c) < 4) return 0;
    *v = le32(c->p + c->off);
    c->off += 4;
    return 1;
}
static int rd64(cursor *c, uint64_t *v) {
    if (left(c) < 8) return 0;
    *v = le64(c->p + c->off);
    c->off += 8;
    return 1;
}
/* A string: *s points into the mapping, *n its length (bounded by the file). */
static int rdstr(cursor *c, const uint8_t **s, uint64_t *n) {
    if (!rd64(c, n) || *n > left(c)) return 0;
    *s = c->p + c->off;
    c->off += (size_t)*n;
    return 1;
}

static dl_status truncated(const cursor *c, const char *what) {
    return dl_fail(DL_ERR_FORMAT, "`%s`: file ends at byte %zu while reading %s: truncated or not a GGUF file?",
                   c->shown, c->len, what);
}

/* Skip one value of type vt (already read). `key` names it in messages. */
static dl_status skip_value(cursor *c, uint32_t vt, const char *key, int depth) {
    char what[320];
    snprintf(what, sizeof what, "metadata `%.256s`", key);
    size_t sz = scalar_size(vt);
    if (sz) return skip(c, sz) ? DL_OK : truncated(c, what);
    if (vt == V_STRING) {
        const uint8_t *s;
        uint64_t n;
        return rdstr(c, &s, &n) ? DL_OK : truncated(c, what);
    }
    if (vt != V_ARRAY)
        return dl_fail(DL_ERR_FORMAT, "`%s`: metadata `%.256s` has unknown value type %u (GGUF knows 0..12)", c->shown,
                       key, vt);
    if (depth >= MAX_ARRAY_DEPTH)
        return dl_fail(DL_ERR_FORMAT, "`%s`: metadata `%.256s` nests arrays deeper than %d", c->shown, key,
                       MAX_ARRAY_DEPTH);
    uint32_t et;
    uint64_t count;
    if (!rd32(c, &et) || !rd64(c, &count)) return truncated(c, what);
    size_t esz = scalar_size(et);
    if (esz) /* count * esz without overflow */
        return count <= left(c) / esz ? (skip(c, count * esz), DL_OK) : truncated(c, what);
    if (et != V_STRING && et != V_ARRAY)
        return dl_fail(DL_ERR_FORMAT, "`%s`: metadata `%.256s` is an array of unknown value type %u", c->shown, key, et);
    /* every element takes at least 8 (string) or 12 (array) bytes: a count beyond
     * that is a truncated or corrupt file, found before looping over it */
    if (count > left(c) / (et == V_STRING ? 8 : 12)) return truncated(c, what);
    for (uint64_t i = 0; i < count; i++) {
        dl_status s = skip_value(c, et, key, depth + 1);
        if (s != DL_OK) return s;
    }
    return DL_OK;
}

static int kv_by_key(const void *a, const void *b) {
    return strcmp(((const kv_entry *)a)->key, ((const kv_entry *)b)->key);
}

static int tensor_by_name(const void *a, const void *b) {
    return strcmp((*(const dl_gguf_tensor *const *)a)->name, (*(const dl_gguf_tensor *const *)b)->name);
}

typedef struct {
    uint64_t b, e;
    int i;
} range;
static int range_by_begin(const void *a, const void *b) {
    const range *x = a, *y = b;
    return x->b < y->b ? -1 : x->b > y->b ? 1 : (x->e > y->e) - (x->e < y->e);
}

/* A NUL-terminated copy of n bytes; names and keys may not contain NUL. */
static char *copy_name(const uint8_t *s, uint64_t n) {
    char *r = malloc((size_t)n + 1);
    if (!r) return NULL;
    memcpy(r, s, (size_t)n);
    r[n] = 0;
    return r;
}

/* Room for one more entry in an array grown by doubling: arrays grow with what was
 * read, never to a count the header claims. */
static int grow(void **arr, int *cap, int n, size_t elem) {
    if (n < *cap) return 1;
    int nc = *cap ? 2 * *cap : 16;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return 0;
    *arr = p;
    *cap = nc;
    return 1;
}

static dl_status parse_kv(dl_gguf *g, cursor *c, uint64_t nkv) {
    for (uint64_t i = 0; i < nkv; i++) {
        char what[64];
        snprintf(what, sizeof what, "metadata entry %llu of %llu", (unsigned long long)i, (unsigned long long)nkv);
        const uint8_t *ks;
        uint64_t kn;
        uint32_t vt;
        if (!rdstr(c, &ks, &kn)) return truncated(c, what);
        if (memchr(ks, 0, (size_t)kn))
            return dl_fail(DL_ERR_FORMAT, "`%s`: %s has a key with a NUL byte", c->shown, what);
        if (!grow((void **)&g->kv, &g->kvcap, g->nkv, sizeof *g->kv)) return dl_fail(DL_ERR_NOMEM, "out of memory");
        kv_entry *e = &g->kv[g->nkv];
        memset(e, 0, sizeof *e);
        if (!(e->key = copy_name(ks, kn))) return dl_fail(DL_ERR_NOMEM, "out of memory");
        g->nkv++;
        if (!rd32(c, &vt)) return truncated(c, what);
        e->type = vt;
        size_t at = c->off;
        dl_status s = skip_value(c, vt, e->key, 0);
        if (s != DL_OK) return s;
        if (vt == V_STRING) {
            uint64_t n = le64(c->p + at);
            if (!(e->str = malloc((size_t)n + 1))) return dl_fail(DL_ERR_NOMEM, "out of memory");
            memcpy(e->str, c->p + at + 8, (size_t)n);
            e->str[n] = 0;
        }
        if (!strcmp(e->key, "general.alignment")) {
            uint32_t a = vt == V_U32 ? le32(c->p + at) : 0;
            if (vt != V_U32)
                return dl_fail(DL_ERR_FORMAT, "`%s`: general.alignment has value type %u, must be uint32 (4)", c->shown, vt);
            if (a == 0 || (a & (a - 1)))
                return dl_fail(DL_ERR_FORMAT, "`%s`: general.alignment is %u, must be a power of two", c->shown, a);
            g->alignment = a;
        }
    }
    if (g->nkv > 1) qsort(g->kv, (size_t)g->nkv, sizeof *g->kv, kv_by_key);
    for (int i = 1; i < g->nkv; i++)
        if (!strcmp(g->kv[i].key, g->kv[i - 1].key))
            return dl_fail(DL_ERR_FORMAT, "`%s`: metadata key `%.256s` appears twice", c->shown, g->kv[i].key);
    return DL_OK;
}

/* One tensor info; offsets are checked later, once the data section is known. */
static dl_status parse_tensor_info(dl_gguf *g, cursor *c, uint64_t i, uint64_t nt) {
    char what[64];
    snprintf(what, sizeof what, "tensor info %llu of %llu", (unsigned long long)i, (unsigned long long)nt);
    const uint8_t *ns;
    uint64_t nn;
    uint32_t ndim, type;
    if (!rdstr(c, &ns, &nn)) return truncated(c, what);
    if (memchr(ns, 0, (size_t)nn)) return dl_fail(DL_ERR_FORMAT, "`%s`: %s has a name with a NUL byte", c->shown, what);
    int cap = g->cap;
    if (!grow((void **)&g->t, &cap, g->n, sizeof *g->t) || !grow((void **)&g->offs, &g->cap, g->n, sizeof *g->offs))
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_gguf_tensor *t = &g->t[g->n];
    uint64_t *offset = &g->offs[g->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = copy_name(ns, nn))) return dl_fail(DL_ERR_NOMEM, "out of memory");
    g->n++;
    const char *name = t->name;
    if (!rd32(c, &ndim)) return truncated(c, what);
    if (ndim < 1 || ndim > DL_GGUF_MAX_DIMS)
        return dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%.256s` has %u dimensions (GGUF allows 1 to %d)", c->shown, name,
                       ndim, DL_GGUF_MAX_DIMS);
    uint64_t ne[DL_GGUF_MAX_DIMS], numel = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        if (!rd64(c, &ne[d])) return truncated(c, what);
        if (ne[d] > (uint64_t)INT64_MAX || (ne[d] && numel > (uint64_t)INT64_MAX / ne[d]))
            return dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%.256s` has dimensions whose product overflows int64", c->shown,
                           name);
        numel *= ne[d];
    }
    if (!rd32(c, &type) || !rd64(c, offset)) return truncated(c, what);
    int ti = type_index(type);
    if (ti < 0)
        return dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%.256s` has unknown GGUF type %u (a newer or corrupt file?)",
                       c->shown, name, type);
    if (ne[0] % (uint64_t)k_types[ti].blk)
        return dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%.256s` of type %s has rows of %llu elements, not a multiple of "
                       "its %lld-element block", c->shown, name, k_types[ti].name, (unsigned long long)ne[0],
                       (long long)k_types[ti].blk);
    uint64_t blocks = numel / (uint64_t)k_types[ti].blk;
    if (blocks > (uint64_t)c->len / k_types[ti].bytes) /* cannot fit the file, and the product would overflow */
        return dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%.256s` needs %llu blocks of %zu bytes, more than the %zu-byte file",
                       c->shown, name, (unsigned long long)blocks, k_types[ti].bytes, c->len);
    if (*offset % g->alignment)
        return dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%.256s` has data offset %llu, not a multiple of the alignment %u",
                       c->shown, name, (unsigned long long)*offset, g->alignment);
    t->type = type;
    t->ndim = (int)ndim;
    for (uint32_t d = 0; d < ndim; d++) t->shape[d] = (int64_t)ne[ndim - 1 - d];
    t->numel = (int64_t)numel;
    t->nbytes = (size_t)(blocks * k_types[ti].bytes);
    return DL_OK;
}

static dl_status parse(dl_gguf *g) {
    cursor c = {g->map.data, g->map.len, 0, g->path};
    uint32_t magic, version;
    if (!rd32(&c, &magic) || magic != 0x46554747u) /* "GGUF" read little-endian */
        return dl_fail(DL_ERR_FORMAT, "`%s`: not a GGUF file (it does not start with \"GGUF\")", g->path);
    if (!rd32(&c, &version)) return truncated(&c, "the header");
    if (version && !(version & 0xffffu))
        return dl_fail(DL_ERR_FORMAT, "`%s`: a big-endian GGUF file; difflet reads little-endian GGUF only", g->path);
    if (version == 1)
        return dl_fail(DL_ERR_FORMAT, "`%s`: GGUF version 1 (32-bit counts, 2023) is not supported; re-convert it "
                       "with a current gguf-py or llama.cpp (versions 2 and 3 are read)", g->path);
    if (version != 2 && version != 3)
        return dl_fail(DL_ERR_FORMAT, "`%s`: GGUF version %u is not supported (versions 2 and 3 are read)", g->path,
                       version);
    g->version = version;
    uint64_t nt, nkv;
    if (!rd64(&c, &nt) || !rd64(&c, &nkv)) return truncated(&c, "the header");
    /* a metadata entry takes at least 13 bytes (key length, type, one byte), a
     * tensor info 32 (name length, n_dims, one dim, type, offset) */
    if (nkv > left(&c) / 13 || nt > left(&c) / 32 || nt > (uint64_t)INT_MAX || nkv > (uint64_t)INT_MAX)
        return dl_fail(DL_ERR_FORMAT, "`%s`: header claims %llu tensors and %llu metadata entries, more than its %zu "
                       "bytes can hold: truncated or corrupt?", g->path, (unsigned long long)nt,
                       (unsigned long long)nkv, c.len);
    g->alignment = 32; /* GGUF's default when general.alignment is absent */
    dl_status s = parse_kv(g, &c, nkv);
    if (s != DL_OK) return s;

    for (uint64_t i = 0; s == DL_OK && i < nt; i++) s = parse_tensor_info(g, &c, i, nt);
    if (s != DL_OK) return s;
    range *ranges = malloc((size_t)(g->n ? g->n : 1) * sizeof *ranges);
    g->by_name = malloc((size_t)(g->n ? g->n : 1) * sizeof *g->by_name);
    if (!ranges || !g->by_name) s = dl_fail(DL_ERR_NOMEM, "`%s`: out of memory", g->path);
    const uint64_t *offs = g->offs;

    /* the data section starts at the next multiple of the alignment */
    size_t start = dl_align_up(c.off, g->alignment);
    if (s == DL_OK && nt && start > c.len)
        s = dl_fail(DL_ERR_FORMAT, "`%s`: tensor data would start at byte %zu of a %zu-byte file: truncated?", g->path,
                    start, c.len);
    uint64_t dlen = start < c.len ? c.len - start : 0;
    int nr = 0;
    for (int i = 0; s == DL_OK && i < g->n; i++) {
        dl_gguf_tensor *t = &g->t[i];
        if (offs[i] > dlen || t->nbytes > dlen - offs[i]) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%.256s` spans data bytes [%llu, %llu) of a %llu-byte data section: "
                        "truncated?", g->path, t->name, (unsigned long long)offs[i],
                        (unsigned long long)(offs[i] + t->nbytes), (unsigned long long)dlen);
            break;
        }
        t->data = g->map.data + start + offs[i];
        if (t->nbytes) ranges[nr++] = (range){offs[i], offs[i] + t->nbytes, i};
    }
    if (s == DL_OK && nr > 1) {
        qsort(ranges, (size_t)nr, sizeof *ranges, range_by_begin);
        for (int i = 1; i < nr; i++)
            if (ranges[i].b < ranges[i - 1].e) {
                s = dl_fail(DL_ERR_FORMAT, "`%s`: tensors `%.256s` and `%.256s` overlap in the data section", g->path,
                            g->t[ranges[i - 1].i].name, g->t[ranges[i].i].name);
                break;
            }
    }
    if (s == DL_OK) {
        for (int i = 0; i < g->n; i++) g->by_name[i] = &g->t[i];
        if (g->n > 1) qsort(g->by_name, (size_t)g->n, sizeof *g->by_name, tensor_by_name);
        for (int i = 1; i < g->n; i++)
            if (!strcmp(g->by_name[i]->name, g->by_name[i - 1]->name)) {
                s = dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%.256s` appears twice", g->path, g->by_name[i]->name);
                break;
            }
    }
    free(ranges);
    return s;
}

void dl_gguf_free(dl_gguf *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++) free((char *)g->t[i].name);
    for (int i = 0; i < g->nkv; i++) free(g->kv[i].key), free(g->kv[i].str);
    free(g->t), free(g->offs), free(g->by_name), free(g->kv);
    if (g->map.data) dl_mmap_close(&g->map);
    free(g->path);
    free(g);
}

dl_status dl_gguf_open(dl_gguf **out, const char *path) {
    *out = NULL;
    dl_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(path))) {
        free(g);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    dl_status s = dl_mmap_open(&g->map, path);
    if (s == DL_OK) s = parse(g);
    if (s != DL_OK) {
        dl_gguf_free(g);
        return s;
    }
    *out = g;
    return DL_OK;
}

int dl_gguf_count(const dl_gguf *g) { return g->n; }
const dl_gguf_tensor *dl_gguf_at(const dl_gguf *g, int i) {
    DL_ASSERT(i >= 0 && i < g->n);
    return &g->t[i];
}
const char *dl_gguf_path(const dl_gguf *g) { return g->path; }

const dl_gguf_tensor *dl_gguf_find(const dl_gguf *g, const char *name) {
    int lo = 0, hi = g->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(g->by_name[mid]->name, name);
        if (!c) return g->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

const char *dl_gguf_get_str(const dl_gguf *g, const char *key) {
    kv_entry k = {.key = (char *)key};
    const kv_entry *e = g->nkv ? bsearch(&k, g->kv, (size_t)g->nkv, sizeof *g->kv, kv_by_key) : NULL;
    return e ? e->str : NULL;
}

/* ---- dequantization ------------------------------------------------------------------ */

static float f16(const uint8_t *p) { return dl_f16_to_f32(le16(p)); }

/* Q4_0, 18 bytes: f16 d, 16 bytes of nibbles: element j low nibble of qs[j], j+16 high. */
static void dq_q4_0(const uint8_t *b, float *y) {
    float d = f16(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((qs[j] & 0x0f) - 8);
        y[j + 16] = d * (float)((qs[j] >> 4) - 8);
    }
}

/* Q4_1, 20 bytes: f16 d, f16 m, nibbles as Q4_0; y = d*q + m. */
static void dq_q4_1(const uint8_t *b, float *y) {
    float d = f16(b), m = f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(qs[j] & 0x0f) + m;
        y[j + 16] = d * (float)(qs[j] >> 4) + m;
    }
}

/* Q5_0, 22 bytes: f16 d, u32 qh (bit j: the 5th bit of element j), nibbles as Q4_0. */
static void dq_q5_0(const uint8_t *b, float *y) {
    float d = f16(b);
    uint32_t qh = le32(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = d * (float)(lo - 16);
        y[j + 16] = d * (float)(hi - 16);
    }
}

/* Q5_1, 24 bytes: f16 d, f16 m, u32 qh, nibbles; y = d*q + m. */
static void dq_q5_1(const uint8_t *b, float *y) {
    float d = f16(b), m = f16(b + 2);
    uint32_t qh = le32(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = d * (float)lo + m;
        y[j + 16] = d * (float)hi + m;
    }
}

/* Q8_0, 34 bytes: f16 d, 32 int8. */
static void dq_q8_0(const uint8_t *b, float *y) {
    float d = f16(b);
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

/* The 8 six-bit scales and mins of a Q4_K/Q5_K super-block, packed in 12 bytes:
 * bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7, bytes
 * 4-7 the same for mins, bytes 8-11 the low 4 bits of scale (low nibble) and min
 * (high nibble) 4-7. */
static void k_scale_min(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 0x3f;
        mn[j] = s[j + 4] & 0x3f;
        sc[j + 4] = (uint8_t)((s[j + 8] & 0x0f) | ((s[j] >> 2) & 0x30));
        mn[j + 4] = (uint8_t)((s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30));
    }
}

/* Q4_K, 144 bytes: f16 d, f16 dmin, 12 bytes of scales, 128 bytes of nibbles. 8
 * sub-blocks of 32: sub-block 2c+h takes nibble h of qs[32c .. 32c+31];
 * y = (d*sc) * q - (dmin*m). */
static void dq_q4_k(const uint8_t *b, float *y) {
    float d = f16(b), dmin = f16(b + 2);
    uint8_t sc[8], mn[8];
    k_scale_min(b + 4, sc, mn);
    const uint8_t *qs = b + 16;
    for (int s = 0; s < 8; s++) {
        float ds = d * (float)sc[s], dm = dmin * (float)mn[s];
        const uint8_t *q = qs + 32 * (s / 2);
        int sh = 4 * (s % 2);
        for (int k = 0; k < 32; k++) y[32 * s + k] = ds * (float)((q[k] >> sh) & 0x0f) - dm;
    }
}

/* Q5_K, 176 bytes: f16 d, f16 dmin, 12 bytes of scales, 32 bytes qh (bit s of qh[k]:
 * the 5th bit of element k of sub-block s), 128 bytes of nibbles as Q4_K. */
static void dq_q5_k(const uint8_t *b, float *y) {
    float d = f16(b), dmin = f16(b + 2);
    uint8_t sc[8], mn[8];
    k_scale_min(b + 4, sc, mn);
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int s = 0; s < 8; s++) {
        float ds = d * (float)sc[s], dm = dmin * (float)mn[s];
        const uint8_t *q = qs + 32 * (s / 2);
        int sh = 4 * (s % 2);
        for (int k = 0; k < 32; k++) {
            int v = ((q[k] >> sh) & 0x0f) | ((qh[k] >> s) & 1) << 4;
            y[32 * s + k] = ds * (float)v - dm;
        }
    }
}

/* Q6_K, 210 bytes: 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8
 * scales, f16 d. Element e = 128c + 32r + k (c half, r quarter): low bits nibble
 * (r/2) of ql[64c + 32(r%2) + k], high bits pair r of qh[32c + k]; q - 32 is scaled
 * by (d * scales[e/16]). */
static void dq_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = f16(b + 208);
    for (int e = 0; e < QK_K; e++) {
        int c = e / 128, r = (e % 128) / 32, k = e % 32;
        int lo = (ql[64 * c + 32 * (r % 2) + k] >> (4 * (r / 2))) & 0x0f;
        int hi = (qh[32 * c + k] >> (2 * r)) & 3;
        float ds = d * (float)sc[e / 16];
        y[e] = ds * (float)((lo | hi << 4) - 32);
    }
}

dl_status dl_gguf_dequant(uint32_t type, const void *src, int64_t n, float *dst) {
    int ti = type_index(type);
    if (ti < 0 || !k_types[ti].supported)
        return dl_fail(DL_ERR_UNSUPPORTED, "GGUF type %s, which difflet cannot read (supported: " SUPPORTED_LIST ")",
                       dl_gguf_type_name(type));
    int64_t blk = k_types[ti].blk;
    if (n < 0 || n % blk)
        return dl_fail(DL_ERR_INVALID, "dequantizing %lld elements of GGUF type %s: not a multiple of its %lld-element "
                       "block", (long long)n, k_types[ti].name, (long long)blk);
    const uint8_t *p = src;
    size_t bb = k_types[ti].bytes;
    switch (type) {
    case DL_GGUF_F32:
        memcpy(dst, p, (size_t)n * 4);
        return DL_OK;
    case DL_GGUF_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = f16(p + 2 * i);
        return DL_OK;
    case DL_GGUF_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = dl_bf16_to_f32(le16(p + 2 * i));
        return DL_OK;
    default: break;
    }
    void (*fn)(const uint8_t *, float *) = NULL;
    switch (type) {
    case DL_GGUF_Q4_0: fn = dq_q4_0; break;
    case DL_GGUF_Q4_1: fn = dq_q4_1; break;
    case DL_GGUF_Q5_0: fn = dq_q5_0; break;
    case DL_GGUF_Q5_1: fn = dq_q5_1; break;
    case DL_GGUF_Q8_0: fn = dq_q8_0; break;
    case DL_GGUF_Q4_K: fn = dq_q4_k; break;
    case DL_GGUF_Q5_K: fn = dq_q5_k; break;
    case DL_GGUF_Q6_K: fn = dq_q6_k; break;
    }
    DL_ASSERT(fn); /* every supported type has a case */
    for (int64_t i = 0; i < n / blk; i++) fn(p + (size_t)i * bb, dst + i * blk);
    return DL_OK;
}

dl_status dl_gguf_read(const dl_gguf *g, const dl_gguf_tensor *t, float *dst) {
    if (!dl_gguf_type_supported(t->type))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: tensor `%s` is of GGUF type %s, which difflet cannot read (supported: "
                       SUPPORTED_LIST ")", g->path, t->name, dl_gguf_type_name(t->type));
    return dl_gguf_dequant(t->type, t->data, t->numel, dst);
}
