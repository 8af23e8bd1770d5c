/* Matmul and convolution through oneDNN (Debian's libdnnl, v2 C API).
 *
 * Weights are converted to the compute dtype and reordered once, at creation, into
 * the layout oneDNN picks for the shape (format_tag_any); every buffer a run needs
 * (packed weights, scratchpad) is allocated at creation, so a run allocates
 * nothing. Activations are plain row-major (matmul) or channels-first (conv).
 *
 * Packed weights travel with their layout. oneDNN's choice of blocking depends on
 * more than the shape (the AMX brgemm matmul picks its N block by thread count), so
 * a program artifact records the exact memory descriptor of every packed tensor
 * (dl_packed.layout) and a later process, whatever its threads or rank layout, uses
 * the weights in place when its primitive wants that layout or accepts it pinned
 * with the same implementation, and otherwise reorders them once at load (correct
 * on any machine, one copy of the weights).
 *
 * bf16 on CPUs without AVX-512 (oneDNN 2.6 implements bf16 matmul and conv only
 * from avx512_core up): the primitive is created in f32 over weights rounded to
 * bf16, and each run widens the bf16 input to f32 and rounds the output back, so
 * the arithmetic is the one a bf16 primitive does (bf16 operands, f32
 * accumulation). The f32 staging buffer is shared by every emulated primitive of
 * the process and sized at creation.
 *
 * The f32 products of a matmul (and the emulated bf16 ones) whose packed weights
 * oneDNN keeps plain ([K, N] row-major: its f32 gemm below AVX-512) run through
 * OpenBLAS's sgemm (Debian's OpenMP build, sharing difflet's pool) when M >= 32:
 * measured 10-16 % faster than oneDNN 2.6's f32 gemm at DiT shapes on an AVX2 EPYC
 * (docs/kernels.md). The bytes, the layout record and the artifact are oneDNN's, so
 * a program does not depend on which GEMM runs it; bias and activation run after
 * the product, a row at a time. DIFFLET_GEMM=onednn keeps every product in oneDNN. */
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_impl.h"
#include "kernels/onednn_impl.h"

dnnl_engine_t dl_dnnl_eng;
dnnl_stream_t dl_dnnl_stream;
static dnnl_status_t g_init_status = dnnl_success;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_once(void) {
    g_init_status = dnnl_engine_create(&dl_dnnl_eng, dnnl_cpu, 0);
    if (g_init_status == dnnl_success)
        g_init_status = dnnl_stream_create(&dl_dnnl_stream, dl_dnnl_eng, dnnl_stream_default_flags);
}

dl_status dl_dnnl_engine(void) {
    pthread_once(&g_once, init_once);
    if (g_init_status != dnnl_success)
        return dl_fail(DL_ERR_BACKEND, "oneDNN: cannot create the CPU engine (status %d)", (int)g_init_status);
    return DL_OK;
}

const char *dl_onednn_version(void) {
    static char buf[32];
    const dnnl_version_t *v = dnnl_version();
    snprintf(buf, sizeof buf, "%d.%d.%d", v->major, v->minor, v->patch);
    return buf;
}

