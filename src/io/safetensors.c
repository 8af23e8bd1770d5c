/* safetensors: reader (mmap + validated header), sharded checkpoints through an
 * index, and an atomic writer.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON
 *   {"__metadata__": {...}, "<name>": {"dtype": "F32", "shape": [..],
 *    "data_offsets": [begin, end]}, ...}
 * then the data section; offsets are relative to its start. Validation: N within
 * the file and DL_ST_MAX_HEADER, every field of the right type, known dtypes,
 * end - begin == numel * dtype size (overflow-checked), every range inside the data
 * section, no two ranges overlapping. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/gguf.h"
#include "difflet/io.h"

static const struct {
    const char *name;
    size_t size;
} k_dtypes[DL_ST_COUNT] = {
    [DL_ST_F32] = {"F32", 4},     [DL_ST_F16] = {"F16", 2},     [DL_ST_BF16] = {"BF16", 2},
    [DL_ST_F64] = {"F64", 8},     [DL_ST_I64] = {"I64", 8},     [DL_ST_I32] = {"I32", 4},
    [DL_ST_I16] = {"I16", 2},     [DL_ST_I8] = {"I8", 1},       [DL_ST_U64] = {"U64", 8},
    [DL_ST_U32] = {"U32", 4},     [DL_ST_U16] = {"U16", 2},     [DL_ST_U8] = {"U8", 1},
    [DL_ST_BOOL] = {"BOOL", 1},   [DL_ST_F8_E4M3] = {"F8_E4M3", 1}, [DL_ST_F8_E5M2] = {"F8_E5M2", 1},
    [DL_ST_GGUF] = {"GGUF", 0},
};

const char *dl_st_dtype_name(dl_st_dtype dt) { return (unsigned)dt < DL_ST_COUNT ? k_dtypes[dt].name : "?"; }
size_t dl_st_dtype_size(dl_st_dtype dt) { return (unsigned)dt < DL_ST_COUNT ? k_dtypes[dt].size : 0; }

struct dl_checkpoint {
    char *label;
    dl_mmap *maps; /* one per file */
    char **files;
    int nmaps;
    dl_st_tensor *t; /* sorted by name */
    int n, cap;
    void **keep;                 /* what a virtual checkpoint's tensors point into (freed with it) */
    void (**keep_free)(void *);
    int nkeep;
};

static int by_name(const void *a, const void *b) {
    return strcmp(((const dl_st_tensor *)a)->name, ((const dl_st_tensor *)b)->name);
}

void dl_ckpt_free(dl_checkpoint *ck) {
    if (!ck) return;
    for (int i = 0; i < ck->n; i++) free((char *)ck->t[i].name);
    for (int i = 0; i < ck->nmaps; i++) {
        dl_mmap_close(&ck->maps[i]);
        free(ck->files[i]);
    }
    for (int i = ck->nkeep - 1; i >= 0; i--) ck->keep_free[i](ck->keep[i]);
    free(ck->keep), free(ck->keep_free);
    free(ck->maps), free(ck->files), free(ck->t), free(ck->label);
    free(ck);
}

/* An exact non-negative integer from a JSON number (offsets, dims). */
static int json_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    if (!(v >= 0 && v <= 9007199254740992.0) || v != (double)(uint64_t)v) return 0;
    *out = (uint64_t)v;
    return 1;
}

typedef struct {
    uint64_t b, e;
} range;

static int by_begin(const void *a, const void *b) {
    const range *x = a, *y = b;
    return x->b < y->b ? -1 : x->b > y->b ? 1 : (x->e > y->e) - (x->e < y->e);
}

