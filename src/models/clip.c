/* CLIPTextModel (transformers): the text encoder FLUX uses for its pooled prompt
 * embedding.
 *   x = token_embedding[ids] + position_embedding[0..S)          // x: [S, D] f32
 *   per layer: x += out_proj(attn_causal(qkv(LN1(x))))             // qkv: [S, 3D]
 *              x += fc2(act(fc1(LN2(x))))                          // fc1: [S, F]
 *   hidden = final_layer_norm(x); pooled = hidden[eos position]                */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "models/models_impl.h"

typedef struct {
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b; /* [D] */
    lin qkv, out, fc1, fc2;
} clip_layer;

struct dl_clip_text {
    int64_t S, D, F, H, V, P; /* seq, width, mlp width, heads, vocab, max positions */
    int L;
    dl_dtype dt;
    float eps;
    int64_t eos_id;
    const float *tok;         /* [V, D]: the artifact's mapping, or tok_own */
    float *tok_own, *pos;     /* [P, D] */
    float *lnf_w, *lnf_b;     /* [D] */
    clip_layer *layers;
    /* activations, planned at load */
    float *x;                 /* [S, D] residual stream */
    void *h;                  /* [S, D] normalised (dt) */
    void *qkv;                /* [S, 3D] (dt) */
    void *att;                /* [S, D] (dt) */
    float *o;                 /* [S, D] projection out */
    void *f;                  /* [S, F] (dt) */
    void *scratch;            /* attention */
    void *arena;              /* one block holding every buffer above */
};

void dl_clip_text_free(dl_clip_text *m) {
    if (!m) return;
    for (int i = 0; m->layers && i < m->L; i++) {
        clip_layer *l = &m->layers[i];
        free(l->ln1_w), free(l->ln1_b), free(l->ln2_w), free(l->ln2_b);
        dl_lin_free(&l->qkv), dl_lin_free(&l->out), dl_lin_free(&l->fc1), dl_lin_free(&l->fc2);
    }
    free(m->layers);
    free(m->tok_own), free(m->pos), free(m->lnf_w), free(m->lnf_b);
    dl_aligned_free(m->arena);
    free(m);
}

int64_t dl_clip_text_width(const dl_clip_text *m) { return m->D; }
int dl_clip_text_layers(const dl_clip_text *m) { return m->L; }

static dl_status act_from(const char *name, const char *file, dl_act *a) {
    if (!strcmp(name, "quick_gelu")) *a = DL_ACT_QUICK_GELU;
    else if (!strcmp(name, "gelu")) *a = DL_ACT_GELU_ERF;
    else if (!strcmp(name, "gelu_new") || !strcmp(name, "gelu_pytorch_tanh")) *a = DL_ACT_GELU_TANH;
    else return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: hidden_act \"%s\" is not supported", file, name);
    return DL_OK;
}

