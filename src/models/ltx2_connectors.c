/* LTX2TextConnectors (diffusers, pipelines/ltx2/connectors.py): the Gemma hidden
 * states of every layer -> the video and the audio stream's text embeddings.
 *
 *   h: [T, C, L1] (C = caption_channels, L1 = text_proj_in_factor), the last `v` rows real
 *   LTX-2.0: per layer l, over the real rows and all channels:
 *              n = (h - mean) / (max - min + 1e-6) * 8,  padded rows 0
 *            e_v = e_a = text_proj_in(n)                         // [T, C]
 *   LTX-2.3: n = h / sqrt(mean_c(h^2) + 1e-6) per row and layer, padded rows 0
 *            e_s = s_proj_in(n * sqrt(hidden_s / C)), s in {video, audio}
 *   connector (per stream):
 *     with R learnable registers: the real rows moved to the front (in order), row r >= v
 *       replaced by registers[r mod R]; every key then attended
 *     without: padded keys masked out (-finfo.max added: they get no weight)
 *     per block: x += attn1(RMS(x)); x += ff(RMS(x))      (RMS without weights, eps 1e-6)
 *       attn1: q, k, v = to_q|k|v; q, k = RMSNorm across heads (weights) then 1-D RoPE;
 *              softmax(q k^T / sqrt(Dh)) v [x 2 sigmoid(to_gate_logits(x)) per head] -> to_out
 *       ff: Linear -> GELU(tanh) -> Linear (4x)
 *     out = RMS(x)
 *   1-D RoPE: f_i = theta^(i / (D/2 - 1)) pi / 2 (f64, then f32), angle = (2 r / base - 1) f_i
 *     over the whole inner width: "interleaved" rotates pairs (2i, 2i+1) with f_i;
 *     "split" gives head h the frequencies [h Dh/2, (h+1) Dh/2) and rotates halves.
 * diffusers then multiplies the video embedding by (mask < 1e-6), which holds for 0
 * and for -finfo.max alike: every row is kept, and so it is here. */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/ltx2.h"
#include "models/models_impl.h"

typedef struct {
    lin qkv;                 /* attn1.to_q|to_k|to_v: [T, D] -> [T, 3D] dt */
    lin o;                   /* attn1.to_out.0 -> f32 */
    lin gate;                /* attn1.to_gate_logits: [T, D] -> [T, H] f32 (gated attention) */
    float *nq, *nk;          /* [D] */
    lin ff1, ff2;            /* ff.net.0.proj (GELU-tanh fused): D -> 4D dt; ff.net.2 -> f32 */
} cblock;

typedef struct {
    int64_t H, Dh, D, R, L;  /* heads, head dim, width, registers (0: none), blocks */
    int gated, split;
    cblock *b;
    float *reg;              /* [R, D] */
    float *cos, *sin;        /* interleaved: [T, D/2]; split: [H, T, Dh/2] */
} conn;

struct dl_ltx2_connectors {
    int64_t T, C, L1, Dv, Da;
    int modal;               /* per_modality_projections (LTX-2.3) */
    dl_dtype dt;
    lin proj, proj_v, proj_a;
    conn cv, ca;
    /* activations */
    float *n;                /* [T, C L1] f32: the normalised stack */
    void *nin;               /* [T, C L1] dt */
    float *x;                /* [T, Dmax] residual */
    float *o;                /* [T, Dmax] f32 updates */
    float *gl;               /* [T, Hmax] gate logits */
    void *h, *qkv, *att, *f; /* [T, Dmax], [T, 3 Dmax], [T, Dmax], [T, 4 Dmax] dt */
    float *e;                /* [T, Dmax] f32: a stream's projected input */
    void *scratch, *arena;
};

void dl_ltx2_connectors_text_dims(const dl_ltx2_connectors *m, int64_t *channels, int64_t *layers) {
    *channels = m->C;
    *layers = m->L1;
}
int64_t dl_ltx2_connectors_video_width(const dl_ltx2_connectors *m) { return m->Dv; }
int64_t dl_ltx2_connectors_audio_width(const dl_ltx2_connectors *m) { return m->Da; }