/* Parse one mapped file and append its tensors. `shown` names it in messages. */
static dl_status parse_file(dl_checkpoint *ck, const dl_mmap *m, const char *shown) {
    if (m->len < 8)
        return dl_fail(DL_ERR_FORMAT, "`%s`: %zu bytes is too short for a safetensors header", shown, m->len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | m->data[i];
    if (hlen > DL_ST_MAX_HEADER)
        return dl_fail(DL_ERR_FORMAT, "`%s`: header of %llu bytes exceeds the %u-byte limit (not a safetensors file?)",
                       shown, (unsigned long long)hlen, DL_ST_MAX_HEADER);
    if (hlen > m->len - 8)
        return dl_fail(DL_ERR_FORMAT, "`%s`: header of %llu bytes is larger than the file (%zu bytes): truncated?",
                       shown, (unsigned long long)hlen, m->len);
    const uint8_t *data = m->data + 8 + hlen;
    uint64_t dlen = m->len - 8 - hlen;
    const char *hdr = (const char *)m->data + 8, *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    int trailing = 0; /* only whitespace (the writer's padding) may follow the object */
    for (const char *p = end; root && p < hdr + hlen; p++) trailing |= !(*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t');
    if (!root || !cJSON_IsObject(root) || trailing) {
        cJSON_Delete(root);
        return dl_fail(DL_ERR_FORMAT, "`%s`: header is not a JSON object%s", shown, trailing ? " (bytes follow it)" : "");
    }
    dl_status s = DL_OK;
    int count = cJSON_GetArraySize(root), first = ck->n, nr = 0;
    range *ranges = calloc((size_t)count + 1, sizeof *ranges);
    if (ck->n + count > ck->cap) {
        int cap = ck->n + count + 16;
        dl_st_tensor *t = realloc(ck->t, (size_t)cap * sizeof *t);
        if (!t || !ranges) {
            free(ranges);
            cJSON_Delete(root);
            if (t) ck->t = t;
            return dl_fail(DL_ERR_NOMEM, "`%s`: out of memory", shown);
        }
        ck->t = t;
        ck->cap = cap;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        const char *name = e->string;
        if (!strcmp(name, "__metadata__")) {
            if (!cJSON_IsObject(e)) {
                s = dl_fail(DL_ERR_FORMAT, "`%s`: __metadata__ is not an object", shown);
                break;
            }
            continue;
        }
        const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsObject(e) || !cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo) ||
            cJSON_GetArraySize(jo) != 2) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` needs dtype, shape and data_offsets [begin, end]", shown, name);
            break;
        }
        dl_st_tensor t = {0};
        t.dtype = DL_ST_COUNT;
        for (int d = 0; d < DL_ST_GGUF; d++) /* the safetensors dtypes */
            if (!strcmp(jd->valuestring, k_dtypes[d].name)) t.dtype = (dl_st_dtype)d;
        if (t.dtype == DL_ST_COUNT) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` has unknown dtype \"%.32s\"", shown, name, jd->valuestring);
            break;
        }
        t.ndim = cJSON_GetArraySize(js);
        if (t.ndim > DL_ST_MAX_DIMS) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` has %d dimensions (at most %d)", shown, name, t.ndim, DL_ST_MAX_DIMS);
            break;
        }
        uint64_t numel = 1, b, en;
        int ok = 1;
        for (int d = 0; d < t.ndim && ok; d++) {
            uint64_t v;
            ok = json_u64(cJSON_GetArrayItem(js, d), &v) && v <= (uint64_t)INT64_MAX;
            if (ok && v && numel > UINT64_MAX / v) ok = 0;
            if (ok) {
                t.shape[d] = (int64_t)v;
                numel *= v;
            }
        }
        if (!ok) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` has an invalid shape", shown, name);
            break;
        }
        if (!json_u64(cJSON_GetArrayItem(jo, 0), &b) || !json_u64(cJSON_GetArrayItem(jo, 1), &en) || en < b) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` has invalid data_offsets", shown, name);
            break;
        }
        size_t es = k_dtypes[t.dtype].size;
        if (numel > UINT64_MAX / es || numel * es != en - b) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` spans %llu bytes, its shape and dtype need %llu", shown, name,
                        (unsigned long long)(en - b), (unsigned long long)(numel * es));
            break;
        }
        if (en > dlen) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` ends at byte %llu of a %llu-byte data section: truncated file?",
                        shown, name, (unsigned long long)en, (unsigned long long)dlen);
            break;
        }
        t.name = strdup(name);
        if (!t.name) {
            s = dl_fail(DL_ERR_NOMEM, "out of memory");
            break;
        }
        t.numel = (int64_t)numel;
        t.data = data + b;
        t.nbytes = (size_t)(en - b);
        t.file = shown;
        ck->t[ck->n++] = t;
        ranges[nr++] = (range){b, en};
    }
    if (s == DL_OK) {
        if (nr > 1) qsort(ranges, (size_t)nr, sizeof *ranges, by_begin);
        for (int i = 1; i < nr; i++)
            if (ranges[i].b < ranges[i - 1].e) {
                s = dl_fail(DL_ERR_FORMAT, "`%s`: tensors overlap at data bytes [%llu, %llu)", shown,
                            (unsigned long long)ranges[i].b, (unsigned long long)ranges[i - 1].e);
                break;
            }
    }
    (void)first;
    free(ranges);
    cJSON_Delete(root);
    return s;
}

static dl_status add_map(dl_checkpoint *ck, const char *path, const char *shown_name) {
    dl_mmap *maps = realloc(ck->maps, (size_t)(ck->nmaps + 1) * sizeof *maps);
    if (maps) ck->maps = maps;
    char **files = realloc(ck->files, (size_t)(ck->nmaps + 1) * sizeof *files);
    if (files) ck->files = files;
    if (!maps || !files) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_status s = dl_mmap_open(&ck->maps[ck->nmaps], path);
    if (s != DL_OK) return s;
    ck->files[ck->nmaps] = strdup(shown_name);
    if (!ck->files[ck->nmaps]) {
        dl_mmap_close(&ck->maps[ck->nmaps]);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    ck->nmaps++;
    return parse_file(ck, &ck->maps[ck->nmaps - 1], ck->files[ck->nmaps - 1]);
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Sharded: the index maps each tensor to a shard file beside it. */
static dl_status open_index(dl_checkpoint *ck, const char *path) {
    char *txt;
    size_t len;
    dl_status s = dl_file_read(path, 64u << 20, &txt, &len);
    if (s != DL_OK) return s;
    cJSON *root = cJSON_ParseWithLength(txt, len);
    free(txt);
    const cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return dl_fail(DL_ERR_FORMAT, "`%s`: not a JSON object with a \"weight_map\"", ck->label);
    }
    const char *slash = strrchr(path, '/');
    size_t dirlen = slash ? (size_t)(slash - path + 1) : 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) { /* open each distinct shard once */
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !ends_with(e->valuestring, ".safetensors")) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: weight_map entry for `%s` must name a .safetensors file beside the index",
                        ck->label, e->string);
            break;
        }
        int seen = 0;
        for (int i = 0; i < ck->nmaps && !seen; i++) {
            const char *f = strrchr(ck->files[i], '/');
            seen = !strcmp(f ? f + 1 : ck->files[i], e->valuestring);
        }
        if (seen) continue;
        char full[4096], shown[4096];
        snprintf(full, sizeof full, "%.*s%s", (int)dirlen, path, e->valuestring);
        const char *ls = strrchr(ck->label, '/');
        snprintf(shown, sizeof shown, "%.*s%s", ls ? (int)(ls - ck->label + 1) : 0, ck->label, e->valuestring);
        if ((s = add_map(ck, full, shown)) != DL_OK) break;
    }
    if (s == DL_OK) { /* every tensor the index names must be in the shard it names */
        if (ck->n > 1) qsort(ck->t, (size_t)ck->n, sizeof *ck->t, by_name);
        cJSON_ArrayForEach(e, wm) {
            const dl_st_tensor *t = dl_ckpt_find(ck, e->string);
            if (!t || !ends_with(t->file, e->valuestring)) {
                s = dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` is not in %s", ck->label, e->string, e->valuestring);
                break;
            }
        }
    }
    cJSON_Delete(root);
    return s;
}