const char *dl_onednn_isa(void) {
    /* the ISA oneDNN dispatches to: the CPU's best, lowered by ONEDNN_MAX_CPU_ISA */
    const dl_cpu_features *f = dl_cpu();
    dnnl_cpu_isa_t lim = dnnl_get_effective_cpu_isa();
    int amx = f->amx_bf16, bf16 = f->avx512_bf16, a512 = f->avx512f, a2 = f->avx2_fma;
    if (lim != dnnl_cpu_isa_all) {
        amx &= (lim & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
        bf16 &= (lim & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
        a512 &= (lim & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
        a2 &= (lim & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2;
    }
    return amx && bf16 ? "avx512-amx" : bf16 ? "avx512-bf16" : a512 ? "avx512" : a2 ? "avx2" : "sse41";
}

dnnl_data_type_t dl_dnnl_dt(dl_dtype dt) {
    switch (dt) {
    case DL_F32: return dnnl_f32;
    case DL_BF16: return dnnl_bf16;
    case DL_F16: return dnnl_f16;
    }
    return dnnl_f32;
}


/* ---- packed-layout records -----------------------------------------------------------
 * A blocked memory descriptor as a sequence of little-endian int64 fields (never the
 * struct's bytes): magic, version, ndims, dims, data type, padded dims, padded
 * offsets, offset0, strides, inner block count, inner blocks, inner indices, extra
 * flags, compensation mask, scale adjust (float bits), asymmetric compensation mask. */
#define MD_MAGIC 0x444d4c44 /* "DLMD" */
#define MD_VERSION 1

size_t dl_dnnl_md_serialize(const dnnl_memory_desc_t *md, int64_t *f) {
    size_t n = 0;
    const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
    f[n++] = MD_MAGIC;
    f[n++] = MD_VERSION;
    f[n++] = md->ndims;
    for (int i = 0; i < md->ndims; i++) f[n++] = md->dims[i];
    f[n++] = md->data_type;
    for (int i = 0; i < md->ndims; i++) f[n++] = md->padded_dims[i];
    for (int i = 0; i < md->ndims; i++) f[n++] = md->padded_offsets[i];
    f[n++] = md->offset0;
    for (int i = 0; i < md->ndims; i++) f[n++] = b->strides[i];
    f[n++] = b->inner_nblks;
    for (int i = 0; i < b->inner_nblks; i++) f[n++] = b->inner_blks[i];
    for (int i = 0; i < b->inner_nblks; i++) f[n++] = b->inner_idxs[i];
    f[n++] = (int64_t)md->extra.flags;
    f[n++] = md->extra.compensation_mask;
    uint32_t sa;
    memcpy(&sa, &md->extra.scale_adjust, 4);
    f[n++] = sa;
    f[n++] = md->extra.asymm_compensation_mask;
    return n;
}

/* Parse a record made by md_serialize; it must describe `want_dims` and fit in
 * `bytes` of weights. */
dl_status dl_dnnl_md_parse(const void *rec, size_t rec_bytes, const dnnl_memory_desc_t *plain, size_t bytes,
                          dnnl_memory_desc_t *md) {
    int64_t f[MD_MAX_FIELDS];
    size_t nf = rec_bytes / 8, n = 0;
    if (rec_bytes % 8 || nf > MD_MAX_FIELDS || nf < 3) goto bad;
    memcpy(f, rec, rec_bytes);
    memset(md, 0, sizeof *md);
#define NEXT(v)                 \
    do {                        \
        if (n >= nf) goto bad;  \
        (v) = f[n++];           \
    } while (0)
    int64_t magic, ver, nd, v;
    NEXT(magic);
    NEXT(ver);
    NEXT(nd);
    if (magic != MD_MAGIC || ver != MD_VERSION || nd != plain->ndims) goto bad;
    md->ndims = (int)nd;
    for (int i = 0; i < nd; i++) {
        NEXT(md->dims[i]);
        if (md->dims[i] != plain->dims[i]) goto bad;
    }
    NEXT(v);
    if (v != dnnl_f32 && v != dnnl_bf16 && v != dnnl_f16 && v != dnnl_s8) goto bad;
    md->data_type = (dnnl_data_type_t)v;
    for (int i = 0; i < nd; i++) {
        NEXT(md->padded_dims[i]);
        if (md->padded_dims[i] < md->dims[i] || md->padded_dims[i] > 4 * md->dims[i] + 64) goto bad;
    }
    for (int i = 0; i < nd; i++) NEXT(md->padded_offsets[i]);
    NEXT(md->offset0);
    md->format_kind = dnnl_blocked;
    dnnl_blocking_desc_t *b = &md->format_desc.blocking;
    for (int i = 0; i < nd; i++) NEXT(b->strides[i]);
    NEXT(v);
    if (v < 0 || v > DNNL_MAX_NDIMS) goto bad;
    b->inner_nblks = (int)v;
    for (int i = 0; i < b->inner_nblks; i++) {
        NEXT(b->inner_blks[i]);
        if (b->inner_blks[i] <= 0 || b->inner_blks[i] > 1024) goto bad;
    }
    for (int i = 0; i < b->inner_nblks; i++) {
        NEXT(b->inner_idxs[i]);
        if (b->inner_idxs[i] < 0 || b->inner_idxs[i] >= nd) goto bad;
    }
    NEXT(v);
    md->extra.flags = (uint64_t)v;
    NEXT(v);
    md->extra.compensation_mask = (int)v;
    NEXT(v);
    uint32_t sa = (uint32_t)v;
    memcpy(&md->extra.scale_adjust, &sa, 4);
    NEXT(v);
    md->extra.asymm_compensation_mask = (int)v;
#undef NEXT
    if (n != nf || dnnl_memory_desc_get_size(md) != bytes) goto bad;
    return DL_OK;
bad:
    return dl_fail(DL_ERR_FORMAT, "packed weights: the recorded layout is malformed or does not describe %zu bytes "
                   "of this shape (compiled by another difflet or oneDNN?)", bytes);
}

size_t dl_onednn_plain_record(int64_t k, int64_t n, dl_dtype dt, void *rec) {
    dnnl_memory_desc_t md;
    dnnl_dims_t wdims = {k, n}, wstr = {1, k};
    if (dnnl_memory_desc_init_by_strides(&md, 2, wdims, dl_dnnl_dt(dt), wstr) != dnnl_success) return 0;
    int64_t f[MD_MAX_FIELDS];
    size_t nb = dl_dnnl_md_serialize(&md, f) * 8;
    memcpy(rec, f, nb);
    return nb;
}

/* ---- the bf16-emulation staging buffer ------------------------------------------------ */
static dl_staging g_emu = {.lock = PTHREAD_MUTEX_INITIALIZER};

dl_status dl_staging_reserve(dl_staging *st, size_t bytes, const char *what) {
    dl_status s = DL_OK;
    pthread_mutex_lock(&st->lock);
    if (bytes > st->cap) {
        void *nb = dl_aligned_alloc(bytes);
        if (!nb) {
            s = dl_fail(DL_ERR_NOMEM, "oneDNN: cannot allocate %zu bytes of %s staging", bytes, what);
        } else {
            dl_aligned_free(st->buf);
            st->buf = nb;
            st->cap = bytes;
        }
    }
    pthread_mutex_unlock(&st->lock);
    return s;
}

/* rows x cols between strided bf16 (or f32) and contiguous f32, on the pool */
typedef struct {
    dl_dtype dd, sd;
    void *dst;
    const void *src;
    int64_t rows, cols, ldd, lds;
} conv_rows;

static void conv_rows_fn(void *ctx, int ith, int nth) {
    const conv_rows *c = ctx;
    int64_t b, e;
    if (c->rows == 1) { /* one long row: split its elements */
        dl_split(c->cols, ith, nth, &b, &e);
        if (e > b)
            dl_kernels()->convert(c->dd, (char *)c->dst + (size_t)b * dl_dtype_size(c->dd), c->sd,
                                  (const char *)c->src + (size_t)b * dl_dtype_size(c->sd), e - b);
        return;
    }
    dl_split(c->rows, ith, nth, &b, &e);
    for (int64_t r = b; r < e; r++)
        dl_kernels()->convert(c->dd, (char *)c->dst + (size_t)(r * c->ldd) * dl_dtype_size(c->dd), c->sd,
                              (const char *)c->src + (size_t)(r * c->lds) * dl_dtype_size(c->sd), c->cols);
}

static void convert_rows(dl_dtype dd, void *dst, int64_t ldd, dl_dtype sd, const void *src, int64_t lds,
                         int64_t rows, int64_t cols) {
    conv_rows c = {dd, sd, dst, src, rows, cols, ldd, lds};
    dl_parallel(conv_rows_fn, &c);
}

/* ---- what matmul and conv share --------------------------------------------------------- */

/* An operation's descriptors, made for a compute dtype and a weights descriptor
 * (NULL: format_any). `emu`: the f32 primitive standing in for bf16. */
typedef struct op_spec op_spec;
struct op_spec {
    dnnl_status_t (*make_pd)(const op_spec *op, dl_dtype cdt, int emu, const dnnl_memory_desc_t *wei,
                             dnnl_primitive_attr_t attr, dnnl_primitive_desc_t *pd);
    void (*plain_w)(const op_spec *op, dl_dtype cdt, dnnl_memory_desc_t *md); /* the user weights layout */
    /* the caller's activation layouts when the primitive picks its own (NULL: it
     * takes the caller's) */
    void (*plain_io)(const op_spec *op, dl_dtype cdt, dnnl_memory_desc_t *src, dnnl_memory_desc_t *dst);
    int64_t wn; /* weight elements */
    int is_matmul;
    int has_bias;
    dl_act act;
    union {
        dl_matmul_desc mm;
        dl_conv_desc cv;
    } u;
};

typedef struct {
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, bias, dst, scratch;
    void *wbuf, *sbuf, *bbuf;
    const void *wext; /* packed weights owned by the caller (artifact mapping) */
    size_t wbytes;
    int64_t layout[MD_MAX_FIELDS]; /* the packed weights' descriptor, serialized */
    dnnl_memory_desc_t wmd;        /* ... and as oneDNN describes it */
    size_t layout_bytes;
    int emu;          /* bf16 emulated in f32: inputs widened, outputs rounded */
    size_t emu_src_bytes;
    /* activations in the primitive's own (blocked) layout, reordered from and to the
     * caller's plain ones around each run (convolutions: see io_blocked) */
    dnnl_primitive_t r_in, r_out;
    dnnl_memory_t x_plain, x_blk, y_blk, y_plain;
    size_t blk_src_bytes;
    int serial; /* im2col + sgemm (a convolution's last resort): run on one thread, whose sums are the same */
} prim_state;

static void prim_state_free(prim_state *p) {
    if (p->prim) dnnl_primitive_destroy(p->prim);
    if (p->r_in) dnnl_primitive_destroy(p->r_in);
    if (p->r_out) dnnl_primitive_destroy(p->r_out);
    dnnl_memory_t mems[] = {p->src, p->wei, p->bias, p->dst, p->scratch, p->x_plain, p->x_blk, p->y_blk, p->y_plain};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
        if (mems[i]) dnnl_memory_destroy(mems[i]);
    dl_aligned_free(p->wbuf);
    dl_aligned_free(p->sbuf);
    dl_aligned_free(p->bbuf);
    memset(p, 0, sizeof *p);
}

/* Attributes: user scratchpad and an optional eltwise post-op. */
static dl_status make_attr(dnnl_primitive_attr_t *attr, dl_act act) {
    dl_status s = DL_OK;
    dnnl_post_ops_t po = NULL;
    *attr = NULL;
    DNNL_TRY(dnnl_primitive_attr_create(attr), "attr create");
    DNNL_TRY(dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user), "scratchpad mode");
    if (act != DL_ACT_NONE) {
        /* quick_gelu = swish with alpha 1.702; silu = swish with alpha 1 */
        dnnl_alg_kind_t alg = act == DL_ACT_GELU_TANH ? dnnl_eltwise_gelu_tanh
                              : act == DL_ACT_GELU_ERF ? dnnl_eltwise_gelu_erf
                              : act == DL_ACT_RELU     ? dnnl_eltwise_relu
                                                       : dnnl_eltwise_swish;
        float alpha = act == DL_ACT_QUICK_GELU ? 1.702f : act == DL_ACT_RELU ? 0.f : 1.f;
        DNNL_TRY(dnnl_post_ops_create(&po), "post-ops create");
        DNNL_TRY(dnnl_post_ops_append_eltwise(po, 1.f, alg, alpha, 0.f), "eltwise post-op");
        DNNL_TRY(dnnl_primitive_attr_set_post_ops(*attr, po), "set post-ops");
    }
err:
    if (po) dnnl_post_ops_destroy(po);
    return s;
}

const char *dl_dnnl_impl(const_dnnl_primitive_desc_t pd) {
    const char *impl = NULL;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    return impl ? impl : "?";
}

/* One reorder of weights from (from_md over from) into (to_md over to). */
dl_status dl_dnnl_reorder(const dnnl_memory_desc_t *from_md, const void *from, const dnnl_memory_desc_t *to_md,
                                 void *to) {
    dl_status s = DL_OK;
    dnnl_memory_t a = NULL, b = NULL;
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_primitive_t r = NULL;
    DNNL_TRY(dnnl_memory_create(&a, from_md, dl_dnnl_eng, (void *)from), "weights memory (from)");
    DNNL_TRY(dnnl_memory_create(&b, to_md, dl_dnnl_eng, to), "weights memory (to)");
    DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, from_md, dl_dnnl_eng, to_md, dl_dnnl_eng, NULL), "weights reorder descriptor");
    DNNL_TRY(dnnl_primitive_create(&r, rpd), "weights reorder");
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, a}, {DNNL_ARG_TO, b}};
    DNNL_TRY(dnnl_primitive_execute(r, dl_dnnl_stream, 2, args), "weights reorder run");
    DNNL_TRY(dnnl_stream_wait(dl_dnnl_stream), "stream wait");
