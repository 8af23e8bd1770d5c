/* LTX2VideoTransformer3DModel (diffusers, models/transformers/transformer_ltx2.py): the
 * audio-video DiT of LTX-2, one forward for batch 1 on one rank: the pipeline's passes
 * (no per-token timesteps, all text rows attended), with or without spatio-temporal
 * guidance's perturbed self-attention and modality isolation.
 *
 *   video x_v [Nv, D] = proj_in(latents [Nv, Cin]), audio x_a [Na, Da] = audio_proj_in(.)
 *   text e_v [T, D], e_a [T, Da]: caption_projection (Linear, GELU-tanh, Linear) when
 *     use_prompt_embeddings (LTX-2.0), else the connectors' outputs as they are (LTX-2.3)
 *   adaLN-single embeddings E(t) (f32, batch 1): emb = l2(silu(l1(proj256(t)))),
 *     out = linear(silu(emb)): time_embed(t_v) [6|9 D] (+ emb_v for the output),
 *     audio_time_embed(t_a), av scale/shift [4 D] / [4 Da] of tc_v = use_cross ? sigma_a
 *     : t_v and tc_a = use_cross ? sigma_v : t_a, the a2v / v2a gates [D] / [Da] of
 *     tc x (cross_attn_timestep_scale_multiplier / timestep_scale_multiplier), and with
 *     cross_attn_mod the prompt adaLN [2 D] / [2 Da] of sigma_v / sigma_a
 *   per block (per-block tables + those embeddings; RMS = RMSNorm without weight, eps):
 *     x_v += g_msa * attn1(RMS(x_v)(1 + s_msa) + sh_msa)                 video RoPE (3-D)
 *     x_a += same with the audio table, audio_attn1                      audio RoPE (1-D)
 *     (STG: in the listed blocks of a perturbed_attn model, LTX2PerturbedAttnProcessor
 *     with an all-zero perturbation mask: both self-attentions give v = to_v(h) in
 *     place of softmax(q k^T) v, then the gate and to_out as usual)
 *     x_v += [g_q *] attn2(RMS(x_v)[(1 + s_q) + sh_q], e_v[(1 + s_kv) + sh_kv])   no RoPE
 *     x_a += the same for audio (audio_attn2, e_a)
 *     n_v = RMS(x_v), n_a = RMS(x_a) (both before either of:)
 *     x_v += g_a2v * a2v(q: n_v mod, kv: n_a mod)       q: video, k: audio cross RoPE (1-D)
 *     x_a += g_v2a * v2a(q: n_a mod, kv: n_v mod)       q: audio, k: video cross RoPE
 *     x_v += g_mlp * ff(RMS(x_v)(1 + s_mlp) + sh_mlp), likewise audio (GELU-tanh, 4x)
 *   out_v = proj_out(LN(x_v)(1 + scale) + shift), (shift, scale) = table + emb_v; audio alike
 *   attention (LTX2Attention): q, k, v = to_q|k|v; q, k RMSNorm across all heads (eps
 *     1e-6, weights); RoPE; softmax(q k^T / sqrt(Dh)) v; [x 2 sigmoid(to_gate_logits(hq))
 *     per head]; to_out.0
 *   RoPE (LTX2AudioVideoRotaryPosEmbed), over the attention's whole inner width dim:
 *     position = midpoint of the patch's [start, end) in pixel / seconds space over the
 *     base size, g -> 2 g - 1; F = dim / (2 n_axes) frequencies theta^linspace(0, 1, F) pi / 2
 *     (f64 or f32, then f32); angle index f n_axes + axis; cos 1 / sin 0 padding in front;
 *     "interleaved" rotates pairs (2i, 2i+1); "split" cuts the dim / 2 angles into
 *     groups (the rope's heads) and rotates halves of each group's slice of the width.
 * The model is built for one shape (grid, audio frames, text rows, fps): RoPE tables
 * and every activation are made at load, nothing is allocated in run.
 *
 * Parallel execution (a dl_dit_split; docs/parallel.md): TP splits every attention's
 * heads (to_q / to_k / to_v / to_gate_logits column parallel, to_out row parallel) and
 * the feed-forwards' columns, Megatron style, in both streams; the row-parallel outputs
 * are all-reduced over the tp group (tp rank 0 adds the bias), and the across-heads
 * q / k RMSNorm all-reduces each row's sum of squares (as Wan's). CP partitions the
 * video tokens over the cp group: the video self-attention by the DiT library's modes
 * (Ulysses, ring, gather), the text cross-attention and the feed-forwards on the local
 * rows. The audio stream (tens of tokens) is replicated on every cp rank: a2v (video
 * queries, audio keys) is local; v2a (audio queries over every video key) is each
 * rank's partial attention over its video keys, all-gathered and merged in rank order
 * (ring, Ulysses), or one attention over the all-gathered video K / V (gather), so
 * every cp rank holds the same audio stream. Every rank returns both full outputs (the
 * video rows all-gathered). Sequence parallelism (sp) is refused. */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/comm.h"
#include "difflet/ltx2.h"
#include "models/models_impl.h"

typedef struct {
    float *cos, *sin; /* interleaved: [N, dim/2]; split: [G, N, r], r = dim / (2 G) */
    int64_t N, dim, G;
    int split;
} rope;

typedef struct {
    int self;           /* q, k, v from one input (fused qkv) */
    int gated;
    int64_t H, Dh, W;   /* heads, head dim, inner width H Dh */
    int64_t Hl, Wl;     /* this rank's heads and width (TP: H / tp) */
    lin qkv;            /* self: [Nq, Dq] -> [Nq, 3Wl] dt */
    lin q, kv;          /* cross: [Nq, Dq] -> [Nq, Wl] dt; [Nk, Dk] -> [Nk, 2Wl] dt (k | v) */
    lin o;              /* to_out.0: [Nq, Wl] -> [Nq, Dout] f32 (TP: a partial sum) */
    lin gate;           /* to_gate_logits: [Nq, Dq] -> [Nq, Hl] f32 */
    float *nq, *nk;     /* [W] (the whole norm weight; a rank applies its slice) */
} xattn;

typedef struct {
    xattn a1, aa1, a2, aa2, a2v, v2a;
    lin ff1, ff2, aff1, aff2; /* net.0.proj (GELU-tanh): D -> 4D dt; net.2 -> D f32 */
    float *sst, *asst;        /* [6|9, D], [6|9, Da] */
    float *pst, *apst;        /* [2, D], [2, Da] (cross_attn_adaln) */
    float *vca, *aca;         /* [5, D], [5, Da]: a2v scale, shift, v2a scale, shift, gate */
} tblock;

/* One entry of the text cache (see dl_ltx2_transformer_run): the text cross-attentions'
 * K | V of every block for one guidance pass's text, keyed by that text exactly (and by
 * the sigmas where cross_attn_mod's prompt adaLN modulates the keys by them). */
typedef struct {
    float *text, *atext; /* the inputs it was made from: [T, text_width], [T, audio_text_width] */
    float sigma, asigma; /* and the sigmas (kv_sigma) */
    char *kv;            /* per block: [T, 2 Wl] video then [T, 2 Wal] audio K | V, dt (normed keys) */
    uint64_t used;       /* when last used (the run counter); 0: empty */
} txslot;
enum { TEXT_SLOTS = 2 }; /* a request's distinct texts: the prompt and the negative prompt */

typedef struct { /* LTX2AdaLayerNormSingle, f32 */
    float *w1, *b1, *w2, *b2, *wl, *bl; /* [d, 256], [d], [d, d], [d], [n d, d], [n d] */
    int64_t d, n;
} adaln;

struct dl_ltx2_transformer {
    dl_ltx2_transformer_info in;
    dl_dit cv;                 /* the video stream under the split (no text rows): its rows [n0, n0 + Nl)
                                  of Nv, H / tp heads, the CP self-attention's exchange buffers */
    dl_dit ca;                 /* the audio width (Da, Ha / tp heads), every audio row (cp 1) */
    int64_t Nvl, n0;           /* this rank's video rows */
    int64_t D, H, Dh, Da, Ha, Dha, L, T;
    int nv9, na9, prompt_mod, prompt_single, prompt_emb, pert;
    double eps, gate_factor;
    dl_dtype dt;
    lin proj_in, aproj_in, proj_out, aproj_out, cap1, cap2, acap1, acap2;
    adaln te, ate, cav, caa, gv, ga, pv, pa;
    float *out_sst, *out_asst; /* [2, D], [2, Da] */
    tblock *b;
    rope rv, ra, rcv, rca;     /* self video, self audio, cross video, cross audio */
    /* small per-call vectors (malloc'd at load) */
    float *vecs;
    float *tv, *ev, *ta, *ea, *tcv, *tca, *tgv, *tga, *tpv, *tpa; /* embeddings */
    float *mv, *ma, *kvv, *kva;                                   /* a block's modulation */
    /* activations (arena) */
    float *xv, *xa;            /* [Nvl, D], [Na, Da] f32 residuals (this rank's video rows) */
    void *hv, *hv2, *ha, *ha2; /* dt: normalised + modulated rows */
    void *xin;                 /* [max(Nvl, Na), max(Cin, Ca)] dt */
    void *qb, *kvb, *att, *f;  /* dt: [R, 3Wl], [K, 2Wl], [R, Wl], [R, 4 Wl] (Wl = max(D, Da) / tp) */
    float *gl, *o;             /* [R, Hmax / tp], [R, Dmax] f32 (R = max(Nvl, Na)) */
    float *ss;                 /* [max(R, T)]: the TP norms' sums of squares */
    float *vpart;              /* v2a partials (cp > 1, ring / Ulysses): [cp, Na Ha/tp (Dha + 2)] f32 */
    void *vkv;                 /* v2a keys (cp > 1, gather): [Nv, 2 Da / tp] dt, every rank's video K | V */
    float *ctxv, *ctxa;        /* [T, D], [T, Da] f32: the text as the blocks see it */
    void *ctxin, *ctxmid, *ectx; /* dt: [T, Cmax], [T, Dmax], [T, Dmax] */
    void *scratch, *arena;
    txslot tx[TEXT_SLOTS];     /* the text cache */
    int kv_sigma;              /* the text keys depend on the sigmas (cross_attn_mod with prompt adaLN) */
    size_t kv_block;           /* bytes of one block's cached K | V */
    uint64_t runs;             /* the run counter (the cache's clock) */
    void *txmem;
};

static void rope_free(rope *r) { free(r->cos), free(r->sin); }
static void adaln_free(adaln *a) { free(a->w1), free(a->b1), free(a->w2), free(a->b2), free(a->wl), free(a->bl); }
static void xattn_free(xattn *a) {
    dl_lin_free(&a->qkv), dl_lin_free(&a->q), dl_lin_free(&a->kv), dl_lin_free(&a->o), dl_lin_free(&a->gate);
    free(a->nq), free(a->nk);
}

