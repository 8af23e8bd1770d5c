/* Matmul and convolution through oneDNN (Debian's libdnnl, v2 C API).
 *
 * Weights are converted to the compute dtype and reordered once, at creation, into
 * the layout oneDNN picks for the shape (format_tag_any); every buffer a run needs
 * (packed weights, scratchpad) is allocated at creation, so a run allocates
 * nothing. Activations are plain row-major (matmul) or channels-first (conv). */
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_impl.h"

static dnnl_engine_t g_eng;
static dnnl_stream_t g_stream;
static dnnl_status_t g_init_status = dnnl_success;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_once(void) {
    g_init_status = dnnl_engine_create(&g_eng, dnnl_cpu, 0);
    if (g_init_status == dnnl_success)
        g_init_status = dnnl_stream_create(&g_stream, g_eng, dnnl_stream_default_flags);
}

static dl_status engine(void) {
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

static dnnl_data_type_t dnnl_dt(dl_dtype dt) {
    switch (dt) {
    case DL_F32: return dnnl_f32;
    case DL_BF16: return dnnl_bf16;
    case DL_F16: return dnnl_f16;
    }
    return dnnl_f32;
}

#define DNNL_TRY(call, what)                                                                 \
    do {                                                                                     \
        dnnl_status_t st_ = (call);                                                          \
        if (st_ != dnnl_success) {                                                           \
            s = dl_fail(DL_ERR_BACKEND, "oneDNN: %s failed (status %d)", what, (int)st_);    \
            goto err;                                                                        \
        }                                                                                    \
    } while (0)

/* Objects shared by matmul and conv: the primitive, its memories and the buffers
 * it owns. */
typedef struct {
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, bias, dst, scratch;
    void *wbuf, *sbuf, *bbuf;
    const void *wext; /* packed weights owned by the caller (artifact mapping) */
    size_t wbytes;
} prim_state;

static void prim_state_free(prim_state *p) {
    if (p->prim) dnnl_primitive_destroy(p->prim);
    dnnl_memory_t mems[] = {p->src, p->wei, p->bias, p->dst, p->scratch};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
        if (mems[i]) dnnl_memory_destroy(mems[i]);
    dl_aligned_free(p->wbuf);
    dl_aligned_free(p->sbuf);
    dl_aligned_free(p->bbuf);
    memset(p, 0, sizeof *p);
}

/* From a primitive descriptor and user weights (`user_w_md` over `w`): create the
 * primitive, reorder the weights into the layout the primitive wants, bind bias,
 * and allocate the scratchpad. With user_w_md NULL, `w` is already in that layout
 * (packed_bytes long) and is used in place. Takes ownership of nothing given. */
static dl_status prim_state_build(prim_state *p, const_dnnl_primitive_desc_t pd,
                                  const dnnl_memory_desc_t *user_w_md, const void *w, size_t packed_bytes,
                                  const float *bias) {
    dl_status s = DL_OK;
    dnnl_memory_t user_w = NULL;
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_primitive_t reorder = NULL;
    const dnnl_memory_desc_t *src_md = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    const dnnl_memory_desc_t *wei_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    const dnnl_memory_desc_t *dst_md = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    const dnnl_memory_desc_t *sp_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);

    DNNL_TRY(dnnl_primitive_create(&p->prim, pd), "primitive creation");
    DNNL_TRY(dnnl_memory_create(&p->src, src_md, g_eng, DNNL_MEMORY_NONE), "src memory");
    DNNL_TRY(dnnl_memory_create(&p->dst, dst_md, g_eng, DNNL_MEMORY_NONE), "dst memory");

    p->wbytes = dnnl_memory_desc_get_size(wei_md);
    if (!user_w_md) { /* already packed: use the caller's buffer in place */
        if (packed_bytes != p->wbytes) {
            s = dl_fail(DL_ERR_FORMAT, "packed weights are %zu bytes, this primitive wants %zu (compiled by another oneDNN or ISA?)",
                        packed_bytes, p->wbytes);
            goto err;
        }
        p->wext = w;
        DNNL_TRY(dnnl_memory_create(&p->wei, wei_md, g_eng, (void *)w), "weights memory");
    } else {
        p->wbuf = dl_aligned_alloc(p->wbytes);
        if (!p->wbuf) {
            s = dl_fail(DL_ERR_NOMEM, "oneDNN: cannot allocate %zu bytes of packed weights", p->wbytes);
            goto err;
        }
        DNNL_TRY(dnnl_memory_create(&p->wei, wei_md, g_eng, p->wbuf), "weights memory");
        DNNL_TRY(dnnl_memory_create(&user_w, user_w_md, g_eng, (void *)w), "user weights memory");
        DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, user_w_md, g_eng, wei_md, g_eng, NULL),
                 "weights reorder descriptor");
        DNNL_TRY(dnnl_primitive_create(&reorder, rpd), "weights reorder");
        dnnl_exec_arg_t rargs[2] = {{DNNL_ARG_FROM, user_w}, {DNNL_ARG_TO, p->wei}};
        DNNL_TRY(dnnl_primitive_execute(reorder, g_stream, 2, rargs), "weights reorder run");
        DNNL_TRY(dnnl_stream_wait(g_stream), "stream wait");
    }

    if (bias) { /* copied: the caller's buffer need not outlive the primitive */
        const dnnl_memory_desc_t *b_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 1);
        size_t bb = dnnl_memory_desc_get_size(b_md);
        p->bbuf = dl_aligned_alloc(bb);
        if (!p->bbuf) {
            s = dl_fail(DL_ERR_NOMEM, "oneDNN: cannot allocate %zu bytes of bias", bb);
            goto err;
        }
        memcpy(p->bbuf, bias, bb);
        DNNL_TRY(dnnl_memory_create(&p->bias, b_md, g_eng, p->bbuf), "bias memory");
    }
    size_t sp = sp_md ? dnnl_memory_desc_get_size(sp_md) : 0;
    if (sp) {
        p->sbuf = dl_aligned_alloc(sp);
        if (!p->sbuf) {
            s = dl_fail(DL_ERR_NOMEM, "oneDNN: cannot allocate %zu bytes of scratchpad", sp);
            goto err;
        }
        DNNL_TRY(dnnl_memory_create(&p->scratch, sp_md, g_eng, p->sbuf), "scratchpad memory");
    }