dl_status dl_clip_text_load(dl_clip_text **out, dl_model_dir *dir, const char *component, int64_t seq_len,
                            dl_dtype dt, dl_wsrc *src) {
    *out = NULL;
    char file[512], nb[4][256];
    snprintf(file, sizeof file, "%s/config.json", component);
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    dl_clip_text *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    m->dt = dt;
    m->S = seq_len;
    int64_t L = 0;
    double eps;
    const char *act_name;
    dl_act act = DL_ACT_QUICK_GELU;
    dl_wsrc *ck = NULL;
    if ((s = dl_cfg_int(cfg, file, "hidden_size", 512, &m->D)) || (s = dl_cfg_int(cfg, file, "intermediate_size", 2048, &m->F)) ||
        (s = dl_cfg_int(cfg, file, "num_attention_heads", 8, &m->H)) || (s = dl_cfg_int(cfg, file, "num_hidden_layers", 12, &L)) ||
        (s = dl_cfg_int(cfg, file, "vocab_size", 49408, &m->V)) ||
        (s = dl_cfg_int(cfg, file, "max_position_embeddings", 77, &m->P)) ||
        (s = dl_cfg_int(cfg, file, "eos_token_id", 2, &m->eos_id)) ||
        (s = dl_cfg_float(cfg, file, "layer_norm_eps", 1e-5, &eps)) ||
        (s = dl_cfg_str(cfg, file, "hidden_act", "quick_gelu", &act_name)) || (s = act_from(act_name, file, &act)))
        goto fail;
    m->L = (int)L;
    m->eps = (float)eps;
    if (m->D <= 0 || m->H <= 0 || m->D % m->H || L <= 0 || L > 1000 || m->F <= 0 || m->V <= 0) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: inconsistent sizes (hidden_size %lld, heads %lld, layers %lld)", file,
                    (long long)m->D, (long long)m->H, (long long)L);
        goto fail;
    }
    if (seq_len <= 0 || seq_len > m->P) {
        s = dl_fail(DL_ERR_INVALID, "CLIP text encoder: sequence length %lld is outside 1..%lld (max_position_embeddings)",
                    (long long)seq_len, (long long)m->P);
        goto fail;
    }
    if ((s = dl_ws_open(&ck, src, dir, component)) != DL_OK) goto fail;
    /* transformers 4 checkpoints prefix every name with "text_model." */
    const char *pre = dl_ws_find(ck, "text_model.embeddings.token_embedding.weight") ? "text_model." : "";
    int64_t D = m->D, S = m->S, F = m->F;
    int64_t sh_tok[2] = {m->V, D}, sh_pos[2] = {m->P, D}, sh_d[1] = {D};
    if ((s = dl_param_f32_map(ck, dl_pname(nb[0], 256, pre, "embeddings.token_embedding.weight"), 2, sh_tok, &m->tok, &m->tok_own)) ||
        (s = dl_param_f32(ck, dl_pname(nb[0], 256, pre, "embeddings.position_embedding.weight"), 2, sh_pos, &m->pos)) ||
        (s = dl_param_f32(ck, dl_pname(nb[0], 256, pre, "final_layer_norm.weight"), 1, sh_d, &m->lnf_w)) ||
        (s = dl_param_f32(ck, dl_pname(nb[0], 256, pre, "final_layer_norm.bias"), 1, sh_d, &m->lnf_b)))
        goto fail;
    m->layers = calloc((size_t)m->L, sizeof *m->layers);
    if (!m->layers) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < m->L; i++) {
        clip_layer *l = &m->layers[i];
        char p[64];
        snprintf(p, sizeof p, "%sencoder.layers.%d.", pre, i);
        const char *qkv_w[3] = {dl_pname(nb[0], 256, p, "self_attn.q_proj.weight"), dl_pname(nb[1], 256, p, "self_attn.k_proj.weight"),
                                dl_pname(nb[2], 256, p, "self_attn.v_proj.weight")};
        char bb[3][256];
        const char *qkv_b[3] = {dl_pname(bb[0], 256, p, "self_attn.q_proj.bias"), dl_pname(bb[1], 256, p, "self_attn.k_proj.bias"),
                                dl_pname(bb[2], 256, p, "self_attn.v_proj.bias")};
        int64_t parts[3] = {D, D, D}, pd[1] = {D}, pf[1] = {F};
        if ((s = dl_param_f32(ck, dl_pname(nb[3], 256, p, "layer_norm1.weight"), 1, sh_d, &l->ln1_w)) ||
            (s = dl_param_f32(ck, dl_pname(nb[3], 256, p, "layer_norm1.bias"), 1, sh_d, &l->ln1_b)) ||
            (s = dl_param_f32(ck, dl_pname(nb[3], 256, p, "layer_norm2.weight"), 1, sh_d, &l->ln2_w)) ||
            (s = dl_param_f32(ck, dl_pname(nb[3], 256, p, "layer_norm2.bias"), 1, sh_d, &l->ln2_b)) ||
            (s = dl_lin_load(&l->qkv, ck, qkv_w, qkv_b, 3, parts, S, D, dt, dt, DL_ACT_NONE)))
            goto fail;
        const char *ow[1] = {dl_pname(nb[0], 256, p, "self_attn.out_proj.weight")}, *ob[1] = {dl_pname(bb[0], 256, p, "self_attn.out_proj.bias")};
        if ((s = dl_lin_load(&l->out, ck, ow, ob, 1, pd, S, D, dt, DL_F32, DL_ACT_NONE))) goto fail;
        const char *f1w[1] = {dl_pname(nb[0], 256, p, "mlp.fc1.weight")}, *f1b[1] = {dl_pname(bb[0], 256, p, "mlp.fc1.bias")};
        if ((s = dl_lin_load(&l->fc1, ck, f1w, f1b, 1, pf, S, D, dt, dt, act))) goto fail;
        const char *f2w[1] = {dl_pname(nb[0], 256, p, "mlp.fc2.weight")}, *f2b[1] = {dl_pname(bb[0], 256, p, "mlp.fc2.bias")};
        if ((s = dl_lin_load(&l->fc2, ck, f2w, f2b, 1, pd, S, F, dt, DL_F32, DL_ACT_NONE))) goto fail;
    }
    size_t es = dl_dtype_size(dt);
    act_plan pl = {0};
    dl_plan_add(&pl, &m->x, (size_t)(S * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->h, (size_t)(S * D) * es, 1, 1);
    dl_plan_add(&pl, &m->qkv, (size_t)(S * 3 * D) * es, 1, 1);
    dl_plan_add(&pl, &m->att, (size_t)(S * D) * es, 1, 1);
    dl_plan_add(&pl, &m->o, (size_t)(S * D) * 4, 1, 1);
    dl_plan_add(&pl, &m->f, (size_t)(S * F) * es, 1, 1);
    dl_plan_attn_scratch(&pl, &m->scratch, dt, S, m->H, D / m->H, 1, 1, 1);
    if ((s = dl_plan_commit(&pl, ck, &m->arena)) != DL_OK) goto fail;
    dl_ws_close(ck);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_clip_text_free(m);
    return s;
}