void dl_ltx2_transformer_free(dl_ltx2_transformer *m) {
    if (!m) return;
    for (int64_t i = 0; m->b && i < m->L; i++) {
        tblock *b = &m->b[i];
        xattn_free(&b->a1), xattn_free(&b->aa1), xattn_free(&b->a2), xattn_free(&b->aa2);
        xattn_free(&b->a2v), xattn_free(&b->v2a);
        dl_lin_free(&b->ff1), dl_lin_free(&b->ff2), dl_lin_free(&b->aff1), dl_lin_free(&b->aff2);
        free(b->sst), free(b->asst), free(b->pst), free(b->apst), free(b->vca), free(b->aca);
    }
    free(m->b);
    dl_lin_free(&m->proj_in), dl_lin_free(&m->aproj_in), dl_lin_free(&m->proj_out), dl_lin_free(&m->aproj_out);
    dl_lin_free(&m->cap1), dl_lin_free(&m->cap2), dl_lin_free(&m->acap1), dl_lin_free(&m->acap2);
    adaln *e[8] = {&m->te, &m->ate, &m->cav, &m->caa, &m->gv, &m->ga, &m->pv, &m->pa};
    for (int i = 0; i < 8; i++) adaln_free(e[i]);
    free(m->out_sst), free(m->out_asst);
    rope_free(&m->rv), rope_free(&m->ra), rope_free(&m->rcv), rope_free(&m->rca);
    free(m->vecs);
    dl_dit_free(&m->cv), dl_dit_free(&m->ca);
    dl_aligned_free(m->arena), dl_aligned_free(m->vpart), dl_aligned_free(m->vkv), dl_aligned_free(m->txmem);
    free(m);
}

const dl_ltx2_transformer_info *dl_ltx2_transformer_get_info(const dl_ltx2_transformer *m) { return &m->in; }

/* ---- configuration ---------------------------------------------------------------- */

typedef struct {
    int64_t Cin, Cout, p, pt, H, Dh, cad, sf[3], pos_max, base_h, base_w;
    int64_t Ca, Caout, ap, apt, Ha, Dha, acad, asf, apos_max, sr, hop;
    int64_t L, C, causal, ts_mult, cts_mult;
    int gated, cmod, agated, acmod, affine, abias, aobias, f64, prompt_emb, ff_bias, aff_bias, prompt_single, split;
    int pert;
    double eps, theta;
} tcfg;

static dl_status cfg_str_is(const cJSON *cfg, const char *file, const char *key, const char *def, const char *const *ok,
                            int nok, int *which) {
    const char *v;
    dl_status s = dl_cfg_str(cfg, file, key, def, &v);
    if (s) return s;
    for (int i = 0; i < nok; i++)
        if (!strcmp(v, ok[i])) {
            if (which) *which = i;
            return DL_OK;
        }
    return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: %s \"%s\" is not supported (only \"%s\"%s%s%s)", file, key, v, ok[0],
                   nok > 1 ? " or \"" : "", nok > 1 ? ok[1] : "", nok > 1 ? "\"" : "");
}

static dl_status read_config(tcfg *k, const cJSON *cfg, const char *file) {
    dl_status s;
    int64_t co, aco;
    static const char *const ropes[2] = {"interleaved", "split"}, *const qk[1] = {"rms_norm_across_heads"},
                              *const act[1] = {"gelu-approximate"};
    int kf;
    if ((s = dl_cfg_int(cfg, file, "in_channels", 128, &k->Cin)) || (s = dl_cfg_int(cfg, file, "out_channels", 128, &co)) ||
        (s = dl_cfg_int(cfg, file, "patch_size", 1, &k->p)) || (s = dl_cfg_int(cfg, file, "patch_size_t", 1, &k->pt)) ||
        (s = dl_cfg_int(cfg, file, "num_attention_heads", 32, &k->H)) ||
        (s = dl_cfg_int(cfg, file, "attention_head_dim", 128, &k->Dh)) ||
        (s = dl_cfg_int(cfg, file, "cross_attention_dim", 4096, &k->cad)) ||
        (s = dl_cfg_int(cfg, file, "pos_embed_max_pos", 20, &k->pos_max)) ||
        (s = dl_cfg_int(cfg, file, "base_height", 2048, &k->base_h)) || (s = dl_cfg_int(cfg, file, "base_width", 2048, &k->base_w)) ||
        (s = dl_cfg_bool(cfg, file, "gated_attn", 0, &k->gated)) || (s = dl_cfg_bool(cfg, file, "cross_attn_mod", 0, &k->cmod)) ||
        (s = dl_cfg_int(cfg, file, "audio_in_channels", 128, &k->Ca)) ||
        (s = dl_cfg_int(cfg, file, "audio_out_channels", 128, &aco)) ||
        (s = dl_cfg_int(cfg, file, "audio_patch_size", 1, &k->ap)) ||
        (s = dl_cfg_int(cfg, file, "audio_patch_size_t", 1, &k->apt)) ||
        (s = dl_cfg_int(cfg, file, "audio_num_attention_heads", 32, &k->Ha)) ||
        (s = dl_cfg_int(cfg, file, "audio_attention_head_dim", 64, &k->Dha)) ||
        (s = dl_cfg_int(cfg, file, "audio_cross_attention_dim", 2048, &k->acad)) ||
        (s = dl_cfg_int(cfg, file, "audio_scale_factor", 4, &k->asf)) ||
        (s = dl_cfg_int(cfg, file, "audio_pos_embed_max_pos", 20, &k->apos_max)) ||
        (s = dl_cfg_int(cfg, file, "audio_sampling_rate", 16000, &k->sr)) ||
        (s = dl_cfg_int(cfg, file, "audio_hop_length", 160, &k->hop)) ||
        (s = dl_cfg_bool(cfg, file, "audio_gated_attn", 0, &k->agated)) ||
        (s = dl_cfg_bool(cfg, file, "audio_cross_attn_mod", 0, &k->acmod)) ||
        (s = dl_cfg_int(cfg, file, "num_layers", 48, &k->L)) ||
        (s = cfg_str_is(cfg, file, "activation_fn", "gelu-approximate", act, 1, NULL)) ||
        (s = cfg_str_is(cfg, file, "qk_norm", "rms_norm_across_heads", qk, 1, NULL)) ||
        (s = dl_cfg_bool(cfg, file, "norm_elementwise_affine", 0, &k->affine)) ||
        (s = dl_cfg_float(cfg, file, "norm_eps", 1e-6, &k->eps)) ||
        (s = dl_cfg_int(cfg, file, "caption_channels", 3840, &k->C)) ||
        (s = dl_cfg_bool(cfg, file, "attention_bias", 1, &k->abias)) ||
        (s = dl_cfg_bool(cfg, file, "attention_out_bias", 1, &k->aobias)) ||
        (s = dl_cfg_float(cfg, file, "rope_theta", 10000.0, &k->theta)) ||
        (s = dl_cfg_bool(cfg, file, "rope_double_precision", 1, &k->f64)) ||
        (s = dl_cfg_int(cfg, file, "causal_offset", 1, &k->causal)) ||
        (s = dl_cfg_int(cfg, file, "timestep_scale_multiplier", 1000, &k->ts_mult)) ||
        (s = dl_cfg_int(cfg, file, "cross_attn_timestep_scale_multiplier", 1000, &k->cts_mult)) ||
        (s = cfg_str_is(cfg, file, "rope_type", "interleaved", ropes, 2, &k->split)) ||
        (s = dl_cfg_bool(cfg, file, "use_prompt_embeddings", 1, &k->prompt_emb)) ||
        (s = dl_cfg_bool(cfg, file, "perturbed_attn", 0, &k->pert)) || (s = dl_cfg_bool(cfg, file, "ff_bias", 1, &k->ff_bias)) ||
        (s = dl_cfg_bool(cfg, file, "audio_ff_bias", 1, &k->aff_bias)) ||
        (s = dl_cfg_bool(cfg, file, "use_prompt_adaln_single", 1, &k->prompt_single)) ||
        (s = dl_cfg_bool(cfg, file, "use_keyframes_abs_pos_embedding", 0, &kf)))
        return s;
    /* perturbed_attn swaps in LTX2PerturbedAttnProcessor, which without a perturbation
     * mask computes exactly the default (STG's blocks use it); the keyframe embedding is
     * only added with a keyframes mask, which the pipeline's passes have not */
    (void)kf;
    k->Cout = co ? co : k->Cin, k->Caout = aco ? aco : k->Ca;
    k->sf[0] = 8, k->sf[1] = k->sf[2] = 32;
    const cJSON *sf = cJSON_GetObjectItemCaseSensitive(cfg, "vae_scale_factors");
    if (sf && !cJSON_IsNull(sf)) {
        if (!cJSON_IsArray(sf) || cJSON_GetArraySize(sf) != 3)
            return dl_fail(DL_ERR_FORMAT, "`%s`: vae_scale_factors must be 3 integers", file);
        for (int i = 0; i < 3; i++) {
            const cJSON *a = cJSON_GetArrayItem(sf, i);
            if (!cJSON_IsNumber(a) || a->valuedouble < 1 || a->valuedouble > 1024 || a->valuedouble != (int)a->valuedouble)
                return dl_fail(DL_ERR_FORMAT, "`%s`: vae_scale_factors must be 3 integers in 1..1024", file);
            k->sf[i] = (int64_t)a->valuedouble;
        }
    }
    if (k->affine)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: norm_elementwise_affine true (weighted block norms) is not supported", file);
    if (k->ap != 1 || k->apt != 1)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: audio_patch_size / audio_patch_size_t other than 1 are not supported", file);
    if (k->Cin < 1 || k->Cout < 1 || k->Ca < 1 || k->Caout < 1 || k->H < 1 || k->Dh < 2 || k->Ha < 1 || k->Dha < 2 ||
        k->L < 1 || k->L > 1024 || k->C < 1 || k->p < 1 || k->pt < 1 || k->pos_max < 1 || k->apos_max < 1 || k->base_h < 1 ||
        k->base_w < 1 || k->asf < 1 || k->sr < 1 || k->hop < 1 || k->ts_mult < 1 || k->cts_mult < 1 || !(k->theta > 0) ||
        !(k->eps > 0) || (k->H * k->Dh) % 2 || (k->Ha * k->Dha) % 2)
        return dl_fail(DL_ERR_FORMAT, "`%s`: inconsistent sizes", file);
    const int64_t D = k->H * k->Dh, Da = k->Ha * k->Dha;
    if (k->cad != D || k->acad != Da)
        return dl_fail(DL_ERR_UNSUPPORTED,
                       "`%s`: cross_attention_dim %lld / audio_cross_attention_dim %lld differ from the streams' widths %lld / %lld "
                       "(the text modulation and the a2v RoPE need them equal)",
                       file, (long long)k->cad, (long long)k->acad, (long long)D, (long long)Da);
    if (k->split && ((D / 2) % k->H || (Da / 2) % k->Ha || (Da / 2) % k->H))
        return dl_fail(DL_ERR_FORMAT, "`%s`: split RoPE needs half the inner widths divisible by the heads", file);
    return DL_OK;
}

/* why a split cannot run config k (NULL when it can) */
static const char *split_why(const tcfg *k, const dl_dit_split *sp, char *buf, size_t n) {
    const char *why = dl_dit_split_check(sp, k->H, buf, n); /* video heads: tp, and tp x cp for Ulysses */
    if (why) return why;
    const int64_t D = k->H * k->Dh, Da = k->Ha * k->Dha;
    if (sp->sp && sp->tp > 1)
        return "LTX-2 does not support sequence parallelism on the TP group (sp); split the video tokens with cp";
    if (k->Ha % sp->tp) {
        snprintf(buf, n, "the model's %lld audio attention heads are not divisible by tp=%d", (long long)k->Ha, sp->tp);
        return buf;
    }
    if (!k->split && ((D / sp->tp) % 2 || (Da / sp->tp) % 2)) {
        snprintf(buf, n, "interleaved RoPE rotates column pairs: tp=%d leaves a rank %lld video and %lld audio attention "
                         "columns, which must both be even", sp->tp, (long long)(D / sp->tp), (long long)(Da / sp->tp));
        return buf;
    }
    if (sp->cp > 64) return "at most 64 cp ranks (the ring and the v2a merge keep one partial per rank)";
    return NULL;
}