err:
    if (reorder) dnnl_primitive_destroy(reorder);
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    if (user_w) dnnl_memory_destroy(user_w);
    return s;
}

static dl_status prim_state_run(prim_state *p, const void *x, void *y) {
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
    DNNL_TRY(dnnl_primitive_execute(p->prim, g_stream, n, args), "execute");
    DNNL_TRY(dnnl_stream_wait(g_stream), "stream wait");
err:
    return s;
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

/* ---- matmul --------------------------------------------------------------------- */

struct dl_matmul {
    dl_matmul_desc d;
    prim_state p;
};

/* Shared by both constructors: w is [N, K] in w_dt (converted and reordered), or,
 * with packed_bytes != 0, already packed. */
static dl_status matmul_make(dl_matmul **out, const dl_matmul_desc *d0, const void *w, dl_dtype w_dt,
                             size_t packed_bytes, const float *bias) {
    *out = NULL;
    dl_status s = engine();
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
    void *wconv = NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    if (!mm) return dl_fail(DL_ERR_NOMEM, "matmul: out of memory");
    mm->d = d;

    /* weights in the compute dtype, still [N, K] */
    size_t nw = (size_t)(d.n * d.k);
    if (!packed_bytes && w_dt != d.dt) {
        wconv = dl_aligned_alloc(nw * dl_dtype_size(d.dt));
        if (!wconv) {
            s = dl_fail(DL_ERR_NOMEM, "matmul: cannot allocate %zu weight bytes", nw * dl_dtype_size(d.dt));
            goto err;
        }
        dl_kernels()->convert(d.dt, wconv, w_dt, w, (int64_t)nw);
    }
    dnnl_memory_desc_t src_md, wei_md, user_w_md, bias_md, dst_md;
    dnnl_dims_t sdims = {d.m, d.k}, sstr = {d.ldx, 1};
    dnnl_dims_t wdims = {d.k, d.n}, wstr = {1, d.k}; /* [N, K] row-major seen as [K, N] */
    dnnl_dims_t ddims = {d.m, d.n}, dstr = {d.ldy, 1};
    dnnl_dims_t bdims = {1, d.n};
    DNNL_TRY(dnnl_memory_desc_init_by_strides(&src_md, 2, sdims, dnnl_dt(d.dt), sstr), "src desc");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&wei_md, 2, wdims, dnnl_dt(d.dt), dnnl_format_tag_any), "weights desc");
    DNNL_TRY(dnnl_memory_desc_init_by_strides(&user_w_md, 2, wdims, dnnl_dt(d.dt), wstr), "user weights desc");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&bias_md, 2, bdims, dnnl_f32, dnnl_ab), "bias desc");
    DNNL_TRY(dnnl_memory_desc_init_by_strides(&dst_md, 2, ddims, dnnl_dt(d.dst_dt), dstr), "dst desc");
    dnnl_matmul_desc_t md;
    DNNL_TRY(dnnl_matmul_desc_init(&md, &src_md, &wei_md, bias ? &bias_md : NULL, &dst_md), "matmul desc");
    if ((s = make_attr(&attr, d.act)) != DL_OK) goto err;
    DNNL_TRY(dnnl_primitive_desc_create(&pd, &md, attr, g_eng, NULL), "matmul primitive descriptor");
    if ((s = prim_state_build(&mm->p, pd, packed_bytes ? NULL : &user_w_md, wconv ? wconv : w, packed_bytes, bias)) != DL_OK)
        goto err;
    {
        const char *impl = NULL;
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
        DL_DEBUG("matmul M=%lld K=%lld N=%lld %s: %s", (long long)d.m, (long long)d.k,
                 (long long)d.n, dl_dtype_name(d.dt), impl ? impl : "?");
    }
