/* T5EncoderModel (transformers): FLUX's sequence text encoder (T5 v1.1 XXL), and
 * UMT5EncoderModel: Wan 2.1's (umt5-xxl), the same but for a bias of its own in every layer.
 *   x = shared[ids]                                               // x: [S, D] f32
 *   bias = relative_attention_bias[bucket(j - i)] of layer 0     // [H, 2S-1], Toeplitz
 *          (UMT5: of each layer, for that layer)
 *   per layer: x += o(attn(qkv(rms(x)), bias, no scaling))       // qkv: [S, 3*H*dk]
 *              x += wo(gelu_tanh(wi_0 h) * wi_1 h), h = rms(x)   // gated-gelu (v1.1; gated-silu alike)
 *           or x += wo(relu(wi h))                                // original T5 (or gelu, silu)
 *   hidden = rms_final(x)
 * An attention mask of the padded form [1]*valid + [0]*(S - valid) keeps keys [valid, S)
 * from every query row (padded rows are still computed), exactly what transformers'
 * additive finfo.min gives in f32: their exponentials are 0. */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "models/models_impl.h"

typedef struct {
    float *ln_att, *ln_ff; /* [D] */
    lin qkv, o, wi0, wi1, wo;
} t5_layer;

struct dl_t5_encoder {
    int64_t S, D, DK, H, F, V, nbuckets, maxdist;
    int L, gated;
    int umt5;                     /* a relative position bias per layer (UMT5) */
    dl_act act;                   /* the feed-forward activation */
    dl_dtype dt;
    float eps;
    const float *emb; /* [V, D]: the artifact's mapping, or emb_own */
    float *emb_own;
    float *bias_rel; /* [nbias, H, 2S - 1]: nbias = L (UMT5) or 1 (T5: layer 0's, shared) */
    float *ln_final; /* [D] */
    t5_layer *layers;
    float *x, *o;    /* [S, D] f32 */
    void *h;         /* [S, D] dt */
    void *qkv;       /* [S, 3 H DK] dt */
    void *att;       /* [S, H DK] dt */
    void *f0, *f1;   /* [S, F] dt */
    void *scratch;
    void *arena; /* one block holding every buffer above */
};

int32_t dl_t5_bucket(int64_t rel, int bidirectional, int num_buckets, int max_distance) {
    int32_t b = 0;
    if (bidirectional) {
        num_buckets /= 2;
        if (rel > 0) b += num_buckets;
        rel = rel < 0 ? -rel : rel;
    } else {
        rel = rel < 0 ? -rel : 0; /* -min(rel, 0) */
    }
    int max_exact = num_buckets / 2;
    if (rel < max_exact) return b + (int32_t)rel;
    /* in float32, as torch computes it: log(rel / max_exact) / log(max_distance / max_exact)
     * * (num_buckets - max_exact), truncated */
    float r = logf((float)rel / (float)max_exact) / (float)log((double)max_distance / max_exact) *
              (float)(num_buckets - max_exact);
    int32_t large = max_exact + (int32_t)r;
    if (large > num_buckets - 1) large = num_buckets - 1;
    return b + large;
}

/* Which architecture the config declares, by model_type ("umt5") and architectures
 * ("UMT5EncoderModel", ...): *umt5 = 1 for UMT5, 0 for T5 and its other variants (mt5)
 * or when neither is given. The two disagreeing is an error. */
static dl_status cfg_umt5(const cJSON *cfg, const char *file, int *umt5) {
    const char *mt;
    dl_status s = dl_cfg_str(cfg, file, "model_type", "", &mt);
    if (s != DL_OK) return s;
    int by_type = mt[0] ? !strcmp(mt, "umt5") : -1, by_arch = -1; /* -1: not declared */
    const char *arch = NULL;
    const cJSON *e, *ar = cJSON_GetObjectItemCaseSensitive(cfg, "architectures");
    if (!cJSON_IsArray(ar)) ar = NULL;
    cJSON_ArrayForEach(e, ar) {
        if (!cJSON_IsString(e)) continue;
        int u = !strncmp(e->valuestring, "UMT5", 4);
        if (by_arch < 0 || u) by_arch = u, arch = e->valuestring;
    }
    if (by_type >= 0 && by_arch >= 0 && by_type != by_arch)
        return dl_fail(DL_ERR_FORMAT, "`%s`: model_type \"%s\" and architectures \"%s\" disagree on T5 or UMT5", file, mt,
                       arch);
    *umt5 = by_type >= 0 ? by_type : by_arch == 1;
    return DL_OK;
}