err:
    if (r) dnnl_primitive_destroy(r);
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    if (a) dnnl_memory_destroy(a);
    if (b) dnnl_memory_destroy(b);
    return s;
}

dl_status dl_dnnl_bind(const_dnnl_primitive_desc_t pd, const void *w, dnnl_primitive_t *prim, dnnl_memory_t *src,
                       dnnl_memory_t *wei, dnnl_memory_t *dst, dnnl_memory_t *scratch, void **sbuf) {
    dl_status s = DL_OK;
    DNNL_TRY(dnnl_primitive_create(prim, pd), "primitive creation");
    DNNL_TRY(dnnl_memory_create(src, dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0), dl_dnnl_eng, DNNL_MEMORY_NONE),
             "src memory");
    DNNL_TRY(dnnl_memory_create(dst, dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0), dl_dnnl_eng, DNNL_MEMORY_NONE),
             "dst memory");
    DNNL_TRY(dnnl_memory_create(wei, dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0), dl_dnnl_eng, (void *)w),
             "weights memory");
    const dnnl_memory_desc_t *sp_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t sp = sp_md ? dnnl_memory_desc_get_size(sp_md) : 0;
    if (sp) {
        if (!(*sbuf = dl_aligned_alloc(sp))) return dl_fail(DL_ERR_NOMEM, "oneDNN: out of memory for a scratchpad");
        DNNL_TRY(dnnl_memory_create(scratch, sp_md, dl_dnnl_eng, *sbuf), "scratchpad memory");
    }
err:
    return s;
}

/* ---- activations in a primitive's own layout ---------------------------------------------
 * oneDNN's convolutions over plain (ncsp) activations are im2col + its sgemm, whose
 * threads split the reduction when the output has few channels, and over nhwc they
 * are brgemm kernels whose blocking follows the thread count: either way the sums
 * depend on the threads, and a program's results on the process that runs it. Over
 * channel-blocked activations (nChw16c where oneDNN runs AVX-512, nChw8c below) its
 * direct kernels reduce in one order whatever the threads; the activations are
 * reordered into and out of that layout (pure copies) in a staging buffer shared by
 * the process's convolutions. */
static dnnl_format_tag_t act_tag(int ndim) {
    int b16 = !strncmp(dl_onednn_isa(), "avx512", 6);
    return ndim == 2 ? (b16 ? dnnl_aBcd16b : dnnl_aBcd8b) : (b16 ? dnnl_aBcde16b : dnnl_aBcde8b);
}
static dl_staging g_blk = {.lock = PTHREAD_MUTEX_INITIALIZER};

static dl_status reorder_prim(const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to, dnnl_primitive_t *r,
                              dnnl_memory_t *mf, dnnl_memory_t *mt) {
    dl_status s = DL_OK;
    dnnl_primitive_desc_t rpd = NULL;
    DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, from, dl_dnnl_eng, to, dl_dnnl_eng, NULL), "activation reorder descriptor");
    DNNL_TRY(dnnl_primitive_create(r, rpd), "activation reorder");
    DNNL_TRY(dnnl_memory_create(mf, from, dl_dnnl_eng, DNNL_MEMORY_NONE), "activation memory");
    DNNL_TRY(dnnl_memory_create(mt, to, dl_dnnl_eng, DNNL_MEMORY_NONE), "activation memory");
err:
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    return s;
}

/* oneDNN's im2col / sgemm-based implementations ("gemm:jit", "x64:gemm:jit", not brgemm) */
static int sgemm_impl(const_dnnl_primitive_desc_t pd) {
    const char *impl = dl_dnnl_impl(pd);
    return strstr(impl, "gemm") && !strstr(impl, "brg");
}

static dl_status io_blocked(prim_state *p, const op_spec *op, dl_dtype cdt, const_dnnl_primitive_desc_t pd) {
    dnnl_memory_desc_t xs, ys;
    op->plain_io(op, cdt, &xs, &ys);
    const dnnl_memory_desc_t *xb = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    const dnnl_memory_desc_t *yb = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    int bx = !dnnl_memory_desc_equal(&xs, xb), by = !dnnl_memory_desc_equal(&ys, yb);
    dl_status s = DL_OK;
    if (bx) s = reorder_prim(&xs, xb, &p->r_in, &p->x_plain, &p->x_blk);
    if (by && s == DL_OK) s = reorder_prim(yb, &ys, &p->r_out, &p->y_blk, &p->y_plain);
    if (s != DL_OK || (!bx && !by)) return s;
    p->blk_src_bytes = bx ? (dnnl_memory_desc_get_size(xb) + 63) / 64 * 64 : 0;
    return dl_staging_reserve(&g_blk, p->blk_src_bytes + (by ? dnnl_memory_desc_get_size(yb) : 0) + 64,
                              "convolution activation");
}

/* Create the primitive of `op` in p. Fresh weights: `w` [wn] in w_dt, converted
 * (through bf16 when emulating bf16) and reordered. Packed weights (pk non-NULL):
 * used in place when this process's primitive takes their recorded layout, else
 * reordered once from it. `bias` is copied. */
