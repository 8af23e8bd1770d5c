/* STDiT3 (OpenSora 1.2, hpcaitech/Open-Sora v1.2.0): a diffusion transformer over
 * video latents whose depth alternates a spatial block (attention among the S tokens
 * of one frame) and a temporal block (attention among the T' tokens of one position,
 * RoPE over the frame index). Built for a fixed latent grid, caption length and batch
 * (1, or 2: both CFG branches in every linear).
 *
 *   x = PatchEmbed3D(zero-pad(latents)) + pos(h', w')          // [N, D], token n = t' S + h' W' + w'
 *   t = t_embedder(sin(timestep)) + fps_embedder(sin(fps))      // [D]; sin(v) = [cos(v f) | sin(v f)], 256
 *   t_mlp = t_block(silu(t))                                     // [6D]
 *   y = y_proj(caption)                                          // [L, D] (fc1, GELU-tanh, fc2); [0, valid) used
 *   for i < depth: x = spatial_blocks[i](x); x = temporal_blocks[i](x), each:
 *     shift1, scale1, gate1, shift2, scale2, gate2 = scale_shift_table [6, D] + t_mlp
 *     q, k, v = qkv(LN(x)(1 + scale1) + shift1);  q, k = RMS_Dh(q), RMS_Dh(k)   (per head)
 *     temporal blocks only: q, k = RoPE(q), RoPE(k)   (interleaved pairs, angle t' freq_k)
 *     x += gate1 * proj(attn(q, k, v))                 // per frame (spatial) / per position (temporal)
 *     x += cross_attn.proj(attn(q_linear(x), kv_linear(y)))   // no norm, keys [0, valid)
 *     x += gate2 * fc2(gelu_tanh(fc1(LN(x)(1 + scale2) + shift2)))
 *   out = unpatchify(linear(LN(x)(1 + sst[1] + t) + sst[0] + t))   // t, not t_mlp; cropped to [Cout, F, H, W]
 *
 * pos(h', w') = [e(w' / scale * base / W') | e(h' / scale * base / H')] (the column first:
 * the reference's meshgrid), e(p) = [sin(p g_k) | cos(p g_k)], g_k = 10000^(-2k / (D/2)),
 * base = round(sqrt(S)), scale = sqrt(height width) / input_sq_size, in f32, the same
 * for every frame. In bf16 the timestep is rounded to bf16 first (timestep.to(dtype)).
 * Unpatchify: the linear's column ((a ph + b) pw + c) Cout + o of token (t', h', w') is
 * out[o, t' pt + a, h' ph + b, w' pw + c].
 *
 * Splits: TP is Megatron's (heads of qkv, proj and the cross-attention, MLP columns;
 * the Q/K norm is per head, so exact). CP is OpenSora's dynamic sequence parallelism
 * (DSP; cp_mode does not apply): a cp rank holds a shard of the frames (all their S
 * tokens) in the spatial blocks and a shard of the positions (all T' frames) in the
 * temporal blocks. An all-to-all of the residual stream switches between the two
 * around each temporal block (two per depth; trading q, k, v and the attention output
 * instead would take four); cross-attention and the MLPs are row-local, the final
 * layer runs in the temporal layout and its rows are all-gathered.
 *
 * Not here: the reference's x_mask / t0 conditioning on given frames (image- and
 * video-to-video), which is not an input of this interface. */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/comm.h"
#include "difflet/opensora.h"
#include "models/models_impl.h"

enum { FREQ = 256 }; /* the timestep / fps sinusoid's width */

/* the config's sizes and this rank's place in the grid (transformer and probe) */
typedef struct {
    int64_t D, H, Dh, F, depth, Cin, Cout, Ccap, Lmax, P[3];
    double sq;                      /* input_sq_size */
    int64_t lat[3], G[3], S, N;     /* latent grid (F, H, W); token grid (T', H', W'); S = H' W'; N = T' S */
    int64_t f0, Tl, s0, Sl;         /* this cp rank's frames [f0, f0 + Tl) and positions [s0, s0 + Sl) */
} st_geom;

/* What the transformer and its probe share: the patch + position embedding of this
 * rank's frames and the time conditioning. Buffers are planned into the owner's arena
 * (phase 0; t up to 2, t_mlp up to 1; pos always: it is kept for the next call). */
typedef struct {
    dl_dtype dt;
    st_geom g;
    dl_conv *patch;                 /* x_embedder.proj: [Cin, Tl pt, H' ph, W' pw] -> [D, Tl S] */
    lin t1, t2, f1, f2, tb;         /* t_embedder.mlp.0 / 2, fps_embedder.mlp.0 / 2, t_block.1 */
    void *lat_in, *pe;              /* [Cin, Tl pt, H' ph, W' pw], [D, Tl S] dt */
    void *vin, *vh;                 /* [max(256, D)] dt: one-row matmul inputs */
    float *freq, *tmp;              /* [256], [D] */
    float *temb, *femb, *t, *tmlp;  /* [D], [D], [D] = temb + femb, [6D] */
    float *pos;                     /* [S, D]: the position embedding for pos_hw */
    float pos_hw[2];                /* the height and width pos holds (0, 0: none yet) */
} st_embed;

typedef struct {
    lin qkv;                        /* attn.qkv: D -> 3 Dl (this rank's heads of q | k | v) */
    float *nq, *nk;                 /* attn.q_norm / k_norm: [Dh] */
    lin proj;                       /* attn.proj: Dl -> D, f32 (row parallel) */
    lin q2;                         /* cross_attn.q_linear: D -> Dl */
    lin kv2;                        /* cross_attn.kv_linear over the caption rows: D -> 2 Dl (k | v) */
    lin proj2;                      /* cross_attn.proj: Dl -> D, f32 */
    lin fc1, fc2;                   /* mlp.fc1 (GELU-tanh fused): D -> Fl; mlp.fc2: Fl -> D, f32 */
    float *sst;                     /* scale_shift_table [6, D] */
} st_block;

struct dl_stdit3 {
    dl_dit c;                       /* sizes, split, the stream's activations (rows per phase: views) */
    int B;                          /* CFG branches per call */
    st_geom g;
    st_embed e;
    int64_t T, Rs, Rt, Rmax;        /* caption rows; rows per branch: spatial Tl S, temporal T' Sl */
    lin y1, y2;                     /* y_embedder.y_proj.fc1 (GELU-tanh), fc2: [B T, Ccap] -> [B T, D] */
    st_block *sb, *tb;              /* spatial_blocks, temporal_blocks [depth] */
    float *sst_f;                   /* final_layer.scale_shift_table [2, D] */
    lin fin;                        /* final_layer.linear: D -> PP Cout, f32, over the temporal rows */
    const float *null_y;            /* y_embedder.y_embedding [Lmax, Ccap] */
    float *null_own;                /* what frees it (NULL when mapped from a program) */
    int64_t *rb, *rs;               /* [S]: row rb[s] + t' rs[s] of the gathered output holds (t', s) */
    size_t *cnt;                    /* [4 cp]: all-to-all / gather counts and displacements */
    size_t tslice;                  /* one thread's temporal attention scratch (bytes, aligned) */
    /* activations (the stream's are in c) */
    void *txt_in, *txt_h, *ctx;     /* [B T, Ccap], [B T, D], [B T, D] dt */
    void *kv2, *f;                  /* [B T, 2 Dl], [B Rmax, Fl] dt */
    float *mod;                     /* [6D] */
    float *pout;                    /* [B Rt, PP Cout] f32 */
    float *full;                    /* [N, PP Cout] f32: every cp rank's rows (cp > 1) */
    float *spare;                   /* a batch-2 program's discarded second output (one-branch calls) */
    void *arena;
    dl_stdit3_tap tap;
    void *tap_ctx;
};