err:
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    dl_aligned_free(wconv);
    if (s != DL_OK) {
        dl_matmul_free(mm);
        return s;
    }
    *out = mm;
    return DL_OK;
}

dl_status dl_matmul_new(dl_matmul **out, const dl_matmul_desc *d, const void *w, dl_dtype w_dt, const float *bias) {
    return matmul_make(out, d, w, w_dt, 0, bias);
}

dl_status dl_matmul_new_packed(dl_matmul **out, const dl_matmul_desc *d, const void *packed, size_t bytes,
                               const float *bias) {
    if (!bytes) return dl_fail(DL_ERR_INVALID, "matmul: empty packed weights");
    return matmul_make(out, d, packed, d->dt, bytes, bias);
}

const void *dl_matmul_packed(const dl_matmul *mm, size_t *bytes) {
    *bytes = mm->p.wbytes;
    return mm->p.wext ? mm->p.wext : mm->p.wbuf;
}

dl_status dl_matmul_run(dl_matmul *mm, const void *x, void *y) { return prim_state_run(&mm->p, x, y); }

size_t dl_matmul_weight_bytes(const dl_matmul *mm) { return mm->p.wbytes; }

void dl_matmul_free(dl_matmul *mm) {
    if (!mm) return;
    prim_state_free(&mm->p);
    free(mm);
}

/* ---- convolution ---------------------------------------------------------------- */

struct dl_conv {
    dl_conv_desc d;
    prim_state p;
};

int64_t dl_conv_out_dim(const dl_conv_desc *d, int i) {
    return (d->in[i] + 2 * d->pad[i] - d->kernel[i]) / d->stride[i] + 1;
}