static dl_status prim_make(prim_state *p, const op_spec *op, dl_dtype dt, const void *w, dl_dtype w_dt,
                           const dl_packed *pk, const float *bias) {
    dl_status s = DL_OK;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL, pin = NULL;
    void *wconv = NULL, *wtmp = NULL;
    dl_dtype cdt = dt;
    if ((s = make_attr(&attr, op->act)) != DL_OK) goto err;
    dnnl_status_t st = op->make_pd(op, cdt, 0, NULL, attr, &pd);
    const int no_bf16 = st == dnnl_unimplemented;
    if (st == dnnl_success && dt == DL_BF16 && op->is_matmul && sgemm_impl(pd)) {
        /* oneDNN's bf16 sgemm (AVX-512 without BF16) splits a few rows' sums by thread:
         * emulated like below, where the products of few rows are difflet's own */
        dnnl_primitive_desc_destroy(pd);
        pd = NULL;
        st = dnnl_unimplemented;
    }
    if (st == dnnl_unimplemented && dt == DL_BF16) { /* no native bf16 product: emulate in f32 */
        cdt = DL_F32;
        p->emu = 1;
        st = op->make_pd(op, cdt, 1, NULL, attr, &pd);
        static atomic_int told;
        if (no_bf16 && !atomic_exchange(&told, 1))
            DL_WARN("bf16 is emulated in f32 on this CPU (no AVX-512 BF16 for oneDNN): the same numbers, no faster "
                    "than f32; --dtype f32 (dtype f32 in a deployment) avoids the conversions");
    }
    if (st != dnnl_success) {
        s = dl_fail(DL_ERR_BACKEND, "oneDNN: no %s implementation for this shape on this CPU (status %d)",
                    dl_dtype_name(dt), (int)st);
        goto err;
    }
    const dnnl_memory_desc_t *wei_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    p->wbytes = dnnl_memory_desc_get_size(wei_md);
    const void *in_place = NULL;
    dnnl_memory_desc_t from_md;
    const void *from = NULL;
    if (pk) {
        dnnl_memory_desc_t plain;
        op->plain_w(op, cdt, &plain);
        if ((s = dl_dnnl_md_parse(pk->layout, pk->layout_bytes, &plain, pk->bytes, &from_md)) != DL_OK) goto err;
        if (from_md.data_type == dnnl_s8) { /* int8 weights whose scales entry is missing: never reordered to floats */
            s = dl_fail(DL_ERR_FORMAT, "packed weights: recorded as int8 without their scales, for a %s layer",
                        dl_dtype_name(dt));
            goto err;
        }
        from = pk->data;
        if (dnnl_memory_desc_equal(&from_md, wei_md)) {
            in_place = pk->data;
        } else if (op->make_pd(op, cdt, p->emu, &from_md, attr, &pin) == dnnl_success &&
                   !strcmp(dl_dnnl_impl(pin), dl_dnnl_impl(pd))) { /* the same kernel takes the recorded blocking */
            dnnl_primitive_desc_destroy(pd);
            pd = pin;
            pin = NULL;
            wei_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
            p->wbytes = dnnl_memory_desc_get_size(wei_md);
            in_place = pk->data;
        } else {
            DL_DEBUG("packed weights re-laid out at load: this process's %s wants another blocking", dl_dnnl_impl(pd));
        }
    } else {
        /* fresh weights: [wn] in the compute dtype (rounded to bf16 first when emulating) */
        const void *wsrc = w;
        dl_dtype sdt = w_dt;
        if (p->emu && w_dt != DL_BF16) {
            wtmp = dl_aligned_alloc((size_t)op->wn * 2);
            if (!wtmp) goto nomem;
            dl_kernels()->convert(DL_BF16, wtmp, w_dt, w, op->wn);
            wsrc = wtmp, sdt = DL_BF16;
        }
        if (sdt != cdt) {
            wconv = dl_aligned_alloc((size_t)op->wn * dl_dtype_size(cdt));
            if (!wconv) goto nomem;
            dl_kernels()->convert(cdt, wconv, sdt, wsrc, op->wn);
            wsrc = wconv;
        }
        op->plain_w(op, cdt, &from_md);
        from = wsrc;
    }
    if (in_place) {
        p->wext = in_place;
    } else {
        p->wbuf = dl_aligned_alloc(p->wbytes);
        if (!p->wbuf) goto nomem;
        if ((s = dl_dnnl_reorder(&from_md, from, wei_md, p->wbuf)) != DL_OK) goto err;
    }
    if ((s = dl_dnnl_bind(pd, in_place ? in_place : p->wbuf, &p->prim, &p->src, &p->wei, &p->dst, &p->scratch, &p->sbuf)) !=
        DL_OK)
        goto err;
    p->layout_bytes = dl_dnnl_md_serialize(wei_md, p->layout) * 8;
    p->wmd = *wei_md;
    if (op->plain_io && (s = io_blocked(p, op, cdt, pd)) != DL_OK) goto err;
    p->serial = op->plain_io && sgemm_impl(pd);
    if (bias) { /* copied: the caller's buffer need not outlive the primitive */
        const dnnl_memory_desc_t *b_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 1);
        size_t bb = dnnl_memory_desc_get_size(b_md);
        p->bbuf = dl_aligned_alloc(bb);
        if (!p->bbuf) goto nomem;
        memcpy(p->bbuf, bias, bb);
        DNNL_TRY(dnnl_memory_create(&p->bias, b_md, dl_dnnl_eng, p->bbuf), "bias memory");
    }
    if (p->emu) { /* staging: the widened input, then the f32 output when the caller wants bf16 */
        size_t src_b = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0));
        size_t dst_b = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0));
        p->emu_src_bytes = (src_b + 63) / 64 * 64;
        if ((s = dl_staging_reserve(&g_emu, p->emu_src_bytes + dst_b, "bf16")) != DL_OK) goto err;
    }
    DL_DEBUG("%s%s: %s", dl_dtype_name(dt), p->emu ? " (emulated in f32)" : "", dl_dnnl_impl(pd));
    goto err;
nomem:
    s = dl_fail(DL_ERR_NOMEM, "oneDNN: out of memory creating a primitive");
err:
    if (pin) dnnl_primitive_desc_destroy(pin);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    dl_aligned_free(wconv);
    dl_aligned_free(wtmp);
    return s;
}

static dl_status prim_exec_blocked(prim_state *p, const void *x, void *y);

/* the primitive over x and y (in its layouts), queued on the stream */
static dl_status prim_run(prim_state *p, const void *x, void *y) {
    dl_status s = DL_OK;
    DNNL_TRY(dnnl_memory_set_data_handle(p->src, (void *)x), "set src");
    DNNL_TRY(dnnl_memory_set_data_handle(p->dst, y), "set dst");
    dnnl_exec_arg_t args[5];
    int n = 0;
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, p->src};
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, p->wei};
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_DST, p->dst};
    if (p->bias) args[n++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, p->bias};
    if (p->scratch) args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, p->scratch};
    DNNL_TRY(dnnl_primitive_execute(p->prim, dl_dnnl_stream, n, args), "execute");
err:
    return s;
}

static dl_status prim_exec_here(prim_state *p, const void *x, void *y) {
    dl_status s = DL_OK;
    if (p->r_in || p->r_out) return prim_exec_blocked(p, x, y);
    if ((s = prim_run(p, x, y)) != DL_OK) return s;
    DNNL_TRY(dnnl_stream_wait(dl_dnnl_stream), "stream wait");
err:
    return s;
}

static dl_status prim_exec(prim_state *p, const void *x, void *y) {
    if (!p->serial) return prim_exec_here(p, x, y);
    const int nt = dl_threads();
    dl_set_threads(1);
    dl_status s = prim_exec_here(p, x, y);
    dl_set_threads(nt);
    return s;
}

static dl_status reorder_run(dnnl_primitive_t r, dnnl_memory_t from, dnnl_memory_t to) {
    dl_status s = DL_OK;
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    DNNL_TRY(dnnl_primitive_execute(r, dl_dnnl_stream, 2, args), "activation reorder run");
err:
    return s;
}

static dl_status prim_exec_blocked(prim_state *p, const void *x, void *y) {
    dl_status s = DL_OK;
    pthread_mutex_lock(&g_blk.lock);
    char *xb = p->r_in ? g_blk.buf : (char *)x, *yb = p->r_out ? (char *)g_blk.buf + p->blk_src_bytes : y;
    if (p->r_in) {
        DNNL_TRY(dnnl_memory_set_data_handle(p->x_plain, (void *)x), "set src");
        DNNL_TRY(dnnl_memory_set_data_handle(p->x_blk, xb), "set src");
        if ((s = reorder_run(p->r_in, p->x_plain, p->x_blk)) != DL_OK) goto err;
    }
    if ((s = prim_run(p, xb, yb)) != DL_OK) goto err;
    if (p->r_out) {
        DNNL_TRY(dnnl_memory_set_data_handle(p->y_blk, yb), "set dst");
        DNNL_TRY(dnnl_memory_set_data_handle(p->y_plain, y), "set dst");
        if ((s = reorder_run(p->r_out, p->y_blk, p->y_plain)) != DL_OK) goto err;
    }
    DNNL_TRY(dnnl_stream_wait(dl_dnnl_stream), "stream wait");
err:
    pthread_mutex_unlock(&g_blk.lock);
    return s;
}

static void prim_packed(const prim_state *p, dl_packed *out) {
    out->data = p->wext ? p->wext : p->wbuf;
    out->bytes = p->wbytes;
    out->layout = p->layout;
    out->layout_bytes = p->layout_bytes;
    out->aux = NULL;
    out->aux_bytes = 0;
}

