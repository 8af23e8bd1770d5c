/* Qwen2_5_VLForConditionalGeneration (transformers), its language model on text
 * alone: Qwen-Image's text encoder (diffusers' QwenImagePipeline takes
 * hidden_states[-1] of the template-wrapped prompt). The same decoder without the
 * q/k/v biases is transformers' LlamaModel (model_type "llama", attention_bias
 * false): HunyuanVideo's text encoder, read at a layer counted from the end
 * (dl_qwen2_text_run_hidden: hidden_states[k] is layer k's raw output for k < L, the
 * final norm's output for k = L).
 *   x = embed_tokens[ids]                                         // x: [n, D] f32
 *   per layer: h = rms(x) * input_layernorm                       // h: [n, D]
 *              q, k, v = h Wq^T + bq, h Wk^T + bk, h Wv^T + bv    // [n, H Dh], [n, KV Dh] x2
 *              q, k = rope(q), rope(k)                            // rotate_half, position t
 *              x += o_proj(attn_causal(q, k, v) with KV head h / (H / KV) for query head h)
 *              h = rms(x) * post_attention_layernorm
 *              x += down(silu(gate(h)) * up(h))                   // [n, F] inside
 *   hidden = rms(x) * norm                                        // hidden_states[-1]
 * RoPE: Qwen2.5-VL's multimodal RoPE gives each frequency band i (of Dh/2) the angle
 * pos[section(i)] * inv_freq[i], where mrope_section splits the bands over the
 * temporal, height and width position ids; text tokens have all three equal to the
 * 1-D position t, so every band gets t * inv_freq[i], concatenated twice, applied
 * with rotate_half: exactly standard NeoX RoPE over Dh. inv_freq[i] = 1 /
 * theta^(2i / Dh) and the angles are computed in f32 as transformers does.
 * GQA: K/V heads are copied out per query head (repeat_kv) into a buffer, so the
 * fused attention kernel runs unchanged; the encoder runs once per request.
 * Rows: causal attention and no padding, so rows < n depend only on ids < n. The
 * matmuls (oneDNN, fixed M) run on 128-row chunks, as many as cover n; rows past n
 * inside the last chunk are kept at exactly zero (zero embeddings, zero attention
 * output: RMSNorm of zero is zero, the MLP has no biases) and never returned. */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/qwen.h"
#include "models/models_impl.h"

enum { QWEN_CHUNK = 128 }; /* rows per matmul call */

typedef struct {
    float *ln_in, *ln_post; /* [D] */
    lin qkv;                /* [D] -> [(H + 2 KV) Dh], q | k | v with biases */
    lin o;                  /* [H Dh] -> [D] f32 */
    lin gate, up;           /* [D] -> [F] (gate with SiLU fused) */
    lin down;               /* [F] -> [D] f32 */
} qwen_layer;

struct dl_qwen2_text {
    int64_t S, C, Sp;           /* max tokens, rows per matmul chunk, S rounded up to chunks */
    int64_t D, H, KV, Dh, F, V; /* width, heads, KV heads, head dim, MLP width, vocab */
    int L;
    int bias;                   /* q/k/v biases (Qwen2; a Llama with attention_bias) */
    const char *name;           /* "Qwen2.5-VL" or "Llama": for messages */
    dl_dtype dt;
    float eps;
    const float *emb;           /* [V, D]: the artifact's mapping, or emb_own */
    float *emb_own;
    float *ln_final;            /* [D] */
    float *rope_cos, *rope_sin; /* [S, Dh/2] */
    qwen_layer *layers;
    /* activations, planned at load */
    float *x, *o;               /* [Sp, D] f32: residual stream, projection outputs */
    void *h;                    /* [Sp, D] dt: normalised rows */
    void *qkv;                  /* [Sp, (H + 2 KV) Dh] dt */
    void *kv;                   /* [S, 2 H Dh] dt: k | v per query head (only when KV < H) */
    void *att;                  /* [Sp, H Dh] dt */
    void *g, *u;                /* [Sp, F] dt */
    void *scratch;              /* attention */
    void *arena;                /* one block holding every buffer above */
};

