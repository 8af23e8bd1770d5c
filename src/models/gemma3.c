/* Gemma3ForConditionalGeneration (transformers 5), its language model on text alone:
 * LTX-2's text encoder. LTX2Pipeline._get_gemma_prompt_embeds tokenizes the prompt
 * LEFT-padded to max_sequence_length and keeps every hidden state, so this file
 * returns all L + 1 of them, padded rows included.
 *   x = embed_tokens[ids] * sqrt(D)                               // x: [n, D] f32 (hidden_states[0])
 *   per layer: h = rms(x) * (1 + input_layernorm)                 // h: [n, D]
 *              q, k, v = h Wq^T, h Wk^T, h Wv^T                   // [n, H Dh], [n, KV Dh] x2
 *              q, k = rms(q) * (1 + q_norm), rms(k) * (1 + k_norm) // per head, over Dh
 *              q, k = rope(q), rope(k)                            // rotate_half, position t; the
 *                                                                 // layer type's own table
 *              a = attn(q, k, v) * (query_pre_attn_scalar^-1/2 scale) // KV head h / (H / KV)
 *              x += rms(a Wo^T) * (1 + post_attention_layernorm)
 *              h = rms(x) * (1 + pre_feedforward_layernorm)
 *              x += rms(down(gelu_tanh(gate(h)) * up(h))) * (1 + post_feedforward_layernorm)
 *                                                                 // hidden_states[i + 1] = x
 *   hidden_states[L] = rms(x) * (1 + norm)                        // replaces the last layer's
 * Norms are Gemma3RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + w), in f32; the 1 + w
 * is formed once at load, in f32 as transformers forms it.
 * Embedding scale: Gemma3TextScaledWordEmbedding multiplies by sqrt(D) cast to the
 * weights' dtype: f32(sqrt(D)) for f32, bf16(sqrt(D)) for bf16 (62.0, not 61.97,
 * for Gemma 3 12B's D = 3840); the bf16 build uses the bf16 value.
 * Mask (transformers' create_causal_mask / create_sliding_window_causal_mask with a
 * 2-D attention_mask): query i sees key j iff j <= i, j is not padding (j >= p with
 * p = pad_left) and, on sliding layers, j > i - sliding_window. A padded query (i <
 * p) sees no key at all; torch's sdpa (the default implementation, what the
 * pipeline loads) returns zeros for such a row and so does the fused kernel (an
 * empty key interval), so the padded rows' attention output is zero and their
 * hidden states are their embeddings pushed through the MLPs alone. (The eager
 * implementation would instead average every key for them: other padded rows.)
 * Positions are 0..n-1 regardless of padding (position_ids default to arange).
 * Attention: one causal call over the key interval [p, n) on full layers, and on
 * sliding layers whenever the window cannot hide a key (n - p <= window: always so
 * for Gemma 3's 512 / 1024 windows at LTX-2's 1024 tokens). Otherwise a sliding
 * layer runs the same kernel once per query row over its own interval
 * [max(p, i - window + 1), i + 1), each thread on its own rows and scratch slice:
 * exact, but each call fills a whole query tile for one row (dl_attn_args has no
 * per-row window).
 * attn_logit_softcapping is accepted and ignored: transformers' Gemma3Attention
 * never passes it to the attention (make_gemma3_vectors.py checks that a config
 * setting it gives the same numbers); final_logit_softcapping acts on logits only.
 * Rows: the matmuls (oneDNN, fixed M) run on chunks of C = min(max_len, 128) rows,
 * as many as cover n; rows past n inside the last chunk are kept at exactly zero
 * (zero embeddings and attention output; RMSNorm of zero is zero, no biases). */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/gemma3.h"
#include "models/models_impl.h"

enum { G3_CHUNK = 128 }; /* rows per matmul call */

