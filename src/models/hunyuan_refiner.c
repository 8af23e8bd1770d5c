/* HunyuanVideoTokenRefiner (diffusers): the transformer's `context_embedder`, which
 * refines the Llama text embeddings before the dual-stream blocks (the math is in
 * difflet/hunyuan.h). Weights `context_embedder.*` of the transformer component:
 * time_text_embed.{timestep,text}_embedder.linear_{1,2}, proj_in,
 * token_refiner.refiner_blocks.N.{norm1, attn.to_{q,k,v}, attn.to_out.0, norm2,
 * ff.net.0.proj, ff.net.2, norm_out.linear}. */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/hunyuan.h"
#include "models/models_impl.h"

typedef struct {
    float *n1w, *n1b, *n2w, *n2b; /* [D] */
    lin qkv;                      /* [D] -> [3D] dt */
    lin o;                        /* [D] -> [D] f32 */
    lin ff1;                      /* [D] -> [F] dt, SiLU fused */
    lin ff2;                      /* [F] -> [D] f32 */
    lin mod;                      /* silu(temb) [D] -> [2D] f32: gate_msa | gate_mlp */
} refiner_block;

struct dl_hunyuan_refiner {
    int64_t T, Cin, D, H, Dh, F;
    int L;
    dl_dtype dt;
    lin t1, t2, p1, p2, proj_in;
    refiner_block *blocks;
    float *tproj, *pooled, *temb, *gates; /* [256], [Cin], [D], [L, 2D] (f32) */
    void *vin;                            /* one-row matmul inputs (dt): [max(256, Cin, D)] */
    void *v1;                             /* [D] dt: the embedders' hidden row */
    float *va, *vb;                       /* [D] f32 */
    float *x, *o;                         /* [T, D] f32 */
    void *tin;                            /* [T, Cin] dt: proj_in's input */
    void *h, *qkv, *att, *f;              /* [T, D], [T, 3D], [T, D], [T, F] dt */
    void *scratch, *arena;
};

int64_t dl_hunyuan_refiner_width(const dl_hunyuan_refiner *m) { return m->D; }

void dl_hunyuan_refiner_free(dl_hunyuan_refiner *m) {
    if (!m) return;
    for (int i = 0; m->blocks && i < m->L; i++) {
        refiner_block *b = &m->blocks[i];
        free(b->n1w), free(b->n1b), free(b->n2w), free(b->n2b);
        dl_lin_free(&b->qkv), dl_lin_free(&b->o), dl_lin_free(&b->ff1), dl_lin_free(&b->ff2), dl_lin_free(&b->mod);
    }
    free(m->blocks);
    dl_lin_free(&m->t1), dl_lin_free(&m->t2), dl_lin_free(&m->p1), dl_lin_free(&m->p2), dl_lin_free(&m->proj_in);
    dl_aligned_free(m->arena);
    free(m);
}

dl_status dl_hunyuan_refiner_load(dl_hunyuan_refiner **out, dl_model_dir *dir, const char *component, int64_t T,
                                  dl_dtype dt, dl_wsrc *src) {
    *out = NULL;
    char file[512], n[256];
    snprintf(file, sizeof file, "%s/config.json", component);
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    if (T < 1 || T > 65536) return dl_fail(DL_ERR_INVALID, "token refiner: %lld text rows (1..65536)", (long long)T);
    dl_hunyuan_refiner *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_wsrc *ck = NULL;
    int64_t L;
    if ((s = dl_cfg_int(cfg, file, "text_embed_dim", 4096, &m->Cin)) ||
        (s = dl_cfg_int(cfg, file, "num_attention_heads", 24, &m->H)) ||
        (s = dl_cfg_int(cfg, file, "attention_head_dim", 128, &m->Dh)) ||
        (s = dl_cfg_int(cfg, file, "num_refiner_layers", 2, &L)))
        goto fail;
    /* the refiner's MLP is 4x wide whatever the config's mlp_ratio (diffusers builds
     * HunyuanVideoTokenRefiner with its default mlp_ratio) */
    m->T = T, m->dt = dt, m->L = (int)L, m->D = m->H * m->Dh, m->F = 4 * m->D;
    if (m->Cin <= 0 || m->H <= 0 || m->Dh <= 0 || L < 1 || L > 64 || m->F <= 0) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: inconsistent token refiner sizes", file);
        goto fail;
    }
    const int64_t D = m->D, F = m->F, Cin = m->Cin;
    if ((s = dl_ws_open(&ck, src, dir, component)) != DL_OK) goto fail;