int64_t dl_stdit3_in_channels(const dl_stdit3 *m) { return m->g.Cin; }
int64_t dl_stdit3_out_channels(const dl_stdit3 *m) { return m->g.Cout; }
int64_t dl_stdit3_caption_channels(const dl_stdit3 *m) { return m->g.Ccap; }
int64_t dl_stdit3_max_length(const dl_stdit3 *m) { return m->g.Lmax; }
int64_t dl_stdit3_heads(const dl_stdit3 *m) { return m->g.H; }
int dl_stdit3_batch(const dl_stdit3 *m) { return m->B; }
const float *dl_stdit3_null_caption(const dl_stdit3 *m) { return m->null_y; }
void dl_stdit3_set_tap(dl_stdit3 *m, dl_stdit3_tap fn, void *ctx) { m->tap = fn, m->tap_ctx = ctx; }

#define RUN(l, x, y)                                         \
    do {                                                     \
        if ((s = lin_run((l), (x), (y))) != DL_OK) return s; \
    } while (0)
#define TRY(e)                            \
    do {                                  \
        if ((s = (e)) != DL_OK) return s; \
    } while (0)

/* shard [off, off + cnt) of n items for part i of k */
static void shard(int64_t n, int i, int k, int64_t *off, int64_t *cnt) {
    *off = n * i / k;
    *cnt = n * (i + 1) / k - *off;
}

/* ---- config and geometry ------------------------------------------------------------ */

static dl_status read_config(st_geom *g, const cJSON *cfg, const char *file) {
    double ratio;
    int pred_sigma, qk_norm, skip_y;
    const char *mt;
    dl_status s;
    if ((s = dl_cfg_str(cfg, file, "model_type", "STDiT3", &mt)) || (s = dl_cfg_int(cfg, file, "hidden_size", 1152, &g->D)) ||
        (s = dl_cfg_int(cfg, file, "depth", 28, &g->depth)) || (s = dl_cfg_int(cfg, file, "num_heads", 16, &g->H)) ||
        (s = dl_cfg_int(cfg, file, "in_channels", 4, &g->Cin)) ||
        (s = dl_cfg_int(cfg, file, "caption_channels", 4096, &g->Ccap)) ||
        (s = dl_cfg_int(cfg, file, "model_max_length", 300, &g->Lmax)) ||
        (s = dl_cfg_float(cfg, file, "mlp_ratio", 4.0, &ratio)) ||
        (s = dl_cfg_float(cfg, file, "input_sq_size", 512, &g->sq)) ||
        (s = dl_cfg_bool(cfg, file, "pred_sigma", 1, &pred_sigma)) || (s = dl_cfg_bool(cfg, file, "qk_norm", 1, &qk_norm)) ||
        (s = dl_cfg_bool(cfg, file, "skip_y_embedder", 0, &skip_y)))
        return s;
    if (strcmp(mt, "STDiT3"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: model_type \"%s\" is not STDiT3", file, mt);
    if (skip_y)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: skip_y_embedder is true: captions already projected to the hidden width are not supported (STDiT3's y_embedder runs here)", file);
    if (!qk_norm)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: qk_norm false is not supported (OpenSora 1.2 normalises q and k per head)", file);
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(cfg, "patch_size");
    g->P[0] = 1, g->P[1] = 2, g->P[2] = 2;
    if (ps && !cJSON_IsNull(ps)) {
        if (!cJSON_IsArray(ps) || cJSON_GetArraySize(ps) != 3)
            return dl_fail(DL_ERR_FORMAT, "`%s`: patch_size must be 3 integers", file);
        for (int i = 0; i < 3; i++) {
            const cJSON *v = cJSON_GetArrayItem(ps, i);
            if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 64 || v->valuedouble != (double)(int64_t)v->valuedouble)
                return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: patch_size must be 3 integers from 1 to 64", file);
            g->P[i] = (int64_t)v->valuedouble;
        }
    }
    if (g->D <= 0 || g->H <= 0 || g->depth <= 0 || g->depth > 4096 || g->Cin <= 0 || g->Ccap <= 0 || g->Lmax <= 0 ||
        !(ratio > 0) || !(g->sq > 0))
        return dl_fail(DL_ERR_FORMAT, "`%s`: inconsistent sizes (hidden_size, depth, num_heads, in_channels, caption_channels, model_max_length, mlp_ratio and input_sq_size must be positive)", file);
    if (g->D % g->H)
        return dl_fail(DL_ERR_FORMAT, "`%s`: hidden_size %lld is not divisible by num_heads %lld", file, (long long)g->D,
                       (long long)g->H);
    g->Dh = g->D / g->H;
    if (g->Dh % 2)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: head dim %lld is odd (RoPE rotates pairs)", file, (long long)g->Dh);
    if (g->D % 4)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: hidden_size %lld is not divisible by 4 (the 2-D sin-cos position embedding)", file,
                       (long long)g->D);
    g->F = (int64_t)((double)g->D * ratio); /* int(hidden_size * mlp_ratio) */
    g->Cout = pred_sigma ? 2 * g->Cin : g->Cin;
    if (g->F <= 0) return dl_fail(DL_ERR_FORMAT, "`%s`: mlp_ratio %g gives no MLP width", file, ratio);
    return DL_OK;
}

/* The config, the token grid of a latent grid and this rank's frames and positions;
 * the split checked (the DSP has no head condition on cp). */
static dl_status setup(st_geom *g, dl_model_dir *dir, const char *component, const int64_t lat[3], const dl_dit_split *sp,
                       const char *who) {
    char file[512], why[256];
    snprintf(file, sizeof file, "%s/config.json", component);
    const cJSON *cfg;
    dl_status s;
    if ((s = dl_model_dir_config(dir, component, &cfg)) || (s = read_config(g, cfg, file))) return s;
    for (int i = 0; i < 3; i++) {
        if (lat[i] <= 0 || lat[i] > (1 << 16))
            return dl_fail(DL_ERR_INVALID, "%s: latent grid %lldx%lldx%lld (frames x height x width) out of range", who,
                           (long long)lat[0], (long long)lat[1], (long long)lat[2]);
        g->lat[i] = lat[i];
        g->G[i] = (lat[i] + g->P[i] - 1) / g->P[i]; /* padded to the patch, cropped back at the end */
    }
    g->S = g->G[1] * g->G[2];
    g->N = g->G[0] * g->S;
    dl_dit_split chk = *sp;
    chk.cp_mode = DL_CP_GATHER;
    const char *bad = dl_dit_split_check(&chk, g->H, why, sizeof why);
    if (bad) return dl_fail(DL_ERR_INVALID, "%s: parallel split refused: %s", who, bad);
    if (sp->sp && sp->tp > 1)
        return dl_fail(DL_ERR_UNSUPPORTED, "%s: parallel split refused: sequence parallelism on the TP group (sp) is not supported; split the frames with cp (OpenSora's dynamic sequence parallelism)", who);
    if (sp->cp > g->G[0] || sp->cp > g->S)
        return dl_fail(DL_ERR_INVALID, "%s: parallel split refused: cp=%d ranks for %lld latent frames and %lld positions after patching (OpenSora's dynamic sequence parallelism gives every cp rank at least one of each)",
                       who, sp->cp, (long long)g->G[0], (long long)g->S);
    shard(g->G[0], sp->cp_rank, sp->cp, &g->f0, &g->Tl);
    shard(g->S, sp->cp_rank, sp->cp, &g->s0, &g->Sl);
    return DL_OK;
}

/* ---- the embedding (shared with the probe) ------------------------------------------ */

static void embed_free(st_embed *e) {
    lin *ls[] = {&e->t1, &e->t2, &e->f1, &e->f2, &e->tb};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) dl_lin_free(ls[i]);
    dl_conv_free(e->patch);
    e->patch = NULL;
}