void dl_qwen2_text_free(dl_qwen2_text *m) {
    if (!m) return;
    for (int i = 0; m->layers && i < m->L; i++) {
        qwen_layer *l = &m->layers[i];
        free(l->ln_in), free(l->ln_post);
        dl_lin_free(&l->qkv), dl_lin_free(&l->o), dl_lin_free(&l->gate), dl_lin_free(&l->up), dl_lin_free(&l->down);
    }
    free(m->layers);
    free(m->emb_own), free(m->ln_final), free(m->rope_cos), free(m->rope_sin);
    dl_aligned_free(m->arena);
    free(m);
}

int64_t dl_qwen2_text_width(const dl_qwen2_text *m) { return m->D; }
int64_t dl_qwen2_text_vocab(const dl_qwen2_text *m) { return m->V; }
int64_t dl_qwen2_text_max_len(const dl_qwen2_text *m) { return m->S; }
int dl_qwen2_text_layers(const dl_qwen2_text *m) { return m->L; }

static const cJSON *obj(const cJSON *o, const char *key) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return cJSON_IsObject(v) ? v : NULL;
}

/* The RoPE settings, wherever this transformers version put them: rope_parameters
 * {rope_type, rope_theta, mrope_section} in the text config (5.x), or rope_theta and
 * rope_scaling {type | rope_type, mrope_section} in the text config or at the top
 * level (4.x). Only the unscaled kinds ("default", "mrope") are served; a given
 * mrope_section must cover the Dh/2 frequency bands (transformers splits them by it). */
static dl_status cfg_rope(const cJSON *cfg, const cJSON *txt, const char *file, int64_t Dh, double *theta) {
    const cJSON *rp = obj(txt, "rope_parameters");
    if (!rp) rp = obj(txt, "rope_scaling");
    if (!rp) rp = obj(cfg, "rope_scaling");
    dl_status s;
    *theta = 1e6; /* Qwen2_5_VLTextConfig's default */
    const cJSON *where = rp && cJSON_GetObjectItemCaseSensitive(rp, "rope_theta") ? rp
                         : cJSON_GetObjectItemCaseSensitive(txt, "rope_theta")   ? txt
                                                                                 : cfg;
    if ((s = dl_cfg_float(where, file, "rope_theta", 1e6, theta)) != DL_OK) return s;
    if (!(*theta > 1.0))
        return dl_fail(DL_ERR_FORMAT, "`%s`: rope_theta %g must be above 1", file, *theta);
    if (!rp) return DL_OK;
    const char *type;
    if ((s = dl_cfg_str(rp, file, "rope_type", "", &type)) != DL_OK) return s;
    if (!type[0] && (s = dl_cfg_str(rp, file, "type", "default", &type)) != DL_OK) return s;
    if (strcmp(type, "default") && strcmp(type, "mrope"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: rope type \"%s\" is not supported (default / mrope only)", file, type);
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(rp, "mrope_section"), *e;
    if (!sec) return DL_OK;
    if (!cJSON_IsArray(sec)) return dl_fail(DL_ERR_FORMAT, "`%s`: mrope_section is not a list", file);
    int64_t sum = 0;
    cJSON_ArrayForEach(e, sec) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble != (double)(int64_t)e->valuedouble)
            return dl_fail(DL_ERR_FORMAT, "`%s`: mrope_section holds something other than counts", file);
        sum += (int64_t)e->valuedouble;
    }
    if (sum != Dh / 2)
        return dl_fail(DL_ERR_FORMAT, "`%s`: mrope_section sums to %lld bands, the head dim %lld has %lld", file,
                       (long long)sum, (long long)Dh, (long long)(Dh / 2));
    return DL_OK;
}

/* The text model's fields: `text_config` when present (transformers 5 writes it;
 * some 4.x configs have both, the same), else the top level. */