const char *dl_ltx2_split_check(const cJSON *cfg, const dl_dit_split *sp, char *buf, size_t n) {
    tcfg k;
    if (read_config(&k, cfg, "transformer/config.json")) {
        snprintf(buf, n, "%s", dl_last_error());
        return buf;
    }
    const char *why = split_why(&k, sp, buf, n);
    if (why && why != buf) {
        snprintf(buf, n, "%s", why);
        return buf;
    }
    return why;
}

/* ---- RoPE tables -------------------------------------------------------------------- */

/* LTX2AudioVideoRotaryPosEmbed.forward for positions g [N, nd] (already position /
 * base, f32) over width dim with G groups (split) */
static dl_status rope_make(rope *r, const float *g, int64_t N, int nd, int64_t dim, int64_t G, int split, double theta, int f64) {
    const int64_t half = dim / 2, F = dim / (2 * nd), pad = half - F * nd;
    r->N = N, r->dim = dim, r->G = G, r->split = split;
    r->cos = malloc((size_t)(N * half) * sizeof(float));
    r->sin = malloc((size_t)(N * half) * sizeof(float));
    float *fr = malloc((size_t)(F ? F : 1) * sizeof(float)), *ang = malloc((size_t)half * sizeof(float));
    if (!r->cos || !r->sin || !fr || !ang) {
        free(fr), free(ang);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    for (int64_t i = 0; i < F; i++) { /* torch.linspace(0, 1, F) in its dtype, then pow * pi / 2 */
        if (f64) {
            double step = F > 1 ? 1.0 / (double)(F - 1) : 0.0;
            double ls = i < F / 2 ? (double)i * step : 1.0 - step * (double)(F - 1 - i);
            fr[i] = (float)(pow(theta, ls) * M_PI / 2.0);
        } else {
            float step = F > 1 ? 1.0f / (float)(F - 1) : 0.0f;
            float ls = i < F / 2 ? step * (float)i : 1.0f - step * (float)(F - 1 - i);
            float pw = powf((float)theta, ls);
            fr[i] = pw * (float)M_PI / 2.0f;
        }
    }
    const int64_t rr = split ? half / G : half;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t j = 0; j < pad; j++) ang[j] = NAN; /* padding: cos 1, sin 0 */
        for (int64_t f = 0; f < F; f++)
            for (int a = 0; a < nd; a++) {
                volatile float t = g[n * nd + a] * 2.f; /* (g * 2 - 1) * f in f32, unfused */
                volatile float u = t - 1.f;
                ang[pad + f * nd + a] = u * fr[f];
            }
        for (int64_t j = 0; j < half; j++) {
            const int64_t at = split ? ((j / rr) * N + n) * rr + j % rr : n * half + j;
            r->cos[at] = isnan(ang[j]) ? 1.f : cosf(ang[j]);
            r->sin[at] = isnan(ang[j]) ? 0.f : sinf(ang[j]);
        }
    }
    free(fr), free(ang);
    return DL_OK;
}

/* keep rows [row0, row0 + rows) and columns [col0, col0 + cols) of the rotated width
 * (a rank's tokens and heads): interleaved pairs, or whole split-RoPE groups */
static dl_status rope_slice(rope *r, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
    if (row0 == 0 && rows == r->N && col0 == 0 && cols == r->dim) return DL_OK;
    const int64_t half = r->dim / 2, w = r->split ? r->dim / r->G : 2, rr = w / 2, G = r->split ? cols / w : 1;
    DL_ASSERT(col0 % w == 0 && cols % w == 0 && row0 + rows <= r->N && col0 + cols <= r->dim);
    float *c = malloc((size_t)(rows * cols / 2) * sizeof(float)), *sn = malloc((size_t)(rows * cols / 2) * sizeof(float));
    if (!c || !sn) {
        free(c), free(sn);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    for (int64_t n = 0; n < rows; n++)
        if (!r->split) /* [N, dim / 2] */
            for (int64_t j = 0; j < cols / 2; j++) {
                c[n * (cols / 2) + j] = r->cos[(row0 + n) * half + col0 / 2 + j];
                sn[n * (cols / 2) + j] = r->sin[(row0 + n) * half + col0 / 2 + j];
            }
        else /* [G, N, rr] */
            for (int64_t g = 0; g < G; g++)
                for (int64_t j = 0; j < rr; j++) {
                    const int64_t from = ((col0 / w + g) * r->N + row0 + n) * rr + j;
                    c[(g * rows + n) * rr + j] = r->cos[from];
                    sn[(g * rows + n) * rr + j] = r->sin[from];
                }
    free(r->cos), free(r->sin);
    r->cos = c, r->sin = sn, r->N = rows, r->dim = cols;
    if (r->split) r->G = G;
    return DL_OK;
}

/* the four tables for the built shape (prepare_video_coords / prepare_audio_coords,
 * then the midpoints over the bases, in f32 as torch computes them) */
static dl_status ropes_make(dl_ltx2_transformer *m, const tcfg *k, const dl_ltx2_transformer_shape *sh) {
    const int64_t Nv = m->in.video_tokens, Na = m->in.audio_tokens;
    const int64_t nf = (sh->frames + k->pt - 1) / k->pt, nh = (sh->height + k->p - 1) / k->p, nw = (sh->width + k->p - 1) / k->p;
    float *gv = malloc((size_t)(Nv * 3) * sizeof(float)), *gc = malloc((size_t)Nv * sizeof(float));
    float *ga = malloc((size_t)Na * sizeof(float)), *gac = malloc((size_t)Na * sizeof(float));
    dl_status s = DL_OK;
    if (!gv || !gc || !ga || !gac) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto done;
    }
    const int64_t cmax = k->pos_max > k->apos_max ? k->pos_max : k->apos_max;
    const float fps = (float)sh->fps;
    for (int64_t f = 0, n = 0; f < nf; f++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t w = 0; w < nw; w++, n++) {
                const float st[3] = {(float)(f * k->pt), (float)(h * k->p), (float)(w * k->p)};
                const float sz[3] = {(float)k->pt, (float)k->p, (float)k->p};
                const float base[3] = {(float)k->pos_max, (float)k->base_h, (float)k->base_w};
                for (int a = 0; a < 3; a++) {
                    volatile float s0 = st[a] * (float)k->sf[a], e0 = (st[a] + sz[a]) * (float)k->sf[a];
                    if (a == 0) { /* causal shift and clamp, then seconds */
                        volatile float s1 = s0 + (float)k->causal, e1 = e0 + (float)k->causal;
                        s1 = s1 - (float)k->sf[0], e1 = e1 - (float)k->sf[0];
                        s0 = (s1 < 0 ? 0.f : s1) / fps, e0 = (e1 < 0 ? 0.f : e1) / fps;
                    }
                    volatile float mid = (s0 + e0) / 2.f;
                    gv[n * 3 + a] = mid / base[a];
                    if (a == 0) gc[n] = mid / (float)cmax;
                }
            }
    for (int64_t n = 0; n < Na; n++) {
        const float sf = (float)k->asf;
        volatile float s0 = (float)n * sf, e0 = ((float)n + 1.f) * sf;
        s0 = s0 + (float)k->causal, e0 = e0 + (float)k->causal;
        s0 = s0 - sf, e0 = e0 - sf;
        s0 = s0 < 0 ? 0.f : s0, e0 = e0 < 0 ? 0.f : e0;
        s0 = s0 * (float)k->hop, e0 = e0 * (float)k->hop;
        s0 = s0 / (float)k->sr, e0 = e0 / (float)k->sr;
        volatile float mid = (s0 + e0) / 2.f;
        ga[n] = mid / (float)k->apos_max;
        gac[n] = mid / (float)cmax;
    }
    /* this rank's video rows and attention columns of each (TP: its heads' slice of the width) */
    const int tp = m->cv.sp.tp, tr = m->cv.sp.tp_rank;
    const int64_t Dl = m->D / tp, Dal = m->Da / tp;
    if ((s = rope_make(&m->rv, gv, Nv, 3, m->D, k->H, k->split, k->theta, k->f64)) ||
        (s = rope_make(&m->ra, ga, Na, 1, m->Da, k->Ha, k->split, k->theta, k->f64)) ||
        (s = rope_make(&m->rcv, gc, Nv, 1, m->Da, k->H, k->split, k->theta, k->f64)) ||
        (s = rope_make(&m->rca, gac, Na, 1, m->Da, k->Ha, k->split, k->theta, k->f64)) ||
        (s = rope_slice(&m->rv, m->n0, m->Nvl, tr * Dl, Dl)) || (s = rope_slice(&m->ra, 0, Na, tr * Dal, Dal)) ||
        (s = rope_slice(&m->rcv, m->n0, m->Nvl, tr * Dal, Dal)) || (s = rope_slice(&m->rca, 0, Na, tr * Dal, Dal)))
        goto done;
done:
    free(gv), free(gc), free(ga), free(gac);
    return s;
}

/* ---- loading ------------------------------------------------------------------------ */

/* `<base>.weight` [n, k] (and `<base>.bias` when bias), this rank's TP slice (sp NULL: whole) */
static dl_status lin1s(lin *l, dl_wsrc *ck, const char *base, int bias, int64_t m, int64_t k, int64_t n, dl_dtype dt,
                       dl_dtype dst, dl_act act, const lin_split *sp) {
    char w[200], b[200];
    snprintf(w, sizeof w, "%.180s.weight", base);
    snprintf(b, sizeof b, "%.180s.bias", base);
    const char *wn[1] = {w}, *bn[1] = {b};
    return dl_lin_load_split(l, ck, wn, bias ? bn : NULL, 1, &n, m, k, dt, dst, act, 0, sp);
}

static dl_status lin1(lin *l, dl_wsrc *ck, const char *base, int bias, int64_t m, int64_t k, int64_t n, dl_dtype dt,
                      dl_dtype dst, dl_act act) {
    return lin1s(l, ck, base, bias, m, k, n, dt, dst, act, NULL);
}

/* Megatron slices of an n-wide column-parallel layer (this rank's rows [tr n / tp, ..)) and
 * of the row-parallel layer reading it (those input columns; the bias on tp rank 0) */
typedef struct {
    lin_split col, row;
} tp_slices;
static tp_slices tp_split(int tp, int tr, int64_t n) {
    const int64_t nl = n / tp;
    tp_slices t = {.col = {.row0 = tr * nl, .rows = nl}, .row = {.nseg = 1, .seg0 = {tr * nl}, .segn = {nl}, .no_bias = tr != 0}};
    return t;
}

static dl_status adaln_load(adaln *a, dl_wsrc *ck, const char *p, int64_t d, int64_t n) {
    char nm[200];
    int64_t s1[2] = {d, 256}, s2[2] = {d, d}, sl[2] = {n * d, d}, b1[1] = {d}, bl[1] = {n * d};
    dl_status s;
    a->d = d, a->n = n;
#define NM(x) (snprintf(nm, sizeof nm, "%s.%s", p, x), nm)
    if ((s = dl_param_f32(ck, NM("emb.timestep_embedder.linear_1.weight"), 2, s1, &a->w1)) ||
        (s = dl_param_f32(ck, NM("emb.timestep_embedder.linear_1.bias"), 1, b1, &a->b1)) ||
        (s = dl_param_f32(ck, NM("emb.timestep_embedder.linear_2.weight"), 2, s2, &a->w2)) ||
        (s = dl_param_f32(ck, NM("emb.timestep_embedder.linear_2.bias"), 1, b1, &a->b2)) ||
        (s = dl_param_f32(ck, NM("linear.weight"), 2, sl, &a->wl)) || (s = dl_param_f32(ck, NM("linear.bias"), 1, bl, &a->bl)))
        return s;
#undef NM
    return DL_OK;
}