dl_status dl_ckpt_open(dl_checkpoint **out, const char *path, const char *label) {
    *out = NULL;
    dl_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck) return dl_fail(DL_ERR_NOMEM, "out of memory");
    ck->label = strdup(label ? label : path);
    if (!ck->label) {
        free(ck);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    dl_status s = ends_with(path, ".json") ? open_index(ck, path) : add_map(ck, path, ck->label);
    if (s == DL_OK) {
        if (ck->n > 1) qsort(ck->t, (size_t)ck->n, sizeof *ck->t, by_name);
        for (int i = 1; i < ck->n; i++)
            if (!strcmp(ck->t[i].name, ck->t[i - 1].name)) {
                s = dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` appears twice", ck->label, ck->t[i].name);
                break;
            }
    }
    if (s != DL_OK) {
        dl_ckpt_free(ck);
        return s;
    }
    *out = ck;
    return DL_OK;
}

int dl_ckpt_count(const dl_checkpoint *ck) { return ck->n; }
const dl_st_tensor *dl_ckpt_at(const dl_checkpoint *ck, int i) { return &ck->t[i]; }
const char *dl_ckpt_label(const dl_checkpoint *ck) { return ck->label; }

const dl_st_tensor *dl_ckpt_find(const dl_checkpoint *ck, const char *name) {
    dl_st_tensor key = {.name = name};
    return ck->n ? bsearch(&key, ck->t, (size_t)ck->n, sizeof *ck->t, by_name) : NULL;
}

static void fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

dl_status dl_ckpt_expect(const dl_checkpoint *ck, const char *name, int ndim, const int64_t *shape,
                         const dl_st_tensor **out) {
    char want[160], have[160];
    fmt_shape(want, sizeof want, ndim, shape);
    const dl_st_tensor *t = dl_ckpt_find(ck, name);
    if (out) *out = NULL;
    if (!t) return dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` is missing (config expects shape %s)", ck->label, name, want);
    if (t->dtype == DL_ST_GGUF && !dl_gguf_type_supported(t->qtype))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: tensor `%s` is of GGUF type %s, which difflet cannot read (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)",
                       t->file, name, dl_gguf_type_name(t->qtype));
    if (t->dtype != DL_ST_F32 && t->dtype != DL_ST_F16 && t->dtype != DL_ST_BF16 && t->dtype != DL_ST_GGUF)
        return dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` has dtype %s, expected F32, F16 or BF16", t->file, name,
                       dl_st_dtype_name(t->dtype));
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        fmt_shape(have, sizeof have, t->ndim, t->shape);
        return dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` has shape %s, config expects %s", t->file, name, have, want);
    }
    if (out) *out = t;
    return DL_OK;
}