dl_status dl_clip_text_run(dl_clip_text *m, const int32_t *ids, float *hidden, float *pooled, float *all_hidden) {
    const int64_t S = m->S, D = m->D, Dh = D / m->H;
    for (int64_t t = 0; t < S; t++) {
        if (ids[t] < 0 || ids[t] >= m->V)
            return dl_fail(DL_ERR_INVALID, "CLIP text encoder: token id %d at position %lld is outside the vocabulary (%lld)",
                           ids[t], (long long)t, (long long)m->V);
        for (int64_t d = 0; d < D; d++) m->x[t * D + d] = m->tok[ids[t] * D + d] + m->pos[t * D + d];
    }
    if (all_hidden) memcpy(all_hidden, m->x, (size_t)(S * D) * 4);
    size_t es = dl_dtype_size(m->dt);
    dl_attn_args a = {.dt = m->dt, .sq = S, .sk = S, .heads = m->H, .head_dim = Dh, .q = m->qkv,
                      .k = (char *)m->qkv + (size_t)D * es, .v = (char *)m->qkv + (size_t)(2 * D) * es,
                      .q_stride = 3 * D, .k_stride = 3 * D, .v_stride = 3 * D, .out = m->att, .out_stride = D,
                      .kv_begin = 0, .kv_end = S, .scale = 1.f / sqrtf((float)Dh), .causal = 1};
    dl_status s = DL_OK;
    for (int i = 0; i < m->L && s == DL_OK; i++) {
        clip_layer *l = &m->layers[i];
        /* h = LN1(x) in the compute dtype: convert the f32 stream while normalising */
        DL_PAR(dl_layernorm_x_t(m->dt, m->h, DL_F32, m->x, S, D, l->ln1_w, l->ln1_b, NULL, NULL, m->eps, ith, nth));
        if ((s = lin_run(&l->qkv, m->h, m->qkv))) break;
        DL_PAR(dl_attn_t(&a, m->scratch, ith, nth));
        if ((s = lin_run(&l->out, m->att, m->o))) break;
        DL_PAR(dl_gated_residual_t(DL_F32, m->x, m->o, S, D, NULL, ith, nth));
        DL_PAR(dl_layernorm_x_t(m->dt, m->h, DL_F32, m->x, S, D, l->ln2_w, l->ln2_b, NULL, NULL, m->eps, ith, nth));
        if ((s = lin_run(&l->fc1, m->h, m->f))) break;
        if ((s = lin_run(&l->fc2, m->f, m->o))) break;
        DL_PAR(dl_gated_residual_t(DL_F32, m->x, m->o, S, D, NULL, ith, nth));
        if (all_hidden) memcpy(all_hidden + (size_t)(i + 1) * (size_t)(S * D), m->x, (size_t)(S * D) * 4);
    }
    if (s != DL_OK) return s;
    DL_PAR(dl_layernorm_t(DL_F32, hidden, m->x, S, D, m->lnf_w, m->lnf_b, m->eps, ith, nth));
    if (pooled) {
        int64_t at = 0;
        if (m->eos_id == 2) { /* legacy configs: the first position of the largest id */
            for (int64_t t = 1; t < S; t++)
                if (ids[t] > ids[at]) at = t;
        } else {
            for (at = 0; at < S - 1 && ids[at] != m->eos_id; at++) {}
            if (ids[at] != m->eos_id) at = 0; /* no EOS: argmax of an all-false mask is 0 */
        }
        memcpy(pooled, hidden + at * D, (size_t)D * 4);
    }
    return DL_OK;
}