#define NM(x) (snprintf(n, sizeof n, "context_embedder.%s", x), n)
    if ((s = dl_lin_named(&m->t1, ck, NM("time_text_embed.timestep_embedder.linear_1"), 1, 256, D, dt, dt, DL_ACT_SILU, 0, NULL)) ||
        (s = dl_lin_named(&m->t2, ck, NM("time_text_embed.timestep_embedder.linear_2"), 1, D, D, dt, DL_F32, DL_ACT_NONE, 0, NULL)) ||
        (s = dl_lin_named(&m->p1, ck, NM("time_text_embed.text_embedder.linear_1"), 1, Cin, D, dt, dt, DL_ACT_SILU, 0, NULL)) ||
        (s = dl_lin_named(&m->p2, ck, NM("time_text_embed.text_embedder.linear_2"), 1, D, D, dt, DL_F32, DL_ACT_NONE, 0, NULL)) ||
        (s = dl_lin_named(&m->proj_in, ck, NM("proj_in"), T, Cin, D, dt, DL_F32, DL_ACT_NONE, 0, NULL)))
        goto fail;
#undef NM
    if (!(m->blocks = calloc((size_t)L, sizeof *m->blocks))) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < m->L; i++) {
        refiner_block *b = &m->blocks[i];
        char p[96];
        snprintf(p, sizeof p, "context_embedder.token_refiner.refiner_blocks.%d.", i);
#define NM(x) (snprintf(n, sizeof n, "%s%s", p, x), n)
        if ((s = dl_param_vec(ck, NM("norm1.weight"), D, &b->n1w)) || (s = dl_param_vec(ck, NM("norm1.bias"), D, &b->n1b)) ||
            (s = dl_param_vec(ck, NM("norm2.weight"), D, &b->n2w)) || (s = dl_param_vec(ck, NM("norm2.bias"), D, &b->n2b)) ||
            (s = dl_lin_qkv(&b->qkv, ck, p, "attn.to_q", "attn.to_k", "attn.to_v", T, D, dt, NULL)) ||
            (s = dl_lin_named(&b->o, ck, NM("attn.to_out.0"), T, D, D, dt, DL_F32, DL_ACT_NONE, 0, NULL)) ||
            (s = dl_lin_named(&b->ff1, ck, NM("ff.net.0.proj"), T, D, F, dt, dt, DL_ACT_SILU, 0, NULL)) ||
            (s = dl_lin_named(&b->ff2, ck, NM("ff.net.2"), T, F, D, dt, DL_F32, DL_ACT_NONE, 0, NULL)) ||
            (s = dl_lin_named(&b->mod, ck, NM("norm_out.linear"), 1, D, 2 * D, dt, DL_F32, DL_ACT_NONE, 0, NULL)))
            goto fail;
#undef NM
    }
    const size_t es = dl_dtype_size(dt);
    const int64_t vmax = Cin > D ? (Cin > 256 ? Cin : 256) : (D > 256 ? D : 256);
    act_plan pl = {0};
    dl_plan_add(&pl, &m->tproj, 256 * 4, 0, 2);
    dl_plan_add(&pl, &m->pooled, (size_t)Cin * 4, 0, 2);
    dl_plan_add(&pl, &m->temb, (size_t)D * 4, 0, 2);
    dl_plan_add(&pl, &m->gates, (size_t)(L * 2 * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->vin, (size_t)vmax * es, 0, 2);
    dl_plan_add(&pl, &m->v1, (size_t)D * es, 0, 2);
    dl_plan_add(&pl, &m->va, (size_t)D * 4, 0, 2);
    dl_plan_add(&pl, &m->vb, (size_t)D * 4, 0, 2);
    dl_plan_add(&pl, &m->x, (size_t)(T * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->tin, (size_t)(T * Cin) * es, 0, 0);
    dl_plan_add(&pl, &m->o, (size_t)(T * D) * 4, 1, 1);
    dl_plan_add(&pl, &m->h, (size_t)(T * D) * es, 1, 1);
    dl_plan_add(&pl, &m->qkv, (size_t)(T * 3 * D) * es, 1, 1);
    dl_plan_add(&pl, &m->att, (size_t)(T * D) * es, 1, 1);
    dl_plan_add(&pl, &m->f, (size_t)(T * F) * es, 1, 1);
    dl_plan_attn_scratch(&pl, &m->scratch, dt, T, m->H, m->Dh, 0, 1, 1);
    if ((s = dl_plan_commit(&pl, ck, &m->arena)) != DL_OK) goto fail;
    dl_ws_close(ck);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_hunyuan_refiner_free(m);
    return s;
}

static float silu(float v) { return v / (1.0f + expf(-v)); }

dl_status dl_hunyuan_refiner_run(dl_hunyuan_refiner *m, const float *text, int64_t valid, float t, float *out) {
    const int64_t T = m->T, D = m->D, Cin = m->Cin, H = m->H, Dh = m->Dh;
    const size_t es = dl_dtype_size(m->dt);
    dl_status s;
    if (valid < 1 || valid > T)
        return dl_fail(DL_ERR_INVALID, "token refiner: %lld real rows of %lld", (long long)valid, (long long)T);
    if (!isfinite(t)) return dl_fail(DL_ERR_INVALID, "token refiner: the timestep is not finite");
    /* the masked mean in f32, as torch sums (text * mask).sum(1) / mask.sum(1) */
    for (int64_t c = 0; c < Cin; c++) {
        float acc = 0;
        for (int64_t r = 0; r < valid; r++) acc += text[r * Cin + c];
        m->pooled[c] = acc / (float)valid;
    }
    /* temb = timestep_embedder(proj(t)) + text_embedder(pooled) */
    dl_dit_timestep_proj(t, 256, m->tproj);
    DL_PAR(dl_convert_t(m->dt, m->vin, DL_F32, m->tproj, 256, ith, nth));
    if ((s = lin_run(&m->t1, m->vin, m->v1)) || (s = lin_run(&m->t2, m->v1, m->va))) return s;
    DL_PAR(dl_convert_t(m->dt, m->vin, DL_F32, m->pooled, Cin, ith, nth));
    if ((s = lin_run(&m->p1, m->vin, m->v1)) || (s = lin_run(&m->p2, m->v1, m->vb))) return s;
    for (int64_t j = 0; j < D; j++) m->temb[j] = silu(m->va[j] + m->vb[j]); /* every block's norm_out takes silu(temb) */
    DL_PAR(dl_convert_t(m->dt, m->vin, DL_F32, m->temb, D, ith, nth));
    for (int i = 0; i < m->L; i++)
        if ((s = lin_run(&m->blocks[i].mod, m->vin, m->gates + (size_t)i * 2 * D))) return s;
    /* x = proj_in(text) */
    DL_PAR(dl_convert_t(m->dt, m->tin, DL_F32, text, T * Cin, ith, nth));
    if ((s = lin_run(&m->proj_in, m->tin, m->x))) return s;
    const char *q = m->qkv;
    for (int i = 0; i < m->L; i++) {
        refiner_block *b = &m->blocks[i];
        const float *gm = m->gates + (size_t)i * 2 * D, *gf = gm + D;
        DL_PAR(dl_layernorm_x_t(m->dt, m->h, DL_F32, m->x, T, D, b->n1w, b->n1b, NULL, NULL, 1e-6f, ith, nth));
        if ((s = lin_run(&b->qkv, m->h, m->qkv))) return s;
        /* real rows: the real keys; padded rows: key 0 alone */
        dl_attn_args a = {.dt = m->dt, .sq = valid, .sk = T, .heads = H, .head_dim = Dh, .q = q, .q_stride = 3 * D,
                          .k = q + (size_t)D * es, .v = q + (size_t)(2 * D) * es, .k_stride = 3 * D, .v_stride = 3 * D,
                          .out = m->att, .out_stride = D, .kv_begin = 0, .kv_end = valid, .scale = 1.f / sqrtf((float)Dh)};
        DL_PAR(dl_attn_t(&a, m->scratch, ith, nth));
        if (valid < T) {
            dl_attn_args p = a;
            p.sq = T - valid, p.q = q + (size_t)(valid * 3 * D) * es, p.out = (char *)m->att + (size_t)(valid * D) * es;
            p.kv_end = 1;
            DL_PAR(dl_attn_t(&p, m->scratch, ith, nth));
        }
        if ((s = lin_run(&b->o, m->att, m->o))) return s;
        DL_PAR(dl_gated_residual_t(DL_F32, m->x, m->o, T, D, gm, ith, nth));
        DL_PAR(dl_layernorm_x_t(m->dt, m->h, DL_F32, m->x, T, D, b->n2w, b->n2b, NULL, NULL, 1e-6f, ith, nth));
        if ((s = lin_run(&b->ff1, m->h, m->f)) || (s = lin_run(&b->ff2, m->f, m->o))) return s;
        DL_PAR(dl_gated_residual_t(DL_F32, m->x, m->o, T, D, gf, ith, nth));
    }
    memcpy(out, m->x, (size_t)(T * D) * 4);
    return DL_OK;
}