static void conn_free(conn *c) {
    for (int i = 0; c->b && i < c->L; i++) {
        cblock *b = &c->b[i];
        dl_lin_free(&b->qkv), dl_lin_free(&b->o), dl_lin_free(&b->gate), dl_lin_free(&b->ff1), dl_lin_free(&b->ff2);
        free(b->nq), free(b->nk);
    }
    free(c->b), free(c->reg), free(c->cos), free(c->sin);
}

void dl_ltx2_connectors_free(dl_ltx2_connectors *m) {
    if (!m) return;
    conn_free(&m->cv), conn_free(&m->ca);
    dl_lin_free(&m->proj), dl_lin_free(&m->proj_v), dl_lin_free(&m->proj_a);
    dl_aligned_free(m->arena);
    free(m);
}

/* the connector's config (prefix "video" or "audio") */
static dl_status conn_config(conn *c, const cJSON *cfg, const char *file, const char *s) {
    char k[96];
    int64_t R;
    const cJSON *r;
    dl_status st;
#define KEY(x) (snprintf(k, sizeof k, "%s_%s", s, x), k)
    if ((st = dl_cfg_int(cfg, file, KEY("connector_num_attention_heads"), 30, &c->H)) ||
        (st = dl_cfg_int(cfg, file, KEY("connector_attention_head_dim"), 128, &c->Dh)) ||
        (st = dl_cfg_int(cfg, file, KEY("connector_num_layers"), 2, &c->L)) ||
        (st = dl_cfg_bool(cfg, file, KEY("gated_attn"), 0, &c->gated)))
        return st;
    r = cJSON_GetObjectItemCaseSensitive(cfg, KEY("connector_num_learnable_registers"));
#undef KEY
    if (r && cJSON_IsNull(r)) R = 0;
    else if ((st = dl_cfg_int(cfg, file, k, 128, &R))) return st;
    c->R = R;
    c->D = c->H * c->Dh;
    if (c->H < 1 || c->Dh < 2 || c->Dh % 2 || c->L < 0 || c->L > 256 || R < 0)
        return dl_fail(DL_ERR_FORMAT, "`%s`: inconsistent %s connector sizes", file, s);
    return DL_OK;
}

static dl_status conn_load(conn *c, dl_wsrc *ck, const char *s, int64_t T, dl_dtype dt) {
    char p[128], n[256];
    const int64_t D = c->D;
    dl_status st;
    if (c->R && T % c->R)
        return dl_fail(DL_ERR_INVALID, "LTX-2 connectors: %lld text rows are not a multiple of the %s connector's %lld registers",
                       (long long)T, s, (long long)c->R);
    if (c->R) {
        int64_t shape[2] = {c->R, D};
        snprintf(n, sizeof n, "%s_connector.learnable_registers", s);
        if ((st = dl_param_f32(ck, n, 2, shape, &c->reg))) return st;
    }
    if (!(c->b = calloc((size_t)(c->L ? c->L : 1), sizeof *c->b))) return dl_fail(DL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < c->L; i++) {
        cblock *b = &c->b[i];
        snprintf(p, sizeof p, "%s_connector.transformer_blocks.%d.", s, i);
#define NM(x) (snprintf(n, sizeof n, "%s%s", p, x), n)
        if ((st = dl_lin_qkv(&b->qkv, ck, p, "attn1.to_q", "attn1.to_k", "attn1.to_v", T, D, dt, NULL)) ||
            (st = dl_lin_named(&b->o, ck, NM("attn1.to_out.0"), T, D, D, dt, DL_F32, DL_ACT_NONE, 0, NULL)) ||
            (st = dl_param_vec(ck, NM("attn1.norm_q.weight"), D, &b->nq)) ||
            (st = dl_param_vec(ck, NM("attn1.norm_k.weight"), D, &b->nk)) ||
            (c->gated && (st = dl_lin_named(&b->gate, ck, NM("attn1.to_gate_logits"), T, D, c->H, dt, DL_F32, DL_ACT_NONE, 0, NULL))) ||
            (st = dl_lin_named(&b->ff1, ck, NM("ff.net.0.proj"), T, D, 4 * D, dt, dt, DL_ACT_GELU_TANH, 0, NULL)) ||
            (st = dl_lin_named(&b->ff2, ck, NM("ff.net.2"), T, 4 * D, D, dt, DL_F32, DL_ACT_NONE, 0, NULL)))
            return st;
#undef NM
        if (!c->gated && dl_ws_find(ck, (snprintf(n, sizeof n, "%sattn1.to_gate_logits.weight", p), n)))
            return dl_fail(DL_ERR_FORMAT, "LTX-2 connectors: `%s` is in the checkpoint but %s_gated_attn is false", n, s);
    }
    return DL_OK;
}