void dl_t5_encoder_free(dl_t5_encoder *m) {
    if (!m) return;
    for (int i = 0; m->layers && i < m->L; i++) {
        t5_layer *l = &m->layers[i];
        free(l->ln_att), free(l->ln_ff);
        dl_lin_free(&l->qkv), dl_lin_free(&l->o), dl_lin_free(&l->wi0), dl_lin_free(&l->wi1), dl_lin_free(&l->wo);
    }
    free(m->layers);
    free(m->emb_own), free(m->bias_rel), free(m->ln_final);
    dl_aligned_free(m->arena);
    free(m);
}

int64_t dl_t5_encoder_width(const dl_t5_encoder *m) { return m->D; }
int64_t dl_t5_encoder_head_dim(const dl_t5_encoder *m) { return m->DK; }
int dl_t5_encoder_layers(const dl_t5_encoder *m) { return m->L; }

dl_status dl_t5_encoder_load(dl_t5_encoder **out, dl_model_dir *dir, const char *component, int64_t seq_len,
                             dl_dtype dt, dl_wsrc *src) {
    *out = NULL;
    char file[512], nb[4][256];
    snprintf(file, sizeof file, "%s/config.json", component);
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    dl_t5_encoder *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    m->dt = dt;
    m->S = seq_len;
    int64_t L = 0;
    double eps;
    const char *ff;
    dl_wsrc *ck = NULL;
    if ((s = dl_cfg_int(cfg, file, "d_model", 512, &m->D)) || (s = dl_cfg_int(cfg, file, "d_kv", 64, &m->DK)) ||
        (s = dl_cfg_int(cfg, file, "d_ff", 2048, &m->F)) || (s = dl_cfg_int(cfg, file, "num_heads", 8, &m->H)) ||
        (s = dl_cfg_int(cfg, file, "num_layers", 6, &L)) || (s = dl_cfg_int(cfg, file, "vocab_size", 32128, &m->V)) ||
        (s = dl_cfg_int(cfg, file, "relative_attention_num_buckets", 32, &m->nbuckets)) ||
        (s = dl_cfg_int(cfg, file, "relative_attention_max_distance", 128, &m->maxdist)) ||
        (s = dl_cfg_float(cfg, file, "layer_norm_epsilon", 1e-6, &eps)) ||
        (s = dl_cfg_str(cfg, file, "feed_forward_proj", "relu", &ff)))
        goto fail;
    m->L = (int)L;
    m->eps = (float)eps;
    if ((s = cfg_umt5(cfg, file, &m->umt5)) != DL_OK) goto fail;
    /* as transformers reads it: "[gated-]ACT", "gated-gelu" meaning gelu_new (tanh) */
    m->gated = !strncmp(ff, "gated-", 6);
    const char *an = m->gated ? ff + 6 : ff;
    if (!strcmp(an, "relu")) m->act = DL_ACT_RELU;
    else if (!strcmp(an, "gelu_new") || (m->gated && !strcmp(an, "gelu"))) m->act = DL_ACT_GELU_TANH;
    else if (!strcmp(an, "gelu")) m->act = DL_ACT_GELU_ERF;
    else if (!strcmp(an, "silu") || !strcmp(an, "swish")) m->act = DL_ACT_SILU;
    else {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: feed_forward_proj \"%s\" is not supported ([gated-]relu, gelu, gelu_new, silu)",
                    file, ff);
        goto fail;
    }
    if (m->D <= 0 || m->DK <= 0 || m->H <= 0 || L <= 0 || L > 1000 || m->F <= 0 || m->V <= 0 || m->nbuckets < 2 ||
        m->maxdist < m->nbuckets / 2) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: inconsistent sizes", file);
        goto fail;
    }
    if (seq_len <= 0 || seq_len > 65536) {
        s = dl_fail(DL_ERR_INVALID, "T5 encoder: sequence length %lld is outside 1..65536", (long long)seq_len);
        goto fail;
    }
    if ((s = dl_ws_open(&ck, src, dir, component)) != DL_OK) goto fail;
    const int64_t D = m->D, S = m->S, I = m->H * m->DK, F = m->F;
    int64_t sh_emb[2] = {m->V, D}, sh_d[1] = {D}, sh_rb[2] = {m->nbuckets, m->H};
    /* the embedding is `shared.weight`, or `encoder.embed_tokens.weight` when only that is stored */
    const char *emb = dl_ws_find(ck, "shared.weight") ? "shared.weight" : "encoder.embed_tokens.weight";
    if ((s = dl_param_f32_map(ck, emb, 2, sh_emb, &m->emb, &m->emb_own)) ||
        (s = dl_param_f32(ck, "encoder.final_layer_norm.weight", 1, sh_d, &m->ln_final)))
        goto fail;
    /* T5 has a bias in layer 0 only (transformers ignores any other); UMT5 one in every
     * layer. A checkpoint of the one with the config of the other is refused. */
    for (int i = 1; i < m->L; i++) {
        snprintf(nb[0], sizeof nb[0], "encoder.block.%d.layer.0.SelfAttention.relative_attention_bias.weight", i);
        if (dl_ws_find(ck, nb[0]) != m->umt5) {
            s = m->umt5 ? dl_fail(DL_ERR_FORMAT,
                                  "`%s` declares UMT5, which has a relative position bias in every layer, but %s has no `%s`",
                                  file, dl_ws_label(ck), nb[0])
                        : dl_fail(DL_ERR_FORMAT,
                                  "%s has `%s`, a relative position bias per layer as UMT5 has, but `%s` declares T5 "
                                  "(UMT5 needs model_type \"umt5\" / UMT5EncoderModel)",
                                  dl_ws_label(ck), nb[0], file);
            goto fail;
        }
    }
    const int nbias = m->umt5 ? m->L : 1;
    const int64_t W = 2 * S - 1;
    m->bias_rel = malloc((size_t)(nbias * m->H * W) * sizeof *m->bias_rel);
    if (!m->bias_rel) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < nbias; i++) {
        float *rb, *bi = m->bias_rel + (size_t)i * (size_t)(m->H * W);
        snprintf(nb[0], sizeof nb[0], "encoder.block.%d.layer.0.SelfAttention.relative_attention_bias.weight", i);
        if ((s = dl_param_f32(ck, nb[0], 2, sh_rb, &rb)) != DL_OK) goto fail;
        for (int64_t r = -(S - 1); r <= S - 1; r++) { /* r = j - i */
            int32_t bk = dl_t5_bucket(r, 1, (int)m->nbuckets, (int)m->maxdist);
            for (int64_t h = 0; h < m->H; h++) bi[h * W + r + S - 1] = rb[bk * m->H + h];
        }
        free(rb);
    }
    m->layers = calloc((size_t)m->L, sizeof *m->layers);
    if (!m->layers) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < m->L; i++) {
        t5_layer *l = &m->layers[i];
        char p[64];
        snprintf(p, sizeof p, "encoder.block.%d.", i);
        const char *qkv[3] = {dl_pname(nb[0], 256, p, "layer.0.SelfAttention.q.weight"), dl_pname(nb[1], 256, p, "layer.0.SelfAttention.k.weight"),
                              dl_pname(nb[2], 256, p, "layer.0.SelfAttention.v.weight")};
        int64_t parts[3] = {I, I, I}, pd[1] = {D}, pf[1] = {F};
        if ((s = dl_param_f32(ck, dl_pname(nb[3], 256, p, "layer.0.layer_norm.weight"), 1, sh_d, &l->ln_att)) ||
            (s = dl_param_f32(ck, dl_pname(nb[3], 256, p, "layer.1.layer_norm.weight"), 1, sh_d, &l->ln_ff)) ||
            (s = dl_lin_load(&l->qkv, ck, qkv, NULL, 3, parts, S, D, dt, dt, DL_ACT_NONE)))
            goto fail;
        const char *o[1] = {dl_pname(nb[0], 256, p, "layer.0.SelfAttention.o.weight")};
        if ((s = dl_lin_load(&l->o, ck, o, NULL, 1, pd, S, I, dt, DL_F32, DL_ACT_NONE))) goto fail;
        if (m->gated) {
            const char *w0[1] = {dl_pname(nb[0], 256, p, "layer.1.DenseReluDense.wi_0.weight")};
            const char *w1[1] = {dl_pname(nb[1], 256, p, "layer.1.DenseReluDense.wi_1.weight")};
            if ((s = dl_lin_load(&l->wi0, ck, w0, NULL, 1, pf, S, D, dt, dt, m->act)) ||
                (s = dl_lin_load(&l->wi1, ck, w1, NULL, 1, pf, S, D, dt, dt, DL_ACT_NONE)))
                goto fail;
        } else {
            const char *w0[1] = {dl_pname(nb[0], 256, p, "layer.1.DenseReluDense.wi.weight")};
            if ((s = dl_lin_load(&l->wi0, ck, w0, NULL, 1, pf, S, D, dt, dt, m->act))) goto fail;
        }
        const char *wo[1] = {dl_pname(nb[0], 256, p, "layer.1.DenseReluDense.wo.weight")};
        if ((s = dl_lin_load(&l->wo, ck, wo, NULL, 1, pd, S, F, dt, DL_F32, DL_ACT_NONE))) goto fail;
    }
    size_t es = dl_dtype_size(dt);
    act_plan pl = {0};
    dl_plan_add(&pl, &m->x, (size_t)(S * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->o, (size_t)(S * D) * 4, 1, 1);
    dl_plan_add(&pl, &m->h, (size_t)(S * D) * es, 1, 1);
    dl_plan_add(&pl, &m->qkv, (size_t)(S * 3 * I) * es, 1, 1);
    dl_plan_add(&pl, &m->att, (size_t)(S * I) * es, 1, 1);
    dl_plan_add(&pl, &m->f0, (size_t)(S * F) * es, 1, 1);
    dl_plan_add(&pl, &m->f1, (size_t)(S * F) * es, 1, 1);
    dl_plan_attn_scratch(&pl, &m->scratch, dt, S, m->H, m->DK, 0, 1, 1);
    if ((s = dl_plan_commit(&pl, ck, &m->arena)) != DL_OK) goto fail;
    dl_ws_close(ck);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_t5_encoder_free(m);
    return s;
}