/* an LTX2Attention `<p>` for nq query rows of width dq and nk key rows of width dk; with
 * TP (tp > 1) rank tr's heads */
static dl_status xattn_load(xattn *a, dl_wsrc *ck, const char *p, int self, int gated, int64_t H, int64_t Dh, int64_t nq,
                            int64_t dq, int64_t nk, int64_t dk, int64_t dout, const tcfg *k, dl_dtype dt, int tp, int tr) {
    char nm[200], w[3][200], b[3][200];
    dl_status s;
    a->self = self, a->gated = gated, a->H = H, a->Dh = Dh, a->W = H * Dh;
    a->Hl = H / tp, a->Wl = a->Hl * Dh;
    const int64_t W = a->W, np[3] = {W, W, W};
    tp_slices sw = tp_split(tp, tr, W), sh = tp_split(tp, tr, H);
    const lin_split *cw = tp > 1 ? &sw.col : NULL, *rw = tp > 1 ? &sw.row : NULL, *chd = tp > 1 ? &sh.col : NULL;
    const char *x[3] = {"to_q", "to_k", "to_v"};
    for (int i = 0; i < 3; i++) {
        snprintf(w[i], sizeof w[i], "%s.%s.weight", p, x[i]);
        snprintf(b[i], sizeof b[i], "%s.%s.bias", p, x[i]);
    }
    const char *wn[3] = {w[0], w[1], w[2]}, *bn[3] = {b[0], b[1], b[2]};
#define NM(x) (snprintf(nm, sizeof nm, "%s.%s", p, x), nm)
    if (self) {
        if ((s = dl_lin_load_split(&a->qkv, ck, wn, k->abias ? bn : NULL, 3, np, nq, dq, dt, dt, DL_ACT_NONE, 0, cw))) return s;
    } else if ((s = dl_lin_load_split(&a->q, ck, wn, k->abias ? bn : NULL, 1, np, nq, dq, dt, dt, DL_ACT_NONE, 0, cw)) ||
               (s = dl_lin_load_split(&a->kv, ck, wn + 1, k->abias ? bn + 1 : NULL, 2, np, nk, dk, dt, dt, DL_ACT_NONE, 0, cw))) {
        return s;
    }
    if ((s = lin1s(&a->o, ck, NM("to_out.0"), k->aobias, nq, W, dout, dt, DL_F32, DL_ACT_NONE, rw)) ||
        (s = dl_param_vec(ck, NM("norm_q.weight"), W, &a->nq)) || (s = dl_param_vec(ck, NM("norm_k.weight"), W, &a->nk)) ||
        (gated && (s = lin1s(&a->gate, ck, NM("to_gate_logits"), 1, nq, dq, H, dt, DL_F32, DL_ACT_NONE, chd))))
        return s;
    if (!gated && dl_ws_find(ck, NM("to_gate_logits.weight")))
        return dl_fail(DL_ERR_FORMAT, "LTX-2 transformer: `%s` is in the checkpoint but the config has no gated attention", nm);
#undef NM
    return DL_OK;
}

static dl_status block_load(dl_ltx2_transformer *m, tblock *b, dl_wsrc *ck, int64_t i, const tcfg *k) {
    char p[96], nm[200];
    const int64_t Nv = m->Nvl, Na = m->in.audio_tokens, T = m->T, D = m->D, Da = m->Da;
    const int tp = m->cv.sp.tp, tr = m->cv.sp.tp_rank;
    tp_slices fv = tp_split(tp, tr, 4 * D), fa = tp_split(tp, tr, 4 * Da);
    const lin_split *cfv = tp > 1 ? &fv.col : NULL, *rfv = tp > 1 ? &fv.row : NULL;
    const lin_split *cfa = tp > 1 ? &fa.col : NULL, *rfa = tp > 1 ? &fa.row : NULL;
    const dl_dtype dt = m->dt;
    dl_status s;
    const int64_t sv[2] = {m->nv9 ? 9 : 6, D}, sa[2] = {m->na9 ? 9 : 6, Da}, pv[2] = {2, D}, pa[2] = {2, Da}, cv[2] = {5, D},
                  ca[2] = {5, Da};
    snprintf(p, sizeof p, "transformer_blocks.%lld", (long long)i);
#define NM(x) (snprintf(nm, sizeof nm, "%s.%s", p, x), nm)
    char a1[128], aa1[128], a2[128], aa2[128], a2v[128], v2a[128];
    snprintf(a1, sizeof a1, "%s.attn1", p), snprintf(aa1, sizeof aa1, "%s.audio_attn1", p);
    snprintf(a2, sizeof a2, "%s.attn2", p), snprintf(aa2, sizeof aa2, "%s.audio_attn2", p);
    snprintf(a2v, sizeof a2v, "%s.audio_to_video_attn", p), snprintf(v2a, sizeof v2a, "%s.video_to_audio_attn", p);
    if ((s = xattn_load(&b->a1, ck, a1, 1, k->gated, m->H, m->Dh, Nv, D, Nv, D, D, k, dt, tp, tr)) ||
        (s = xattn_load(&b->aa1, ck, aa1, 1, k->agated, m->Ha, m->Dha, Na, Da, Na, Da, Da, k, dt, tp, tr)) ||
        (s = xattn_load(&b->a2, ck, a2, 0, k->gated, m->H, m->Dh, Nv, D, T, D, D, k, dt, tp, tr)) ||
        (s = xattn_load(&b->aa2, ck, aa2, 0, k->agated, m->Ha, m->Dha, Na, Da, T, Da, Da, k, dt, tp, tr)) ||
        (s = xattn_load(&b->a2v, ck, a2v, 0, k->gated, m->Ha, m->Dha, Nv, D, Na, Da, D, k, dt, tp, tr)) ||
        (s = xattn_load(&b->v2a, ck, v2a, 0, k->agated, m->Ha, m->Dha, Na, Da, Nv, D, Da, k, dt, tp, tr)) ||
        (s = lin1s(&b->ff1, ck, NM("ff.net.0.proj"), k->ff_bias, Nv, D, 4 * D, dt, dt, DL_ACT_GELU_TANH, cfv)) ||
        (s = lin1s(&b->ff2, ck, NM("ff.net.2"), k->ff_bias, Nv, 4 * D, D, dt, DL_F32, DL_ACT_NONE, rfv)) ||
        (s = lin1s(&b->aff1, ck, NM("audio_ff.net.0.proj"), k->aff_bias, Na, Da, 4 * Da, dt, dt, DL_ACT_GELU_TANH, cfa)) ||
        (s = lin1s(&b->aff2, ck, NM("audio_ff.net.2"), k->aff_bias, Na, 4 * Da, Da, dt, DL_F32, DL_ACT_NONE, rfa)) ||
        (s = dl_param_f32(ck, NM("scale_shift_table"), 2, sv, &b->sst)) ||
        (s = dl_param_f32(ck, NM("audio_scale_shift_table"), 2, sa, &b->asst)) ||
        (s = dl_param_f32(ck, NM("video_a2v_cross_attn_scale_shift_table"), 2, cv, &b->vca)) ||
        (s = dl_param_f32(ck, NM("audio_a2v_cross_attn_scale_shift_table"), 2, ca, &b->aca)) ||
        (m->prompt_mod && ((s = dl_param_f32(ck, NM("prompt_scale_shift_table"), 2, pv, &b->pst)) ||
                           (s = dl_param_f32(ck, NM("audio_prompt_scale_shift_table"), 2, pa, &b->apst)))))
        return s;
#undef NM
    return DL_OK;
}

/* the attention scratch of one attention shape (the kernel path depends on head_dim) */
static size_t attn_bytes(dl_dtype dt, int64_t sq, int64_t sk, int64_t H, int64_t Dh, int64_t qs, int64_t kvs) {
    dl_attn_args a = {.dt = dt, .sq = sq, .sk = sk, .heads = H, .head_dim = Dh, .q_stride = qs, .k_stride = kvs,
                      .v_stride = kvs, .kv_end = sk};
    return dl_attn_scratch_bytes(&a, omp_get_max_threads()) + 64;
}

static int64_t max2(int64_t a, int64_t b) { return a > b ? a : b; }

dl_status dl_ltx2_transformer_load(dl_ltx2_transformer **out, dl_model_dir *dir, const char *component,
                                   const dl_ltx2_transformer_shape *sh, dl_dtype dt, dl_wsrc *src) {
    return dl_ltx2_transformer_load_split(out, dir, component, sh, dt, src, NULL);
}

/* the split's refusals (NULL when it runs): the config's, then the size's */
static dl_status split_refused(const tcfg *k, const dl_dit_split *sp, int64_t Nv, const char *who) {
    char buf[512];
    const char *why = split_why(k, sp, buf, sizeof buf);
    if (why) return dl_fail(DL_ERR_INVALID, "%s: parallel split refused: %s", who, why);
    if (sp->cp > Nv)
        return dl_fail(DL_ERR_INVALID, "%s: parallel split refused: cp=%d ranks for %lld video tokens (each cp rank needs at "
                                       "least one)", who, sp->cp, (long long)Nv);
    if ((sp->tp > 1 && !sp->tp_comm) || (sp->cp > 1 && !sp->cp_comm))
        return dl_fail(DL_ERR_INVALID, "%s: a split without its communicators", who);
    return DL_OK;
}