static dl_status embed_load(st_embed *e, dl_wsrc *ck) {
    const st_geom *g = &e->g;
    const int64_t D = g->D;
    const dl_dtype dt = e->dt;
    dl_conv_desc pd = {.ndim = 3, .cin = g->Cin, .cout = D, .in = {g->Tl * g->P[0], g->G[1] * g->P[1], g->G[2] * g->P[2]},
                       .kernel = {g->P[0], g->P[1], g->P[2]}, .stride = {g->P[0], g->P[1], g->P[2]}, .dt = dt};
    dl_status s;
    if ((s = dl_conv_load(&e->patch, ck, "x_embedder.proj", &pd)) ||
        (s = dl_lin_named(&e->t1, ck, "t_embedder.mlp.0", 1, FREQ, D, dt, dt, DL_ACT_SILU, 0, NULL)) ||
        (s = dl_lin_named(&e->t2, ck, "t_embedder.mlp.2", 1, D, D, dt, DL_F32, DL_ACT_NONE, 0, NULL)) ||
        (s = dl_lin_named(&e->f1, ck, "fps_embedder.mlp.0", 1, FREQ, D, dt, dt, DL_ACT_SILU, 0, NULL)) ||
        (s = dl_lin_named(&e->f2, ck, "fps_embedder.mlp.2", 1, D, D, dt, DL_F32, DL_ACT_NONE, 0, NULL)) ||
        (s = dl_lin_named(&e->tb, ck, "t_block.1", 1, D, 6 * D, dt, DL_F32, DL_ACT_NONE, 0, NULL)))
        return s;
    return DL_OK;
}

static void embed_plan(st_embed *e, act_plan *pl) {
    const st_geom *g = &e->g;
    const size_t es = dl_dtype_size(e->dt);
    const int64_t D = g->D, vmax = D > FREQ ? D : FREQ;
    const int64_t nin = g->Cin * g->Tl * g->P[0] * g->G[1] * g->P[1] * g->G[2] * g->P[2];
    dl_plan_add(pl, &e->lat_in, (size_t)nin * es, 0, 0);
    dl_plan_add(pl, &e->pe, (size_t)(D * g->Tl * g->S) * es, 0, 0);
    dl_plan_add(pl, &e->vin, (size_t)vmax * es, 0, 0);
    dl_plan_add(pl, &e->vh, (size_t)vmax * es, 0, 0);
    dl_plan_add(pl, &e->freq, FREQ * 4, 0, 0);
    dl_plan_add(pl, &e->tmp, (size_t)D * 4, 0, 0);
    dl_plan_add(pl, &e->temb, (size_t)D * 4, 0, 0);
    dl_plan_add(pl, &e->femb, (size_t)D * 4, 0, 0);
    dl_plan_add(pl, &e->t, (size_t)D * 4, 0, 2);
    dl_plan_add(pl, &e->tmlp, (size_t)(6 * D) * 4, 0, 1);
    dl_plan_add(pl, &e->pos, (size_t)(g->S * D) * 4, 0, 2);
}

/* out [D] = mlp.2(silu(mlp.0(sin(v)))) */
static dl_status embed_mlp(st_embed *e, lin *a, lin *b, float v, float *out) {
    dl_status s;
    dl_dit_timestep_proj(v, FREQ, e->freq);
    dl_convert_t(e->dt, e->vin, DL_F32, e->freq, FREQ, 0, 1); /* one row: cheaper than waking the pool */
    RUN(a, e->vin, e->vh);
    RUN(b, e->vh, out);
    return DL_OK;
}

/* t = t_embedder(timestep) + fps_embedder(fps) and t_mlp = t_block(silu(t)) */
static dl_status embed_time(st_embed *e, float timestep, float fps) {
    const int64_t D = e->g.D;
    dl_status s;
    if (e->dt == DL_BF16) timestep = dl_bf16_to_f32(dl_f32_to_bf16(timestep)); /* timestep.to(dtype) */
    TRY(embed_mlp(e, &e->t1, &e->t2, timestep, e->temb));
    TRY(embed_mlp(e, &e->f1, &e->f2, fps, e->femb));
    for (int64_t i = 0; i < D; i++) {
        e->t[i] = e->temb[i] + e->femb[i];
        e->tmp[i] = e->t[i] / (1.f + expf(-e->t[i]));
    }
    dl_convert_t(e->dt, e->vin, DL_F32, e->tmp, D, 0, 1);
    RUN(&e->tb, e->vin, e->tmlp);
    return DL_OK;
}

/* the position embedding [S, D] of a height x width video (pixels), in f32 */
static void embed_pos(st_embed *e, float height, float width) {
    const int64_t D = e->g.D, Hg = e->g.G[1], Wg = e->g.G[2], q = D / 4;
    const double base = round(sqrt((double)(Hg * Wg))); /* sqrt(S) is never k + 0.5: banker's rounding agrees */
    const float scale = (float)(sqrt((double)height * (double)width) / e->g.sq);
    const float bh = (float)(base / (double)Hg), bw = (float)(base / (double)Wg);
    for (int64_t i = 0; i < Hg; i++)
        for (int64_t j = 0; j < Wg; j++) {
            const float ph = ((float)i / scale) * bh, pw = ((float)j / scale) * bw;
            float *p = e->pos + (i * Wg + j) * D;
            for (int64_t k = 0; k < q; k++) {
                const float f = 1.f / powf(10000.f, (float)(2 * k) / (float)(D / 2));
                p[k] = sinf(pw * f), p[q + k] = cosf(pw * f);
                p[2 * q + k] = sinf(ph * f), p[3 * q + k] = cosf(ph * f);
            }
        }
    e->pos_hw[0] = height, e->pos_hw[1] = width;
}

/* x [Tl S, D] f32 = the patch embedding of this rank's frames (zero-padded at the end
 * of W, H and T to the patch) plus the position embedding; tap (may be NULL) sees
 * both halves */
static dl_status embed_patch(st_embed *e, const float *lat, float height, float width, float *x, dl_stdit3_tap tap,
                             void *tctx) {
    const st_geom *g = &e->g;
    const int64_t D = g->D, S = g->S, rows = g->Tl * S, F = g->lat[0], H = g->lat[1], W = g->lat[2];
    const int64_t Fp = g->Tl * g->P[0], Hp = g->G[1] * g->P[1], Wp = g->G[2] * g->P[2], fa = g->f0 * g->P[0];
    const dl_dtype dt = e->dt;
    const size_t es = dl_dtype_size(dt);
    char *li = e->lat_in;
    dl_status s;
#pragma omp parallel for schedule(static)
    for (int64_t cf = 0; cf < g->Cin * Fp; cf++) {
        const int64_t c = cf / Fp, f = fa + cf % Fp;
        for (int64_t h = 0; h < Hp; h++) {
            char *dst = li + (size_t)((cf * Hp + h) * Wp) * es;
            if (f < F && h < H) {
                dl_convert_t(dt, dst, DL_F32, lat + ((c * F + f) * H + h) * W, W, 0, 1);
                memset(dst + (size_t)W * es, 0, (size_t)(Wp - W) * es);
            } else {
                memset(dst, 0, (size_t)Wp * es);
            }
        }
    }
    TRY(dl_conv_run(e->patch, e->lat_in, e->pe));
    if (e->pos_hw[0] != height || e->pos_hw[1] != width) embed_pos(e, height, width);
    const char *pe = e->pe;
    const float *pos = e->pos;
    const int add = !tap; /* with a tap, the two halves are shown apart */
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t d = 0; d < D; d++)
            x[r * D + d] = dl_ld(dt, pe, d * rows + r) + (add ? pos[(r % S) * D + d] : 0.f);
    if (!tap) return DL_OK;
    tap(tctx, "patch_embed", x, DL_F32, rows, D);
    tap(tctx, "pos_emb", pos, DL_F32, S, D);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t d = 0; d < D; d++) x[r * D + d] += pos[(r % S) * D + d];
    tap(tctx, "x_embed", x, DL_F32, rows, D);
    return DL_OK;
}