static dl_status packed_check(const dl_packed *pk) {
    if (!pk || !pk->data || !pk->bytes) return dl_fail(DL_ERR_INVALID, "packed weights: none given");
    if (!pk->layout || !pk->layout_bytes)
        return dl_fail(DL_ERR_FORMAT, "packed weights: their layout record is missing (an artifact from an older difflet?)");
    return DL_OK;
}

/* ---- matmul --------------------------------------------------------------------- */

struct dl_matmul {
    dl_matmul_desc d;
    prim_state p;
    dl_q8 *q;  /* int8 weights (d.quant): everything runs there */
    int blas;  /* over p's plain [K, N] f32 weights: 0 oneDNN, BLAS_SGEMM OpenBLAS's sgemm, BLAS_FEW_ROWS few_rows */
};

enum { BLAS_MIN_M = 32, BLAS_SGEMM = 1, BLAS_FEW_ROWS = 2 }; /* fewer rows: few_rows */

/* DIFFLET_GEMM: "openblas" (the default) or "onednn" */
int dl_gemm_blas(void) {
    static atomic_int v = -1;
    int e = atomic_load(&v);
    if (e < 0) {
        const char *g = getenv("DIFFLET_GEMM");
        e = !(g && !strcmp(g, "onednn"));
        if (g && *g && strcmp(g, "onednn") && strcmp(g, "openblas"))
            DL_WARN("DIFFLET_GEMM=%s is not known (openblas or onednn): using openblas", g);
        if (e && openblas_get_parallel() != 2) { /* its own thread pool beside OpenMP's would oversubscribe */
            DL_WARN("the OpenBLAS loaded is not its OpenMP build (libopenblas-openmp): f32 products stay in oneDNN");
            e = 0;
        }
        atomic_store(&v, e);
    }
    return e;
}

const char *dl_gemm_name(const dl_matmul *mm) {
    if (mm->q)
        return mm->d.quant == DL_QUANT_W8A8 ? "oneDNN int8"
               : dl_q8_bf16_panels(mm->q) ? "oneDNN bf16 (int8 weights)"
               : dl_gemm_blas()           ? "OpenBLAS (int8 weights)"
                                          : "oneDNN (int8 weights)";
    return mm->blas == BLAS_SGEMM ? "OpenBLAS" : mm->blas == BLAS_FEW_ROWS ? "difflet (few rows)" : "oneDNN";
}

const char *dl_openblas_version(void) {
    static char buf[64];
    const char *c = openblas_get_config(); /* "OpenBLAS 0.3.21 DYNAMIC_ARCH ..." */
    int n = 0;
    for (int words = 0; c[n] && n < (int)sizeof buf - 1; n++)
        if (c[n] == ' ' && ++words == 2) break;
    snprintf(buf, sizeof buf, "%.*s (%s, %s)", n, c, openblas_get_corename(),
             openblas_get_parallel() == 2 ? "OpenMP" : openblas_get_parallel() == 1 ? "pthreads" : "serial");
    return buf;
}

/* whether mm's f32 products run outside oneDNN (and where): plain [K, N] weights, f32
 * in and out (or staged so), dimensions within OpenBLAS's int */
static int blas_fits(const dl_matmul *mm) {
    const dl_matmul_desc *d = &mm->d;
    dnnl_memory_desc_t kn;
    dnnl_dims_t dims = {d->k, d->n};
    if (!dl_gemm_blas() || (!mm->p.emu && (d->dt != DL_F32 || d->dst_dt != DL_F32))) return 0;
    if (d->m > INT_MAX || d->k > INT_MAX || d->n > INT_MAX || d->ldx > INT_MAX || d->ldy > INT_MAX) return 0;
    if (dnnl_memory_desc_init_by_tag(&kn, 2, dims, dnnl_f32, dnnl_ab) != dnnl_success) return 0;
    if (!dnnl_memory_desc_equal(&mm->p.wmd, &kn)) return 0;
    return d->m < BLAS_MIN_M ? BLAS_FEW_ROWS : BLAS_SGEMM;
}

/* ---- products of a few rows over plain f32 weights ----------------------------------
 * oneDNN 2.6's sgemm (its matmul where the weights stay plain: below AVX-512, and
 * for emulated bf16) splits the K sums of a product with few rows across threads,
 * so its results depend on the thread count; OpenBLAS's sgemm is 3x slower at one
 * row. These run here (slower than oneDNN's split sums: the price of the same bytes): each thread owns a range of output columns, in chunks whose
 * M rows of y stay in cache (FEW_CACHE bytes) while the chunk's weights stream past
 * once, row by row; every element is summed over k in order, whatever the threads. */
enum { FEW_CACHE = 128 << 10 };

typedef struct {
    const float *x, *w;
    float *y;
    int64_t m, k, n, ldx, ldy;
} few_args;

typedef float few_v8 __attribute__((vector_size(32), aligned(4)));
enum { FEW_NB = 128, FEW_KB = 256 }; /* a packed block: FEW_KB weight rows by FEW_NB columns (128 KiB, on the stack) */

/* rows [r0, r0 + R) by the 16 columns of packed strip p (kb rows of 16): R x 16 sums in
 * registers (two 8-lane halves: AVX2 registers), continuing y's partial sums (first
 * block: from 0) over k in order */
#define FEW_TILE(R)                                                                          \
    do {                                                                                     \
        few_v8 lo[R], hi[R];                                                                 \
        for (int i = 0; i < R; i++) {                                                        \
            lo[i] = hi[i] = (few_v8){0};                                                     \
            if (k0) {                                                                        \
                memcpy(&lo[i], a->y + (r0 + i) * a->ldy + n, 32);                            \
                memcpy(&hi[i], a->y + (r0 + i) * a->ldy + n + 8, 32);                        \
            }                                                                                \
        }                                                                                    \
        for (int64_t kk = 0; kk < kb; kk++) {                                                \
            few_v8 wl = *(const few_v8 *)(p + kk * 16), wh = *(const few_v8 *)(p + kk * 16 + 8); \
            for (int i = 0; i < R; i++) {                                                    \
                const float xv = a->x[(r0 + i) * a->ldx + k0 + kk];                          \
                lo[i] += xv * wl, hi[i] += xv * wh;                                          \
            }                                                                                \
        }                                                                                    \
        for (int i = 0; i < R; i++) {                                                        \
            memcpy(a->y + (r0 + i) * a->ldy + n, &lo[i], 32);                                \
            memcpy(a->y + (r0 + i) * a->ldy + n + 8, &hi[i], 32);                            \
        }                                                                                    \
    } while (0)

static inline __attribute__((always_inline)) void few_body(const few_args *a, int ith, int nth) {
    int64_t c0, c1;
    dl_split((a->n + 15) / 16, ith, nth, &c0, &c1); /* 16-column units: whole cache lines per thread */
    c0 *= 16, c1 = c1 * 16 < a->n ? c1 * 16 : a->n;
    float buf[FEW_NB * FEW_KB] __attribute__((aligned(64)));
    if (a->m > 1) { /* weight blocks packed into 16-column strips, then register tiles of up to 4 rows */
        const int64_t full = c0 + (c1 - c0) / 16 * 16;
        for (int64_t n0 = c0; n0 < full; n0 += FEW_NB) {
            const int64_t nw = full - n0 < FEW_NB ? full - n0 : FEW_NB;
            for (int64_t k0 = 0; k0 < a->k; k0 += FEW_KB) {
                const int64_t kb = a->k - k0 < FEW_KB ? a->k - k0 : FEW_KB;
                for (int64_t kk = 0; kk < kb; kk++)
                    for (int64_t s = 0; s < nw / 16; s++)
                        memcpy(buf + (s * kb + kk) * 16, a->w + (k0 + kk) * a->n + n0 + s * 16, 64);
                for (int64_t s = 0; s < nw / 16; s++) {
                    const float *p = buf + s * kb * 16;
                    const int64_t n = n0 + s * 16;
                    int64_t r0 = 0;
                    for (; r0 + 4 <= a->m; r0 += 4) FEW_TILE(4);
                    for (; r0 < a->m; r0++) FEW_TILE(1);
                }
            }
        }
        c0 = full;
    }
    int64_t chunk = FEW_CACHE / (a->m * (int64_t)sizeof(float)) / 16 * 16;
    if (chunk < 64) chunk = 64;
    for (int64_t n0 = c0; n0 < c1; n0 += chunk) {
        const int64_t nb = c1 - n0 < chunk ? c1 - n0 : chunk;
        for (int64_t r = 0; r < a->m; r++) memset(a->y + r * a->ldy + n0, 0, (size_t)nb * sizeof(float));
        for (int64_t kk = 0; kk < a->k; kk++) {
            const float *wr = a->w + kk * a->n + n0;
            for (int64_t r = 0; r < a->m; r++) {
                float *yr = a->y + r * a->ldy + n0;
                const float xv = a->x[r * a->ldx + kk];
                for (int64_t j = 0; j < nb; j++) yr[j] += xv * wr[j];
            }
        }
    }
}