/* the 1-D RoPE tables for T rows (see the top) */
static dl_status conn_rope(conn *c, int64_t T, int64_t base, double theta, int f64) {
    const int64_t half = c->D / 2;
    c->cos = malloc((size_t)(T * half) * sizeof(float));
    c->sin = malloc((size_t)(T * half) * sizeof(float));
    float *fr = malloc((size_t)half * sizeof(float));
    if (!c->cos || !c->sin || !fr) {
        free(fr);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    for (int64_t i = 0; i < half; i++) { /* torch.linspace(0, 1, half): the second half counted from the end */
        double step = half > 1 ? 1.0 / (double)(half - 1) : 0.0;
        double ls = i < half / 2 ? (double)i * step : 1.0 - (double)(half - 1 - i) * step;
        fr[i] = f64 ? (float)(pow(theta, ls) * M_PI / 2.0) : (float)((float)powf((float)theta, (float)ls) * (float)M_PI / 2.0f);
    }
    for (int64_t r = 0; r < T; r++) {
        const float g = (float)r / (float)base, a = g * 2.f - 1.f;
        for (int64_t i = 0; i < half; i++) {
            float ang = a * fr[i];
            /* split: head h's table [h][r][0, Dh/2) is frequencies [h Dh/2, (h+1) Dh/2) */
            int64_t at = c->split ? ((i / (c->Dh / 2)) * T + r) * (c->Dh / 2) + i % (c->Dh / 2) : r * half + i;
            c->cos[at] = cosf(ang);
            c->sin[at] = sinf(ang);
        }
    }
    free(fr);
    return DL_OK;
}

/* a projection whose bias the config may leave out (proj_bias) */
static dl_status proj_load(lin *l, dl_wsrc *ck, const char *name, int64_t m, int64_t k, int64_t n, dl_dtype dt) {
    char b[160];
    snprintf(b, sizeof b, "%s.bias", name);
    if (dl_ws_find(ck, b)) return dl_lin_named(l, ck, name, m, k, n, dt, DL_F32, DL_ACT_NONE, 0, NULL);
    char w[160];
    snprintf(w, sizeof w, "%s.weight", name);
    const char *names[1] = {w};
    return dl_lin_load(l, ck, names, NULL, 1, &n, m, k, dt, DL_F32, DL_ACT_NONE);
}

dl_status dl_ltx2_connectors_load(dl_ltx2_connectors **out, dl_model_dir *dir, const char *component, int64_t T,
                                  dl_dtype dt, dl_wsrc *src) {
    *out = NULL;
    char file[512];
    snprintf(file, sizeof file, "%s/config.json", component);
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    if (T < 1 || T > 65536) return dl_fail(DL_ERR_INVALID, "LTX-2 connectors: %lld text rows (1..65536)", (long long)T);
    dl_ltx2_connectors *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_wsrc *ck = NULL;
    int64_t base, vh, ah;
    double theta;
    int f64, bias;
    const cJSON *rt = cJSON_GetObjectItemCaseSensitive(cfg, "rope_type");
    m->T = T, m->dt = dt;
    if ((s = dl_cfg_int(cfg, file, "caption_channels", 3840, &m->C)) ||
        (s = dl_cfg_int(cfg, file, "text_proj_in_factor", 49, &m->L1)) ||
        (s = dl_cfg_int(cfg, file, "connector_rope_base_seq_len", 4096, &base)) ||
        (s = dl_cfg_float(cfg, file, "rope_theta", 10000.0, &theta)) ||
        (s = dl_cfg_bool(cfg, file, "rope_double_precision", 1, &f64)) ||
        (s = dl_cfg_bool(cfg, file, "per_modality_projections", 0, &m->modal)) ||
        (s = dl_cfg_int(cfg, file, "video_hidden_dim", 4096, &vh)) || (s = dl_cfg_int(cfg, file, "audio_hidden_dim", 2048, &ah)) ||
        (s = dl_cfg_bool(cfg, file, "proj_bias", 0, &bias)) || (s = conn_config(&m->cv, cfg, file, "video")) ||
        (s = conn_config(&m->ca, cfg, file, "audio")))
        goto fail;
    (void)bias; /* proj_bias: the projections' biases are read when the checkpoint has them */
    if (rt && !cJSON_IsNull(rt) && (!cJSON_IsString(rt) || (strcmp(rt->valuestring, "interleaved") && strcmp(rt->valuestring, "split")))) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: rope_type must be \"interleaved\" or \"split\"", file);
        goto fail;
    }
    m->cv.split = m->ca.split = rt && cJSON_IsString(rt) && !strcmp(rt->valuestring, "split");
    m->Dv = m->cv.D, m->Da = m->ca.D;
    const int64_t K = m->C * m->L1;
    if (m->C < 1 || m->L1 < 1 || base < 1 || !(theta > 0)) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: inconsistent sizes", file);
        goto fail;
    }
    if (m->modal ? (vh != m->Dv || ah != m->Da) : (m->C != m->Dv || m->C != m->Da)) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: the connectors' widths (video %lld, audio %lld) are not their inputs' (%lld, %lld)", file,
                    (long long)m->Dv, (long long)m->Da, (long long)(m->modal ? vh : m->C), (long long)(m->modal ? ah : m->C));
        goto fail;
    }
    if ((s = dl_ws_open(&ck, src, dir, component)) != DL_OK) goto fail;
    if (m->modal) {
        if ((s = proj_load(&m->proj_v, ck, "video_text_proj_in", T, K, m->Dv, dt)) ||
            (s = proj_load(&m->proj_a, ck, "audio_text_proj_in", T, K, m->Da, dt)))
            goto fail;
    } else if ((s = proj_load(&m->proj, ck, "text_proj_in", T, K, m->C, dt))) {
        goto fail;
    }
    if ((s = conn_load(&m->cv, ck, "video", T, dt)) || (s = conn_load(&m->ca, ck, "audio", T, dt)) ||
        (s = conn_rope(&m->cv, T, base, theta, f64)) || (s = conn_rope(&m->ca, T, base, theta, f64)))
        goto fail;
    const int64_t Dm = m->Dv > m->Da ? m->Dv : m->Da, Hm = m->cv.H > m->ca.H ? m->cv.H : m->ca.H;
    const size_t es = dl_dtype_size(dt);
    act_plan pl = {0};
    dl_plan_add(&pl, &m->n, (size_t)(T * K) * 4, 0, 1); /* both streams project from it */
    dl_plan_add(&pl, &m->nin, (size_t)(T * K) * es, 0, 1);
    dl_plan_add(&pl, &m->e, (size_t)(T * Dm) * 4, 0, 1);
    dl_plan_add(&pl, &m->x, (size_t)(T * Dm) * 4, 1, 1);
    dl_plan_add(&pl, &m->o, (size_t)(T * Dm) * 4, 1, 1);
    dl_plan_add(&pl, &m->gl, (size_t)(T * Hm) * 4, 1, 1);
    dl_plan_add(&pl, &m->h, (size_t)(T * Dm) * es, 1, 1);
    dl_plan_add(&pl, &m->qkv, (size_t)(T * 3 * Dm) * es, 1, 1);
    dl_plan_add(&pl, &m->att, (size_t)(T * Dm) * es, 1, 1);
    dl_plan_add(&pl, &m->f, (size_t)(T * 4 * Dm) * es, 1, 1);
    /* the attention scratch of whichever connector needs more (the kernel path, and so
     * the scratch, depends on the head size) */
    size_t sb = 0;
    for (int i = 0; i < 2; i++) {
        const conn *c = i ? &m->ca : &m->cv;
        dl_attn_args a = {.dt = dt, .sq = T, .sk = T, .heads = c->H, .head_dim = c->Dh, .q_stride = 3 * c->D,
                          .k_stride = 3 * c->D, .v_stride = 3 * c->D, .kv_end = T};
        size_t b = dl_attn_scratch_bytes(&a, omp_get_max_threads()) + 64;
        sb = b > sb ? b : sb;
    }
    dl_plan_add(&pl, &m->scratch, sb, 1, 1);
    if ((s = dl_plan_commit(&pl, ck, &m->arena)) != DL_OK) goto fail;
    dl_ws_close(ck);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_ltx2_connectors_free(m);
    return s;
}