/* ---- loading -------------------------------------------------------------------------- */

/* This rank's heads of a fused checkpoint projection `<base>` (weight [parts D, D],
 * bias [parts D]: attn.qkv's q | k | v, cross_attn.kv_linear's k | v) as one linear
 * D -> parts Dl: rows [j D + tr Dl, j D + (tr + 1) Dl) of each part j. lin_split takes
 * one row range for all parts of a linear, so the slice is made here (layers.c's
 * conventions: `#packed`, `#layout`, `#bias`), recorded under its own name. */
static dl_status lin_heads(lin *l, dl_wsrc *ws, const char *base, int parts, int64_t m, int64_t D, int64_t Dl, int tr,
                           dl_dtype dt) {
    char wn[300], bn[300], pk[300], bk[300];
    snprintf(wn, sizeof wn, "%s.weight", base);
    snprintf(bn, sizeof bn, "%s.bias", base);
    snprintf(pk, sizeof pk, "%s.weight#heads#packed", base);
    snprintf(bk, sizeof bk, "%s.weight#heads#bias", base);
    const int64_t n = parts * Dl;
    dl_matmul_desc d = {.m = m, .k = D, .n = n, .dt = dt, .dst_dt = dt, .act = DL_ACT_NONE};
    memset(l, 0, sizeof *l);
    if (!ws->ck) return dl_lin_make(l, ws, pk, bk, &d, NULL, NULL); /* a program: the packed slice in place */
    const int64_t wsh[2] = {parts * D, D}, bsh[1] = {parts * D};
    float *w = NULL, *b = NULL, *sw = malloc((size_t)(n * D) * 4), *sb = malloc((size_t)n * 4);
    dl_status s = !sw || !sb ? dl_fail(DL_ERR_NOMEM, "out of memory loading `%s`", wn) : DL_OK;
    if (s == DL_OK && (s = dl_param_f32_nr(ws, wn, 2, wsh, &w)) == DL_OK && (s = dl_param_f32_nr(ws, bn, 1, bsh, &b)) == DL_OK) {
        for (int j = 0; j < parts; j++) {
            memcpy(sw + j * Dl * D, w + (j * D + tr * Dl) * D, (size_t)(Dl * D) * 4);
            memcpy(sb + j * Dl, b + j * D + tr * Dl, (size_t)Dl * 4);
        }
        s = dl_lin_make(l, ws, pk, bk, &d, sw, sb);
    }
    free(w), free(b), free(sw), free(sb);
    return s;
}

/* a fused projection: whole (one rank) or this rank's heads (TP) */
static dl_status lin_fused(dl_stdit3 *m, lin *l, dl_wsrc *ck, const char *base, int parts, int64_t rows) {
    const dl_dit *c = &m->c;
    if (c->sp.tp == 1) return dl_lin_named(l, ck, base, rows, c->D, parts * c->D, c->dt, c->dt, DL_ACT_NONE, 0, NULL);
    return lin_heads(l, ck, base, parts, rows, c->D, c->Dl, c->sp.tp_rank, c->dt);
}

static void block_free(st_block *b) {
    lin *ls[] = {&b->qkv, &b->proj, &b->q2, &b->kv2, &b->proj2, &b->fc1, &b->fc2};
    for (size_t k = 0; k < sizeof ls / sizeof ls[0]; k++) dl_lin_free(ls[k]);
    free(b->nq), free(b->nk), free(b->sst);
}

/* block `p` ("spatial_blocks.3.") over `rows` rows (every branch's), this rank's TP slices */
static dl_status block_load(dl_stdit3 *m, st_block *b, dl_wsrc *ck, const char *p, int64_t rows) {
    const dl_dit *c = &m->c;
    const int64_t D = c->D, F = c->F, Dl = c->Dl, Fl = c->Fl, BT = m->B * m->T;
    const dl_dtype dt = c->dt;
    const int tp = c->sp.tp, tr = c->sp.tp_rank;
    /* Megatron slices: column parallel (this rank's heads / MLP columns), row parallel
     * (the matching input columns; the bias added by tp rank 0 only) */
    const lin_split col_h = {.row0 = tr * Dl, .rows = Dl}, col_f = {.row0 = tr * Fl, .rows = Fl};
    const lin_split row_h = {.nseg = 1, .seg0 = {tr * Dl}, .segn = {Dl}, .no_bias = tr != 0};
    const lin_split row_f = {.nseg = 1, .seg0 = {tr * Fl}, .segn = {Fl}, .no_bias = tr != 0};
    const lin_split *ch = tp > 1 ? &col_h : NULL, *cf = tp > 1 ? &col_f : NULL;
    const lin_split *rh = tp > 1 ? &row_h : NULL, *rf = tp > 1 ? &row_f : NULL;
    char n[10][256];
    const char *names[10] = {"attn.qkv", "attn.q_norm.weight", "attn.k_norm.weight", "attn.proj", "cross_attn.q_linear",
                             "cross_attn.kv_linear", "cross_attn.proj", "mlp.fc1", "mlp.fc2", "scale_shift_table"};
    for (int i = 0; i < 10; i++) snprintf(n[i], sizeof n[i], "%s%s", p, names[i]);
    const int64_t sst[2] = {6, D};
    dl_status s;
    if ((s = lin_fused(m, &b->qkv, ck, n[0], 3, rows)) || (s = dl_param_vec(ck, n[1], c->Dh, &b->nq)) ||
        (s = dl_param_vec(ck, n[2], c->Dh, &b->nk)) ||
        (s = dl_lin_named(&b->proj, ck, n[3], rows, D, D, dt, DL_F32, DL_ACT_NONE, 0, rh)) ||
        (s = dl_lin_named(&b->q2, ck, n[4], rows, D, D, dt, dt, DL_ACT_NONE, 0, ch)) ||
        (s = lin_fused(m, &b->kv2, ck, n[5], 2, BT)) ||
        (s = dl_lin_named(&b->proj2, ck, n[6], rows, D, D, dt, DL_F32, DL_ACT_NONE, 0, rh)) ||
        (s = dl_lin_named(&b->fc1, ck, n[7], rows, D, F, dt, dt, DL_ACT_GELU_TANH, 0, cf)) ||
        (s = dl_lin_named(&b->fc2, ck, n[8], rows, F, D, dt, DL_F32, DL_ACT_NONE, 0, rf)) ||
        (s = dl_param_f32(ck, n[9], 2, sst, &b->sst)))
        return s;
    return DL_OK;
}

void dl_stdit3_free(dl_stdit3 *m) {
    if (!m) return;
    embed_free(&m->e);
    dl_lin_free(&m->y1), dl_lin_free(&m->y2), dl_lin_free(&m->fin);
    for (int64_t i = 0; i < m->g.depth && m->sb; i++) block_free(&m->sb[i]);
    for (int64_t i = 0; i < m->g.depth && m->tb; i++) block_free(&m->tb[i]);
    free(m->sb), free(m->tb), free(m->sst_f), free(m->null_own), free(m->rb), free(m->rs), free(m->cnt), free(m->spare);
    dl_dit_free(&m->c);
    dl_aligned_free(m->arena);
    free(m);
}

/* the attention scratch: cross-attention and spatial attention on the pool, temporal
 * attention one whole sequence per thread (each its own slice) */