int dl_t5_encoder_is_umt5(const dl_t5_encoder *m) { return m->umt5; }

dl_status dl_t5_encoder_run(dl_t5_encoder *m, const int32_t *ids, float *hidden, float *all_hidden) {
    return dl_t5_encoder_run_masked(m, ids, m->S, hidden, all_hidden);
}

dl_status dl_t5_encoder_run_masked(dl_t5_encoder *m, const int32_t *ids, int64_t valid, float *hidden,
                                   float *all_hidden) {
    const int64_t S = m->S, D = m->D, I = m->H * m->DK, F = m->F, W = 2 * S - 1;
    if (valid < 1 || valid > S)
        return dl_fail(DL_ERR_INVALID, "T5 encoder: %lld valid tokens is outside 1..%lld (the sequence length)",
                       (long long)valid, (long long)S);
    for (int64_t t = 0; t < S; t++) {
        if (ids[t] < 0 || ids[t] >= m->V)
            return dl_fail(DL_ERR_INVALID, "T5 encoder: token id %d at position %lld is outside the vocabulary (%lld)",
                           ids[t], (long long)t, (long long)m->V);
        memcpy(m->x + t * D, m->emb + ids[t] * D, (size_t)D * 4);
    }
    if (all_hidden) memcpy(all_hidden, m->x, (size_t)(S * D) * 4);
    size_t es = dl_dtype_size(m->dt);
    dl_attn_args a = {.dt = m->dt, .sq = S, .sk = S, .heads = m->H, .head_dim = m->DK, .q = m->qkv,
                      .k = (char *)m->qkv + (size_t)I * es, .v = (char *)m->qkv + (size_t)(2 * I) * es,
                      .q_stride = 3 * I, .k_stride = 3 * I, .v_stride = 3 * I, .out = m->att, .out_stride = I,
                      .kv_begin = 0, .kv_end = valid, .scale = 1.f, .bias_rel = m->bias_rel};
    dl_status s = DL_OK;
    for (int i = 0; i < m->L && s == DL_OK; i++) {
        t5_layer *l = &m->layers[i];
        if (m->umt5) a.bias_rel = m->bias_rel + (size_t)i * (size_t)(m->H * W);
        DL_PAR(dl_rmsnorm_x_t(m->dt, m->h, DL_F32, m->x, S, D, l->ln_att, m->eps, ith, nth));
        if ((s = lin_run(&l->qkv, m->h, m->qkv))) break;
        DL_PAR(dl_attn_t(&a, m->scratch, ith, nth));
        if ((s = lin_run(&l->o, m->att, m->o))) break;
        DL_PAR(dl_gated_residual_t(DL_F32, m->x, m->o, S, D, NULL, ith, nth));
        DL_PAR(dl_rmsnorm_x_t(m->dt, m->h, DL_F32, m->x, S, D, l->ln_ff, m->eps, ith, nth));
        if ((s = lin_run(&l->wi0, m->h, m->f0))) break;
        if (m->gated) {
            if ((s = lin_run(&l->wi1, m->h, m->f1))) break;
            DL_PAR(dl_mul_t(m->dt, m->f0, m->f0, m->f1, S * F, ith, nth));
        }
        if ((s = lin_run(&l->wo, m->f0, m->o))) break;
        DL_PAR(dl_gated_residual_t(DL_F32, m->x, m->o, S, D, NULL, ith, nth));
        if (all_hidden && i + 1 < m->L) memcpy(all_hidden + (size_t)(i + 1) * (size_t)(S * D), m->x, (size_t)(S * D) * 4);
    }
    if (s != DL_OK) return s;
    DL_PAR(dl_rmsnorm_t(DL_F32, hidden, m->x, S, D, m->ln_final, m->eps, ith, nth));
    if (all_hidden) memcpy(all_hidden + (size_t)m->L * (size_t)(S * D), hidden, (size_t)(S * D) * 4);
    return DL_OK;
}