#define RUN(l, x, y)                                         \
    do {                                                     \
        if ((s = lin_run((l), (x), (y))) != DL_OK) return s; \
    } while (0)

/* one connector over its projected input e [T, D] (real rows last `valid`) into out */
static dl_status conn_run(dl_ltx2_connectors *m, conn *c, const float *e, int64_t valid, float *out) {
    const int64_t T = m->T, D = c->D, H = c->H, Dh = c->Dh, p0 = T - valid;
    const size_t es = dl_dtype_size(m->dt);
    dl_status s;
    int64_t kb = p0; /* the keys attended: the real rows, or every row once registers fill the rest */
    if (c->R) {
        memcpy(m->x, e + p0 * D, (size_t)(valid * D) * 4); /* real rows to the front, in order */
        for (int64_t r = valid; r < T; r++) memcpy(m->x + r * D, c->reg + (r % c->R) * D, (size_t)D * 4);
        kb = 0;
    } else {
        memcpy(m->x, e, (size_t)(T * D) * 4);
    }
    char *q = m->qkv, *k = q + (size_t)D * es;
    for (int i = 0; i < c->L; i++) {
        cblock *b = &c->b[i];
        DL_PAR(dl_rmsnorm_x_t(m->dt, m->h, DL_F32, m->x, T, D, NULL, 1e-6f, ith, nth));
        RUN(&b->qkv, m->h, m->qkv);
        if (c->gated) RUN(&b->gate, m->h, m->gl);
        DL_PAR({
            dl_rmsnorm_heads_t(m->dt, q, T, 3 * D, 1, D, b->nq, 1e-6f, ith, nth);
            dl_rmsnorm_heads_t(m->dt, k, T, 3 * D, 1, D, b->nk, 1e-6f, ith, nth);
        });
        if (!c->split) {
            DL_PAR({
                dl_rope_t(DL_ROPE_PAIRS, m->dt, q, T, 1, D, 3 * D, c->cos, c->sin, ith, nth);
                dl_rope_t(DL_ROPE_PAIRS, m->dt, k, T, 1, D, 3 * D, c->cos, c->sin, ith, nth);
            });
        } else {
            for (int64_t h = 0; h < H; h++) {
                const float *ct = c->cos + h * T * (Dh / 2), *st = c->sin + h * T * (Dh / 2);
                char *qh = q + (size_t)(h * Dh) * es, *kh = k + (size_t)(h * Dh) * es;
                DL_PAR({
                    dl_rope_t(DL_ROPE_HALVES, m->dt, qh, T, 1, Dh, 3 * D, ct, st, ith, nth);
                    dl_rope_t(DL_ROPE_HALVES, m->dt, kh, T, 1, Dh, 3 * D, ct, st, ith, nth);
                });
            }
        }
        dl_attn_args a = {.dt = m->dt, .sq = T, .sk = T, .heads = H, .head_dim = Dh, .q = q, .q_stride = 3 * D, .k = k,
                          .v = q + (size_t)(2 * D) * es, .k_stride = 3 * D, .v_stride = 3 * D, .out = m->att,
                          .out_stride = D, .kv_begin = kb, .kv_end = T, .scale = 1.f / sqrtf((float)Dh)};
        DL_PAR(dl_attn_t(&a, m->scratch, ith, nth));
        if (c->gated) { /* out *= 2 sigmoid(gate logit) per head, rounded as the stream's dtype */
            for (int64_t r = 0; r < T; r++)
                for (int64_t h = 0; h < H; h++) {
                    float g = 2.f / (1.f + expf(-m->gl[r * H + h]));
                    char *row = (char *)m->att + (size_t)(r * D + h * Dh) * es;
                    for (int64_t j = 0; j < Dh; j++) {
                        if (m->dt == DL_F32) ((float *)row)[j] *= g;
                        else ((uint16_t *)row)[j] = dl_f32_to_bf16(dl_bf16_to_f32(((uint16_t *)row)[j]) * g);
                    }
                }
        }
        RUN(&b->o, m->att, m->o);
        for (int64_t j = 0; j < T * D; j++) m->x[j] += m->o[j];
        DL_PAR(dl_rmsnorm_x_t(m->dt, m->h, DL_F32, m->x, T, D, NULL, 1e-6f, ith, nth));
        RUN(&b->ff1, m->h, m->f);
        RUN(&b->ff2, m->f, m->o);
        for (int64_t j = 0; j < T * D; j++) m->x[j] += m->o[j];
    }
    DL_PAR(dl_rmsnorm_x_t(DL_F32, out, DL_F32, m->x, T, D, NULL, 1e-6f, ith, nth));
    return DL_OK;
}