static void plan_scratch(dl_stdit3 *m, act_plan *pl) {
    const dl_dit *c = &m->c;
    const int nth = omp_get_max_threads();
    const int64_t q3 = 3 * c->Dl;
    dl_attn_args a = {.dt = c->dt, .heads = c->Hl, .head_dim = c->Dh, .q_stride = q3, .k_stride = q3, .v_stride = q3};
    a.sq = m->Rmax, a.sk = a.kv_end = m->T;
    size_t bytes = dl_attn_scratch_bytes(&a, nth);
    a.sq = a.sk = a.kv_end = m->g.S;
    size_t sp = dl_attn_scratch_bytes(&a, nth);
    a.sq = a.sk = a.kv_end = m->g.G[0];
    m->tslice = dl_align_up(dl_attn_scratch_bytes(&a, 1), DL_ALIGN);
    if (sp > bytes) bytes = sp;
    if (m->tslice * (size_t)nth > bytes) bytes = m->tslice * (size_t)nth;
    dl_plan_add(pl, &m->c.scratch, bytes + 64, 1, 1);
}

dl_status dl_stdit3_load(dl_stdit3 **out, dl_model_dir *dir, const char *component, int64_t lat_frames, int64_t lat_h,
                         int64_t lat_w, int64_t txt_len, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split, int batch) {
    *out = NULL;
    if (batch != 1 && batch != 2) return dl_fail(DL_ERR_INVALID, "STDiT3: a batch of %d branches (1 or 2)", batch);
    if (dt != DL_F32 && dt != DL_BF16) return dl_fail(DL_ERR_UNSUPPORTED, "STDiT3: dtype %s (f32 or bf16)", dl_dtype_name(dt));
    dl_stdit3 *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_wsrc *ck = NULL;
    dl_status s;
    st_geom *g = &m->g;
    m->c.sp = split ? *split : (dl_dit_split){.tp = 1, .cp = 1};
    m->B = batch;
    const int64_t lat[3] = {lat_frames, lat_h, lat_w};
    if ((s = setup(g, dir, component, lat, &m->c.sp, "STDiT3"))) goto fail;
    if (txt_len <= 0 || txt_len > g->Lmax) {
        s = dl_fail(DL_ERR_INVALID, "STDiT3: %lld caption rows (1 to model_max_length %lld)", (long long)txt_len, (long long)g->Lmax);
        goto fail;
    }
    const int cp = m->c.sp.cp, tp = m->c.sp.tp;
    const int64_t D = g->D, N = g->N, S = g->S, T = txt_len, B = batch, PPC = g->P[0] * g->P[1] * g->P[2] * g->Cout;
    m->T = T;
    m->Rs = g->Tl * S, m->Rt = g->G[0] * g->Sl;
    m->Rmax = m->Rs > m->Rt ? m->Rs : m->Rt;
    /* the stream: no text rows, L = T = 0 (the caption enters by cross-attention); its
     * rows are set per phase (views), not by dl_dit_plan: DSP shards frames / positions */
    dl_dit *c = &m->c;
    c->dt = dt, c->D = D, c->H = g->H, c->Dh = g->Dh, c->F = g->F, c->N = c->S = N;
    c->Hl = g->H / tp, c->Dl = c->Hl * g->Dh, c->Fl = g->F / tp;
    c->Nl = c->Sl = c->xn = B * m->Rmax;
    m->e = (st_embed){.dt = dt, .g = *g};
    m->rb = malloc((size_t)S * sizeof *m->rb), m->rs = malloc((size_t)S * sizeof *m->rs);
    m->cnt = calloc((size_t)(4 * cp), sizeof *m->cnt);
    m->sb = calloc((size_t)g->depth, sizeof *m->sb), m->tb = calloc((size_t)g->depth, sizeof *m->tb);
    c->rope_cos = malloc((size_t)(g->G[0] * g->Dh / 2) * 4), c->rope_sin = malloc((size_t)(g->G[0] * g->Dh / 2) * 4);
    if (!m->rb || !m->rs || !m->cnt || !m->sb || !m->tb || !c->rope_cos || !c->rope_sin) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int j = 0; j < cp; j++) { /* the gathered output: rank j's [T', Sl_j] rows, in rank order */
        int64_t s0, sn;
        shard(S, j, cp, &s0, &sn);
        for (int64_t p = s0; p < s0 + sn; p++) m->rb[p] = g->G[0] * s0 + p - s0, m->rs[p] = sn;
    }
    const int64_t lsh[2] = {g->Lmax, g->Ccap}, fsh[2] = {2, D}, hd = g->Dh / 2;
    char p[64];
    if ((s = dl_ws_open(&ck, src, dir, component)) || (s = embed_load(&m->e, ck)) ||
        (s = dl_lin_named(&m->y1, ck, "y_embedder.y_proj.fc1", B * T, g->Ccap, D, dt, dt, DL_ACT_GELU_TANH, 0, NULL)) ||
        (s = dl_lin_named(&m->y2, ck, "y_embedder.y_proj.fc2", B * T, D, D, dt, dt, DL_ACT_NONE, 0, NULL)) ||
        (s = dl_param_f32_map(ck, "y_embedder.y_embedding", 2, lsh, &m->null_y, &m->null_own)) ||
        (s = dl_param_f32(ck, "final_layer.scale_shift_table", 2, fsh, &m->sst_f)) ||
        (s = dl_lin_named(&m->fin, ck, "final_layer.linear", B * m->Rt, D, PPC, dt, DL_F32, DL_ACT_NONE, 0, NULL)))
        goto fail;
    for (int64_t i = 0; i < g->depth; i++) {
        snprintf(p, sizeof p, "spatial_blocks.%lld.", (long long)i);
        if ((s = block_load(m, &m->sb[i], ck, p, B * m->Rs))) goto fail;
        snprintf(p, sizeof p, "temporal_blocks.%lld.", (long long)i);
        if ((s = block_load(m, &m->tb[i], ck, p, B * m->Rt))) goto fail;
    }
    /* RoPE of the temporal blocks: angle t' freq_k, freq from the checkpoint (rope.freqs) */
    float *freqs = NULL;
    const int64_t fr[1] = {hd};
    if (dl_ws_find(ck, "rope.freqs")) {
        if ((s = dl_param_f32(ck, "rope.freqs", 1, fr, &freqs))) goto fail;
    } else if (!(freqs = malloc((size_t)hd * 4))) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    } else {
        for (int64_t k = 0; k < hd; k++) freqs[k] = 1.f / powf(10000.f, (float)(2 * k) / (float)g->Dh);
    }
    for (int64_t t = 0; t < g->G[0]; t++)
        for (int64_t k = 0; k < hd; k++) {
            const float a = (float)t * freqs[k];
            c->rope_cos[t * hd + k] = cosf(a), c->rope_sin[t * hd + k] = sinf(a);
        }
    free(freqs);
    const size_t es = dl_dtype_size(dt);
    const int64_t BR = B * m->Rmax, BT = B * T;
    act_plan pl = {0};
    dl_plan_add(&pl, &c->x, (size_t)(BR * D) * 4, 0, 2);
    dl_plan_add(&pl, &c->o, (size_t)(BR * D) * 4, 1, 1); /* also the all-to-all's staging */
    dl_plan_add(&pl, &c->h, (size_t)(BR * D) * es, 1, 2);
    dl_plan_add(&pl, &c->qkv, (size_t)(BR * 3 * c->Dl) * es, 1, 1); /* also the cross-attention's q */
    dl_plan_add(&pl, &c->att, (size_t)(BR * c->Dl) * es, 1, 1);
    dl_plan_add(&pl, &m->f, (size_t)(BR * c->Fl) * es, 1, 1);
    dl_plan_add(&pl, &m->kv2, (size_t)(BT * 2 * c->Dl) * es, 1, 1);
    dl_plan_add(&pl, &m->txt_in, (size_t)(BT * g->Ccap) * es, 0, 0);
    dl_plan_add(&pl, &m->txt_h, (size_t)(BT * D) * es, 0, 0);
    dl_plan_add(&pl, &m->ctx, (size_t)(BT * D) * es, 0, 1);
    dl_plan_add(&pl, &m->mod, (size_t)(6 * D) * 4, 1, 2);
    dl_plan_add(&pl, &m->pout, (size_t)(B * m->Rt * PPC) * 4, 2, 2);
    dl_plan_add(&pl, &m->full, cp > 1 ? (size_t)(N * PPC) * 4 : 0, 2, 2);
    plan_scratch(m, &pl);
    embed_plan(&m->e, &pl);
    if ((s = dl_plan_commit(&pl, ck, &m->arena))) goto fail;
    dl_ws_close(ck);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_stdit3_free(m);
    return s;
}