static dl_status conv_make(dl_conv **out, const dl_conv_desc *d, const void *w, dl_dtype w_dt, size_t packed_bytes,
                           const float *bias) {
    *out = NULL;
    dl_status s = engine();
    if (s != DL_OK) return s;
    if (d->ndim != 2 && d->ndim != 3)
        return dl_fail(DL_ERR_INVALID, "conv: ndim must be 2 or 3, got %d", d->ndim);
    if (d->dt != DL_F32 && d->dt != DL_BF16)
        return dl_fail(DL_ERR_UNSUPPORTED, "conv: dtype %s is not supported (f32, bf16)", dl_dtype_name(d->dt));
    for (int i = 0; i < d->ndim; i++)
        if (d->in[i] <= 0 || d->kernel[i] <= 0 || d->stride[i] <= 0 || d->pad[i] < 0 ||
            dl_conv_out_dim(d, i) <= 0)
            return dl_fail(DL_ERR_INVALID, "conv: bad geometry on axis %d (in %lld, kernel %lld, stride %lld, pad %lld)",
                           i, (long long)d->in[i], (long long)d->kernel[i], (long long)d->stride[i],
                           (long long)d->pad[i]);
    if (d->cin <= 0 || d->cout <= 0) return dl_fail(DL_ERR_INVALID, "conv: bad channel counts");
    dl_conv *c = calloc(1, sizeof *c);
    void *wconv = NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    if (!c) return dl_fail(DL_ERR_NOMEM, "conv: out of memory");
    c->d = *d;
    int nd = d->ndim + 2;
    dnnl_dims_t sdims = {1, d->cin}, wdims = {d->cout, d->cin}, ddims = {1, d->cout}, bdims = {d->cout};
    dnnl_dims_t strides, pad;
    int64_t wn = d->cout * d->cin;
    for (int i = 0; i < d->ndim; i++) {
        sdims[2 + i] = d->in[i];
        wdims[2 + i] = d->kernel[i];
        ddims[2 + i] = dl_conv_out_dim(d, i);
        strides[i] = d->stride[i];
        pad[i] = d->pad[i];
        wn *= d->kernel[i];
    }
    if (!packed_bytes && w_dt != d->dt) {
        wconv = dl_aligned_alloc((size_t)wn * dl_dtype_size(d->dt));
        if (!wconv) {
            s = dl_fail(DL_ERR_NOMEM, "conv: cannot allocate weights");
            goto err;
        }
        dl_kernels()->convert(d->dt, wconv, w_dt, w, wn);
    }
    dnnl_format_tag_t plain = d->ndim == 2 ? dnnl_abcd : dnnl_abcde;
    dnnl_memory_desc_t src_md, wei_md, user_w_md, bias_md, dst_md;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&src_md, nd, sdims, dnnl_dt(d->dt), plain), "src desc");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&wei_md, nd, wdims, dnnl_dt(d->dt), dnnl_format_tag_any), "weights desc");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&user_w_md, nd, wdims, dnnl_dt(d->dt), plain), "user weights desc");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&bias_md, 1, bdims, dnnl_f32, dnnl_a), "bias desc");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst_md, nd, ddims, dnnl_dt(d->dt), plain), "dst desc");
    dnnl_convolution_desc_t cd;
    DNNL_TRY(dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct,
                                                &src_md, &wei_md, bias ? &bias_md : NULL, &dst_md,
                                                strides, pad, pad),
             "convolution desc");
    if ((s = make_attr(&attr, DL_ACT_NONE)) != DL_OK) goto err;
    DNNL_TRY(dnnl_primitive_desc_create(&pd, &cd, attr, g_eng, NULL), "convolution primitive descriptor");
    if ((s = prim_state_build(&c->p, pd, packed_bytes ? NULL : &user_w_md, wconv ? wconv : w, packed_bytes, bias)) != DL_OK)
        goto err;
    {
        const char *impl = NULL;
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
        DL_DEBUG("conv%dd %lld->%lld %s: %s", d->ndim, (long long)d->cin, (long long)d->cout,
                 dl_dtype_name(d->dt), impl ? impl : "?");
    }
err:
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    dl_aligned_free(wconv);
    if (s != DL_OK) {
        dl_conv_free(c);
        return s;
    }
    *out = c;
    return DL_OK;
}

dl_status dl_conv_new(dl_conv **out, const dl_conv_desc *d, const void *w, dl_dtype w_dt, const float *bias) {
    return conv_make(out, d, w, w_dt, 0, bias);
}

dl_status dl_conv_new_packed(dl_conv **out, const dl_conv_desc *d, const void *packed, size_t bytes,
                             const float *bias) {
    if (!bytes) return dl_fail(DL_ERR_INVALID, "conv: empty packed weights");
    return conv_make(out, d, packed, d->dt, bytes, bias);
}

const void *dl_conv_packed(const dl_conv *c, size_t *bytes) {
    *bytes = c->p.wbytes;
    return c->p.wext ? c->p.wext : c->p.wbuf;
}

dl_status dl_conv_run(dl_conv *c, const void *x, void *y) { return prim_state_run(&c->p, x, y); }

void dl_conv_free(dl_conv *c) {
    if (!c) return;
    prim_state_free(&c->p);
    free(c);
}