dl_status dl_ltx2_connectors_run(dl_ltx2_connectors *m, const float *hidden, int64_t valid, float *video, float *audio) {
    const int64_t T = m->T, C = m->C, L1 = m->L1, K = C * L1, p0 = T - valid;
    dl_status s;
    if (valid < 1 || valid > T)
        return dl_fail(DL_ERR_INVALID, "LTX-2 connectors: %lld real text rows of %lld", (long long)valid, (long long)T);
    for (int64_t j = 0; j < T * K; j++)
        if (!isfinite(hidden[j])) return dl_fail(DL_ERR_INVALID, "LTX-2 connectors: a text hidden state is not finite");
    memset(m->n, 0, (size_t)(p0 * K) * 4); /* padded rows: 0 */
    if (!m->modal) {
        /* per layer: mean and range over the real rows and every channel, in f32 */
        for (int64_t l = 0; l < L1; l++) {
            double sum = 0;
            float mn = INFINITY, mx = -INFINITY;
            for (int64_t r = p0; r < T; r++)
                for (int64_t c = 0; c < C; c++) {
                    float v = hidden[r * K + c * L1 + l];
                    sum += v, mn = fminf(mn, v), mx = fmaxf(mx, v);
                }
            const float mean = (float)(sum / ((double)(valid * C) + 1e-6)), range = (mx - mn) + 1e-6f;
            for (int64_t r = p0; r < T; r++)
                for (int64_t c = 0; c < C; c++) m->n[r * K + c * L1 + l] = (hidden[r * K + c * L1 + l] - mean) / range * 8.f;
        }
    } else {
        /* per row and layer: x / sqrt(mean_c(x^2) + 1e-6) */
        for (int64_t r = p0; r < T; r++)
            for (int64_t l = 0; l < L1; l++) {
                double ss = 0;
                for (int64_t c = 0; c < C; c++) {
                    float v = hidden[r * K + c * L1 + l];
                    ss += (double)v * v;
                }
                const float inv = 1.f / sqrtf((float)(ss / (double)C) + 1e-6f);
                for (int64_t c = 0; c < C; c++) m->n[r * K + c * L1 + l] = hidden[r * K + c * L1 + l] * inv;
            }
    }
    for (int st = 0; st < 2; st++) {
        conn *c = st ? &m->ca : &m->cv;
        lin *pj = m->modal ? (st ? &m->proj_a : &m->proj_v) : &m->proj;
        const float sc = m->modal ? (float)sqrt((double)c->D / (double)C) : 1.f;
        const float *src = m->n;
        if (sc != 1.f) { /* (n x scale) in f32 before the projection, as the pipeline computes it */
            DL_PAR({
                int64_t a = T * K * ith / nth, b = T * K * (ith + 1) / nth;
                for (int64_t j = a; j < b; j++) {
                    float v = src[j] * sc;
                    if (m->dt == DL_F32) ((float *)m->nin)[j] = v;
                    else ((uint16_t *)m->nin)[j] = dl_f32_to_bf16(v);
                }
            });
        } else {
            to_dt(m->dt, m->nin, src, T * K);
        }
        RUN(pj, m->nin, m->e);
        if ((s = conn_run(m, c, m->e, valid, st ? audio : video))) return s;
    }
    return DL_OK;
}