/* a GGUF block-quantized tensor dequantized (f32), then converted to dt in slices */
static dl_status gguf_read(const dl_st_tensor *t, dl_dtype dt, void *dst) {
    if (!dl_gguf_type_supported(t->qtype))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: tensor `%s` is of GGUF type %s, which difflet cannot read", t->file, t->name,
                       dl_gguf_type_name(t->qtype));
    if (dt == DL_F32) return dl_gguf_dequant(t->qtype, t->data, t->numel, dst);
    const int64_t be = dl_gguf_block_elems(t->qtype), chunk = be * 1024;
    const size_t bb = dl_gguf_block_bytes(t->qtype);
    float *tmp = malloc((size_t)chunk * sizeof *tmp);
    if (!tmp) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_status s = DL_OK;
    for (int64_t i = 0; i < t->numel && s == DL_OK; i += chunk) {
        int64_t n = t->numel - i < chunk ? t->numel - i : chunk;
        s = dl_gguf_dequant(t->qtype, t->data + (size_t)(i / be) * bb, n, tmp);
        for (int64_t k = 0; s == DL_OK && k < n; k++)
            ((uint16_t *)dst)[i + k] = dt == DL_BF16 ? dl_f32_to_bf16(tmp[k]) : dl_f32_to_f16(tmp[k]);
    }
    free(tmp);
    return s;
}

/* ---- checkpoints made of described tensors (GGUF import) ----------------------------- */

dl_status dl_ckpt_new_virtual(dl_checkpoint **out, const char *label) {
    dl_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->label = strdup(label))) {
        free(ck);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    *out = ck;
    return DL_OK;
}

dl_status dl_ckpt_add(dl_checkpoint *ck, const dl_st_tensor *t) {
    if (ck->n == ck->cap) {
        int cap = ck->cap ? 2 * ck->cap : 64;
        dl_st_tensor *nt = realloc(ck->t, (size_t)cap * sizeof *nt);
        if (!nt) return dl_fail(DL_ERR_NOMEM, "out of memory");
        ck->t = nt, ck->cap = cap;
    }
    ck->t[ck->n] = *t;
    if (!(ck->t[ck->n].name = strdup(t->name))) return dl_fail(DL_ERR_NOMEM, "out of memory");
    ck->n++;
    return DL_OK;
}