/* ---- the forward pass ------------------------------------------------------------------ */

/* the stream as `rows` rows from row 0 (every branch's in one phase's layout) */
static dl_dit rows_view(const dl_dit *c, int64_t rows) {
    dl_dit v = *c;
    v.Nl = v.Sl = v.xn = rows;
    v.n0 = v.xa = 0;
    return v;
}

/* spatial self-attention: every (branch, frame) sequence of S consecutive rows */
static void attn_spatial(dl_stdit3 *m, const st_block *b) {
    const dl_dit *c = &m->c;
    const dl_dtype dt = c->dt;
    const size_t es = dl_dtype_size(dt);
    const int64_t S = m->g.S, Dl = c->Dl, q3 = 3 * Dl, rows = m->B * m->Rs, nseq = m->B * m->g.Tl;
    char *qkv = c->qkv, *att = c->att;
    DL_PAR({
        dl_rmsnorm_heads_t(dt, qkv, rows, q3, c->Hl, c->Dh, b->nq, 1e-6f, ith, nth);
        dl_rmsnorm_heads_t(dt, qkv + (size_t)Dl * es, rows, q3, c->Hl, c->Dh, b->nk, 1e-6f, ith, nth);
    });
    const dl_attn_args a = {.dt = dt, .sq = S, .sk = S, .heads = c->Hl, .head_dim = c->Dh, .q_stride = q3,
                            .k_stride = q3, .v_stride = q3, .out_stride = Dl, .kv_end = S,
                            .scale = 1.f / sqrtf((float)c->Dh)};
    DL_PAR({ /* one region: each thread does its share of every sequence, no barrier between */
        dl_attn_args ai = a;
        for (int64_t i = 0; i < nseq; i++) {
            ai.q = qkv + (size_t)(i * S * q3) * es;
            ai.k = (const char *)ai.q + (size_t)Dl * es;
            ai.v = (const char *)ai.q + (size_t)(2 * Dl) * es;
            ai.out = att + (size_t)(i * S * Dl) * es;
            dl_attn_t(&ai, c->scratch, ith, nth);
        }
    });
}

/* temporal self-attention: every (branch, position) sequence of T' rows Sl apart; a
 * thread takes whole sequences (norm, RoPE, attention) with its own scratch slice */
static void attn_temporal(dl_stdit3 *m, const st_block *b) {
    const dl_dit *c = &m->c;
    const dl_dtype dt = c->dt;
    const size_t es = dl_dtype_size(dt);
    const int64_t T1 = m->g.G[0], Sl = m->g.Sl, Dl = c->Dl, q3 = 3 * Dl, nseq = m->B * Sl, Rt = m->Rt;
    char *qkv = c->qkv, *att = c->att;
    const dl_attn_args a = {.dt = dt, .sq = T1, .sk = T1, .heads = c->Hl, .head_dim = c->Dh, .q_stride = Sl * q3,
                            .k_stride = Sl * q3, .v_stride = Sl * q3, .out_stride = Sl * Dl, .kv_end = T1,
                            .scale = 1.f / sqrtf((float)c->Dh)};
    DL_PAR({
        void *scr = (char *)c->scratch + (size_t)ith * m->tslice;
        dl_attn_args ai = a;
        int64_t i0, i1;
        dl_split(nseq, ith, nth, &i0, &i1);
        for (int64_t i = i0; i < i1; i++) {
            const int64_t r = i / Sl * Rt + i % Sl; /* the sequence's first row */
            char *q = qkv + (size_t)(r * q3) * es, *k = q + (size_t)Dl * es;
            dl_rmsnorm_heads_t(dt, q, T1, Sl * q3, c->Hl, c->Dh, b->nq, 1e-6f, 0, 1);
            dl_rmsnorm_heads_t(dt, k, T1, Sl * q3, c->Hl, c->Dh, b->nk, 1e-6f, 0, 1);
            dl_rope_t(DL_ROPE_PAIRS, dt, q, T1, c->Hl, c->Dh, Sl * q3, c->rope_cos, c->rope_sin, 0, 1);
            dl_rope_t(DL_ROPE_PAIRS, dt, k, T1, c->Hl, c->Dh, Sl * q3, c->rope_cos, c->rope_sin, 0, 1);
            ai.q = q, ai.k = k, ai.v = q + (size_t)(2 * Dl) * es;
            ai.out = att + (size_t)(r * Dl) * es;
            dl_attn_t(&ai, scr, 0, 1);
        }
    });
}

/* one block over the rows of its phase (every branch's); valid[b]: branch b's caption keys */
static dl_status block_run(dl_stdit3 *m, st_block *b, int temporal, const int64_t *valid) {
    dl_dit *c = &m->c;
    const int64_t D = c->D, Dl = c->Dl, R = temporal ? m->Rt : m->Rs, T = m->T;
    const size_t es = dl_dtype_size(c->dt);
    dl_dit all = rows_view(c, m->B * R), one = rows_view(c, R);
    float *md = m->mod; /* shift1, scale1, gate1, shift2, scale2, gate2 */
    dl_status s;
    for (int64_t i = 0; i < 6 * D; i++) md[i] = b->sst[i] + m->e.tmlp[i];
    /* self-attention */
    dl_dit_ln_mod(&all, NULL, NULL, md + D, md);
    RUN(&b->qkv, c->h, c->qkv);
    if (temporal) attn_temporal(m, b);
    else attn_spatial(m, b);
    RUN(&b->proj, c->att, c->o);
    TRY(dl_dit_reduce_out(&all));
    dl_dit_gate_add(&all, NULL, md + 2 * D);
    /* cross-attention of the un-normalised rows to the branch's own caption */
    to_dt(c->dt, c->h, c->x, m->B * R * D);
    RUN(&b->q2, c->h, c->qkv); /* q: [B R, Dl] */
    RUN(&b->kv2, m->ctx, m->kv2);
    for (int bb = 0; bb < m->B; bb++) {
        const char *q = (const char *)c->qkv + (size_t)(bb * R * Dl) * es;
        const char *kv = (const char *)m->kv2 + (size_t)(bb * T * 2 * Dl) * es;
        dl_dit_cross_attention(&one, q, Dl, kv, kv + (size_t)Dl * es, 2 * Dl, T, valid[bb],
                               (char *)c->att + (size_t)(bb * R * Dl) * es, Dl);
    }
    RUN(&b->proj2, c->att, c->o);
    TRY(dl_dit_reduce_out(&all));
    dl_dit_gate_add(&all, NULL, NULL);
    /* MLP */
    dl_dit_ln_mod(&all, NULL, NULL, md + 4 * D, md + 3 * D);
    RUN(&b->fc1, c->h, m->f);
    RUN(&b->fc2, m->f, c->o);
    TRY(dl_dit_reduce_out(&all));
    dl_dit_gate_add(&all, NULL, md + 5 * D);
    return DL_OK;
}

/* DSP: the residual of every branch from the spatial layout (frames [f0, f0 + Tl) x
 * all S positions) to the temporal one (all T' frames x positions [s0, s0 + Sl)), or
 * back; packed / unpacked through o. Rank j's rows of a frame are consecutive in both
 * layouts, and the temporal layout receives rank j's frames as one block. */