dl_status dl_ltx2_transformer_load_split(dl_ltx2_transformer **out, dl_model_dir *dir, const char *component,
                                         const dl_ltx2_transformer_shape *sh, dl_dtype dt, dl_wsrc *src,
                                         const dl_dit_split *split) {
    *out = NULL;
    char file[512];
    snprintf(file, sizeof file, "%s/config.json", component);
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    tcfg k;
    if ((s = read_config(&k, cfg, file))) return s;
    if (dt != DL_F32 && dt != DL_BF16) return dl_fail(DL_ERR_UNSUPPORTED, "LTX-2 transformer: %s matmuls are not supported (f32, bf16)", dl_dtype_name(dt));
    if (sh->frames < 1 || sh->height < 1 || sh->width < 1 || sh->audio_frames < 1 || sh->text_rows < 1 ||
        sh->frames > 4096 || sh->height > 4096 || sh->width > 4096 || sh->audio_frames > 1 << 20 || sh->text_rows > 65536 ||
        !(sh->fps > 0) || !isfinite(sh->fps))
        return dl_fail(DL_ERR_INVALID, "LTX-2 transformer: latent grid %lld x %lld x %lld, %lld audio frames, %lld text rows, fps %g "
                                       "(each >= 1, fps > 0)",
                       (long long)sh->frames, (long long)sh->height, (long long)sh->width, (long long)sh->audio_frames,
                       (long long)sh->text_rows, sh->fps);
    const int64_t Nv = ((sh->frames + k.pt - 1) / k.pt) * ((sh->height + k.p - 1) / k.p) * ((sh->width + k.p - 1) / k.p);
    if (Nv > (int64_t)1 << 22) return dl_fail(DL_ERR_INVALID, "LTX-2 transformer: %lld video tokens (at most 4M)", (long long)Nv);
    const dl_dit_split one = {.tp = 1, .cp = 1}, *sp = split ? split : &one;
    if ((s = split_refused(&k, sp, Nv, "LTX-2 transformer"))) return s;
    dl_ltx2_transformer *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_wsrc *ck = NULL;
    /* the video stream's split (its rows, the CP exchange) and the audio width's (TP only) */
    m->cv = (dl_dit){.sp = *sp, .dt = dt, .D = k.H * k.Dh, .H = k.H, .Dh = k.Dh, .F = 4 * k.H * k.Dh, .N = Nv, .S = Nv};
    m->ca = (dl_dit){.sp = {.tp = sp->tp, .cp = 1, .tp_rank = sp->tp_rank, .tp_comm = sp->tp_comm}, .dt = dt,
                     .D = k.Ha * k.Dha, .H = k.Ha, .Dh = k.Dha, .F = 4 * k.Ha * k.Dha, .N = sh->audio_frames,
                     .S = sh->audio_frames};
    if ((s = dl_dit_plan(&m->cv)) || (s = dl_dit_plan(&m->ca))) goto fail;
    m->Nvl = m->cv.Nl, m->n0 = m->cv.n0;
    m->dt = dt, m->T = sh->text_rows;
    m->pert = k.pert;
    m->D = k.H * k.Dh, m->H = k.H, m->Dh = k.Dh, m->Da = k.Ha * k.Dha, m->Ha = k.Ha, m->Dha = k.Dha, m->L = k.L;
    m->nv9 = k.cmod, m->na9 = k.acmod, m->prompt_mod = k.cmod || k.acmod, m->prompt_single = k.prompt_single;
    m->prompt_emb = k.prompt_emb, m->eps = k.eps, m->gate_factor = (double)k.cts_mult / (double)k.ts_mult;
    dl_ltx2_transformer_info *in = &m->in;
    in->video_tokens = Nv, in->video_in = k.Cin, in->video_out = k.Cout;
    in->audio_tokens = sh->audio_frames, in->audio_in = k.Ca, in->audio_out = k.Caout;
    in->text_rows = sh->text_rows, in->text_width = k.prompt_emb ? k.C : m->D, in->audio_text_width = k.prompt_emb ? k.C : m->Da;
    in->layers = k.L, in->perturbed_attn = k.pert;
    const int64_t D = m->D, Da = m->Da, Na = in->audio_tokens, T = m->T, Nvl = m->Nvl;
    if ((s = dl_ws_open(&ck, src, dir, component)) != DL_OK) goto fail;
    const int64_t so[2] = {2, D}, sao[2] = {2, Da};
    if ((s = lin1(&m->proj_in, ck, "proj_in", 1, Nvl, k.Cin, D, dt, DL_F32, DL_ACT_NONE)) ||
        (s = lin1(&m->aproj_in, ck, "audio_proj_in", 1, Na, k.Ca, Da, dt, DL_F32, DL_ACT_NONE)) ||
        (s = lin1(&m->proj_out, ck, "proj_out", 1, Nvl, D, k.Cout, dt, DL_F32, DL_ACT_NONE)) ||
        (s = lin1(&m->aproj_out, ck, "audio_proj_out", 1, Na, Da, k.Caout, dt, DL_F32, DL_ACT_NONE)) ||
        (k.prompt_emb && ((s = lin1(&m->cap1, ck, "caption_projection.linear_1", 1, T, k.C, D, dt, dt, DL_ACT_GELU_TANH)) ||
                          (s = lin1(&m->cap2, ck, "caption_projection.linear_2", 1, T, D, D, dt, DL_F32, DL_ACT_NONE)) ||
                          (s = lin1(&m->acap1, ck, "audio_caption_projection.linear_1", 1, T, k.C, Da, dt, dt, DL_ACT_GELU_TANH)) ||
                          (s = lin1(&m->acap2, ck, "audio_caption_projection.linear_2", 1, T, Da, Da, dt, DL_F32, DL_ACT_NONE)))) ||
        (s = adaln_load(&m->te, ck, "time_embed", D, k.cmod ? 9 : 6)) ||
        (s = adaln_load(&m->ate, ck, "audio_time_embed", Da, k.acmod ? 9 : 6)) ||
        (s = adaln_load(&m->cav, ck, "av_cross_attn_video_scale_shift", D, 4)) ||
        (s = adaln_load(&m->caa, ck, "av_cross_attn_audio_scale_shift", Da, 4)) ||
        (s = adaln_load(&m->gv, ck, "av_cross_attn_video_a2v_gate", D, 1)) ||
        (s = adaln_load(&m->ga, ck, "av_cross_attn_audio_v2a_gate", Da, 1)) ||
        (m->prompt_mod && m->prompt_single &&
         ((s = adaln_load(&m->pv, ck, "prompt_adaln", D, 2)) || (s = adaln_load(&m->pa, ck, "audio_prompt_adaln", Da, 2)))) ||
        (s = dl_param_f32(ck, "scale_shift_table", 2, so, &m->out_sst)) ||
        (s = dl_param_f32(ck, "audio_scale_shift_table", 2, sao, &m->out_asst)))
        goto fail;
    if (!(m->b = calloc((size_t)m->L, sizeof *m->b))) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < m->L; i++)
        if ((s = block_load(m, &m->b[i], ck, i, &k))) goto fail;
    if ((s = ropes_make(m, &k, sh))) goto fail;
    /* per-call vectors */
    const size_t nvec = (size_t)(9 * D + D + 9 * Da + Da + 4 * D + 4 * Da + D + Da + 2 * D + 2 * Da + 9 * D + 9 * Da + 2 * D + 2 * Da);
    if (!(m->vecs = calloc(nvec, sizeof(float)))) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    {
        float *v = m->vecs;
        m->tv = v, v += 9 * D, m->ev = v, v += D, m->ta = v, v += 9 * Da, m->ea = v, v += Da;
        m->tcv = v, v += 4 * D, m->tca = v, v += 4 * Da, m->tgv = v, v += D, m->tga = v, v += Da;
        m->tpv = v, v += 2 * D, m->tpa = v, v += 2 * Da, m->mv = v, v += 9 * D, m->ma = v, v += 9 * Da;
        m->kvv = v, v += 2 * D, m->kva = v, v += 2 * Da;
    }
    /* activations: all live through the whole call (one phase) */
    const size_t es = dl_dtype_size(dt);
    const int tp = sp->tp, cp = sp->cp;
    const int64_t R = max2(Nvl, Na), K = max2(R, T), Dm = max2(D, Da), Hm = max2(m->H, m->Ha), Cm = max2(k.Cin, k.Ca);
    const int64_t Dml = Dm / tp, Hml = Hm / tp; /* this rank's attention columns and heads (TP) */
    const int64_t Cx = k.prompt_emb ? k.C : 1;
    act_plan pl = {0};
    dl_plan_add(&pl, &m->xv, (size_t)(Nvl * D) * 4, 0, 0);
    dl_plan_add(&pl, &m->xa, (size_t)(Na * Da) * 4, 0, 0);
    dl_plan_add(&pl, &m->hv, (size_t)(Nvl * D) * es, 0, 0);
    dl_plan_add(&pl, &m->hv2, (size_t)(Nvl * D) * es, 0, 0);
    dl_plan_add(&pl, &m->ha, (size_t)(Na * Da) * es, 0, 0);
    dl_plan_add(&pl, &m->ha2, (size_t)(Na * Da) * es, 0, 0);
    dl_plan_add(&pl, &m->xin, (size_t)(R * Cm) * es, 0, 0);
    dl_plan_add(&pl, &m->qb, (size_t)(R * 3 * Dml) * es, 0, 0);
    dl_plan_add(&pl, &m->kvb, (size_t)(K * 2 * Dml) * es, 0, 0);
    dl_plan_add(&pl, &m->att, (size_t)(R * Dml) * es, 0, 0);
    dl_plan_add(&pl, &m->f, (size_t)(R * 4 * Dml) * es, 0, 0);
    dl_plan_add(&pl, &m->gl, (size_t)(R * Hml) * 4, 0, 0);
    dl_plan_add(&pl, &m->o, (size_t)(R * Dm) * 4, 0, 0);
    if (tp > 1) dl_plan_add(&pl, &m->ss, (size_t)K * 4, 0, 0);
    dl_plan_add(&pl, &m->ctxv, (size_t)(T * D) * 4, 0, 0);
    dl_plan_add(&pl, &m->ctxa, (size_t)(T * Da) * 4, 0, 0);
    dl_plan_add(&pl, &m->ctxin, (size_t)(T * Cx) * es, 0, 0);
    dl_plan_add(&pl, &m->ctxmid, (size_t)(T * Dm) * es, 0, 0);
    dl_plan_add(&pl, &m->ectx, (size_t)(T * Dm) * es, 0, 0);
    /* the largest scratch over every attention of a block */
    const int64_t Dh = m->Dh, Dha = m->Dha, H = m->H, Ha = m->Ha;
    size_t sb = attn_bytes(dt, Nv, Nv, H, Dh, 3 * D, 3 * D);
    sb = (size_t)max2((int64_t)sb, (int64_t)attn_bytes(dt, Na, Na, Ha, Dha, 3 * Da, 3 * Da));
    sb = (size_t)max2((int64_t)sb, (int64_t)attn_bytes(dt, Nv, T, H, Dh, D, 2 * D));
    sb = (size_t)max2((int64_t)sb, (int64_t)attn_bytes(dt, Na, T, Ha, Dha, Da, 2 * Da));
    sb = (size_t)max2((int64_t)sb, (int64_t)attn_bytes(dt, Nv, Na, Ha, Dha, Da, 2 * Da));
    sb = (size_t)max2((int64_t)sb, (int64_t)attn_bytes(dt, Na, Nv, Ha, Dha, Da, 2 * Da));
    dl_plan_add(&pl, &m->scratch, sb, 0, 0);
    if ((s = dl_plan_commit(&pl, ck, &m->arena)) != DL_OK) goto fail;
    { /* the text cache: TEXT_SLOTS x (the key's inputs, every block's text K | V) */
        m->kv_sigma = m->prompt_mod && m->prompt_single;
        m->kv_block = (size_t)(T * 2 * (D / tp + Da / tp)) * es;
        const size_t tb = dl_align_up((size_t)(T * in->text_width) * 4, DL_ALIGN),
                     ab = dl_align_up((size_t)(T * in->audio_text_width) * 4, DL_ALIGN),
                     kb = dl_align_up(m->kv_block * (size_t)m->L, DL_ALIGN);
        if (!(m->txmem = dl_ws_alloc(ck, TEXT_SLOTS * (tb + ab + kb)))) {
            s = dl_fail(DL_ERR_NOMEM, "LTX-2 transformer: cannot allocate the %zu-byte text cache", TEXT_SLOTS * (tb + ab + kb));
            goto fail;
        }
        char *c = m->txmem;
        for (int i = 0; i < TEXT_SLOTS; i++, c += tb + ab + kb)
            m->tx[i] = (txslot){.text = (float *)c, .atext = (float *)(c + tb), .kv = c + tb + ab};
    }
    if (cp > 1) { /* the video self-attention's exchange (the library's), v2a's partials or gathered K | V */
        m->cv.scratch = m->scratch;
        if ((s = dl_dit_alloc(&m->cv))) goto fail;
        const int64_t Hal = Ha / tp, Dal = Da / tp;
        m->vpart = dl_aligned_alloc((size_t)(cp * Na * Hal * (Dha + 2)) * 4);
        if (sp->cp_mode == DL_CP_GATHER) m->vkv = dl_aligned_alloc((size_t)(Nv * 2 * Dal) * es);
        if (!m->vpart || (sp->cp_mode == DL_CP_GATHER && !m->vkv)) {
            s = dl_fail(DL_ERR_NOMEM, "out of memory");
            goto fail;
        }
    }
    dl_ws_close(ck);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_ltx2_transformer_free(m);
    return s;
}