dl_status dl_ckpt_keep(dl_checkpoint *ck, void *p, void (*release)(void *)) {
    void **k = realloc(ck->keep, (size_t)(ck->nkeep + 1) * sizeof *k);
    void (**r)(void *) = k ? realloc(ck->keep_free, (size_t)(ck->nkeep + 1) * sizeof *r) : NULL;
    if (k) ck->keep = k;
    if (!k || !r) {
        release(p);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    ck->keep_free = r;
    ck->keep[ck->nkeep] = p, ck->keep_free[ck->nkeep] = release;
    ck->nkeep++;
    return DL_OK;
}

dl_status dl_ckpt_seal(dl_checkpoint *ck) {
    qsort(ck->t, (size_t)ck->n, sizeof *ck->t, by_name);
    for (int i = 1; i < ck->n; i++)
        if (!strcmp(ck->t[i - 1].name, ck->t[i].name))
            return dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` twice", ck->label, ck->t[i].name);
    return DL_OK;
}

dl_status dl_ckpt_read(const dl_st_tensor *t, dl_dtype dt, void *dst) {
    if (t->dtype == DL_ST_GGUF) return gguf_read(t, dt, dst);
    if (t->dtype != DL_ST_F32 && t->dtype != DL_ST_F16 && t->dtype != DL_ST_BF16)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: tensor `%s` has dtype %s, which difflet does not compute with", t->file,
                       t->name, dl_st_dtype_name(t->dtype));
    dl_dtype src = t->dtype == DL_ST_F32 ? DL_F32 : t->dtype == DL_ST_F16 ? DL_F16 : DL_BF16;
    if (src == dt) {
        memcpy(dst, t->data, t->nbytes);
        return DL_OK;
    }
    /* the mapped data need not be aligned: read each element with memcpy */
    for (int64_t i = 0; i < t->numel; i++) {
        float v;
        if (src == DL_F32) {
            memcpy(&v, t->data + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, t->data + 2 * i, 2);
            v = src == DL_F16 ? dl_f16_to_f32(h) : dl_bf16_to_f32(h);
        }
        if (dt == DL_F32) ((float *)dst)[i] = v;
        else ((uint16_t *)dst)[i] = dt == DL_BF16 ? dl_f32_to_bf16(v) : dl_f32_to_f16(v);
    }
    return DL_OK;
}

uint64_t dl_ckpt_content_hash(const dl_checkpoint *ck) {
    dl_hasher *h = dl_hasher_new(0x646966666c6574ull);
    DL_ASSERT(h);
    for (int i = 0; i < ck->n; i++) {
        const dl_st_tensor *t = &ck->t[i];
        dl_hasher_update(h, t->name, strlen(t->name) + 1);
        uint8_t meta[2 + 8 * DL_ST_MAX_DIMS] = {(uint8_t)t->dtype, (uint8_t)t->ndim};
        for (int d = 0; d < t->ndim; d++)
            for (int b = 0; b < 8; b++) meta[2 + 8 * d + b] = (uint8_t)((uint64_t)t->shape[d] >> (8 * b));
        dl_hasher_update(h, meta, sizeof meta);
        if (t->dtype == DL_ST_GGUF) { /* the block type too (safetensors keys stay as they were) */
            uint8_t q[4] = {(uint8_t)t->qtype, (uint8_t)(t->qtype >> 8), (uint8_t)(t->qtype >> 16), (uint8_t)(t->qtype >> 24)};
            dl_hasher_update(h, q, sizeof q);
        }
        dl_hasher_update(h, t->data, t->nbytes);
    }
    uint64_t v = dl_hasher_digest(h);
    dl_hasher_free(h);
    return v;
}

/* ---- writer ------------------------------------------------------------------------ */

typedef struct {
    char *name;
    dl_st_dtype dt;
    int ndim;
    int64_t shape[DL_ST_MAX_DIMS];
    const void *data;
    size_t nbytes;
} wentry;

struct dl_st_writer {
    wentry *e;
    int n, cap;
    cJSON *meta;
};

dl_st_writer *dl_st_writer_new(void) { return calloc(1, sizeof(dl_st_writer)); }

void dl_st_writer_free(dl_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->e[i].name);
    free(w->e);
    cJSON_Delete(w->meta);
    free(w);
}

dl_status dl_st_writer_add(dl_st_writer *w, const char *name, dl_st_dtype dt, int ndim, const int64_t *shape,
                           const void *data) {
    if ((unsigned)dt >= DL_ST_GGUF || ndim < 0 || ndim > DL_ST_MAX_DIMS || !strcmp(name, "__metadata__"))
        return dl_fail(DL_ERR_INVALID, "safetensors writer: bad tensor `%s`", name);
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->e[i].name, name)) return dl_fail(DL_ERR_INVALID, "safetensors writer: `%s` added twice", name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        wentry *e = realloc(w->e, (size_t)cap * sizeof *e);
        if (!e) return dl_fail(DL_ERR_NOMEM, "out of memory");
        w->e = e;
        w->cap = cap;
    }
    wentry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    if (!e->name) return dl_fail(DL_ERR_NOMEM, "out of memory");
    e->dt = dt;
    e->ndim = ndim;
    size_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) {
            free(e->name);
            return dl_fail(DL_ERR_INVALID, "safetensors writer: `%s` has a negative dimension", name);
        }
        e->shape[d] = shape[d];
        numel *= (size_t)shape[d];
    }
    e->data = data;
    e->nbytes = numel * k_dtypes[dt].size;
    w->n++;
    return DL_OK;
}

dl_status dl_st_writer_meta(dl_st_writer *w, const char *key, const char *value) {
    if (!w->meta && !(w->meta = cJSON_CreateObject())) return dl_fail(DL_ERR_NOMEM, "out of memory");
    cJSON_DeleteItemFromObjectCaseSensitive(w->meta, key);
    if (!cJSON_AddStringToObject(w->meta, key, value)) return dl_fail(DL_ERR_NOMEM, "out of memory");
    return DL_OK;
}

static int wentry_by_name(const void *a, const void *b) {
    return strcmp(((const wentry *)a)->name, ((const wentry *)b)->name);
}

dl_status dl_st_writer_save(dl_st_writer *w, const char *path) {
    if (w->n > 1) qsort(w->e, (size_t)w->n, sizeof *w->e, wentry_by_name);
    cJSON *root = cJSON_CreateObject();
    if (!root) return dl_fail(DL_ERR_NOMEM, "out of memory");
    if (w->meta) cJSON_AddItemReferenceToObject(root, "__metadata__", w->meta);
    uint64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const wentry *e = &w->e[i];
        cJSON *t = cJSON_AddObjectToObject(root, e->name);
        cJSON *shape = t ? cJSON_AddArrayToObject(t, "shape") : NULL;
        cJSON *offs = t ? cJSON_AddArrayToObject(t, "data_offsets") : NULL;
        if (!t || !shape || !offs || !cJSON_AddStringToObject(t, "dtype", k_dtypes[e->dt].name)) {
            cJSON_Delete(root);
            return dl_fail(DL_ERR_NOMEM, "out of memory");
        }
        for (int d = 0; d < e->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e->shape[d]));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + e->nbytes)));
        off += e->nbytes;
    }
    char *hdr = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!hdr) return dl_fail(DL_ERR_NOMEM, "out of memory");
    size_t hl = strlen(hdr), padded = dl_align_up(hl, 8); /* data section 8-byte aligned */
    char *buf = malloc(8 + padded);
    if (!buf) {
        free(hdr);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    for (int b = 0; b < 8; b++) buf[b] = (char)(((uint64_t)padded >> (8 * b)) & 0xff);
    memcpy(buf + 8, hdr, hl);
    memset(buf + 8 + hl, ' ', padded - hl);
    free(hdr);
    dl_atomic_file f;
    dl_status s = dl_atomic_open(&f, path);
    if (s == DL_OK) s = dl_atomic_write(&f, buf, 8 + padded);
    for (int i = 0; s == DL_OK && i < w->n; i++) s = dl_atomic_write(&f, w->e[i].data, w->e[i].nbytes);
    free(buf);
    if (s != DL_OK) {
        if (f.tmp) dl_atomic_abort(&f);
        return s;
    }
    return dl_atomic_commit(&f);
}