static dl_status dsp_switch(dl_stdit3 *m, int to_temporal) {
    dl_dit *c = &m->c;
    const int cp = c->sp.cp;
    const int64_t D = c->D, S = m->g.S, Tl = m->g.Tl, Sl = m->g.Sl, Rs = m->Rs, Rt = m->Rt;
    const size_t row = (size_t)D * 4;
    size_t *sc = m->cnt, *sd = sc + cp, *rc = sd + cp, *rd = rc + cp;
    float *x = c->x, *st = c->o;
    for (int j = 0; j < cp; j++) {
        int64_t f0, fn, s0, sn;
        shard(m->g.G[0], j, cp, &f0, &fn);
        shard(S, j, cp, &s0, &sn);
        /* spatial side: [my frames, j's positions]; temporal side: [j's frames, my positions] */
        size_t a = (size_t)(Tl * sn) * row, ad = (size_t)(Tl * s0) * row, b = (size_t)(fn * Sl) * row, bd = (size_t)(f0 * Sl) * row;
        sc[j] = to_temporal ? a : b, sd[j] = to_temporal ? ad : bd;
        rc[j] = to_temporal ? b : a, rd[j] = to_temporal ? bd : ad;
    }
    dl_status s;
    if (to_temporal) {
#pragma omp parallel for schedule(static)
        for (int64_t bt = 0; bt < m->B * Tl; bt++) { /* pack [branch][j][frame][position] */
            const int64_t br = bt / Tl, t = bt % Tl;
            for (int j = 0; j < cp; j++) {
                int64_t s0, sn;
                shard(S, j, cp, &s0, &sn);
                memcpy(st + (br * Rs + Tl * s0 + t * sn) * D, x + (br * Rs + t * S + s0) * D, (size_t)sn * row);
            }
        }
        for (int br = 0; br < m->B; br++)
            TRY(dl_comm_alltoallv(c->sp.cp_comm, st + br * Rs * D, sc, sd, x + br * Rt * D, rc, rd));
        return DL_OK;
    }
    for (int br = 0; br < m->B; br++)
        TRY(dl_comm_alltoallv(c->sp.cp_comm, x + br * Rt * D, sc, sd, st + br * Rs * D, rc, rd));
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < m->B * Tl; bt++) {
        const int64_t br = bt / Tl, t = bt % Tl;
        for (int j = 0; j < cp; j++) {
            int64_t s0, sn;
            shard(S, j, cp, &s0, &sn);
            memcpy(x + (br * Rs + t * S + s0) * D, st + (br * Rs + Tl * s0 + t * sn) * D, (size_t)sn * row);
        }
    }
    return DL_OK;
}

/* the final layer's rows (every token's, row of (t', s) at rb[s] + t' rs[s]) into
 * out [Cout, F, H, W], cropped to the latent grid */
static void unpatchify(const dl_stdit3 *m, const float *rows, float *out) {
    const st_geom *g = &m->g;
    const int64_t Co = g->Cout, P0 = g->P[0], P1 = g->P[1], P2 = g->P[2], PPC = P0 * P1 * P2 * Co;
    const int64_t F = g->lat[0], H = g->lat[1], W = g->lat[2], S = g->S, G2 = g->G[2];
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < g->N; n++) {
        const int64_t t = n / S, sp = n % S, hh = sp / G2, ww = sp % G2;
        const float *row = rows + (m->rb[sp] + t * m->rs[sp]) * PPC;
        for (int64_t a = 0; a < P0 && t * P0 + a < F; a++)
            for (int64_t b = 0; b < P1 && hh * P1 + b < H; b++)
                for (int64_t cc = 0; cc < P2 && ww * P2 + cc < W; cc++) {
                    const float *v = row + ((a * P1 + b) * P2 + cc) * Co;
                    const int64_t at = ((t * P0 + a) * H + hh * P1 + b) * W + ww * P2 + cc;
                    for (int64_t o = 0; o < Co; o++) out[o * F * H * W + at] = v[o];
                }
    }
}

static dl_status check_cond(const dl_stdit3 *m, const dl_stdit3_cond *c, const char *who) {
    if (!c || !c->y) return dl_fail(DL_ERR_INVALID, "%s: no caption", who);
    if (c->valid < 1 || c->valid > m->T)
        return dl_fail(DL_ERR_INVALID, "%s: %lld valid caption tokens (1 to %lld)", who, (long long)c->valid, (long long)m->T);
    if (!isfinite(c->timestep) || !isfinite(c->fps))
        return dl_fail(DL_ERR_INVALID, "%s: the timestep and fps must be finite (%g, %g)", who, c->timestep, c->fps);
    if (!isfinite(c->height) || !isfinite(c->width) || !(c->height > 0) || !(c->width > 0))
        return dl_fail(DL_ERR_INVALID, "%s: the video size %gx%g must be positive", who, c->width, c->height);
    return DL_OK;
}

static dl_status check_comms(const dl_dit_split *sp, const char *who) {
    if ((sp->tp > 1 && !sp->tp_comm) || (sp->cp > 1 && !sp->cp_comm))
        return dl_fail(DL_ERR_INVALID, "%s: a split model loaded without its communicators cannot run", who);
    return DL_OK;
}

/* the B branches (same latents, timestep, fps and size; caption cs[b]) into out[b] */
static dl_status run_batch(dl_stdit3 *m, const float *latents, const dl_stdit3_cond *const *cs, float *const *out) {
    dl_dit *c = &m->c;
    const st_geom *g = &m->g;
    const int B = m->B, cp = c->sp.cp;
    const int64_t D = c->D, T = m->T, PPC = g->P[0] * g->P[1] * g->P[2] * g->Cout;
    const size_t es = dl_dtype_size(c->dt);
    int64_t valid[2];
    dl_status s;
    TRY(check_comms(&c->sp, "STDiT3"));
    for (int b = 0; b < B; b++) {
        TRY(check_cond(m, cs[b], "STDiT3"));
        valid[b] = cs[b]->valid;
        if (cs[b]->timestep != cs[0]->timestep || cs[b]->fps != cs[0]->fps || cs[b]->height != cs[0]->height ||
            cs[b]->width != cs[0]->width)
            return dl_fail(DL_ERR_INVALID, "STDiT3: the CFG branches differ in timestep, fps or size");
    }
    if (!latents) return dl_fail(DL_ERR_INVALID, "STDiT3: no latents");
    dl_stdit3_tap tap = cp == 1 ? m->tap : NULL;
    void *tc = m->tap_ctx;
    /* conditioning */
    TRY(embed_time(&m->e, cs[0]->timestep, cs[0]->fps));
    if (tap) {
        tap(tc, "t_emb", m->e.temb, DL_F32, 1, D), tap(tc, "fps_emb", m->e.femb, DL_F32, 1, D);
        tap(tc, "t", m->e.t, DL_F32, 1, D), tap(tc, "t_mlp", m->e.tmlp, DL_F32, 1, 6 * D);
    }
    for (int b = 0; b < B; b++) to_dt(c->dt, (char *)m->txt_in + (size_t)(b * T * g->Ccap) * es, cs[b]->y, T * g->Ccap);
    RUN(&m->y1, m->txt_in, m->txt_h);
    RUN(&m->y2, m->txt_h, m->ctx);
    if (tap) tap(tc, "y_tokens", m->ctx, c->dt, valid[0], D);
    /* this rank's tokens (spatial layout), the same for every branch */
    TRY(embed_patch(&m->e, latents, cs[0]->height, cs[0]->width, c->x, tap, tc));
    for (int b = 1; b < B; b++) memcpy(c->x + b * m->Rs * D, c->x, (size_t)(m->Rs * D) * 4);
    char name[32];
    for (int64_t i = 0; i < g->depth; i++) {
        TRY(block_run(m, &m->sb[i], 0, valid));
        if (tap) tap(tc, (snprintf(name, sizeof name, "spatial_%lld", (long long)i), name), c->x, DL_F32, B * m->Rs, D);
        if (cp > 1) TRY(dsp_switch(m, 1));
        TRY(block_run(m, &m->tb[i], 1, valid));
        if (tap) tap(tc, (snprintf(name, sizeof name, "temporal_%lld", (long long)i), name), c->x, DL_F32, B * m->Rt, D);
        if (cp > 1 && i + 1 < g->depth) TRY(dsp_switch(m, 0));
    }
    /* final layer (temporal layout): shift, scale = sst[0] + t, sst[1] + t */
    dl_dit all = rows_view(c, B * m->Rt);
    for (int64_t i = 0; i < D; i++) m->mod[i] = m->sst_f[i] + m->e.t[i], m->mod[D + i] = m->sst_f[D + i] + m->e.t[i];
    dl_dit_ln_mod(&all, NULL, NULL, m->mod + D, m->mod);
    RUN(&m->fin, c->h, m->pout);
    if (tap) tap(tc, "final", m->pout, DL_F32, B * m->Rt, PPC);
    for (int b = 0; b < B; b++) {
        const float *rows = m->pout + b * m->Rt * PPC;
        if (cp > 1) { /* every rank's [T', Sl_j] rows, rank j's at T' s0_j */
            size_t *cn = m->cnt, *dp = cn + cp;
            for (int j = 0; j < cp; j++) {
                int64_t s0, sn;
                shard(g->S, j, cp, &s0, &sn);
                cn[j] = (size_t)(g->G[0] * sn * PPC) * 4, dp[j] = (size_t)(g->G[0] * s0 * PPC) * 4;
            }
            TRY(dl_comm_allgatherv(c->sp.cp_comm, rows, m->full, cn, dp));
            rows = m->full;
        }
        unpatchify(m, rows, out[b]);
    }
    return DL_OK;
}