static dl_status cfg_read(dl_qwen2_text *m, const cJSON *cfg, const char *file, double *theta) {
    const cJSON *txt = obj(cfg, "text_config");
    if (!txt) txt = cfg;
    char tf[600];
    snprintf(tf, sizeof tf, "%s%s", file, txt != cfg ? " (text_config)" : "");
    const char *mt, *act;
    int64_t L, hd, swin;
    double eps;
    int sliding;
    dl_status s;
    if ((s = dl_cfg_str(cfg, file, "model_type", "", &mt)) != DL_OK) return s;
    const int llama = !strcmp(mt, "llama");
    if (mt[0] && !llama && strcmp(mt, "qwen2_5_vl") && strcmp(mt, "qwen2_5_vl_text"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: model_type \"%s\" is not Qwen2.5-VL (qwen2_5_vl) or Llama (llama)", file, mt);
    m->name = llama ? "Llama" : "Qwen2.5-VL";
    m->bias = 1;
    if (llama) {
        int mlp_bias;
        if ((s = dl_cfg_bool(txt, tf, "attention_bias", 0, &m->bias)) || (s = dl_cfg_bool(txt, tf, "mlp_bias", 0, &mlp_bias)))
            return s;
        if (mlp_bias) return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: mlp_bias true is not supported", tf);
    }
    if ((s = dl_cfg_int(txt, tf, "hidden_size", 3584, &m->D)) || (s = dl_cfg_int(txt, tf, "intermediate_size", 18944, &m->F)) ||
        (s = dl_cfg_int(txt, tf, "num_attention_heads", 28, &m->H)) ||
        (s = dl_cfg_int(txt, tf, "num_key_value_heads", 4, &m->KV)) ||
        (s = dl_cfg_int(txt, tf, "num_hidden_layers", 28, &L)) || (s = dl_cfg_int(txt, tf, "vocab_size", 152064, &m->V)) ||
        (s = dl_cfg_float(txt, tf, "rms_norm_eps", 1e-6, &eps)) || (s = dl_cfg_str(txt, tf, "hidden_act", "silu", &act)) ||
        (s = dl_cfg_bool(txt, tf, "use_sliding_window", 0, &sliding)) ||
        (s = dl_cfg_int(txt, tf, "sliding_window", 0, &swin)))
        return s;
    if (m->D <= 0 || m->H <= 0 || m->KV <= 0 || m->H % m->KV || m->D % m->H || L <= 0 || L > 1000 || m->F <= 0 ||
        m->V <= 0)
        return dl_fail(DL_ERR_FORMAT,
                       "`%s`: inconsistent sizes (hidden_size %lld, heads %lld, key/value heads %lld, layers %lld)", tf,
                       (long long)m->D, (long long)m->H, (long long)m->KV, (long long)L);
    m->L = (int)L;
    m->eps = (float)eps;
    m->Dh = m->D / m->H;
    /* transformers' Qwen2.5-VL attention takes hidden_size / heads whatever head_dim says */
    if ((s = dl_cfg_int(txt, tf, "head_dim", m->Dh, &hd)) != DL_OK) return s;
    if (hd != m->Dh)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: head_dim %lld differs from hidden_size / num_attention_heads = %lld", tf,
                       (long long)hd, (long long)m->Dh);
    if (m->Dh % 2 || m->Dh > 1024)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: head dim %lld (must be even, at most 1024)", tf, (long long)m->Dh);
    if (strcmp(act, "silu"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: hidden_act \"%s\" is not supported (silu)", tf, act);
    /* a sliding window shorter than the sequence would hide keys: not implemented */
    if (sliding && swin < m->S)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: sliding-window attention (window %lld) over %lld tokens is not supported",
                       tf, (long long)swin, (long long)m->S);
    return cfg_rope(cfg, txt, tf, m->Dh, theta);
}

/* cos/sin [S, Dh/2] of angle t * inv_freq[i], in f32 as transformers computes them:
 * inv_freq = 1 / theta ** (arange(0, Dh, 2) / Dh), freqs = float(t) * inv_freq. */