__attribute__((target("avx512f"))) static void few_avx512(void *ctx, int ith, int nth) { few_body(ctx, ith, nth); }
__attribute__((target("avx2,fma"))) static void few_avx2(void *ctx, int ith, int nth) { few_body(ctx, ith, nth); }
static void few_base(void *ctx, int ith, int nth) { few_body(ctx, ith, nth); }

static void few_rows(const dl_matmul_desc *d, const float *x, int64_t ldx, const float *w, float *y, int64_t ldy) {
    few_args a = {x, w, y, d->m, d->k, d->n, ldx, ldy};
    dl_isa isa = dl_kernel_isa();
    dl_parallel(isa >= DL_ISA_AVX512 ? few_avx512 : isa == DL_ISA_AVX2 ? few_avx2 : few_base, &a);
}

typedef struct {
    const dl_matmul *mm;
    float *y;
    int64_t ldy;
} blas_epi;

static void blas_epilogue_fn(void *ctx, int ith, int nth) {
    const blas_epi *e = ctx;
    const dl_matmul_desc *d = &e->mm->d;
    const float *b = e->mm->p.bbuf;
    int64_t r0, r1;
    dl_split(d->m, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        float *row = e->y + r * e->ldy;
        if (b)
            for (int64_t j = 0; j < d->n; j++) row[j] += b[j];
        if (d->act != DL_ACT_NONE) dl_activation_t(d->act, DL_F32, row, row, d->n, 0, 1);
    }
}

/* y [M, N] (row stride ldy) = act(x [M, K] (ldx) . W + b), all f32 */
static void blas_exec(const dl_matmul *mm, const float *x, int64_t ldx, float *y, int64_t ldy) {
    const dl_matmul_desc *d = &mm->d;
    const float *w = mm->p.wext ? mm->p.wext : mm->p.wbuf;
    if (mm->blas == BLAS_FEW_ROWS)
        few_rows(d, x, ldx, w, y, ldy);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)d->m, (int)d->n, (int)d->k, 1.f, x, (int)ldx, w,
                (int)d->n, 0.f, y, (int)ldy);
    if (mm->p.bbuf || d->act != DL_ACT_NONE) {
        blas_epi e = {mm, y, ldy};
        dl_parallel(blas_epilogue_fn, &e);
    }
}

/* src [M, K] and dst [M, N]: the caller's strides, or contiguous f32 staging when
 * emulating bf16 */
static dnnl_status_t mm_make_pd(const op_spec *op, dl_dtype cdt, int emu, const dnnl_memory_desc_t *wei,
                                dnnl_primitive_attr_t attr, dnnl_primitive_desc_t *pd) {
    const dl_matmul_desc *d = &op->u.mm;
    dnnl_memory_desc_t src_md, wei_md, bias_md, dst_md;
    int stage_dst = emu && d->dst_dt != DL_F32;
    dnnl_dims_t sdims = {d->m, d->k}, sstr = {emu ? d->k : d->ldx, 1};
    dnnl_dims_t wdims = {d->k, d->n};
    dnnl_dims_t ddims = {d->m, d->n}, dstr = {stage_dst ? d->n : d->ldy, 1};
    dnnl_dims_t bdims = {1, d->n};
    dnnl_status_t st;
    if ((st = dnnl_memory_desc_init_by_strides(&src_md, 2, sdims, dl_dnnl_dt(cdt), sstr)) != dnnl_success) return st;
    if (wei)
        wei_md = *wei;
    else if ((st = dnnl_memory_desc_init_by_tag(&wei_md, 2, wdims, dl_dnnl_dt(cdt), dnnl_format_tag_any)) != dnnl_success)
        return st;
    if ((st = dnnl_memory_desc_init_by_tag(&bias_md, 2, bdims, dnnl_f32, dnnl_ab)) != dnnl_success) return st;
    if ((st = dnnl_memory_desc_init_by_strides(&dst_md, 2, ddims, dl_dnnl_dt(emu ? DL_F32 : d->dst_dt), dstr)) !=
        dnnl_success)
        return st;
    dnnl_matmul_desc_t md;
    if ((st = dnnl_matmul_desc_init(&md, &src_md, &wei_md, op->has_bias ? &bias_md : NULL, &dst_md)) != dnnl_success)
        return st;
    return dnnl_primitive_desc_create(pd, &md, attr, dl_dnnl_eng, NULL);
}

static void mm_plain_w(const op_spec *op, dl_dtype cdt, dnnl_memory_desc_t *md) {
    const dl_matmul_desc *d = &op->u.mm;
    dnnl_dims_t wdims = {d->k, d->n}, wstr = {1, d->k}; /* [N, K] row-major seen as [K, N] */
    dnnl_memory_desc_init_by_strides(md, 2, wdims, dl_dnnl_dt(cdt), wstr);
}

static dl_status matmul_make(dl_matmul **out, const dl_matmul_desc *d0, const void *w, dl_dtype w_dt,
                             const dl_packed *pk, const float *bias) {
    *out = NULL;
    dl_status s = dl_dnnl_engine();
    if (s != DL_OK) return s;
    dl_matmul_desc d = *d0;
    if (!d.ldx) d.ldx = d.k;
    if (!d.ldy) d.ldy = d.n;
    if (d.m <= 0 || d.k <= 0 || d.n <= 0 || d.ldx < d.k || d.ldy < d.n)
        return dl_fail(DL_ERR_INVALID, "matmul: bad shape M=%lld K=%lld N=%lld", (long long)d.m,
                       (long long)d.k, (long long)d.n);
    if (d.dt != DL_F32 && d.dt != DL_BF16)
        return dl_fail(DL_ERR_UNSUPPORTED, "matmul: compute dtype %s is not supported (f32, bf16)",
                       dl_dtype_name(d.dt));
    dl_matmul *mm = calloc(1, sizeof *mm);
    if (!mm) return dl_fail(DL_ERR_NOMEM, "matmul: out of memory");
    mm->d = d;
    if (d.quant != DL_QUANT_NONE) {
        if ((s = dl_q8_new(&mm->q, &d, w, w_dt, pk, bias)) != DL_OK) {
            free(mm);
            return s;
        }
        *out = mm;
        return DL_OK;
    }
    op_spec op = {.make_pd = mm_make_pd, .plain_w = mm_plain_w, .wn = d.n * d.k, .is_matmul = 1, .has_bias = bias != NULL,
                  .act = d.act};
    op.u.mm = d;
    DL_DEBUG("matmul M=%lld K=%lld N=%lld", (long long)d.m, (long long)d.k, (long long)d.n);
    if ((s = prim_make(&mm->p, &op, d.dt, w, w_dt, pk, bias)) != DL_OK) {
        dl_matmul_free(mm);
        return s;
    }
    mm->blas = blas_fits(mm);
    if (mm->blas)
        DL_DEBUG("matmul M=%lld K=%lld N=%lld: %s", (long long)d.m, (long long)d.k, (long long)d.n, dl_gemm_name(mm));
    *out = mm;
    return DL_OK;
}