/* ---- the forward ---------------------------------------------------------------------- */

#define RUN(l, x, y)                                         \
    do {                                                     \
        if ((s = lin_run((l), (x), (y))) != DL_OK) return s; \
    } while (0)

/* y[n] = W[n, :] x + b[n] in f32 (double sums), n rows of k */
static void matvec(float *y, const float *w, const float *b, const float *x, int64_t n, int64_t k) {
    DL_PAR({
        int64_t r0, r1;
        dl_split(n, ith, nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) { /* 8 independent sums (no add-latency chain; vectorisable) */
            const float *wr = w + r * k;
            double acc[8] = {0};
            int64_t j = 0;
            for (; j + 8 <= k; j += 8)
                for (int l = 0; l < 8; l++) acc[l] += (double)wr[j + l] * x[j + l];
            for (; j < k; j++) acc[0] += (double)wr[j] * x[j];
            y[r] = (float)((((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))) + b[r]);
        }
    });
}

static float silu(float v) { return v / (1.f + expf(-v)); }

/* LTX2AdaLayerNormSingle(t): out [n d] and (emb != NULL) the embedded timestep [d] */
static void adaln_run(const adaln *a, float t, float *out, float *emb) {
    float proj[256], h[a->d], e[a->d];
    dl_dit_timestep_proj(t, 256, proj);
    matvec(h, a->w1, a->b1, proj, a->d, 256);
    for (int64_t j = 0; j < a->d; j++) h[j] = silu(h[j]);
    matvec(e, a->w2, a->b2, h, a->d, a->d);
    if (emb) memcpy(emb, e, (size_t)a->d * 4);
    for (int64_t j = 0; j < a->d; j++) h[j] = silu(e[j]);
    matvec(out, a->wl, a->bl, h, a->n * a->d, a->d);
}

/* y (dt) = norm(x)(1 + scale) + shift over rows of x [rows, cols] f32: RMSNorm without
 * weight (layer 0) or LayerNorm without affine (layer 1); scale NULL: no modulation */
static void norm_mod(dl_dtype dt, void *y, const float *x, int64_t rows, int64_t cols, float eps, int layer,
                     const float *scale, const float *shift) {
    DL_PAR({
        int64_t r0, r1;
        dl_split(rows, ith, nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            const float *xr = x + r * cols;
            double mean = 0, ss = 0;
            if (layer) {
                for (int64_t j = 0; j < cols; j++) mean += xr[j];
                mean /= (double)cols;
            }
            for (int64_t j = 0; j < cols; j++) ss += ((double)xr[j] - mean) * ((double)xr[j] - mean);
            const float inv = (float)(1.0 / sqrt(ss / (double)cols + (double)eps)), mu = (float)mean;
            for (int64_t j = 0; j < cols; j++) {
                float v = (xr[j] - mu) * inv;
                if (scale) v = v * (1.f + scale[j]) + shift[j];
                if (dt == DL_F32) ((float *)y)[r * cols + j] = v;
                else ((uint16_t *)y)[r * cols + j] = dl_f32_to_bf16(v);
            }
        }
    });
}

/* x [rows, cols] += (gate ? gate * u : u) */
static void gate_add(float *x, const float *u, const float *gate, int64_t rows, int64_t cols) {
    DL_PAR({
        int64_t r0, r1;
        dl_split(rows, ith, nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++)
            for (int64_t j = 0; j < cols; j++) x[r * cols + j] += gate ? u[r * cols + j] * gate[j] : u[r * cols + j];
    });
}

static void rope_apply(const rope *r, dl_dtype dt, void *x, int64_t rows, int64_t stride) {
    DL_ASSERT(r->N == rows);
    if (!r->split) {
        DL_PAR(dl_rope_t(DL_ROPE_PAIRS, dt, x, rows, 1, r->dim, stride, r->cos, r->sin, ith, nth));
        return;
    }
    const int64_t w = r->dim / r->G, half = w / 2;
    const size_t es = dl_dtype_size(dt);
    for (int64_t g = 0; g < r->G; g++) {
        const float *ct = r->cos + g * rows * half, *st = r->sin + g * rows * half;
        char *xg = (char *)x + (size_t)(g * w) * es;
        DL_PAR(dl_rope_t(DL_ROPE_HALVES, dt, xg, rows, 1, w, stride, ct, st, ith, nth));
    }
}

/* TP: the row-parallel partial sums of n floats become the whole (an all-reduce over the tp group) */
static dl_status tp_reduce(dl_ltx2_transformer *m, float *x, int64_t n) {
    return m->cv.sp.tp > 1 ? dl_comm_allreduce_sum(m->cv.sp.tp_comm, x, (size_t)n) : DL_OK;
}

/* where an attention's keys are */
typedef enum {
    KEYS_LOCAL = 0, /* on this rank: the text, the audio, or every key without CP */
    KEYS_VSELF,     /* video self-attention: the cp group's video rows (the DiT library's CP modes) */
    KEYS_VIDEO      /* v2a: audio queries (every rank) over the cp group's video rows */
} keys_at;

/* v2a with CP: the audio queries over every cp rank's video keys (k, v: this rank's
 * nk rows, stride ks). Ring / Ulysses: this rank's partial (O, row max, sum of exps)
 * over its keys, all-gathered and merged in rank order; gather: every rank's K | V
 * all-gathered (kv: this rank's [nk, 2 Wl] rows), one attention. The result, into
 * att [nq, Wl], is the same on every cp rank. */
static dl_status v2a_cp(dl_ltx2_transformer *m, const xattn *a, const char *q, int64_t qs, const char *kv, int64_t nq,
                        int64_t nk) {
    const dl_dit *c = &m->cv;
    const int cp = c->sp.cp, r = c->sp.cp_rank;
    const int64_t Hl = a->Hl, Dh = a->Dh, Wl = a->Wl;
    const size_t es = dl_dtype_size(m->dt);
    dl_attn_args at = {.dt = m->dt, .sq = nq, .sk = nk, .heads = Hl, .head_dim = Dh, .q = q, .q_stride = qs, .k = kv,
                       .v = kv + (size_t)Wl * es, .k_stride = 2 * Wl, .v_stride = 2 * Wl, .out = m->att, .out_stride = Wl,
                       .kv_begin = 0, .kv_end = nk, .scale = 1.f / sqrtf((float)Dh)};
    dl_status s;
    if (c->sp.cp_mode == DL_CP_GATHER) {
        const size_t row = (size_t)(2 * Wl) * es;
        for (int j = 0; j < cp; j++) c->cnt[j] = (size_t)c->cnn[j] * row, c->dsp[j] = (size_t)c->cn0[j] * row;
        if ((s = dl_comm_allgatherv(c->sp.cp_comm, kv, m->vkv, c->cnt, c->dsp))) return s;
        at.k = m->vkv, at.v = (const char *)m->vkv + (size_t)Wl * es, at.sk = at.kv_end = c->N;
        DL_PAR(dl_attn_t(&at, m->scratch, ith, nth));
        return DL_OK;
    }
    const int64_t P = nq * Hl * (Dh + 2); /* one rank's partial: o [nq, Hl, Dh], m and l [Hl, nq] */
    float *mine = m->vpart + r * P;
    at.o_part = mine, at.m = mine + nq * Hl * Dh, at.l = at.m + nq * Hl;
    DL_PAR(dl_attn_t(&at, m->scratch, ith, nth));
    if ((s = dl_comm_allgather(c->sp.cp_comm, mine, (size_t)P * 4, m->vpart))) return s;
    dl_attn_partial parts[64];
    for (int j = 0; j < cp; j++) {
        float *o = m->vpart + j * P;
        parts[j] = (dl_attn_partial){o, o + nq * Hl * Dh, o + nq * Hl * Dh + nq * Hl};
    }
    DL_PAR(dl_attn_merge_t(parts, cp, nq, Hl, Dh, m->dt, m->att, Wl, NULL, NULL, NULL, ith, nth));
    return DL_OK;
}

/* out [nq, Dout] f32 = attention a of hq [nq, Dq] (dt) over hk [nk, Dk] (dt; self: hq),
 * this rank's heads (TP: the row-parallel output all-reduced); w is the stream whose
 * width the attention has (its across-heads norm's split); keys: where the keys are.
 * kvc (a cross-attention without key RoPE): where its K | V [nk, 2 Wl] (normed keys)
 * go, or with have, are already (hk unused); NULL: the scratch kvb. */
static dl_status xattn_run(dl_ltx2_transformer *m, xattn *a, dl_dit *w, const void *hq, int64_t nq, const void *hk,
                           int64_t nk, const rope *rq, const rope *rk, int perturbed, keys_at keys, char *kvc, int have,
                           float *out) {
    const int64_t Wl = a->Wl, Hl = a->Hl, Dh = a->Dh;
    const size_t es = dl_dtype_size(m->dt);
    const int cp = m->cv.sp.cp > 1;
    dl_status s;
    char *q, *k, *v;
    int64_t qs, ks;
    if (a->self) {
        RUN(&a->qkv, hq, m->qb);
        q = m->qb, k = q + (size_t)Wl * es, v = q + (size_t)(2 * Wl) * es, qs = ks = 3 * Wl;
    } else {
        DL_ASSERT(!kvc || (!rk && keys == KEYS_LOCAL));
        RUN(&a->q, hq, m->qb);
        k = kvc ? kvc : m->kvb;
        if (!have) RUN(&a->kv, hk, k);
        q = m->qb, v = k + (size_t)Wl * es, qs = Wl, ks = 2 * Wl;
    }
    if (a->gated) RUN(&a->gate, hq, m->gl);
    if (perturbed) { /* STG (self-attention only): the value projection in place of attention */
        DL_ASSERT(a->self);
        for (int64_t r = 0; r < nq; r++)
            memcpy((char *)m->att + (size_t)(r * Wl) * es, v + (size_t)(r * qs) * es, (size_t)Wl * es);
    } else {
        if ((s = dl_dit_rmsnorm_full(w, q, nq, qs, a->nq, 1e-6f, m->ss)) ||
            (!have && (s = dl_dit_rmsnorm_full(w, k, nk, ks, a->nk, 1e-6f, m->ss))))
            return s;
        if (rq) rope_apply(rq, m->dt, q, nq, qs);
        if (rk) rope_apply(rk, m->dt, k, nk, ks);
        if (cp && keys == KEYS_VSELF) { /* the library's CP modes over the fused q | k | v rows */
            m->cv.qkv = m->qb, m->cv.att = m->att;
            if ((s = dl_dit_attention(&m->cv, Wl))) return s;
        } else if (cp && keys == KEYS_VIDEO) {
            if ((s = v2a_cp(m, a, q, qs, k, nq, nk))) return s;
        } else {
            dl_attn_args at = {.dt = m->dt, .sq = nq, .sk = nk, .heads = Hl, .head_dim = Dh, .q = q, .q_stride = qs, .k = k,
                               .v = v, .k_stride = ks, .v_stride = ks, .out = m->att, .out_stride = Wl, .kv_begin = 0,
                               .kv_end = nk, .scale = 1.f / sqrtf((float)Dh)};
            DL_PAR(dl_attn_t(&at, m->scratch, ith, nth));
        }
    }
    if (a->gated) { /* out *= 2 sigmoid(gate logit) per head, rounded as the stream's dtype */
        DL_PAR({
            int64_t r0, r1;
            dl_split(nq, ith, nth, &r0, &r1);
            for (int64_t r = r0; r < r1; r++)
                for (int64_t h = 0; h < Hl; h++) {
                    const float g = 2.f / (1.f + expf(-m->gl[r * Hl + h]));
                    char *row = (char *)m->att + (size_t)(r * Wl + h * Dh) * es;
                    for (int64_t j = 0; j < Dh; j++) {
                        if (m->dt == DL_F32) ((float *)row)[j] *= g;
                        else ((uint16_t *)row)[j] = dl_f32_to_bf16(dl_bf16_to_f32(((uint16_t *)row)[j]) * g);
                    }
                }
        });
    }
    RUN(&a->o, m->att, out);
    return tp_reduce(m, out, nq * a->o.n);
}