typedef struct {
    float *ln_in, *ln_post_attn, *ln_pre_ff, *ln_post_ff; /* [D]: 1 + w */
    float *q_norm, *k_norm;                               /* [Dh]: 1 + w */
    lin qkv;                                              /* [D] -> [(H + 2 KV) Dh], q | k | v */
    lin o;                                                /* [H Dh] -> [D] f32 */
    lin gate, up;                                         /* [D] -> [F] (gate with GELU-tanh fused) */
    lin down;                                             /* [F] -> [D] f32 */
    int sliding;                                          /* layer_types[i] == "sliding_attention" */
} g3_layer;

struct dl_gemma3_text {
    int64_t S, C, Sp;           /* max tokens, rows per matmul chunk, S rounded up to chunks */
    int64_t D, H, KV, Dh, F, V; /* width, heads, KV heads, head dim, MLP width, vocab */
    int64_t window;             /* sliding_window */
    int L;
    dl_dtype dt;
    float eps, scale, emb_scale; /* RMSNorm eps, attention scale, embedding scale (in dt) */
    const float *emb;            /* [V, D]: the artifact's mapping, or emb_own */
    float *emb_own;
    float *ln_final;                /* [D]: 1 + w */
    float *cos_g, *sin_g;           /* [S, Dh/2]: full-attention layers */
    float *cos_l, *sin_l;           /* [S, Dh/2]: sliding layers */
    g3_layer *layers;
    size_t attn_slice;              /* one thread's attention scratch for up to S keys */
    /* activations, planned at load */
    float *x, *o;                   /* [Sp, D] f32: residual stream, projection outputs */
    void *h;                        /* [Sp, D] dt: normalised rows */
    void *qkv;                      /* [Sp, (H + 2 KV) Dh] dt */
    void *kv;                       /* [S, 2 H Dh] dt: k | v per query head (only when KV < H) */
    void *att;                      /* [Sp, H Dh] dt */
    void *g, *u;                    /* [Sp, F] dt */
    void *scratch;                  /* attention: one slice per thread */
    void *arena;                    /* one block holding every buffer above */
};

void dl_gemma3_text_free(dl_gemma3_text *m) {
    if (!m) return;
    for (int i = 0; m->layers && i < m->L; i++) {
        g3_layer *l = &m->layers[i];
        free(l->ln_in), free(l->ln_post_attn), free(l->ln_pre_ff), free(l->ln_post_ff), free(l->q_norm), free(l->k_norm);
        dl_lin_free(&l->qkv), dl_lin_free(&l->o), dl_lin_free(&l->gate), dl_lin_free(&l->up), dl_lin_free(&l->down);
    }
    free(m->layers);
    free(m->emb_own), free(m->ln_final);
    free(m->cos_g), free(m->sin_g), free(m->cos_l), free(m->sin_l);
    dl_aligned_free(m->arena);
    free(m);
}

int64_t dl_gemma3_text_width(const dl_gemma3_text *m) { return m->D; }
int64_t dl_gemma3_text_vocab(const dl_gemma3_text *m) { return m->V; }
int64_t dl_gemma3_text_max_len(const dl_gemma3_text *m) { return m->S; }
int dl_gemma3_text_layers(const dl_gemma3_text *m) { return m->L; }

static const cJSON *obj(const cJSON *o, const char *key) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return cJSON_IsObject(v) ? v : NULL;
}

/* One layer type's RoPE, as Gemma3TextConfig.convert_rope_params_to_dict settles
 * it: rope_parameters[type] (transformers 5), for full attention updated by a
 * rope_scaling (4.x), theta from the entry or else rope_theta (full) /
 * rope_local_base_freq (sliding) or the defaults 1e6 / 1e4. Kinds: "default", and
 * "linear" (inv_freq / factor). */
typedef struct {
    double theta, factor;
} g3_rope;