static void rope_table(dl_qwen2_text *m, double theta) {
    const int64_t half = m->Dh / 2;
    for (int64_t i = 0; i < half; i++) {
        float inv = 1.0f / powf((float)theta, (float)(2 * i) / (float)m->Dh);
        for (int64_t t = 0; t < m->S; t++) {
            float a = (float)t * inv;
            m->rope_cos[t * half + i] = (float)cos((double)a);
            m->rope_sin[t * half + i] = (float)sin((double)a);
        }
    }
}

dl_status dl_qwen2_text_load(dl_qwen2_text **out, dl_model_dir *dir, const char *component, int64_t max_len,
                             dl_dtype dt, dl_wsrc *src) {
    *out = NULL;
    char file[512], nb[4][256], bb[3][256];
    snprintf(file, sizeof file, "%s/config.json", component);
    if (max_len <= 0 || max_len > 65536)
        return dl_fail(DL_ERR_INVALID, "text encoder: max length %lld is outside 1..65536", (long long)max_len);
    if (dt != DL_F32 && dt != DL_BF16)
        return dl_fail(DL_ERR_UNSUPPORTED, "text encoder: dtype %s (f32 or bf16)", dl_dtype_name(dt));
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    dl_qwen2_text *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    m->dt = dt;
    m->S = max_len;
    m->C = max_len < QWEN_CHUNK ? max_len : QWEN_CHUNK;
    m->Sp = (max_len + m->C - 1) / m->C * m->C;
    double theta;
    dl_wsrc *ck = NULL;
    if ((s = cfg_read(m, cfg, file, &theta)) != DL_OK) goto fail;
    if ((s = dl_ws_open(&ck, src, dir, component)) != DL_OK) goto fail;
    const int64_t D = m->D, S = m->S, Sp = m->Sp, C = m->C, Dh = m->Dh, F = m->F;
    const int64_t QD = m->H * Dh, KD = m->KV * Dh;
    /* transformers 5 names Qwen2.5-VL's language model model.language_model.*, 4.x
       model.*; a bare LlamaModel has no prefix */
    const char *pre = dl_ws_find(ck, "model.language_model.embed_tokens.weight") ? "model.language_model."
                      : dl_ws_find(ck, "model.embed_tokens.weight")             ? "model."
                      : dl_ws_find(ck, "embed_tokens.weight")                   ? ""
                                                                                : NULL;
    if (!pre) {
        s = dl_fail(DL_ERR_FORMAT,
                    "%s has none of `model.language_model.embed_tokens.weight` (transformers 5), "
                    "`model.embed_tokens.weight` (transformers 4) or `embed_tokens.weight` (a bare model): not a %s checkpoint",
                    dl_ws_label(ck), m->name);
        goto fail;
    }
    int64_t sh_emb[2] = {m->V, D}, sh_d[1] = {D};
    if ((s = dl_param_f32_map(ck, dl_pname(nb[0], 256, pre, "embed_tokens.weight"), 2, sh_emb, &m->emb, &m->emb_own)) ||
        (s = dl_param_f32(ck, dl_pname(nb[0], 256, pre, "norm.weight"), 1, sh_d, &m->ln_final)))
        goto fail;
    m->layers = calloc((size_t)m->L, sizeof *m->layers);
    m->rope_cos = malloc((size_t)(S * (Dh / 2)) * sizeof *m->rope_cos);
    m->rope_sin = malloc((size_t)(S * (Dh / 2)) * sizeof *m->rope_sin);
    if (!m->layers || !m->rope_cos || !m->rope_sin) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    rope_table(m, theta);
    for (int i = 0; i < m->L; i++) {
        qwen_layer *l = &m->layers[i];
        char p[96];
        snprintf(p, sizeof p, "%slayers.%d.", pre, i);
        const char *qkv_w[3] = {dl_pname(nb[0], 256, p, "self_attn.q_proj.weight"), dl_pname(nb[1], 256, p, "self_attn.k_proj.weight"),
                                dl_pname(nb[2], 256, p, "self_attn.v_proj.weight")};
        const char *qkv_b[3] = {dl_pname(bb[0], 256, p, "self_attn.q_proj.bias"), dl_pname(bb[1], 256, p, "self_attn.k_proj.bias"),
                                dl_pname(bb[2], 256, p, "self_attn.v_proj.bias")};
        int64_t parts[3] = {QD, KD, KD}, pd[1] = {D}, pf[1] = {F};
        if ((s = dl_param_f32(ck, dl_pname(nb[3], 256, p, "input_layernorm.weight"), 1, sh_d, &l->ln_in)) ||
            (s = dl_param_f32(ck, dl_pname(nb[3], 256, p, "post_attention_layernorm.weight"), 1, sh_d, &l->ln_post)) ||
            (s = dl_lin_load(&l->qkv, ck, qkv_w, m->bias ? qkv_b : NULL, 3, parts, C, D, dt, dt, DL_ACT_NONE)))
            goto fail;
        const char *ow[1] = {dl_pname(nb[0], 256, p, "self_attn.o_proj.weight")};
        const char *gw[1] = {dl_pname(nb[1], 256, p, "mlp.gate_proj.weight")};
        const char *uw[1] = {dl_pname(nb[2], 256, p, "mlp.up_proj.weight")};
        const char *dw[1] = {dl_pname(nb[3], 256, p, "mlp.down_proj.weight")};
        if ((s = dl_lin_load(&l->o, ck, ow, NULL, 1, pd, C, QD, dt, DL_F32, DL_ACT_NONE)) ||
            (s = dl_lin_load(&l->gate, ck, gw, NULL, 1, pf, C, D, dt, dt, DL_ACT_SILU)) ||
            (s = dl_lin_load(&l->up, ck, uw, NULL, 1, pf, C, D, dt, dt, DL_ACT_NONE)) ||
            (s = dl_lin_load(&l->down, ck, dw, NULL, 1, pd, C, F, dt, DL_F32, DL_ACT_NONE)))
            goto fail;
    }
    size_t es = dl_dtype_size(dt);
    act_plan pl = {0};
    dl_plan_add(&pl, &m->x, (size_t)(Sp * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->o, (size_t)(Sp * D) * 4, 1, 1);
    dl_plan_add(&pl, &m->h, (size_t)(Sp * D) * es, 1, 1);
    dl_plan_add(&pl, &m->qkv, (size_t)(Sp * (QD + 2 * KD)) * es, 1, 1);
    if (m->KV < m->H) dl_plan_add(&pl, &m->kv, (size_t)(S * 2 * QD) * es, 1, 1);
    dl_plan_add(&pl, &m->att, (size_t)(Sp * QD) * es, 1, 1);
    dl_plan_add(&pl, &m->g, (size_t)(Sp * F) * es, 1, 1);
    dl_plan_add(&pl, &m->u, (size_t)(Sp * F) * es, 1, 1);
    dl_plan_attn_scratch(&pl, &m->scratch, dt, S, m->H, Dh, 1, 1, 1);
    if ((s = dl_plan_commit(&pl, ck, &m->arena)) != DL_OK) goto fail;
    dl_ws_close(ck);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_qwen2_text_free(m);
    return s;
}



dl_status dl_qwen2_text_run(dl_qwen2_text *m, const int32_t *ids, int64_t n, float *hidden) {
    return dl_qwen2_text_run_hidden(m, ids, n, n, m->L, hidden);
}

dl_status dl_qwen2_text_run_hidden(dl_qwen2_text *m, const int32_t *ids, int64_t n, int64_t valid, int upto, float *hidden) {
    const int64_t S = m->S, D = m->D, Dh = m->Dh, F = m->F, C = m->C;
    const int64_t QD = m->H * Dh, KD = m->KV * Dh, W = QD + 2 * KD;
    if (n < 1 || n > S)
        return dl_fail(DL_ERR_INVALID, "%s text encoder: %lld tokens is outside 1..%lld (the length it was built for)",
                       m->name, (long long)n, (long long)S);
    if (valid < 1 || valid > n)
        return dl_fail(DL_ERR_INVALID, "%s text encoder: %lld valid tokens of %lld", m->name, (long long)valid, (long long)n);
    if (upto < 0 || upto > m->L)
        return dl_fail(DL_ERR_INVALID, "%s text encoder: hidden state %d of %d layers (0..%d)", m->name, upto, m->L, m->L);
    for (int64_t t = 0; t < n; t++)
        if (ids[t] < 0 || ids[t] >= m->V)
            return dl_fail(DL_ERR_INVALID,
                           "%s text encoder: token id %d at position %lld is outside the vocabulary (%lld)", m->name, ids[t],
                           (long long)t, (long long)m->V);
    const int64_t nch = (n + C - 1) / C, R = nch * C; /* rows the matmuls cover */
    const size_t es = dl_dtype_size(m->dt);
    for (int64_t t = 0; t < n; t++) memcpy(m->x + t * D, m->emb + (int64_t)ids[t] * D, (size_t)D * 4);
    memset(m->x + n * D, 0, (size_t)((R - n) * D) * 4);
    const int gqa = m->KV < m->H;
    char *q = m->qkv, *k = q + (size_t)QD * es;
    dl_attn_args a = {.dt = m->dt, .sq = n, .sk = n, .heads = m->H, .head_dim = Dh, .q = q, .q_stride = W,
                      .k = gqa ? m->kv : k, .v = gqa ? (char *)m->kv + (size_t)QD * es : k + (size_t)KD * es,
                      .k_stride = gqa ? 2 * QD : W, .v_stride = gqa ? 2 * QD : W, .out = m->att, .out_stride = QD,
                      .kv_begin = 0, .kv_end = valid, .scale = 1.f / sqrtf((float)Dh), .causal = 1};
    dl_status s = DL_OK;
    for (int i = 0; i < upto && s == DL_OK; i++) {
        qwen_layer *l = &m->layers[i];
        DL_PAR(dl_rmsnorm_x_t(m->dt, m->h, DL_F32, m->x, R, D, l->ln_in, m->eps, ith, nth));
        if ((s = dl_lin_chunks(&l->qkv, m->h, es, m->qkv, es, C, nch))) break;
        DL_PAR(dl_rope_t(DL_ROPE_HALVES, m->dt, q, n, m->H, Dh, W, m->rope_cos, m->rope_sin, ith, nth);
               dl_rope_t(DL_ROPE_HALVES, m->dt, k, n, m->KV, Dh, W, m->rope_cos, m->rope_sin, ith, nth));
        if (gqa) DL_PAR(dl_expand_kv(m->dt, m->qkv, m->kv, m->H, m->KV, m->Dh, n, ith, nth));
        DL_PAR(dl_attn_t(&a, m->scratch, ith, nth));
        memset((char *)m->att + (size_t)(n * QD) * es, 0, (size_t)((R - n) * QD) * es);
        if ((s = dl_lin_chunks(&l->o, m->att, es, m->o, 4, C, nch))) break;
        DL_PAR(dl_gated_residual_t(DL_F32, m->x, m->o, R, D, NULL, ith, nth));
        DL_PAR(dl_rmsnorm_x_t(m->dt, m->h, DL_F32, m->x, R, D, l->ln_post, m->eps, ith, nth));
        if ((s = dl_lin_chunks(&l->gate, m->h, es, m->g, es, C, nch)) || (s = dl_lin_chunks(&l->up, m->h, es, m->u, es, C, nch)))
            break;
        DL_PAR(dl_mul_t(m->dt, m->g, m->g, m->u, R * F, ith, nth));
        if ((s = dl_lin_chunks(&l->down, m->g, es, m->o, 4, C, nch))) break;
        DL_PAR(dl_gated_residual_t(DL_F32, m->x, m->o, R, D, NULL, ith, nth));
    }
    if (s != DL_OK) return s;
    if (upto == m->L) DL_PAR(dl_rmsnorm_t(DL_F32, hidden, m->x, n, D, m->ln_final, m->eps, ith, nth));
    else memcpy(hidden, m->x, (size_t)(n * D) * 4); /* a layer's raw output (or the embeddings) */
    return DL_OK;
}