/* mod[i] = table[i] + temb[i] for n rows of d */
static void add_rows(float *mod, const float *table, const float *temb, int64_t n, int64_t d) {
    for (int64_t j = 0; j < n * d; j++) mod[j] = table[j] + (temb ? temb[j] : 0.f);
}

/* the text as a block's cross-attention keys see it: e (1 + scale) + shift (kv: shift,
 * scale) or e as it is, into ectx (dt) */
static void text_kv(dl_ltx2_transformer *m, const float *e, int64_t d, const float *kv) {
    const int64_t T = m->T;
    for (int64_t r = 0; r < T; r++)
        for (int64_t j = 0; j < d; j++) {
            float v = e[r * d + j];
            if (kv) v = v * (1.f + kv[d + j]) + kv[j];
            if (m->dt == DL_F32) ((float *)m->ectx)[r * d + j] = v;
            else ((uint16_t *)m->ectx)[r * d + j] = dl_f32_to_bf16(v);
        }
}

/* one block; kvc: its text K | V in the text cache (video [T, 2 Wl], then audio), made
 * here unless have */
static dl_status block_run(dl_ltx2_transformer *m, tblock *b, int isolate, int perturbed, char *kvc, int have) {
    const int64_t Nv = m->Nvl, Na = m->in.audio_tokens, D = m->D, Da = m->Da; /* this rank's video rows */
    dl_dit *wv = &m->cv, *wa = &m->ca;
    const float eps = (float)m->eps;
    const dl_dtype dt = m->dt;
    dl_status s;
    float *mv = m->mv, *ma = m->ma; /* shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp[, q shift, scale, gate] */
    add_rows(mv, b->sst, m->tv, m->nv9 ? 9 : 6, D);
    add_rows(ma, b->asst, m->ta, m->na9 ? 9 : 6, Da);
    /* 1. self-attention */
    norm_mod(dt, m->hv, m->xv, Nv, D, eps, 0, mv + D, mv);
    if ((s = xattn_run(m, &b->a1, wv, m->hv, Nv, m->hv, Nv, &m->rv, &m->rv, perturbed, KEYS_VSELF, NULL, 0, m->o))) return s;
    gate_add(m->xv, m->o, mv + 2 * D, Nv, D);
    norm_mod(dt, m->ha, m->xa, Na, Da, eps, 0, ma + Da, ma);
    if ((s = xattn_run(m, &b->aa1, wa, m->ha, Na, m->ha, Na, &m->ra, &m->ra, perturbed, KEYS_LOCAL, NULL, 0, m->o))) return s;
    gate_add(m->xa, m->o, ma + 2 * Da, Na, Da);
    /* 2. text cross-attention */
    const float *kvv = NULL, *kva = NULL;
    if (m->prompt_mod) {
        add_rows(m->kvv, b->pst, m->prompt_single ? m->tpv : NULL, 2, D);
        add_rows(m->kva, b->apst, m->prompt_single ? m->tpa : NULL, 2, Da);
        kvv = m->kvv, kva = m->kva;
    }
    char *kvca = kvc + (size_t)(m->T * 2 * b->a2.Wl) * dl_dtype_size(dt); /* the audio text's K | V */
    norm_mod(dt, m->hv, m->xv, Nv, D, eps, 0, m->nv9 ? mv + 7 * D : NULL, mv + 6 * D);
    if (!have) text_kv(m, m->ctxv, D, kvv);
    if ((s = xattn_run(m, &b->a2, wv, m->hv, Nv, m->ectx, m->T, NULL, NULL, 0, KEYS_LOCAL, kvc, have, m->o))) return s;
    gate_add(m->xv, m->o, m->nv9 ? mv + 8 * D : NULL, Nv, D);
    norm_mod(dt, m->ha, m->xa, Na, Da, eps, 0, m->na9 ? ma + 7 * Da : NULL, ma + 6 * Da);
    if (!have) text_kv(m, m->ctxa, Da, kva);
    if ((s = xattn_run(m, &b->aa2, wa, m->ha, Na, m->ectx, m->T, NULL, NULL, 0, KEYS_LOCAL, kvca, have, m->o))) return s;
    gate_add(m->xa, m->o, m->na9 ? ma + 8 * Da : NULL, Na, Da);
    /* 3. audio-to-video and video-to-audio: every modulated input made before either */
    if (!isolate) {
        float cv[5 * D], ca[5 * Da]; /* a2v scale, shift, v2a scale, shift; gate */
        add_rows(cv, b->vca, m->tcv, 4, D);
        add_rows(cv + 4 * D, b->vca + 4 * D, m->tgv, 1, D);
        add_rows(ca, b->aca, m->tca, 4, Da);
        add_rows(ca + 4 * Da, b->aca + 4 * Da, m->tga, 1, Da);
        norm_mod(dt, m->hv, m->xv, Nv, D, eps, 0, cv, cv + D);           /* a2v queries */
        norm_mod(dt, m->hv2, m->xv, Nv, D, eps, 0, cv + 2 * D, cv + 3 * D); /* v2a keys */
        norm_mod(dt, m->ha, m->xa, Na, Da, eps, 0, ca, ca + Da);
        norm_mod(dt, m->ha2, m->xa, Na, Da, eps, 0, ca + 2 * Da, ca + 3 * Da);
        if ((s = xattn_run(m, &b->a2v, wa, m->hv, Nv, m->ha, Na, &m->rcv, &m->rca, 0, KEYS_LOCAL, NULL, 0, m->o))) return s;
        gate_add(m->xv, m->o, cv + 4 * D, Nv, D);
        if ((s = xattn_run(m, &b->v2a, wa, m->ha2, Na, m->hv2, Nv, &m->rca, &m->rcv, 0, KEYS_VIDEO, NULL, 0, m->o))) return s;
        gate_add(m->xa, m->o, ca + 4 * Da, Na, Da);
    }
    /* 4. feed-forwards */
    norm_mod(dt, m->hv, m->xv, Nv, D, eps, 0, mv + 4 * D, mv + 3 * D);
    RUN(&b->ff1, m->hv, m->f);
    RUN(&b->ff2, m->f, m->o);
    if ((s = tp_reduce(m, m->o, Nv * D))) return s;
    gate_add(m->xv, m->o, mv + 5 * D, Nv, D);
    norm_mod(dt, m->ha, m->xa, Na, Da, eps, 0, ma + 4 * Da, ma + 3 * Da);
    RUN(&b->aff1, m->ha, m->f);
    RUN(&b->aff2, m->f, m->o);
    if ((s = tp_reduce(m, m->o, Na * Da))) return s;
    gate_add(m->xa, m->o, ma + 5 * Da, Na, Da);
    return DL_OK;
}

/* The text cache's entry for this call's text (*have: its K | V are made) or the one to
 * make them in (empty, else the least recently used), emptied until the run completes.
 * Under TP every rank of the group must agree (the key norm all-reduces): a miss on any
 * rank is a miss on all. */
static dl_status text_slot(dl_ltx2_transformer *m, const dl_ltx2_transformer_input *x, txslot **out, int *have) {
    const size_t tb = (size_t)(m->T * m->in.text_width) * 4, ab = (size_t)(m->T * m->in.audio_text_width) * 4;
    txslot *hit = NULL, *victim = &m->tx[0];
    for (int i = 0; i < TEXT_SLOTS; i++) {
        txslot *t = &m->tx[i];
        if (t->used && !memcmp(t->text, x->text, tb) && !memcmp(t->atext, x->audio_text, ab) &&
            (!m->kv_sigma || (!memcmp(&t->sigma, &x->sigma, 4) && !memcmp(&t->asigma, &x->audio_sigma, 4))))
            hit = t;
        if (t->used < victim->used) victim = t;
    }
    if (m->cv.sp.tp > 1) {
        float miss = hit ? 0.f : 1.f;
        dl_status s = dl_comm_allreduce_sum(m->cv.sp.tp_comm, &miss, 1);
        if (s) return s;
        if (miss > 0.f) hit = NULL;
    }
    *have = hit != NULL;
    *out = hit ? hit : victim;
    if (!hit) victim->used = 0;
    return DL_OK;
}

void dl_ltx2_transformer_forget_text(dl_ltx2_transformer *m) {
    for (int i = 0; i < TEXT_SLOTS; i++) m->tx[i].used = 0;
}

static int all_finite(const float *x, int64_t n) {
    for (int64_t j = 0; j < n; j++)
        if (!isfinite(x[j])) return 0;
    return 1;
}