static dl_status cfg_rope(const cJSON *txt, const char *tf, int full, g3_rope *r) {
    const char *lt = full ? "full_attention" : "sliding_attention";
    const cJSON *rp = obj(obj(txt, "rope_parameters"), lt), *sc = full ? obj(txt, "rope_scaling") : NULL;
    char where[700];
    snprintf(where, sizeof where, "%s (RoPE of %s layers)", tf, lt);
    dl_status s;
    double def;
    if ((s = dl_cfg_float(txt, tf, full ? "rope_theta" : "rope_local_base_freq", full ? 1e6 : 1e4, &def)) != DL_OK) return s;
    r->theta = def;
    r->factor = 1;
    const char *type = "default";
    const cJSON *srcs[2] = {rp, sc}; /* rope_scaling's fields override */
    for (int i = 0; i < 2; i++) {
        const cJSON *o = srcs[i];
        if (!o) continue;
        const char *t;
        double prf;
        if ((s = dl_cfg_float(o, where, "rope_theta", r->theta, &r->theta)) ||
            (s = dl_cfg_float(o, where, "factor", r->factor, &r->factor)) ||
            (s = dl_cfg_float(o, where, "partial_rotary_factor", 1.0, &prf)) || (s = dl_cfg_str(o, where, "rope_type", "", &t)))
            return s;
        if (!t[0] && (s = dl_cfg_str(o, where, "type", "", &t)) != DL_OK) return s;
        if (t[0]) type = t;
        if (prf != 1.0)
            return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: partial_rotary_factor %g is not supported (1 only)", where, prf);
    }
    if (!(r->theta > 1.0)) return dl_fail(DL_ERR_FORMAT, "`%s`: rope_theta %g must be above 1", where, r->theta);
    if (!strcmp(type, "default")) {
        r->factor = 1;
    } else if (!strcmp(type, "linear")) {
        if (!(r->factor > 0)) return dl_fail(DL_ERR_FORMAT, "`%s`: linear RoPE factor %g must be positive", where, r->factor);
    } else {
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: rope type \"%s\" is not supported (default / linear only)", where, type);
    }
    return DL_OK;
}

/* layer_types (transformers 5), else sliding_window_pattern (4.x; default 6): layer i
 * slides unless (i + 1) % pattern == 0. */
static dl_status cfg_layer_types(dl_gemma3_text *m, const cJSON *txt, const char *tf) {
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(txt, "layer_types");
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != m->L)
            return dl_fail(DL_ERR_FORMAT, "`%s`: layer_types must list %d layer types", tf, m->L);
        for (int i = 0; i < m->L; i++) {
            const cJSON *e = cJSON_GetArrayItem(lt, i);
            const char *v = cJSON_IsString(e) ? e->valuestring : "";
            if (!strcmp(v, "sliding_attention")) m->layers[i].sliding = 1;
            else if (!strcmp(v, "full_attention")) m->layers[i].sliding = 0;
            else
                return dl_fail(DL_ERR_UNSUPPORTED,
                               "`%s`: layer_types[%d] is \"%s\" (sliding_attention / full_attention only)", tf, i, v);
        }
        return DL_OK;
    }
    int64_t pat;
    dl_status s = dl_cfg_int(txt, tf, "sliding_window_pattern", 6, &pat);
    if (s != DL_OK) return s;
    if (pat < 1) return dl_fail(DL_ERR_FORMAT, "`%s`: sliding_window_pattern %lld must be at least 1", tf, (long long)pat);
    for (int i = 0; i < m->L; i++) m->layers[i].sliding = (i + 1) % pat != 0;
    return DL_OK;
}

/* The text model's fields (Gemma3TextConfig's defaults where absent): `text_config`
 * when present, else the top level (a Gemma3ForCausalLM's config). */
