/* Shared building blocks of the model files: weight sources (checkpoint or program
 * artifact), linear layers and convolutions built through them, parameter vectors,
 * and running a kernel over the thread pool. */
#ifndef DIFFLET_MODELS_IMPL_H
#define DIFFLET_MODELS_IMPL_H

#include <omp.h>
#include <string.h>

#include "difflet/models.h"
#include "difflet/artifact.h"

/* The source a model loads through: `given` (a program's), or the component's
 * checkpoint opened here (closed by dl_ws_close). */
dl_status dl_ws_open(dl_wsrc **ws, dl_wsrc *given, dl_model_dir *dir, const char *component);
void dl_ws_close(dl_wsrc *ws);
/* Is a parameter present (checkpoint name; in an artifact, recorded under it)? */
int dl_ws_find(const dl_wsrc *ws, const char *name);
const char *dl_ws_label(const dl_wsrc *ws);
/* Activation buffer, counted into the model's arena size. */
void *dl_ws_alloc(dl_wsrc *ws, size_t bytes);

/* The activation arena: each buffer declares the phases [first, last] of the forward
 * pass in which it is live; dl_plan_commit places them at fixed offsets in one block,
 * letting buffers whose lifetimes do not intersect share bytes (greedy, largest
 * first, lowest offset that fits), and sets every declared pointer. */
enum { PLAN_MAX = 32 };
typedef struct {
    struct {
        void **dst;
        size_t bytes, off;
        int first, last;
    } b[PLAN_MAX];
    int n;
    size_t total;
} act_plan;
void dl_plan_add(act_plan *p, void *dst_ptr_addr, size_t bytes, int first, int last);
/* The per-thread scratch of self-attention over S tokens read from fused QKV rows. */
void dl_plan_attn_scratch(act_plan *p, void *dst_ptr_addr, dl_dtype dt, int64_t S, int64_t heads, int64_t head_dim,
                       int causal, int first, int last);
/* Places the buffers (offsets, total) without allocating: the same plan for a host
 * arena (dl_plan_commit) or a device one (src/cuda/device.c: dl_cuda_plan_commit). */
void dl_plan_place(act_plan *p);
/* Allocates the arena (*arena, 64-byte aligned; free with dl_aligned_free). */
dl_status dl_plan_commit(act_plan *p, dl_wsrc *ws, void **arena);

typedef struct {
    dl_matmul *mm;
    int64_t k, n;
    int64_t m, ldx; /* the rows and x's row stride it was built for */
    dl_dtype dt;    /* x's dtype */
    int cal;        /* int8 calibration: its layer's id + 1 (0: not observed) */
} lin;

/* int8 activation calibration (src/models/int8_calib.c; docs/int8.md): while it is on,
 * every linear made registers under "<component>/<weight name>" and each run's input
 * rows are quantized as W8A8 would and their error summed. */
int dl_calib_register(const char *component, const char *packed_name);
void dl_calib_observe(int cal, const void *x, int64_t m, int64_t k, int64_t ldx, dl_dtype dt);

/* y[m, n] = act(x[m, k] W^T + b) where W (and b) are the checkpoint tensors
 * `names[0..nparts)` concatenated along N (a fused QKV from q, k, v), each [n_i, k].
 * bnames may be NULL (no bias) or have NULL entries (zero bias for that part). */
dl_status dl_lin_load(lin *l, dl_wsrc *ws, const char *const *names, const char *const *bnames, int nparts,
                   const int64_t *n_parts, int64_t m, int64_t k, dl_dtype dt, dl_dtype dst_dt, dl_act act);
/* The same with output rows ldy elements apart (writing into a wider buffer). */
dl_status dl_lin_load_ld(lin *l, dl_wsrc *ws, const char *const *names, const char *const *bnames, int nparts,
                      const int64_t *n_parts, int64_t m, int64_t k, dl_dtype dt, dl_dtype dst_dt, dl_act act,
                      int64_t ldy);