dl_status dl_ltx2_transformer_run(dl_ltx2_transformer *m, const dl_ltx2_transformer_input *x, float *out_video,
                                  float *out_audio) {
    const dl_ltx2_transformer_info *in = &m->in;
    const int64_t Nv = in->video_tokens, Na = in->audio_tokens, T = m->T, D = m->D, Da = m->Da, Nvl = m->Nvl, n0 = m->n0;
    dl_status s;
    if (!x || !x->video || !x->audio || !x->text || !x->audio_text || !out_video || !out_audio)
        return dl_fail(DL_ERR_INVALID, "LTX-2 transformer: an input or output buffer is missing");
    if (x->video_tokens != Nv || x->audio_tokens != Na || x->text_rows != T)
        return dl_fail(DL_ERR_INVALID,
                       "LTX-2 transformer: built for %lld video tokens, %lld audio tokens and %lld text rows; given %lld, %lld, %lld",
                       (long long)Nv, (long long)Na, (long long)T, (long long)x->video_tokens, (long long)x->audio_tokens,
                       (long long)x->text_rows);
    const float ts[4] = {x->timestep, x->audio_timestep, x->sigma, x->audio_sigma};
    static const char *const tn[4] = {"timestep", "audio_timestep", "sigma", "audio_sigma"};
    for (int i = 0; i < 4; i++)
        if (!isfinite(ts[i])) return dl_fail(DL_ERR_INVALID, "LTX-2 transformer: %s is not finite", tn[i]);
    if (!all_finite(x->video, Nv * in->video_in) || !all_finite(x->audio, Na * in->audio_in) ||
        !all_finite(x->text, T * in->text_width) || !all_finite(x->audio_text, T * in->audio_text_width))
        return dl_fail(DL_ERR_INVALID, "LTX-2 transformer: a latent or text embedding value is not finite");
    /* embeddings (f32) */
    const float tcv = x->use_cross_timestep ? x->audio_sigma : x->timestep;
    const float tca = x->use_cross_timestep ? x->sigma : x->audio_timestep;
    const float gf = (float)m->gate_factor;
    adaln_run(&m->te, x->timestep, m->tv, m->ev);
    adaln_run(&m->ate, x->audio_timestep, m->ta, m->ea);
    adaln_run(&m->cav, tcv, m->tcv, NULL);
    adaln_run(&m->gv, tcv * gf, m->tgv, NULL);
    adaln_run(&m->caa, tca, m->tca, NULL);
    adaln_run(&m->ga, tca * gf, m->tga, NULL);
    if (m->prompt_mod && m->prompt_single) {
        adaln_run(&m->pv, x->sigma, m->tpv, NULL);
        adaln_run(&m->pa, x->audio_sigma, m->tpa, NULL);
    }
    if (x->stg_nblocks < 0 || x->stg_nblocks > 4096 || (x->stg_nblocks && !x->stg_blocks))
        return dl_fail(DL_ERR_INVALID, "LTX-2 transformer: %d spatio-temporal guidance blocks", x->stg_nblocks);
    /* inputs: proj_in, text (caption projections; none when the text cache has its K | V) */
    txslot *tx;
    int have;
    if ((s = text_slot(m, x, &tx, &have))) return s;
    to_dt(m->dt, m->xin, x->video + n0 * in->video_in, Nvl * in->video_in); /* this rank's video rows */
    RUN(&m->proj_in, m->xin, m->xv);
    to_dt(m->dt, m->xin, x->audio, Na * in->audio_in);
    RUN(&m->aproj_in, m->xin, m->xa);
    if (!have && m->prompt_emb) {
        to_dt(m->dt, m->ctxin, x->text, T * in->text_width);
        RUN(&m->cap1, m->ctxin, m->ctxmid);
        RUN(&m->cap2, m->ctxmid, m->ctxv);
        to_dt(m->dt, m->ctxin, x->audio_text, T * in->audio_text_width);
        RUN(&m->acap1, m->ctxin, m->ctxmid);
        RUN(&m->acap2, m->ctxmid, m->ctxa);
    } else if (!have) {
        memcpy(m->ctxv, x->text, (size_t)(T * D) * 4);
        memcpy(m->ctxa, x->audio_text, (size_t)(T * Da) * 4);
    }
    for (int64_t i = 0; i < m->L; i++) {
        int pert = 0; /* diffusers: a block index past the last block perturbs nothing */
        for (int j = 0; m->pert && j < x->stg_nblocks; j++) pert |= x->stg_blocks[j] == i;
        if ((s = block_run(m, &m->b[i], x->isolate_modalities, pert, tx->kv + (size_t)i * m->kv_block, have))) return s;
    }
    if (!have) { /* every block's text K | V are made: the entry is this text's */
        memcpy(tx->text, x->text, (size_t)(T * in->text_width) * 4);
        memcpy(tx->atext, x->audio_text, (size_t)(T * in->audio_text_width) * 4);
        tx->sigma = x->sigma, tx->asigma = x->audio_sigma;
    }
    tx->used = ++m->runs;
    /* output: LN(x)(1 + scale) + shift, (shift, scale) = table + embedded timestep */
    float sv[2 * D], sa[2 * Da];
    for (int i = 0; i < 2; i++) {
        for (int64_t j = 0; j < D; j++) sv[i * D + j] = m->out_sst[i * D + j] + m->ev[j];
        for (int64_t j = 0; j < Da; j++) sa[i * Da + j] = m->out_asst[i * Da + j] + m->ea[j];
    }
    norm_mod(m->dt, m->hv, m->xv, Nvl, D, 1e-6f, 1, sv + D, sv);
    RUN(&m->proj_out, m->hv, out_video + n0 * in->video_out);
    if ((s = dl_dit_gather_image_rows(&m->cv, out_video, in->video_out))) return s; /* every cp rank's rows */
    norm_mod(m->dt, m->ha, m->xa, Na, Da, 1e-6f, 1, sa + Da, sa);
    RUN(&m->aproj_out, m->ha, out_audio);
    return DL_OK;
}

/* ---- the step-caching probe ------------------------------------------------------------
 * A program of its own (the pipeline's "probe" component, weights from the transformer
 * folder): proj_in, time_embed and block 0's scale_shift_table. Its feature is block 0's
 * modulated video input RMS(proj_in(latents))(1 + scale_msa) + shift_msa, the
 * modulation E(t) + table (the same arithmetic as the forward's first norm_mod, in f32);
 * the score is its relative L1 change (dl_dit_probe_score, as the other probes). The
 * feature depends on the latents and the timestep only: every guidance pass of a step
 * sees the same value. Under a split each cp rank computes its video rows' feature and
 * the score's sums are added over the cp group in rank order (every rank gets the same
 * score); tp ranks compute it alike. */
struct dl_ltx2_probe {
    dl_dit c;          /* the split: this rank's video rows [n0, n0 + Nl), the cp group for the score */
    int64_t Nv, Cin, D, nmod;
    double eps;
    dl_dtype dt;
    lin proj_in;       /* [Nv, Cin] dt -> [Nv, D] f32 */
    adaln te;          /* time_embed: [nmod D] */
    float *sst;        /* transformer_blocks.0.scale_shift_table [nmod, D] */
    float *mod;        /* [nmod D] */
    float *x, *cur;    /* [Nl, D] f32 (arena) */
    void *xin;         /* [Nl, Cin] dt (arena) */
    float *prev[2];    /* [Nl, D] per slot */
    int have[2];
    void *arena;
};

void dl_ltx2_probe_free(dl_ltx2_probe *p) {
    if (!p) return;
    dl_lin_free(&p->proj_in);
    adaln_free(&p->te);
    dl_dit_free(&p->c);
    free(p->sst), free(p->mod);
    dl_aligned_free(p->prev[0]), dl_aligned_free(p->prev[1]), dl_aligned_free(p->arena);
    free(p);
}

void dl_ltx2_probe_reset(dl_ltx2_probe *p) { p->have[0] = p->have[1] = 0; }

dl_status dl_ltx2_probe_load(dl_ltx2_probe **out, dl_model_dir *dir, const char *component,
                             const dl_ltx2_transformer_shape *sh, dl_dtype dt, dl_wsrc *src) {
    return dl_ltx2_probe_load_split(out, dir, component, sh, dt, src, NULL);
}

dl_status dl_ltx2_probe_load_split(dl_ltx2_probe **out, dl_model_dir *dir, const char *component,
                                   const dl_ltx2_transformer_shape *sh, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split) {
    *out = NULL;
    char file[512];
    snprintf(file, sizeof file, "%s/config.json", component);
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    tcfg k;
    if ((s = read_config(&k, cfg, file))) return s;
    if (dt != DL_F32 && dt != DL_BF16) return dl_fail(DL_ERR_UNSUPPORTED, "LTX-2 probe: %s matmuls are not supported (f32, bf16)", dl_dtype_name(dt));
    if (sh->frames < 1 || sh->height < 1 || sh->width < 1 || sh->frames > 4096 || sh->height > 4096 || sh->width > 4096)
        return dl_fail(DL_ERR_INVALID, "LTX-2 probe: latent grid %lld x %lld x %lld (each in 1..4096)", (long long)sh->frames,
                       (long long)sh->height, (long long)sh->width);
    const int64_t Nv = ((sh->frames + k.pt - 1) / k.pt) * ((sh->height + k.p - 1) / k.p) * ((sh->width + k.p - 1) / k.p);
    if (Nv > (int64_t)1 << 22) return dl_fail(DL_ERR_INVALID, "LTX-2 probe: %lld video tokens (at most 4M)", (long long)Nv);
    const dl_dit_split one = {.tp = 1, .cp = 1}, *sp = split ? split : &one;
    if ((s = split_refused(&k, sp, Nv, "LTX-2 probe"))) return s;
    dl_ltx2_probe *p = calloc(1, sizeof *p);
    if (!p) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_wsrc *ck = NULL;
    p->Nv = Nv, p->Cin = k.Cin, p->D = k.H * k.Dh, p->nmod = k.cmod ? 9 : 6, p->eps = k.eps, p->dt = dt;
    p->c = (dl_dit){.sp = *sp, .dt = dt, .D = p->D, .H = k.H, .Dh = k.Dh, .F = 4 * p->D, .N = Nv, .S = Nv};
    if ((s = dl_dit_plan(&p->c))) {
        dl_ltx2_probe_free(p);
        return s;
    }
    const int64_t D = p->D, ss[2] = {p->nmod, D}, Nl = p->c.Nl;
    if ((s = dl_ws_open(&ck, src, dir, component)) != DL_OK ||
        (s = lin1(&p->proj_in, ck, "proj_in", 1, Nl, k.Cin, D, dt, DL_F32, DL_ACT_NONE)) ||
        (s = adaln_load(&p->te, ck, "time_embed", D, p->nmod)) ||
        (s = dl_param_f32(ck, "transformer_blocks.0.scale_shift_table", 2, ss, &p->sst)))
        goto fail;
    act_plan pl = {0};
    dl_plan_add(&pl, &p->x, (size_t)(Nl * D) * 4, 0, 0);
    dl_plan_add(&pl, &p->cur, (size_t)(Nl * D) * 4, 0, 0);
    dl_plan_add(&pl, &p->xin, (size_t)(Nl * k.Cin) * dl_dtype_size(dt), 0, 0);
    if ((s = dl_plan_commit(&pl, ck, &p->arena)) != DL_OK) goto fail;
    p->mod = malloc((size_t)(p->nmod * D) * sizeof(float));
    for (int i = 0; i < 2; i++) p->prev[i] = dl_aligned_alloc((size_t)(Nl * D) * 4);
    if (!p->mod || !p->prev[0] || !p->prev[1]) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    dl_ws_close(ck);
    *out = p;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_ltx2_probe_free(p);
    return s;
}

dl_status dl_ltx2_probe_run(dl_ltx2_probe *p, int slot, const float *video, float timestep, double *score) {
    const int64_t Nv = p->Nv, D = p->D, Nl = p->c.Nl;
    dl_status s;
    *score = 0;
    if (slot < 0 || slot > 1) return dl_fail(DL_ERR_INVALID, "LTX-2 probe: slot %d (0 or 1)", slot);
    if (!isfinite(timestep)) return dl_fail(DL_ERR_INVALID, "LTX-2 probe: the timestep is not finite");
    if (!video || !all_finite(video, Nv * p->Cin)) return dl_fail(DL_ERR_INVALID, "LTX-2 probe: a latent value is not finite");
    adaln_run(&p->te, timestep, p->mod, NULL);
    add_rows(p->mod, p->sst, p->mod, 2, D); /* shift_msa, scale_msa */
    to_dt(p->dt, p->xin, video + p->c.n0 * p->Cin, Nl * p->Cin); /* this rank's video rows */
    RUN(&p->proj_in, p->xin, p->x);
    norm_mod(DL_F32, p->cur, p->x, Nl, D, (float)p->eps, 0, p->mod + D, p->mod);
    if (p->have[slot] && (s = dl_dit_probe_score(&p->c, p->cur, p->prev[slot], Nl * D, score))) return s;
    memcpy(p->prev[slot], p->cur, (size_t)(Nl * D) * 4);
    p->have[slot] = 1;
    return DL_OK;
}