dl_status dl_stdit3_run(dl_stdit3 *m, const float *latents, const dl_stdit3_cond *c, float *out) {
    if (m->B == 1) {
        const dl_stdit3_cond *c1[1] = {c};
        float *o1[1] = {out};
        return run_batch(m, latents, c1, o1);
    }
    /* a program built for two branches runs one as two identical ones (no saving) */
    const st_geom *g = &m->g;
    if (!m->spare && !(m->spare = malloc((size_t)(g->Cout * g->lat[0] * g->lat[1] * g->lat[2]) * 4)))
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    const dl_stdit3_cond *c2[2] = {c, c};
    float *o2[2] = {out, m->spare};
    return run_batch(m, latents, c2, o2);
}

dl_status dl_stdit3_run2(dl_stdit3 *m, const float *latents, const dl_stdit3_cond *c0, const dl_stdit3_cond *c1,
                         float *out0, float *out1) {
    if (m->B != 2) return dl_fail(DL_ERR_INVALID, "STDiT3: built for %d branch(es), not a CFG batch of 2", m->B);
    const dl_stdit3_cond *c2[2] = {c0, c1};
    float *o2[2] = {out0, out1};
    return run_batch(m, latents, c2, o2);
}

/* ---- the probe program ------------------------------------------------------------- */

struct dl_stdit3_probe {
    dl_dit c;                       /* D and the split (the score's cp group) */
    st_embed e;
    float *sst0;                    /* spatial_blocks.0.scale_shift_table [6, D] */
    float *x, *cur, *mod;           /* [Tl S, D], [Tl S, D], [6D] f32 */
    float *prev[2];                 /* [Tl S, D] per CFG slot */
    int have[2];
    void *arena;
};

void dl_stdit3_probe_free(dl_stdit3_probe *p) {
    if (!p) return;
    embed_free(&p->e);
    free(p->sst0);
    dl_dit_free(&p->c);
    dl_aligned_free(p->prev[0]), dl_aligned_free(p->prev[1]), dl_aligned_free(p->arena);
    free(p);
}

void dl_stdit3_probe_reset(dl_stdit3_probe *p) { p->have[0] = p->have[1] = 0; }

dl_status dl_stdit3_probe_load(dl_stdit3_probe **out, dl_model_dir *dir, const char *component, int64_t lat_frames,
                               int64_t lat_h, int64_t lat_w, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split) {
    *out = NULL;
    if (dt != DL_F32 && dt != DL_BF16) return dl_fail(DL_ERR_UNSUPPORTED, "STDiT3 probe: dtype %s (f32 or bf16)", dl_dtype_name(dt));
    dl_stdit3_probe *p = calloc(1, sizeof *p);
    if (!p) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_wsrc *ck = NULL;
    st_geom g;
    dl_status s;
    const int64_t lat[3] = {lat_frames, lat_h, lat_w};
    p->c.sp = split ? *split : (dl_dit_split){.tp = 1, .cp = 1};
    if ((s = setup(&g, dir, component, lat, &p->c.sp, "STDiT3 probe"))) goto fail;
    /* tp ranks compute the probe alike; cp ranks their own frames */
    const int64_t D = g.D, rows = g.Tl * g.S, sst[2] = {6, D};
    p->c.dt = dt, p->c.D = D, p->c.H = g.H, p->c.Dh = g.Dh;
    p->e = (st_embed){.dt = dt, .g = g};
    if ((s = dl_ws_open(&ck, src, dir, component)) || (s = embed_load(&p->e, ck)) ||
        (s = dl_param_f32(ck, "spatial_blocks.0.scale_shift_table", 2, sst, &p->sst0)))
        goto fail;
    act_plan pl = {0};
    dl_plan_add(&pl, &p->x, (size_t)(rows * D) * 4, 0, 1);
    dl_plan_add(&pl, &p->cur, (size_t)(rows * D) * 4, 1, 1);
    dl_plan_add(&pl, &p->mod, (size_t)(6 * D) * 4, 1, 1);
    embed_plan(&p->e, &pl);
    if ((s = dl_plan_commit(&pl, ck, &p->arena))) goto fail;
    for (int i = 0; i < 2; i++)
        if (!(p->prev[i] = dl_aligned_alloc((size_t)(rows * D) * 4))) {
            s = dl_fail(DL_ERR_NOMEM, "out of memory");
            goto fail;
        }
    dl_ws_close(ck);
    *out = p;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_stdit3_probe_free(p);
    return s;
}

dl_status dl_stdit3_probe_run(dl_stdit3_probe *p, int slot, const float *latents, const dl_stdit3_cond *c, double *score) {
    const int64_t D = p->c.D, rows = p->e.g.Tl * p->e.g.S;
    dl_status s;
    *score = 0;
    if (slot < 0 || slot > 1) return dl_fail(DL_ERR_INVALID, "probe: slot %d (0 or 1)", slot);
    if (!c || !latents) return dl_fail(DL_ERR_INVALID, "STDiT3 probe: no latents or conditioning");
    if (!isfinite(c->timestep) || !isfinite(c->fps) || !isfinite(c->height) || !isfinite(c->width) || !(c->height > 0) ||
        !(c->width > 0))
        return dl_fail(DL_ERR_INVALID, "STDiT3 probe: the timestep and fps must be finite and the size positive");
    if (p->c.sp.cp > 1 && !p->c.sp.cp_comm) return dl_fail(DL_ERR_INVALID, "STDiT3 probe: a cp split without its communicator");
    TRY(embed_time(&p->e, c->timestep, c->fps));
    TRY(embed_patch(&p->e, latents, c->height, c->width, p->x, NULL, NULL));
    for (int64_t i = 0; i < 2 * D; i++) p->mod[i] = p->sst0[i] + p->e.tmlp[i]; /* shift1, scale1 */
    return dl_dit_probe_feature(&p->c, p->cur, p->prev[slot], &p->have[slot], p->x, rows, p->mod + D, p->mod, score);
}