static dl_status cfg_read(dl_gemma3_text *m, const cJSON *cfg, const char *file, g3_rope *rg, g3_rope *rl) {
    const cJSON *txt = obj(cfg, "text_config");
    if (!txt) txt = cfg;
    char tf[600];
    snprintf(tf, sizeof tf, "%s%s", file, txt != cfg ? " (text_config)" : "");
    const char *mt, *act;
    int64_t L;
    double eps, qpas;
    int bidir, bias;
    dl_status s;
    if ((s = dl_cfg_str(cfg, file, "model_type", "", &mt)) != DL_OK) return s;
    if (mt[0] && strcmp(mt, "gemma3") && strcmp(mt, "gemma3_text"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: model_type \"%s\" is not Gemma 3 (gemma3 / gemma3_text)", file, mt);
    if ((s = dl_cfg_int(txt, tf, "hidden_size", 2304, &m->D)) || (s = dl_cfg_int(txt, tf, "intermediate_size", 9216, &m->F)) ||
        (s = dl_cfg_int(txt, tf, "num_attention_heads", 8, &m->H)) ||
        (s = dl_cfg_int(txt, tf, "num_key_value_heads", 4, &m->KV)) || (s = dl_cfg_int(txt, tf, "head_dim", 256, &m->Dh)) ||
        (s = dl_cfg_int(txt, tf, "num_hidden_layers", 26, &L)) || (s = dl_cfg_int(txt, tf, "vocab_size", 262208, &m->V)) ||
        (s = dl_cfg_float(txt, tf, "rms_norm_eps", 1e-6, &eps)) ||
        (s = dl_cfg_str(txt, tf, "hidden_activation", "gelu_pytorch_tanh", &act)) ||
        (s = dl_cfg_float(txt, tf, "query_pre_attn_scalar", 256, &qpas)) ||
        (s = dl_cfg_int(txt, tf, "sliding_window", 4096, &m->window)) ||
        (s = dl_cfg_bool(txt, tf, "use_bidirectional_attention", 0, &bidir)) ||
        (s = dl_cfg_bool(txt, tf, "attention_bias", 0, &bias)))
        return s;
    if (m->D <= 0 || m->H <= 0 || m->KV <= 0 || m->H % m->KV || m->Dh <= 0 || L <= 0 || L > 1000 || m->F <= 0 || m->V <= 0)
        return dl_fail(DL_ERR_FORMAT,
                       "`%s`: inconsistent sizes (hidden_size %lld, heads %lld, key/value heads %lld, head_dim %lld, "
                       "layers %lld, intermediate_size %lld, vocab_size %lld)",
                       tf, (long long)m->D, (long long)m->H, (long long)m->KV, (long long)m->Dh, (long long)L,
                       (long long)m->F, (long long)m->V);
    if (m->Dh % 2 || m->Dh > 1024)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: head_dim %lld (must be even, at most 1024)", tf, (long long)m->Dh);
    if (strcmp(act, "gelu_pytorch_tanh"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: hidden_activation \"%s\" is not supported (gelu_pytorch_tanh)", tf, act);
    if (bidir)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: use_bidirectional_attention true is not supported (causal only)", tf);
    if (bias) return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: attention_bias true is not supported", tf);
    if (!(qpas > 0)) return dl_fail(DL_ERR_FORMAT, "`%s`: query_pre_attn_scalar %g must be positive", tf, qpas);
    if (!(eps >= 0)) return dl_fail(DL_ERR_FORMAT, "`%s`: rms_norm_eps %g must not be negative", tf, eps);
    m->L = (int)L;
    m->eps = (float)eps;
    m->scale = (float)pow(qpas, -0.5);
    m->layers = calloc((size_t)m->L, sizeof *m->layers);
    if (!m->layers) return dl_fail(DL_ERR_NOMEM, "out of memory");
    if ((s = cfg_layer_types(m, txt, tf)) != DL_OK) return s;
    int any_sliding = 0;
    for (int i = 0; i < m->L; i++) any_sliding |= m->layers[i].sliding;
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(txt, "sliding_window");
    if (any_sliding && ((sw && cJSON_IsNull(sw)) || m->window < 1))
        return dl_fail(DL_ERR_FORMAT, "`%s`: sliding layers need a sliding_window of at least 1", tf);
    if ((s = cfg_rope(txt, tf, 1, rg)) != DL_OK) return s;
    return cfg_rope(txt, tf, 0, rl);
}

/* cos/sin [S, Dh/2] of angle t * inv_freq[i], in f32 as transformers computes them:
 * inv_freq = 1 / theta ** (arange(0, Dh, 2) / Dh) (then / factor for linear),
 * freqs = float(t) * inv_freq. */
static void rope_table(const dl_gemma3_text *m, const g3_rope *r, float *cos_t, float *sin_t) {
    const int64_t half = m->Dh / 2;
    for (int64_t i = 0; i < half; i++) {
        float inv = 1.0f / powf((float)r->theta, (float)(2 * i) / (float)m->Dh);
        if (r->factor != 1) inv /= (float)r->factor;
        for (int64_t t = 0; t < m->S; t++) {
            float a = (float)t * inv;
            cos_t[t * half + i] = (float)cos((double)a);
            sin_t[t * half + i] = (float)sin((double)a);
        }
    }
}

/* A Gemma3RMSNorm weight of n elements as the factor it applies: 1 + w, in f32. */
static dl_status norm_param(dl_wsrc *ck, const char *name, int64_t n, float **out) {
    int64_t sh[1] = {n};
    dl_status s = dl_param_f32(ck, name, 1, sh, out);
    if (s != DL_OK) return s;
    for (int64_t i = 0; i < n; i++) (*out)[i] = 1.0f + (*out)[i];
    return DL_OK;
}

dl_status dl_gemma3_text_load(dl_gemma3_text **out, dl_model_dir *dir, const char *component, int64_t max_len,
                              dl_dtype dt, dl_wsrc *src) {
    *out = NULL;
    char file[512], nb[4][256];
    snprintf(file, sizeof file, "%s/config.json", component);
    if (max_len <= 0 || max_len > 65536)
        return dl_fail(DL_ERR_INVALID, "Gemma 3 text encoder: max length %lld is outside 1..65536", (long long)max_len);
    if (dt != DL_F32 && dt != DL_BF16)
        return dl_fail(DL_ERR_UNSUPPORTED, "Gemma 3 text encoder: dtype %s (f32 or bf16)", dl_dtype_name(dt));
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    dl_gemma3_text *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    m->dt = dt;
    m->S = max_len;
    m->C = max_len < G3_CHUNK ? max_len : G3_CHUNK;
    m->Sp = (max_len + m->C - 1) / m->C * m->C;
    g3_rope rg, rl;
    dl_wsrc *ck = NULL;
    if ((s = cfg_read(m, cfg, file, &rg, &rl)) != DL_OK) goto fail;
    /* sqrt(D) as a Python float, held by a f32 buffer, cast to the weights' dtype */
    m->emb_scale = (float)sqrt((double)m->D);
    if (dt == DL_BF16) m->emb_scale = dl_bf16_to_f32(dl_f32_to_bf16(m->emb_scale));
    if ((s = dl_ws_open(&ck, src, dir, component)) != DL_OK) goto fail;
    const int64_t D = m->D, S = m->S, Sp = m->Sp, C = m->C, Dh = m->Dh, F = m->F;
    const int64_t QD = m->H * Dh, KD = m->KV * Dh;
    const char *pre = dl_ws_find(ck, "model.language_model.embed_tokens.weight")   ? "model.language_model."
                      : dl_ws_find(ck, "language_model.model.embed_tokens.weight") ? "language_model.model."
                      : dl_ws_find(ck, "model.embed_tokens.weight")                ? "model."
                      : dl_ws_find(ck, "embed_tokens.weight")                      ? ""
                                                                                   : NULL;
    if (!pre) {
        s = dl_fail(DL_ERR_FORMAT,
                    "%s has none of `model.language_model.embed_tokens.weight` (transformers >= 4.52), "
                    "`language_model.model.embed_tokens.weight` (the original checkpoints), `model.embed_tokens.weight` "
                    "(Gemma3ForCausalLM) or `embed_tokens.weight` (a bare model): not a Gemma 3 checkpoint",
                    dl_ws_label(ck));
        goto fail;
    }
    int64_t sh_emb[2] = {m->V, D};
    if ((s = dl_param_f32_map(ck, dl_pname(nb[0], 256, pre, "embed_tokens.weight"), 2, sh_emb, &m->emb, &m->emb_own)) ||
        (s = norm_param(ck, dl_pname(nb[0], 256, pre, "norm.weight"), D, &m->ln_final)))
        goto fail;
    const size_t tab = (size_t)(S * (Dh / 2)) * sizeof(float);
    m->cos_g = malloc(tab), m->sin_g = malloc(tab), m->cos_l = malloc(tab), m->sin_l = malloc(tab);
    if (!m->cos_g || !m->sin_g || !m->cos_l || !m->sin_l) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    rope_table(m, &rg, m->cos_g, m->sin_g);
    rope_table(m, &rl, m->cos_l, m->sin_l);
    for (int i = 0; i < m->L; i++) {
        g3_layer *l = &m->layers[i];
        char p[96];
        snprintf(p, sizeof p, "%slayers.%d.", pre, i);
        const char *qkv_w[3] = {dl_pname(nb[0], 256, p, "self_attn.q_proj.weight"), dl_pname(nb[1], 256, p, "self_attn.k_proj.weight"),
                                dl_pname(nb[2], 256, p, "self_attn.v_proj.weight")};
        int64_t parts[3] = {QD, KD, KD}, pd[1] = {D}, pf[1] = {F};
        if ((s = dl_lin_load(&l->qkv, ck, qkv_w, NULL, 3, parts, C, D, dt, dt, DL_ACT_NONE)) ||
            (s = norm_param(ck, dl_pname(nb[3], 256, p, "input_layernorm.weight"), D, &l->ln_in)) ||
            (s = norm_param(ck, dl_pname(nb[3], 256, p, "post_attention_layernorm.weight"), D, &l->ln_post_attn)) ||
            (s = norm_param(ck, dl_pname(nb[3], 256, p, "pre_feedforward_layernorm.weight"), D, &l->ln_pre_ff)) ||
            (s = norm_param(ck, dl_pname(nb[3], 256, p, "post_feedforward_layernorm.weight"), D, &l->ln_post_ff)) ||
            (s = norm_param(ck, dl_pname(nb[3], 256, p, "self_attn.q_norm.weight"), Dh, &l->q_norm)) ||
            (s = norm_param(ck, dl_pname(nb[3], 256, p, "self_attn.k_norm.weight"), Dh, &l->k_norm)))
            goto fail;
        const char *ow[1] = {dl_pname(nb[0], 256, p, "self_attn.o_proj.weight")};
        const char *gw[1] = {dl_pname(nb[1], 256, p, "mlp.gate_proj.weight")};
        const char *uw[1] = {dl_pname(nb[2], 256, p, "mlp.up_proj.weight")};
        const char *dw[1] = {dl_pname(nb[3], 256, p, "mlp.down_proj.weight")};
        if ((s = dl_lin_load(&l->o, ck, ow, NULL, 1, pd, C, QD, dt, DL_F32, DL_ACT_NONE)) ||
            (s = dl_lin_load(&l->gate, ck, gw, NULL, 1, pf, C, D, dt, dt, DL_ACT_GELU_TANH)) ||
            (s = dl_lin_load(&l->up, ck, uw, NULL, 1, pf, C, D, dt, dt, DL_ACT_NONE)) ||
            (s = dl_lin_load(&l->down, ck, dw, NULL, 1, pd, C, F, dt, DL_F32, DL_ACT_NONE)))
            goto fail;
    }
    size_t es = dl_dtype_size(dt);
    dl_attn_args sa = {.dt = dt, .sq = S, .sk = S, .heads = m->H, .head_dim = Dh, .kv_end = S, .causal = 1};
    m->attn_slice = dl_attn_scratch_bytes(&sa, 1); /* a row call over fewer keys needs no more */
    act_plan pl = {0};
    dl_plan_add(&pl, &m->x, (size_t)(Sp * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->o, (size_t)(Sp * D) * 4, 1, 1);
    dl_plan_add(&pl, &m->h, (size_t)(Sp * D) * es, 1, 1);
    dl_plan_add(&pl, &m->qkv, (size_t)(Sp * (QD + 2 * KD)) * es, 1, 1);
    if (m->KV < m->H) dl_plan_add(&pl, &m->kv, (size_t)(S * 2 * QD) * es, 1, 1);
    dl_plan_add(&pl, &m->att, (size_t)(Sp * QD) * es, 1, 1);
    dl_plan_add(&pl, &m->g, (size_t)(Sp * F) * es, 1, 1);
    dl_plan_add(&pl, &m->u, (size_t)(Sp * F) * es, 1, 1);
    dl_plan_add(&pl, &m->scratch, (size_t)omp_get_max_threads() * m->attn_slice, 1, 1);
    if ((s = dl_plan_commit(&pl, ck, &m->arena)) != DL_OK) goto fail;
    dl_ws_close(ck);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_gemma3_text_free(m);
    return s;
}



/* Sliding-window attention when the window hides keys: thread ith's share of the
 * query rows [p, n), one kernel call per row over its keys [max(p, i - window + 1),
 * i + 1), on the thread's own scratch slice. Padded rows [0, p) get zeros. */
static void attn_window(const dl_gemma3_text *m, const dl_attn_args *a, int64_t n, int64_t p, int ith, int nth) {
    const size_t es = dl_dtype_size(m->dt);
    const int64_t QD = m->H * m->Dh;
    int64_t b, e;
    dl_split(n, ith, nth, &b, &e);
    void *scratch = (char *)m->scratch + (size_t)ith * m->attn_slice;
    for (int64_t i = b; i < e; i++) {
        if (i < p) {
            memset((char *)a->out + (size_t)(i * QD) * es, 0, (size_t)QD * es);
            continue;
        }
        dl_attn_args r = *a;
        r.q = (const char *)a->q + (size_t)(i * a->q_stride) * es;
        r.out = (char *)a->out + (size_t)(i * a->out_stride) * es;
        r.sq = 1;
        r.causal = 0;
        r.kv_begin = i - m->window + 1 > p ? i - m->window + 1 : p;
        r.kv_end = i + 1;
        dl_attn_t(&r, scratch, 0, 1);
    }
}

dl_status dl_gemma3_text_run_all(dl_gemma3_text *m, const int32_t *ids, int64_t n, int64_t pad_left, float *hidden) {
    const int64_t S = m->S, D = m->D, Dh = m->Dh, F = m->F, C = m->C;
    const int64_t QD = m->H * Dh, KD = m->KV * Dh, W = QD + 2 * KD;
    if (n < 1 || n > S)
        return dl_fail(DL_ERR_INVALID, "Gemma 3 text encoder: %lld tokens is outside 1..%lld (the length it was built for)",
                       (long long)n, (long long)S);
    if (pad_left < 0 || pad_left >= n)
        return dl_fail(DL_ERR_INVALID, "Gemma 3 text encoder: %lld padded positions of %lld leave no token (0..%lld)",
                       (long long)pad_left, (long long)n, (long long)(n - 1));
    for (int64_t t = 0; t < n; t++)
        if (ids[t] < 0 || ids[t] >= m->V)
            return dl_fail(DL_ERR_INVALID, "Gemma 3 text encoder: token id %d at position %lld is outside the vocabulary (%lld)",
                           ids[t], (long long)t, (long long)m->V);
    const int64_t nch = (n + C - 1) / C, R = nch * C; /* rows the matmuls cover */
    const size_t es = dl_dtype_size(m->dt), state = (size_t)(n * D);
    for (int64_t t = 0; t < n; t++) {
        const float *e = m->emb + (int64_t)ids[t] * D;
        for (int64_t j = 0; j < D; j++) m->x[t * D + j] = e[j] * m->emb_scale;
    }
    memset(m->x + n * D, 0, (size_t)((R - n) * D) * 4);
    memcpy(hidden, m->x, state * 4); /* hidden_states[0] */
    const int gqa = m->KV < m->H;
    char *q = m->qkv, *k = q + (size_t)QD * es;
    dl_attn_args a = {.dt = m->dt, .sq = n, .sk = n, .heads = m->H, .head_dim = Dh, .q = q, .q_stride = W,
                      .k = gqa ? m->kv : k, .v = gqa ? (char *)m->kv + (size_t)QD * es : k + (size_t)KD * es,
                      .k_stride = gqa ? 2 * QD : W, .v_stride = gqa ? 2 * QD : W, .out = m->att, .out_stride = QD,
                      .kv_begin = pad_left, .kv_end = n, .scale = m->scale, .causal = 1};
    const int windowed = n - pad_left > m->window; /* some valid key falls out of some row's window */
    dl_status s = DL_OK;
    for (int i = 0; i < m->L && s == DL_OK; i++) {
        g3_layer *l = &m->layers[i];
        const float *cs = l->sliding ? m->cos_l : m->cos_g, *sn = l->sliding ? m->sin_l : m->sin_g;
        DL_PAR(dl_rmsnorm_x_t(m->dt, m->h, DL_F32, m->x, R, D, l->ln_in, m->eps, ith, nth));
        if ((s = dl_lin_chunks(&l->qkv, m->h, es, m->qkv, es, C, nch))) break;
        DL_PAR(dl_rmsnorm_heads_t(m->dt, q, n, W, m->H, Dh, l->q_norm, m->eps, ith, nth);
               dl_rmsnorm_heads_t(m->dt, k, n, W, m->KV, Dh, l->k_norm, m->eps, ith, nth));
        DL_PAR(dl_rope_t(DL_ROPE_HALVES, m->dt, q, n, m->H, Dh, W, cs, sn, ith, nth);
               dl_rope_t(DL_ROPE_HALVES, m->dt, k, n, m->KV, Dh, W, cs, sn, ith, nth));
        if (gqa) DL_PAR(dl_expand_kv(m->dt, m->qkv, m->kv, m->H, m->KV, m->Dh, n, ith, nth));
        if (l->sliding && windowed) DL_PAR(attn_window(m, &a, n, pad_left, ith, nth));
        else DL_PAR(dl_attn_t(&a, m->scratch, ith, nth));
        memset((char *)m->att + (size_t)(n * QD) * es, 0, (size_t)((R - n) * QD) * es);
        if ((s = dl_lin_chunks(&l->o, m->att, es, m->o, 4, C, nch))) break;
        DL_PAR(dl_rmsnorm_t(DL_F32, m->o, m->o, R, D, l->ln_post_attn, m->eps, ith, nth));
        DL_PAR(dl_gated_residual_t(DL_F32, m->x, m->o, R, D, NULL, ith, nth));
        DL_PAR(dl_rmsnorm_x_t(m->dt, m->h, DL_F32, m->x, R, D, l->ln_pre_ff, m->eps, ith, nth));
        if ((s = dl_lin_chunks(&l->gate, m->h, es, m->g, es, C, nch)) || (s = dl_lin_chunks(&l->up, m->h, es, m->u, es, C, nch)))
            break;
        DL_PAR(dl_mul_t(m->dt, m->g, m->g, m->u, R * F, ith, nth));
        if ((s = dl_lin_chunks(&l->down, m->g, es, m->o, 4, C, nch))) break;
        DL_PAR(dl_rmsnorm_t(DL_F32, m->o, m->o, R, D, l->ln_post_ff, m->eps, ith, nth));
        DL_PAR(dl_gated_residual_t(DL_F32, m->x, m->o, R, D, NULL, ith, nth));
        float *dst = hidden + (size_t)(i + 1) * state;
        if (i + 1 < m->L) memcpy(dst, m->x, state * 4);
        else DL_PAR(dl_rmsnorm_t(DL_F32, dst, m->x, n, D, m->ln_final, m->eps, ith, nth));
    }
    return s;
}