/* A tensor-parallel slice of such a linear (Megatron): rows [row0, row0 + rows) of
 * every part (column parallel; rows 0 keeps all), and only the input columns of the
 * nseg segments [seg0[j], seg0[j] + segn[j]) (row parallel; nseg 0 keeps all). A
 * row-parallel rank other than the first sets no_bias: the bias is added once, by
 * the rank whose partial sum carries it. n_parts and k are the checkpoint's. */
typedef struct {
    int64_t row0, rows;
    int nseg;
    int64_t seg0[2], segn[2];
    int no_bias;
} lin_split;
dl_status dl_lin_load_split(lin *l, dl_wsrc *ws, const char *const *names, const char *const *bnames, int nparts,
                         const int64_t *n_parts, int64_t m, int64_t k, dl_dtype dt, dl_dtype dst_dt, dl_act act,
                         int64_t ldy, const lin_split *sp);
/* A linear from weights already in memory (w [n, k] f32, b [n] or NULL; the model's
 * own slicing), under the weight source's int8 scheme, recorded when compiling as
 * `pk` (packed; `pk#layout`, and `pk#q8` for int8) and `bk` (bias; NULL: none); from
 * a program (w, b unused), read back from those entries. */
dl_status dl_lin_make(lin *l, dl_wsrc *ws, const char *pk, const char *bk, const dl_matmul_desc *d, const float *w,
                      const float *b);
void dl_lin_free(lin *l);
/* one linear with bias named `<base>.weight` / `<base>.bias` (output rows ldy apart,
 * 0: n), optionally this rank's tensor-parallel slice (sp NULL: whole) */
dl_status dl_lin_named(lin *l, dl_wsrc *ck, const char *base, int64_t m, int64_t k, int64_t n, dl_dtype dt,
                       dl_dtype dst, dl_act act, int64_t ldy, const lin_split *sp);
/* fused q|k|v of the linears `<p><a>`, `<p><b>`, `<p><c>` (each [D, D]); with a split,
 * this rank's heads of each */
dl_status dl_lin_qkv(lin *l, dl_wsrc *ck, const char *p, const char *a, const char *b, const char *c, int64_t m,
                     int64_t D, dl_dtype dt, const lin_split *sp);
/* a float vector parameter of n elements */
dl_status dl_param_vec(dl_wsrc *ck, const char *name, int64_t n, float **out);
static inline dl_status lin_run(lin *l, const void *x, void *y) {
    if (l->cal) dl_calib_observe(l->cal, x, l->m, l->k, l->ldx, l->dt);
    return dl_matmul_run(l->mm, x, y);
}

/* Convolution `<base>.weight` / `<base>.bias` for desc d. */
dl_status dl_conv_load(dl_conv **c, dl_wsrc *ws, const char *base, const dl_conv_desc *d);

/* A float parameter of exactly this shape as malloc'd f32 (recorded when compiling). */
dl_status dl_param_f32(dl_wsrc *ws, const char *name, int ndim, const int64_t *shape, float **out);
/* The same, read in place from an artifact's mapping (no copy; large embedding
 * tables): *owned is what the model frees (NULL when mapped). */
dl_status dl_param_f32_map(dl_wsrc *ws, const char *name, int ndim, const int64_t *shape, const float **out, float **owned);
/* The same, never recorded (for weights that are recorded packed). */
dl_status dl_param_f32_nr(dl_wsrc *ws, const char *name, int ndim, const int64_t *shape, float **out);

/* Run a statement on every thread of the pool with ith / nth in scope. */
#define DL_PAR(...)                                                      \
    do {                                                                 \
        _Pragma("omp parallel") {                                        \
            int ith = omp_get_thread_num(), nth = omp_get_num_threads(); \
            __VA_ARGS__;                                                 \
        }                                                                \
    } while (0)

/* element i of a dt (f32 or bf16) buffer as f32, and v stored there rounded to
 * nearest even (a NaN stays a NaN): the VAEs' per-element loops */