dl_status dl_matmul_new(dl_matmul **out, const dl_matmul_desc *d, const void *w, dl_dtype w_dt, const float *bias) {
    return matmul_make(out, d, w, w_dt, NULL, bias);
}

dl_status dl_matmul_new_packed(dl_matmul **out, const dl_matmul_desc *d, const dl_packed *pk, const float *bias) {
    *out = NULL;
    dl_status s = packed_check(pk);
    return s != DL_OK ? s : matmul_make(out, d, NULL, d->dt, pk, bias);
}

void dl_matmul_packed(const dl_matmul *mm, dl_packed *out) {
    if (mm->q)
        dl_q8_packed(mm->q, out);
    else
        prim_packed(&mm->p, out);
}

dl_status dl_matmul_run(dl_matmul *mm, const void *x, void *y) {
    if (mm->q) return dl_q8_run(mm->q, x, y);
    if (!mm->p.emu) {
        if (!mm->blas) return prim_exec(&mm->p, x, y);
        blas_exec(mm, x, mm->d.ldx, y, mm->d.ldy);
        return DL_OK;
    }
    /* bf16 emulated: widen x into the staging buffer, run, round the output back */
    const dl_matmul_desc *d = &mm->d;
    pthread_mutex_lock(&g_emu.lock);
    float *xs = g_emu.buf, *ys = (float *)((char *)g_emu.buf + mm->p.emu_src_bytes);
    convert_rows(DL_F32, xs, d->k, d->dt, x, d->ldx, d->m, d->k);
    int stage = d->dst_dt != DL_F32;
    dl_status s = DL_OK;
    if (mm->blas)
        blas_exec(mm, xs, d->k, stage ? ys : y, stage ? d->n : d->ldy);
    else
        s = prim_exec(&mm->p, xs, stage ? (void *)ys : y);
    if (s == DL_OK && stage) convert_rows(d->dst_dt, y, d->ldy, DL_F32, ys, d->n, d->m, d->n);
    pthread_mutex_unlock(&g_emu.lock);
    return s;
}

size_t dl_matmul_weight_bytes(const dl_matmul *mm) { return mm->q ? dl_q8_weight_bytes(mm->q) : mm->p.wbytes; }

void dl_matmul_free(dl_matmul *mm) {
    if (!mm) return;
    dl_q8_free(mm->q);
    prim_state_free(&mm->p);
    free(mm);
}

/* ---- convolution ---------------------------------------------------------------- */

struct dl_conv {
    dl_conv_desc d;
    prim_state p;
    int64_t in_n, out_n; /* activation elements */
};

int64_t dl_conv_out_dim(const dl_conv_desc *d, int i) {
    return (d->in[i] + 2 * d->pad[i] - d->kernel[i]) / d->stride[i] + 1;
}

static void cv_dims(const dl_conv_desc *d, dnnl_dims_t sdims, dnnl_dims_t wdims, dnnl_dims_t ddims) {
    sdims[0] = 1, sdims[1] = d->cin;
    wdims[0] = d->cout, wdims[1] = d->cin;
    ddims[0] = 1, ddims[1] = d->cout;
    for (int i = 0; i < d->ndim; i++) {
        sdims[2 + i] = d->in[i];
        wdims[2 + i] = d->kernel[i];
        ddims[2 + i] = dl_conv_out_dim(d, i);
    }
}

int64_t dl_deconv_out_dim(const dl_conv_desc *d, int i) {
    return (d->in[i] - 1) * d->stride[i] - 2 * d->pad[i] + d->kernel[i];
}

static void dc_dims(const dl_conv_desc *d, dnnl_dims_t sdims, dnnl_dims_t wdims, dnnl_dims_t ddims) {
    cv_dims(d, sdims, wdims, ddims); /* weights: oneDNN's logical [cout, cin, k...] */
    for (int i = 0; i < d->ndim; i++) ddims[2 + i] = dl_deconv_out_dim(d, i);
}

/* One (transposed) convolution descriptor over activations in layouts `ls` (src) and
 * `ld` (dst). */
static dnnl_status_t conv_pd_in(const op_spec *op, int deconv, dl_dtype cdt, const dnnl_memory_desc_t *wei,
                                dnnl_format_tag_t ls, dnnl_format_tag_t ld, dnnl_primitive_attr_t attr,
                                dnnl_primitive_desc_t *pd) {
    const dl_conv_desc *d = &op->u.cv;
    int nd = d->ndim + 2;
    dnnl_dims_t sdims, wdims, ddims, bdims = {d->cout}, strides, pad;
    (deconv ? dc_dims : cv_dims)(d, sdims, wdims, ddims);
    for (int i = 0; i < d->ndim; i++) strides[i] = d->stride[i], pad[i] = d->pad[i];
    dnnl_memory_desc_t src_md, wei_md, bias_md, dst_md;
    dnnl_status_t st;
    if ((st = dnnl_memory_desc_init_by_tag(&src_md, nd, sdims, dl_dnnl_dt(cdt), ls)) != dnnl_success) return st;
    if (wei)
        wei_md = *wei;
    else if ((st = dnnl_memory_desc_init_by_tag(&wei_md, nd, wdims, dl_dnnl_dt(cdt), dnnl_format_tag_any)) !=
             dnnl_success)
        return st;
    if ((st = dnnl_memory_desc_init_by_tag(&bias_md, 1, bdims, dnnl_f32, dnnl_a)) != dnnl_success) return st;
    if ((st = dnnl_memory_desc_init_by_tag(&dst_md, nd, ddims, dl_dnnl_dt(cdt), ld)) != dnnl_success) return st;
    const dnnl_memory_desc_t *bmd = op->has_bias ? &bias_md : NULL;
    if (deconv) {
        dnnl_deconvolution_desc_t dd;
        if ((st = dnnl_deconvolution_forward_desc_init(&dd, dnnl_forward_inference, dnnl_deconvolution_direct, &src_md,
                                                       &wei_md, bmd, &dst_md, strides, pad, pad)) != dnnl_success)
            return st;
        return dnnl_primitive_desc_create(pd, &dd, attr, dl_dnnl_eng, NULL);
    }
    dnnl_convolution_desc_t cd;
    if ((st = dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct, &src_md, &wei_md,
                                                 bmd, &dst_md, strides, pad, pad)) != dnnl_success)
        return st;
    return dnnl_primitive_desc_create(pd, &cd, attr, dl_dnnl_eng, NULL);
}

/* The activation layouts tried, first that oneDNN runs with a real kernel (never its
 * reference loops while another layout has one): channel-blocked in and out; plain in
 * (its direct kernels for few input channels), blocked out; plain both (im2col + sgemm,
 * which may split sums by thread: the last resort, planned and run on one thread). */
static dnnl_status_t conv_pd(const op_spec *op, int deconv, dl_dtype cdt, const dnnl_memory_desc_t *wei,
                             dnnl_primitive_attr_t attr, dnnl_primitive_desc_t *pd) {
    const int n = op->u.cv.ndim;
    const dnnl_format_tag_t plain = n == 2 ? dnnl_abcd : dnnl_abcde, blk = act_tag(n);
    const dnnl_format_tag_t tries[3][2] = {{blk, blk}, {plain, blk}, {plain, plain}};
    dnnl_status_t st = dnnl_unimplemented;
    for (int t = 0; t < 3; t++) {
        dnnl_primitive_desc_t c = NULL;
        const int nt = dl_threads();
        if (t == 2) dl_set_threads(1); /* planned for one thread, as it runs (prim_state.serial) */
        dnnl_status_t e = conv_pd_in(op, deconv, cdt, wei, tries[t][0], tries[t][1], attr, &c);
        dl_set_threads(nt);
        if (e != dnnl_success) continue;
        if (*pd) dnnl_primitive_desc_destroy(*pd);
        *pd = c, st = e;
        if (strncmp(dl_dnnl_impl(c), "ref", 3)) break;
    }
    return st;
}

static dnnl_status_t cv_make_pd(const op_spec *op, dl_dtype cdt, int emu, const dnnl_memory_desc_t *wei,
                                dnnl_primitive_attr_t attr, dnnl_primitive_desc_t *pd) {
    (void)emu; /* dst is in the compute dtype either way */
    return conv_pd(op, 0, cdt, wei, attr, pd);
}

static void io_plain(int ndim, dl_dtype cdt, const dnnl_dims_t sdims, const dnnl_dims_t ddims, dnnl_memory_desc_t *src,
                     dnnl_memory_desc_t *dst) {
    dnnl_format_tag_t plain = ndim == 2 ? dnnl_abcd : dnnl_abcde;
    dnnl_memory_desc_init_by_tag(src, ndim + 2, sdims, dl_dnnl_dt(cdt), plain);
    dnnl_memory_desc_init_by_tag(dst, ndim + 2, ddims, dl_dnnl_dt(cdt), plain);
}

static void cv_plain_io(const op_spec *op, dl_dtype cdt, dnnl_memory_desc_t *src, dnnl_memory_desc_t *dst) {
    dnnl_dims_t sdims, wdims, ddims;
    cv_dims(&op->u.cv, sdims, wdims, ddims);
    io_plain(op->u.cv.ndim, cdt, sdims, ddims, src, dst);
}

static void cv_plain_w(const op_spec *op, dl_dtype cdt, dnnl_memory_desc_t *md) {
    const dl_conv_desc *d = &op->u.cv;
    dnnl_dims_t sdims, wdims, ddims;
    cv_dims(d, sdims, wdims, ddims);
    dnnl_memory_desc_init_by_tag(md, d->ndim + 2, wdims, dl_dnnl_dt(cdt), d->ndim == 2 ? dnnl_abcd : dnnl_abcde);
}

static dl_status conv_make(dl_conv **out, const dl_conv_desc *d, const void *w, dl_dtype w_dt, const dl_packed *pk,
                           const float *bias);

dl_status dl_conv_new(dl_conv **out, const dl_conv_desc *d, const void *w, dl_dtype w_dt, const float *bias) {
    return conv_make(out, d, w, w_dt, NULL, bias);
}

dl_status dl_conv_new_packed(dl_conv **out, const dl_conv_desc *d, const dl_packed *pk, const float *bias) {
    *out = NULL;
    dl_status s = packed_check(pk);
    return s != DL_OK ? s : conv_make(out, d, NULL, d->dt, pk, bias);
}

void dl_conv_packed(const dl_conv *c, dl_packed *out) { prim_packed(&c->p, out); }

dl_status dl_conv_run(dl_conv *c, const void *x, void *y) {
    if (!c->p.emu) return prim_exec(&c->p, x, y);
    pthread_mutex_lock(&g_emu.lock);
    float *xs = g_emu.buf, *ys = (float *)((char *)g_emu.buf + c->p.emu_src_bytes);
    convert_rows(DL_F32, xs, 0, c->d.dt, x, 0, 1, c->in_n);
    dl_status s = prim_exec(&c->p, xs, ys);
    if (s == DL_OK) convert_rows(c->d.dt, y, 0, DL_F32, ys, 0, 1, c->out_n);
    pthread_mutex_unlock(&g_emu.lock);
    return s;
}

void dl_conv_free(dl_conv *c) {
    if (!c) return;
    prim_state_free(&c->p);
    free(c);
}

/* ---- transposed convolution ------------------------------------------------------ */

/* the user weights: PyTorch's [cin, cout, k...], oneDNN's iohw / iodhw */
static void dc_plain_w(const op_spec *op, dl_dtype cdt, dnnl_memory_desc_t *md) {
    const dl_conv_desc *d = &op->u.cv;
    dnnl_dims_t sdims, wdims, ddims;
    dc_dims(d, sdims, wdims, ddims);
    dnnl_memory_desc_init_by_tag(md, d->ndim + 2, wdims, dl_dnnl_dt(cdt), d->ndim == 2 ? dnnl_bacd : dnnl_bacde);
}

static void dc_plain_io(const op_spec *op, dl_dtype cdt, dnnl_memory_desc_t *src, dnnl_memory_desc_t *dst) {
    dnnl_dims_t sdims, wdims, ddims;
    dc_dims(&op->u.cv, sdims, wdims, ddims);
    io_plain(op->u.cv.ndim, cdt, sdims, ddims, src, dst);
}

static dnnl_status_t dc_make_pd(const op_spec *op, dl_dtype cdt, int emu, const dnnl_memory_desc_t *wei,
                                dnnl_primitive_attr_t attr, dnnl_primitive_desc_t *pd) {
    (void)emu;
    return conv_pd(op, 1, cdt, wei, attr, pd);
}

/* a convolution (deconv 0) or a transposed convolution (deconv 1, PyTorch's
 * ConvTranspose weight layout) of geometry d */
static dl_status conv_build(dl_conv **out, const dl_conv_desc *d, const void *w, dl_dtype w_dt, const dl_packed *pk,
                            const float *bias, int deconv) {
    const char *what = deconv ? "deconv" : "conv";
    int64_t (*odim)(const dl_conv_desc *, int) = deconv ? dl_deconv_out_dim : dl_conv_out_dim;
    *out = NULL;
    dl_status s = dl_dnnl_engine();
    if (s != DL_OK) return s;
    if (d->ndim != 2 && d->ndim != 3) return dl_fail(DL_ERR_INVALID, "%s: ndim must be 2 or 3, got %d", what, d->ndim);
    if (d->dt != DL_F32 && d->dt != DL_BF16)
        return dl_fail(DL_ERR_UNSUPPORTED, "%s: dtype %s is not supported (f32, bf16)", what, dl_dtype_name(d->dt));
    for (int i = 0; i < d->ndim; i++)
        if (d->in[i] <= 0 || d->kernel[i] <= 0 || d->stride[i] <= 0 || d->pad[i] < 0 || odim(d, i) <= 0)
            return dl_fail(DL_ERR_INVALID, "%s: bad geometry on axis %d (in %lld, kernel %lld, stride %lld, pad %lld)", what,
                           i, (long long)d->in[i], (long long)d->kernel[i], (long long)d->stride[i], (long long)d->pad[i]);
    if (d->cin <= 0 || d->cout <= 0) return dl_fail(DL_ERR_INVALID, "%s: bad channel counts", what);
    dl_conv *c = calloc(1, sizeof *c);
    if (!c) return dl_fail(DL_ERR_NOMEM, "%s: out of memory", what);
    c->d = *d;
    op_spec op = {.make_pd = deconv ? dc_make_pd : cv_make_pd, .plain_w = deconv ? dc_plain_w : cv_plain_w,
                  .plain_io = deconv ? dc_plain_io : cv_plain_io,
                  .wn = d->cout * d->cin, .has_bias = bias != NULL};
    op.u.cv = *d;
    c->in_n = d->cin;
    c->out_n = d->cout;
    for (int i = 0; i < d->ndim; i++) {
        op.wn *= d->kernel[i];
        c->in_n *= d->in[i];
        c->out_n *= odim(d, i);
    }
    DL_DEBUG("%s%dd %lld->%lld", what, d->ndim, (long long)d->cin, (long long)d->cout);
    if ((s = prim_make(&c->p, &op, d->dt, w, w_dt, pk, bias)) != DL_OK) {
        dl_conv_free(c);
        return s;
    }
    *out = c;
    return DL_OK;
}

static dl_status conv_make(dl_conv **out, const dl_conv_desc *d, const void *w, dl_dtype w_dt, const dl_packed *pk,
                           const float *bias) {
    return conv_build(out, d, w, w_dt, pk, bias, 0);
}

dl_status dl_deconv_new(dl_conv **out, const dl_conv_desc *d, const void *w, dl_dtype w_dt, const float *bias) {
    return conv_build(out, d, w, w_dt, NULL, bias, 1);
}