static inline float dl_ld(dl_dtype dt, const void *p, int64_t i) {
    if (dt == DL_F32) return ((const float *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline void dl_st(dl_dtype dt, void *p, int64_t i, float v) {
    if (dt == DL_F32) {
        ((float *)p)[i] = v;
        return;
    }
    uint32_t u;
    memcpy(&u, &v, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN stays NaN */
        u = (u >> 16) | 0x40u;
    else
        u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    ((uint16_t *)p)[i] = (uint16_t)u;
}

/* ---- strided video activations (the causal video VAEs: hunyuan_vae.c, opensora_vae.c)
 * Element (c, t, i, j) of a [C, T, h, w] tensor stored at off + c sc + t st + i si + j sj:
 * a plain tensor, the interior of a padded conv input, or token-major rows. */
typedef struct {
    int64_t off, sc, st, si, sj;
} dl_vlayout;

static inline int64_t dl_vat(const dl_vlayout *o, int64_t c, int64_t t, int64_t i, int64_t j) {
    return o->off + c * o->sc + t * o->st + i * o->si + j * o->sj;
}

/* dst (ddt, layout o) = src [C, T frames, h, w] (sdt, channel stride lds, frames h w
 * apart), on the pool */
void dl_vcopy(dl_dtype ddt, void *dst, dl_vlayout o, dl_dtype sdt, const void *src, int64_t lds, int64_t C, int64_t T,
              int64_t h, int64_t w);
/* dst (dt, layout o) = act(GroupNorm(x)) over T frames of x [C, T, h, w] (xdt, channel
 * stride ldx): per group of C / G channels, mean and biased variance over its channels
 * x T h w (accumulated in double), y = x (rstd gw[c]) + (gb[c] - mean rstd gw[c]),
 * rstd = 1 / sqrt(var + eps), then SiLU when silu. st: [2 G] doubles of scratch. */
void dl_vgroup_norm(dl_dtype dt, void *dst, dl_vlayout o, dl_dtype xdt, const void *x, int64_t ldx, int64_t C,
                    int64_t T, int64_t h, int64_t w, int64_t G, const float *gw, const float *gb, double eps, int silu,
                    double *st);
/* x[c, 0:n) = a[c, 0:n) + (b ? b : x)[c, 0:n) for C channels of stride ld; x f32, a and
 * b in dt (a residual block's sum) */
void dl_vresidual(float *x, dl_dtype dt, const void *a, const void *b, int64_t ld, int64_t C, int64_t n);

/* y = x W^T for the first nch chunks of C rows (row strides l->k and l->n): a text
 * encoder's matmuls over just the chunks that hold tokens */
dl_status dl_lin_chunks(lin *l, const void *x, size_t xes, void *y, size_t yes, int64_t C, int64_t nch);
/* repeat_kv (GQA): K and V of rows [0, n) of fused [q (H Dh) | k (KV Dh) | v (KV Dh)]
 * rows into kv [n, 2 H Dh], query head h getting KV head h / (H / KV). Thread split
 * over rows. */
void dl_expand_kv(dl_dtype dt, const void *qkv, void *kv, int64_t H, int64_t KV, int64_t Dh, int64_t n, int ith, int nth);

/* f32 -> dt conversion of n elements on the pool */
#define to_dt(dt, dst, src, n) DL_PAR(dl_convert_t((dt), (dst), DL_F32, (src), (n), ith, nth))

/* ---- the DiT block library (dit.c) -----------------------------------------------
 * The joint stream of a diffusion transformer on this rank: T text rows then N image
 * (latent) rows, one [S, ...] view for joint attention, possibly split (Difflet §4).
 * A rank holds the T text rows and its Nl image rows (the cp shard [n0, n0 + Nl)),
 * its "local rows" [0, Sl); with TP it has Hl = H / tp heads (Dl = Hl * Dh columns
 * of q, k, v and attention) and Fl = F / tp MLP columns; with SP its residual
 * stream x holds only its token shard [xa, xa + xn) of the local rows. The model
 * sets the sizes, calls dl_dit_plan, plans the activations (x, o, h, qkv, att,
 * scratch) with its own, sets the RoPE tables, then calls dl_dit_alloc. */
typedef struct {
    dl_dit_split sp;
    dl_dtype dt;
    int64_t D, H, Dh, F;            /* width, heads, head dim, MLP width */
    int64_t T, N, S, L;             /* text rows, image rows, T + N, valid text keys [0, L) */
    int64_t Hl, Dl, Fl;             /* this rank's heads, attention and MLP columns */
    int64_t Nl, n0, Sl;             /* image rows [n0, n0 + Nl) of N; local rows T + Nl */
    int64_t xa, xn;                 /* residual rows held (SP shard of the local rows) */
    int64_t *cn0, *cnn;             /* [cp]: every cp rank's image row offset and count */
    int64_t *ts0, *tsn;             /* [tp]: every tp rank's SP shard */
    size_t *cnt, *dsp, *cnt2, *dsp2; /* collective counts scratch ([max(tp, cp)] each) */
    float *o_sh;                    /* [xn, D] f32: reduce-scattered residual update (SP) */
    void *cbuf, *cbuf2, *cbuf3;     /* CP exchange buffers (mode dependent) */
    float *part;                    /* partial attention outputs: o, m, l per part */
    int64_t part_rows;              /* rows x heads of one part */
    float *rope_cos, *rope_sin;     /* [Sl, Dh/2] of the local rows (malloc'd; freed here) */
    /* activations, owned by the model's arena */
    float *x, *o;                   /* [xn, D] residual, [Sl, D] f32 updates */
    void *h;                        /* [Sl, D] dt: normalised + modulated rows */
    void *qkv;                      /* [Sl, 3 Dl] dt: fused q | k | v */
    void *att;                      /* [Sl, >= Dl] dt: attention output (row stride given per call) */
    void *scratch;                  /* the fused attention's per-thread scratch */
} dl_dit;

/* Row layout of the split (sizes, shards) and its counts scratch. */
dl_status dl_dit_plan(dl_dit *c);
/* The CP exchange buffers and partial-attention outputs (after dl_dit_plan). */
dl_status dl_dit_alloc(dl_dit *c);
void dl_dit_free(dl_dit *c); /* what plan and alloc made, and the RoPE tables */
int dl_dit_sp_on(const dl_dit *c);
/* adaLN: h = LN(x) * (1 + scale) + shift over the rows held, text rows by (st, ht),
 * image rows by (si, hi); a NULL scale skips those rows */
void dl_dit_ln_mod(dl_dit *c, const float *st, const float *ht, const float *si, const float *hi);
/* gated residual: x += gate * update, text rows gated by gt, image rows by gi */
void dl_dit_gate_add(dl_dit *c, const float *gt, const float *gi);
/* after row-parallel layers: partial sums in o become the update (all-reduce; SP:
 * reduce-scatter to the rows held) */
dl_status dl_dit_reduce_out(dl_dit *c);
/* before column-parallel layers (SP): every rank's normalised rows into h */
dl_status dl_dit_gather_h(dl_dit *c);
/* per-head RMSNorm of q and k (text and image weights) and RoPE (pairs) */
void dl_dit_qk_norm_rope(dl_dit *c, const float *nq_t, const float *nk_t, const float *nq_i, const float *nk_i);
/* joint attention of the local rows into att (row stride os), by the split's mode:
 * one rank, Ulysses, ring or gather; padded text keys [L, T) never attended */
dl_status dl_dit_attention(dl_dit *c, int64_t os);
/* RMSNorm across all heads of `rows` rows (Wan: torch.nn.RMSNorm over the whole
 * projection; w: the full [D] weight): each row holds this rank's Dl columns at
 * x + r * stride; with TP the rows' sums of squares are all-reduced over the tp group
 * (ss: [rows] f32 scratch) and the rank's slice of w applies. */
dl_status dl_dit_rmsnorm_full(dl_dit *c, void *x, int64_t rows, int64_t stride, const float *w, float eps, float *ss);
/* that norm on q and k of the local rows, then RoPE (pairs); ss: [Sl] scratch */
dl_status dl_dit_qk_norm_full_rope(dl_dit *c, const float *nq, const float *nk, float eps, float *ss);
/* cross-attention (Wan, OpenSora): the local image rows' queries (Nl rows, this
 * rank's Hl heads, row stride qs) over nk context keys and values (valid [0,
 * valid), row stride kvs) into out (row stride os). The context is on every cp
 * rank, so no rank talks to another; TP keeps whole heads. */
void dl_dit_cross_attention(dl_dit *c, const void *q, int64_t qs, const void *k, const void *v, int64_t kvs, int64_t nk,
                            int64_t valid, void *out, int64_t os);
/* diffusers' Timesteps(dim, flip_sin_to_cos=True, downscale_freq_shift=0) of t, in
 * f32 as torch computes it: [cos(t f_i) | sin(t f_i)], f_i = exp(-ln(10^4) i / (dim/2)) */
void dl_dit_timestep_proj(float t, int64_t dim, float *out);
/* SwiGLU: y[r, 0:f) = silu(ab[r, 0:f)) * ab[r, f:2f) for `rows` rows of ab (row
 * stride 2f) into y (row stride ldy), in the stream's dtype (each product rounded
 * as torch rounds it). */
void dl_dit_swiglu(dl_dit *c, void *y, int64_t ldy, const void *ab, int64_t rows, int64_t f);
/* every cp rank's image rows of a [N, cols] f32 output (each computed [Nl, cols] at
 * its n0): all-gathered in place */
dl_status dl_dit_gather_image_rows(dl_dit *c, float *out, int64_t cols);

/* ---- the dual-stream (MMDiT) block: FLUX's double block, Qwen-Image's block ----------
 * per stream s in {txt, img}, own weights, one joint attention:
 *   shift1, scale1, gate1, shift2, scale2, gate2 = mod_s(silu(temb))
 *   h = LN(x_s)(1 + scale1) + shift1;  q, k, v = qkv_s(h);  q, k = RMS(q), RMS(k) (per head)
 *   x_s += gate1 * out_s(attention over [txt; img] with RoPE);  x_s += gate2 * ff_s(LN(x_s)(1 + scale2) + shift2)
 * with the MLP D -> F (GELU-tanh) -> D. Names differ per model (mod, MLP); the
 * attention's are diffusers' Attention with added (context) projections. */
typedef struct {
    lin mod_img, mod_txt;                     /* D -> 6D */
    lin qkv_img, qkv_txt;                     /* to_q|to_k|to_v, add_q|add_k|add_v_proj: D -> 3D */
    float *nq_img, *nk_img, *nq_txt, *nk_txt; /* [head_dim] */
    lin out_img, out_txt;                     /* to_out.0, to_add_out */
    lin ff1_img, ff2_img, ff1_txt, ff2_txt;
} dl_dit_dual;
typedef struct {
    const char *mod_img, *mod_txt, *ff1_img, *ff2_img, *ff1_txt, *ff2_txt; /* under the block's prefix */
} dl_dit_dual_names;
/* block `prefix` ("transformer_blocks.3."), this rank's TP slices */
dl_status dl_dit_dual_load(dl_dit_dual *b, dl_dit *c, dl_wsrc *ck, const char *prefix, const dl_dit_dual_names *nm);
void dl_dit_dual_free(dl_dit_dual *b);
/* one block on the stream: vec is silu(temb) in the stream's dtype [D]; mod_img,
 * mod_txt [6D] f32 and f [Sl, Fl] (dt) are the caller's scratch */
dl_status dl_dit_dual_run(dl_dit *c, dl_dit_dual *b, const void *vec, float *mod_img, float *mod_txt, void *f);

/* ---- the single-stream block: FLUX's and HunyuanVideo's single block --------------
 * one weight set over all S rows:
 *   shift, scale, gate = mod(silu(temb));  h = LN(x)(1 + scale) + shift
 *   x += gate * proj_out([attention(RoPE(RMS(q)), RoPE(RMS(k)), v) | gelu_tanh(proj_mlp(h))])
 * (diffusers' names: norm.linear, attn.to_q|to_k|to_v, attn.norm_q|norm_k, proj_mlp,
 * proj_out); the MLP is F wide. */
typedef struct {
    lin mod;                        /* D -> 3D */
    lin qkv;                        /* D -> 3D */
    float *nq, *nk;                 /* [head_dim] */
    lin mlp;                        /* proj_mlp: D -> F, GELU-tanh fused, into att's columns [Dl, Dl + Fl) */
    lin out;                        /* proj_out: D + F -> D */
} dl_dit_single;
/* block `prefix` ("single_transformer_blocks.3."), this rank's TP slices; att must
 * be planned [Sl, Dl + Fl] */
dl_status dl_dit_single_load(dl_dit_single *b, dl_dit *c, dl_wsrc *ck, const char *prefix);
void dl_dit_single_free(dl_dit_single *b);
/* one block: vec is silu(temb) [D] in dt; mod [3D] f32 is the caller's scratch */
dl_status dl_dit_single_run(dl_dit *c, dl_dit_single *b, const void *vec, float *mod);

/* ---- the conditioning vector (FLUX, HunyuanVideo: time_text_embed) ------------------
 *   temb = timestep_embedder(proj(t)) [+ guidance_embedder(proj(g))] + text_embedder(pooled)
 * each embedder Linear -> SiLU -> Linear, proj diffusers' Timesteps(256); t and g as
 * the model's forward receives them (FLUX scales by 1000 itself, HunyuanVideo's
 * pipeline does). Own one-row buffers (a few KiB, malloc'd at load). */
typedef struct {
    lin t1, t2, g1, g2, p1, p2;
    int guidance;
    int64_t D, Pd;
    dl_dtype dt;
    void *vin, *vh;                 /* [max(256, Pd, D)] dt */
    float *tproj, *tmp;             /* [256], [D] */
} dl_dit_cond;
/* `<prefix>timestep_embedder.linear_1` ... (prefix "time_text_embed."), pooled width
 * Pd; a checkpoint with a guidance embedder when guidance is 0 is refused */
dl_status dl_dit_cond_load(dl_dit_cond *e, dl_dit *c, dl_wsrc *ck, const char *prefix, int64_t Pd, int guidance,
                           const char *file);
void dl_dit_cond_free(dl_dit_cond *e);
/* temb [D] f32 and vec = silu(temb) [D] in dt */
dl_status dl_dit_cond_run(dl_dit_cond *e, const float *pooled, float t, float g, float *temb, void *vec);

/* The step-caching probe's score (TeaCache's relative L1 change): sum |cur - prev| /
 * sum |prev| over this rank's n values, summed over the cp group in rank order so
 * every rank gets the same score (0 when prev is all zeros). */
dl_status dl_dit_probe_score(const dl_dit *c, const float *cur, const float *prev, int64_t n, double *score);
/* The probe's feature and score: cur = LN(x)(1 + scale) + shift over `rows` rows of
 * x [rows, D] f32; score its change against prev when *have (else 0); then prev =
 * cur and *have = 1. */
dl_status dl_dit_probe_feature(const dl_dit *c, float *cur, float *prev, int *have, const float *x, int64_t rows,
                               const float *scale, const float *shift, double *score);

/* "<prefix><name>" into buf (names with an optional model prefix). */
const char *dl_pname(char *buf, size_t n, const char *prefix, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif
